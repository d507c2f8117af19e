"""The gateway's side of Redis: admit jobs, read reply streams, cancel, look up
workers. Async, one connection pool per app."""
from __future__ import annotations

import time
from typing import AsyncIterator, Optional

import anyio

from inferq.schemas import Job, decode_event, keys, records, transitions
from inferq.schemas.connection import async_client, sync_client
from inferq.schemas.fold import Assembly
from inferq.schemas.follower import Follow
from inferq.schemas.queues import models_of_keys
from inferq.schemas.text import as_str
from inferq.producer.admission import ADMISSION_LUA, Admitted, aadmit
from inferq.producer.errors import JobNotFound
from inferq.producer.gateway.reply_hub import ReplyHub
from inferq.producer.queue_stats import ModelQueueStats, all_stats
from inferq.producer.settings import ProducerSettings


class Backend:
    def __init__(self, settings: ProducerSettings, max_connections: Optional[int] = None):
        self.settings = settings
        self.redis = async_client(settings, max_connections=max_connections)
        self._admit = self.redis.register_script(ADMISSION_LUA)
        self.replies = ReplyHub(self.redis)  # one shared read for every stream followed
        self._models_cache: tuple[float, list[str]] = (0.0, [])
        self.outage_tolerance_s = 30.0

    async def close(self) -> None:
        await self.replies.close()
        await self.redis.aclose()

    async def ping(self) -> bool:
        try:
            return bool(await self.redis.ping())
        except Exception:
            return False

    # -- jobs -----------------------------------------------------------
    async def submit(self, job: Job, idempotency_key: Optional[str] = None) -> Admitted:
        """Admission + enqueue in one Lua step; raises QueueFull / RateLimited / QueueUnavailable."""
        return await aadmit(self.redis, self._admit, job, idempotency_key, self.settings)

    async def info(self, job_id: str) -> Optional[dict]:
        raw = await self.redis.hgetall(keys.job_info(job_id))
        if not raw:
            # The info hash may have expired while the reply stream lives on.
            if not await self.redis.exists(keys.reply(job_id)):
                return None
            return {}
        return records.parse_info(raw)

    async def cancel(self, job_id: str) -> None:
        # The worker checks the flag once per step (and at intake); its TTL
        # outlives any waiting job so a late intake still sees it.
        await transitions.request_cancel(self.redis, job_id=job_id, ttl=self.settings.live_ttl)

    async def events(self, job_id: str, last_id: str = "0-0",
                     block_ms: int = 1000) -> AsyncIterator[tuple[Optional[str], object]]:
        """Yield (entry id, event) from ``last_id`` on; (None, None) after each
        idle ``block_ms`` so callers can send keepalives and notice disconnects.
        Every event is yielded (the fold filters); the read ends only on the
        final event of the attempt the follower accepts."""
        plan = Follow(job_id, block_ms=block_ms, count=self.replies.count, raw=True, keepalive=True,
                      reconnect_timeout=self.outage_tolerance_s, missing=lambda: JobNotFound(job_id))
        async for item in self.replies.follow(keys.reply(job_id), plan, last_id):
            yield item

    async def history(self, job_id: str) -> Assembly:
        asm = Assembly()
        for _, fields in await self.redis.xrange(keys.reply(job_id)):
            asm.feed(decode_event(fields))
        return asm

    # -- models and workers ---------------------------------------------
    async def live_worker_count(self, model: str) -> int:
        cutoff = time.time() - self.settings.worker_stale_seconds
        return int(await self.redis.zcount(keys.workers(model), cutoff, "+inf"))

    async def known_models(self, max_age_s: float = 2.0) -> list[str]:
        """Models with a job stream or a worker registry (cached briefly: SCAN is
        not free). A model whose workers all stopped stays known, so it gets 503."""
        at, models = self._models_cache
        if time.monotonic() - at < max_age_s:
            return models
        found = set()
        async for key in self.redis.scan_iter(match=keys.pattern("workers"), count=500):
            m = keys.tag_of(as_str(key))
            if m:
                found.add(m)
        found |= models_of_keys([k async for k in self.redis.scan_iter(match=keys.pattern("jobs"), count=500)])
        models = sorted(found)
        self._models_cache = (time.monotonic(), models)
        return models

    async def queue_stats(self) -> list[ModelQueueStats]:
        # The stats reader is synchronous (shared with the CLI); run it off the loop.
        def read():
            r = sync_client(self.settings)
            try:
                return all_stats(r, self.settings.worker_stale_seconds)
            finally:
                r.close()

        return await anyio.to_thread.run_sync(read)
