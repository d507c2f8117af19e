"""The dashboard's memory of the last minutes: a bounded ring of samples.

Every ``dashboard_sample_s`` (only while someone has looked at the dashboard
within the window, so an unwatched gateway does no work) one sample records
each model's queue numbers (producer/queue_stats.py, the same reader as
`inferq status`) and each configured worker's /metrics (the same reading as
`inferq doctor`, producer/engine_limits.py). Charts are differences of
consecutive samples; the ring holds window / interval samples, never more.
"""
from __future__ import annotations

import asyncio
import math
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

import anyio

from inferq.schemas.connection import sync_client
from inferq.producer.engine_limits import Sample, diagnose, parse_metrics
from inferq.producer.queue_stats import ModelQueueStats, all_stats

TTFT = "inferq:time_to_first_token_seconds"


@dataclass
class WorkerReading:
    """One scrape of one worker's /metrics."""

    url: str
    sample: Sample
    model: str
    worker: str
    done: float  # jobs finished (any reason), cumulative
    ttft_buckets: dict[float, float]  # le -> cumulative count
    ttft_sum: float
    ttft_count: float


@dataclass
class Snapshot:
    at: float
    queues: list[ModelQueueStats]
    workers: dict[str, WorkerReading] = field(default_factory=dict)  # by URL
    errors: dict[str, str] = field(default_factory=dict)  # URL -> why it could not be read


def read_worker(url: str, text: str, at: float) -> WorkerReading:
    m = parse_metrics(text)
    sample = Sample.from_text(text, at=at)
    buckets: dict[float, float] = {}
    for labels, v in m.get(TTFT + "_bucket", []):
        le = float(labels.get("le", "inf").replace("+Inf", "inf"))
        buckets[le] = buckets.get(le, 0.0) + v
    cfg = sample.config
    return WorkerReading(url=url, sample=sample, model=cfg.get("model", ""), worker=cfg.get("worker", ""),
                         done=sum(v for _, v in m.get("inferq:request_success_total", [])),
                         ttft_buckets=buckets, ttft_sum=sum(v for _, v in m.get(TTFT + "_sum", [])),
                         ttft_count=sum(v for _, v in m.get(TTFT + "_count", [])))


def quantile(q: float, buckets: dict[float, float]) -> Optional[float]:
    """Prometheus' histogram_quantile over cumulative bucket counts."""
    edges = sorted(buckets)
    if not edges or buckets[edges[-1]] <= 0:
        return None
    rank = q * buckets[edges[-1]]
    lower, below = 0.0, 0.0
    for le in edges:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                return lower  # in the open top bucket: its lower edge is all we know
            span = count - below
            return lower + (le - lower) * ((rank - below) / span if span else 0.0)
        lower, below = le, count
    return lower


class Sampler:
    def __init__(self, ctx, urls: list[str], every_s: float, window_s: float):
        self.ctx, self.urls, self.every_s, self.window_s = ctx, urls, every_s, window_s
        self.ring: deque[Snapshot] = deque(maxlen=max(2, int(window_s / every_s) + 1))
        self._watched = -math.inf
        self._task: Optional[asyncio.Task] = None
        self._wake = asyncio.Event()

    def watched(self) -> None:
        """A dashboard view was read: keep sampling for the next window."""
        first = self._watched == -math.inf or time.monotonic() - self._watched > self.window_s
        self._watched = time.monotonic()
        if first:
            self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    async def _run(self) -> None:
        while True:
            if time.monotonic() - self._watched > self.window_s:
                self._wake.clear()
                await self._wake.wait()
            try:
                self.ring.append(await self.take())
            except Exception:
                pass  # Redis or a worker away: the next sample tries again
            await asyncio.sleep(self.every_s)

    async def take(self) -> Snapshot:
        models = await self.ctx.backend.known_models(max_age_s=10.0)
        settings = self.ctx.backend.settings

        def read() -> Snapshot:
            at = time.time()
            r = sync_client(settings)
            try:
                queues = all_stats(r, settings.worker_stale_seconds, models) if models else []
            finally:
                r.close()
            snap = Snapshot(at=at, queues=queues)
            for url in self.urls:
                try:
                    with urllib.request.urlopen(url, timeout=2.0) as resp:
                        text = resp.read().decode("utf-8", errors="replace")
                    snap.workers[url] = read_worker(url, text, at)
                except (OSError, ValueError) as e:
                    snap.errors[url] = str(e)[:200]
            return snap

        return await anyio.to_thread.run_sync(read)

    # -- what the views read ----------------------------------------------------
    def series(self, model: Optional[str] = None) -> list[dict]:
        """One point per pair of consecutive samples: backlog, throughput and TTFT."""
        snaps = list(self.ring)
        out = []
        for prev, cur in zip(snaps, snaps[1:]):
            dt = max(1e-6, cur.at - prev.at)
            for q in cur.queues:
                if model and q.model != model:
                    continue
                tokens = done = 0.0
                buckets: dict[float, float] = {}
                ttft_sum = ttft_n = 0.0
                for url, w in cur.workers.items():
                    p = prev.workers.get(url)
                    if w.model != q.model or p is None:
                        continue
                    # A restarted worker starts its counters at 0: count nothing for that step.
                    tokens += max(0.0, w.sample.generation_tokens - p.sample.generation_tokens)
                    done += max(0.0, w.done - p.done)
                    if w.ttft_count >= p.ttft_count:
                        for le, c in w.ttft_buckets.items():
                            buckets[le] = buckets.get(le, 0.0) + max(0.0, c - p.ttft_buckets.get(le, 0.0))
                        ttft_sum += w.ttft_sum - p.ttft_sum
                        ttft_n += w.ttft_count - p.ttft_count
                out.append({"at": round(cur.at, 3), "model": q.model, "waiting": q.waiting, "pending": q.pending,
                            "dlq": q.dlq, "workers_alive": q.workers_alive,
                            "tokens_per_s": round(tokens / dt, 2), "jobs_per_s": round(done / dt, 3),
                            "ttft_mean_s": round(ttft_sum / ttft_n, 4) if ttft_n else None,
                            "ttft_p50_s": _round(quantile(0.5, buckets)) if ttft_n else None,
                            "ttft_p90_s": _round(quantile(0.9, buckets)) if ttft_n else None})
        return out

    def worker_readings(self) -> dict[str, dict]:
        """The latest reading of each worker by its name, with the doctor's verdict
        over the last two samples (which engine limit binds)."""
        snaps = list(self.ring)
        if not snaps:
            return {}
        cur = snaps[-1]
        out: dict[str, dict] = {}
        for url, w in cur.workers.items():
            prev = next((s.workers[url] for s in reversed(snaps[:-1]) if url in s.workers), None)
            entry = {"metrics_url": url, "model": w.model, "running": w.sample.running,
                     "waiting_in_engine": w.sample.waiting, "in_flight": w.sample.in_flight,
                     "kv_cache_usage": round(w.sample.kv_usage, 4), "preemptions_kv": w.sample.preemptions,
                     "preemptions_priority": w.sample.priority_preemptions,
                     "config": {k: w.sample.config.get(k) for k in
                                ("max_num_seqs", "max_num_batched_tokens", "num_kv_blocks", "max_model_len",
                                 "attention_backend", "dtype")}}
            if prev is not None:
                report = diagnose(prev.sample, w.sample)
                entry["doctor"] = report.as_dict()
            out[w.worker or url] = entry
        for url, why in cur.errors.items():
            # Name it after the worker it last answered for (a killed worker keeps its row).
            known = next((s.workers[url] for s in reversed(snaps) if url in s.workers), None)
            name = known.worker if known is not None and known.worker else url
            out.setdefault(name, {"metrics_url": url, "model": known.model if known else None, "error": why})
        return out


def _round(v: Optional[float]) -> Optional[float]:
    return None if v is None else round(v, 4)
