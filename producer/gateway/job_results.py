"""Run a set of non-streamed jobs to their end (embeddings, tokenize): admit them
all, wait for every final event, and fail the whole request on the first error,
cancelling the jobs still queued or running."""
from __future__ import annotations

import asyncio

from fastapi import Request

from inferq.schemas import Job
from inferq.schemas.fold import Assembly
from inferq.producer.gateway.runner import Context, admit, cancel_shielded, raise_for_error, wait_for_result


async def results_of(ctx: Context, request: Request, jobs: list[Job], route: str) -> list[Assembly]:
    """One Assembly per job, in order; raises the first job's APIError (4xx/5xx)."""
    admitted: list[str] = []
    try:
        for job in jobs:  # in order: a full queue refuses the rest, and the admitted ones are cancelled
            admitted.append((await admit(ctx, job)).job_id)
    except BaseException:
        for job_id in admitted:
            await cancel_shielded(ctx, job_id)
        raise
    ctx.metrics.jobs_submitted.labels(route=route).inc(len(admitted))
    out: list = [None] * len(admitted)

    async def collect(i: int, job_id: str) -> None:
        asm = await wait_for_result(ctx, request, job_id)  # cancels its job if it ends early
        raise_for_error(asm, job_id)
        out[i] = asm

    # The first failure ends the others: their waits are cancelled, which cancels their jobs.
    tasks = [asyncio.ensure_future(collect(i, job_id)) for i, job_id in enumerate(admitted)]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return out
