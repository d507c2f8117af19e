"""The publisher's fenced writes, driven step by step against a real
redis-server: once another worker has reclaimed a job (a lost lease), this
worker's finish and failure are refused by Redis, counted, and write nothing;
the renewal reports the entry lost. Deterministic: no partition timing."""
from __future__ import annotations

import queue

import pytest
import redis

from inferq.schemas import Job, SamplingParams, decode_event, keys, transitions

from inferq.gpuworker.engine.outputs import EngineStats, RequestDelta
from inferq.gpuworker.logging import get_logger
from inferq.gpuworker.metrics import WorkerMetrics
from inferq.gpuworker.service.context import WorkerContext
from inferq.gpuworker.service.messages import Rejected, Started, StepOutput
from inferq.gpuworker.service.publisher import Publisher
from inferq.gpuworker.service.state import InFlight, JobState

MODEL = "fence-pub"


@pytest.fixture
def r(redis_url):
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def held_by_a(r) -> tuple[Publisher, JobState, WorkerMetrics]:
    """Worker "w-a" has read the job, claimed attempt 1 and published its start."""
    ctx = WorkerContext(model=MODEL, consumer="w-a", lease_seconds=1, max_deliveries=5, reply_ttl=60,
                        reply_maxlen=1000)
    job = Job(model=MODEL, prompt="x", sampling=SamplingParams(max_tokens=4))
    r.xgroup_create(ctx.stream, ctx.group, id="0", mkstream=True)
    eid = r.xadd(ctx.stream, job.to_fields()).decode()
    r.xreadgroup(ctx.group, "w-a", {ctx.stream: ">"})
    attempt, _ = transitions.claim_attempt(r, stream=ctx.stream, entry_id=eid, consumer="w-a", job_id=job.id, live_ttl=60)
    st = JobState(job=job, entry_id=eid, raw=job.to_fields()["job"], attempt=attempt, log=get_logger())
    inflight = InFlight(4)
    inflight.add(st)
    metrics = WorkerMetrics(MODEL)
    pub = Publisher(ctx, r, inflight, queue.Queue(), queue.Queue(), lambda *a: None, metrics, get_logger())
    pub.flush([Started([st])])
    return pub, st, metrics


def b_reclaims(r, st: JobState) -> None:
    r.xclaim(keys.jobs(MODEL), keys.JOBS_GROUP, "w-b", 0, [st.entry_id])
    attempt, _ = transitions.claim_attempt(r, stream=keys.jobs(MODEL), entry_id=st.entry_id, consumer="w-b", job_id=st.id,
                                           live_ttl=60)
    assert attempt == st.attempt + 1


def idle_stats() -> EngineStats:
    return EngineStats(num_running=0, num_waiting=0, kv_cache_usage=0.0, num_blocks=16, num_free_blocks=16,
                       prefix_cache_queries=0, prefix_cache_hits=0, num_preemptions=0, num_steps=1,
                       num_generated_tokens=1, num_prompt_tokens=1)


def refused(metrics: WorkerMetrics, op: str) -> float:
    return metrics.registry.get_sample_value("inferq:fenced_refusals_total", {"model_name": MODEL, "op": op}) or 0.0


def finals(r, job_id: str) -> list:
    return [(e.type, e.attempt) for e in (decode_event(f) for _, f in r.xrange(keys.reply(job_id)))
            if e.type in ("done", "error")]


def test_a_finish_after_the_lease_was_lost_is_refused(r):
    pub, st, metrics = held_by_a(r)
    b_reclaims(r, st)
    done = RequestDelta(st.id, [5], "a", finished=True, finish_reason="length", num_prompt_tokens=1,
                        num_output_tokens=1)
    pub.flush([StepOutput([done], idle_stats(), 0.0, 0.0)])
    assert finals(r, st.id) == []  # nothing final published for the stale attempt
    assert refused(metrics, "finish") == 1
    row, = r.xpending_range(keys.jobs(MODEL), keys.JOBS_GROUP, "-", "+", 10)
    assert row["consumer"] == b"w-b"  # still B's, not acked or deleted
    assert r.hget(keys.job_info(st.id), "attempt") == b"2"
    assert len(pub.inflight) == 0
    # The renewal says the same thing: the entry is not ours any more.
    assert transitions.renew(r, stream=keys.jobs(MODEL), consumer="w-a", entry_ids=[st.entry_id]) == [st.entry_id]


def test_a_failure_after_the_lease_was_lost_is_refused(r):
    pub, st, metrics = held_by_a(r)
    b_reclaims(r, st)
    pub.flush([Rejected(st, "invalid_prompt", "too long")])
    assert finals(r, st.id) == [] and r.xlen(keys.dlq(MODEL)) == 0
    assert refused(metrics, "fail") == 1
    assert r.xlen(keys.jobs(MODEL)) == 1


def test_the_owner_finishes_once(r):
    pub, st, metrics = held_by_a(r)
    done = RequestDelta(st.id, [5], "a", finished=True, finish_reason="length", num_prompt_tokens=1,
                        num_output_tokens=1)
    pub.flush([StepOutput([done], idle_stats(), 0.0, 0.0)])
    assert finals(r, st.id) == [("done", 1)] and refused(metrics, "finish") == 0
    assert r.xlen(keys.jobs(MODEL)) == 0
