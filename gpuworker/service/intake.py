"""Intake thread: pulls job entries from the model's lanes into the engine.

Order of reading: entries handed back locally (reclaimed by the reaper, or to
retry after an engine fault), then this consumer's own pending entries (left
by a previous run under the same worker id), then new ones (``>``) in the
order gpuworker/service/lanes.py decides, never more than the free capacity
(plus, for interactive jobs, a small reserve the engine makes room for by
preempting batch jobs).
"""
from __future__ import annotations

import json
import queue
import re
import threading
import time
from collections import Counter
from typing import Optional

import redis
from pydantic import ValidationError

from inferq.schemas.text import as_str
from inferq.schemas import Usage, keys, transitions
from inferq.schemas.job import Job, job_payload
from inferq.schemas.queues import Lane
from inferq.schemas.redis_errors import REFUSING_WRITES, UNAVAILABLE

from inferq.gpuworker.engine.grammar import GrammarError
from inferq.gpuworker.service import migration, replies, token_jobs
from inferq.gpuworker.service.batch import Batch, retrying
from inferq.gpuworker.service.context import WorkerContext
from inferq.gpuworker.service.lanes import LaneReader
from inferq.gpuworker.service.messages import AddJob, Started
from inferq.gpuworker.service.prompts import PromptBuilder, PromptError
from inferq.gpuworker.service.state import InFlight, JobState

_ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def salvage_job_id(raw: Optional[str]) -> Optional[str]:
    """The id of a job whose payload failed validation, if one can be read, so
    its client still gets an ``error`` event."""
    try:
        jid = json.loads(raw).get("id") if raw else None
    except Exception:
        return None
    return jid if isinstance(jid, str) and _ID_RE.match(jid) else None


def describe(e: Exception) -> str:
    if isinstance(e, ValidationError):
        parts = []
        for err in e.errors()[:5]:
            loc = ".".join(str(x) for x in err.get("loc", ())) or "job"
            parts.append(f"{loc}: {err.get('msg')}")
        return "invalid job: " + "; ".join(parts)
    return f"invalid job: {e}"


class Intake(threading.Thread):
    def __init__(self, ctx: WorkerContext, r: redis.Redis, inflight: InFlight, prompts: PromptBuilder,
                 to_engine: "queue.Queue", to_publisher: "queue.Queue", metrics, log, block_ms: int,
                 stop: threading.Event, grammar=None, grammar_timeout_s: Optional[float] = None):
        super().__init__(name="inferq-intake", daemon=True)
        self.ctx, self.r, self.inflight, self.prompts = ctx, r, inflight, prompts
        self.to_engine, self.to_publisher, self.metrics, self.log = to_engine, to_publisher, metrics, log
        self.block_ms = block_ms
        self.stop = stop
        self.grammar = grammar  # GrammarCompiler for structured outputs (None: the worker has none)
        self.grammar_timeout_s = grammar_timeout_s
        self.local: "queue.Queue[tuple[Lane, str, dict, str]]" = queue.Queue()
        self.reader = LaneReader(ctx, r, log, self.ensure_group)
        self.error: Optional[BaseException] = None
        # Set once this consumer's own pending entries were re-read; until then
        # the reaper must not claim (its claims would be read twice).
        self.caught_up = threading.Event()

    # -- public --------------------------------------------------------------
    def requeue(self, lane: Lane, entries: list, suspect: str = "") -> None:
        """Entries of ``lane`` this consumer owns that should be (re)started here;
        ``suspect`` marks jobs retried after an engine fault (see EngineLoop)."""
        for entry_id, fields in entries:
            self.local.put((lane, entry_id, fields, suspect))

    def ensure_group(self, lane: Optional[Lane] = None) -> None:
        """The consumer group on a lane's stream (every lane when none is named)."""
        if lane is None:
            for ln in self.reader.refresh(force=True):
                self.ensure_group(ln)
            return
        try:
            self.r.xgroup_create(lane.stream, self.ctx.group, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    # -- loop ----------------------------------------------------------------
    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # surfaced by the worker, which then stops
            self.error = e
            self.log.exception("intake_crashed")

    def _give_up(self) -> bool:
        return self.stop.is_set()

    def _loop(self) -> None:
        retrying(self.ensure_group, give_up=self._give_up, log=self.log, what="xgroup_create")
        self._read_own_pending()
        self.caught_up.set()
        while not self.stop.is_set():
            self._drain_local()
            # The interactive room first: a worker full of batch jobs still takes an
            # interactive one at once (it blocks on the interactive lanes, not here).
            free = self.inflight.free()
            extra, running_by_tenant = self._interactive_room(free)
            if free <= 0 and extra <= 0:
                self.inflight.wait_free(0.2)
                continue
            try:
                got = self.reader.read(free, extra, running_by_tenant, self.block_ms)
            except REFUSING_WRITES as e:  # out of memory / read-only: take no new work until it passes
                self.log.warning("redis_refusing_writes_retrying", op="xreadgroup", error=str(e))
                self.stop.wait(0.5)
                continue
            # Before ResponseError: CLUSTERDOWN / TRYAGAIN / MOVED are ResponseErrors too.
            except UNAVAILABLE as e:
                self.log.warning("redis_unavailable_retrying", op="xreadgroup", error=str(e))
                self.stop.wait(0.5)
                continue
            except redis.ResponseError as e:
                if "NOGROUP" in str(e):  # stream or group deleted under us: recreate
                    self.ensure_group()
                    continue
                raise
            for lane, entries in got:
                self.admit(lane, entries)

    def _interactive_room(self, free: int) -> tuple[int, Counter]:
        """How many interactive jobs may come in past capacity (one per running
        batch job, up to the reserve: the engine preempts batch jobs for them),
        and the jobs running here per tenant (for the tenant cap)."""
        snap = self.inflight.snapshot()
        by_tenant = Counter(st.job.tenant or "" for st in snap)
        if not self.ctx.interactive_reserve:
            return 0, by_tenant
        batch = sum(1 for st in snap if st.job.priority_class != "interactive")
        over = max(0, len(snap) - self.inflight.capacity)
        return max(0, min(self.ctx.interactive_reserve, batch) - over), by_tenant

    def _read_own_pending(self) -> None:
        for lane in self.reader.refresh(force=True):
            last = "0"
            while not self.stop.is_set():
                free = self.inflight.wait_free(0.5)
                if free <= 0:
                    continue
                resp = retrying(
                    lambda: self.r.xreadgroup(self.ctx.group, self.ctx.consumer, {lane.stream: last}, count=free),
                    give_up=self._give_up, log=self.log, what="xreadgroup_pending")
                entries = resp[0][1] if resp else []
                if not entries:
                    break
                last = as_str(entries[-1][0])
                self.log.info("pending_reread", count=len(entries), stream=lane.stream)
                self.admit(lane, entries)

    def _drain_local(self) -> None:
        by_lane: dict[Lane, list] = {}
        flags = {}
        while True:
            try:
                lane, entry_id, fields, suspect = self.local.get_nowait()
            except queue.Empty:
                break
            by_lane.setdefault(lane, []).append((entry_id, fields))
            if suspect:
                flags[as_str(entry_id)] = suspect
        for lane, entries in by_lane.items():
            self.admit(lane, entries, flags)

    # -- admission -------------------------------------------------------------
    def admit(self, lane: Lane, entries: list, suspects: Optional[dict] = None) -> None:
        """Validate, count the attempt, and start each job (or finish/reject it)."""
        b = Batch()
        parsed: list[tuple[str, object, Job]] = []
        snap = self.inflight.snapshot()
        held = {st.entry_id for st in snap}
        running = {st.id for st in snap}
        for entry_id, fields in entries:
            entry_id = as_str(entry_id)
            if entry_id in held:
                continue  # already running here (read twice): one copy is enough
            if not fields:  # deleted from the stream while pending: nothing left to do
                b.xack(lane.stream, self.ctx.group, entry_id)
                continue
            raw_b = job_payload(fields)
            # ``raw`` is what the DLQ keeps: the payload's exact bytes.
            raw = raw_b if raw_b is not None else json.dumps({as_str(k): as_str(v) for k, v in fields.items()})
            text = as_str(raw)
            try:
                # Invalid UTF-8 or a missing field is a client error, not a crash.
                job = Job.from_fields(fields)
            except Exception as e:
                jid = salvage_job_id(text)
                if jid and not transitions.in_partition(lane.stream, jid):
                    jid = None  # its keys live on another slot: dead letter only
                self._reject(b, lane, entry_id, raw, jid, 1, "invalid_job", describe(e), claimed=False)
                continue
            if not transitions.in_partition(lane.stream, job.id):
                # Written past admission onto another partition's stream: its keys
                # could not be changed atomically with the entry.
                self._reject(b, lane, entry_id, raw, None, 1, "wrong_partition",
                             f"job {job.id!r} belongs to partition {keys.partition_of(job.id)} "
                             f"(INFERQ_PARTITIONS={keys.partitions()}), not to the stream {lane.stream!r}",
                             claimed=False)
                continue
            if job.id in running:
                # Another entry with this job id is running here: dead-letter this
                # copy without touching the running job's reply stream or status.
                self._reject(b, lane, entry_id, raw, None, 1, "duplicate_job_id",
                             f"job id {job.id!r} is already running on this worker", claimed=False)
                continue
            running.add(job.id)
            parsed.append((entry_id, raw, job))
        if not parsed:
            b.send(self.r, give_up=self._give_up, log=self.log)
            return

        # One round trip: claim an attempt of each job (fenced: only while the entry
        # is still this consumer's) and read its cancel flag.
        idx = [transitions.claim_attempt(b, stream=lane.stream, entry_id=entry_id, consumer=self.ctx.consumer,
                                         job_id=job.id, live_ttl=self.ctx.live_ttl) for entry_id, _, job in parsed]
        res = b.send(self.r, give_up=self._give_up, log=self.log)

        now = time.time()
        b = Batch()
        ready: list[JobState] = []
        for (entry_id, raw, job), i in zip(parsed, idx):
            if isinstance(res[i], Exception):
                raise res[i]
            attempt, cancelled = (int(x) for x in res[i])
            if attempt < 0:
                # Claimed by another worker between our read and this claim: theirs now.
                self.metrics.refused("claim")
                self.log.info("entry_taken_by_another_worker", entry_id=entry_id, job_id=job.id)
                continue
            st = JobState(job=job, entry_id=entry_id, raw=raw, attempt=attempt,
                          log=self.log.bind(job_id=job.id, attempt=attempt), received_at=now,
                          suspect=(suspects or {}).get(entry_id, ""), lane=lane)
            if attempt > 1:
                self.metrics.redeliveries.inc()
            if attempt > self.ctx.max_deliveries:
                self._reject(b, lane, entry_id, raw, job.id, attempt, "max_deliveries",
                             f"delivered {attempt - 1} times without finishing (max_deliveries={self.ctx.max_deliveries})")
                continue
            if job.model != self.ctx.model:
                self._reject(b, lane, entry_id, raw, job.id, attempt, "unknown_model",
                             f"this worker serves {self.ctx.model!r}, not {job.model!r}")
                continue
            if cancelled:
                st.cancel_requested = True
                self._finish_early(b, st, "abort")
                continue
            if job.deadline is not None and job.deadline <= now:
                self._finish_early(b, st, "deadline")
                continue
            if job.task in ("tokenize", "detokenize"):
                self._answer_tokens(b, st)
                continue
            try:
                st.prompt_ids = self.prompts.token_ids(job)
            except PromptError as e:
                self._reject(b, lane, entry_id, raw, job.id, attempt, e.code, str(e))
                continue
            except Exception as e:  # a tokenizer failure is this job's problem, not the worker's
                self._reject(b, lane, entry_id, raw, job.id, attempt, "invalid_prompt", f"tokenization failed: {e}")
                continue
            constraint = job.sampling.structured_outputs
            if constraint is not None:
                # Compiled here, off the step loop; a cache hit costs a copy.
                try:
                    st.matcher = self.grammar.matcher(constraint, timeout_s=self.grammar_timeout_s)
                except GrammarError as e:
                    self._reject(b, lane, entry_id, raw, job.id, attempt, "invalid_constraint", str(e))
                    continue
            ready.append(st)
            self.metrics.queue_time.observe(max(0.0, now - st.created))
            if self.ctx.log_prompts:
                st.log.info("job_started", prompt_tokens=len(st.prompt_ids), prompt=job.prompt or job.messages)
            else:
                st.log.info("job_started", prompt_tokens=len(st.prompt_ids), reclaimed=attempt > 1)
        b.send(self.r, give_up=self._give_up, log=self.log)
        for st in ready:
            if st.attempt > 1 and st.job.task == "generate":
                self._plan_continuation(st)
        if ready:
            # Queued to the publisher before the engine can produce a delta for them.
            self.to_publisher.put(Started(ready))
        for st in ready:
            self.inflight.add(st)
            self.to_engine.put(AddJob(st))

    def _plan_continuation(self, st: JobState) -> None:
        """A redelivered job continues from what its reply stream already holds
        (service/migration.py), when that can be continued exactly."""
        entries = retrying(lambda: self.r.xrange(st.reply_key), give_up=self._give_up, log=self.log,
                           what="xrange_reply")
        p = self.prompts
        st.continued = migration.plan(st, entries or [], p.tok, p.vocab_size, p.max_model_len, p.eos_token_ids)
        kept = 0 if st.continued is None else sum(len(c.token_ids) for c in st.continued.values())
        self.metrics.continued(kept)
        st.log.info("job_continues" if kept else "job_regenerates", continued_tokens=kept)

    def _reject(self, b: Batch, lane: Lane, entry_id: str, raw, job_id: Optional[str], attempt: int, code: str, message: str,
                *, claimed: bool = True) -> None:
        """Error event + dead letter. ``claimed`` False: refused before an attempt
        was claimed (unreadable payload, duplicate id), fenced on the entry alone."""
        self.metrics.error(code)
        self.log.warning("job_rejected", job_id=job_id, entry_id=entry_id, attempt=attempt, code=code, reason=message)
        replies.fail(b, self.ctx, lane=lane, entry_id=entry_id, raw=raw, job_id=job_id, attempt=attempt if claimed else 0,
                     event_attempt=attempt, seq=0, code=code, message=message)

    def _answer_tokens(self, b: Batch, st: JobState) -> None:
        """Tokenize / detokenize: answered here with the model's tokenizer (no engine
        step): one delta with the text or token ids, and ``done``."""
        try:
            text, ids = token_jobs.answer(st.job, self.prompts)
        except PromptError as e:
            self._reject(b, st.lane, st.entry_id, st.raw, st.id, st.attempt, e.code, str(e))
            return
        except Exception as e:  # a tokenizer failure is this job's problem, not the worker's
            self._reject(b, st.lane, st.entry_id, st.raw, st.id, st.attempt, "invalid_prompt", f"tokenization failed: {e}")
            return
        replies.start(b, self.ctx, st)
        replies.add_delta(b, self.ctx, st, text, ids, None)
        replies.finish(b, self.ctx, st, "stop", Usage(prompt_tokens=len(ids), completion_tokens=0),
                       max_model_len=self.prompts.max_model_len)
        self.metrics.finished("stop")
        st.log.info("job_finished", finish_reason="stop", task=st.job.task, tokens=len(ids))

    def _finish_early(self, b: Batch, st: JobState, reason: str) -> None:
        """Cancelled or past its deadline before prefill: done without the engine."""
        replies.start(b, self.ctx, st)
        replies.finish(b, self.ctx, st, reason, Usage(prompt_tokens=0, completion_tokens=0))
        self.metrics.finished(reason)
        st.log.info("job_finished", finish_reason=reason, before_prefill=True)
