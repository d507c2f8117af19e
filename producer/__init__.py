"""inferq producer SDK: enqueue generation jobs and stream their replies.

Needs only Redis and pydantic (no torch). See inferq.producer.client for an example.
"""
from inferq.producer.async_client import AsyncJobHandle, AsyncProducer
from inferq.producer.client import JobHandle, JobResult, Producer
from inferq.producer.errors import (
    InferqError,
    JobFailed,
    JobNotFound,
    JobRestarted,
    QueueFull,
    QueueUnavailable,
    RateLimited,
)
from inferq.producer.settings import ProducerSettings
from inferq.schemas.connection import RedisSettings

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
