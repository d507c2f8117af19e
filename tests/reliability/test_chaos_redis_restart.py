"""Chaos: restart redis-server (AOF on, same port and data folder) while jobs
are queued and running. Queued jobs survive and complete, the worker and the
gateway reconnect on their own, and clients resume their reply streams."""
from __future__ import annotations

import json
import threading
import time

import httpx

from inferq.producer import Producer
from inferq.schemas import SamplingParams, keys
from tests.gateway.stack import running_gateway
from tests.reliability.conftest import pending_count, wait_for
from tests.reliability.streams import watch

N_JOBS = 160  # more than the worker's 64 slots: some are still queued at the restart
MAX_TOKENS = 40
# The worker is paced: a batch of 64 jobs takes 40 steps, >= 2 s on any machine, so jobs are
# still queued when generation is seen under way (unpaced, a fast machine took them all first).
PACE = ("--step-pace-s", "0.05")


def greedy() -> dict:
    return {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}


def sse_events(url: str, job_id: str, last_event_id: str | None, out: list) -> None:
    """Read the native events stream into ``out`` until done, or until the connection breaks."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    with httpx.stream("GET", f"{url}/v1/jobs/{job_id}/events", headers=headers, timeout=30) as resp:
        assert resp.status_code == 200, resp.read()
        ev_id = None
        for line in resp.iter_lines():
            if line.startswith("id: "):
                ev_id = line[4:]
            elif line.startswith("data: "):
                out.append((ev_id, json.loads(line[6:])))


def test_redis_restart_with_jobs_queued_and_running(chaos, chaos_oracle):
    for w in chaos.fleet.alive():  # only the paced worker takes these jobs
        w.terminate(timeout=20)
    workers = chaos.fleet.start("chaos-redis-paced", extra=PACE)
    r = chaos.client()
    p = Producer(chaos.url, default_model="chaos")
    prompts = [f"restart job {i}" for i in range(N_JOBS)]
    handles = [p.submit(pr, sampling=greedy()) for pr in prompts]
    # One SDK client per job streams the last 90 (a redis-py pool has ~100 connections).
    watched = [watch(h) for h in handles[-90:]]
    with running_gateway(chaos.url) as gw:
        sse_job = handles[-1].id  # among the last queued: still waiting at the restart
        before: list = []

        def first_connection():
            try:
                sse_events(gw, sse_job, None, before)
            except httpx.HTTPError:
                pass  # the connection broke with the restart: resumed below

        sse_thread = threading.Thread(target=first_connection, daemon=True)
        sse_thread.start()
        wait_for(lambda: before and any(w.count("delta") for w, _ in watched), 60, what="generation under way")
        pipe = r.pipeline(transaction=False)
        for h in handles:
            pipe.hget(keys.job_info(h.id), "status")
        queued_at_restart = sum(1 for s in pipe.execute() if s == b"queued")  # not started by any worker
        r.close()

        chaos.stop_redis()
        t_down = time.monotonic()
        # While Redis is down the gateway says so (503, retry), it does not fail as a bug would (500).
        down = httpx.post(f"{gw}/v1/jobs", timeout=60, json={"model": "chaos", "prompt": "x", "sampling": greedy()})
        assert down.status_code == 503, down.text
        assert down.json()["error"]["code"] == "redis_unavailable" and down.headers["retry-after"]
        assert httpx.get(f"{gw}/health", timeout=60).status_code == 503
        time.sleep(max(0.0, 2.0 - (time.monotonic() - t_down)))  # the outage lasts at least 2 s (fault, not a wait)
        chaos.start_redis()
        outage_s = time.monotonic() - t_down

        r = chaos.client()
        for w, t in watched:
            t.join(180)
        sse_thread.join(60)
        # The gateway reconnects: new requests work, and a client whose events
        # stream broke resumes after the last id it saw (Last-Event-ID), missing nothing.
        resumed: list = []
        if not before or "finish_reason" not in before[-1][1]:
            sse_events(gw, sse_job, before[-1][0] if before else None, resumed)
        assert httpx.get(f"{gw}/health", timeout=10).json()["redis"] is True
        late = httpx.post(f"{gw}/v1/jobs", timeout=30, json={"model": "chaos", "prompt": "after", "sampling": greedy()})
        assert late.status_code == 202
        assert p.job(late.json()["id"]).result(timeout=60).usage.completion_tokens == MAX_TOKENS

    expected = chaos_oracle.generate(prompts[-90:], SamplingParams(**greedy()))
    for (w, _), exp in zip(watched, expected):
        assert w.error is None, repr(w.error)
        assert w.text == exp.text and w.types[-1] == "done"
    seen = [ev for _, ev in before + resumed]
    assert seen[-1]["finish_reason"] == "length"
    ids = [i for i, _ in before + resumed]
    assert len(ids) == len(set(ids))  # resumed after the last id: no event twice
    assert "".join(ev.get("text", "") for ev in seen if "text" in ev and ev["attempt"] == seen[-1]["attempt"]) \
        == expected[-1].text
    for w in workers:
        assert w.proc.poll() is None  # no crash
        assert "redis_unavailable_retrying" in w.log()
    assert queued_at_restart > 0
    assert r.xlen(keys.jobs("chaos")) == 0 and pending_count(r, "chaos") == 0 and r.xlen(keys.dlq("chaos")) == 0
    print(f"\n[reliability] redis restart: {N_JOBS} jobs, {queued_at_restart} still queued at the restart, "
          f"{outage_s:.1f} s outage, lost 0, worker and gateway reconnected; SSE client: "
          + (f"resumed with {len(resumed)} events after {len(before)}" if resumed else
             f"stream carried on through the outage ({len(before)} events)"))
    p.close()
    for w in workers:  # later tests start unpaced workers
        w.terminate(timeout=20)
    r.close()
