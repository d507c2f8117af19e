"""Celery tasks: `generate`, `generate_many`, and beat maintenance.

    from inferq.producer.celery_tasks import generate, generate_many
    generate.delay("Hello", sampling={"max_tokens": 32}).get()
    generate_many.delay([{"prompt": "a"}, {"messages": [...]}], sampling={...}).get()

`generate` uses the Celery task id as the job's idempotency key, so a task
redelivered after a worker crash (acks_late) waits for the same job instead of
generating twice.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

from celery import chord
from celery.utils.log import get_task_logger
from pydantic import ValidationError

from inferq.producer.celery_app import app
from inferq.producer.errors import QueueFull, RateLimited

log = get_task_logger(__name__)


@functools.lru_cache(maxsize=1)
def _producer():
    # One per Celery worker process (forked children build their own).
    from inferq.producer import Producer

    return Producer()


def _redis():
    return _producer().redis


def result_dict(job_id: str, r) -> dict:
    return {
        "job_id": job_id,
        "text": r.text,
        "token_ids": r.token_ids,
        "finish_reason": r.finish_reason,
        "usage": r.usage.model_dump(),
        "timings": r.timings.model_dump(),
        "attempt": r.attempt,
    }


@app.task(bind=True, name="inferq.generate", acks_late=True, max_retries=20)
def generate(self, prompt: Optional[str] = None, *, messages: Optional[list] = None,
             prompt_token_ids: Optional[list[int]] = None, sampling: Optional[dict] = None,
             model: Optional[str] = None, priority: int = 0, metadata: Optional[dict] = None,
             tenant: Optional[str] = None, timeout: float = 600.0) -> dict:
    """Submit one job, wait for it, return text, tokens, finish reason, usage."""
    p = _producer()
    try:
        h = p.submit(prompt, messages=messages, prompt_token_ids=prompt_token_ids, sampling=sampling,
                     model=model, priority=priority, metadata=metadata, tenant=tenant,
                     idempotency_key=f"celery:{self.request.id}")
    except (QueueFull, RateLimited) as e:
        # Backpressure: try again later instead of failing the caller.
        delay = getattr(e, "retry_after", None) or min(60, 2 ** self.request.retries)
        raise self.retry(exc=e, countdown=delay)
    except ValidationError as e:
        # pydantic's error does not survive the result backend's pickling (the caller
        # would see "ValidationError([])"): hand back its message as a plain ValueError.
        raise ValueError(f"invalid job: {e}") from None
    try:
        res = h.result(timeout=timeout)
    except TimeoutError:
        h.cancel()  # nobody will read it any more
        raise
    return result_dict(h.id, res)


@app.task(name="inferq.collect_results")
def collect_results(results: list) -> list:
    return list(results)


@app.task(bind=True, name="inferq.generate_many")
def generate_many(self, items: list[dict], **common: Any):
    """Fan out one `generate` per item (item fields override ``common``); the
    result is the list of their results, in order (a chord)."""
    if not items:
        return []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise TypeError(f"items[{i}] must be a dict of generate() arguments, not {type(item).__name__}")
    header = [generate.s(**{**common, **item}) for item in items]
    raise self.replace(chord(header, collect_results.s()))


# -- beat maintenance -----------------------------------------------------------
@app.task(name="inferq.maintain_queues")
def maintain_queues() -> dict:
    from inferq.producer.maintenance import run_all

    report = run_all(_redis())
    log.info("inferq maintenance: %s", report)
    return report


@app.task(name="inferq.expire_replies")
def expire_replies() -> int:
    from inferq.producer.maintenance import MaintenanceSettings, expire_finished_replies

    return expire_finished_replies(_redis(), MaintenanceSettings())


@app.task(name="inferq.export_queue_stats")
def export_queue_stats() -> list:
    from inferq.producer.maintenance import MaintenanceSettings, export_stats

    stats = export_stats(_redis(), MaintenanceSettings())
    for st in stats:
        log.info("inferq queue %s depth=%s waiting=%s pending=%s dlq=%s workers_alive=%s", st["model"], st["depth"],
                 st["waiting"], st["pending"], st["dlq"], st["workers_alive"])
    return stats
