"""`inferq bench COMMAND`: argument parsing and dispatch.

`serve` is client-side (no torch) and parsed here. Every other command runs
``inferq.bench.<module>.main(argv)``, imported only then (inferq.bench.commands
lists them), so `inferq bench --help` stays light.
"""
from __future__ import annotations

import argparse
import importlib
import math
import sys
from pathlib import Path
from typing import Optional, Sequence

from inferq.bench.commands import BENCHMARKS, GROUPS, module_of


def usage() -> str:
    width = max(map(len, BENCHMARKS)) + 2
    lines = ["usage: inferq bench COMMAND [options]"]
    for group, commands in GROUPS.items():
        lines += ["", f"{group}:"] + [f"  {name:<{width}}{line}" for name, line in commands.items()]
    return "\n".join(lines + ["", "`inferq bench COMMAND --help` shows each command's options."])


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="inferq bench serve",
                                description="Load-test a running inferq the way `vllm bench serve` does.")
    g = p.add_argument_group("target")
    g.add_argument("--backend", choices=("redis", "http"), default="redis",
                   help="redis: producer SDK on the job streams; http: the gateway's /v1/completions")
    g.add_argument("--redis-url", default=None, help="default $INFERQ_REDIS_URL or redis://127.0.0.1:6379/0")
    g.add_argument("--base-url", default="http://127.0.0.1:8000", help="gateway URL (http backend)")
    g.add_argument("--api-key", default=None, help="gateway API key (http backend)")
    g.add_argument("--model", default=None, help="served model name (default: the SDK default / the gateway's first)")
    g.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")

    d = p.add_argument_group("dataset")
    d.add_argument("--dataset", choices=("random", "shared-prefix", "jsonl"), default="random")
    d.add_argument("--dataset-path", default=None, help="JSONL file: {prompt|prompt_token_ids, max_tokens}")
    d.add_argument("--num-prompts", type=int, default=100)
    d.add_argument("--random-input-len", type=int, default=256)
    d.add_argument("--random-output-len", type=int, default=64)
    d.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="lengths uniform in [len*(1-r), len*(1+r)]")
    d.add_argument("--prefix-len", type=int, default=256, help="shared-prefix: tokens in each shared prefix")
    d.add_argument("--num-prefixes", type=int, default=4, help="shared-prefix: distinct prefixes")
    d.add_argument("--suffix-len", type=int, default=32, help="shared-prefix: each request's own tokens")
    d.add_argument("--output-len", type=int, default=None, help="shared-prefix/jsonl: tokens to generate "
                   "(default --random-output-len)")
    d.add_argument("--vocab-size", type=int, default=49152, help="random token ids are drawn below this")

    a = p.add_argument_group("load")
    a.add_argument("--request-rate", type=float, default=math.inf, help="requests/s (default inf: all at once)")
    a.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps: 1 = Poisson")
    a.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight")
    a.add_argument("--num-warmups", type=int, default=2, help="unmeasured requests sent first")
    a.add_argument("--seed", type=int, default=0)

    o = p.add_argument_group("output")
    o.add_argument("--percentiles", default="99", help="comma list of percentiles to report, e.g. 50,90,99")
    o.add_argument("--goodput", nargs="+", default=None, metavar="NAME:MS",
                   help="SLOs for goodput, e.g. ttft:500 tpot:50 e2e:5000 (or comma-separated)")
    o.add_argument("--result-file", default=None, help="JSON result (default bench-serve-<time>.json)")
    o.add_argument("--figure", default=None, help="PNG figure (default: next to the JSON result)")
    o.add_argument("--no-figure", action="store_true")
    o.add_argument("--no-progress", action="store_true")
    return p


def _percentiles(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--percentiles takes numbers like 50,90,99, not {text!r}") from None
    if any(not 0 <= v <= 100 for v in vals):
        raise ValueError("--percentiles must lie in [0, 100]")
    return vals


def build_dataset(args):
    from inferq.bench import datasets

    out_len = args.output_len or args.random_output_len
    if args.num_prompts < 1:
        raise ValueError("--num-prompts must be at least 1")
    if args.dataset == "random":
        return datasets.random_dataset(args.num_prompts, args.random_input_len, args.random_output_len,
                                       args.random_range_ratio, args.vocab_size, args.seed)
    if args.dataset == "shared-prefix":
        return datasets.shared_prefix_dataset(args.num_prompts, args.num_prefixes, args.prefix_len,
                                              args.suffix_len, out_len, args.vocab_size, args.seed)
    if not args.dataset_path:
        raise ValueError("--dataset jsonl needs --dataset-path FILE")
    return datasets.jsonl_dataset(args.dataset_path, args.num_prompts, out_len)


def cmd_serve(argv: Sequence[str]) -> int:
    from rich.console import Console

    from inferq.bench import serve
    from inferq.bench.metrics import parse_goodput

    args = serve_parser().parse_args(list(argv))
    err = Console(stderr=True)
    try:
        pcts = _percentiles(args.percentiles)
        slos = parse_goodput(args.goodput)
        requests = build_dataset(args)
        if args.max_concurrency is not None and args.max_concurrency < 1:
            raise ValueError("--max-concurrency must be at least 1")
        if args.num_warmups < 0:
            raise ValueError("--num-warmups cannot be negative")
        if args.backend == "redis":
            from inferq.bench.backends import RedisBackend

            backend = RedisBackend(args.redis_url, args.model, args.timeout)
        else:
            from inferq.bench.backends import HTTPBackend

            backend = HTTPBackend(args.base_url, args.model, args.timeout, args.api_key)
        result, records, start = serve.run(
            backend, requests, request_rate=args.request_rate, burstiness=args.burstiness,
            max_concurrency=args.max_concurrency, num_warmups=args.num_warmups, percentiles=pcts,
            slos=slos, seed=args.seed, progress=not args.no_progress, console=err)
    except (ValueError, RuntimeError, OSError) as e:
        err.print(f"[red]error:[/red] {e}")
        return 1
    print(serve.format_summary(result))
    from datetime import datetime

    path = Path(args.result_file or f"bench-serve-{datetime.now():%Y%m%d-%H%M%S}.json")
    config = {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in vars(args).items()}
    config["request_rate"] = "inf" if math.isinf(args.request_rate) else args.request_rate
    config["model"] = backend.model
    serve.write_json(path, serve.result_document(result, records, start, config))
    print(f"result: {path}")
    if not args.no_figure:
        from inferq.bench.plots import serve_figure

        fig = serve_figure(records, start, result, Path(args.figure or path.with_suffix(".png")),
                           title=f"inferq bench serve ({args.backend}, {backend.model}): {result['completed']} ok, "
                                 f"{result['failed']} failed, {result['output_throughput']:.1f} output tok/s")
        print(f"figure: {fig}")
    return 0 if result["completed"] else 1


def run_module(name: str, argv: Sequence[str]) -> int:
    """`inferq bench NAME`: the main(argv) of its module, imported now."""
    try:
        main = importlib.import_module(module_of(name)).main
    except ImportError as e:
        print(f"error: `inferq bench {name}` cannot import {module_of(name)} ({e}); the engine benchmarks "
              f"need the worker extra (torch etc.)", file=sys.stderr)
        return 1
    return int(main(list(argv)) or 0)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"inferq bench: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return cmd_serve(rest) if name == "serve" else run_module(name, rest)


if __name__ == "__main__":
    sys.exit(main())
