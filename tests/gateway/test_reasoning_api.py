"""Reasoning models through real processes and the official `openai` client:
redis-server, workers, the gateway.

* "thinker": a tiny random thinking model (tests/reasoning_models.py, SWITCH_TEMPLATE:
  the generation prompt opens ``<think>`` unless ``enable_thinking`` is false). Its
  worker detects the family from the template (deepseek_r1) and publishes it; the
  gateway, told nothing, splits by it. A logit bias on ``</think>`` scripts when the
  reasoning ends, so the JSON Schema's place (after the reasoning only) can be seen.
* "tiny" (the shared stack's worker, no reasoning of its own): a gateway told
  ``tiny=qwen3`` splits what a regex forces it to write, a real ``<think>`` block, so
  streamed and non-streamed answers can be compared on non-empty reasoning.
"""
from __future__ import annotations

import json

import pytest
import redis
from openai import OpenAI
from pydantic import BaseModel

from inferq.schemas import keys
from tests.gateway.stack import TINY, running_gateway
from tests.reasoning_models import END_THINK_ID, SWITCH_TEMPLATE, save_thinking_model
from tests.workers import WorkerProc

THINKER = "thinker"
ASK = [{"role": "user", "content": "Is it raining?"}]
END_NOW = {str(END_THINK_ID): 100}  # the model closes its reasoning at once
# What the regex makes the "tiny" model write: a think block, then an answer.
FORCED = r"<think>\n[a-z]{2,6}( [a-z]{2,6}){1,3}\n</think>\n\nThe answer is [0-9]{1,2}\."


class Verdict(BaseModel):
    raining: bool


@pytest.fixture(scope="module")
def thinker(stack, tmp_path_factory):
    folder = save_thinking_model(tmp_path_factory.mktemp("thinker"), SWITCH_TEMPLATE, tie_word_embeddings=False)
    w = WorkerProc(stack.url, folder, THINKER, stack.tmp, "thinker-worker", "--device", "cpu", "--dtype", "float32",
                   "--max-num-seqs", "8", "--num-kv-blocks", "128", "--lease-seconds", "5", defaults=())
    try:
        w.wait_ready(240)
        yield w
    finally:
        w.terminate(timeout=20)


@pytest.fixture(scope="module")
def client(stack, thinker):
    with running_gateway(stack.url, reasoning_parser=f"{TINY}=qwen3") as url:
        yield OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)


def reasoning_of(message):
    """What the openai client keeps of the field it does not declare."""
    return (message.model_extra or {}).get("reasoning_content")


def streamed(client, **kw):
    reasoning, content, finish = [], [], None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for choice in chunk.choices:
            r = (choice.delta.model_extra or {}).get("reasoning_content")
            reasoning.append(r or "")
            content.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(reasoning), "".join(content), finish


def test_worker_publishes_the_family_it_detected(stack, thinker):
    r = redis.Redis.from_url(stack.url)
    try:
        assert r.hget(keys.model_info(THINKER), "reasoning_parser") == b"deepseek_r1"
        assert r.ttl(keys.model_info(THINKER)) > 0
        assert r.hget(keys.model_info(TINY), "reasoning_parser") == b"none"
    finally:
        r.close()


def test_reasoning_apart_from_content_stream_and_not(client):
    kw = dict(model=TINY, messages=ASK, temperature=0, max_tokens=40, extra_body={"guided_regex": FORCED})
    msg = client.chat.completions.create(**kw).choices[0].message
    reasoning = reasoning_of(msg)
    assert reasoning and "<think>" not in reasoning and "</think>" not in reasoning and "\n" not in reasoning
    assert msg.content.startswith("The answer is ") and "think>" not in msg.content
    assert streamed(client, **kw) == (reasoning, msg.content, "stop")
    # Several choices: each is split on its own, streamed and not.
    both = client.chat.completions.create(n=2, **kw).choices
    assert [(reasoning_of(c.message), c.message.content) for c in both] == [(reasoning, msg.content)] * 2
    per_choice: dict = {}
    for chunk in client.chat.completions.create(stream=True, n=2, **kw):
        for c in chunk.choices:
            r, t = per_choice.setdefault(c.index, ([], []))
            r.append((c.delta.model_extra or {}).get("reasoning_content") or "")
            t.append(c.delta.content or "")
    assert {i: ("".join(r), "".join(t)) for i, (r, t) in per_choice.items()} == {0: (reasoning, msg.content),
                                                                                1: (reasoning, msg.content)}


def test_schema_applies_after_the_reasoning(client):
    # The reasoning ends at once (scripted): the answer is the schema's, parsed from content alone.
    done = client.chat.completions.parse(model=THINKER, messages=ASK, temperature=0, max_tokens=40,
                                         response_format=Verdict, logit_bias=END_NOW)
    msg = done.choices[0].message
    assert done.choices[0].finish_reason == "stop" and isinstance(msg.parsed, Verdict)
    assert reasoning_of(msg) == ""
    # Inside the reasoning the schema changes nothing: the same text as without it.
    free = client.chat.completions.create(model=THINKER, messages=ASK, temperature=0, max_tokens=12)
    held = client.chat.completions.create(model=THINKER, messages=ASK, temperature=0, max_tokens=12,
                                          response_format={"type": "json_schema", "json_schema": {
                                              "name": "verdict", "schema": Verdict.model_json_schema()}})
    assert held.choices[0].finish_reason == "length" and held.choices[0].message.content == ""
    assert reasoning_of(free.choices[0].message)  # words, not JSON
    assert reasoning_of(held.choices[0].message) == reasoning_of(free.choices[0].message)
    assert streamed(client, model=THINKER, messages=ASK, temperature=0, max_tokens=12,
                    response_format={"type": "json_object"})[:2] == (reasoning_of(free.choices[0].message), "")


def test_forced_tool_call_is_read_from_the_content(client):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
        "required": ["city"], "additionalProperties": False}}}
    done = client.chat.completions.create(model=THINKER, messages=ASK, temperature=0, max_tokens=60, tools=[tool],
                                          tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                          logit_bias=END_NOW)
    msg = done.choices[0].message
    assert done.choices[0].finish_reason == "tool_calls", msg
    assert msg.tool_calls[0].function.name == "get_weather"
    assert json.loads(msg.tool_calls[0].function.arguments)["city"] in ("Paris", "Oslo")
    assert reasoning_of(msg) == ""


def test_enable_thinking_false_reaches_the_template(client):
    on = client.chat.completions.create(model=THINKER, messages=ASK, temperature=0, max_tokens=4)
    off = client.chat.completions.parse(model=THINKER, messages=ASK, temperature=0, max_tokens=40,
                                        response_format=Verdict,
                                        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    # The template closed an empty block instead of opening one: two more prompt tokens
    # ("<think>", "\n" vs "<think>", "\n\n", "</think>", "\n\n").
    assert off.usage.prompt_tokens == on.usage.prompt_tokens + 2
    # No reasoning: the schema constrains from the first token, and nothing is split.
    assert isinstance(off.choices[0].message.parsed, Verdict)
    assert reasoning_of(off.choices[0].message) is None


def test_bad_chat_template_kwargs_are_refused(client):
    import openai

    with pytest.raises(openai.BadRequestError, match="may not set add_generation_prompt"):
        client.chat.completions.create(model=THINKER, messages=ASK, max_tokens=4,
                                       extra_body={"chat_template_kwargs": {"add_generation_prompt": False}})
    with pytest.raises(openai.BadRequestError, match="at most 16384 bytes"):
        client.chat.completions.create(model=THINKER, messages=ASK, max_tokens=4,
                                       extra_body={"chat_template_kwargs": {"note": "x" * 20_000}})


def test_responses_api_gives_a_reasoning_item(client):
    """/v1/responses: the think block is a ``reasoning`` output item (reasoning_text
    content, streamed as response.reasoning_text.delta), the answer a message item."""
    chat = client.chat.completions.create(model=THINKER, messages=ASK, temperature=0, max_tokens=12)
    want = reasoning_of(chat.choices[0].message)
    assert want
    kw = dict(model=THINKER, input=ASK[0]["content"], temperature=0, max_output_tokens=12)
    r = client.responses.create(**kw)
    assert [item.type for item in r.output] == ["reasoning"]  # cut off while thinking: no answer yet
    assert r.output[0].content[0].type == "reasoning_text" and r.output[0].content[0].text == want
    assert r.output_text == ""
    assert client.responses.retrieve(r.id).output[0].content[0].text == want
    events = list(client.responses.create(stream=True, **kw))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == want
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in done] == ["reasoning"] and done[0].content[0].text == want
    assert [e.text for e in events if e.type == "response.reasoning_text.done"] == [want]
