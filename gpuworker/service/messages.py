"""What the worker's threads send each other, one dataclass per kind.

To the engine thread (its command queue):
  AddJob     intake: start this job (or restart it if the engine has it)
  AbortJob   publisher: the client cancelled; finish it with ``reason``
  DropJob    lease keeper: another worker owns it now; forget it silently

To the publisher (its item queue):
  Started    intake: jobs handed to the engine (their started events)
  StepOutput engine: one step's deltas and stats
  Rejected   engine: the engine refused a job (bad request)
  Failed     engine: a fault aborted these jobs (retry or dead-letter)
  Dropped    engine: jobs abandoned without a reply
  Stop       worker: write what is queued, then end
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from inferq.gpuworker.service.state import JobState


# -- engine commands --------------------------------------------------------------
@dataclass(frozen=True)
class AddJob:
    st: JobState


@dataclass(frozen=True)
class AbortJob:
    job_id: str
    reason: str


@dataclass(frozen=True)
class DropJob:
    job_id: str


# -- publisher items --------------------------------------------------------------
@dataclass
class StepOutput:
    deltas: list
    stats: object
    t: float  # wall time the step ended
    step_s: float


@dataclass
class Started:
    """Jobs handed to the engine: their restarted/started events ride on the
    publisher's next pipeline, queued ahead of any of their deltas."""

    states: list


@dataclass
class Rejected:
    st: JobState
    code: str
    message: str


@dataclass
class Failed:
    """An engine fault: these jobs were aborted and must be retried or dead-lettered."""

    states: list
    error: str
    culprit: Optional[str] = None  # the job on probation when it happened


@dataclass
class Dropped:
    """Jobs abandoned without a reply: the lease was lost (another worker has
    them), or the drain timed out (``handback``: return them to the group)."""

    ids: list = field(default_factory=list)
    handback: bool = False


class Stop:
    """End of the publisher's queue."""


STOP = Stop()
