"""The engine thread: the only code that touches the engine (it is not
thread-safe). Commands arrive on a queue; each step's deltas go to the
publisher, which writes them while the next step runs.

Engine faults (an exception inside step) abort every job in the engine. The
worker cannot tell which job caused one, so the jobs come back as suspects and
are put on probation one at a time (other new jobs wait): a fault while a
suspect is on probation blames that suspect, which from then on is probed
alone. Jobs that merely shared a step with a bad job therefore lose at most a
couple of attempts, and the bad one reaches --max-deliveries on its own."""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Callable, Optional

from inferq.schemas import keys

from inferq.gpuworker.engine.outputs import RequestDelta
from inferq.gpuworker.service.choices import ChoiceGroup, choice_params, choice_request_id
from inferq.gpuworker.service.embed_jobs import pooling_of
from inferq.gpuworker.service.messages import AbortJob, AddJob, Dropped, DropJob, Failed, Rejected, StepOutput
from inferq.gpuworker.service.state import InFlight, JobState


# Job priorities span -1000..1000; each class lies wholly after the one before,
# so the engine's priority policy runs (and preempts for) interactive jobs first.
CLASS_STRIDE = 10_000


def engine_priority(job) -> int:
    rank = keys.CLASSES.index(job.priority_class) if job.priority_class in keys.CLASSES else len(keys.CLASSES)
    return rank * CLASS_STRIDE + job.priority


class EngineLoop(threading.Thread):
    def __init__(self, engine, commands: "queue.Queue", to_publisher: "queue.Queue", inflight: InFlight, metrics, log,
                 rebuild: Optional[Callable[[], object]] = None, check_invariants: bool = False,
                 step_pace_s: float = 0.0):
        super().__init__(name="inferq-engine", daemon=True)
        self.engine = engine
        self.commands = commands
        self.out = to_publisher
        self.inflight = inflight
        self.metrics = metrics
        self.log = log
        self.rebuild = rebuild
        self.drain_until: Optional[float] = None  # set by the worker on shutdown
        # time.monotonic() at the top of the latest iteration: GET /health (service/health.py).
        self.last_beat: Optional[float] = None
        self.error: Optional[BaseException] = None
        # Job id -> its engine requests (one per choice, see service/choices.py).
        self._in_engine: dict[str, ChoiceGroup] = {}
        self._probation: deque = deque()  # suspects waiting for their probe
        self._probing: Optional[JobState] = None
        self._held: deque = deque()  # new jobs waiting for the probes to end
        # Debug/test aid: verify the block pool after every abort and whenever idle.
        self.check_invariants = check_invariants
        # Test aid (WorkerSettings.step_pace_s): a fixed sleep per step, so a test's
        # timing does not depend on how fast the machine runs the engine.
        self.step_pace_s = step_pace_s

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:
            self.error = e
            self.log.exception("engine_loop_crashed")

    def _loop(self) -> None:
        while True:
            self.last_beat = time.monotonic()
            busy = self.engine.has_unfinished() or bool(self._probation) or bool(self._held)
            self._drain_commands(block=not busy)
            if self.drain_until is not None:
                idle = not (self.engine.has_unfinished() or self._probation or self._held)
                if idle and self.commands.empty():
                    return
                if time.monotonic() >= self.drain_until:
                    self._drop_all()
                    return
            self._advance_probation()
            if self.engine.has_unfinished():
                self._step()

    def _drain_commands(self, block: bool) -> None:
        try:
            cmd = self.commands.get(timeout=0.05) if block else self.commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(cmd)
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, cmd) -> None:
        {AddJob: self._on_add, AbortJob: self._on_abort, DropJob: self._on_drop}[type(cmd)](cmd)

    def _on_add(self, cmd: AddJob) -> None:
        st = cmd.st
        if st.is_dropped:
            return
        if st.suspect:
            self._probation.append(st)
        elif self._probation or self._probing is not None:
            self._held.append(st)
        else:
            self._add(st)

    def _on_abort(self, cmd: AbortJob) -> None:
        job_id, reason = cmd.job_id, cmd.reason
        if job_id in self._in_engine:
            deltas = self._abort_group(job_id, reason)
            if deltas:
                self.out.put(StepOutput(deltas, self.engine.stats(), time.time(), 0.0))
            self._verify("abort")
        elif self._unqueue(job_id) is not None:  # still waiting: finish it without the engine
            self.out.put(StepOutput([RequestDelta(job_id, [], "", finished=True, finish_reason=reason)],
                                    self.engine.stats(), time.time(), 0.0))

    def _on_drop(self, cmd: DropJob) -> None:
        job_id = cmd.job_id
        if job_id in self._in_engine:
            self._abort_group(job_id)
        self._unqueue(job_id)
        self.out.put(Dropped([job_id]))

    def _unqueue(self, job_id: str) -> Optional[JobState]:
        for q in (self._probation, self._held):
            for st in q:
                if st.id == job_id:
                    q.remove(st)
                    return st
        return None

    def _abort_group(self, job_id: str, reason: str = "abort") -> list:
        """Abort every choice of a job; the job-level deltas that say so."""
        g = self._in_engine.get(job_id)
        if g is None:
            return []
        out = []
        for rid in sorted(g.live):
            d = self.engine.abort(rid, reason=reason)
            g.live.discard(rid)
            if d is not None:
                out += g.translate(d)
        out += g.end_waiting(reason)
        self._in_engine.pop(job_id, None)
        return out

    def _add(self, st: JobState) -> bool:
        if st.id in self._in_engine:  # the same job handed to us again: restart it (every choice)
            self._abort_group(st.id)
        g = ChoiceGroup.of(st.id, st.job.sampling)
        self._in_engine[st.id] = g
        if st.continued and g.keep_ended(st.continued):
            # Choice 0 had already ended (migration): the others need not wait for its prompt.
            waiting, g.waiting = g.waiting, []
            return all(self._add_choice(st, g, i) for i in waiting)
        return self._add_choice(st, g, 0)

    def _add_choice(self, st: JobState, g: ChoiceGroup, index: int) -> bool:
        job = st.job
        rid = choice_request_id(st.id, index)
        cont = (st.continued or {}).get(index)
        try:
            self.engine.add_request(rid, st.prompt_ids, choice_params(job.sampling, index),
                                    priority=engine_priority(job), deadline=job.deadline, arrival_time=st.created,
                                    matcher=None if st.matcher is None else st.matcher.deep_copy(),
                                    continue_token_ids=() if cont is None else cont.token_ids,
                                    pooling=pooling_of(job))
        except ValueError as e:
            self._abort_group(st.id)
            self.out.put(Rejected(st, "invalid_request", str(e)))
            return False
        g.live.add(rid)
        return True

    def _add_siblings(self, progressed: set[str]) -> None:
        """Choices 1..n-1 (1..best_of-1) join once choice 0 has a token: its prompt's
        full blocks are computed and cached by then, so they share them (prefix cache).
        ``progressed``: job ids whose choice 0 got a token or ended this step."""
        for job_id in progressed:
            g = self._in_engine.get(job_id)
            if g is None or not g.waiting:
                continue
            st = self.inflight.get(g.job_id)
            waiting, g.waiting = g.waiting, []
            for i in waiting:
                if st is None or not self._add_choice(st, g, i):
                    break

    def _advance_probation(self) -> None:
        """Start the next probe, or let held jobs in once probation is over."""
        if self._probing is not None and self._probing.id not in self._in_engine:
            self._probing = None  # cancelled, dropped or finished
        while self._probing is None and self._probation:
            st = self._probation[0]
            if st.suspect == "culprit" and self.engine.has_unfinished():
                return  # a job blamed before runs alone
            self._probation.popleft()
            if not st.is_dropped and self._add(st):
                self._probing = st
        if self._probing is None and not self._probation:
            while self._held:
                st = self._held.popleft()
                if not st.is_dropped:
                    self._add(st)

    def _step(self) -> None:
        t0 = time.perf_counter()
        try:
            deltas = self.engine.step()
        except Exception as e:  # a job must never take the worker down
            self._on_fault(e)
            return
        dt = time.perf_counter() - t0
        # Jobs whose choice 0 (it runs under the job id; siblings have a "#<i>" suffix) got a
        # token or ended, read from the engine's deltas: a best_of job publishes none until its end.
        in_engine = self._in_engine
        progressed = {d.request_id for d in deltas if (d.new_token_ids or d.finished) and d.request_id in in_engine}
        deltas = self._to_job_deltas(deltas)
        self._add_siblings(progressed)
        p = self._probing
        if p is not None and (p.id not in self._in_engine or p.id in progressed):
            self._probing = None  # it produced a token (or ended): probation passed
        self.out.put(StepOutput(deltas, self.engine.stats(), time.time(), dt))
        if self.step_pace_s:
            time.sleep(self.step_pace_s)
        if not self.engine.has_unfinished():
            self._verify("idle")

    def _to_job_deltas(self, deltas: list) -> list:
        out = []
        for d in deltas:
            job_id = d.request_id.rsplit("#", 1)[0] if d.request_id not in self._in_engine else d.request_id
            g = self._in_engine.get(job_id)
            if g is None:
                out.append(d)
                continue
            for jd in g.translate(d):
                if jd.finished:
                    self._in_engine.pop(job_id, None)
                out.append(jd)
        return out

    def _verify(self, when: str) -> None:
        if not self.check_invariants:
            return
        try:
            self.engine.check_invariants()
        except AssertionError as e:
            self.metrics.invariant_failures.inc()
            self.log.error("engine_invariant_failed", when=when, error=str(e))

    def _on_fault(self, e: Exception) -> None:
        ids = list(self._in_engine)
        self.log.error("engine_step_failed", error=repr(e), jobs=len(ids), exc_info=True)
        for g in self._in_engine.values():
            for rid in g.live:
                try:
                    self.engine.abort(rid)
                except Exception:
                    pass
        self._in_engine.clear()
        try:
            self.engine.check_invariants()
        except Exception as inv:
            if self.rebuild is None:
                raise
            self.log.error("engine_rebuild", reason=repr(inv))
            self.engine = self.rebuild()
        culprit = self._probing.id if self._probing is not None and self._probing.id in ids else None
        self._probing = None
        states = [st for st in (self.inflight.get(rid) for rid in ids) if st is not None]
        self.out.put(Failed(states, f"{type(e).__name__}: {e}", culprit))

    def _drop_all(self) -> None:
        ids = list(self._in_engine)
        for job_id in ids:
            self._abort_group(job_id)
        self._in_engine.clear()
        ids += [st.id for st in list(self._probation) + list(self._held)]
        self._probation.clear()
        self._held.clear()
        self._probing = None
        # Commands still queued (jobs admitted during the drain) are dropped too.
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(cmd, AddJob):
                ids.append(cmd.st.id)
        if ids:
            self.log.warning("drain_timeout_left_pending", jobs=len(ids))
            self.out.put(Dropped(ids, handback=True))
