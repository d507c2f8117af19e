"""Admission settings of every producer (SDK, gateway, Celery, CLI), on top of
the connection settings and queue policy every process shares (``schemas``). Read from the
environment with the INFERQ_ prefix."""
from __future__ import annotations

from pydantic import Field

from schemas import keys
from schemas.policy import QueuePolicy


class ProducerSettings(QueuePolicy):
    default_model: str = keys.DEFAULT_MODEL
    max_backlog: int = Field(10_000, ge=0, description="Jobs per model stream before QueueFull; 0 = unbounded.")
    idempotency_ttl: int = Field(86_400, ge=1)
    # Per-tenant token bucket (jobs per second, burst); 0 disables it.
    rate_limit: float = Field(0.0, ge=0.0)
    rate_burst: int = Field(0, ge=0)
