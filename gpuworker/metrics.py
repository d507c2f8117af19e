"""Prometheus metrics of one worker. Names follow vLLM's (``vllm:`` becomes
``inferq:``) with the same buckets where the two overlap, so dashboards and
the ``doctor`` command read them the same way; docs/operations.md lists them.

Each worker has its own registry, so several can live in one test process.
"""
from __future__ import annotations

import json
import socket
import threading
from typing import Callable, Optional
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

# vLLM V1's buckets (seconds).
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                           60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
# Structured-output grammar compiles: usually ~1 ms, pathological schemas seconds.
COMPILE_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
STEP_BUCKETS = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0]


class WorkerMetrics:
    def __init__(self, model_name: str, registry: Optional[CollectorRegistry] = None):
        self.registry = reg = registry or CollectorRegistry()
        L = ["model_name"]
        self.model_name = model_name

        def h(name, doc, buckets):
            return Histogram(name, doc, L, buckets=buckets, registry=reg).labels(model_name)

        def g(name, doc):
            return Gauge(name, doc, L, registry=reg).labels(model_name)

        def c(name, doc):
            return Counter(name, doc, L, registry=reg).labels(model_name)

        # Request latencies (as vLLM, measured from the job's submit time).
        self.ttft = h("inferq:time_to_first_token_seconds", "Submit to first token.", TTFT_BUCKETS)
        self.itl = h("inferq:inter_token_latency_seconds", "Gap between successive tokens of a job.", ITL_BUCKETS)
        self.e2e = h("inferq:e2e_request_latency_seconds", "Submit to finish.", REQUEST_LATENCY_BUCKETS)
        self.queue_time = h("inferq:request_queue_time_seconds", "Submit to intake by a worker.", REQUEST_LATENCY_BUCKETS)
        # Scheduler state.
        self.running = g("inferq:num_requests_running", "Requests in the engine's running set.")
        self.waiting = g("inferq:num_requests_waiting", "Requests admitted to the engine but not yet running.")
        self.kv_usage = g("inferq:kv_cache_usage_perc", "Fraction of KV blocks in use (0-1).")
        self.prefix_queries = c("inferq:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = c("inferq:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        # One series per reason, both created up front: "kv" (blocks ran out for a
        # running request) and "priority" (a waiting request of better priority
        # took the seat or blocks); their sum is vLLM's vllm:num_preemptions.
        preemptions = Counter("inferq:num_preemptions", "Requests preempted (recompute), by reason.",
                              L + ["reason"], registry=reg)
        self.preemptions_kv = preemptions.labels(model_name, "kv")
        self.preemptions_priority = preemptions.labels(model_name, "priority")
        self.prompt_tokens = c("inferq:prompt_tokens", "Prompt tokens computed (prefill).")
        self.generation_tokens = c("inferq:generation_tokens", "Tokens generated.")
        self._finished = Counter("inferq:request_success", "Jobs finished, by finish reason.",
                                 L + ["finished_reason"], registry=reg)
        # Queue side (inferq only).
        self.inflight = g("inferq:jobs_in_flight", "Jobs this worker holds (read, not yet acked).")
        self.queue_depth = g("inferq:queue_depth", "Entries in the model's job stream (waiting + in flight).")
        self.consumer_lag = g("inferq:consumer_lag", "Job stream entries not yet delivered to any worker.")
        self.pending = g("inferq:jobs_pending", "Entries delivered to the group and not yet acked (all workers).")
        self.dlq_size = g("inferq:dlq_size", "Entries in the model's dead-letter stream.")
        self._errors = Counter("inferq:job_errors", "Jobs rejected or failed, by error code.",
                               L + ["code"], registry=reg)
        self.redeliveries = c("inferq:job_redeliveries", "Jobs started again after an earlier attempt.")
        self.redeliveries_continued = c("inferq:job_redeliveries_continued",
                                        "Redelivered jobs that continued from their published tokens (migration).")
        self.continued_tokens = c("inferq:continued_tokens",
                                  "Tokens redelivered jobs kept from earlier attempts instead of regenerating.")
        self.reclaimed = c("inferq:jobs_reclaimed", "Entries claimed from idle (dead) workers.")
        self._refused = Counter("inferq:fenced_refusals", "State changes Redis refused because this worker no "
                                "longer owned the job (lease lost): never published.", L + ["op"], registry=reg)
        self.reply_events = c("inferq:reply_events", "Events written to reply streams.")
        self.step_time = h("inferq:engine_step_seconds", "Wall time of one engine step.", STEP_BUCKETS)
        self.publish_time = h("inferq:publish_seconds", "Wall time of one reply pipeline round trip.", STEP_BUCKETS)
        self.invariant_failures = c("inferq:engine_invariant_failures",
                                    "Block-pool invariant violations seen (only checked with --check-invariants).")
        # Structured outputs (compiled in the intake thread, gpuworker/engine/grammar.py).
        self.grammar_compile_time = h("inferq:grammar_compile_seconds",
                                      "Time to compile a structured-output constraint (cache misses only).", COMPILE_BUCKETS)
        grammar_cache = Counter("inferq:grammar_cache_lookups", "Structured-output constraints looked up in the "
                                "compiled-grammar cache, by result (hit | miss).", L + ["result"], registry=reg)
        self.grammar_cache_hits = grammar_cache.labels(model_name, "hit")
        self.grammar_cache_misses = grammar_cache.labels(model_name, "miss")
        self.grammar_cache_entries = g("inferq:grammar_cache_entries", "Compiled grammars held in the worker's cache.")
        # Speculative decoding (vLLM's vllm:spec_decode_* counters).
        self.spec_drafts = c("inferq:spec_decode_num_drafts", "Proposals verified (one request, one step).")
        self.spec_draft_tokens = c("inferq:spec_decode_num_draft_tokens", "Tokens proposed and verified.")
        self.spec_accepted_tokens = c("inferq:spec_decode_num_accepted_tokens", "Proposed tokens the target model accepted.")
        self.spec_acceptance = g("inferq:spec_decode_acceptance_rate", "Accepted / proposed tokens since the engine started (0 when none).")
        self.config = Info("inferq:worker_config", "Worker and engine configuration.", registry=reg)
        self._last_totals = {"q": 0, "h": 0, "pk": 0, "pp": 0, "pt": 0, "gt": 0, "sd": 0, "st": 0, "sa": 0}

    def grammar_compiled(self, seconds: float, cache_hit: bool, entries: int) -> None:
        self.grammar_cache_entries.set(entries)
        if cache_hit:
            self.grammar_cache_hits.inc()
        else:
            self.grammar_cache_misses.inc()
            self.grammar_compile_time.observe(seconds)

    def finished(self, reason: str) -> None:
        self._finished.labels(self.model_name, reason).inc()

    def continued(self, tokens: int) -> None:
        """A redelivered job's plan: ``tokens`` kept from earlier attempts (0: it regenerates)."""
        if tokens:
            self.redeliveries_continued.inc()
            self.continued_tokens.inc(tokens)

    def refused(self, op: str) -> None:
        self._refused.labels(self.model_name, op).inc()

    def error(self, code: str) -> None:
        self._errors.labels(self.model_name, code).inc()

    def update_engine(self, stats) -> None:
        """Set gauges and advance counters from the engine's cumulative stats."""
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_cache_usage)
        last = self._last_totals
        priority = stats.num_priority_preemptions
        for key, counter, total in (
            ("q", self.prefix_queries, stats.prefix_cache_queries),
            ("h", self.prefix_hits, stats.prefix_cache_hits),
            ("pk", self.preemptions_kv, stats.num_preemptions - priority),
            ("pp", self.preemptions_priority, priority),
            ("pt", self.prompt_tokens, stats.num_prompt_tokens),
            ("gt", self.generation_tokens, stats.num_generated_tokens),
        ) + self._spec_totals(stats.spec):
            if total > last[key]:
                counter.inc(total - last[key])
            last[key] = total  # an engine rebuilt after a fault starts again from 0

    def _spec_totals(self, spec) -> tuple:
        if spec is None:
            return ()
        self.spec_acceptance.set(spec.acceptance_rate)
        return (("sd", self.spec_drafts, spec.num_drafts), ("st", self.spec_draft_tokens, spec.num_draft_tokens),
                ("sa", self.spec_accepted_tokens, spec.num_accepted_tokens))

    def serve(self, port: int, addr: str = "0.0.0.0", health: Optional[Callable[[], tuple[bool, str]]] = None):
        """Serve /metrics on ``port`` and, given ``health`` (returning (ok, reason)), GET /health:
        200 or 503 with the reason. Returns the server (or None if port is 0)."""
        if not port:
            return None
        app = with_health(make_wsgi_app(self.registry), health) if health else make_wsgi_app(self.registry)

        class Server(ThreadingWSGIServer):
            address_family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0]  # IPv6 too

        server = make_server(addr, port, app, Server, handler_class=QuietHandler)
        threading.Thread(target=server.serve_forever, name="inferq-metrics", daemon=True).start()
        return server


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # no access log line per scrape or probe
        pass


def with_health(metrics_app, health: Callable[[], tuple[bool, str]]):
    """The WSGI app: GET /health answered by ``health``, every other path by ``metrics_app``."""

    def app(environ, start_response):
        if environ.get("PATH_INFO") != "/health":
            return metrics_app(environ, start_response)
        ok, reason = health()
        body = json.dumps({"status": "ok" if ok else "unhealthy", "reason": reason}).encode()
        start_response("200 OK" if ok else "503 Service Unavailable",
                       [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return app
