"""Latency and throughput arithmetic of one benchmark run, as `vllm bench serve`
defines it (see shared/REFERENCES.md):

- TTFT  = request sent -> first content chunk
- ITL   = gaps between successive chunks, pooled over all requests
- TPOT  = (E2E - TTFT) / (output tokens - 1), one value per request with > 1 token
- E2E   = request sent -> last chunk
- goodput = requests per second that met every given SLO

Times are seconds on one monotonic clock; reported latencies are milliseconds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

SLO_NAMES = ("ttft", "tpot", "e2e")


@dataclass
class RequestRecord:
    """What the client saw of one request."""

    sent_at: float
    chunk_times: list[float] = field(default_factory=list)  # arrival of each content chunk
    prompt_tokens: int = 0
    output_tokens: int = 0
    success: bool = False
    error: str = ""

    @property
    def ttft(self) -> Optional[float]:
        return self.chunk_times[0] - self.sent_at if self.chunk_times else None

    @property
    def e2e(self) -> Optional[float]:
        return self.chunk_times[-1] - self.sent_at if self.chunk_times else None

    @property
    def itls(self) -> list[float]:
        c = self.chunk_times
        return [b - a for a, b in zip(c, c[1:])]

    @property
    def tpot(self) -> Optional[float]:
        if self.output_tokens < 2 or not self.chunk_times:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    if not values:
        return float("nan")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(values_s: Sequence[float], percentiles: Sequence[float]) -> dict:
    """mean, median, std and the asked percentiles, in milliseconds."""
    ms = [v * 1000.0 for v in values_s]
    if not ms:
        out = {"mean": float("nan"), "median": float("nan"), "std": float("nan")}
    else:
        mean = sum(ms) / len(ms)
        out = {"mean": mean, "median": percentile(ms, 50),
               "std": math.sqrt(sum((v - mean) ** 2 for v in ms) / len(ms))}
    for q in percentiles:
        out[f"p{q:g}"] = percentile(ms, q)
    return out


def parse_goodput(spec: Optional[Sequence[str]]) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` or ``"ttft:500,tpot:50"`` -> {"ttft": 0.5, "tpot": 0.05} (seconds)."""
    if not spec:
        return {}
    if isinstance(spec, str):
        spec = [spec]
    slos: dict[str, float] = {}
    for item in ",".join(spec).split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition(":")
        name = name.strip().lower()
        if not sep or name not in SLO_NAMES:
            raise ValueError(f"bad goodput SLO {item!r}: use name:milliseconds with name in {', '.join(SLO_NAMES)}")
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"bad goodput SLO {item!r}: {value!r} is not a number of milliseconds") from None
        if ms <= 0:
            raise ValueError(f"bad goodput SLO {item!r}: the limit must be positive")
        slos[name] = ms / 1000.0
    return slos


def meets_slos(rec: RequestRecord, slos: dict[str, float]) -> bool:
    if not rec.success:
        return False
    for name, limit in slos.items():
        value = getattr(rec, name)
        # A one-token output has no TPOT: nothing to violate.
        if value is not None and value > limit:
            return False
    return True


def compute_metrics(
    records: Sequence[RequestRecord],
    duration_s: float,
    percentiles: Sequence[float] = (99,),
    slos: Optional[dict[str, float]] = None,
) -> dict:
    """The benchmark's summary: counts, throughputs and latency statistics."""
    if duration_s <= 0:
        raise ValueError("duration must be positive")
    pcts = sorted(set([50, 99, *percentiles]))
    ok = [r for r in records if r.success]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    e2es = [r.e2e for r in ok if r.e2e is not None]
    tpots = [r.tpot for r in ok if r.tpot is not None]
    itls = [g for r in ok for g in r.itls]
    result = {
        "duration_s": duration_s,
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration_s,
        "output_throughput": out_tokens / duration_s,
        "total_token_throughput": (in_tokens + out_tokens) / duration_s,
        "ttft_ms": summarize(ttfts, pcts),
        "tpot_ms": summarize(tpots, pcts),
        "itl_ms": summarize(itls, pcts),
        "e2e_ms": summarize(e2es, pcts),
        "errors": sorted({r.error for r in records if not r.success and r.error}),
    }
    if slos:
        good = sum(1 for r in ok if meets_slos(r, slos))
        result["slos_ms"] = {k: v * 1000.0 for k, v in slos.items()}
        result["good_requests"] = good
        result["goodput"] = good / duration_s
    return result


def throughput_timeline(records: Sequence[RequestRecord], start: float, bin_s: float = 1.0) -> tuple[list[float], list[float]]:
    """Output tokens per second in fixed bins, by chunk arrival. Each chunk's
    tokens are spread evenly over the request's chunks (the client sees chunks,
    the server reports the token total)."""
    if bin_s <= 0:
        raise ValueError("bin width must be positive")
    counts: dict[int, float] = {}
    last = 0
    for r in records:
        if not r.success or not r.chunk_times:
            continue
        per_chunk = r.output_tokens / len(r.chunk_times)
        for t in r.chunk_times:
            b = int((t - start) // bin_s)
            counts[b] = counts.get(b, 0.0) + per_chunk
            last = max(last, b)
    if not counts:
        return [], []
    xs = [(b + 0.5) * bin_s for b in range(last + 1)]
    ys = [counts.get(b, 0.0) / bin_s for b in range(last + 1)]
    return xs, ys
