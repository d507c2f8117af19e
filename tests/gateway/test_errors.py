"""Every error status the gateway returns, in OpenAI's error shape."""
import time

import httpx
import pytest
import redis

from inferq.schemas import keys
from tests.gateway.stack import TINY, running_gateway


def assert_openai_error(resp: httpx.Response, status: int, code: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    if code is not None:
        assert err["code"] == code
    return err


def chat(url: str, **body) -> httpx.Response:
    payload = {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body}
    return httpx.post(f"{url}/v1/chat/completions", json=payload, timeout=60)


@pytest.mark.parametrize("body, param_hint", [
    ({"temperature": 5.0}, "temperature"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"messages": []}, "messages"),
    ({"n": 17}, "n=17 exceeds the limit"),
    ({"stop": ["a"] * 20}, "stop"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "image_url"),
])
def test_invalid_chat_input_is_400(gateway_url, body, param_hint):
    err = assert_openai_error(chat(gateway_url, **body), 400)
    assert err["type"] == "invalid_request_error"
    assert param_hint in err["message"] + str(err["param"])


def test_malformed_json_is_400(gateway_url):
    r = httpx.post(f"{gateway_url}/v1/completions", content=b"{not json", timeout=10,
                   headers={"content-type": "application/json"})
    assert_openai_error(r, 400)


def test_max_tokens_above_cap_is_400(stack):
    with running_gateway(stack.url, max_tokens_cap=64) as url:
        err = assert_openai_error(chat(url, max_tokens=65), 400)
        assert "64" in err["message"] and err["param"] == "max_tokens"


def test_prompt_over_char_cap_is_400(stack):
    with running_gateway(stack.url, max_prompt_chars=100) as url:
        err = assert_openai_error(chat(url, messages=[{"role": "user", "content": "x" * 101}]), 400, "prompt_too_long")
        assert "100" in err["message"]


def test_worker_side_validation_error_is_400(gateway_url):
    # Token ids beyond the vocabulary pass the gateway and are refused by the worker.
    r = httpx.post(f"{gateway_url}/v1/completions", timeout=60,
                   json={"model": TINY, "prompt": [10**7], "max_tokens": 2})
    err = assert_openai_error(r, 400, "invalid_prompt")
    assert "vocabulary" in err["message"]


def test_body_over_limit_is_413(stack):
    with running_gateway(stack.url, max_body_bytes=2048) as url:
        r = chat(url, messages=[{"role": "user", "content": "y" * 4096}])
        assert_openai_error(r, 413, "request_too_large")


def test_unknown_model_is_404(gateway_url):
    err = assert_openai_error(chat(gateway_url, model="nope"), 404, "model_not_found")
    assert TINY in err["message"]  # says what is served


def test_unknown_job_is_404(gateway_url):
    for method, path in (("GET", "/v1/jobs/doesnotexist"), ("DELETE", "/v1/jobs/doesnotexist"),
                         ("GET", "/v1/jobs/doesnotexist/events")):
        assert_openai_error(httpx.request(method, f"{gateway_url}{path}", timeout=10), 404, "job_not_found")


def test_model_without_live_workers_is_503(stack):
    # A model whose workers all stopped: its job stream and group remain.
    r = redis.Redis.from_url(stack.url)
    r.xgroup_create(keys.jobs("orphan"), keys.JOBS_GROUP, id="$", mkstream=True)
    r.zadd(keys.workers("orphan"), {"gone-worker": time.time() - 3600})
    with running_gateway(stack.url) as url:
        resp = chat(url, model="orphan")
        err = assert_openai_error(resp, 503, "no_worker")
        assert resp.headers["retry-after"] == "5"
        assert "orphan" in err["message"]
        health = httpx.get(f"{url}/health", timeout=10).json()
        assert health["models"]["orphan"]["live_workers"] == 0
        assert health["models"][TINY]["live_workers"] >= 1
    r.delete(keys.jobs("orphan"), keys.workers("orphan"))


def test_configured_model_without_worker_is_503(stack):
    with running_gateway(stack.url, models=f"{TINY},planned") as url:
        assert_openai_error(chat(url, model="planned"), 503, "no_worker")
        assert_openai_error(chat(url, model="other"), 404, "model_not_found")


def test_full_backlog_is_429_with_retry_after(stack):
    # Backlog bound 1: a running job holds its stream entry until it finishes.
    with running_gateway(stack.url, producer={"max_backlog": 1}) as url:
        first = httpx.post(f"{url}/v1/jobs", timeout=30, json={
            "model": TINY, "prompt": "long", "sampling": {"max_tokens": 2000, "ignore_eos": True}})
        assert first.status_code == 202
        try:
            resp = chat(url)
            err = assert_openai_error(resp, 429, "queue_full")
            assert int(resp.headers["retry-after"]) >= 1
            assert "full" in err["message"]
            assert err["type"] == "rate_limit_error"
        finally:
            httpx.delete(f"{url}/v1/jobs/{first.json()['id']}", timeout=10)


def test_tenant_rate_limit_is_429_with_retry_after(stack):
    with running_gateway(stack.url, api_keys="k1:acme", producer={"rate_limit": 0.01, "rate_burst": 1}) as url:
        h = {"Authorization": "Bearer k1"}
        body = {"model": TINY, "prompt": "a", "sampling": {"max_tokens": 1}}
        assert httpx.post(f"{url}/v1/jobs", json=body, headers=h, timeout=30).status_code == 202
        resp = httpx.post(f"{url}/v1/jobs", json=body, headers=h, timeout=30)
        assert_openai_error(resp, 429, "rate_limited")
        assert int(resp.headers["retry-after"]) >= 50  # one token per 100 s


def test_job_nobody_finishes_is_504_and_cancelled(stack):
    """The backstop when the worker stops answering after admission: the
    gateway gives up (504), cancels the job, and the worker never runs it."""
    import os
    import signal

    with running_gateway(stack.url, request_timeout_s=1.0) as url:
        os.kill(stack.worker.pid, signal.SIGSTOP)  # alive (fresh heartbeat) but not working
        try:
            t0 = time.monotonic()
            resp = chat(url, max_tokens=8)
            elapsed = time.monotonic() - t0
        finally:
            os.kill(stack.worker.pid, signal.SIGCONT)
        err = assert_openai_error(resp, 504, "timeout")
        assert "cancelled" in err["message"] and 1.5 < elapsed < 10
        job = resp.headers.get("x-inferq-job-id")
    r = redis.Redis.from_url(stack.url)
    assert r.exists(keys.cancel(job)) or r.hget(keys.job_info(job), "status") in (b"cancelled", b"done")


SURROGATE = '"\\ud800x"'  # a lone surrogate: valid JSON, not encodable as UTF-8


@pytest.mark.parametrize("path, raw", [
    ("/v1/completions", '{"model": "%s", "prompt": "hi", "max_tokens": 2, "stop": [%s]}'),
    ("/v1/chat/completions", '{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stop": %s}'),
    ("/v1/chat/completions", '{"model": "%s", "messages": [{"role": "user", "content": %s}], "max_tokens": 2}'),
    ("/v1/completions", '{"model": "%s", "prompt": %s, "max_tokens": 2}'),
    ("/v1/jobs", '{"model": "%s", "prompt": "hi", "sampling": {"max_tokens": 2, "stop": [%s]}}'),
    ("/v1/jobs", '{"model": "%s", "prompt": %s}'),
    ("/v1/jobs", '{"model": "%s", "prompt": "hi", "metadata": {"k": %s}}'),
])
def test_lone_surrogates_are_400_not_500(gateway_url, path, raw):
    body = (raw % (TINY, SURROGATE)).encode()
    r = httpx.post(f"{gateway_url}{path}", content=body, headers={"content-type": "application/json"}, timeout=30)
    err = assert_openai_error(r, 400)
    assert "surrogate" in err["message"] or "unicode string" in err["message"], err
