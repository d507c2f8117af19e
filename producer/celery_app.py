"""The Celery application for backends that already run Celery.

Broker and result backend are the inferq Redis (INFERQ_REDIS_URL, with
INFERQ_REDIS_PASSWORD / TLS settings; in sentinel mode the master the sentinels
name, through kombu's ``sentinel://`` transport), unless INFERQ_CELERY_BROKER_URL /
INFERQ_CELERY_RESULT_BACKEND say otherwise. No model ever runs here: tasks
submit jobs to the GPU workers through the queue and wait for replies.

With INFERQ_REDIS_MODE=cluster, INFERQ_CELERY_BROKER_URL is required: kombu's
Redis transport cannot use a Redis Cluster, so the broker (and, by default, the
result backend) is a separate standalone or Sentinel Redis; the tasks still
reach the queue itself through the cluster.

    celery -A inferq.producer.celery_app worker --loglevel=info
    celery -A inferq.producer.celery_app beat --loglevel=info
"""
from __future__ import annotations

import ssl
from typing import Optional
from urllib.parse import quote, urlparse

from celery import Celery
from pydantic import Field

from inferq.producer.settings import ProducerSettings


class CelerySettings(ProducerSettings):
    """The Celery app's own knobs (INFERQ_CELERY_*, INFERQ_MAINTENANCE_INTERVAL)
    on top of the producer settings every Celery task uses."""

    celery_broker_url: Optional[str] = Field(None, description="Broker URL (default: the inferq Redis; required in cluster mode).")
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


def sentinel_url(s: ProducerSettings) -> str:
    """INFERQ_REDIS_MODE=sentinel as kombu/Celery spell it: one ``sentinel://``
    URL per sentinel, joined by ``;``, carrying the master's credentials and db
    (the service name goes in the transport options, see ``sentinel_options``)."""
    m = s.master_kwargs()
    auth = ""
    if "password" in m:
        auth = f"{quote(m.get('username') or '', safe='')}:{quote(m['password'], safe='')}@"
    hosts = [(f"[{h}]" if ":" in h else h, p) for h, p in s.sentinel_addresses()]
    return ";".join(f"sentinel://{auth}{h}:{p}/{m['db']}" for h, p in hosts)


def sentinel_options(s: ProducerSettings) -> dict:
    return {"master_name": s.redis_sentinel_master, "sentinel_kwargs": s.sentinel_kwargs()}


def broker_url(s: CelerySettings) -> str:
    """INFERQ_CELERY_BROKER_URL, else the inferq Redis as kombu spells it."""
    if s.celery_broker_url:
        return s.celery_broker_url
    if s.cluster_mode:
        raise ValueError("INFERQ_REDIS_MODE=cluster: Celery cannot use a Redis Cluster as its broker; set "
                         "INFERQ_CELERY_BROKER_URL (and optionally INFERQ_CELERY_RESULT_BACKEND) to a standalone "
                         "or Sentinel Redis")
    return sentinel_url(s) if s.sentinel_mode else s.url_with_credentials()


def make_celery() -> Celery:
    s = CelerySettings()
    broker = broker_url(s)
    backend = s.celery_result_backend or broker
    app = Celery("inferq", broker=broker, backend=backend, include=["inferq.producer.celery_tasks"])
    app.conf.update(
        task_serializer="json", result_serializer="json", accept_content=["json"],
        # A task is acked only after it returns: a worker lost mid-task leaves it
        # for another (the job itself is deduplicated by an idempotency key).
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_transport_options={"visibility_timeout": s.celery_visibility_timeout,
                                  **(sentinel_options(s) if urlparse(broker).scheme == "sentinel" else {})},
        result_backend_transport_options=sentinel_options(s) if urlparse(backend).scheme == "sentinel" else {},
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
