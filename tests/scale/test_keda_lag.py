"""The signal KEDA reads: `XINFO GROUPS` lag of the job stream's group.

KEDA's `redis-streams` trigger with `lagCount` scales on this number (and
`activationLagCount: "0"` wakes a worker from zero on it). It must be a number
equal to the jobs not yet delivered, after every pattern the worker uses on
the stream: reading only its free capacity, XACK + XDEL on finish,
dead-lettering, a job cancelled before delivery, handing jobs back on a
SIGTERM drain.

Every check takes one atomic snapshot (MULTI: XINFO GROUPS, XLEN, XPENDING,
XRANGE) and computes the expected value from the same snapshot: the entries
after the group's last-delivered-id. Tests wait on observed progress (a reply
event, a pending count, a log line), never on a sleep.

Found here (see docs/scaling.md, "The lag signal"): Redis reports lag as NULL
(KEDA then reads 0) after XDEL of the entry *at* the group's last-delivered-id
while an older entry is still pending and jobs wait behind it. A reading worker
repairs it with its next XREADGROUP; it persists while no worker reads (a
drain, a scale-in, the last worker gone). Whenever it is NULL, XPENDING >= 1
and XLEN >= 1, which keeps KEDA's `pendingEntriesCount` and `streamLength`
triggers active: base/keda.yaml carries both for that reason.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pytest
import redis

from inferq.producer import Producer
from inferq.schemas import keys
from inferq.schemas.job import Job
from tests.service.conftest import wait_for

pytestmark = pytest.mark.timeout(600)

# Paced engine: every step sleeps 0.2 s, so a 400-token job runs at least 80 s
# on any machine; these jobs finish only when the test cancels them.
PACE = ("--step-pace-s", "0.2")
LONG = {"max_tokens": 400, "temperature": 0.0, "ignore_eos": True}
SHORT = {"max_tokens": 3, "temperature": 0.0}


def _id(x) -> tuple[int, int]:
    ms, _, seq = (x.decode() if isinstance(x, bytes) else x).partition("-")
    return int(ms), int(seq or 0)


@dataclass
class Snap:
    lag: object          # int, or None where Redis answers NULL
    undelivered: int     # entries after last-delivered-id
    xlen: int
    pending: int
    last_delivered: str

    def __str__(self) -> str:
        return (f"lag={self.lag} undelivered={self.undelivered} xlen={self.xlen} pending={self.pending} "
                f"last-delivered-id={self.last_delivered}")


def snap(r: redis.Redis, model: str) -> Snap:
    s = keys.jobs(model)
    p = r.pipeline(transaction=True)
    p.xinfo_groups(s)
    p.xlen(s)
    p.xpending(s, keys.JOBS_GROUP)
    p.xrange(s, "-", "+")
    groups, xlen, pend, entries = p.execute()
    g = next(g for g in groups if g["name"] in (keys.JOBS_GROUP, keys.JOBS_GROUP.encode()))
    last = g["last-delivered-id"]
    undelivered = sum(1 for eid, _ in entries if _id(eid) > _id(last))
    return Snap(g["lag"], undelivered, xlen, pend["pending"], last.decode() if isinstance(last, bytes) else last)


def assert_exact(s: Snap, what: str) -> Snap:
    assert isinstance(s.lag, int), f"after {what}: lag is NULL ({s})"
    assert s.lag == s.undelivered, f"after {what}: lag differs from the undelivered jobs ({s})"
    # Workers delete what they finish, so the stream holds exactly the undelivered
    # and the pending entries (what the gateway's inferq_queue_waiting reports).
    assert s.xlen - s.pending == s.undelivered, f"after {what}: {s}"
    return s


def keda_triggers_active(s: Snap) -> dict:
    """What base/keda.yaml's three triggers see (KEDA reads a NULL lag as 0)."""
    return {"lag": (s.lag or 0) > 0, "pending": s.pending > 0, "stream-length": s.xlen > 0}


def done_event(r: redis.Redis, job_id: str):
    for _, f in r.xrange(keys.reply(job_id)):
        if f.get(b"type") in (b"done", b"error"):
            return f
    return None


def raw_job(model: str, **kw) -> dict:
    return {"job": json.dumps({"model": model, **kw})}


def test_lag_is_the_undelivered_count_after_every_worker_pattern(module_redis, tiny_model, start_worker):
    model = "tiny-lag"
    r = redis.Redis.from_url(module_redis.url)
    p = Producer(module_redis.url, default_model=model, max_backlog=1000)
    w1 = start_worker(module_redis.url, tiny_model, model, "lag-1", "--max-num-seqs", "4",
                      "--drain-timeout", "1", *PACE)

    # The group exists (created by the worker), nothing queued.
    s = assert_exact(snap(r, model), "worker start")
    assert s.lag == 0

    # 1. ack + delete on finish.
    for h in [p.submit(f"short {i}", sampling=SHORT) for i in range(3)]:
        assert h.result(timeout=120).finish_reason in ("stop", "length")
    s = assert_exact(snap(r, model), "XACK + XDEL on finish")
    assert (s.lag, s.xlen, s.pending) == (0, 0, 0)

    # 2. dead-letter: a token id outside the vocabulary, a prompt over max_model_len.
    r.xadd(keys.jobs(model), raw_job(model, id="poison-vocab", prompt_token_ids=[10**6]))
    r.xadd(keys.jobs(model), raw_job(model, id="poison-long", prompt_token_ids=[5] * 600))
    wait_for(lambda: r.xlen(keys.dlq(model)) == 2, 60, what="two DLQ entries")
    assert done_event(r, "poison-vocab")[b"type"] == b"error"
    assert done_event(r, "poison-long")[b"type"] == b"error"
    s = assert_exact(snap(r, model), "dead-lettering")
    assert (s.lag, s.xlen, s.pending) == (0, 0, 0)

    # 3. cancelled before delivery, worker idle: read, finished early, acked, deleted.
    early = Job(model=model, prompt="never runs", sampling={"max_tokens": 50})
    r.set(keys.cancel(early.id), "1")
    r.xadd(keys.jobs(model), early.to_fields())
    wait_for(lambda: done_event(r, early.id), 60, what="cancelled job's done event")
    s = assert_exact(snap(r, model), "a job cancelled before delivery")
    assert (s.lag, s.xlen, s.pending) == (0, 0, 0)

    # 4. only free capacity is read: 4 slots, 4 long jobs held, the rest wait.
    held = [p.submit(f"long {i}", sampling=LONG) for i in range(4)]
    wait_for(lambda: snap(r, model).pending == 4, 60, what="4 jobs in flight")
    cancelled_in_queue = Job(model=model, prompt="cancelled while queued", sampling=LONG)
    r.set(keys.cancel(cancelled_in_queue.id), "1")
    r.xadd(keys.jobs(model), cancelled_in_queue.to_fields())
    queued = [p.submit(f"queued {i}", sampling=LONG) for i in range(3)]
    s = assert_exact(snap(r, model), "reading only free capacity")
    assert (s.lag, s.pending, s.xlen) == (4, 4, 8)
    assert keda_triggers_active(s) == {"lag": True, "pending": True, "stream-length": True}

    # 5. a held job finishes (cancelled mid-generation): the slot is refilled from
    # the queue; the next entry is the job cancelled before delivery, finished
    # early, so the one after it is read too.
    assert held[0].cancel()
    wait_for(lambda: done_event(r, held[0].id) and done_event(r, cancelled_in_queue.id), 60,
             what="cancelled jobs finished")
    wait_for(lambda: snap(r, model).pending == 4 and snap(r, model).undelivered == 2, 60,
             what="the freed slot refilled")
    s = assert_exact(snap(r, model), "finish + refill + cancel before delivery in a backlog")
    assert (s.lag, s.pending, s.xlen) == (2, 4, 6)

    # 6. hand-back on a SIGTERM drain: 4 jobs cannot finish in 1 s; they stay
    # pending (released for the reaper), the queued ones stay undelivered.
    assert w1.terminate(timeout=120) == 0
    assert "drain_timeout_left_pending" in w1.log()
    s = assert_exact(snap(r, model), "hand-back on drain")
    assert (s.lag, s.pending, s.xlen) == (2, 4, 6)
    assert keda_triggers_active(s) == {"lag": True, "pending": True, "stream-length": True}

    # 7. another worker reaps the handed-back jobs and reads the rest; cancel all;
    # everything is acked and deleted.
    start_worker(module_redis.url, tiny_model, model, "lag-2", "--max-num-seqs", "8", *PACE)
    def owners():
        return {c["name"]: c["pending"] for c in r.xpending(keys.jobs(model), keys.JOBS_GROUP)["consumers"]}

    wait_for(lambda: owners() == {b"lag-2": 6}, 120, what="6 jobs in flight on the second worker")
    s = assert_exact(snap(r, model), "reclaim + read by a second worker")
    assert s.lag == 0
    for h in held[1:] + queued:
        h.cancel()
    wait_for(lambda: r.xlen(keys.jobs(model)) == 0, 120, what="stream emptied")
    s = assert_exact(snap(r, model), "cancelling everything")
    assert (s.lag, s.pending) == (0, 0)
    assert keda_triggers_active(s) == {"lag": False, "pending": False, "stream-length": False}
    p.close()
    r.close()


def test_redis_reports_null_lag_after_deleting_the_last_delivered_entry(module_redis):
    """The Redis rule behind the NULL, with the exact commands the worker issues
    (XREADGROUP COUNT=free, then XACK + XDEL of a finished job)."""
    r = redis.Redis.from_url(module_redis.url)
    s, g = keys.jobs("null-lag"), keys.JOBS_GROUP
    r.xgroup_create(s, g, id="0", mkstream=True)
    ids = [r.xadd(s, {"job": f"j{i}"}) for i in range(5)]
    r.xreadgroup(g, "w", {s: ">"}, count=2)             # a worker with 2 free slots
    assert r.xinfo_groups(s)[0]["lag"] == 3

    # The older of the two finishes first: XDEL below last-delivered-id, lag exact.
    r.xack(s, g, ids[0])
    r.xdel(s, ids[0])
    assert r.xinfo_groups(s)[0]["lag"] == 3

    r.xreadgroup(g, "w", {s: ">"}, count=1)             # its slot is refilled
    # Now the newest delivered job (== last-delivered-id) finishes while an older
    # one (ids[1]) is still pending and two jobs wait: Redis cannot count the
    # entries after a tombstone at last-delivered-id and answers NULL.
    r.xack(s, g, ids[2])
    r.xdel(s, ids[2])
    sn = snap_raw(r, s)
    assert sn.lag is None
    assert (sn.undelivered, sn.pending, sn.xlen) == (2, 1, 3)
    # What KEDA's triggers see meanwhile: lag reads 0 but pending and XLEN are > 0.
    assert keda_triggers_active(sn) == {"lag": False, "pending": True, "stream-length": True}

    # The next read repairs it.
    r.xreadgroup(g, "w", {s: ">"}, count=1)
    sn = snap_raw(r, s)
    assert sn.lag == sn.undelivered == 1

    # With nothing older pending, the same delete leaves lag exact.
    r.xack(s, g, ids[1], ids[3])
    r.xdel(s, ids[1], ids[3])
    sn = snap_raw(r, s)
    assert sn.lag == sn.undelivered == 1 and sn.pending == 0
    r.delete(s)
    r.close()


def snap_raw(r: redis.Redis, stream: str) -> Snap:
    return snap(r, keys.name_of(stream))


def test_null_lag_window_across_a_drain_keeps_a_keda_trigger_active(module_redis, tiny_model, start_worker):
    """The one worker pattern that leaves lag NULL until another worker reads: a
    job finishes during a SIGTERM drain (so no new read follows) while an older
    one is still held and jobs wait. Whatever Redis answers, KEDA's pending and
    stream-length triggers stay active, and the next worker's read makes lag
    exact again."""
    model = "tiny-lag-drain"
    r = redis.Redis.from_url(module_redis.url)
    p = Producer(module_redis.url, default_model=model, max_backlog=1000)
    w = start_worker(module_redis.url, tiny_model, model, "drain-lag-1", "--max-num-seqs", "2",
                     "--drain-timeout", "600", *PACE)
    older, newer = p.submit("older", sampling=LONG), p.submit("newer", sampling=LONG)
    wait_for(lambda: snap(r, model).pending == 2, 60, what="2 jobs in flight")
    waiting = [p.submit(f"waiting {i}", sampling=LONG) for i in range(3)]
    assert_exact(snap(r, model), "two held, three waiting")

    w.proc.send_signal(__import__("signal").SIGTERM)
    wait_for(lambda: "shutdown_requested" in w.log(), 60, what="drain started")
    # The newest delivered job finishes during the drain: XACK + XDEL at last-delivered-id.
    assert newer.cancel()
    wait_for(lambda: done_event(r, newer.id), 60, what="newer job finished during the drain")
    s = snap(r, model)
    assert s.pending == 1 and s.xlen == 4 and s.undelivered == 3, s
    assert s.lag is None or s.lag == s.undelivered, s
    nulled = s.lag is None
    assert keda_triggers_active(s)["pending"] and keda_triggers_active(s)["stream-length"]

    # The drain ends (the older job is cancelled and finishes): nothing older is
    # pending any more, so lag is exact again even before anyone reads.
    assert older.cancel()
    assert w.terminate(timeout=120) == 0
    s = assert_exact(snap(r, model), "the drain ended")
    assert (s.lag, s.pending) == (3, 0)

    # A new worker reads; cancel everything; the stream empties; lag 0.
    start_worker(module_redis.url, tiny_model, model, "drain-lag-2", "--max-num-seqs", "4", *PACE)
    wait_for(lambda: snap(r, model).pending == 3, 120, what="waiting jobs read by the new worker")
    assert_exact(snap(r, model), "the new worker's read")
    for h in waiting:
        h.cancel()
    wait_for(lambda: r.xlen(keys.jobs(model)) == 0, 120, what="stream emptied")
    s = assert_exact(snap(r, model), "cancelling everything")
    assert s.lag == 0
    print(f"lag was NULL during the drain: {nulled}")
    p.close()
    r.close()
