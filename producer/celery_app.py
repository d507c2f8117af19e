"""The Celery application for backends that already run Celery.

Broker and result backend are the inferq Redis (INFERQ_REDIS_URL, with
INFERQ_REDIS_PASSWORD / TLS settings), unless INFERQ_CELERY_BROKER_URL /
INFERQ_CELERY_RESULT_BACKEND say otherwise. No model ever runs here: tasks
submit jobs to the GPU workers through the queue and wait for replies.

    celery -A producer.celery_app worker --loglevel=info
    celery -A producer.celery_app beat --loglevel=info
"""
from __future__ import annotations

import ssl
from typing import Optional
from urllib.parse import urlparse

from celery import Celery
from pydantic import Field

from producer.settings import ProducerSettings


class CelerySettings(ProducerSettings):
    """The Celery app's own knobs (INFERQ_CELERY_*, INFERQ_MAINTENANCE_INTERVAL)
    on top of the producer settings every Celery task uses."""

    celery_broker_url: Optional[str] = Field(None, description="Broker URL (default: the inferq Redis).")
    celery_result_backend: Optional[str] = Field(None, description="Result backend (default: the broker).")
    # Longer than any generation we wait for, or Redis redelivers a task that is still running.
    celery_visibility_timeout: int = Field(3600, ge=1)
    celery_result_expires: int = Field(86_400, ge=1)
    celery_queue: str = "inferq"
    maintenance_interval: float = Field(30.0, gt=0.0, description="Seconds between beat maintenance runs.")


def _ssl_options(s: ProducerSettings) -> dict:
    # Celery wants ssl's constants where redis-py takes strings; the files are shared.
    return {"ssl_cert_reqs": ssl.CERT_NONE if s.redis_tls_insecure else ssl.CERT_REQUIRED, **s.tls_files()}


def beat_schedule(s: Optional[CelerySettings] = None) -> dict:
    every = (s or CelerySettings()).maintenance_interval
    return {
        "inferq-reclaim-and-dead-letter": {"task": "inferq.maintain_queues", "schedule": every},
        "inferq-expire-replies": {"task": "inferq.expire_replies", "schedule": every * 4},
        "inferq-export-stats": {"task": "inferq.export_queue_stats", "schedule": max(5.0, every / 2)},
    }


def make_celery() -> Celery:
    s = CelerySettings()
    broker = s.celery_broker_url or s.url_with_credentials()
    backend = s.celery_result_backend or broker
    app = Celery("inferq", broker=broker, backend=backend, include=["producer.celery_tasks"])
    app.conf.update(
        task_serializer="json", result_serializer="json", accept_content=["json"],
        # A task is acked only after it returns: a worker lost mid-task leaves it
        # for another (the job itself is deduplicated by an idempotency key).
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options={"visibility_timeout": s.celery_visibility_timeout},
        broker_connection_retry_on_startup=True,
        result_expires=s.celery_result_expires,
        result_extended=True,
        task_default_queue=s.celery_queue,
        beat_schedule=beat_schedule(s),
        timezone="UTC",
    )
    if urlparse(broker).scheme == "rediss":
        app.conf.broker_use_ssl = _ssl_options(s)
    if urlparse(backend).scheme == "rediss":
        app.conf.redis_backend_use_ssl = _ssl_options(s)
    return app


app = make_celery()
