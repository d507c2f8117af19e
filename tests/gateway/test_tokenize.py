"""POST /tokenize and /detokenize (vLLM's shapes) against the shared stack (real
redis-server, worker on a tiny random Llama with the SmolLM2 tokenizer and chat
template, gateway), with the HF tokenizer of the same folder as the oracle."""
from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from tests.gateway.stack import TINY

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime number."},
            {"role": "assistant", "content": "Seven."}, {"role": "user", "content": "Another, please."}]


@pytest.fixture(scope="module")
def tok(stack):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(stack.model_dir)


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json={"model": TINY, **body}, timeout=60)


def test_tokenize_prompt_matches_hf(gateway_url, tok):
    text = "Hello, world! Queues and tokens: ünïcödé 🚀."
    r = post(gateway_url, "/tokenize", {"prompt": text})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == tok(text).input_ids
    assert body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 4096  # the worker's context (the stack's model allows 4096 positions)
    no_special = post(gateway_url, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()
    assert no_special["tokens"] == tok(text, add_special_tokens=False).input_ids


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_tokenize_messages_uses_the_chat_template(gateway_url, tok, add_generation_prompt):
    r = post(gateway_url, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": add_generation_prompt})
    assert r.status_code == 200, r.text
    text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert r.json()["tokens"] == tok(text, add_special_tokens=False).input_ids
    assert text.rstrip().endswith("assistant") == add_generation_prompt


def test_tokenized_messages_are_the_prompt_a_chat_completion_gets(gateway_url):
    """The token count /tokenize gives is the chat completion's prompt_tokens."""
    tokens = post(gateway_url, "/tokenize", {"messages": MESSAGES}).json()["tokens"]
    client = OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0, timeout=120)
    done = client.chat.completions.create(model=TINY, messages=MESSAGES, max_tokens=1, temperature=0)
    assert done.usage.prompt_tokens == len(tokens)


def test_detokenize_round_trips(gateway_url, tok):
    text = "Round trip: the lighthouse keeper counted 12 waves."
    tokens = post(gateway_url, "/tokenize", {"prompt": text}).json()["tokens"]
    r = post(gateway_url, "/detokenize", {"tokens": tokens})
    assert r.status_code == 200, r.text
    assert r.json()["prompt"] == tok.decode(tokens) == text
    chat = post(gateway_url, "/tokenize", {"messages": MESSAGES}).json()["tokens"]
    assert post(gateway_url, "/detokenize", {"tokens": chat}).json()["prompt"] == tok.decode(chat)
    assert post(gateway_url, "/detokenize", {"tokens": []}).json() == {"prompt": ""}


@pytest.mark.parametrize("path, body, param", [
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": "x", "messages": MESSAGES}, "prompt"),
    ("/tokenize", {"prompt": "x", "return_token_strs": True}, "return_token_strs"),
    ("/detokenize", {"tokens": [-3]}, "tokens"),
    ("/detokenize", {"tokens": [1, 10_000_000]}, None),  # refused by the worker: beyond the vocabulary
])
def test_bad_requests_are_400(gateway_url, path, body, param):
    r = post(gateway_url, path, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"]
    if param:
        assert err["param"] == param


def test_unknown_model_is_404(gateway_url):
    r = httpx.post(f"{gateway_url}/tokenize", json={"model": "nope", "prompt": "x"}, timeout=60)
    assert r.status_code == 404


def test_sdk_tokenize(stack, tok):
    from inferq import Producer

    with Producer(stack.url, default_model=TINY) as p:
        assert p.tokenize("Hello there", timeout=60) == tok("Hello there").input_ids
        text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
        assert p.tokenize(messages=MESSAGES, timeout=60) == tok(text, add_special_tokens=False).input_ids
        h = p.submit(prompt_token_ids=tok("Hi you").input_ids, task="detokenize")
        assert h.result(60).text == "Hi you"
