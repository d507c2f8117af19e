"""The webhook dispatcher: an asyncio task pair inside every gateway process.

Intake reads the completion-events streams as one consumer of the group
``inferq-webhooks`` (so several gateways share the records), turns each record
into deliveries for the tenant's subscribed endpoints and writes them to the
outbox while acking + deleting the record (one script). Records a dead gateway
had read but not handled are claimed after ``claim_idle_s`` (XAUTOCLAIM, as the
worker's reaper does for jobs). The sender claims due deliveries (a lease in
the outbox's scores), POSTs each signed body and settles it: delivered, retry
later with exponential back-off, or dead-lettered with the last error once out
of attempts or age. Nothing here runs on a request's path; a slow endpoint
holds one of ``concurrency`` sends, never the event loop.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
import uuid
from dataclasses import dataclass
from typing import Optional

import httpx
from redis.exceptions import ResponseError

from inferq.schemas import keys
from inferq.schemas.completion_events import EVENTS_GROUP, CompletionEvent
from inferq.producer.gateway.webhooks import batch_events
from inferq.producer.gateway.webhooks.endpoints import EndpointStore
from inferq.producer.gateway.webhooks.outbox import Delivery, Outbox, delivery_id
from inferq.producer.gateway.webhooks.signer import signed_headers

log = logging.getLogger("inferq.gateway.webhooks")


@dataclass(frozen=True)
class DispatchPolicy:
    timeout_s: float = 10.0
    max_attempts: int = 12
    max_age_s: float = 72 * 3600.0
    backoff_s: float = 5.0
    backoff_max_s: float = 3600.0
    concurrency: int = 32
    claim_idle_s: float = 30.0
    poll_s: float = 0.2
    read_count: int = 200

    @property
    def lease_s(self) -> float:
        """How long a claimed delivery stays with its sender: past the HTTP timeout,
        so only a sender that died leaves it to another gateway."""
        return 2 * self.timeout_s + 5.0

    def backoff(self, attempts: int) -> float:
        """Exponential with jitter (a half to the whole step), so retries of many
        deliveries to one recovering endpoint spread out."""
        step = min(self.backoff_s * 2 ** max(attempts - 1, 0), self.backoff_max_s)
        return step * (0.5 + random.random() / 2)


class Dispatcher:
    def __init__(self, redis, endpoints: EndpointStore, outbox: Outbox, policy: DispatchPolicy, metrics=None):
        self.redis, self.endpoints, self.outbox, self.policy, self.metrics = redis, endpoints, outbox, policy, metrics
        self.consumer = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._tasks: list[asyncio.Task] = []
        self._stopping = False
        self._sending: dict[asyncio.Task, tuple[str, str]] = {}
        self._http: Optional[httpx.AsyncClient] = None
        self._last_reclaim = self._last_sweep = 0.0  # monotonic times of the housekeeping's slower jobs

    def start(self) -> None:
        self._http = httpx.AsyncClient(timeout=self.policy.timeout_s, follow_redirects=False)
        self._tasks = [asyncio.create_task(self._forever(self._intake_round, "intake")),
                       asyncio.create_task(self._forever(self._send_round, "send")),
                       asyncio.create_task(self._forever(self._housekeeping_round, "housekeeping", every=2.0))]

    async def stop(self) -> None:
        # The flag as well as the cancel: a client library may turn a cancel that lands
        # mid-command into an ordinary error, which a round survives.
        self._stopping = True
        sending = dict(self._sending)
        tasks = [*self._tasks, *sending]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        for tag, did in sending.values():  # due again at once, for the next dispatcher
            try:
                await self.outbox.release(tag, did, time.time())
            except Exception:
                pass
        if self._http is not None:
            await self._http.aclose()

    async def _forever(self, round_, name: str, every: Optional[float] = None) -> None:
        groups_ready = False
        while not self._stopping:
            try:
                if not groups_ready:
                    await self._ensure_groups()
                    groups_ready = True
                worked = await round_()
            except asyncio.CancelledError:
                raise
            except ResponseError as e:
                if "NOGROUP" not in str(e):
                    log.exception("webhook %s round failed; retrying", name)
                groups_ready = False  # the stream was deleted (a flushed database): make it again
                worked = False
                await asyncio.sleep(1.0)
            except Exception:
                log.exception("webhook %s round failed; retrying", name)
                worked = False
                await asyncio.sleep(1.0)
            if every is not None:
                await asyncio.sleep(every)
            elif not worked:
                await asyncio.sleep(self.policy.poll_s)

    async def _ensure_groups(self) -> None:
        """The group (and so the stream) of every partition: from here on the
        workers' final-state scripts write completion records."""
        for tag in keys.all_tags():
            try:
                await self.redis.xgroup_create(keys.completion_events(tag), EVENTS_GROUP, id="0", mkstream=True)
            except ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise

    # -- records -> deliveries --------------------------------------------------
    async def _intake_round(self) -> bool:
        worked = False
        for tag in keys.all_tags():
            got = await self.redis.xreadgroup(EVENTS_GROUP, self.consumer, {keys.completion_events(tag): ">"},
                                              count=self.policy.read_count)
            for _, entries in got or []:
                for entry_id, fields in entries:
                    await self._route(tag, entry_id, fields)
                    worked = True
        return worked

    async def _route(self, tag: str, entry_id, fields: dict) -> None:
        ev = CompletionEvent.from_fields(fields)
        now = time.time()
        deliveries = []
        for event_type, subject in ev.webhook_events():
            payload = ev.payload(event_type, subject)
            body = json.dumps(payload, separators=(",", ":"))
            for ep in await self.endpoints.matching(ev.tenant, event_type):
                deliveries.append(Delivery(id=delivery_id(payload["id"], ep.id), endpoint=ep.id, url=ep.url,
                                           tenant=ev.tenant, type=event_type, event=payload["id"], body=body,
                                           created_at=now))
        await self.outbox.enqueue(tag, entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
                                  deliveries, due=now)

    async def _reclaim(self) -> None:
        """Records read by a gateway that died before handling them."""
        idle_ms = int(self.policy.claim_idle_s * 1000)
        for tag in keys.all_tags():
            stream, start = keys.completion_events(tag), "0-0"
            while True:
                res = await self.redis.xautoclaim(stream, EVENTS_GROUP, self.consumer, idle_ms, start_id=start,
                                                  count=self.policy.read_count)
                start, entries = res[0], res[1]
                deleted = res[2] if len(res) > 2 else []
                if deleted:  # pending ids whose record is gone (already handled): just ack
                    await self.redis.xack(stream, EVENTS_GROUP, *deleted)
                for entry_id, fields in entries:
                    if fields:
                        await self._route(tag, entry_id, fields)
                if start in (b"0-0", "0-0"):
                    break

    # -- sending -----------------------------------------------------------------
    async def _send_round(self) -> bool:
        free = self.policy.concurrency - len(self._sending)
        if free <= 0:
            await asyncio.wait(list(self._sending), return_when=asyncio.FIRST_COMPLETED)
            return True
        now, taken = time.time(), 0
        for tag in keys.all_tags():
            for did in await self.outbox.claim(tag, now, now + self.policy.lease_s, free - taken):
                task = asyncio.create_task(self._send(tag, did))
                self._sending[task] = (tag, did)
                task.add_done_callback(self._sending.pop)
                taken += 1
        return taken > 0

    async def _send(self, tag: str, did: str) -> None:
        d = await self.outbox.load(tag, did)
        if d is None:
            return  # settled by another dispatcher meanwhile
        ep = (await self.endpoints.all()).get(d.endpoint)
        attempts = d.attempts + 1
        status, error = None, ""
        if ep is None:
            error = "the endpoint no longer exists"
            attempts = self.policy.max_attempts
        else:
            body = d.body.encode()
            try:
                resp = await self._http.post(ep.url, content=body, headers=signed_headers(ep.secret, d.id, body))
                status = resp.status_code
                if not 200 <= status < 300:
                    error = f"HTTP {status}: {resp.text[:200]}"
            except httpx.TimeoutException:
                error = f"no answer within {self.policy.timeout_s:g}s"
            except httpx.HTTPError as e:
                error = f"{type(e).__name__}: {e}"[:300] or type(e).__name__
        now = time.time()
        if not error:
            outcome = "delivered"
        elif attempts >= self.policy.max_attempts or now - d.created_at >= self.policy.max_age_s:
            outcome = "dead"
        else:
            outcome = "retry"
        settled = await self.outbox.settle(tag, d, outcome, now=now, attempts=attempts, error=error, status=status,
                                           retry_at=now + self.policy.backoff(attempts))
        if settled and self.metrics is not None:
            self.metrics.webhook_deliveries.labels(outcome=outcome).inc()
        if outcome == "dead" and settled:
            log.warning("webhook %s to %s dead-lettered after %d attempts: %s", d.id, d.url, attempts, error)

    # -- housekeeping --------------------------------------------------------------
    async def _housekeeping_round(self) -> bool:
        now = time.monotonic()
        if now - self._last_reclaim >= min(5.0, self.policy.claim_idle_s):
            self._last_reclaim = now
            await self._reclaim()
        if now - self._last_sweep >= 30.0:
            self._last_sweep = now
            await batch_events.sweep(self.redis)
            await self._forget_dead_consumers()
        if self.metrics is not None:
            d = await self.outbox.depths()
            self.metrics.webhook_outbox.set(d["pending"])
            self.metrics.webhook_dead.set(d["dead"])
            self.metrics.webhook_backlog.set(d["backlog"])
        return True

    async def _forget_dead_consumers(self, idle_s: float = 3600.0) -> None:
        """Consumers of gateways long gone, holding nothing (their names are per process)."""
        for tag in keys.all_tags():
            stream = keys.completion_events(tag)
            for c in await self.redis.xinfo_consumers(stream, EVENTS_GROUP):
                name = c["name"].decode() if isinstance(c["name"], bytes) else c["name"]
                if name != self.consumer and int(c["pending"]) == 0 and int(c["idle"]) > idle_s * 1000:
                    await self.redis.xgroup_delconsumer(stream, EVENTS_GROUP, name)
