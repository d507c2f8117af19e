"""The Celery application for backends that already run Celery.

Broker and result backend are the inferq Redis (INFERQ_REDIS_URL, with
INFERQ_REDIS_PASSWORD / TLS settings), unless INFERQ_CELERY_BROKER_URL /
INFERQ_CELERY_RESULT_BACKEND say otherwise. No model ever runs here: tasks
submit jobs to the GPU workers through the queue and wait for replies.

    celery -A producer.celery_app worker --loglevel=info
    celery -A producer.celery_app beat --loglevel=info
"""
from __future__ import annotations

import os
import ssl
from urllib.parse import urlparse

from celery import Celery

from producer.settings import ProducerSettings


def _ssl_options(s: ProducerSettings) -> dict:
    # Celery wants ssl's constants where redis-py takes strings; the files are shared.
    return {"ssl_cert_reqs": ssl.CERT_NONE if s.redis_tls_insecure else ssl.CERT_REQUIRED, **s.tls_files()}


def beat_schedule() -> dict:
    every = float(os.environ.get("INFERQ_MAINTENANCE_INTERVAL", "30"))
    return {
        "inferq-reclaim-and-dead-letter": {"task": "inferq.maintain_queues", "schedule": every},
        "inferq-expire-replies": {"task": "inferq.expire_replies", "schedule": every * 4},
        "inferq-export-stats": {"task": "inferq.export_queue_stats", "schedule": max(5.0, every / 2)},
    }


def make_celery() -> Celery:
    s = ProducerSettings()
    broker = os.environ.get("INFERQ_CELERY_BROKER_URL") or s.url_with_credentials()
    backend = os.environ.get("INFERQ_CELERY_RESULT_BACKEND") or broker
    app = Celery("inferq", broker=broker, backend=backend, include=["producer.celery_tasks"])
    app.conf.update(
        task_serializer="json", result_serializer="json", accept_content=["json"],
        # A task is acked only after it returns: a worker lost mid-task leaves it
        # for another (the job itself is deduplicated by an idempotency key).
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # Longer than any generation we wait for, or Redis redelivers a task
        # that is still running.
        broker_transport_options={"visibility_timeout": int(os.environ.get("INFERQ_CELERY_VISIBILITY_TIMEOUT", "3600"))},
        broker_connection_retry_on_startup=True,
        result_expires=int(os.environ.get("INFERQ_CELERY_RESULT_EXPIRES", "86400")),
        result_extended=True,
        task_default_queue=os.environ.get("INFERQ_CELERY_QUEUE", "inferq"),
        beat_schedule=beat_schedule(),
        timezone="UTC",
    )
    if urlparse(broker).scheme == "rediss":
        app.conf.broker_use_ssl = _ssl_options(s)
    if urlparse(backend).scheme == "rediss":
        app.conf.redis_backend_use_ssl = _ssl_options(s)
    return app


app = make_celery()
