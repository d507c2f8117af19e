"""Limits: every oversized or impossible request is refused with a message
that says which limit it hit (through the gateway, the SDK and the raw stream)."""
from __future__ import annotations

import json

import httpx
import pytest
from pydantic import ValidationError

from inferq.producer import JobFailed, Producer
from inferq.schemas import keys
from tests.gateway.stack import running_gateway
from tests.reliability.conftest import MODEL, wait_for

MAX_MODEL_LEN = 512  # the tiny model's max_position_embeddings


@pytest.fixture(scope="module")
def gw(fleet, secure_redis):
    with running_gateway(secure_redis.user_url, max_body_bytes=4096, max_tokens_cap=64) as url:
        yield url


@pytest.fixture(scope="module")
def sdk(fleet, secure_redis):
    with Producer(secure_redis.user_url, default_model=MODEL) as p:
        yield p


def error_of(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    return resp.json()["error"]


def test_oversized_body(gw):
    body = {"model": MODEL, "prompt": "x" * 5000, "max_tokens": 1}
    err = error_of(httpx.post(f"{gw}/v1/completions", json=body, timeout=10), 413)
    assert err["code"] == "request_too_large" and "limit of 4096 bytes" in err["message"]

    def chunks():  # no Content-Length: the limit is counted while reading
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    err = error_of(httpx.post(f"{gw}/v1/completions", content=chunks(), timeout=10,
                              headers={"content-type": "application/json"}), 413)
    assert "limit of 4096 bytes" in err["message"]


def test_prompt_past_max_model_len(gw, sdk):
    ids = [100] * 600
    err = error_of(httpx.post(f"{gw}/v1/completions", json={"model": MODEL, "prompt": ids, "max_tokens": 1},
                              timeout=60), 400)
    expected = f"the prompt has 600 tokens, but this model allows at most {MAX_MODEL_LEN - 1} prompt tokens " \
               f"(max_model_len {MAX_MODEL_LEN})"
    assert err["code"] == "prompt_too_long" and err["message"] == expected
    with pytest.raises(JobFailed) as e:
        sdk.submit(prompt_token_ids=ids, sampling={"max_tokens": 1}).result(timeout=60)
    assert e.value.code == "prompt_too_long" and e.value.message == expected


def test_max_tokens_past_the_cap(gw, sdk):
    err = error_of(httpx.post(f"{gw}/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 65},
                              timeout=10), 400)
    assert err["message"] == "max_tokens=65 exceeds this gateway's cap of 64" and err["param"] == "max_tokens"
    err = error_of(httpx.post(f"{gw}/v1/jobs", timeout=10, json={"model": MODEL, "prompt": "a",
                                                                  "sampling": {"max_tokens": 10**9}}), 400)
    assert "exceeds this gateway's cap of 64" in err["message"]
    # The SDK has no cap of its own: the model's length stops the job.
    res = sdk.submit(prompt_token_ids=[5] * 500, sampling={"max_tokens": 10**9, "ignore_eos": True}).result(timeout=120)
    assert res.finish_reason == "length" and res.usage.completion_tokens == MAX_MODEL_LEN - 500


def test_huge_n_and_logprobs(gw, sdk):
    err = error_of(httpx.post(f"{gw}/v1/completions", json={"model": MODEL, "prompt": "a", "n": 10**6}, timeout=10), 400)
    assert "n=1000000 exceeds the limit of 16 choices" in err["message"]
    err = error_of(httpx.post(f"{gw}/v1/completions", json={"model": MODEL, "prompt": "a", "logprobs": 10**6},
                              timeout=10), 400)
    assert err["param"] == "logprobs" and "less than or equal to 20" in err["message"]
    err = error_of(httpx.post(f"{gw}/v1/chat/completions", timeout=10, json={
        "model": MODEL, "messages": [{"role": "user", "content": "a"}], "logprobs": True, "top_logprobs": 21}), 400)
    assert err["param"] == "top_logprobs" and "less than or equal to 20" in err["message"]
    with pytest.raises(ValidationError, match="less than or equal to 16"):
        sdk.submit("a", sampling={"n": 10**6})
    with pytest.raises(ValidationError, match="less than or equal to 20"):
        sdk.submit("a", sampling={"logprobs": 10**6})
    # A valid n is served: one job, every choice.
    res = sdk.submit("a", sampling={"n": 2, "temperature": 1.0, "max_tokens": 1}).result(timeout=60)
    assert [c.index for c in res.choices] == [0, 1] and res.usage.completion_tokens == 2


def test_invalid_utf8(gw, r):
    body = b'{"model": "tiny", "prompt": "caf\xe9 \xff\xfe", "max_tokens": 1}'
    err = error_of(httpx.post(f"{gw}/v1/completions", content=body, timeout=10,
                              headers={"content-type": "application/json"}), 400)
    assert err["code"] == "invalid_request"
    assert err["message"] == "the request body could not be decoded: send JSON encoded as UTF-8"
    # Straight onto the stream: dead-lettered with the decoder's reason, the bytes kept as they were.
    raw = b'{"id": "utf8-case", "model": "tiny", "prompt": "\xff"}'
    entry = r.xadd(keys.jobs(MODEL), {"job": raw}).decode()
    dl = wait_for(lambda: [f for _, f in r.xrange(keys.dlq(MODEL)) if f[b"entry_id"].decode() == entry], 60,
                  what="DLQ entry")[0]
    assert dl[b"code"] == b"invalid_job" and b"utf-8" in dl[b"reason"] and dl[b"job"] == raw


def test_unknown_model(gw, r):
    err = error_of(httpx.post(f"{gw}/v1/completions", json={"model": "nope", "prompt": "a"}, timeout=10), 404)
    assert err["code"] == "model_not_found" and err["message"].startswith("model 'nope' does not exist") \
        and MODEL in err["message"]
    # A job for another model written onto this model's stream.
    job = {"id": "wrong-model-case", "model": "other", "prompt": "a"}
    r.xadd(keys.jobs(MODEL), {"job": json.dumps(job)})
    ev = wait_for(lambda: [e for _, e in r.xrange(keys.reply("wrong-model-case")) if e[b"type"] == b"error"], 60,
                  what="error event")[0]
    data = json.loads(ev[b"data"])
    assert data["code"] == "unknown_model" and data["message"] == f"this worker serves '{MODEL}', not 'other'"


def test_last_event_id_out_of_range(gw, sdk):
    """A resume id Redis would refuse (a part over 64 bits, a trailing newline) is a 400
    up front, not a 200 whose stream then breaks."""
    h = sdk.submit("resume", sampling={"max_tokens": 1})
    h.result(timeout=60)
    for bad in ("99999999999999999999-0", "1-18446744073709551616", "1-0\n", "abc"):
        resp = httpx.get(f"{gw}/v1/jobs/{h.id}/events", params={"last_event_id": bad}, timeout=10)
        err = error_of(resp, 400)
        assert err["message"].startswith("Last-Event-ID must be a reply entry id like '1700000000000-0'"), bad
    ok = httpx.get(f"{gw}/v1/jobs/{h.id}/events", params={"last_event_id": "18446744073709551615-0"}, timeout=10)
    assert ok.status_code == 200  # the largest valid id: past the end of a finished job, an empty stream
