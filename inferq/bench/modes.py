"""`inferq bench modes`: the seed's four batching modes on one mixed workload,
measured on the real engine in this process.

- NAIVE: one request at a time (max_num_seqs=1, whole prompts).
- STATIC: a batch is admitted only when the previous one has completely
  finished; whole prompts, and a token budget that prefills the whole batch in
  one step, as a padded batch would (without the padding's extra compute).
- CONTINUOUS: iteration-level admission, whole prompts (no chunked prefill),
  token budget >= the longest prompt.
- CONTINUOUS+CHUNKED: chunked prefill with a small token budget, so decodes
  share every step with at most one budget's worth of prefill.

The model and KV tensors are loaded once; each mode gets a fresh block manager
and scheduler built exactly as the engine builds its own. Also reported, from
the same traces: how much of the allocated KV memory holds no token under
paged allocation vs a contiguous per-request reservation.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import torch

from inferq.bench.metrics import percentile
from inferq.bench.mixed_workload import TimedRequest, mixed_workload
from inferq.bench.replay import Trace, replay

MODES = ("naive", "static", "continuous", "chunked")
LABELS = {"naive": "NAIVE", "static": "STATIC", "continuous": "CONTINUOUS", "chunked": "CONTINUOUS+CHUNKED"}


@dataclass
class ModeSpec:
    name: str
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked: bool
    static: bool = False


def mode_specs(max_num_seqs: int, budget: int, chunk_budget: int, static_batch: int, longest_prompt: int) -> dict[str, ModeSpec]:
    whole = max(budget, longest_prompt)  # without chunking a prompt must fit in one step
    return {
        "naive": ModeSpec("naive", 1, whole, chunked=False),
        "static": ModeSpec("static", static_batch, max(whole, static_batch * longest_prompt), chunked=False, static=True),
        "continuous": ModeSpec("continuous", max_num_seqs, whole, chunked=False),
        "chunked": ModeSpec("chunked", max_num_seqs, chunk_budget, chunked=True),
    }


def configure(engine, spec: ModeSpec) -> None:
    """Give the loaded engine a fresh, empty block manager and scheduler for this mode."""
    from inferq.gpuworker.engine.kv_cache_manager import KVCacheManager
    from inferq.gpuworker.engine.scheduler import Scheduler

    if engine.has_unfinished():
        raise RuntimeError("cannot switch modes with requests in flight")
    engine.kv = KVCacheManager(engine.kv.pool.num_blocks, engine.kv.block_size, enable_prefix_caching=False)
    engine.scheduler = Scheduler(engine.kv, max_num_seqs=spec.max_num_seqs,
                                 max_num_batched_tokens=spec.max_num_batched_tokens,
                                 policy="fcfs", enable_chunked_prefill=spec.chunked)


# -- summaries ---------------------------------------------------------------
def summarize_latency(trace: Trace) -> dict:
    reqs = list(trace.requests.values())
    ttfts = [r.ttft for r in reqs if r.ttft is not None]
    itls = [g for r in reqs for g in r.itls]
    out_tokens = sum(r.num_tokens for r in reqs)
    return {
        "wall_s": trace.wall_s,
        "steps": trace.steps,
        "output_tokens": out_tokens,
        "throughput_tok_s": out_tokens / trace.wall_s,
        "mean_ttft_ms": 1000 * statistics.fmean(ttfts) if ttfts else float("nan"),
        "median_ttft_ms": 1000 * percentile(ttfts, 50),
        "p99_ttft_ms": 1000 * percentile(ttfts, 99),
        "median_itl_ms": 1000 * percentile(itls, 50),
        "p99_itl_ms": 1000 * percentile(itls, 99),
        "max_itl_ms": 1000 * max(itls) if itls else float("nan"),
        "mean_step_tokens": statistics.fmean(trace.step_tokens) if trace.step_tokens else 0.0,
        "max_step_tokens": max(trace.step_tokens, default=0),
        "max_step_ms": 1000 * max(trace.step_seconds, default=0.0),
        "mean_step_seqs": statistics.fmean(trace.step_seqs) if trace.step_seqs else 0.0,
        # (tokens, ms, sequences) of every step: what one step costs as it grows.
        "steps_tokens_ms": [[n, round(1000 * s, 2), q] for n, s, q in
                            zip(trace.step_tokens, trace.step_seconds, trace.step_seqs)],
    }


def summarize_kv(trace: Trace, max_model_len: int) -> dict:
    """Fraction of reserved KV slots that hold no token, summed over all steps
    (token-weighted: every step's slots count once)."""
    tokens = sum(s.tokens for s in trace.kv)
    paged = sum(s.paged_slots for s in trace.kv)
    final = sum(s.final_len_slots for s in trace.kv)
    contiguous = sum(s.num_requests for s in trace.kv) * max_model_len

    def waste(slots: int) -> float:
        return 1.0 - tokens / slots if slots else float("nan")

    return {
        "samples": len(trace.kv),
        "max_requests_holding_blocks": max((s.num_requests for s in trace.kv), default=0),
        "paged_waste": waste(paged),
        "contiguous_final_len_waste": waste(final),
        "contiguous_max_model_len_waste": waste(contiguous),
        "max_model_len": max_model_len,
    }


# -- output --------------------------------------------------------------------
def markdown_table(results: dict[str, dict]) -> str:
    lines = ["| mode | throughput (out tok/s) | mean TTFT (ms) | p99 ITL (ms) | max ITL (ms) | median ITL (ms) | wall (s) "
             "| steps | max tokens/step |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in results.items():
        m = r["latency"]
        lines.append(f"| {LABELS[name]} | {m['throughput_tok_s']:.2f} | {m['mean_ttft_ms']:.0f} | {m['p99_itl_ms']:.0f} | "
                     f"{m['max_itl_ms']:.0f} | {m['median_itl_ms']:.0f} | {m['wall_s']:.1f} | {m['steps']} | "
                     f"{m['max_step_tokens']} |")
    return "\n".join(lines)


def step_cost_fit(results: dict[str, dict]) -> dict:
    """Least-squares line through every step of every mode: ms = fixed + per_token * tokens.
    On a CPU the per-token term dominates long prefills; chunking bounds it."""
    pts = [(p[0], p[1]) for r in results.values() for p in r["latency"]["steps_tokens_ms"]]
    if len(pts) < 2 or len({n for n, _ in pts}) < 2:
        return {"fixed_ms": float("nan"), "per_token_ms": float("nan"), "steps": len(pts)}
    mx = statistics.fmean(n for n, _ in pts)
    my = statistics.fmean(ms for _, ms in pts)
    slope = sum((n - mx) * (ms - my) for n, ms in pts) / sum((n - mx) ** 2 for n, _ in pts)
    decode_only = [ms for n, ms in pts if n <= 32]
    out = {"fixed_ms": my - slope * mx, "per_token_ms": slope, "steps": len(pts),
           "median_small_step_ms": statistics.median(decode_only) if decode_only else float("nan")}
    # With the number of sequences as a second term: per-sequence work (attention
    # over each one's context, sampling) that tokens alone do not capture.
    rows = [p for r in results.values() for p in r["latency"]["steps_tokens_ms"] if len(p) > 2]
    if len(rows) >= 3 and len({p[2] for p in rows}) > 1:
        a = torch.tensor([[1.0, p[0], p[2]] for p in rows], dtype=torch.float64)
        b = torch.tensor([[p[1]] for p in rows], dtype=torch.float64)
        coef = torch.linalg.lstsq(a, b).solution.flatten().tolist()
        out["with_seqs"] = {"fixed_ms": coef[0], "per_token_ms": coef[1], "per_seq_ms": coef[2]}
    return out


def kv_table(results: dict[str, dict]) -> str:
    any_r = next(iter(results.values()))["kv"]
    lines = [f"| mode | paged (block {{bs}}) | contiguous at prompt+max_tokens | contiguous at max_model_len ({any_r['max_model_len']}) |",
             "| --- | ---: | ---: | ---: |"]
    for name, r in results.items():
        k = r["kv"]
        lines.append(f"| {LABELS[name]} | {100 * k['paged_waste']:.1f}% | {100 * k['contiguous_final_len_waste']:.1f}% | "
                     f"{100 * k['contiguous_max_model_len_waste']:.1f}% |")
    return "\n".join(lines)


def modes_figure(results: dict[str, dict], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    labels = [LABELS[n].replace("+", "\n+") for n in names]
    colors = ["#8c8c8c", "#dd8452", "#4c72b0", "#55a868"][: len(names)]
    panels = [("throughput_tok_s", "output tokens/s (higher is better)"),
              ("mean_ttft_ms", "mean TTFT, ms (lower is better)")]
    fig, axes = plt.subplots(1, 5, figsize=(20, 4.2))
    for ax, (key, name) in zip(axes, panels):
        vals = [results[n]["latency"][key] for n in names]
        bars = ax.bar(labels, vals, color=colors)
        ax.bar_label(bars, fmt="%.0f" if max(vals) > 20 else "%.2f", fontsize=8)
        ax.set_title(name, fontsize=10)
        ax.tick_params(axis="x", labelsize=7)
    x = range(len(names))
    ax = axes[2]
    w = 0.4
    for i, (key, lab, alpha) in enumerate((("p99_itl_ms", "p99", 1.0), ("max_itl_ms", "max", 0.45))):
        bars = ax.bar([xi + (i - 0.5) * w for xi in x], [results[n]["latency"][key] for n in names], w,
                      color=colors, alpha=alpha, label=lab, edgecolor="k", linewidth=0.5)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_title("ITL p99 (solid) and max (pale), ms, log", fontsize=10)
    ax = axes[3]
    w = 0.27
    series = [("paged_waste", "paged", "#55a868"), ("contiguous_final_len_waste", "contig. prompt+max_tokens", "#dd8452"),
              ("contiguous_max_model_len_waste", "contig. max_model_len", "#c44e52")]
    for i, (key, lab, c) in enumerate(series):
        ax.bar([xi + (i - 1) * w for xi in x], [100 * results[n]["kv"][key] for n in names], w, label=lab, color=c)
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_ylim(0, 100)
    ax.set_title("KV slots holding no token, %", fontsize=10)
    ax.legend(fontsize=7, loc="center right")
    ax = axes[4]
    for n, c in zip(names, colors):
        pts = results[n]["latency"]["steps_tokens_ms"]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=10, color=c, alpha=0.7, label=LABELS[n])
    ax.set_xlabel("tokens in the step")
    ax.set_title("step time, ms, vs tokens in the step", fontsize=10)
    ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


# -- command -------------------------------------------------------------------
def _pair(text: str, name: str) -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name} takes MIN,MAX (two integers), not {text!r}") from None
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(f"{name} needs 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="inferq bench modes", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="HF folder or .gguf (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--short-input", type=lambda s: _pair(s, "--short-input"), default=(16, 64), metavar="MIN,MAX")
    p.add_argument("--long-input", type=lambda s: _pair(s, "--long-input"), default=(256, 512), metavar="MIN,MAX")
    p.add_argument("--long-fraction", type=float, default=0.25, help="share of requests with a long prompt")
    p.add_argument("--output", type=lambda s: _pair(s, "--output"), default=(8, 48), metavar="MIN,MAX",
                   help="output lengths (EOS ignored)")
    p.add_argument("--request-rate", type=float, default=2.0, help="Poisson arrivals per second (inf: all at once)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    p.add_argument("--max-num-seqs", type=int, default=32, help="CONTINUOUS modes")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="CONTINUOUS token budget (raised to the longest prompt if smaller)")
    p.add_argument("--chunk-budget", type=int, default=256, help="CONTINUOUS+CHUNKED token budget per step")
    p.add_argument("--static-batch-size", type=int, default=8)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--dtype", default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--figure", default=None, help="write the PNG chart here")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    bad = [m for m in args.modes.split(",") if m not in MODES]
    if bad or not args.modes:
        p.error(f"--modes: unknown {', '.join(bad) or '(empty)'}; choose from {', '.join(MODES)}")
    if args.threads < 1:
        p.error("--threads must be at least 1")
    return args


def run_modes(engine, workload: list[TimedRequest], specs: dict[str, ModeSpec], modes: list[str],
              static_batch: int, progress=None) -> dict[str, dict]:
    results = {}
    for name in modes:
        spec = specs[name]
        configure(engine, spec)
        tick = (lambda: progress.advance(name)) if progress is not None else None
        if progress is not None:
            progress.start(LABELS[name], len(workload))
        trace = replay(engine, workload, static=spec.static, static_batch=static_batch, on_request_done=tick)
        if progress is not None:
            progress.stop()
        engine.check_invariants()
        results[name] = {"spec": asdict(spec), "latency": summarize_latency(trace),
                         "kv": summarize_kv(trace, engine.model_config.max_model_len)}
    return results


class _Bar:
    """A rich progress bar per mode."""

    def __init__(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.p = Progress(TextColumn("{task.description:<20}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        self.task = None

    def start(self, label, total):
        if self.task is None:
            self.p.start()
        self.task = self.p.add_task(label, total=total)

    def advance(self, _name):
        self.p.update(self.task, advance=1)

    def stop(self):
        pass

    def close(self):
        if self.task is not None:
            self.p.stop()


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from inferq.gpuworker.engine.llm_engine import LLMEngine
    from inferq.gpuworker.config import EngineConfig

    # The cache must hold every request at its final length at once (no preemption
    # skews any mode), and without chunking the longest prompt must fit in one step.
    longest_prompt = args.long_input[1] if args.long_fraction > 0 else args.short_input[1]
    max_final = max(args.long_input[1], args.short_input[1]) + args.output[1]
    num_blocks = args.num_requests * -(-max_final // args.block_size) + 1
    budget = max(args.max_num_batched_tokens, longest_prompt, args.static_batch_size * longest_prompt)
    engine = LLMEngine(EngineConfig(
        model=args.model, dtype=args.dtype, device=args.device, block_size=args.block_size,
        num_kv_blocks=num_blocks, max_num_seqs=max(args.max_num_seqs, args.static_batch_size),
        max_num_batched_tokens=budget, enable_chunked_prefill=False, enable_prefix_caching=False))
    vocab = engine.model_config.vocab_size
    workload = mixed_workload(args.num_requests, short_input=args.short_input, long_input=args.long_input,
                              long_fraction=args.long_fraction, output=args.output, request_rate=args.request_rate,
                              vocab_size=vocab, seed=args.seed)
    too_long = [r.request_id for r in workload if r.final_len > engine.max_model_len]
    if too_long:
        print(f"error: {len(too_long)} requests exceed max_model_len {engine.max_model_len}; shorten --long-input/--output",
              file=sys.stderr)
        return 1
    longest = max(len(r.prompt_token_ids) for r in workload)
    specs = mode_specs(args.max_num_seqs, args.max_num_batched_tokens, args.chunk_budget, args.static_batch_size, longest)
    dtype = next(engine.model.parameters()).dtype
    n_long = sum(len(r.prompt_token_ids) >= args.long_input[0] for r in workload) if args.long_fraction else 0
    print(f"workload: {len(workload)} requests ({n_long} long), {sum(len(r.prompt_token_ids) for r in workload)} prompt "
          f"tokens, {sum(r.output_len for r in workload)} output tokens, Poisson {args.request_rate}/s over "
          f"{workload[-1].arrival_s:.1f} s; {engine.model_name} on {engine.device} {dtype}, {args.threads} torch threads",
          flush=True)

    # Warm-up: the first forwards pay one-off costs that must not land on the first mode.
    configure(engine, specs["continuous"])
    warm = mixed_workload(2, short_input=(8, 16), long_input=(8, 16), long_fraction=0, output=(2, 4),
                          request_rate=math.inf, vocab_size=vocab, seed=args.seed + 1)
    replay(engine, warm)

    modes = args.modes.split(",")
    bar = None if args.no_progress else _Bar()
    try:
        results = run_modes(engine, workload, specs, modes, args.static_batch_size, bar)
    finally:
        if bar is not None:
            bar.close()
    print()
    print(markdown_table(results))
    print()
    fit = step_cost_fit(results)
    print(f"step cost fit over {fit['steps']} steps: {fit['fixed_ms']:.0f} ms + {fit['per_token_ms']:.2f} ms/token "
          f"(median step with <= 32 tokens: {fit.get('median_small_step_ms', float('nan')):.0f} ms)")
    if "with_seqs" in fit:
        w = fit["with_seqs"]
        print(f"  with sequences: {w['fixed_ms']:.0f} ms + {w['per_token_ms']:.2f} ms/token + {w['per_seq_ms']:.1f} ms/sequence")
    print()
    print("KV slots allocated but holding no token (sampled after every step):")
    print(kv_table(results).replace("{bs}", str(args.block_size)))
    doc = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "device": str(engine.device),
                    "dtype": str(dtype), "torch_threads": args.threads, "torch": torch.__version__},
        "args": {k: v for k, v in vars(args).items()},
        "workload": {"requests": len(workload), "long": n_long,
                     "prompt_tokens": sum(len(r.prompt_token_ids) for r in workload),
                     "output_tokens": sum(r.output_len for r in workload),
                     "arrivals_s": [r.arrival_s for r in workload]},
        "results": results,
        "step_cost_fit": fit,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=2, default=str))
        print(f"result: {args.json}")
    if args.figure:
        title = (f"inferq bench modes: {len(workload)} mixed requests ({n_long} long), Poisson {args.request_rate}/s, "
                 f"{engine.model_name}, {engine.device} {dtype}, {args.threads} threads")
        print(f"figure: {modes_figure(results, Path(args.figure), title)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
