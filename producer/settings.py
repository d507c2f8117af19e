"""Admission settings of every producer (SDK, gateway, Celery, CLI), on top of
the connection settings and queue policy every process shares (``schemas``). Read from the
environment with the INFERQ_ prefix."""
from __future__ import annotations

from pydantic import Field, model_validator

from inferq.schemas import keys
from inferq.schemas.policy import QueuePolicy


class ProducerSettings(QueuePolicy):
    default_model: str = keys.DEFAULT_MODEL
    max_backlog: int = Field(10_000, ge=0, description="Jobs per model stream before QueueFull; 0 = unbounded.")
    idempotency_ttl: int = Field(86_400, ge=1)
    # Per-tenant token bucket (jobs per second, burst); 0 disables it.
    rate_limit: float = Field(0.0, ge=0.0)
    rate_burst: int = Field(0, ge=0)
    # WAIT after admission (replicated Redis, e.g. Sentinel): the SDK/gateway
    # returns an accepted job only after this many replicas acknowledged it, or
    # after the timeout (then the job is returned anyway, marked not replicated).
    # Replication stays asynchronous: this narrows the window in which a failover
    # loses an accepted job, it does not close it (see docs/deploy.md, Sentinel).
    admission_replicas: int = Field(0, ge=0, description="Replicas that must acknowledge an admitted job (WAIT); 0 = off.")
    admission_wait_ms: int = Field(1000, ge=1, description="Longest WAIT for those replicas (ms); then the job is returned, marked not replicated.")

    # Prefix affinity: derive a session from the first N characters of a longer
    # prompt (0 = only an explicit session_id routes a job to a preferred worker).
    affinity_prefix_chars: int = Field(0, ge=0, description="derive a session id from a prompt prefix this long (0 = off)")

    @model_validator(mode="after")
    def _wait_below_socket_timeout(self):
        if self.admission_replicas and self.admission_wait_ms / 1000 >= self.socket_timeout - 1:
            raise ValueError(f"admission_wait_ms ({self.admission_wait_ms}) must stay at least 1 s under "
                             f"socket_timeout ({self.socket_timeout}s)")
        return self
