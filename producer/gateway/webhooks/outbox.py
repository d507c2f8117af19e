"""The delivery outbox in Redis, per partition (its keys share the partition's
slot with the completion-events stream, so turning a record into deliveries is
one script): a sorted set of delivery ids scored by when each is due, a hash per
delivery, a capped list of recent attempts and a capped dead-letter list.
Every change is one script (enqueue.lua, claim.lua, settle.lua)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from typing import Optional

from inferq.schemas import keys
from inferq.schemas.completion_events import EVENTS_GROUP
from inferq.schemas.text import as_str


def _script(redis, name: str):
    return redis.register_script(resources.files(__package__).joinpath(f"{name}.lua").read_text("utf-8"))


def delivery_id(event_id: str, endpoint_id: str) -> str:
    """The ``webhook-id`` of one event sent to one endpoint: the same on every
    attempt and after any crash, so a receiver drops duplicates by it."""
    return "wh_" + hashlib.sha256(f"{event_id}|{endpoint_id}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Delivery:
    id: str
    endpoint: str
    url: str
    tenant: str
    type: str
    event: str
    body: str
    created_at: float
    attempts: int = 0
    last_error: str = ""

    def fields(self) -> dict[str, str]:
        return {"id": self.id, "endpoint": self.endpoint, "url": self.url, "tenant": self.tenant, "type": self.type,
                "event": self.event, "body": self.body, "created_at": repr(self.created_at),
                "attempts": str(self.attempts), "last_error": self.last_error}

    @classmethod
    def from_fields(cls, raw: dict) -> "Delivery":
        f = {as_str(k): as_str(v) for k, v in raw.items()}
        return cls(id=f["id"], endpoint=f["endpoint"], url=f["url"], tenant=f["tenant"], type=f["type"],
                   event=f["event"], body=f["body"], created_at=float(f["created_at"]),
                   attempts=int(f.get("attempts") or 0), last_error=f.get("last_error", ""))

    def line(self, outcome: str, at: float, error: str = "", status: Optional[int] = None) -> dict:
        """One row of the recent or dead-letter list (no body: the event is named by its id)."""
        return {"id": self.id, "event": self.event, "type": self.type, "tenant": self.tenant,
                "endpoint": self.endpoint, "url": self.url, "outcome": outcome, "attempts": self.attempts,
                "status": status, "error": error, "created_at": self.created_at, "at": at}


class Outbox:
    def __init__(self, redis, recent_max: int = 200, dead_max: int = 10_000):
        self.redis, self.recent_max, self.dead_max = redis, recent_max, dead_max
        self._enqueue = _script(redis, "enqueue")
        self._claim = _script(redis, "claim")
        self._settle = _script(redis, "settle")

    async def enqueue(self, tag: str, entry_id: str, deliveries: list[Delivery], due: float) -> int:
        """Write a record's deliveries and ack + delete the record, in one step."""
        args: list = [EVENTS_GROUP, entry_id, repr(due)]
        for d in deliveries:
            flat = [x for kv in d.fields().items() for x in kv]
            args += [d.id, len(flat) // 2, *flat]
        return int(await self._enqueue(keys=[keys.completion_events(tag), keys.webhook_outbox(tag),
                                             *(keys.webhook_delivery(tag, d.id) for d in deliveries)], args=args))

    async def claim(self, tag: str, now: float, lease_until: float, limit: int) -> list[str]:
        ids = await self._claim(keys=[keys.webhook_outbox(tag)], args=[repr(now), repr(lease_until), limit])
        return [as_str(x) for x in ids]

    async def load(self, tag: str, delivery: str) -> Optional[Delivery]:
        raw = await self.redis.hgetall(keys.webhook_delivery(tag, delivery))
        return Delivery.from_fields(raw) if raw else None

    async def release(self, tag: str, delivery: str, now: float) -> None:
        """Due again at once (a stopping dispatcher hands back what it was sending)."""
        await self.redis.zadd(keys.webhook_outbox(tag), {delivery: now}, xx=True)

    async def settle(self, tag: str, d: Delivery, outcome: str, *, now: float, attempts: int, error: str = "",
                     status: Optional[int] = None, retry_at: float = 0.0) -> bool:
        done = d.__class__(**{**d.__dict__, "attempts": attempts})
        line = json.dumps(done.line(outcome, now, error, status))
        return bool(await self._settle(
            keys=[keys.webhook_outbox(tag), keys.webhook_delivery(tag, d.id), keys.webhook_recent(tag),
                  keys.webhook_dead(tag)],
            args=[d.id, outcome, repr(retry_at), attempts, error, line, self.recent_max,
                  line if outcome == "dead" else "", self.dead_max]))

    # -- reading (dashboard, metrics, tests) -------------------------------------
    async def recent(self, limit: int = 50) -> list[dict]:
        return await self._lines(keys.webhook_recent, limit)

    async def dead(self, limit: int = 50) -> list[dict]:
        return await self._lines(keys.webhook_dead, limit)

    async def _lines(self, key_of, limit: int) -> list[dict]:
        rows = []
        for tag in keys.all_tags():
            rows += [json.loads(as_str(x)) for x in await self.redis.lrange(key_of(tag), 0, limit - 1)]
        return sorted(rows, key=lambda r: r["at"], reverse=True)[:limit]

    async def depths(self) -> dict[str, int]:
        """Pending deliveries, dead letters and completion records not yet routed."""
        out = {"pending": 0, "dead": 0, "backlog": 0}
        for tag in keys.all_tags():
            out["pending"] += await self.redis.zcard(keys.webhook_outbox(tag))
            out["dead"] += await self.redis.llen(keys.webhook_dead(tag))
            out["backlog"] += await self.redis.xlen(keys.completion_events(tag))
        return out
