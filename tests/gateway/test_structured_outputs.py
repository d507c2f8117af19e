"""Structured outputs end to end: the official `openai` client -> gateway (real HTTP)
-> Redis -> worker processes on the real SmolLM2-135M-Instruct, and the SDK path.

Two workers: "smol" (normal), and "smol-slow" whose grammar compiles are paced
slower than its compile time-out (a test aid), so a time-out happens whatever
the machine's speed."""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel, Field

from inferq.producer import Producer
from inferq.producer.errors import JobFailed
from inferq.schemas import SamplingParams
from tests.conftest import RedisServer
from tests.gateway.stack import running_gateway
from inferq.bench.structured_cases import PROMPTS, SCHEMAS
from tests.workers import WorkerProc

SMOL, SLOW = "smol", "smol-slow"
CACHE_BOUND = 32


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from inferq.gpuworker.models.loader import bundled_model_path

    tmp = tmp_path_factory.mktemp("structured")
    (tmp / "redis").mkdir()
    server = RedisServer(tmp / "redis").start()
    model = bundled_model_path()
    workers = [
        WorkerProc(server.url, model, SMOL, tmp, "so-worker", "--device", "cpu", "--max-num-seqs", "32",
                   "--grammar-cache-size", str(CACHE_BOUND), metrics=True, defaults=()),
        WorkerProc(server.url, model, SLOW, tmp, "so-slow", "--device", "cpu", "--max-num-seqs", "4",
                   "--grammar-compile-timeout-s", "0.5", "--test-grammar-compile-delay-s", "5", metrics=True,
                   defaults=()),
    ]
    try:
        for w in workers:
            w.wait_ready(240)
        with running_gateway(server.url) as url:
            yield server.url, url, workers
    finally:
        for w in workers:
            w.terminate(timeout=20)
        server.stop()


@pytest.fixture(scope="module")
def client(stack):
    return OpenAI(base_url=f"{stack[1]}/v1", api_key="unused", max_retries=0, timeout=300)


def ask(client, name, temperature, stream, model=SMOL):
    kw = dict(model=model, messages=[{"role": "user", "content": PROMPTS[name]}], temperature=temperature, seed=11,
              max_tokens=200, response_format={"type": "json_schema",
                                               "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}})
    if not stream:
        r = client.chat.completions.create(**kw)
        return r.choices[0].message.content, r.choices[0].finish_reason
    text, finish = [], None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            text.append(c.delta.content or "")
            finish = c.finish_reason or finish
    return "".join(text), finish


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_json_schema_answers_validate(client, temperature, stream):
    names = list(SCHEMAS)
    with ThreadPoolExecutor(len(names)) as pool:  # concurrent: the worker batches them
        answers = list(pool.map(lambda n: ask(client, n, temperature, stream), names))
    for name, (text, finish) in zip(names, answers):
        assert finish == "stop", (name, text)
        jsonschema.validate(json.loads(text), SCHEMAS[name])


def test_streamed_equals_whole_at_temperature_zero(client):
    assert ask(client, "nested_address", 0.0, True) == ask(client, "nested_address", 0.0, False)


class Item(BaseModel):
    name: str = Field(max_length=20)
    qty: int = Field(ge=1, le=9)


class Groceries(BaseModel):
    items: list[Item] = Field(min_length=1, max_length=3)
    shop: str = Field(max_length=20)


def test_sdk_parse_with_a_pydantic_model(client):
    r = client.chat.completions.parse(model=SMOL, temperature=0, max_tokens=200, response_format=Groceries,
                                      messages=[{"role": "user", "content": "List two groceries and the shop, as JSON."}])
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Groceries) and 1 <= len(parsed.items) <= 3
    assert Groceries.model_validate_json(r.choices[0].message.content) == parsed


def test_json_object_regex_choice_and_grammar(client):
    msgs = [{"role": "user", "content": "Answer."}]
    def chat(**extra):
        r = client.chat.completions.create(model=SMOL, messages=msgs, temperature=0, max_tokens=60, **extra)
        return r.choices[0].message.content, r.choices[0].finish_reason

    text, finish = chat(response_format={"type": "json_object"})
    assert finish == "length" or isinstance(json.loads(text), dict)
    text, finish = chat(extra_body={"guided_regex": r"[A-Z]{2}-[0-9]{3}"})
    assert re.fullmatch(r"[A-Z]{2}-[0-9]{3}", text) and finish == "stop"
    text, _ = chat(extra_body={"guided_choice": ["alpha", "beta", "gamma"]})
    assert text in ("alpha", "beta", "gamma")
    text, _ = chat(extra_body={"structured_outputs": {"choice": ["up", "down"]}})
    assert text in ("up", "down")
    lark = 'start: "Result: " ANSWER\nANSWER: "pass" | "fail"'
    text, _ = chat(extra_body={"guided_grammar": lark})
    assert text in ("Result: pass", "Result: fail")
    gbnf = 'root ::= "Result: " ("pass" | "fail")'
    assert chat(extra_body={"guided_grammar": gbnf})[0] in ("Result: pass", "Result: fail")


def test_completions_endpoint_streamed_and_not(client):
    schema = SCHEMAS["person"]
    kw = dict(model=SMOL, prompt="A person as JSON:", temperature=0, max_tokens=80, extra_body={"guided_json": schema})
    whole = client.completions.create(**kw).choices[0]
    assert whole.finish_reason == "stop"
    jsonschema.validate(json.loads(whole.text), schema)
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
    assert streamed == whole.text


def test_logit_bias_and_min_tokens(client):
    # +100 on one ordinary token id: greedy picks it every time.
    r = client.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": "Hi"}], temperature=0,
                                       max_tokens=4, logit_bias={"1000": 100}, logprobs=True)
    tokens = [t.token for t in r.choices[0].logprobs.content]
    assert r.usage.completion_tokens == 4 and tokens == ["token_id:1000"] * 4, tokens
    short = client.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": "Reply yes or no."}],
                                           temperature=0, max_tokens=64)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 30
    held = client.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": "Reply yes or no."}],
                                          temperature=0, max_tokens=64, extra_body={"min_tokens": 30})
    assert held.usage.completion_tokens >= 30


@pytest.mark.parametrize("body, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format", "cannot be compiled"),
    ({"extra_body": {"guided_json": {"type": "array", "uniqueItems": True}}}, "guided_json", "uniqueItems"),
    ({"extra_body": {"guided_regex": "(open"}}, "guided_regex", "cannot be compiled"),
    ({"extra_body": {"guided_regex": "a", "guided_choice": ["a"]}}, "guided_choice", "at most one"),
    ({"extra_body": {"use_beam_search": True}}, "use_beam_search", "beam search"),
    ({"extra_body": {"functions": [{"name": "f", "parameters": {}}]}}, "functions", "use 'tools'"),
    ({"extra_body": {"best_of": 3}}, "best_of", "best_of"),
])
def test_bad_constraints_and_unsupported_parameters_are_400s(client, body, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=SMOL, messages=[{"role": "user", "content": "x"}], max_tokens=5, **body)
    err = e.value.body
    assert err["param"] == param and words in err["message"], err


def test_compile_time_out_fails_that_job_alone(stack, client):
    redis_url, _, workers = stack
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, "person", 0.0, False, model=SLOW)
    assert "longer than 0.5 s to compile" in e.value.body["message"]
    # The SDK path: the queued job gets an error event (and a DLQ entry with the reason).
    with Producer(redis_url=redis_url, default_model=SLOW) as p:
        h = p.submit("x", sampling=SamplingParams(max_tokens=4, structured_outputs={"regex": "[a-z]+"}))
        with pytest.raises(JobFailed) as jf:
            h.result(timeout=120)
        assert jf.value.code == "invalid_constraint" and "to compile" in jf.value.message
        # The worker lives on and serves the next job.
        ok = p.submit("Hello", sampling=SamplingParams(max_tokens=3, temperature=0)).result(timeout=120)
        assert ok.usage.completion_tokens >= 1
    assert workers[1].proc.poll() is None


def test_a_thousand_distinct_schemas_keep_the_compile_cache_bounded(stack):
    redis_url, _, workers = stack
    w = workers[0]
    misses_before = w.metric("inferq:grammar_cache_lookups_total", result="miss")
    with Producer(redis_url=redis_url, default_model=SMOL) as p:
        handles = [p.submit(prompt_token_ids=[1, 2, 3], sampling=SamplingParams(
            max_tokens=1, temperature=0,
            structured_outputs={"json": {"type": "object", "properties": {f"field_{i}": {"type": "integer"}},
                                         "required": [f"field_{i}"]}})) for i in range(1000)]
        for h in handles:
            assert h.result(timeout=600).usage.completion_tokens == 1
    assert w.metric("inferq:grammar_cache_lookups_total", result="miss") - misses_before == 1000
    assert w.metric("inferq:grammar_cache_entries") == CACHE_BOUND
    assert w.metric("inferq:grammar_compile_seconds_count") >= 1000


def test_async_sdk_and_batch_api_lines_carry_the_constraint(stack, client):
    import asyncio
    import io

    from tests.gateway.test_batch_api import wait_status

    from inferq.producer import AsyncProducer

    redis_url = stack[0]
    schema = SCHEMAS["enum_colour"]

    async def via_async_sdk():
        async with AsyncProducer(redis_url, default_model=SMOL) as ap:
            h = await ap.submit(messages=[{"role": "user", "content": PROMPTS["enum_colour"]}],
                                sampling={"max_tokens": 60, "temperature": 0, "structured_outputs": {"json": schema}})
            return await h.result(timeout=120)

    res = asyncio.run(via_async_sdk())
    assert res.finish_reason == "stop"
    jsonschema.validate(json.loads(res.text), schema)

    body = {"model": SMOL, "messages": [{"role": "user", "content": PROMPTS["enum_colour"]}], "max_tokens": 60,
            "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}}
    bad = dict(body, response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": {"uniqueItems": True}}})
    lines = [json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": b})
             for cid, b in (("good", body), ("bad", bad))]
    f = client.files.create(file=("so.jsonl", io.BytesIO("\n".join(lines).encode() + b"\n")), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    b = wait_status(client, b.id, {"completed", "failed", "cancelled", "expired"})
    assert b.status == "completed" and b.request_counts.completed == 1 and b.request_counts.failed == 1
    out = [json.loads(x) for x in client.files.content(b.output_file_id).text.splitlines() if x]
    answer = out[0]["response"]["body"]["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(answer), schema)
    assert answer == res.text  # the same greedy job, whichever way it was sent
    errs = [json.loads(x) for x in client.files.content(b.error_file_id).text.splitlines() if x]
    assert errs[0]["custom_id"] == "bad" and "uniqueItems" in json.dumps(errs[0])
