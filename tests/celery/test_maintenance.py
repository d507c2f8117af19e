"""Beat maintenance on a real Redis: the queue states a crashed worker leaves
behind (pending entries on a consumer with no heartbeat, entries delivered
too often) and finished reply streams without a TTL."""
import time

import pytest
import redis

from inferq.producer import JobFailed, Producer
from inferq.producer.maintenance import (
    MaintenanceSettings, dead_letter_exceeded, expire_finished_replies, reclaim_stale, run_all,
)
from inferq.schemas import DoneEvent, Job, encode_event, keys

MODEL = "maint"
S = MaintenanceSettings(lease_seconds=0.05, max_deliveries=3, reply_ttl=600)  # min idle 150 ms


@pytest.fixture
def r(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.xgroup_create(keys.jobs(MODEL), keys.JOBS_GROUP, id="$", mkstream=True)
    return client


def enqueue_and_deliver(r, consumer: str, deliveries: int) -> tuple[str, Job]:
    job = Job(model=MODEL, prompt="hello")
    eid = r.xadd(keys.jobs(MODEL), job.to_fields()).decode()
    r.xadd(keys.reply(job.id), {"type": "queued", "data": "{}"})
    r.xreadgroup(keys.JOBS_GROUP, consumer, {keys.jobs(MODEL): ">"}, count=1)
    for _ in range(deliveries - 1):  # each plain XCLAIM is one more delivery
        r.xclaim(keys.jobs(MODEL), keys.JOBS_GROUP, consumer, 0, [eid])
    return eid, job


def test_dead_letter_after_max_deliveries(r, redis_url):
    eid, job = enqueue_and_deliver(r, "crashy-1", deliveries=3)
    keep, _ = enqueue_and_deliver(r, "crashy-1", deliveries=1)
    time.sleep(0.3)
    assert dead_letter_exceeded(r, MODEL, S) == 1
    (dlq_id, fields), = r.xrange(keys.dlq(MODEL))
    assert fields[b"job_id"].decode() == job.id and fields[b"code"] == b"max_deliveries"
    assert fields[b"attempts"] == b"3" and Job.model_validate_json(fields[b"job"]).id == job.id
    assert [e[0].decode() for e in r.xrange(keys.jobs(MODEL))] == [keep]  # acked and deleted; the other stays
    with pytest.raises(JobFailed, match="max_deliveries"):
        Producer(redis_url).job(job.id).result(timeout=5)


def test_reclaim_moves_dead_consumers_entries_to_a_live_one(r):
    eid, _ = enqueue_and_deliver(r, "dead-1", deliveries=1)
    r.zadd(keys.workers(MODEL), {"alive-1": time.time()})
    time.sleep(0.3)
    out = reclaim_stale(r, MODEL, S)
    assert out["moved"] == 1 and out["live_workers"] == 1
    assert out["consumers_removed"] == 1  # the emptied dead consumer leaves the group
    (row,) = r.xpending_range(keys.jobs(MODEL), keys.JOBS_GROUP, "-", "+", 10)
    assert row["consumer"] == b"alive-1"
    assert row["times_delivered"] == 1  # JUSTID: not counted as a delivery
    assert row["time_since_delivered"] >= S.min_idle_ms  # left idle: the live reaper takes it at once
    names = {c["name"] for c in r.xinfo_consumers(keys.jobs(MODEL), keys.JOBS_GROUP)}
    assert names == {b"alive-1"}


def test_nothing_moves_without_a_live_worker(r):
    enqueue_and_deliver(r, "dead-1", deliveries=1)
    time.sleep(0.3)
    assert reclaim_stale(r, MODEL, S)["moved"] == 0


def test_expire_finished_replies(r):
    done, running = Job(model=MODEL, prompt="a"), Job(model=MODEL, prompt="b")
    r.xadd(keys.reply(done.id), encode_event(DoneEvent(finish_reason="stop")))
    r.hset(keys.job_info(done.id), "status", "done")
    r.xadd(keys.reply(running.id), {"type": "started", "data": "{}"})
    assert expire_finished_replies(r, S) == 1
    assert 0 < r.ttl(keys.reply(done.id)) <= 600 and 0 < r.ttl(keys.job_info(done.id)) <= 600
    assert r.ttl(keys.reply(running.id)) == -1


def test_run_all_reports_per_model(r):
    enqueue_and_deliver(r, "crashy-1", deliveries=3)
    time.sleep(0.3)
    report = run_all(r, S)
    assert report[MODEL]["dead_lettered"] == 1
    assert "_replies_expired" in report
