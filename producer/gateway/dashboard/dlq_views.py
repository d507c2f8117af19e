"""The DLQ: a page of dead letters with their reasons, retry and delete
(producer/dlq.py, the same code `inferq dlq` runs: retry goes through the
admission script, so a refusal leaves the entry as it was)."""
from __future__ import annotations

import json
import re
from typing import Optional

import anyio
from fastapi import APIRouter, Depends, Query, Request

from inferq.schemas import keys
from inferq.schemas.connection import sync_client
from inferq.producer import dlq
from inferq.producer.admission import ADMISSION_LUA
from inferq.producer.gateway.dashboard.access import Viewer, operator
from inferq.producer.gateway.errors import APIError, bad_request
from inferq.producer.gateway.runner import ctx_of

router = APIRouter()

_ENTRY_ID = re.compile(r"^\d+-\d+$")


def _check(partition: int, dlq_id: str) -> None:
    if not 0 <= partition < keys.partitions():
        raise bad_request(f"partition must be between 0 and {keys.partitions() - 1}", param="partition")
    if not _ENTRY_ID.fullmatch(dlq_id):
        raise bad_request(f"a DLQ id looks like '1700000000000-0', not {dlq_id!r}", param="dlq_id")


def _sync(request: Request, fn):
    settings = ctx_of(request).backend.settings

    def run():
        r = sync_client(settings)
        try:
            return fn(r, settings)
        finally:
            r.close()

    return anyio.to_thread.run_sync(run)


@router.get("/dashboard/api/dlq")
async def dlq_page(request: Request, model: Optional[str] = None, cursor: Optional[str] = None,
                   limit: int = Query(50, ge=1, le=200), who: Viewer = Depends(operator)):
    """Dead letters oldest first; pass ``next_cursor`` back as ``cursor`` for the next page."""
    ctx = ctx_of(request)
    names = [model] if model else await ctx.backend.known_models(max_age_s=10.0)
    after = None
    if cursor:
        try:
            m, part, last = json.loads(cursor)
            after = (m, (int(part), last))
        except (ValueError, TypeError):
            raise bad_request("cursor is not one this endpoint returned", param="cursor") from None

    def read(r, _settings):
        rows, nxt = [], None
        started = after is None
        for m in names:
            if not started:
                if m != after[0]:
                    continue
                started = True
                page, more = dlq.page(r, m, limit - len(rows), after[1])
            else:
                page, more = dlq.page(r, m, limit - len(rows))
            rows += [{"model": m, **row, "job": _preview(row.get("job", ""))} for row in page]
            if more is not None:
                return rows, json.dumps([m, *more])
            if len(rows) >= limit:
                i = names.index(m)
                return rows, (json.dumps([names[i + 1], 0, None]) if i + 1 < len(names) else None)
        return rows, nxt

    rows, nxt = await _sync(request, read)
    return {"object": "list", "data": rows, "next_cursor": nxt}


def _preview(payload: str) -> dict:
    """What the page shows of the payload: the prompt's start, not the whole job."""
    try:
        job = json.loads(payload)
    except ValueError:
        return {"unreadable": True, "bytes": len(payload)}
    if not isinstance(job, dict):
        return {"unreadable": True, "bytes": len(payload)}
    if job.get("redacted"):
        return {"redacted": True, "bytes": job.get("bytes")}
    prompt = job.get("prompt") or json.dumps(job.get("messages") or job.get("prompt_token_ids") or "")
    return {"tenant": job.get("tenant"), "prompt": str(prompt)[:200]}


@router.post("/dashboard/api/dlq/{model}/{partition}/{dlq_id}/retry")
async def retry(model: str, partition: int, dlq_id: str, request: Request, who: Viewer = Depends(operator)):
    _check(partition, dlq_id)

    def run(r, settings):
        dead = dlq.entry(r, model, partition, dlq_id)
        if dead is None:
            return None
        script = r.register_script(ADMISSION_LUA)
        return dlq.requeue(r, script, settings, keys.dlq(model, partition), dlq_id, dead.to_fields())

    try:
        job_id = await _sync(request, run)
    except dlq.NotRequeued as e:
        raise APIError(409, f"DLQ entry {dlq_id} was not requeued: {e}", code="not_requeued") from None
    if job_id is None:
        raise APIError(404, f"DLQ entry {dlq_id} not found", code="dlq_entry_not_found")
    return {"object": "dashboard.dlq_retry", "dlq_id": dlq_id, "job_id": job_id, "requeued": True}


@router.delete("/dashboard/api/dlq/{model}/{partition}/{dlq_id}")
async def delete(model: str, partition: int, dlq_id: str, request: Request, who: Viewer = Depends(operator)):
    _check(partition, dlq_id)
    if not await _sync(request, lambda r, _s: dlq.delete(r, model, partition, dlq_id)):
        raise APIError(404, f"DLQ entry {dlq_id} not found", code="dlq_entry_not_found")
    return {"object": "dashboard.dlq_delete", "dlq_id": dlq_id, "deleted": True}
