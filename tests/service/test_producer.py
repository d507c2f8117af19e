"""Producer SDK against a real redis-server: admission, validation, reply
reading (resume, restarts, duplicates), cancel and status. Worker events are
written here in the wire format a worker uses, so the reading logic is tested
on its own; the end-to-end tests with real workers are in test_worker_*.py."""
from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import pytest
import redis
from pydantic import ValidationError

from inferq.producer.client import build_job
from inferq.producer import AsyncProducer, JobFailed, JobNotFound, JobRestarted, Producer, QueueFull, RateLimited
from inferq.schemas import (
    DeltaEvent,
    DoneEvent,
    ErrorEvent,
    Job,
    RestartedEvent,
    StartedEvent,
    Usage,
    encode_event,
    keys,
)

MODEL = "m1"


@pytest.fixture
def r(redis_url):
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.fixture
def p(redis_url):
    prod = Producer(redis_url, default_model=MODEL, max_backlog=5)
    yield prod
    prod.close()


def emit(r, job_id, *events):
    for ev in events:
        r.xadd(keys.reply(job_id), encode_event(ev))


def test_submit_enqueues_job_and_queued_event(p, r):
    h = p.submit("hello", sampling={"max_tokens": 7, "temperature": 0}, priority=3, tenant="acme", metadata={"a": 1})
    entries = r.xrange(keys.jobs(MODEL))
    assert len(entries) == 1
    job = Job.from_fields(entries[0][1])
    assert job.id == h.id and job.prompt == "hello" and job.sampling.max_tokens == 7
    assert job.priority == 3 and job.tenant == "acme" and job.metadata == {"a": 1}
    reply = r.xrange(keys.reply(h.id))
    assert reply[0][1][b"type"] == b"queued"
    assert 0 < r.ttl(keys.reply(h.id)) <= p.settings.live_ttl
    st = h.status()
    assert st["status"] == "queued" and st["model"] == MODEL and st["tenant"] == "acme" and st["attempt"] == 0
    assert st["entry_id"] == entries[0][0].decode()
    assert p.depth() == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "exactly one of"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "exactly one of"),
        ({"prompt": "a", "sampling": {"max_tokens": 0}}, "max_tokens"),
        ({"prompt": "a", "sampling": {"temperature": -1}}, "temperature"),
        ({"prompt": "a", "sampling": {"bogus": 1}}, "bogus"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
        ({"prompt_token_ids": [1, -2]}, "non-negative"),
        ({"prompt": "a", "deadline": 30.0}, "in the past"),
        ({"prompt": "a", "idempotency_key": "has space"}, "idempotency_key"),
        ({"prompt": "a", "priority": 10**6}, "priority"),
    ],
)
def test_bad_input_is_rejected_before_any_write(p, r, kwargs, message):
    with pytest.raises((ValueError, ValidationError)) as e:
        p.submit(**kwargs)
    assert message in str(e.value)
    assert r.dbsize() == 0


def test_queue_full_reports_depth(p, r):
    for i in range(5):
        p.submit(f"job {i}")
    with pytest.raises(QueueFull) as e:
        p.submit("one too many")
    assert e.value.depth == 5 and e.value.model == MODEL
    assert r.xlen(keys.jobs(MODEL)) == 5
    # Another model has its own bound.
    p.submit("elsewhere", model="m2")


def test_idempotency_key_returns_existing_job(p, r):
    a = p.submit("x", idempotency_key="order-17")
    b = p.submit("different payload", idempotency_key="order-17")
    c = p.submit("x", idempotency_key="order-18")
    assert b.id == a.id and b.duplicate and not a.duplicate
    assert c.id != a.id
    assert r.xlen(keys.jobs(MODEL)) == 2


def test_idempotency_keys_of_tenants_never_collide(p):
    """A caller without a tenant cannot spell another tenant's key, and tenant
    names with separators cannot spell each other's either."""
    acme = p.submit("x", tenant="acme", idempotency_key="x")
    for tenant, key in ((None, "tenant=acme/x"), (None, "t4:acme:x"), ("acme:x", "x"), ("ac", "me:x")):
        other = p.submit("x", tenant=tenant, idempotency_key=key)
        assert other.id != acme.id and not other.duplicate, (tenant, key)
    assert p.submit("x", tenant="acme", idempotency_key="x").id == acme.id


def test_a_duplicate_tells_the_real_status_and_a_key_never_outlives_its_job(p, r):
    from inferq.producer.admission import admit

    first = p.submit("x", idempotency_key="order-1")
    r.hset(keys.job_info(first.id), "status", "done")  # the job ran meanwhile
    adm = admit(p.redis, p._admit, build_job(MODEL, "x"), "order-1", p.settings)
    assert adm.duplicate and adm.job_id == first.id and adm.status == "done"
    # The job's records expired but the key did not: the key is forgotten and
    # the submit admits a new job instead of returning an id that would 404.
    r.delete(keys.job_info(first.id), keys.reply(first.id))
    again = p.submit("x", idempotency_key="order-1")
    assert again.id != first.id and not again.duplicate
    assert again.status()["status"] == "queued"
    assert p.submit("x", idempotency_key="order-1").id == again.id


def test_rate_limit_per_tenant(redis_url):
    with Producer(redis_url, default_model=MODEL, rate_limit=1.0, rate_burst=2) as p:
        p.submit("1", tenant="t")
        p.submit("2", tenant="t")
        with pytest.raises(RateLimited) as e:
            p.submit("3", tenant="t")
        assert 0 < e.value.retry_after <= 1.0
        p.submit("other tenant", tenant="u")
        p.submit("no tenant is not limited")


def _done(attempt, seq, reason="stop", n=2):
    return DoneEvent(attempt=attempt, seq=seq, finish_reason=reason, usage=Usage(prompt_tokens=3, completion_tokens=n))


def test_result_restart_and_duplicates(p, r):
    h = p.submit("hi")
    emit(
        r, h.id,
        StartedEvent(attempt=1, seq=0, worker="w1"),
        DeltaEvent(attempt=1, seq=1, text="Hel", token_ids=[1]),
        RestartedEvent(attempt=2, seq=0, reason="redelivered"),
        StartedEvent(attempt=2, seq=1, worker="w2"),
        DeltaEvent(attempt=2, seq=2, text="Hel", token_ids=[1]),
        DeltaEvent(attempt=1, seq=2, text="STALE", token_ids=[9]),  # a worker that lost its lease
        DeltaEvent(attempt=2, seq=2, text="Hel", token_ids=[1]),  # a retried publish
        DeltaEvent(attempt=2, seq=3, text="lo", token_ids=[2]),
        _done(2, 4),
    )
    res = h.result(timeout=5)
    assert res.text == "Hello" and res.token_ids == [1, 2] and res.finish_reason == "stop"
    assert res.attempt == 2 and res.usage.completion_tokens == 2
    # text() follows the restart silently because the new attempt repeats the shown prefix.
    assert "".join(h.text(timeout=5)) == "Hello"
    types = [ev.type for _, ev in h.stream(timeout=5)]
    assert types == ["queued", "started", "delta", "restarted", "started", "delta", "delta", "done"]


def test_text_raises_when_restart_diverges(p, r):
    h = p.submit("hi")
    emit(
        r, h.id,
        StartedEvent(attempt=1, seq=0),
        DeltaEvent(attempt=1, seq=1, text="abc"),
        RestartedEvent(attempt=2, seq=0),
        DeltaEvent(attempt=2, seq=1, text="xyz"),
        _done(2, 2),
    )
    with pytest.raises(JobRestarted) as e:
        list(h.text(timeout=5))
    assert e.value.attempt == 2 and e.value.shown == "abc"
    with pytest.raises(JobRestarted):
        list(h.text(timeout=5, on_restart="raise"))
    assert h.result(timeout=5).text == "xyz"


def test_stream_resumes_from_last_seen_id_and_blocks_for_new_events(p, r):
    h = p.submit("hi")
    emit(r, h.id, StartedEvent(attempt=1, seq=0), DeltaEvent(attempt=1, seq=1, text="a"))
    seen = []
    it = h.stream(timeout=5)
    for entry_id, ev in it:
        seen.append((entry_id, ev))
        if ev.type == "delta":
            break
    last = seen[-1][0]

    def later():
        time.sleep(0.3)
        emit(r, h.id, DeltaEvent(attempt=1, seq=2, text="b"), _done(1, 3))

    writer = threading.Thread(target=later)
    writer.start()
    rest = [ev for _, ev in h.stream(last_id=last, block_ms=100, timeout=5)]
    writer.join(5)  # its XADD reply may still be in flight when the reader has the event
    assert [e.type for e in rest] == ["delta", "done"] and rest[0].text == "b"


def test_error_event_raises_job_failed(p, r):
    h = p.submit("hi")
    emit(r, h.id, ErrorEvent(attempt=1, seq=0, code="prompt_too_long", message="prompt has 9000 tokens"))
    with pytest.raises(JobFailed) as e:
        h.result(timeout=5)
    assert e.value.code == "prompt_too_long" and "9000" in e.value.message


def test_result_timeout_and_unknown_job(p):
    h = p.submit("nobody serves this")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        h.result(timeout=0.3)
    assert time.monotonic() - t0 < 2
    with pytest.raises(JobNotFound):
        p.job("no-such-job").result(timeout=1)
    with pytest.raises(JobNotFound):
        p.job("no-such-job").status()


def test_cancel_sets_flag_and_reports_whether_pending(p, r):
    h = p.submit("hi")
    assert h.cancel() is True
    assert r.exists(keys.cancel(h.id)) and r.ttl(keys.cancel(h.id)) > 0
    assert h.status()["cancel_requested"] is True
    r.hset(keys.job_info(h.id), "status", "done")
    assert h.cancel() is False
    with pytest.raises(JobNotFound):
        p.job("missing").cancel()


def test_workers_lists_live_heartbeats(p, r):
    now = time.time()
    r.zadd(keys.workers(MODEL), {"live": now - 1, "dead": now - 600})
    assert set(p.workers()) == {"live"}


def test_async_producer_same_behaviour(redis_url, r):
    async def main():
        async with AsyncProducer(redis_url, default_model=MODEL, max_backlog=2) as ap:
            h = await ap.submit("hi", sampling={"max_tokens": 3})
            dup = await ap.submit("hi", idempotency_key="k")
            assert (await ap.submit("again", idempotency_key="k")).id == dup.id
            with pytest.raises(QueueFull):
                await ap.submit("full")
            emit(r, h.id, StartedEvent(attempt=1, seq=0), DeltaEvent(attempt=1, seq=1, text="yo", token_ids=[5]), _done(1, 2))
            res = await h.result(timeout=5)
            pieces = [t async for t in h.text(timeout=5)]
            st = await h.status()
            assert await h.cancel() is True
            return res, pieces, st

    res, pieces, st = asyncio.run(main())
    assert res.text == "yo" and res.token_ids == [5]
    assert pieces == ["yo"]
    assert st["status"] == "queued"


def test_producer_imports_without_torch():
    code = "import sys, inferq.producer; assert 'torch' not in sys.modules and 'inferq.gpuworker' not in sys.modules, sorted(m for m in sys.modules if m.startswith(('torch','inferq.gpuworker')))"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_redis_url_from_env_with_password(tmp_path, monkeypatch):
    from tests.conftest import RedisServer

    server = RedisServer(tmp_path, password="s3cret").start()
    try:
        monkeypatch.setenv("INFERQ_REDIS_URL", server.url)
        with Producer(default_model=MODEL) as prod:
            assert prod.ping()
            prod.submit("hi")
        monkeypatch.setenv("INFERQ_REDIS_URL", f"redis://:wrong@127.0.0.1:{server.port}/0")
        with pytest.raises(redis.AuthenticationError):
            Producer(default_model=MODEL).submit("hi")
    finally:
        server.stop()


def test_stream_resumes_across_a_redis_restart(tmp_path):
    from tests.conftest import RedisServer

    server = RedisServer(tmp_path, appendonly=True).start()
    try:
        p = Producer(server.url, default_model=MODEL)
        r = redis.Redis.from_url(server.url)
        h = p.submit("hi")
        emit(r, h.id, StartedEvent(attempt=1, seq=0), DeltaEvent(attempt=1, seq=1, text="before "))
        got = {}

        def reader():
            got["res"] = h.result(timeout=60)

        t = threading.Thread(target=reader)
        t.start()
        time.sleep(0.5)
        port = server.port
        server.stop()  # AOF keeps the reply stream
        time.sleep(1.0)
        server.port = port
        server.start()
        emit(r, h.id, DeltaEvent(attempt=1, seq=2, text="after"), _done(1, 3))
        t.join(30)
        assert got["res"].text == "before after"
        p.close()
        r.close()
    finally:
        server.stop()


def test_a_trimmed_reply_stream_is_an_error_not_short_text(p, r):
    """Events lost from the middle of a reply stream (trimmed by hand here, as a
    MAXLEN would) end the read with ReplyGap instead of a silently short text."""
    from inferq.schemas.fold import ReplyGap

    h = p.submit("hi")
    emit(r, h.id, StartedEvent(attempt=1, seq=0), DeltaEvent(attempt=1, seq=1, text="a"))
    lost = r.xadd(keys.reply(h.id), encode_event(DeltaEvent(attempt=1, seq=2, text="b")))
    emit(r, h.id, DeltaEvent(attempt=1, seq=3, text="c"), _done(1, 4))
    r.xdel(keys.reply(h.id), lost)
    with pytest.raises(ReplyGap, match="expected seq 2, got 3"):
        h.result(timeout=5)
