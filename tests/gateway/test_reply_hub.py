"""The gateway's shared reply reader (producer/gateway/reply_hub.py) on a real
redis-server, and concurrent streams through the gateway with the openai client.

Waits are on observed progress (events seen, a read in flight), each with a
generous deadline that only a broken reader reaches."""
from __future__ import annotations

import asyncio
import time

import pytest
import redis
from openai import AsyncOpenAI

from inferq.producer.gateway import reply_hub, sse
from inferq.producer.gateway import openai_format as fmt
from inferq.producer.gateway.reply_hub import ReplyHub
from inferq.producer.settings import ProducerSettings
from inferq.schemas import keys
from inferq.schemas.connection import async_client
from inferq.schemas.events import DeltaEvent, DoneEvent, QueuedEvent, encode_event
from inferq.schemas.follower import Follow
from tests.gateway.stack import TINY

DEADLINE_S = 60.0


def _plan(job_id: str, block_ms: int = 1000) -> Follow:
    return Follow(job_id, block_ms=block_ms, raw=True, keepalive=True, missing=lambda: LookupError(job_id))


def _xreads(r) -> int:
    return int(r.info("commandstats").get("cmdstat_xread", {}).get("calls", 0))


async def _until(cond, what: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.005)


def _queued(r, job_id: str) -> None:
    r.xadd(keys.reply(job_id), encode_event(QueuedEvent(seq=0, model=TINY)))


def _step(r, job_ids, seq: int, final: bool = False) -> None:
    """One worker step: an event on every stream in one MULTI."""
    pipe = r.pipeline(transaction=True)
    for j in job_ids:
        ev = DoneEvent(seq=seq, finish_reason="length") if final else DeltaEvent(seq=seq, text=f"t{seq}",
                                                                                   token_ids=[seq])
        pipe.xadd(keys.reply(j), encode_event(ev))
    pipe.execute()


async def _collect(hub: ReplyHub, job_id: str, seen: list, plan=None) -> None:
    async for _, ev in hub.follow(keys.reply(job_id), plan or _plan(job_id)):
        if ev is not None:
            seen.append(ev)


def test_one_read_per_step_serves_every_stream(redis_url):
    r = redis.Redis.from_url(redis_url)
    jobs = [f"hub-{i}" for i in range(12)]
    steps = 10

    async def main():
        aredis = async_client(ProducerSettings(redis_url=redis_url))
        hub = ReplyHub(aredis)
        seen = {j: [] for j in jobs}
        for j in jobs:
            _queued(r, j)
        tasks = [asyncio.create_task(_collect(hub, j, seen[j])) for j in jobs]
        await _until(lambda: all(seen.values()), "every queued event")
        before, start = _xreads(r), time.monotonic()
        for seq in range(1, steps + 1):
            _step(r, jobs, seq)
            await _until(lambda: all(len(s) == seq + 1 for s in seen.values()), f"step {seq}")
        _step(r, jobs, steps + 1, final=True)
        await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_S)
        reads = _xreads(r) - before
        elapsed = time.monotonic() - start
        await hub.close()
        await aredis.aclose()
        return seen, reads, elapsed

    seen, reads, elapsed = asyncio.run(main())
    for j in jobs:
        assert [e.seq for e in seen[j]] == list(range(steps + 2))
        assert [e.type for e in seen[j]][-1] == "done"
    # At most two reads per step (Redis before 7.2 answers a blocked XREAD with the one
    # stream that woke it; the next read takes the rest at once), plus idle BLOCK
    # timeouts, where a reader per stream needs one read per stream per step.
    idle = elapsed * 1000 / reply_hub.BLOCK_MS
    assert reads <= 2 * (steps + 1) + idle + 2, (reads, elapsed)
    assert reads * 4 < len(jobs) * steps


def test_a_new_stream_joins_a_blocked_read_at_once(redis_url, monkeypatch):
    # A BLOCK longer than the deadline: only the wake entry can bring the new stream in in time.
    monkeypatch.setattr(reply_hub, "BLOCK_MS", 120_000)
    r = redis.Redis.from_url(redis_url)

    async def main():
        aredis = async_client(ProducerSettings(redis_url=redis_url, socket_timeout=300))
        hub = ReplyHub(aredis)
        first, second = [], []
        _queued(r, "wake-a")
        a = asyncio.create_task(_collect(hub, "wake-a", first, _plan("wake-a", block_ms=300_000)))
        await _until(lambda: first, "the first stream's event")
        reader = hub.readers[keys.tag_of(keys.reply("wake-a"))]
        await _until(lambda: reader.reading is not None, "the shared read to block")
        _queued(r, "wake-b")
        b = asyncio.create_task(_collect(hub, "wake-b", second, _plan("wake-b", block_ms=300_000)))
        await asyncio.wait_for(_until(lambda: second, "the new stream's event"), DEADLINE_S)
        _step(r, ["wake-a", "wake-b"], 1, final=True)
        await asyncio.wait_for(asyncio.gather(a, b), DEADLINE_S)
        await hub.close()
        await aredis.aclose()
        return first, second

    first, second = asyncio.run(main())
    assert [e.type for e in first] == [e.type for e in second] == ["queued", "done"]


def test_a_slow_follower_leaves_the_read_and_still_gets_everything(redis_url, monkeypatch):
    monkeypatch.setattr(reply_hub, "MAX_BUFFERED", 4)
    r = redis.Redis.from_url(redis_url)
    job = "slow"
    _queued(r, job)
    for seq in range(1, 21):
        _step(r, [job], seq)

    async def main():
        aredis = async_client(ProducerSettings(redis_url=redis_url))
        hub = ReplyHub(aredis)
        seen, paused = [], []
        async for _, ev in hub.follow(keys.reply(job), _plan(job)):
            if ev is None:
                continue
            seen.append(ev.seq)
            if len(seen) == 1:
                sub = hub.readers[keys.tag_of(keys.reply(job))].subs[keys.reply(job)]
                paused.append(sub.paused)  # 21 entries read at once, more than 4 buffered
                for seq in range(21, 31):  # written while it is out of the read
                    _step(r, [job], seq)
                _step(r, [job], 31, final=True)
        await hub.close()
        await aredis.aclose()
        return seen, paused

    seen, paused = asyncio.run(main())
    assert paused == [True]
    assert seen == list(range(32))


def test_two_followers_of_one_job_each_get_every_event(redis_url):
    r = redis.Redis.from_url(redis_url)
    _queued(r, "twice")

    async def main():
        aredis = async_client(ProducerSettings(redis_url=redis_url))
        hub = ReplyHub(aredis)
        one, two = [], []
        tasks = [asyncio.create_task(_collect(hub, "twice", s)) for s in (one, two)]
        await _until(lambda: one and two, "both followers' first event")
        _step(r, ["twice"], 1)
        _step(r, ["twice"], 2, final=True)
        await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_S)
        await hub.close()
        await aredis.aclose()
        return one, two

    one, two = asyncio.run(main())
    assert [e.seq for e in one] == [e.seq for e in two] == [0, 1, 2]


def test_a_stream_that_does_not_exist_raises_missing_on_an_idle_read(redis_url):
    async def main():
        aredis = async_client(ProducerSettings(redis_url=redis_url))
        hub = ReplyHub(aredis)
        try:
            with pytest.raises(LookupError):
                await asyncio.wait_for(_collect(hub, "nobody", [], _plan("nobody", block_ms=100)), DEADLINE_S)
            assert not any(rd.subs for rd in hub.readers.values())  # the follower left the read
        finally:
            await hub.close()
            await aredis.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("text", ["plain", "", 'quote " and \\ backslash', "line\nbreak\ttab\x01", "héllo ✓ 🎉",
                                  "\u2028\u2029", "\x00inferq-text\x00"])
def test_text_events_give_the_bytes_of_a_full_encode(text):
    for body in (lambda t: fmt.completion_chunk("j1", "m", 1700000000, t, include_usage=True),
                 lambda t: fmt.chat_chunk("j1", "m", 1700000000, {"content": t})):
        assert sse.TextEvents(body)(text) == sse.data(body(text))


def test_concurrent_streams_through_the_gateway_equal_their_non_streamed_results(gateway_url):
    prompts = [f"Count to {i}:" for i in range(8)]

    async def main():
        client = AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key="unused", max_retries=0, timeout=120)

        async def streamed(prompt):
            chunks = await client.completions.create(model=TINY, prompt=prompt, max_tokens=12, temperature=0,
                                                     stream=True)
            return "".join([c.choices[0].text async for c in chunks if c.choices])

        async def whole(prompt):
            r = await client.completions.create(model=TINY, prompt=prompt, max_tokens=12, temperature=0)
            return r.choices[0].text

        try:
            got = await asyncio.gather(*(streamed(p) for p in prompts))
            want = await asyncio.gather(*(whole(p) for p in prompts))
        finally:
            await client.close()
        return got, want

    got, want = asyncio.run(main())
    assert got == want
    assert all(got)
