"""Fuzz: request bodies for every gateway route that takes one. Each answer is
a success or a 4xx in OpenAI's error shape with a message; never a 5xx, and
the gateway keeps serving."""
from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gateway.stack import running_gateway
from tests.reliability.conftest import MODEL
from tests.reliability.fuzz_inputs import SAMPLING_FIELDS, json_values, mutated, sampling, texts

N_CASES = 1500
CHAT_FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
               "stream", "stream_options", "n", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty",
               "top_k", "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids", "priority", "user", "tools"]
COMPLETION_FIELDS = ["model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "n",
                     "logprobs", "echo", "suffix", "top_k", "ignore_eos", "stop_token_ids", "priority"]
JOB_FIELDS = ["model", "prompt", "messages", "prompt_token_ids", "sampling", "priority", "deadline", "timeout_s",
              "idempotency_key", "metadata"]


@st.composite
def chat_body(draw) -> dict:
    return {"model": MODEL, "max_tokens": draw(st.integers(1, 2)),
            "messages": draw(st.lists(st.fixed_dictionaries({
                "role": st.sampled_from(["system", "developer", "user", "assistant"]), "content": texts}),
                min_size=1, max_size=3))}


@st.composite
def completion_body(draw) -> dict:
    prompt = draw(st.one_of(texts, st.lists(st.integers(0, 60_000), min_size=1, max_size=6)))
    return {"model": MODEL, "prompt": prompt, "max_tokens": draw(st.integers(1, 2))}


@st.composite
def job_body(draw) -> dict:
    body = {"model": MODEL, "sampling": draw(sampling())}
    body["prompt" if draw(st.booleans()) else "prompt_token_ids"] = draw(
        st.one_of(texts, st.lists(st.integers(0, 60_000), min_size=1, max_size=6)))
    return body


@st.composite
def request(draw) -> tuple[str, bytes]:
    route, base, fields = draw(st.sampled_from([
        ("/v1/chat/completions", chat_body, CHAT_FIELDS),
        ("/v1/completions", completion_body, COMPLETION_FIELDS),
        ("/v1/jobs", job_body, JOB_FIELDS),
    ]))
    kind = draw(st.sampled_from(["valid", "mutated", "mutated", "mutated", "json", "bytes"]))
    if kind == "valid":
        return route, json.dumps(draw(base())).encode()
    if kind == "mutated":
        body = draw(mutated(draw(base()), fields, "sampling", SAMPLING_FIELDS))
        body.pop("stream", None)  # streams are covered by the chaos tests; keep each case one round trip
        return route, json.dumps(body).encode()
    if kind == "json":
        return route, json.dumps(draw(json_values)).encode()
    return route, draw(st.binary(max_size=80))  # invalid JSON and invalid UTF-8


@pytest.fixture(scope="module")
def fuzz_gateway(fleet, secure_redis):
    # Small caps keep the valid cases cheap: at most 4 tokens per job.
    with running_gateway(secure_redis.user_url, max_tokens_cap=4, default_max_tokens=2,
                         request_timeout_s=60) as url:
        yield url


def test_gateway_fuzz_never_fails_as_a_server(fuzz_gateway):
    statuses: Counter = Counter()
    client = httpx.Client(base_url=fuzz_gateway, timeout=60)

    @settings(max_examples=N_CASES, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(request())
    def post(case):
        route, body = case
        resp = client.post(route, content=body, headers={"content-type": "application/json"})
        statuses[resp.status_code] += 1
        assert resp.status_code in (200, 202, 400, 404, 413), (route, body, resp.status_code, resp.text)
        payload = resp.json()
        if resp.status_code >= 400:
            err = payload["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["message"], payload
        elif route == "/v1/jobs":
            assert payload["status"] == "queued" and payload["id"]
        else:
            assert payload["choices"] and payload["usage"]["completion_tokens"] <= 4

    post()
    assert client.get("/health").json()["models"][MODEL]["live_workers"] == 2
    ok = client.post("/v1/completions", json={"model": MODEL, "prompt": "ok", "max_tokens": 2})
    assert ok.status_code == 200
    client.close()
    assert sum(statuses.values()) >= 1000
    assert statuses[200] + statuses[202] > 50 and statuses[400] > 200  # both paths were exercised
    print(f"\n[reliability] gateway fuzz: {sum(statuses.values())} requests, statuses {dict(sorted(statuses.items()))}")
