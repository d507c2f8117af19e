"""What the worker knows about each job it holds, shared by its threads."""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from schemas.job import Job


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
    finishing: bool = False  # its final pipeline is being written
    dropped: bool = False  # another worker owns it now (lease lost) or drain ended
    # After an engine fault: "suspect" (was in the failing step), "culprit" (the
    # step failed while it was the job on probation); "" otherwise.
    suspect: str = ""

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def created(self) -> float:
        """Submit time, trusted only if it is sane (payloads can be hand-made)."""
        c = self.job.created_at
        return c if math.isfinite(c) and c <= self.received_at + 60 else self.received_at

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

    def wait_empty(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self._cond:
            while self._jobs:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True
