"""Soak (bounded): a few thousand very short jobs with random priorities,
deadlines and cancels across two workers. Afterwards: every job finished
exactly once, the block pool is consistent and empty, the DLQ holds exactly
the jobs meant to fail, no reply or job keys outlive their TTLs, and worker
memory stays flat."""
from __future__ import annotations

import random
import threading
import time

import pytest
import redis

from inferq.producer import Producer
from inferq.schemas import keys
from tests.reliability.conftest import pending_count, rss_kib, wait_for

N_JOBS = 12000
REPLY_TTL = 4  # the chaos workers' --reply-ttl
PRODUCER_TTL = 60  # keys of jobs still waiting, and cancel flags


def counters(w) -> tuple[float, float]:
    return w.metric("inferq:request_success_total"), w.metric("inferq:job_errors_total")


def leftover(r: redis.Redis, pattern: str) -> list[bytes]:
    return list(r.scan_iter(match=pattern, count=1000))


@pytest.mark.slow
def test_soak_short_jobs_with_cancels_deadlines_priorities(chaos):
    rng = random.Random(7)
    workers = chaos.fleet.ensure_count(2, "chaos-soak")[:2]
    before = [counters(w) for w in workers]
    reasons = ("stop", "length", "abort", "deadline")

    def by_reason() -> dict:
        return {k: sum(w.metric("inferq:request_success_total", finished_reason=k) for w in workers) for k in reasons}

    reasons_before = by_reason()
    r = chaos.client()
    r.delete(keys.dlq("chaos"))

    samples: dict[int, list[int]] = {w.proc.pid: [] for w in workers}
    stop = threading.Event()

    def sample_rss():
        while not stop.is_set():
            for pid in samples:
                v = rss_kib(pid)
                if v:
                    samples[pid].append(v)
            stop.wait(0.5)

    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()

    p = Producer(chaos.url, default_model="chaos", live_ttl=PRODUCER_TTL)
    handles, meant_to_fail, cancelled = [], set(), 0
    t0 = time.monotonic()
    for i in range(N_JOBS):
        kw: dict = {"sampling": {"max_tokens": rng.randint(1, 4), "temperature": rng.choice([0.0, 0.8]),
                                 "seed": i},
                    "priority": rng.randint(-5, 5)}
        if rng.random() < 0.01:
            # Outside the vocabulary: refused by the worker (never cancelled and without a
            # deadline, which would finish it before its prompt is checked).
            meant_to_fail.add(p.submit(prompt_token_ids=[10**6], **kw).id)
            continue
        if rng.random() < 0.2:
            kw["deadline"] = time.time() + rng.uniform(0.05, 3.0)
        handles.append(p.submit(f"soak {i} " + "x" * rng.randint(0, 40), **kw))
        if rng.random() < 0.15:  # cancel a random recent job: queued, running or already done
            rng.choice(handles[-50:]).cancel()
            cancelled += 1
    submit_s = time.monotonic() - t0
    wait_for(lambda: r.xlen(keys.jobs("chaos")) == 0 and pending_count(r, "chaos") == 0, 300, interval=0.5,
             what="every soak job finished")
    run_s = time.monotonic() - t0
    stop.set()
    sampler.join(5)

    # Every job finished exactly once: the workers' finish counters add up to N.
    wait_for(lambda: sum(sum(counters(w)) - sum(b) for w, b in zip(workers, before)) >= N_JOBS, 10,
             what="counters caught up")
    finished = sum(sum(counters(w)) - sum(b) for w, b in zip(workers, before))
    assert finished == N_JOBS
    outcomes = {k: int(v - reasons_before[k]) for k, v in by_reason().items()}
    assert outcomes["abort"] > 0 and outcomes["deadline"] > 0 and outcomes["length"] > 0

    # The DLQ holds exactly the jobs meant to fail, with their reason.
    dlq = r.xrange(keys.dlq("chaos"))
    assert {f[b"job_id"].decode() for _, f in dlq} == meant_to_fail
    assert all(f[b"code"] == b"invalid_prompt" and b"vocabulary" in f[b"reason"] for _, f in dlq)

    # Block pool: checked by the workers (--check-invariants) after every abort and when idle.
    for w in workers:
        assert w.proc.poll() is None
        assert w.metric("inferq:engine_invariant_failures_total") == 0
    wait_for(lambda: all(w.metric("inferq:kv_cache_usage_perc") == 0 and w.metric("inferq:num_requests_running") == 0
                         for w in workers), 30, what="KV pools empty")

    # No reply stream or status hash outlives the reply TTL; every other key has a TTL.
    wait_for(lambda: not leftover(r, "inferq:reply:*") and not leftover(r, "inferq:job:*"), REPLY_TTL + 10,
             interval=0.5, what="reply streams and job hashes expired")
    for key in leftover(r, "inferq:cancel:*"):
        assert 0 < r.ttl(key) <= PRODUCER_TTL, key

    # Memory: flat once warm (generous bound; the trend is reported).
    trend = []
    for pid, vals in samples.items():
        assert len(vals) >= 4
        warm, last, peak = vals[len(vals) // 10], vals[-1], max(vals)
        trend.append((warm // 1024, last // 1024, peak // 1024))
        assert last - warm < 150 * 1024, (warm, last)
    print(f"\n[reliability] soak: {N_JOBS} jobs over 2 workers in {run_s:.0f}s (submitted in {submit_s:.0f}s), "
          f"{cancelled} cancel requests, finished by reason {outcomes}, errors {len(dlq)} (all meant to fail), "
          f"lost 0; RSS MiB (warm, end, peak) per worker {trend}")
    p.close()
    r.close()
