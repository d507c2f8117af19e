"""`inferq doctor`: read a running worker's /metrics twice and say which limit
is the bottleneck, and what to change (the reading itself: producer/engine_limits.py).
"""
from __future__ import annotations

import json
import os
import time
import urllib.request

from inferq.producer.engine_limits import Finding, Report, Sample, diagnose, parse_metrics  # noqa: F401 (re-exported)


def fetch(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read().decode("utf-8", errors="replace")


def default_url() -> str:
    return os.environ.get("INFERQ_METRICS_URL") or \
        f"http://127.0.0.1:{os.environ.get('INFERQ_METRICS_PORT', '9400')}/metrics"


def cmd_doctor(args) -> int:
    from rich.table import Table

    from inferq.cli_common import err, out

    url = args.metrics_url or default_url()
    try:
        with err.status(f"reading {url} twice, {args.interval:g}s apart…"):
            before = Sample.from_text(fetch(url))
            time.sleep(max(0.0, args.interval))
            after = Sample.from_text(fetch(url))
    except (OSError, ValueError) as e:
        err.print(f"[red]error:[/red] cannot read worker metrics at {url}: {e}\n"
                  "Pass --metrics-url http://HOST:PORT/metrics (the worker's --metrics-port).")
        return 1
    report = diagnose(before, after)
    redis_advice = redis_warnings()
    if args.json:
        out.print(json.dumps({**report.as_dict(), "redis_warnings": redis_advice}, indent=2), markup=False)
        return 0
    t = Table(title=f"worker at {url}")
    t.add_column("reading")
    t.add_column("value", justify="right")
    for k, v in report.readings.items():
        t.add_row(k, "-" if v is None else str(v))
    out.print(t)
    for f in report.findings:
        colour = "green" if f.limit == "none" else "yellow"
        out.print(f"[bold {colour}]{f.summary}[/bold {colour}]\n  → {f.advice}")
    for w in redis_advice:
        out.print(f"[bold yellow]Redis:[/bold yellow] {w}")
    return 0


def redis_warnings() -> list[str]:
    """The queue's Redis (INFERQ_REDIS_URL, or the master the sentinels name)
    checked for eviction, persistence and the replicas WAIT asks for."""
    from inferq.schemas.redis_checks import queue_warnings, replication_warnings
    from inferq.schemas.connection import sync_client
    from inferq.producer.settings import ProducerSettings

    s = ProducerSettings()
    r = sync_client(s)  # in sentinel mode: the current master
    try:
        return queue_warnings(r) + replication_warnings(r, s.admission_replicas)
    except Exception as e:
        return [f"cannot reach Redis to check its configuration: {e}"]
    finally:
        r.close()
