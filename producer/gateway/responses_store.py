"""Stored responses in Redis: per tenant, bounded, each with an expiry.

``inferq:response:{p}:<job>`` (hash) holds ``spec`` (responses_spec.ResponseSpec as
JSON) and, once the job has ended, ``final`` (the response object at its end), so a
response outlives its job's reply stream (which expires ``reply_ttl`` after the
job ends). Every gateway process saves the finals of ended jobs listed in
``inferq:responses:unsaved`` (``save_finals``), so a background response is kept
even if no client asks for it before its reply stream expires, whichever gateway
created it and whether or not that gateway still runs.

Per tenant, ``inferq:responses:{t=<tenant>}`` lists the stored responses by
creation time; past ``max_per_tenant`` the oldest are deleted.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Optional

from inferq.schemas import keys
from inferq.schemas.text import as_str
from inferq.producer.gateway.responses_spec import ResponseSpec

_SPEC, _FINAL = "spec", "final"


@dataclass
class Stored:
    spec: ResponseSpec
    final: Optional[dict] = None  # the response object once its job ended


class ResponseStore:
    def __init__(self, redis, ttl_s: int, max_per_tenant: int):
        self.redis = redis
        self.ttl_s = ttl_s
        self.max_per_tenant = max_per_tenant

    async def save(self, spec: ResponseSpec) -> None:
        key = keys.response(spec.job_id)
        await self.redis.hset(key, mapping={_SPEC: spec.model_dump_json()})
        await self.redis.expire(key, self.ttl_s)
        now = time.time()  # finer than created_at (whole seconds): the oldest go first, in order
        await self.redis.zadd(keys.responses_unsaved(), {spec.job_id: now})
        index = keys.responses_of(spec.tenant or "")
        await self.redis.zadd(index, {spec.job_id: now})
        await self.redis.expire(index, self.ttl_s)
        excess = await self.redis.zcard(index) - self.max_per_tenant
        if excess > 0:
            for old in await self.redis.zpopmin(index, excess):
                await self.delete(as_str(old[0]), spec.tenant)

    async def load(self, job_id: str) -> Optional[Stored]:
        raw = await self.redis.hgetall(keys.response(job_id))
        if not raw:
            return None
        fields = {as_str(k): as_str(v) for k, v in raw.items()}
        if _SPEC not in fields:
            return None
        final = json.loads(fields[_FINAL]) if fields.get(_FINAL) else None
        return Stored(ResponseSpec.model_validate_json(fields[_SPEC]), final)

    async def save_final(self, job_id: str, body: dict) -> None:
        """Keep the ended response's object (only while its record exists: a deleted
        or expired response is not brought back)."""
        key = keys.response(job_id)
        if await self.redis.exists(key):
            await self.redis.hset(key, _FINAL, json.dumps(body, separators=(",", ":"), ensure_ascii=False))
        await self.redis.zrem(keys.responses_unsaved(), job_id)

    async def forget_unsaved(self, job_id: str) -> None:
        await self.redis.zrem(keys.responses_unsaved(), job_id)

    async def delete(self, job_id: str, tenant: Optional[str]) -> bool:
        gone = bool(await self.redis.delete(keys.response(job_id)))
        await self.redis.zrem(keys.responses_of(tenant or ""), job_id)
        await self.redis.zrem(keys.responses_unsaved(), job_id)
        return gone

    async def unsaved(self, limit: int = 1000) -> list[str]:
        """Responses whose final is not saved yet, oldest first; ids older than the
        records' expiry are dropped (their records are gone)."""
        await self.redis.zremrangebyscore(keys.responses_unsaved(), "-inf", time.time() - self.ttl_s)
        return [as_str(x) for x in await self.redis.zrange(keys.responses_unsaved(), 0, limit - 1)]
