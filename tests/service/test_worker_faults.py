"""Delivery guarantees with real worker processes: SIGKILL and redelivery,
poison jobs to the DLQ, two workers sharing a stream, SIGTERM drain."""
from __future__ import annotations

import threading
import time

import pytest
import redis

from inferq.producer import JobFailed, Producer
from inferq.schemas import SamplingParams, keys

from tests.service.conftest import wait_for


@pytest.fixture
def r(module_redis):
    c = redis.Redis.from_url(module_redis.url)
    yield c
    c.close()


def _stream_in_thread(h, out: dict, timeout=240):
    def run():
        try:
            out[h.id] = [ev for _, ev in h.stream(timeout=timeout)]
        except Exception as e:  # surfaced by the assertions below
            out[h.id] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _deltas_seen(r, job_id) -> int:
    return sum(1 for _, f in r.xrange(keys.reply(job_id)) if f[b"type"] == b"delta")


def _greedy(max_tokens):
    return {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}


def test_sigkill_mid_generation_second_worker_finishes_everything(module_redis, tiny_model, offline_llm, start_worker, r):
    model = "tiny-crash"
    p = Producer(module_redis.url, default_model=model)
    w1 = start_worker(module_redis.url, tiny_model, model, "crash-1")
    prompts = [f"crash test prompt {i} " + "abc " * (i % 5) for i in range(20)]
    handles = [p.submit(pr, sampling=_greedy(200)) for pr in prompts]
    seen: dict = {}
    threads = [_stream_in_thread(h, seen) for h in handles]
    # The second worker loads its model meanwhile (a model load takes far longer
    # than crash-1 needs to read all 20 jobs, which the status check below confirms).
    w2 = start_worker(module_redis.url, tiny_model, model, "crash-2", wait=False)
    # Kill once every job is mid-generation.
    wait_for(lambda: all(_deltas_seen(r, h.id) > 0 for h in handles), 120, what="all jobs streaming")
    assert all(h.status()["worker"] == "crash-1" for h in handles)
    w1.kill()
    assert all(_deltas_seen(r, h.id) < 200 for h in handles)
    w2.wait_ready()
    for t in threads:
        t.join(240)
    expected = offline_llm.generate(prompts, SamplingParams(**_greedy(200)))
    for h, exp in zip(handles, expected):
        events = seen[h.id]
        assert not isinstance(events, Exception), events
        types = [e.type for e in events]
        assert "restarted" in types and types[-1] == "done"
        restarted = next(e for e in events if e.type == "restarted")
        assert restarted.attempt == 2
        res = h.result(timeout=10)
        assert res.attempt == 2 and res.text == exp.text and res.token_ids == exp.token_ids
        st = h.status()
        assert st["status"] == "done" and st["worker"] == "crash-2" and st["attempt"] == 2
    assert r.xlen(keys.dlq(model)) == 0
    assert r.xlen(keys.jobs(model)) == 0
    assert r.xpending(keys.jobs(model), keys.JOBS_GROUP)["pending"] == 0
    assert "reclaimed_idle_entries" in w2.log()
    p.close()


def test_poison_job_dead_lettered_after_max_deliveries(module_redis, tiny_model, offline_llm, start_worker, r):
    """A job that takes its worker down every time it runs (here: the test
    SIGKILLs whichever worker starts it) ends in the DLQ after N deliveries."""
    model, n = "tiny-poison", 2
    p = Producer(module_redis.url, default_model=model)
    args = ("--max-deliveries", str(n))
    normal_before = [p.submit(f"innocent {i}", sampling=_greedy(6)) for i in range(3)]
    poison = p.submit("poison", sampling=_greedy(400))
    for attempt in range(1, n + 1):
        # The same worker id each time: a restarted worker re-reads its own pending entries first.
        w = start_worker(module_redis.url, tiny_model, model, "poison-w", *args)
        wait_for(lambda: p.job(poison.id).status().get("attempt") == attempt and _deltas_seen(r, poison.id) > 0
                 and all(h.status()["status"] == "done" for h in normal_before), 120, what=f"attempt {attempt} running")
        w.kill()
        if attempt > 1:
            assert "pending_reread" in w.log()
    w = start_worker(module_redis.url, tiny_model, model, "poison-w", *args)
    with pytest.raises(JobFailed) as e:
        poison.result(timeout=60)
    assert e.value.code == "max_deliveries" and f"max_deliveries={n}" in e.value.message
    dlq = r.xrange(keys.dlq(model))
    assert len(dlq) == 1
    f = dlq[0][1]
    assert f[b"job_id"].decode() == poison.id and f[b"code"] == b"max_deliveries" and f[b"attempts"] == str(n + 1).encode()
    # Other jobs, before and after, are unaffected.
    normal_after = [p.submit(f"innocent after {i}", sampling=_greedy(6)) for i in range(3)]
    prompts = [f"innocent {i}" for i in range(3)] + [f"innocent after {i}" for i in range(3)]
    expected = offline_llm.generate(prompts, SamplingParams(**_greedy(6)))
    for h, exp in zip(normal_before + normal_after, expected):
        assert h.result(timeout=60).text == exp.text
    assert r.xlen(keys.jobs(model)) == 0
    assert r.xpending(keys.jobs(model), keys.JOBS_GROUP)["pending"] == 0
    assert w.proc.poll() is None
    p.close()


def test_two_workers_share_40_jobs(module_redis, tiny_model, offline_llm, start_worker, r):
    model = "tiny-scale"
    a = start_worker(module_redis.url, tiny_model, model, "scale-a", "--max-num-seqs", "12", wait=False)
    b = start_worker(module_redis.url, tiny_model, model, "scale-b", "--max-num-seqs", "12", wait=False)
    a.wait_ready(), b.wait_ready()
    p = Producer(module_redis.url, default_model=model)
    assert set(p.workers()) == {"scale-a", "scale-b"}
    prompts = [f"shared job {i}" for i in range(40)]
    handles = [p.submit(pr, sampling=_greedy(24)) for pr in prompts]
    expected = offline_llm.generate(prompts, SamplingParams(**_greedy(24)))
    for h, exp in zip(handles, expected):
        assert h.result(timeout=240).text == exp.text
    by_worker: dict[str, int] = {}
    for h in handles:
        w = h.status()["worker"]
        by_worker[w] = by_worker.get(w, 0) + 1
    assert set(by_worker) == {"scale-a", "scale-b"}, by_worker
    assert sum(by_worker.values()) == 40
    assert r.xlen(keys.jobs(model)) == 0 and r.xlen(keys.dlq(model)) == 0
    p.close()


def test_sigterm_drains_in_flight_and_leaves_the_rest(module_redis, tiny_model, start_worker, r):
    model = "tiny-drain"
    p = Producer(module_redis.url, default_model=model)
    # Paced (20 ms a step) so the drains below take known minimum times on any machine.
    pace = ("--step-pace-s", "0.02")
    w1 = start_worker(module_redis.url, tiny_model, model, "drain-1", "--max-num-seqs", "4", "--drain-timeout", "120",
                      *pace)
    short = [p.submit(f"short {i}", sampling=_greedy(60)) for i in range(4)]
    long = [p.submit(f"long {i}", sampling=_greedy(400)) for i in range(6)]
    wait_for(lambda: all(_deltas_seen(r, h.id) > 0 for h in short), 60, what="short jobs streaming")
    t0 = time.time()
    assert w1.terminate(timeout=120) == 0
    # Whatever the worker had read by SIGTERM was finished there, not abandoned
    # (the shorts for sure; a long one too if a short ended first); the others
    # were never read and wait in the queue.
    started = [h for h in short + long if h.status()["status"] != "queued"]
    assert set(h.id for h in short) <= set(h.id for h in started)
    for h in started:
        res = h.result(timeout=5)
        assert res.usage.completion_tokens == (60 if h in short else 400)
        assert h.status()["worker"] == "drain-1"
    left = [h for h in long if h not in started]
    assert left and all(h.status()["status"] == "queued" for h in left)
    assert r.xlen(keys.jobs(model)) == len(left)
    assert r.xpending(keys.jobs(model), keys.JOBS_GROUP)["pending"] == 0
    assert p.workers() == {}  # it left the live-workers set
    assert time.time() - t0 < 60

    # A short drain timeout hands unfinished jobs back: pending, and already idle
    # past the reaper's threshold so another worker takes them at once. A long
    # job needs >= 8 s here (400 paced steps), far past the 0.5 s drain.
    w2 = start_worker(module_redis.url, tiny_model, model, "drain-2", "--max-num-seqs", "4", "--drain-timeout", "0.5",
                      *pace)
    taken = min(4, len(left))
    wait_for(lambda: sum(_deltas_seen(r, h.id) > 0 for h in left) == taken, 60, what="long jobs streaming")
    assert w2.terminate(timeout=60) == 0
    pend = r.xpending_range(keys.jobs(model), keys.JOBS_GROUP, min="-", max="+", count=10)
    assert len(pend) == taken and all(row["consumer"] == b"drain-2" for row in pend)
    assert all(row["time_since_delivered"] >= 3000 for row in pend)  # 3 leases of 1 s
    assert r.xlen(keys.jobs(model)) == len(left) and r.xlen(keys.dlq(model)) == 0
    assert "drain_timeout_left_pending" in w2.log()
    p.close()
