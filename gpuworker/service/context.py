"""Names and limits every thread of one worker shares."""
from __future__ import annotations

from dataclasses import dataclass

from schemas import keys


@dataclass(frozen=True)
class WorkerContext:
    model: str
    consumer: str
    lease_seconds: float
    max_deliveries: int
    reply_ttl: int
    reply_maxlen: int
    job_ttl: int = 86_400  # status/reply keys of a job still running
    log_prompts: bool = False

    @property
    def stream(self) -> str:
        return keys.jobs(self.model)

    @property
    def group(self) -> str:
        return keys.JOBS_GROUP

    @property
    def dlq(self) -> str:
        return keys.dlq(self.model)

    @property
    def workers_key(self) -> str:
        return keys.workers(self.model)
