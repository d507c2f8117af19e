"""The `inferq bench serve` run: warm up, send the dataset on its arrival
schedule (bounded by max concurrency), collect what each request saw, then
summarise, print, and write the JSON result and the figure."""
from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Sequence

from inferq.bench.arrivals import arrival_offsets
from inferq.bench.datasets import BenchRequest
from inferq.bench.metrics import RequestRecord, compute_metrics


async def run_schedule(backend, requests: Sequence[BenchRequest], offsets: Sequence[float],
                       max_concurrency: Optional[int] = None, on_done=None) -> tuple[list[RequestRecord], float, float]:
    """Send request i at ``start + offsets[i]`` (later if max_concurrency is
    reached). Returns the records in dataset order, the start and the duration."""
    if len(requests) != len(offsets):
        raise ValueError("one arrival offset per request")
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    start = time.perf_counter()

    async def one(req: BenchRequest, at: float) -> RequestRecord:
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if sem is None:
            rec = await backend.send(req)
        else:
            async with sem:
                rec = await backend.send(req)
        if on_done is not None:
            on_done(rec)
        return rec

    records = await asyncio.gather(*(one(r, t) for r, t in zip(requests, offsets)))
    return list(records), start, time.perf_counter() - start


async def warm_up(backend, requests: Sequence[BenchRequest], n: int) -> int:
    """Send ``n`` requests (copies of the first ones, short outputs) and wait for
    them; not measured. Returns how many succeeded."""
    if n <= 0:
        return 0
    picks = [BenchRequest(r.prompt, min(r.output_len, 8), r.prompt_len) for r in requests[:n]]
    while len(picks) < n:
        picks.append(picks[len(picks) % len(requests)])
    recs = await asyncio.gather(*(backend.send(r) for r in picks))
    return sum(r.success for r in recs)


def run(backend, requests: list[BenchRequest], *, request_rate: float, burstiness: float,
        max_concurrency: Optional[int], num_warmups: int, percentiles: Sequence[float],
        slos: dict, seed: int, progress: bool = True, console=None) -> tuple[dict, list[RequestRecord], float]:
    offsets = arrival_offsets(len(requests), request_rate, burstiness, seed)

    async def main():
        try:
            await backend.check()
            if num_warmups:
                ok = await warm_up(backend, requests, num_warmups)
                if ok < num_warmups and console is not None:
                    console.print(f"[yellow]warm-up: {num_warmups - ok} of {num_warmups} requests failed[/yellow]")
            if progress:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

                with Progress(TextColumn("[bold]bench serve"), BarColumn(), MofNCompleteColumn(),
                              TextColumn("failed {task.fields[failed]}"), TimeElapsedColumn(),
                              console=console, transient=False) as bar:
                    task = bar.add_task("requests", total=len(requests), failed=0)
                    failed = 0

                    def done(rec: RequestRecord) -> None:
                        nonlocal failed
                        failed += not rec.success
                        bar.update(task, advance=1, failed=failed)

                    return await run_schedule(backend, requests, offsets, max_concurrency, done)
            return await run_schedule(backend, requests, offsets, max_concurrency)
        finally:
            await backend.close()

    records, start, duration = asyncio.run(main())
    result = compute_metrics(records, duration, percentiles, slos)
    return result, records, start


def result_document(result: dict, records: list[RequestRecord], start: float, config: dict) -> dict:
    """The JSON file: the configuration, the summary, and every request's timings
    (relative to the run start) so any other statistic can be recomputed."""
    per_request = []
    for r in records:
        d = asdict(r)
        d["sent_at"] = r.sent_at - start
        d["chunk_times"] = [t - start for t in r.chunk_times]
        per_request.append(d)
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": config,
        "summary": result,
        "requests": per_request,
    }


def format_summary(result: dict, title: str = "Serving benchmark result") -> str:
    lines = [f"{'=' * 20} {title} {'=' * 20}"]

    def row(label, value):
        lines.append(f"{label:<42}{value:>14}")

    row("Successful requests:", result["completed"])
    row("Failed requests:", result["failed"])
    row("Benchmark duration (s):", f"{result['duration_s']:.2f}")
    row("Total input tokens:", result["total_input_tokens"])
    row("Total generated tokens:", result["total_output_tokens"])
    row("Request throughput (req/s):", f"{result['request_throughput']:.2f}")
    if "goodput" in result:
        row("Request goodput (req/s):", f"{result['goodput']:.2f}")
    row("Output token throughput (tok/s):", f"{result['output_throughput']:.2f}")
    row("Total token throughput (tok/s):", f"{result['total_token_throughput']:.2f}")
    for key, name in (("ttft_ms", "Time to First Token"), ("tpot_ms", "Time per Output Token (excl. 1st token)"),
                      ("itl_ms", "Inter-token Latency"), ("e2e_ms", "End-to-end Latency")):
        lines.append(f"{'-' * 15}{name}{'-' * 15}")
        stats = result[key]
        short = key.split("_")[0].upper()
        row(f"Mean {short} (ms):", _fmt(stats["mean"]))
        row(f"Median {short} (ms):", _fmt(stats["median"]))
        for k, v in stats.items():
            if k.startswith("p") and k != "p50":
                row(f"P{k[1:]} {short} (ms):", _fmt(v))
    if result.get("errors"):
        lines.append("Errors: " + "; ".join(result["errors"][:5]))
    lines.append("=" * (42 + len(title)))
    return "\n".join(lines)


def _fmt(v: float) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # NaN is not JSON: write null instead.
    def clean(o):
        if isinstance(o, float) and math.isnan(o):
            return None
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items()}
        if isinstance(o, list):
            return [clean(v) for v in o]
        return o

    path.write_text(json.dumps(clean(doc), indent=2))
