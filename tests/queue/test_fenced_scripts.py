"""The fenced state-change scripts against a real redis-server: the owner of an
entry and attempt may change the job's state; anyone else is refused, and a
refusal changes nothing."""
import pytest
import redis

from inferq.schemas import keys
from inferq.schemas.lua import source

G = keys.JOBS_GROUP
MODEL = "fence"


@pytest.fixture
def r(redis_url):
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    yield c
    c.close()


def run(r, name, keys_, args):
    return r.eval(source(name), len(keys_), *keys_, *args)


def deliver(r, consumer: str, job_id: str = "j1") -> str:
    stream = keys.jobs(MODEL)
    try:
        r.xgroup_create(stream, G, id="0", mkstream=True)
    except redis.ResponseError:
        pass
    eid = r.xadd(stream, {"job": f'{{"id": "{job_id}"}}'})
    r.xreadgroup(G, consumer, {stream: ">"}, count=1)
    return eid


def job_keys(job_id="j1"):
    return keys.jobs(MODEL), keys.job_info(job_id), keys.reply(job_id), keys.cancel(job_id)


def claim(r, eid, consumer, job_id="j1"):
    stream, info, _, cancel = job_keys(job_id)
    return run(r, "claim_attempt", [stream, info, cancel], [G, eid, consumer, 3600])


def finish(r, eid, consumer, attempt, job_id="j1"):
    return run(r, "finish", list(job_keys(job_id)),
               [G, eid, consumer, attempt, 60, 1000, "done", f'{{"attempt": {attempt}}}',
                3, "status", "done", "worker", consumer, "finished_at", "1.0"])


def test_claim_counts_attempts_only_for_the_owner(r):
    eid = deliver(r, "w-a")
    assert claim(r, eid, "w-a") == [1, 0]
    assert claim(r, eid, "w-b") == [-1, 0]
    r.set(keys.cancel("j1"), "1")
    assert claim(r, eid, "w-a") == [2, 1]
    assert r.hget(keys.job_info("j1"), "attempt") == "2"


def test_a_worker_that_lost_its_lease_cannot_finish_the_live_attempt(r):
    stream, info, reply, _ = job_keys()
    eid = deliver(r, "w-a")
    assert claim(r, eid, "w-a")[0] == 1
    # w-b reclaims the stalled entry and starts attempt 2.
    r.xclaim(stream, G, "w-b", 0, [eid])
    assert claim(r, eid, "w-b")[0] == 2
    # w-a comes back with its prepared finish for attempt 1: refused, nothing written.
    assert finish(r, eid, "w-a", 1) == 0
    assert r.xlen(reply) == 0 and r.xlen(stream) == 1
    assert r.xpending(stream, G)["pending"] == 1
    # Even a stale owner name with the wrong attempt is refused (two processes, one id).
    assert finish(r, eid, "w-b", 1) == 0
    assert finish(r, eid, "w-b", 2) == 1
    assert r.xlen(stream) == 0 and r.xpending(stream, G)["pending"] == 0
    assert [f["type"] for _, f in r.xrange(reply)] == ["done"]
    assert r.hgetall(info)["status"] == "done"
    # The same finish re-sent (dropped connection after EXEC): recognised, not duplicated.
    assert finish(r, eid, "w-b", 2) == 2
    assert r.xlen(reply) == 1


def test_start_is_refused_for_an_old_attempt(r):
    stream, info, reply, _ = job_keys()
    eid = deliver(r, "w-a")
    claim(r, eid, "w-a")
    claim(r, eid, "w-a")  # attempt 2 now
    args = [G, eid, "w-a", 1, 3600, 1000, 1, "started", "{}", 1, "status", "running"]
    assert run(r, "start", [stream, info, reply], args) == 0
    args[3] = 2
    assert run(r, "start", [stream, info, reply], args) == 1
    assert r.hget(info, "status") == "running" and r.xlen(reply) == 1


def test_renew_never_steals_an_entry_another_worker_reclaimed(r):
    stream = keys.jobs(MODEL)
    e1, e2 = deliver(r, "w-a", "j1"), deliver(r, "w-a", "j2")
    r.xclaim(stream, G, "w-b", 0, [e2])  # w-b just reclaimed e2
    lost = run(r, "renew", [stream], [G, "w-a", e1, e2])
    assert lost == [e2]
    owners = {row["message_id"]: row["consumer"] for row in r.xpending_range(stream, G, "-", "+", 10)}
    assert owners == {e1: "w-a", e2: "w-b"}


def test_fail_dead_letters_once_bounded_and_only_for_the_owner(r):
    stream, info, reply, cancel = job_keys()
    dlq = keys.dlq(MODEL)
    for i in range(30):
        eid = deliver(r, "w-a", f"bad{i}")
        _, info_i, reply_i, cancel_i = job_keys(f"bad{i}")
        args = [G, eid, "w-a", 0, 60, 1000, "", 10, 0, 3, "job", "x", "code", "invalid_job", "reason", "bad"]
        assert run(r, "fail", [stream, info_i, reply_i, cancel_i, dlq], args) == 1
    assert r.xlen(dlq) == 10  # the newest 10: bounded
    assert r.xlen(stream) == 0
    eid = deliver(r, "w-a")
    claim(r, eid, "w-a")
    args = [G, eid, "w-b", 1, 60, 1000, '{"code": "x"}', 10, 1, "status", "error", 1, "code", "x"]
    assert run(r, "fail", [stream, info, reply, cancel, dlq], args) == 0  # not w-b's entry
    args[2] = "w-a"
    assert run(r, "fail", [stream, info, reply, cancel, dlq], args) == 1
    assert [f["type"] for _, f in r.xrange(reply)] == ["error"] and r.hget(info, "status") == "error"


def test_handback_only_touches_owned_entries(r):
    stream = keys.jobs(MODEL)
    e1, e2 = deliver(r, "w-a", "j1"), deliver(r, "w-a", "j2")
    r.xclaim(stream, G, "w-b", 0, [e2])
    assert run(r, "handback", [stream], [G, "w-a", 99_000, e1, e2]) == 1
    rows = {row["message_id"]: row for row in r.xpending_range(stream, G, "-", "+", 10)}
    assert rows[e1]["time_since_delivered"] >= 99_000 and rows[e2]["time_since_delivered"] < 99_000
