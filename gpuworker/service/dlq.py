"""The dead-letter stream ``inferq:dlq:{model}``.

Each entry holds: ``job`` (the job JSON exactly as it was on the job stream),
``job_id`` (may be empty for unparseable payloads), ``entry_id`` (its id on
the job stream), ``code`` and ``reason`` (why it failed), ``attempts``,
``worker`` and ``failed_at`` (unix seconds). It is copied first and the job
entry acked and deleted after, in one MULTI, so a crash loses nothing.
"""
from __future__ import annotations

import time

from gpuworker.service.batch import Batch
from gpuworker.service.context import WorkerContext

DLQ_FIELDS = ("job", "job_id", "entry_id", "code", "reason", "attempts", "worker", "failed_at")


def dead_letter(b: Batch, ctx: WorkerContext, *, entry_id: str, raw, job_id: str, code: str,
                reason: str, attempts: int) -> None:
    b.xadd(ctx.dlq, {
        "job": raw,
        "job_id": job_id or "",
        "entry_id": entry_id,
        "code": code,
        "reason": reason,
        "attempts": str(attempts),
        "worker": ctx.consumer,
        "failed_at": repr(time.time()),
    })
    b.xack(ctx.stream, ctx.group, entry_id)
    b.xdel(ctx.stream, entry_id)
