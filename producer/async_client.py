"""asyncio producer SDK (redis.asyncio): the same API as ``Producer`` with
``await`` and ``async for``.

    p = AsyncProducer()
    h = await p.submit("Hello", sampling={"max_tokens": 32})
    async for piece in h.text():
        ...
    res = await h.result(timeout=60)
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, AsyncIterator, Optional

from inferq.schemas import keys, transitions
from inferq.schemas.follower import afollow
from inferq.schemas.queues import alanes_of
from inferq.schemas.text import as_str

from inferq.producer.admission import ADMISSION_LUA, aadmit
from inferq.producer.client import (JobResult, ResultBuilder, TextFollower, build_job, embed_jobs_kw, follow_plan,
                                    parse_status, resolve_settings)
from inferq.producer.errors import JobNotFound
from inferq.producer.settings import ProducerSettings
from inferq.schemas.connection import async_client


class AsyncJobHandle:
    def __init__(self, producer: "AsyncProducer", job_id: str, *, entry_id: Optional[str] = None, duplicate: bool = False,
                 replicas: Optional[int] = None, replicated: bool = True):
        self._p = producer
        self.id = job_id
        self.entry_id = entry_id
        self.duplicate = duplicate
        # INFERQ_ADMISSION_REPLICAS: replicas that acknowledged the job (None: WAIT
        # off); replicated is False when fewer than asked did (see docs/deploy.md).
        self.replicas = replicas
        self.replicated = replicated

    def __repr__(self) -> str:
        return f"AsyncJobHandle({self.id!r})"

    async def _exists(self) -> bool:
        return bool(await self._p.redis.exists(keys.reply(self.id), keys.job_info(self.id)))

    async def stream(
        self, last_id: str = "0-0", block_ms: int = 5000, timeout: Optional[float] = None, raw: bool = False
    ) -> AsyncIterator[tuple[str, Any]]:
        """Async twin of JobHandle.stream: ``(entry_id, event)`` until done/error."""
        if not await self._exists():
            raise JobNotFound(self.id)
        plan = follow_plan(self._p.settings, self.id, block_ms, timeout, raw)
        async for item in afollow(self._p.redis, keys.reply(self.id), plan, last_id):
            yield item

    async def text(self, timeout: Optional[float] = None, on_restart: str = "follow") -> AsyncIterator[str]:
        follower = TextFollower(self.id, on_restart)
        async for _, ev in self.stream(timeout=timeout):
            piece = follower.feed(ev)
            if piece:
                yield piece

    async def result(self, timeout: Optional[float] = None) -> JobResult:
        builder = ResultBuilder(self.id)
        async for _, ev in self.stream(timeout=timeout):
            res = builder.feed(ev)
            if res is not None:
                return res
        raise RuntimeError("reply stream ended without done/error")

    async def cancel(self) -> bool:
        if not await self._exists():
            raise JobNotFound(self.id)
        return bool(await transitions.request_cancel(self._p.redis, job_id=self.id, ttl=self._p.settings.live_ttl))

    async def status(self) -> dict:
        pipe = self._p.redis.pipeline(transaction=False)
        pipe.hgetall(keys.job_info(self.id))
        pipe.exists(keys.cancel(self.id))
        info, cancel = await pipe.execute()
        if not info:
            raise JobNotFound(self.id)
        return parse_status(self.id, info, bool(cancel))


class AsyncProducer:
    def __init__(
        self,
        redis_url: Optional[str] = None,
        *,
        default_model: Optional[str] = None,
        max_backlog: Optional[int] = None,
        live_ttl: Optional[int] = None,
        settings: Optional[ProducerSettings] = None,
        redis_client=None,
        **overrides: Any,
    ):
        self.settings = resolve_settings(settings, redis_url=redis_url, default_model=default_model,
                                         max_backlog=max_backlog, live_ttl=live_ttl, **overrides)
        self.redis = redis_client if redis_client is not None else async_client(self.settings)
        self._admit = self.redis.register_script(ADMISSION_LUA)

    @property
    def default_model(self) -> str:
        return self.settings.default_model

    async def submit(self, prompt: Optional[str] = None, *, idempotency_key: Optional[str] = None, **kw: Any) -> AsyncJobHandle:
        job = build_job(self.default_model, prompt, idempotency_key=idempotency_key, **kw)
        adm = await aadmit(self.redis, self._admit, job, idempotency_key, self.settings)
        return AsyncJobHandle(self, adm.job_id, entry_id=adm.entry_id, duplicate=adm.duplicate,
                              replicas=adm.replicas, replicated=adm.replicated)

    def job(self, job_id: str) -> AsyncJobHandle:
        return AsyncJobHandle(self, job_id)

    async def embed(self, inputs, *, pooling: Optional[str] = None, normalize: bool = True,
                    timeout: Optional[float] = None, **kw: Any) -> list[list[float]]:
        """Producer.embed, awaited: one ``embed`` job per input, the vectors in order."""
        handles = []
        try:
            for job_kw in embed_jobs_kw(inputs, pooling, normalize):
                handles.append(await self.submit(**job_kw, **kw))
            return [(await h.result(timeout)).embedding for h in handles]
        except BaseException:
            for h in handles:  # the rest would be wasted work
                with contextlib.suppress(Exception):
                    await h.cancel()
            raise

    async def tokenize(self, prompt: Optional[str] = None, *, messages: Optional[list] = None,
                       add_special_tokens: Optional[bool] = None, add_generation_prompt: bool = True,
                       timeout: Optional[float] = None, **kw: Any) -> list[int]:
        """Producer.tokenize, awaited."""
        opts = {"add_special_tokens": add_special_tokens, "add_generation_prompt": add_generation_prompt}
        handle = await self.submit(prompt, messages=messages, task="tokenize", tokenize=opts, **kw)
        return (await handle.result(timeout)).token_ids

    async def depth(self, model: Optional[str] = None) -> int:
        """Jobs of the model that have not finished (queued + running), all lanes."""
        lanes = await alanes_of(self.redis, model or self.default_model)
        return sum([int(await self.redis.xlen(ln.stream)) for ln in lanes])

    async def workers(self, model: Optional[str] = None) -> dict[str, float]:
        now = time.time()
        since = now - self.settings.worker_stale_seconds
        rows = await self.redis.zrangebyscore(keys.workers(model or self.default_model), since, "+inf", withscores=True)
        return {as_str(w): round(now - score, 3) for w, score in rows}

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    async def close(self) -> None:
        await self.redis.aclose()

    async def __aenter__(self) -> "AsyncProducer":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


__all__ = ["AsyncProducer", "AsyncJobHandle"]
