"""Chaos: SIGKILL the worker holding 50 streaming jobs while a second worker
runs. Every job completes once, each client's text is whole and equals a clean
greedy run, and nothing is left pending or dead-lettered."""
from __future__ import annotations

import redis

from inferq.producer import Producer
from inferq.schemas import SamplingParams, keys
from tests.reliability.conftest import pending_count, wait_for
from tests.reliability.streams import watch

N_JOBS = 50
MAX_TOKENS = 100


def greedy() -> dict:
    return {"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True}


def deltas(r: redis.Redis, job_id: str) -> int:
    return sum(1 for _, f in r.xrange(keys.reply(job_id)) if f[b"type"] == b"delta")


def test_sigkill_with_50_jobs_in_flight(chaos, chaos_oracle):
    r = chaos.client()
    p = Producer(chaos.url, default_model="chaos")
    prompts = [f"chaos job {i}: " + "lorem ipsum " * (i % 7) for i in range(N_JOBS)]
    # Queued before any worker runs, so the first worker up takes all of them at once.
    handles = [p.submit(pr, sampling=greedy()) for pr in prompts]
    watched = [watch(h) for h in handles]

    v_name, s_name = "chaos-kill-1", "chaos-kill-2"
    # Paced (100 steps >= 5 s a job on any machine), so the kill below always lands mid-generation.
    chaos.fleet.start(v_name, s_name, extra=("--step-pace-s", "0.05"))
    wait_for(lambda: all(deltas(r, h.id) > 0 for h in handles), 120, what="all 50 jobs streaming")
    holders = [h.status().get("worker") for h in handles]
    victim = max((v_name, s_name), key=holders.count)
    survivor = s_name if victim == v_name else v_name
    held = holders.count(victim)
    assert held >= N_JOBS // 2, holders
    chaos.fleet.workers[victim].kill()
    # The kill landed mid-generation: none of the victim's jobs had finished.
    victim_jobs = [h for h, who in zip(handles, holders) if who == victim]
    assert all(deltas(r, h.id) < MAX_TOKENS for h in victim_jobs)

    for _, t in watched:
        t.join(240)
    expected = chaos_oracle.generate(prompts, SamplingParams(**greedy()))
    for (w, _), exp, who in zip(watched, expected, holders):
        assert w.error is None, w.error
        assert w.text == exp.text, w.job_id  # whole, and what a clean greedy run prints
        assert w.count("done") == 1 and w.types[-1] == "done"  # finished exactly once
        assert w.status["status"] == "done"
        if who == victim:
            assert w.count("restarted") == 1 and w.status["attempt"] == 2 and w.status["worker"] == survivor
        else:
            assert w.count("restarted") == 0 and w.status["attempt"] == 1

    assert r.xlen(keys.jobs("chaos")) == 0
    assert pending_count(r, "chaos") == 0
    assert r.xlen(keys.dlq("chaos")) == 0
    survivor_w = chaos.fleet.workers[survivor]
    assert survivor_w.proc.poll() is None
    assert survivor_w.metric("inferq:jobs_reclaimed_total") >= held
    print(f"\n[reliability] sigkill: {N_JOBS} jobs in flight, {held} on the killed worker, "
          f"redelivered {held}, lost 0, finished twice 0")
    p.close()
    r.close()
