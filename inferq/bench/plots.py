"""The `bench serve` figure: latency distributions and throughput over time
(matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from inferq.bench.metrics import RequestRecord, throughput_timeline


def serve_figure(records: Sequence[RequestRecord], start: float, result: dict, path: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if r.success]
    series = {
        "TTFT": [r.ttft * 1000 for r in ok if r.ttft is not None],
        "TPOT": [r.tpot * 1000 for r in ok if r.tpot is not None],
        "ITL (pooled)": [g * 1000 for r in ok for g in r.itls],
        "E2E": [r.e2e * 1000 for r in ok if r.e2e is not None],
    }
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    for ax, (name, vals) in zip(axes.flat, series.items()):
        if vals:
            ax.hist(vals, bins=min(40, max(5, len(vals) // 3)), color="#4c72b0", alpha=0.85)
            key = {"TTFT": "ttft_ms", "TPOT": "tpot_ms", "ITL (pooled)": "itl_ms", "E2E": "e2e_ms"}[name]
            med, p99 = result[key]["median"], result[key]["p99"]
            ax.axvline(med, color="k", ls="--", lw=1, label=f"median {med:.1f}")
            ax.axvline(p99, color="#c44e52", ls=":", lw=1.5, label=f"p99 {p99:.1f}")
            ax.legend(fontsize=8)
        ax.set_title(f"{name} (ms)", fontsize=10)
        ax.set_ylabel("count")

    ax = axes.flat[4]
    xs, ys = throughput_timeline(records, start, bin_s=max(0.5, result["duration_s"] / 40))
    ax.plot(xs, ys, color="#55a868")
    ax.axhline(result["output_throughput"], color="k", ls="--", lw=1,
               label=f"mean {result['output_throughput']:.1f} tok/s")
    ax.set_title("output tokens/s over time", fontsize=10)
    ax.set_xlabel("seconds since start")
    ax.legend(fontsize=8)

    ax = axes.flat[5]
    events = sorted([(r.sent_at - start, 1) for r in records] +
                    [((r.chunk_times[-1] if r.chunk_times else r.sent_at) - start, -1) for r in records])
    t, level, tx, ly = 0.0, 0, [0.0], [0]
    for t, d in events:
        tx.append(t), ly.append(level)
        level += d
        tx.append(t), ly.append(level)
    ax.plot(tx, ly, color="#8172b2")
    ax.set_title("requests in flight", fontsize=10)
    ax.set_xlabel("seconds since start")

    fig.suptitle(title or f"inferq bench serve: {result['completed']} ok, {result['failed']} failed, "
                 f"{result['output_throughput']:.1f} output tok/s", fontsize=11)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
