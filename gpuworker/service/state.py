"""What the worker knows about each job it holds, shared by its threads.

A held job's lifecycle is one ``Phase``, changed only through JobState's
methods (each a compare-and-set, so two threads cannot both win):

  ACTIVE     set by the intake when it starts the job
  FINISHING  by the publisher, when it writes the job's final pipeline
             (done, error, DLQ, or the end of an attempt that will be retried)
  DROPPED    by the lease keeper (the lease was lost: another worker owns it)
             or the publisher (the drain gave up on it); nothing more is written

``cancel_requested`` is not a phase: it records that the client asked to
cancel (seen by the intake or the publisher) so the job's status says
``cancelled`` rather than a plain abort.
"""
from __future__ import annotations

import enum
import functools
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from inferq.schemas import keys
from inferq.schemas.job import Job
from inferq.schemas.queues import Lane

_phase_lock = threading.Lock()  # transitions are rare: one lock for all jobs is enough


class Phase(enum.Enum):
    ACTIVE = "active"
    FINISHING = "finishing"
    DROPPED = "dropped"


@dataclass
class JobState:
    job: Job
    entry_id: str
    raw: Union[bytes, str]  # the job field as read, copied verbatim into the DLQ
    attempt: int
    log: Any
    prompt_ids: list[int] = field(default_factory=list)
    seq: int = 0
    received_at: float = field(default_factory=time.time)
    first_token_at: Optional[float] = None
    last_token_at: Optional[float] = None
    cancel_requested: bool = False
    phase: Phase = Phase.ACTIVE
    # After an engine fault: "suspect" (was in the failing step), "culprit" (the
    # step failed while it was the job on probation); "" otherwise.
    suspect: str = ""
    # The stream (lane) the job's entry is on: every fenced change names it.
    lane: Optional[Lane] = None
    # Structured outputs: the job's compiled matcher in its start state (the engine
    # gets a copy on every add, so a restart after an engine fault starts clean).
    matcher: Any = None
    # Request migration (service/migration.py): per choice index, the output earlier
    # attempts published that this attempt continues from; None: it starts over.
    continued: Optional[dict] = None

    def __post_init__(self) -> None:
        if self.lane is None:
            self.lane = Lane(self.job.model)

    @property
    def id(self) -> str:
        return self.job.id

    # Written or read every engine step (deltas, the cancel check): named once.
    @functools.cached_property
    def reply_key(self) -> str:
        return keys.reply(self.id)

    @functools.cached_property
    def cancel_key(self) -> str:
        return keys.cancel(self.id)

    @property
    def created(self) -> float:
        """Submit time, trusted only if it is sane (payloads can be hand-made)."""
        c = self.job.created_at
        return c if math.isfinite(c) and c <= self.received_at + 60 else self.received_at

    @property
    def is_active(self) -> bool:
        return self.phase is Phase.ACTIVE

    @property
    def is_dropped(self) -> bool:
        return self.phase is Phase.DROPPED

    def begin_finish(self) -> bool:
        """ACTIVE -> FINISHING (publisher). False if it already left ACTIVE."""
        return self._move(Phase.FINISHING)

    def drop(self) -> bool:
        """ACTIVE -> DROPPED (lease keeper, publisher). False if it already left ACTIVE."""
        return self._move(Phase.DROPPED)

    def _move(self, to: Phase) -> bool:
        with _phase_lock:
            if self.phase is not Phase.ACTIVE:
                return False
            self.phase = to
            return True

    def next_seq(self) -> int:
        s = self.seq
        self.seq += 1
        return s


class InFlight:
    """Jobs read from the stream and not yet acked, with a capacity bound the
    intake waits on (the queue, not the worker, holds the backlog)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._jobs: dict[str, JobState] = {}
        self._cond = threading.Condition()

    def add(self, st: JobState) -> None:
        with self._cond:
            self._jobs[st.id] = st

    def get(self, job_id: str) -> Optional[JobState]:
        with self._cond:
            return self._jobs.get(job_id)

    def remove(self, job_id: str) -> Optional[JobState]:
        with self._cond:
            st = self._jobs.pop(job_id, None)
            self._cond.notify_all()
            return st

    def snapshot(self) -> list[JobState]:
        with self._cond:
            return list(self._jobs.values())

    def __len__(self) -> int:
        with self._cond:
            return len(self._jobs)

    def free(self) -> int:
        with self._cond:
            return max(0, self.capacity - len(self._jobs))

    def wait_free(self, timeout: float) -> int:
        with self._cond:
            if len(self._jobs) >= self.capacity:
                self._cond.wait(timeout)
            return max(0, self.capacity - len(self._jobs))
