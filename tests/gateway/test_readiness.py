"""Readiness tells the truth: /ready says "not ready" (503 with a reason) until a
live worker serves a model, a request sent meanwhile gets a clear 503 (never a
404 or 500), and both turn good once the worker has registered. /health stays a
liveness answer (200 while Redis is reachable) throughout."""
import httpx
import pytest

from tests.gateway.stack import TINY, Stack, running_gateway

CHAT = {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}


@pytest.fixture
def bare_stack(tmp_path):
    s = Stack(tmp_path)  # its own redis-server; the worker is started by the test
    yield s
    s.stop()


def test_ready_only_once_a_worker_serves_and_requests_meanwhile_get_503(bare_stack):
    # As `inferq up` runs it: the gateway offers the model its worker will serve.
    with running_gateway(bare_stack.url, producer={"default_model": TINY}, models=TINY) as url:
        r = httpx.get(f"{url}/ready", timeout=10)
        assert r.status_code == 503
        body = r.json()
        assert body["status"] == "not_ready" and "no live worker" in body["reason"]
        assert r.headers["retry-after"]
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200  # alive, just not ready

        # Before any worker registered: the offered model is "starting", not unknown.
        early = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=30)
        assert early.status_code == 503, early.text
        assert early.json()["error"]["code"] == "no_worker" and early.headers["retry-after"]
        no_model = httpx.post(f"{url}/v1/chat/completions", json={k: v for k, v in CHAT.items() if k != "model"},
                              timeout=30)
        assert no_model.status_code == 503 and no_model.json()["error"]["code"] == "no_worker"

        bare_stack.start_worker()  # returns once the worker's heartbeat is in Redis

        r = httpx.get(f"{url}/ready", timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "ready" and r.json()["models"][TINY]["live_workers"] == 1
        done = httpx.post(f"{url}/v1/chat/completions", json=CHAT, timeout=120)
        assert done.status_code == 200, done.text
        assert done.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_ready_is_503_when_redis_is_unreachable(bare_stack):
    with running_gateway(bare_stack.url) as url:
        bare_stack.redis.stop()
        r = httpx.get(f"{url}/ready", timeout=30)
        assert r.status_code == 503
        assert "unreachable" in r.json()["reason"]
