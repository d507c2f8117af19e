"""The queue's delivery policy: knobs the producer, the worker and the
housekeeping tasks must agree on, so they are defined once (same INFERQ_*
names everywhere, one .env serves all)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from inferq.schemas.connection import RedisSettings


class QueuePolicy(RedisSettings):
    lease_seconds: float = Field(10.0, gt=0.0, description="Lease of an in-flight job; the reaper claims entries idle for 3 leases.")
    max_deliveries: int = Field(5, ge=1, description="Deliveries before a job goes to the DLQ.")
    # Two lifetimes of a job's keys (reply stream, job-info hash, cancel flag):
    live_ttl: int = Field(86_400, ge=1, description="Seconds a job's keys live while it waits or runs.")
    reply_ttl: int = Field(3600, ge=1, description="Seconds a job's reply stream and status live after done/error.")
    reply_maxlen: int = Field(20_000, ge=100, description="Approximate MAXLEN of a reply stream.")
    worker_stale_seconds: float = Field(15.0, gt=0.0, description="A worker whose heartbeat is older is treated as gone.")
    # The dead-letter stream is bounded by count and by age; payloads (prompts of
    # up to ~1 MB) are kept for `inferq dlq retry`, or redacted to their size.
    dlq_maxlen: int = Field(10_000, ge=1, description="Most entries kept on a model's dead-letter stream.")
    dlq_max_age_s: int = Field(7 * 86_400, ge=60, description="Dead letters older than this are trimmed.")
    dlq_payload: Literal["keep", "redact"] = Field("keep", description="keep the job payload in the DLQ (retryable) or redact it")
    # Fair share: each tenant's jobs wait on a lane of their own, which workers
    # serve in weighted fair order (by tokens); off: tenants share one lane.
    fair_share: bool = Field(False, description="give each tenant its own lane, served in weighted fair order")
    # Shutdown: the worker drains this long, and whoever supervises it (inferq up) waits for that.
    drain_timeout: float = Field(30.0, ge=0.0, description="seconds to finish in-flight jobs on SIGTERM")

    @property
    def min_idle_ms(self) -> int:
        """Idle time after which a pending entry counts as abandoned (3 leases)."""
        return int(3 * self.lease_seconds * 1000)
