"""Security: Redis ACL users and passwords, gateway API keys, tenant isolation.

The session fleet already runs as the restricted ACL user ``inferq``
(``~inferq:* &inferq:* +@all -@dangerous``): every test in this suite that
uses it shows the worker, SDK and gateway need nothing more."""
from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest
import redis

from inferq.producer import Producer
from inferq.schemas import keys
from tests.gateway.stack import running_gateway
from tests.reliability.conftest import MODEL, USER, wait_for
from tests.workers import REPO


def last_job_id(r: redis.Redis) -> bytes:
    """The id of the last XADD ever made to the job stream (survives XDEL)."""
    return r.xinfo_stream(keys.jobs(MODEL))["last-generated-id"]


def test_acl_user_runs_everything_and_nothing_else(fleet, secure_redis, r):
    with Producer(secure_redis.user_url, default_model=MODEL) as p:
        res = p.submit("acl", sampling={"max_tokens": 3, "temperature": 0}).result(timeout=60)
        assert res.usage.completion_tokens == 3
    with running_gateway(secure_redis.user_url) as gw:
        resp = httpx.post(f"{gw}/v1/completions", timeout=60, json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 2
        assert httpx.get(f"{gw}/health", timeout=10).json()["models"][MODEL]["live_workers"] == 2
    # The same credentials can touch nothing outside inferq's keys, and no dangerous command.
    with pytest.raises(redis.exceptions.NoPermissionError):
        r.set("someone-else:key", "x")
    with pytest.raises(redis.exceptions.NoPermissionError):
        r.flushall()
    with pytest.raises(redis.exceptions.NoPermissionError):
        r.config_get("requirepass")
    assert all(w.proc.poll() is None for w in fleet.workers.values())


def test_wrong_password_fails_fast_with_a_clear_message(secure_redis, tiny_model):
    bad_url = f"redis://{USER}:not-the-password@127.0.0.1:{secure_redis.port}/0"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "inferq.gpuworker.service", "--redis-url", bad_url, "--model", str(tiny_model),
                           "--served-model-name", MODEL], cwd=REPO, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 1
    assert "Redis refused the credentials" in proc.stderr and "INFERQ_REDIS_PASSWORD" in proc.stderr
    assert "not-the-password" not in proc.stderr + proc.stdout  # no secret in the output
    assert "engine_ready" not in proc.stdout  # failed before loading a model
    p = Producer(bad_url, default_model=MODEL)
    with pytest.raises(redis.exceptions.AuthenticationError, match="invalid username-password"):
        p.submit("x")
    p.close()
    print(f"\n[reliability] wrong password: worker exited 1 after {took:.1f}s (no model loaded); SDK raised")


@pytest.fixture(scope="module")
def keyed(fleet, secure_redis):
    with running_gateway(secure_redis.user_url, api_keys="alice-key:alice,bob-key:bob,ops-key") as url:
        yield url


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


ROUTES = [
    ("POST", "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1}),
    ("POST", "/v1/jobs", {"model": MODEL, "prompt": "x", "sampling": {"max_tokens": 1}}),
    ("GET", "/v1/models", None),
    ("GET", "/v1/jobs/some-job", None),
    ("GET", "/v1/jobs/some-job/events", None),
    ("DELETE", "/v1/jobs/some-job", None),
]


def test_no_or_wrong_key_is_401_and_never_reaches_the_queue(keyed, r):
    before = last_job_id(r)
    bad_headers = [{}, auth("wrong"), auth("alice-keyX"), auth("alice-ke"), {"Authorization": "alice-key"},
                   {"Authorization": "Basic alice-key"}, {"Authorization": "Bearer"}]
    n = 0
    for method, path, body in ROUTES:
        for headers in bad_headers:
            resp = httpx.request(method, f"{keyed}{path}", json=body, headers=headers, timeout=10)
            assert resp.status_code == 401, (method, path, headers, resp.text)
            assert resp.json()["error"]["code"] == "invalid_api_key"
            n += 1
    assert last_job_id(r) == before  # nothing was enqueued
    print(f"\n[reliability] api keys: {n} unauthenticated requests, all 401, 0 jobs enqueued")


def test_tenant_cannot_read_or_cancel_another_tenants_job(keyed, r):
    body = {"model": MODEL, "prompt": "alice's secret", "sampling": {"max_tokens": 200, "ignore_eos": True,
                                                                       "temperature": 0}}
    job = httpx.post(f"{keyed}/v1/jobs", json=body, headers=auth("alice-key"), timeout=30).json()["id"]
    for method, path in (("GET", f"/v1/jobs/{job}"), ("GET", f"/v1/jobs/{job}/events"),
                         ("DELETE", f"/v1/jobs/{job}")):
        resp = httpx.request(method, f"{keyed}{path}", headers=auth("bob-key"), timeout=10)
        assert resp.status_code == 404, (method, path)
        assert resp.json()["error"]["code"] == "job_not_found"
        assert "secret" not in resp.text
    assert not r.exists(keys.cancel(job))  # bob's DELETE did nothing
    wait_for(lambda: r.hget(keys.job_info(job), "status") == b"done", 120, what="alice's job finished")
    done = httpx.get(f"{keyed}/v1/jobs/{job}", headers=auth("alice-key"), timeout=10).json()
    assert done["finish_reason"] == "length" and done["usage"]["completion_tokens"] == 200


def test_idempotency_keys_do_not_cross_tenants(keyed, r):
    """Bob reusing Alice's idempotency key must get his own job, not hers."""
    body = {"model": MODEL, "prompt": "p", "sampling": {"max_tokens": 1}, "idempotency_key": "order-42"}
    a = httpx.post(f"{keyed}/v1/jobs", json=body, headers=auth("alice-key"), timeout=30).json()
    b = httpx.post(f"{keyed}/v1/jobs", json=body, headers=auth("bob-key"), timeout=30).json()
    a2 = httpx.post(f"{keyed}/v1/jobs", json=body, headers=auth("alice-key"), timeout=30).json()
    assert a2["id"] == a["id"] and a2["duplicate"] is True  # still deduplicated within a tenant
    assert b["id"] != a["id"] and b["duplicate"] is False
    assert httpx.get(f"{keyed}/v1/jobs/{b['id']}", headers=auth("bob-key"), timeout=10).status_code == 200
