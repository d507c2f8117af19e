"""The batch driver: asyncio tasks inside the gateway process that turn batch
input lines into jobs, follow their replies and write the output/error files.

Why in the gateway process: it already holds what a line needs (the request ->
job conversion, the Redis pool, the settings) and a batch is I/O-bound
bookkeeping, not compute. Why it survives restarts: nothing lives only in
memory. The batch record and the custom_id -> job id map are in Redis; the
results are appended to ``batch_<id>.output.partial`` / ``.errors.partial`` in
the files directory, and a line counts as done exactly when its result line is
there. A driver that starts (or restarts) re-reads the input, skips done lines,
follows the jobs it already enqueued and enqueues the rest with the custom_id as
idempotency key, so no line is enqueued twice. One gateway drives a batch at a
time (a lease in Redis); every gateway scans for batches whose lease lapsed, so
a batch left by a stopped gateway is picked up by the next one that runs.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Optional

import anyio

from inferq.schemas import keys
from inferq.schemas.job import new_job_id
from inferq.schemas.fold import Assembly, ReplyGap
from inferq.schemas.follower import Follow, afollow
from inferq.producer.errors import QueueFull, RateLimited
from inferq.producer.gateway.batch_lines import Line, error_line, output_line, parse_line
from inferq.producer.gateway.batch_store import ACTIVE, BatchStore
from inferq.producer.gateway.errors import APIError
from inferq.producer.gateway.files_store import FilesStore
from inferq.producer.gateway.runner import Context, raise_for_error

log = logging.getLogger("inferq.gateway.batch")

LEASE_S = 15
MAX_RESUBMITS = 3


class _Gone(Exception):
    """A line's reply stream no longer exists."""


def output_file_id(batch_id: str) -> str:
    return f"file-{batch_id.removeprefix('batch_')}-output"


def error_file_id(batch_id: str) -> str:
    return f"file-{batch_id.removeprefix('batch_')}-errors"


class _Results:
    """The two partial files of one batch: which lines are done, and appends."""

    def __init__(self, files: FilesStore, batch_id: str):
        self.out_path = files.scratch_path(f"batch_{batch_id}.output.partial")
        self.err_path = files.scratch_path(f"batch_{batch_id}.errors.partial")
        self.done: set[str] = set()
        self.completed = self.failed = 0
        self._lock = asyncio.Lock()
        for path, ok in ((self.out_path, True), (self.err_path, False)):
            for rec in _read_lines(path):
                self.done.add(rec["id"])
                if ok:
                    self.completed += 1
                elif not _not_run(rec):
                    self.failed += 1

    async def write(self, rec: dict, ok: bool) -> None:
        async with self._lock:
            if rec["id"] in self.done:
                return
            path = self.out_path if ok else self.err_path
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            self.done.add(rec["id"])
            if ok:
                self.completed += 1
            elif not _not_run(rec):
                self.failed += 1


_NOT_RUN = ("batch_cancelled", "batch_expired")


def _not_run(rec: dict) -> bool:
    """Lines a cancel or the expiry stopped: reported in the error file, not counted as failed."""
    return bool(rec.get("error")) and rec["error"].get("code") in _NOT_RUN


def _read_lines(path: Path) -> list[dict]:
    """Complete lines of a partial file; a torn last line (a crash mid-write) is cut off."""
    if not path.exists():
        return []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[:data.rfind(b"\n") + 1]
        with open(path, "r+b") as f:
            f.truncate(len(data))
    return [json.loads(x) for x in data.splitlines() if x.strip()]


class BatchRun:
    """Drives one batch from wherever it stands to a final status."""

    def __init__(self, ctx: Context, files: FilesStore, store: BatchStore, batch_id: str, owner: str):
        self.ctx, self.files, self.store, self.id, self.owner = ctx, files, store, batch_id, owner
        self.results = _Results(files, batch_id)
        self.stop_reason: Optional[str] = None  # "cancelled" | "expired"
        self.inflight: dict[str, str] = {}  # request id -> job id

    async def run(self) -> None:
        batch = await self.store.get(self.id)
        if batch is None or batch["status"] not in ACTIVE:
            return
        # From the start: keeps the lease while a large file is validated, and sees a cancel.
        self._main = asyncio.current_task()
        watcher = asyncio.create_task(self._watch())
        try:
            lines = await self._parse(batch)
            if lines is None:
                return  # the batch failed validation
            await self._save_counts(len(lines))
            moved = await self.store.transition(self.id, ("validating",), "in_progress")
            if moved is None or moved not in ACTIVE:
                return
            if moved == "cancelling":
                self.stop_reason = "cancelled"
            await self._drive(batch, lines)
        finally:
            watcher.cancel()
        await self._finish(lines)

    # -- validating -----------------------------------------------------------
    async def _parse(self, batch: dict) -> Optional[list[Line]]:
        meta = self.files.get(batch["input_file_id"])
        if meta is None:
            await self._fail(batch, "input_file_missing", f"input file {batch['input_file_id']} no longer exists")
            return None
        raw_lines = await anyio.to_thread.run_sync(self.files.data_path(meta["id"]).read_bytes)
        raw_lines = [x for x in raw_lines.splitlines() if x.strip()]
        if not raw_lines:
            await self._fail(batch, "empty_file", "the input file has no requests")
            return None
        limit = self.ctx.settings.batch_max_lines
        if len(raw_lines) > limit:
            await self._fail(batch, "too_many_requests",
                             f"the input file has {len(raw_lines)} requests; a batch takes at most {limit}")
            return None
        seen: set[str] = set()
        lines = []
        for n, raw in enumerate(raw_lines, start=1):
            if n % 200 == 0:
                await asyncio.sleep(0)  # a large file must not hold up the gateway's other requests
            line = await parse_line(self.ctx, batch, n, raw, seen)
            if line.error is not None and line.request_id not in self.results.done:
                await self.results.write(error_line(line, line.error), ok=False)
            lines.append(line)
        return lines

    async def _fail(self, batch: dict, code: str, message: str) -> None:
        errors = {"object": "list", "data": [{"code": code, "message": message, "param": None, "line": None}]}
        await self.store.transition(self.id, ("validating",), "failed", errors=errors)

    # -- in_progress ----------------------------------------------------------
    async def _drive(self, batch: dict, lines: list[Line]) -> None:
        jobs = await self.store.job_map(self.id)
        todo = [ln for ln in lines if ln.prepared is not None and ln.request_id not in self.results.done]
        limit = self.ctx.settings.batch_max_in_flight
        running: set[asyncio.Task] = set()
        try:
            for line in todo:
                while len(running) >= limit and self.stop_reason is None:
                    done, running = await asyncio.wait(running, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                    _reraise(done)
                if self.stop_reason is not None:
                    break
                job_id = jobs.get(line.custom_id) or await self._submit(line)
                if job_id is None:
                    break  # stopped while waiting for room in the queue
                self.inflight[line.request_id] = job_id
                running.add(asyncio.create_task(self._follow(line, job_id)))
            while running:
                if self.stop_reason is not None:
                    await self._cancel_inflight()
                done, running = await asyncio.wait(running, timeout=1.0)
                _reraise(done)
                if self.stop_reason == "cancelled" and running and self._grace_over():
                    break  # no worker took the cancel in time: give up on those lines
        finally:
            for t in running:
                t.cancel()

    async def _submit(self, line: Line, resubmit: int = 0) -> Optional[str]:
        """Enqueue a line (custom_id as idempotency key scoped to the batch); waits out
        QueueFull / RateLimited with backoff. None if the batch stops meanwhile.
        ``resubmit`` > 0: the line's earlier job left no result (its reply stream
        expired while no gateway was following it): run it again as a new job."""
        job, key = line.prepared.job, f"batch/{self.id}/{line.custom_id}"
        if resubmit:
            job, key = job.model_copy(update={"id": new_job_id()}), f"{key}#{resubmit}"
        delay = 0.2
        while self.stop_reason is None:
            try:
                admitted = await self.ctx.backend.submit(job, key)
            except RateLimited as e:
                await asyncio.sleep(min(max(e.retry_after, 0.05), 10.0))
                continue
            except QueueFull:  # includes QueueUnavailable (Redis refusing writes)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            await self.store.record_job(self.id, line.custom_id, admitted.job_id)
            self.ctx.metrics.jobs_submitted.labels(route="batch").inc()
            return admitted.job_id
        return None

    async def _follow(self, line: Line, job_id: Optional[str]) -> None:
        asm = Assembly()
        for resubmit in range(1, MAX_RESUBMITS + 1):
            asm = Assembly()
            plan = Follow(job_id, block_ms=1000, missing=_Gone, reconnect_timeout=300.0)
            try:
                async for _, event in afollow(self.ctx.backend.redis, keys.reply(job_id), plan):
                    asm.feed(event)
                    if asm.finished:
                        break
                break
            except (_Gone, ReplyGap):  # expired, or events lost (a trimmed stream): output untrustworthy
                if self.stop_reason is not None:
                    break
                log.warning("batch %s: line %s lost its result (job %s); running it again", self.id,
                            line.number, job_id)
                new_id = await self._submit(line, resubmit)
                if new_id is None:
                    break
                self.inflight[line.request_id] = job_id = new_id
        await self._record(line, job_id, asm)
        self.inflight.pop(line.request_id, None)
        await self._save_counts()

    async def _record(self, line: Line, job_id: str, asm: Assembly) -> None:
        if not asm.finished and self.stop_reason is not None:
            await self.results.write(error_line(line, _stopped(self.stop_reason)), ok=False)
        elif not asm.finished:
            err = APIError(500, f"the job's result was lost {MAX_RESUBMITS} times", code="result_lost")
            await self.results.write(error_line(line, err, job_id), ok=False)
        elif asm.error_code is not None:
            try:
                raise_for_error(asm, job_id)
            except APIError as err:
                await self.results.write(error_line(line, err, job_id), ok=False)
        elif asm.finish_reason in ("abort", "deadline") and (self.stop_reason or asm.finish_reason == "deadline"):
            reason = self.stop_reason or "expired"
            await self.results.write(error_line(line, _stopped(reason)), ok=False)
        else:
            await self.results.write(output_line(line, job_id, line.prepared.body(job_id, asm)), ok=True)

    async def _cancel_inflight(self) -> None:
        for job_id in list(self.inflight.values()):
            await self.ctx.backend.cancel(job_id)

    def _grace_over(self) -> bool:
        if not hasattr(self, "_stop_at"):
            self._stop_at = time.monotonic()
        return time.monotonic() - self._stop_at > self.ctx.settings.batch_cancel_grace_s

    async def _watch(self) -> None:
        """Notice a cancel or the expiry (read from the record each time); keep the driver lease."""
        while True:
            if not await self.store.acquire(self.id, self.owner, LEASE_S):
                # Another gateway took over (this one stalled past the lease): two drivers
                # must never append to the same files, so this one stops at once.
                log.warning("batch %s: lost the driver lease; leaving the batch to its new driver", self.id)
                self._main.cancel()
                return
            rec = await self.store.get(self.id)
            if rec is None:
                self.stop_reason = "cancelled"
            elif rec["status"] == "cancelling":
                self.stop_reason = "cancelled"
            elif time.time() >= float(rec.get("expires_at") or "inf"):
                self.stop_reason = "expired"
            if self.stop_reason:
                await self._cancel_inflight()
            await asyncio.sleep(0.25)

    async def _save_counts(self, total: Optional[int] = None) -> None:
        fields = {"completed": self.results.completed, "failed": self.results.failed}
        if total is not None:
            fields["total"] = total
        await self.store.update(self.id, **fields)

    # -- finalizing -----------------------------------------------------------
    async def _finish(self, lines: list[Line]) -> None:
        # Lines a cancel or the expiry kept from running go to the error file too.
        if self.stop_reason is not None:
            for line in lines:
                if line.request_id not in self.results.done:
                    await self.results.write(error_line(line, _stopped(self.stop_reason)), ok=False)
        await self._save_counts()
        found = await self.store.transition(self.id, ("in_progress",), "finalizing")
        if found is None:
            return
        if found == "in_progress" and self.stop_reason == "expired":
            found = "expired"
        final = {"in_progress": "completed", "finalizing": "completed", "cancelling": "cancelled",
                 "expired": "expired"}.get(found)
        if final is None:
            return
        tenant = (await self.store.get(self.id) or {}).get("tenant") or None
        fields = {"output_file_id": output_file_id(self.id)}
        self.files.adopt(self.results.out_path, fields["output_file_id"], f"batch_{self.id}_output.jsonl",
                         "batch_output", tenant)
        if self.results.err_path.exists() and self.results.err_path.stat().st_size:
            fields["error_file_id"] = error_file_id(self.id)
            self.files.adopt(self.results.err_path, fields["error_file_id"], f"batch_{self.id}_error.jsonl",
                             "batch_output", tenant)
        await self.store.transition(self.id, ("finalizing", "cancelling", "in_progress"), final, **fields)
        log.info("batch %s %s: %d completed, %d failed", self.id, final, self.results.completed, self.results.failed)


def _reraise(done) -> None:
    """A line whose follower failed is not done: fail the run (a later scan resumes it)."""
    for t in done:
        if not t.cancelled() and t.exception() is not None:
            raise t.exception()


def _stopped(reason: str) -> APIError:
    if reason == "expired":
        return APIError(400, "the batch expired before this request ran", code="batch_expired")
    return APIError(400, "the batch was cancelled before this request finished", code="batch_cancelled")


class BatchManager:
    """Starts a BatchRun for every active batch this gateway holds the lease of;
    scans for unowned ones (a restarted gateway, or one that went away) and
    applies the files/batches retention."""

    def __init__(self, ctx: Context, files: FilesStore, store: BatchStore):
        self.ctx, self.files, self.store = ctx, files, store
        self.owner = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.runs: dict[str, asyncio.Task] = {}
        self._scanner: Optional[asyncio.Task] = None
        self._last_sweep = 0.0

    def start(self) -> None:
        self._scanner = asyncio.create_task(self._scan_loop())

    async def stop(self) -> None:
        tasks = [t for t in (self._scanner, *self.runs.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for batch_id in list(self.runs):
            try:
                await self.store.release(batch_id, self.owner)
            except Exception:
                pass
        self.runs.clear()

    async def kick(self, batch_id: str) -> None:
        """Drive ``batch_id`` now if no one else does."""
        if batch_id in self.runs or not await self.store.acquire(batch_id, self.owner, LEASE_S):
            return
        self.runs[batch_id] = asyncio.create_task(self._run(batch_id))

    async def _run(self, batch_id: str) -> None:
        try:
            await BatchRun(self.ctx, self.files, self.store, batch_id, self.owner).run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("batch %s: driver failed; another scan will resume it", batch_id)
        finally:
            self.runs.pop(batch_id, None)
            await self.store.release(batch_id, self.owner)

    async def _scan_loop(self) -> None:
        while True:
            try:
                for batch_id in await self.store.ids(newest_first=False):
                    if batch_id in self.runs:
                        continue
                    rec = await self.store.get(batch_id)
                    if rec is not None and rec["status"] in ACTIVE:
                        await self.kick(batch_id)
                await self._sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("batch scan failed")
            await asyncio.sleep(self.ctx.settings.batch_scan_s)

    async def _sweep(self) -> None:
        """Retention: files and finished batches older than files_retention_days."""
        days = self.ctx.settings.files_retention_days
        if not days or time.monotonic() - self._last_sweep < 60:
            return
        self._last_sweep = time.monotonic()
        max_age = days * 86_400
        await anyio.to_thread.run_sync(self.files.expire, max_age)
        cutoff = time.time() - max_age
        for batch_id in await self.store.ids(newest_first=False):
            rec = await self.store.get(batch_id)
            if rec is None:
                await self.store.delete(batch_id)
            elif int(rec.get("created_at") or 0) < cutoff and rec["status"] not in ACTIVE:
                await self.store.delete(batch_id)
