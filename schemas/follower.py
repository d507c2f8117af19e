"""The one reply-stream follower: every reader (sync SDK, async SDK, gateway) uses it.

``Cursor`` is the sans-I/O part: it remembers the last entry id (so a read can
resume after a disconnect), filters events through ``ReplyFilter``, and is
finished only by a final event (``done``/``error``) of the attempt it accepts
— a stale ``done`` of an earlier attempt never ends a read. ``follow`` and
``afollow`` are the thin sync/async loops around XREAD BLOCK: they retry while
Redis is briefly unreachable and give up after ``timeout``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator, Optional

from inferq.schemas.events import decode_event
from inferq.schemas.fold import ReplyFilter, is_final
from inferq.schemas.redis_errors import UNAVAILABLE
from inferq.schemas.text import as_str


class Cursor:
    """Position and accepted attempt of one reader on one reply stream."""

    def __init__(self, last_id: str = "0-0") -> None:
        self.last_id = last_id
        self.filter = ReplyFilter(from_start=last_id in ("0", "0-0"))
        self.finished = False

    def take(self, entries) -> Iterator[tuple[str, Any, bool]]:
        """``(entry id, event, accepted)`` for each XREAD entry, up to and including
        the accepted final event."""
        for entry_id, fields in entries:
            self.last_id = as_str(entry_id)
            ev = decode_event(fields)
            accepted = self.filter.accept(ev)
            yield self.last_id, ev, accepted
            if accepted and is_final(ev):
                self.finished = True
                return


@dataclass
class Follow:
    """How one read goes; the clock and retry policy both shells share."""

    job_id: str
    block_ms: int = 5000
    timeout: Optional[float] = None  # TimeoutError after this many seconds
    reconnect_timeout: float = 30.0  # give up when Redis stays unreachable this long
    raw: bool = False  # also yield events the filter dropped
    keepalive: bool = False  # yield (None, None) after each idle BLOCK or outage retry
    count: int = 512
    missing: Optional[Callable[[], Exception]] = None  # raised when the stream is gone on an idle read

    def __post_init__(self) -> None:
        self.end = None if self.timeout is None else time.monotonic() + self.timeout
        self.down_since: Optional[float] = None

    def wait_ms(self) -> int:
        if self.end is None:
            return self.block_ms
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"job {self.job_id} did not finish within {self.timeout}s")
        return max(1, min(self.block_ms, int(left * 1000)))

    def reached(self) -> None:
        self.down_since = None

    def retry_delay(self, error: Exception) -> float:
        """After a connection error: seconds to wait before reading again from the
        last seen id, or ``error`` raised when Redis stays down too long."""
        now = time.monotonic()
        self.down_since = self.down_since or now
        if now - self.down_since > self.reconnect_timeout:
            raise error
        return min(2.0, 0.1 * 2 ** min(int(now - self.down_since), 4))

    def out(self, taken):
        for entry_id, ev, accepted in taken:
            if accepted or self.raw:
                yield entry_id, ev


# Redis down, or a cluster between topologies: resume from the last seen id.
_DOWN = UNAVAILABLE


def follow(r, key: str, plan: Follow, last_id: str = "0-0") -> Iterator[tuple[Optional[str], Any]]:
    """Sync: yield ``(entry id, event)`` until the accepted final event."""
    cur = Cursor(last_id)
    while not cur.finished:
        wait = plan.wait_ms()
        try:
            resp = r.xread({key: cur.last_id}, count=plan.count, block=wait)
            plan.reached()
        except _DOWN as e:
            # Redis restarting or a network blip: resume from the last seen id.
            time.sleep(plan.retry_delay(e))
            if plan.keepalive:
                yield None, None
            continue
        if not resp:
            if plan.missing is not None and not r.exists(key):
                raise plan.missing()
            if plan.keepalive:
                yield None, None
            continue
        yield from plan.out(cur.take(resp[0][1]))


async def afollow(r, key: str, plan: Follow, last_id: str = "0-0") -> AsyncIterator[tuple[Optional[str], Any]]:
    """Async twin of ``follow`` (redis.asyncio client)."""
    import asyncio

    cur = Cursor(last_id)
    while not cur.finished:
        wait = plan.wait_ms()
        try:
            resp = await r.xread({key: cur.last_id}, count=plan.count, block=wait)
            plan.reached()
        except _DOWN as e:
            await asyncio.sleep(plan.retry_delay(e))
            if plan.keepalive:
                yield None, None
            continue
        if not resp:
            if plan.missing is not None and not await r.exists(key):
                raise plan.missing()
            if plan.keepalive:
                yield None, None
            continue
        for item in plan.out(cur.take(resp[0][1])):
            yield item
