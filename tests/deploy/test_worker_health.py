"""The worker's GET /health (the compose healthcheck and the Kubernetes liveness probe):
200 while the engine loop thread is alive and came round recently, 503 with the reason
otherwise. The stall cases run on a given clock, so no test waits on the machine's speed."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

from inferq.gpuworker.metrics import WorkerMetrics
from inferq.gpuworker.service.health import engine_loop_checker, engine_loop_health
from tests.conftest import free_port
from tests.workers import WorkerProc


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_health_follows_the_engine_loop_beat():
    assert engine_loop_health(True, 100.0, 100.5, 120.0).ok
    assert engine_loop_health(True, 100.0, 220.0, 120.0).ok  # at the limit
    stalled = engine_loop_health(True, 100.0, 220.5, 120.0)
    assert not stalled.ok and "120 s ago" in stalled.reason and "stuck" in stalled.reason
    assert not engine_loop_health(True, None, 100.0, 120.0).ok  # not started
    dead = engine_loop_health(False, 100.0, 100.1, 120.0)
    assert not dead.ok and "not running" in dead.reason


def test_the_metrics_port_answers_health_503_once_the_loop_stalls():
    loop = SimpleNamespace(last_beat=1000.0, is_alive=lambda: True)
    now = [1000.2]
    port = free_port()
    server = WorkerMetrics("m").serve(port, "127.0.0.1", health=engine_loop_checker(loop, 30.0, clock=lambda: now[0]))
    try:
        base = f"http://127.0.0.1:{port}"
        assert get(f"{base}/health") == (200, {"status": "ok", "reason": "the engine loop came round 0.20 s ago"})
        now[0] = 1031.0  # the loop has not beaten for 31 s
        code, body = get(f"{base}/health")
        assert code == 503 and body["status"] == "unhealthy" and "31 s ago" in body["reason"]
        loop.last_beat = 1030.9  # it came round again
        assert get(f"{base}/health")[0] == 200
        loop.is_alive = lambda: False
        assert get(f"{base}/health")[0] == 503
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as r:  # /metrics unchanged beside it
            assert b"inferq:num_requests_running" in r.read()
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tests.tiny_models import save_tiny_model

    return save_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "llama")


def test_a_real_worker_answers_health_200_while_idle(redis_server, tiny_model, tmp_path):
    """An idle engine takes no step; its loop still comes round, so /health stays 200."""
    w = WorkerProc(redis_server.url, tiny_model, "tiny-health", tmp_path, "health-1", metrics=True)
    try:
        w.wait_ready()
        code, body = get(f"http://127.0.0.1:{w.metrics_port}/health")
        assert code == 200 and body["status"] == "ok", body
    finally:
        w.terminate()
