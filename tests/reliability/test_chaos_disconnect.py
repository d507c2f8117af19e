"""Chaos: streaming clients that go away mid-stream. The worker keeps serving
everyone else; a gateway client's disconnect cancels its job and frees its KV
blocks; an SDK client's disconnect does not (its stream is resumable), and the
SDK's cancel frees the blocks."""
from __future__ import annotations

import httpx
import pytest

from inferq.producer import Producer
from inferq.producer.client import ResultBuilder
from inferq.schemas import SamplingParams
from tests.gateway.stack import running_gateway
from tests.reliability.conftest import MODEL, wait_for
from tests.reliability.streams import watch
from tests.service.conftest import offline_llm  # noqa: F401  (fixture: the in-process engine oracle)


def greedy(n: int) -> dict:
    return {"max_tokens": n, "temperature": 0.0, "ignore_eos": True}


def engines_idle(fleet) -> bool:
    """No job in any worker's engine and no KV block in use."""
    return all(w.metric("inferq:num_requests_running") == 0 and w.metric("inferq:num_requests_waiting") == 0
               and w.metric("inferq:kv_cache_usage_perc") == 0 for w in fleet.alive())


@pytest.fixture(scope="module")
def gw(fleet, secure_redis):
    with running_gateway(secure_redis.user_url) as url:
        yield url


def test_gateway_disconnect_cancels_and_frees_blocks_others_unaffected(fleet, gw, secure_redis, offline_llm):
    p = Producer(secure_redis.user_url, default_model=MODEL)
    others_prompts = [f"bystander {i}" for i in range(6)]
    others = [watch(p.submit(pr, sampling=greedy(120))) for pr in others_prompts]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a long story"}], "stream": True,
            "max_tokens": 400, "ignore_eos": True}
    with httpx.stream("POST", f"{gw}/v1/chat/completions", json=body, timeout=60) as resp:
        job_id = resp.headers["x-inferq-job-id"]
        chunks = 0
        for line in resp.iter_lines():
            if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                chunks += 1
                if chunks >= 3:
                    # Blocks are in use now (so "back to 0" below means freed, not never used).
                    assert any(w.metric("inferq:kv_cache_usage_perc") > 0 for w in fleet.alive())
                    break  # the client goes away here
    res = p.job(job_id).result(timeout=60)
    assert res.finish_reason == "abort" and res.usage.completion_tokens < 400
    assert p.job(job_id).status()["status"] == "cancelled"
    for w, t in others:
        t.join(120)
    expected = offline_llm.generate(others_prompts, SamplingParams(**greedy(120)))
    for (w, _), exp in zip(others, expected):
        assert w.error is None and w.text == exp.text and w.status["status"] == "done"
    wait_for(lambda: engines_idle(fleet), 30, what="engines idle with every KV block free")
    assert all(w.metric("inferq:engine_invariant_failures_total") == 0 for w in fleet.alive())
    p.close()


def test_native_events_disconnect_does_not_cancel(fleet, gw, secure_redis):
    """The jobs API's events stream is meant to be resumed: dropping it leaves the job running."""
    job = httpx.post(f"{gw}/v1/jobs", timeout=30, json={"model": MODEL, "prompt": "keep going",
                                                         "sampling": greedy(150)}).json()["id"]
    with httpx.stream("GET", f"{gw}/v1/jobs/{job}/events", timeout=60) as resp:
        for line in resp.iter_lines():
            if line == "event: delta":
                break  # the client goes away here
    p = Producer(secure_redis.user_url, default_model=MODEL)
    res = p.job(job).result(timeout=120)
    assert res.finish_reason == "length" and res.usage.completion_tokens == 150
    assert p.job(job).status()["status"] == "done"
    p.close()


def test_sdk_disconnect_resumes_and_sdk_cancel_frees_blocks(fleet, secure_redis, offline_llm):
    p = Producer(secure_redis.user_url, default_model=MODEL)
    h = p.submit("resume me", sampling=greedy(200))
    builder, last_id, seen = ResultBuilder(h.id), "0-0", 0
    for last_id, ev in h.stream():
        builder.feed(ev)
        seen += ev.type == "delta"
        if seen >= 3:
            break
    p.close()  # the client goes away mid-stream
    # A new client resumes after the last id it saw and misses nothing.
    p2 = Producer(secure_redis.user_url, default_model=MODEL)
    res = None
    for _, ev in p2.job(h.id).stream(last_id=last_id, timeout=120):
        res = builder.feed(ev) or res
    assert res.finish_reason == "length" and res.text == offline_llm.generate(["resume me"], SamplingParams(**greedy(200)))[0].text

    # Cancelling through the SDK mid-stream frees the job's blocks.
    long = p2.submit("cancel me", sampling=greedy(450))
    for _, ev in long.stream(timeout=60):
        if ev.type == "delta":
            break
    assert long.cancel() is True
    res = long.result(timeout=60)
    assert res.finish_reason == "abort" and res.usage.completion_tokens < 450
    wait_for(lambda: engines_idle(fleet), 30, what="engines idle with every KV block free")
    assert all(w.metric("inferq:engine_invariant_failures_total") == 0 for w in fleet.alive())
    p2.close()
