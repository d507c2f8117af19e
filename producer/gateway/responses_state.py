"""A stored response's current object, from durable records only (its spec, the
job's reply stream and job-info hash, the cancel flag), and the saving of final
objects before the reply streams expire. Any gateway process gives the same answer,
before or after a restart, and while the job is redelivered to another worker."""
from __future__ import annotations

import asyncio
import logging
from typing import Optional

from inferq.schemas import keys, records
from inferq.schemas.text import as_str
from inferq.producer.gateway.auth import can_access
from inferq.producer.gateway.config import Principal
from inferq.producer.gateway.errors import APIError, bad_request
from inferq.producer.gateway.responses_format import Outcome, folded_body, response_body
from inferq.producer.gateway.responses_input import items_to_messages
from inferq.producer.gateway.responses_spec import job_id_of
from inferq.producer.gateway.responses_store import ResponseStore, Stored
from inferq.producer.gateway.runner import Context

log = logging.getLogger(__name__)


def not_found(resp_id: str) -> APIError:
    return APIError(404, f"No response found with id '{resp_id}'.", code="response_not_found")


class ResponsesService:
    def __init__(self, ctx: Context, store: ResponseStore, save_every_s: float = 2.0):
        self.ctx = ctx
        self.store = store
        self.save_every_s = save_every_s
        self._task: Optional[asyncio.Task] = None

    async def load(self, resp_id: str, principal: Principal) -> Stored:
        """The stored response, or 404 (also for another tenant's: no leaking ids)."""
        job_id = job_id_of(resp_id)
        stored = await self.store.load(job_id) if job_id else None
        if stored is None or not can_access(principal, stored.spec.tenant):
            raise not_found(resp_id)
        return stored

    async def body(self, stored: Stored) -> dict:
        """The response object now; an ended one is saved for good."""
        if stored.final is not None:
            return stored.final
        spec, backend = stored.spec, self.ctx.backend
        info = await backend.info(spec.job_id)
        if info is None:  # neither job record nor reply stream: they expired before the final was saved
            body = response_body(spec, Outcome("failed", error={
                "code": "response_expired", "message": "the job's records expired before its output was saved"}),
                [], None)
            await self.store.save_final(spec.job_id, body)
            return body
        asm = await backend.history(spec.job_id)
        cancel_requested = bool(await backend.redis.exists(keys.cancel(spec.job_id)))
        body = folded_body(spec, asm, info, cancel_requested)
        if asm.finished:
            await self.store.save_final(spec.job_id, body)
        return body

    async def conversation_after(self, resp_id: str, principal: Principal) -> list[dict]:
        """What a response continuing ``resp_id`` starts from: that response's
        conversation and its output (instructions are not inherited)."""
        try:
            stored = await self.load(resp_id, principal)
        except APIError:
            raise bad_request(f"Previous response with id '{resp_id}' not found (responses created with store: false "
                              "cannot be continued).", param="previous_response_id") from None
        body = await self.body(stored)
        if body["status"] not in ("completed", "incomplete"):
            raise bad_request(f"Previous response '{resp_id}' is {body['status']}; only a completed (or incomplete) "
                              "response can be continued.", param="previous_response_id")
        return stored.spec.conversation + items_to_messages(body["output"], stored.spec.conversation)

    # -- saving finals of ended jobs, whoever created them ------------------------------
    async def save_finals_once(self) -> None:
        """Save the final objects of ended jobs; a running job costs one HGET."""
        ids = await self.store.unsaved()
        if not ids:
            return
        async with self.ctx.backend.redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.hget(keys.job_info(job_id), records.STATUS)
            statuses = await pipe.execute()
        for job_id, status in zip(ids, statuses):
            if status is not None and as_str(status) not in records.FINAL_STATUSES:
                continue  # still running (its record gone too: body() says so)
            stored = await self.store.load(job_id)
            if stored is None:  # deleted or expired: nothing to save
                await self.store.forget_unsaved(job_id)
            else:
                await self.body(stored)

    async def _run(self) -> None:
        while True:
            try:
                await self.save_finals_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # Redis away for a moment: try again next round
                log.warning("saving ended responses failed: %s", e)
            await asyncio.sleep(self.save_every_s)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
