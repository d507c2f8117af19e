"""Webhooks: OpenAI-style events for ended responses, batches and jobs, delivered
at least once from a durable outbox and signed the Standard Webhooks way.

endpoints.py (where events go) · signer.py (the signature) · outbox.py + *.lua
(deliveries in Redis) · dispatcher.py (records -> deliveries -> POSTs) ·
batch_events.py (a batch's record) · routes.py (/v1/webhook_endpoints). The
completion record itself is schemas/completion_events.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from inferq.producer.gateway.webhooks.dispatcher import DispatchPolicy, Dispatcher
from inferq.producer.gateway.webhooks.endpoints import Endpoint, EndpointStore
from inferq.producer.gateway.webhooks.outbox import Outbox


@dataclass
class WebhookService:
    """What the routes, the dashboard and the gateway's lifespan share."""

    settings: object  # GatewaySettings
    endpoints: EndpointStore
    outbox: Outbox
    dispatcher: Dispatcher


def create_service(redis, settings, configured: list[Endpoint], metrics=None) -> WebhookService:
    """``configured``: the operator's endpoints (``endpoints.parse_config``, read at start-up)."""
    endpoints = EndpointStore(redis, configured)
    outbox = Outbox(redis, recent_max=settings.webhook_recent_max, dead_max=settings.webhook_dead_max)
    policy = DispatchPolicy(timeout_s=settings.webhook_timeout_s, max_attempts=settings.webhook_max_attempts,
                            max_age_s=settings.webhook_max_age_s, backoff_s=settings.webhook_backoff_s,
                            backoff_max_s=settings.webhook_backoff_max_s, concurrency=settings.webhook_concurrency,
                            claim_idle_s=settings.webhook_claim_idle_s)
    return WebhookService(settings, endpoints, outbox, Dispatcher(redis, endpoints, outbox, policy, metrics))
