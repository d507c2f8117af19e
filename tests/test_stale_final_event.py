"""A stale lower-attempt ``done`` on a reply stream (a worker that lost its job
writing late) must not end any reader's read: the sync SDK, the async SDK and
the gateway all follow the reply stream with inferq.schemas.follower and stop only on
the final event of the attempt they accept.

The events are written by hand into a real redis-server stream."""
from __future__ import annotations

import asyncio
import json

import httpx
import redis

from inferq.producer import AsyncProducer, Producer
from inferq.producer.gateway.backend import Backend
from inferq.producer.settings import ProducerSettings
from inferq.schemas import encode_event, keys
from inferq.schemas.events import DeltaEvent, DoneEvent, RestartedEvent, StartedEvent
from inferq.schemas.fold import Assembly
from tests.gateway.stack import running_gateway

MODEL = "stale-model"


def add(r, job_id, ev):
    return r.xadd(keys.reply(job_id), encode_event(ev)).decode()


def submit_with_stale_done(url: str) -> tuple[Producer, str]:
    """Attempt 1 wrote "old" and, after attempt 2 took over, a late ``done``."""
    p = Producer(url, default_model=MODEL)
    h = p.submit("hi")
    r = p.redis
    add(r, h.id, StartedEvent(attempt=1, seq=0, worker="w1"))
    add(r, h.id, DeltaEvent(attempt=1, seq=1, text="old", token_ids=[1]))
    add(r, h.id, RestartedEvent(attempt=2, seq=0, reason="redelivered"))
    add(r, h.id, StartedEvent(attempt=2, seq=1, worker="w2"))
    add(r, h.id, DeltaEvent(attempt=2, seq=2, text="new", token_ids=[2]))
    add(r, h.id, DoneEvent(attempt=1, seq=2, finish_reason="stop"))  # stale
    return p, h.id


def real_done(r, job_id):
    return add(r, job_id, DoneEvent(attempt=2, seq=3, finish_reason="length"))


def test_sync_sdk_reads_on_past_a_stale_done(redis_url):
    p, job_id = submit_with_stale_done(redis_url)
    stream = p.job(job_id).stream(raw=True, block_ms=200)
    # Read up to the stale done, and only then write the real one: the read must
    # still be open (no timing involved).
    for _, ev in stream:
        if ev.type == "done":
            assert ev.attempt == 1
            break
    real_done(p.redis, job_id)
    rest = [ev for _, ev in stream]
    assert [(e.type, e.attempt) for e in rest] == [("done", 2)]
    res = p.job(job_id).result(timeout=30)
    assert (res.text, res.token_ids, res.finish_reason, res.attempt) == ("new", [2], "length", 2)
    p.close()


def test_async_sdk_reads_on_past_a_stale_done(redis_url):
    p, job_id = submit_with_stale_done(redis_url)

    async def main():
        ap = AsyncProducer(redis_url, default_model=MODEL)
        try:
            seen = []
            agen = ap.job(job_id).stream(raw=True, block_ms=200)
            async for _, ev in agen:
                seen.append((ev.type, ev.attempt))
                if ev.type == "done" and ev.attempt == 1:
                    real_done(p.redis, job_id)
            res = await ap.job(job_id).result(timeout=30)
            return seen, res
        finally:
            await ap.close()

    seen, res = asyncio.run(main())
    assert seen[-2:] == [("done", 1), ("done", 2)]
    assert (res.text, res.finish_reason, res.attempt) == ("new", "length", 2)
    p.close()


def test_gateway_backend_reads_on_past_a_stale_done(redis_url):
    p, job_id = submit_with_stale_done(redis_url)

    async def main():
        backend = Backend(ProducerSettings(redis_url=redis_url))
        asm = Assembly()
        try:
            async for _, ev in backend.events(job_id, block_ms=200):
                if ev is None:
                    continue
                asm.feed(ev)
                if ev.type == "done" and ev.attempt == 1:
                    assert not asm.finished
                    real_done(p.redis, job_id)
            return asm
        finally:
            await backend.close()

    asm = asyncio.run(main())
    assert asm.finished and (asm.text, asm.finish_reason, asm.attempt) == ("new", "length", 2)
    p.close()


def test_gateway_event_stream_does_not_end_at_a_stale_done(redis_url):
    p, job_id = submit_with_stale_done(redis_url)
    final_id = real_done(p.redis, job_id)
    with running_gateway(redis_url) as url:
        events = []
        with httpx.stream("GET", f"{url}/v1/jobs/{job_id}/events", timeout=30) as resp:
            assert resp.status_code == 200
            last_id = None
            for line in resp.iter_lines():
                if line.startswith("id:"):
                    last_id = line[3:].strip()
                elif line.startswith("data:"):
                    events.append(json.loads(line[5:]))
        assert (events[-1]["type"], events[-1]["attempt"]) == ("done", 2) and last_id == final_id
        job = httpx.get(f"{url}/v1/jobs/{job_id}", timeout=30).json()
        assert (job["text"], job["finish_reason"], job["attempt"]) == ("new", "length", 2)
    p.close()
