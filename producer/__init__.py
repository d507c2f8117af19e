"""inferq producer SDK: enqueue generation jobs and stream their replies.

Needs only Redis and pydantic (no torch). See producer.client for an example.
"""
from producer.async_client import AsyncJobHandle, AsyncProducer
from producer.client import JobHandle, JobResult, Producer
from producer.errors import (
    InferqError,
    JobFailed,
    JobNotFound,
    JobRestarted,
    QueueFull,
    QueueUnavailable,
    RateLimited,
)
from producer.settings import ProducerSettings
from schemas.connection import RedisSettings

__all__ = [
    "Producer",
    "AsyncProducer",
    "JobHandle",
    "AsyncJobHandle",
    "JobResult",
    "InferqError",
    "QueueFull",
    "QueueUnavailable",
    "RateLimited",
    "JobFailed",
    "JobNotFound",
    "JobRestarted",
    "ProducerSettings",
    "RedisSettings",
]
