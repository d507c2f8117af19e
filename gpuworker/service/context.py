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
    reply_ttl: int  # a job's keys live this long after done/error
    reply_maxlen: int
    live_ttl: int = 86_400  # ... and this long while it waits or runs
    log_prompts: bool = False
    dlq_maxlen: int = 10_000
    dlq_max_age_s: int = 7 * 86_400
    dlq_redact: bool = False

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
