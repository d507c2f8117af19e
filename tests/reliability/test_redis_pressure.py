"""Redis out of memory (noeviction): admission answers QueueUnavailable in the
SDK and 503 + Retry-After at the gateway, the worker stays alive and retries
its writes with back-off, and once memory frees every job completes with the
same text a clean run gives (no delta lost or repeated)."""
from __future__ import annotations

import httpx
import pytest
import redis

from inferq.producer import Producer, QueueUnavailable
from inferq.schemas import SamplingParams, keys
from tests.conftest import RedisServer
from tests.gateway.stack import running_gateway
from tests.reliability.conftest import pending_count
from tests.service.conftest import WorkerProc, offline_llm, wait_for  # noqa: F401  (offline_llm is a fixture)

MODEL = "tiny-oom"
TOKENS = 120


def greedy() -> dict:
    return {"max_tokens": TOKENS, "temperature": 0.0, "ignore_eos": True}


def test_out_of_memory_is_refused_at_the_edge_and_nothing_is_lost(tmp_path, tiny_model, offline_llm):
    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis").start()
    admin = redis.Redis.from_url(server.url)
    # Paced: the jobs are still running when memory runs out, on any machine.
    w = WorkerProc(server.url, tiny_model, MODEL, tmp_path, "oom-1", "--step-pace-s", "0.02").wait_ready()
    p = Producer(server.url, default_model=MODEL)
    try:
        prompts = [f"pressure job {i}" for i in range(4)]
        handles = [p.submit(t, sampling=greedy()) for t in prompts]
        wait_for(lambda: all(h.status().get("status") == "running" for h in handles), 60, what="jobs running")

        admin.config_set("maxmemory", str(admin.info("memory")["used_memory"] // 2))  # over the limit now
        with pytest.raises(QueueUnavailable, match="refuses writes"):
            p.submit("refused while out of memory")
        with running_gateway(server.url, producer={"default_model": MODEL}) as gw:
            resp = httpx.post(f"{gw}/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 4},
                              timeout=60)
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["code"] == "queue_unavailable" and resp.headers["retry-after"]
        wait_for(lambda: "redis_refusing_writes_retrying" in w.log(), 60, what="the worker hitting OOM")
        assert w.proc.poll() is None, w.log()[-3000:]

        admin.config_set("maxmemory", "0")  # memory frees
        expected = offline_llm.generate(prompts, SamplingParams(**greedy()))
        for h, exp in zip(handles, expected):
            res = h.result(timeout=180)
            assert res.finish_reason == "length" and res.usage.completion_tokens == TOKENS
            assert res.text == exp.text
        assert w.proc.poll() is None
        wait_for(lambda: pending_count(admin, MODEL) == 0 and admin.xlen(keys.jobs(MODEL)) == 0, 30,
                 what="queue drained")
        assert admin.xlen(keys.dlq(MODEL)) == 0
    finally:
        admin.config_set("maxmemory", "0")
        p.close()
        w.terminate()
        admin.close()
        server.stop()
