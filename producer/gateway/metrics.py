"""Gateway metrics (Prometheus), one registry per app so several apps can live
in one process (tests). Queue gauges are read from Redis at scrape time."""
from __future__ import annotations

import re
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# vLLM's TTFT buckets (seconds).
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
# Label values are templates, never raw paths or methods: a caller must not be
# able to create series by inventing URLs or HTTP verbs.
_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/jobs", "/health", "/ready", "/metrics",
           "/v1/embeddings", "/tokenize", "/detokenize", "/v1/responses")
_TEMPLATES = ((re.compile(r"^/v1/jobs/[^/]+$"), "/v1/jobs/{id}"),
              (re.compile(r"^/v1/jobs/[^/]+/events$"), "/v1/jobs/{id}/events"),
              (re.compile(r"^/v1/models/[^/]+$"), "/v1/models/{model}"),
              (re.compile(r"^/v1/responses/[^/]+$"), "/v1/responses/{id}"),
              (re.compile(r"^/v1/responses/[^/]+/cancel$"), "/v1/responses/{id}/cancel"),
              (re.compile(r"^/v1/responses/[^/]+/input_items$"), "/v1/responses/{id}/input_items"))
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("inferq_gateway_requests_total", "HTTP requests by route and status",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("inferq_gateway_request_duration_seconds",
                                 "Time to the response head (streams: to the first byte)",
                                 ["route"], buckets=_TTFT_BUCKETS, registry=r)
        self.ttft = Histogram("inferq_gateway_time_to_first_token_seconds",
                              "Streamed requests: admission to first content chunk", buckets=_TTFT_BUCKETS,
                              registry=r)
        self.active_streams = Gauge("inferq_gateway_active_streams", "Open OpenAI streams", registry=r)
        self.jobs_submitted = Counter("inferq_gateway_jobs_submitted_total", "Jobs admitted", ["route"], registry=r)
        self.rejected = Counter("inferq_gateway_rejected_total", "Jobs refused at admission", ["reason"],
                                registry=r)
        self.stream_divergences = Counter(
            "inferq_gateway_stream_divergences_total",
            "OpenAI streams ended because a redelivered job's new attempt contradicted text already sent",
            registry=r)
        self.cancelled_on_disconnect = Counter("inferq_gateway_cancelled_total",
                                               "Jobs cancelled because their client went away", registry=r)
        self.queue_depth = Gauge("inferq_queue_depth", "Jobs on the stream (waiting + in flight)", ["model"],
                                 registry=r)
        self.queue_waiting = Gauge("inferq_queue_waiting", "Jobs not yet delivered to a worker (lag)", ["model"],
                                   registry=r)
        self.queue_pending = Gauge("inferq_queue_pending", "Jobs delivered and not acked", ["model"], registry=r)
        self.queue_oldest = Gauge("inferq_queue_oldest_waiting_seconds", "Age of the oldest undelivered job",
                                  ["model"], registry=r)
        self.dlq = Gauge("inferq_dlq_size", "Entries in the dead-letter stream", ["model"], registry=r)
        self.workers = Gauge("inferq_workers_alive", "Workers with a fresh heartbeat", ["model"], registry=r)
        # Per priority class and per fair-share tenant lane. Tenants come only from
        # the configured API keys (others count as "other"): a bounded label set.
        self.class_waiting = Gauge("inferq_queue_class_waiting", "Undelivered jobs per priority class",
                                   ["model", "class"], registry=r)
        self.class_pending = Gauge("inferq_queue_class_pending", "Delivered, unacked jobs per priority class",
                                   ["model", "class"], registry=r)
        self.tenant_waiting = Gauge("inferq_queue_tenant_waiting", "Undelivered jobs per tenant lane (fair share on)",
                                    ["model", "tenant"], registry=r)
        self.tenant_pending = Gauge("inferq_queue_tenant_pending", "Delivered, unacked jobs per tenant lane",
                                    ["model", "tenant"], registry=r)
        # Webhooks (producer/gateway/webhooks): set by the dispatcher every few seconds.
        self.webhook_deliveries = Counter("inferq_gateway_webhook_deliveries_total",
                                          "Webhook delivery attempts by outcome (delivered, retry, dead)",
                                          ["outcome"], registry=r)
        self.webhook_outbox = Gauge("inferq_webhook_outbox_pending", "Webhook deliveries waiting to be sent",
                                    registry=r)
        self.webhook_dead = Gauge("inferq_webhook_dead_letters", "Webhook deliveries that ran out of attempts",
                                  registry=r)
        self.webhook_backlog = Gauge("inferq_webhook_events_backlog",
                                     "Completion records not yet turned into deliveries", registry=r)

    def set_queue_stats(self, stats, tenants: frozenset = frozenset()) -> None:
        for g in (self.queue_depth, self.queue_waiting, self.queue_pending, self.queue_oldest, self.dlq, self.workers,
                  self.class_waiting, self.class_pending, self.tenant_waiting, self.tenant_pending):
            g.clear()
        for s in stats:
            self.queue_depth.labels(s.model).set(s.depth)
            self.queue_waiting.labels(s.model).set(s.waiting)
            self.queue_pending.labels(s.model).set(s.pending)
            self.queue_oldest.labels(s.model).set(s.oldest_waiting_s or 0.0)
            self.dlq.labels(s.model).set(s.dlq)
            self.workers.labels(s.model).set(s.workers_alive)
            for cls, row in s.totals("cls").items():
                self.class_waiting.labels(s.model, cls).set(row["waiting"])
                self.class_pending.labels(s.model, cls).set(row["pending"])
            by_tenant: dict[str, dict[str, int]] = {}
            for tenant, row in s.totals("tenant").items():
                if tenant == "-":
                    continue  # the shared lane: no tenant to name
                label = tenant if tenant in tenants else "other"
                acc = by_tenant.setdefault(label, {"waiting": 0, "pending": 0})
                acc["waiting"] += row["waiting"]
                acc["pending"] += row["pending"]
            for label, row in by_tenant.items():
                self.tenant_waiting.labels(s.model, label).set(row["waiting"])
                self.tenant_pending.labels(s.model, label).set(row["pending"])


def route_label(path: str) -> str:
    if path in _ROUTES:
        return path
    for pattern, template in _TEMPLATES:
        if pattern.match(path):
            return template
    return "other"


def method_label(method: str) -> str:
    return method if method in _METHODS else "other"


def status_label(status: int) -> str:
    return str(status) if 100 <= status <= 599 else "other"


class RequestMetrics:
    """Pure ASGI (not BaseHTTPMiddleware, which breaks disconnect detection of streams)."""

    def __init__(self, app, metrics: GatewayMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = route_label(scope.get("path", ""))
        start = time.monotonic()

        async def timed_send(message):
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(route, method_label(scope.get("method", "")),
                                             status_label(int(message["status"]))).inc()
                self.metrics.latency.labels(route).observe(time.monotonic() - start)
            await send(message)

        await self.app(scope, receive, timed_send)
