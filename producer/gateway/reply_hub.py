"""One Redis reader for every reply stream the gateway follows.

A follower of its own per request (``inferq.schemas.follower.afollow``) costs one
XREAD round trip per token per stream: a pooled connection checked out, a
command written, a socket wakeup, for every stream on every worker step. On a
box whose cores the worker needs, that is CPU taken from generation. Here one
task per hash tag (partition) holds a single XREAD BLOCK over all the streams
being followed, so one round trip per worker step serves them all (the worker
writes a step's events in one MULTI, which wakes the read once).

What a reader sees is unchanged: ``follow`` yields what ``afollow`` yields
(the same ``Cursor`` and ``Follow`` plan: attempt filter, keepalive ticks,
``missing`` on an idle read, giving up after the plan's outage tolerance).

A stream that starts being followed while the shared read is blocked without
it would wait for that read to time out; an entry on the reader's own tiny
wake stream (``keys.reader_wake``), read with an explicit last id so it cannot
be missed, ends the block at once. A follower that falls behind (a slow
client) leaves its stream out of the read until it has caught up, so entries
wait in Redis, not in gateway memory, as before.
"""
from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections import deque
from typing import Any, AsyncIterator, Optional

from inferq.schemas import keys
from inferq.schemas.follower import Cursor, Follow, afollow
from inferq.schemas.redis_errors import UNAVAILABLE
from inferq.schemas.text import as_str

# The shared read's BLOCK; RedisSettings requires socket_timeout above 1 s, the
# bound every BLOCK in the project keeps.
BLOCK_MS = 1000
# Entries one follower may have waiting before its stream leaves the read.
MAX_BUFFERED = 1024
WAKE_TTL_MS = 3_600_000
_ENTRY_ID = re.compile(r"^\d+(-\d+)?$")


def _settle(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class _Sub:
    """One follower's place in a tag reader: where the shared read resumes its
    stream, and what it has read for the follower that the follower has not taken."""

    def __init__(self, key: str, last_id: str):
        self.key = key
        self.last_id = last_id
        self.entries: deque = deque()
        self.paused = False  # left out of the read until the follower catches up
        self.error: Optional[BaseException] = None
        self.waiter: Optional[asyncio.Future] = None

    def push(self, entries: list) -> None:
        self.entries.extend(entries)
        self.last_id = as_str(entries[-1][0])
        if len(self.entries) >= MAX_BUFFERED:
            self.paused = True
        if self.waiter is not None:
            _settle(self.waiter)

    def fail(self, error: BaseException) -> None:
        self.error = error
        if self.waiter is not None:
            _settle(self.waiter)

    async def wait(self, timeout_s: float) -> None:
        """Until something was read for this follower, it failed, or ``timeout_s``."""
        if self.entries or self.error is not None:
            return
        loop = asyncio.get_running_loop()
        self.waiter = fut = loop.create_future()
        timer = loop.call_later(timeout_s, _settle, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self.waiter = None

    def take(self) -> list:
        out = list(self.entries)
        self.entries.clear()
        return out


class _TagReader:
    """The shared XREAD of the streams of one hash tag (one Redis Cluster slot)."""

    def __init__(self, redis, tag: str, reader_id: str, count: int):
        self.redis = redis
        self.wake_key = keys.reader_wake(tag, reader_id)
        self.wake_id = "0-0"
        self.count = count
        self.subs: dict[str, _Sub] = {}
        self.task: Optional[asyncio.Task] = None
        self.reading: Optional[dict[str, _Sub]] = None  # the followers of the read in flight
        self.down: Optional[BaseException] = None  # the last error while Redis is unreachable

    async def add(self, sub: _Sub) -> None:
        self.subs[sub.key] = sub
        if self.task is None:
            self.task = asyncio.create_task(self._run(), name=f"reply-reader {self.wake_key}")
        elif self.reading is not None and self.reading.get(sub.key) is not sub:
            await self.wake()

    def remove(self, sub: _Sub) -> None:
        if self.subs.get(sub.key) is sub:
            del self.subs[sub.key]

    async def resume(self, sub: _Sub) -> None:
        """A paused follower caught up: its stream rejoins the read."""
        sub.paused = False
        if self.reading is not None and self.reading.get(sub.key) is not sub and self.subs.get(sub.key) is sub:
            await self.wake()

    async def wake(self) -> None:
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.xadd(self.wake_key, {"w": "1"}, maxlen=1, approximate=False)
            pipe.pexpire(self.wake_key, WAKE_TTL_MS)
            await pipe.execute()
        except Exception:  # noqa: BLE001 - Redis down or refusing writes: the stream joins the next read (<= BLOCK_MS)
            pass

    async def _run(self) -> None:
        delay = 0.1
        try:
            while self.subs:
                reading = {key: sub for key, sub in self.subs.items() if not sub.paused}
                streams = {self.wake_key: self.wake_id, **{key: sub.last_id for key, sub in reading.items()}}
                self.reading = reading
                try:
                    resp = await self.redis.xread(streams, count=self.count, block=BLOCK_MS)
                except UNAVAILABLE as e:
                    # Followers decide when an outage has lasted too long (their plan).
                    self.down = e
                    await asyncio.sleep(delay)
                    delay = min(2.0, delay * 2)
                    continue
                finally:
                    self.reading = None
                self.down, delay = None, 0.1
                for key, entries in resp or ():
                    key = as_str(key)
                    if key == self.wake_key:
                        self.wake_id = as_str(entries[-1][0])
                    elif entries and key in reading and self.subs.get(key) is reading[key]:
                        # (not for a follower that left during the read, nor for a
                        # new one of the same job: it starts from its own id)
                        reading[key].push(entries)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - no follower may wait on a dead reader
            for sub in self.subs.values():
                sub.fail(e)
            self.subs.clear()
            if not isinstance(e, Exception):
                raise
        finally:
            self.task = None


class ReplyHub:
    """The gateway's followers of reply streams, one shared read per hash tag."""

    def __init__(self, redis, count: int = 256):
        self.redis = redis
        self.count = count
        self.id = uuid.uuid4().hex[:12]
        self.readers: dict[str, _TagReader] = {}

    def _reader(self, key: str) -> _TagReader:
        tag = keys.tag_of(key) or ""
        reader = self.readers.get(tag)
        if reader is None:
            reader = self.readers[tag] = _TagReader(self.redis, tag, self.id, self.count)
        return reader

    async def follow(self, key: str, plan: Follow, last_id: str = "0-0") -> AsyncIterator[tuple[Optional[str], Any]]:
        """``afollow``'s contract, on the shared read."""
        reader = self._reader(key)
        if key in reader.subs or not _ENTRY_ID.match(last_id):
            # A second reader of the same job (or an id only Redis can judge)
            # reads on its own, exactly as before.
            async for item in afollow(self.redis, key, plan, last_id):
                yield item
            return
        cur = Cursor(last_id)
        sub = _Sub(key, last_id)
        try:
            await reader.add(sub)
            while not cur.finished:
                await sub.wait(plan.wait_ms() / 1000)
                if sub.error is not None:
                    raise sub.error
                entries = sub.take()
                if entries:
                    plan.reached()
                    for item in plan.out(cur.take(entries)):
                        yield item
                    if sub.paused:  # caught up: back into the read
                        await reader.resume(sub)
                    continue
                if reader.down is not None:
                    plan.retry_delay(reader.down)  # raises once Redis stayed down too long
                elif plan.missing is not None and not await self.redis.exists(key):
                    raise plan.missing()
                else:
                    plan.reached()
                if plan.keepalive:
                    yield None, None
        finally:
            reader.remove(sub)

    async def close(self) -> None:
        tasks = [r.task for r in self.readers.values() if r.task is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
