"""best_of on /v1/completions end to end: the official `openai` client -> gateway (real
HTTP) -> Redis -> a worker process (tiny Llama) and back, plus the SDK, the reply stream
and a Batch API line. best_of sequences run as siblings with seeds seed + i, the same
sequences an n=best_of request returns; the best n by cumulative logprob come back."""
from __future__ import annotations

import json

import openai
import pytest
import redis
from openai import OpenAI

from inferq.producer import Producer
from inferq.schemas import SamplingParams, keys
from inferq.schemas.events import decode_event
from tests.gateway.stack import TINY, running_gateway
from tests.gateway.test_batch_api import client_for, parse_jsonl, wait_status

MAX_TOKENS = 8
# Seeded sampling, every sequence runs to max_tokens: the answers are fixed for a given model.
# On the tiny model seed 20 ranks the sequences last to first, so returning the first n would fail.
SEEDED = dict(model=TINY, prompt="Once upon a time", max_tokens=MAX_TOKENS, temperature=1.0, seed=20,
              extra_body={"ignore_eos": True})


@pytest.fixture(scope="module")
def client(gateway_url):
    return OpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def every(client):
    """The three sequences of best_of=3 as n=3 choices, with their sampled tokens' logprobs,
    and their order by cumulative logprob (best first)."""
    res = client.completions.create(n=3, logprobs=0, **SEEDED)
    sums = [sum(c.logprobs.token_logprobs) for c in res.choices]
    order = sorted(range(3), key=lambda i: (-sums[i], i))
    # The seeds give three different texts with clearly different scores, so the ranking is decided.
    assert len({c.text for c in res.choices}) == 3
    assert sums[order[0]] - sums[order[1]] > 1e-3 and sums[order[1]] - sums[order[2]] > 1e-3, sums
    assert order[:2] != [0, 1], sums  # the ranking, not the sequence order, decides
    return res, sums, order


def test_best_of_3_returns_the_sequence_with_the_highest_cumulative_logprob(client, every):
    res, _, order = every
    one = client.completions.create(best_of=3, **SEEDED)
    assert [c.index for c in one.choices] == [0]
    assert one.choices[0].text == res.choices[order[0]].text
    assert one.choices[0].logprobs is None  # ranking needs logprobs; the client did not ask for them
    assert one.choices[0].finish_reason == "length"
    # Every sequence is billed, the prompt once.
    assert one.usage.completion_tokens == res.usage.completion_tokens == 3 * MAX_TOKENS
    assert one.usage.prompt_tokens == res.usage.prompt_tokens


def test_best_of_3_n2_gives_the_two_best_in_order_with_their_logprobs(client, every):
    res, sums, order = every
    two = client.completions.create(best_of=3, n=2, logprobs=0, **SEEDED)
    assert [c.index for c in two.choices] == [0, 1]
    assert [c.text for c in two.choices] == [res.choices[i].text for i in order[:2]]
    assert [sum(c.logprobs.token_logprobs) for c in two.choices] == pytest.approx([sums[i] for i in order[:2]],
                                                                                  abs=1e-4)


def test_best_of_equal_to_n_is_n(client, every):
    res, _, _ = every
    same = client.completions.create(best_of=3, n=3, **SEEDED)
    assert [c.text for c in same.choices] == [c.text for c in res.choices]
    # best_of == n streams as n does (nothing to rank).
    streamed = {}
    for chunk in client.completions.create(best_of=3, n=3, stream=True, **SEEDED):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == {i: c.text for i, c in enumerate(res.choices)}


def test_greedy_best_of_2_equals_the_single_greedy_answer(client):
    kw = dict(model=TINY, prompt="The sky is", max_tokens=MAX_TOKENS, temperature=0)
    single = client.completions.create(**kw)
    best = client.completions.create(best_of=2, **kw)
    assert [c.text for c in best.choices] == [single.choices[0].text]
    assert best.choices[0].finish_reason == single.choices[0].finish_reason
    assert best.usage.completion_tokens == 2 * single.usage.completion_tokens
    # Through extra_body too (as vLLM's clients send it).
    extra = client.completions.create(extra_body={"best_of": 2}, **kw)
    assert extra.choices[0].text == single.choices[0].text


@pytest.mark.parametrize("kw, words", [
    (dict(n=3, best_of=2), "best_of (2) must be at least n (3)"),
    (dict(best_of=2, stream=True), "best_of cannot be used with stream"),
    (dict(best_of=17), "best_of=17 exceeds the limit of 16"),
    (dict(best_of=0), "best_of"),
])
def test_bad_best_of_on_completions_is_a_400(client, kw, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=TINY, prompt="x", max_tokens=4, **kw)
    assert words in e.value.body["message"], e.value.body
    if "must be at least" in words or "stream" in words:
        assert e.value.body["param"] == "best_of"


def test_chat_refuses_best_of(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=TINY, messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                       extra_body={"best_of": 2})
    assert e.value.body["param"] == "best_of" and "not a chat completions parameter" in e.value.body["message"]
    ok = client.chat.completions.create(model=TINY, messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                        extra_body={"best_of": 1})  # neutral: changes nothing
    assert len(ok.choices) == 1


def test_sdk_job_publishes_only_the_winners(stack, every):
    res, _, order = every
    p = Producer(stack.url, default_model=TINY)
    sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=SEEDED["seed"], ignore_eos=True, best_of=3, n=2)
    h = p.submit(prompt="Once upon a time", sampling=sp)
    out = h.result(timeout=120)
    assert [c.text for c in out.choices] == [res.choices[i].text for i in order[:2]]
    assert out.text == out.choices[0].text and out.usage.completion_tokens == 3 * MAX_TOKENS
    # The reply stream: one whole delta per winner, indexes 0..n-1 only, then one done.
    r = redis.Redis.from_url(stack.url)
    events = [decode_event(f) for _, f in r.xrange(keys.reply(h.id))]
    deltas = [e for e in events if e.type == "delta"]
    assert [(e.index, e.finish_reason, len(e.token_ids)) for e in deltas] == [(0, "length", MAX_TOKENS),
                                                                             (1, "length", MAX_TOKENS)]
    assert [e.type for e in events].count("done") == 1 and events[-1].type == "done"
    assert [c.index for c in events[-1].choices] == [0, 1]


def test_batch_line_with_best_of(stack, tmp_path_factory):
    files = tmp_path_factory.mktemp("files-best-of")
    body = {"model": TINY, "prompt": "Number 3 is", "max_tokens": 5, "temperature": 0, "best_of": 2}
    with running_gateway(stack.url, files_dir=str(files), api_keys="k-all") as url:
        client = client_for(url, "k-all")
        data = json.dumps({"custom_id": "b", "method": "POST", "url": "/v1/completions", "body": body})
        f = client.files.create(file=("b.jsonl", data.encode()), purpose="batch")
        b = wait_status(client, client.batches.create(input_file_id=f.id, endpoint="/v1/completions",
                                                      completion_window="24h").id, {"completed", "failed"})
        assert b.status == "completed" and b.request_counts.completed == 1
        (line,) = parse_jsonl(client.files.content(b.output_file_id).text)
        alone = client.completions.create(**{k: v for k, v in body.items() if k != "best_of"})
    out = line["response"]["body"]
    assert [c["text"] for c in out["choices"]] == [alone.choices[0].text]
    assert out["usage"]["completion_tokens"] == 2 * alone.usage.completion_tokens
