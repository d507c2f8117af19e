"""Errors the producer SDK raises. All derive from InferqError."""
from __future__ import annotations

from typing import Optional


class InferqError(Exception):
    """Base class of every inferq producer error."""


class QueueFull(InferqError):
    """The model's backlog is at its bound; retry later."""

    def __init__(self, model: str, depth: int, max_backlog: int):
        self.model = model
        self.depth = depth
        self.max_backlog = max_backlog
        super().__init__(f"queue for model {model!r} is full: {depth} jobs waiting (max_backlog={max_backlog})")


class QueueUnavailable(QueueFull):
    """Redis answers but refuses writes (out of memory under noeviction, or a
    read-only replica during a failover): nothing was enqueued; retry later."""

    def __init__(self, model: str, cause: str):
        self.model = model
        self.depth = -1
        self.max_backlog = -1
        self.cause = cause
        InferqError.__init__(self, f"queue for model {model!r} cannot take jobs right now: Redis refuses writes "
                                   f"({cause}); retry later")


class RateLimited(InferqError):
    """The tenant's token bucket is empty."""

    def __init__(self, tenant: str, retry_after: float):
        self.tenant = tenant
        self.retry_after = retry_after
        super().__init__(f"tenant {tenant!r} is over its rate limit; retry after {retry_after:.2f}s")


class JobNotFound(InferqError, KeyError):
    """No job with this id is known (never submitted, or its records expired)."""

    def __init__(self, job_id: str):
        self.job_id = job_id
        super().__init__(f"job {job_id!r} not found (unknown id, or its reply stream expired)")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class JobFailed(InferqError):
    """The worker finished the job with an ``error`` event."""

    def __init__(self, job_id: str, code: str, message: str):
        self.job_id = job_id
        self.code = code
        self.message = message
        super().__init__(f"job {job_id} failed [{code}]: {message}")


class JobRestarted(InferqError):
    """Raised by ``text()`` when a redelivered job produced different text than
    what was already handed out, so the caller must start over."""

    def __init__(self, job_id: str, attempt: int, shown: Optional[str] = None):
        self.job_id = job_id
        self.attempt = attempt
        self.shown = shown
        super().__init__(f"job {job_id} restarted (attempt {attempt}) and its new output differs from what was shown")
