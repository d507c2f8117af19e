"""The `inferq` command line: argument parsing and dispatch only.

Each command's work lives next to what it drives (inferq.up, inferq.doctor,
inferq.cli_jobs, inferq.cli_queue, inferq.producer.gateway.cli). Heavy imports (torch, the worker,
uvicorn) happen inside the command that needs them.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def _add_job_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")
    so = p.add_mutually_exclusive_group()
    so.add_argument("--json-schema", metavar="FILE", default=None,
                    help="the output must be JSON valid against this JSON Schema file ('-' reads stdin)")
    so.add_argument("--json-object", action="store_true", help="the output must be a JSON object")
    so.add_argument("--regex", default=None, help="the output must match this regular expression")
    so.add_argument("--choice", action="append", default=None, help="the output must be one of these (repeatable)")
    so.add_argument("--grammar", metavar="FILE", default=None, help="the output must follow this Lark grammar file")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferq", description="Queue-driven LLM generation service.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    up = sub.add_parser("up", help="start Redis (if needed), a worker and the gateway; Ctrl-C stops all")
    up.add_argument("--host", default="127.0.0.1", help="gateway bind address")
    up.add_argument("--port", type=int, default=None, help="gateway port (default 8000, or a free one)")
    up.add_argument("--model", default=None, help="HF folder or .gguf file (default: bundled SmolLM2-135M-Instruct)")
    up.add_argument("--served-model-name", default=None, help="queue/model name (default: from --model)")
    up.add_argument("--device", default=None, help="cuda or cpu (default: GPU if present)")
    up.add_argument("--data-dir", default=".inferq", help="where the embedded Redis keeps its data and logs")
    up.add_argument("--redis-port", type=int, default=None, help="embedded Redis port (default 6379, or a free one)")
    up.add_argument("--metrics-port", type=int, default=None, help="worker metrics port (default 9400, or a free one)")
    up.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for the worker")
    up.add_argument("--api-keys", default=None, help="gateway API keys (key or key:tenant, comma-separated)")
    up.add_argument("--worker-arg", action="append", default=[], metavar="ARG",
                    help="extra argument passed to the worker (repeatable), e.g. --worker-arg=--max-num-seqs=32")

    w = sub.add_parser("worker", help="run a GPU/CPU worker (all arguments go to the worker)", add_help=False)
    w.add_argument("args", nargs=argparse.REMAINDER)

    from inferq.producer.gateway.cli import add_arguments as add_gateway_arguments

    add_gateway_arguments(sub.add_parser("gateway", help="run the OpenAI-compatible HTTP gateway"))

    s = sub.add_parser("submit", help="submit a job and print its text as it streams")
    s.add_argument("prompt")
    s.add_argument("--chat", action="store_true", help="send the prompt as a user chat message (chat template)")
    s.add_argument("--system", default=None, help="system message (implies --chat)")
    s.add_argument("--model", default=None)
    s.add_argument("--priority", type=int, default=0)
    s.add_argument("--timeout", type=float, default=None, help="give up waiting after this many seconds")
    s.add_argument("--detach", action="store_true", help="print the job id and return at once")
    _add_job_sampling(s)

    st = sub.add_parser("stream", help="follow a job's output (resumable)")
    st.add_argument("job_id")
    st.add_argument("--from", dest="last_id", default="0-0", help="resume after this reply entry id")
    st.add_argument("--events", action="store_true", help="print every event as JSON instead of text")

    c = sub.add_parser("cancel", help="cancel a job")
    c.add_argument("job_id")

    stat = sub.add_parser("status", help="queue depth, lag, pending, DLQ and workers per model")
    stat.add_argument("--json", action="store_true")

    d = sub.add_parser("dlq", help="inspect and act on dead-lettered jobs")
    dsub = d.add_subparsers(dest="dlq_command", metavar="ACTION")
    dl = dsub.add_parser("list", help="show DLQ entries")
    dl.add_argument("--model", default=None)
    dl.add_argument("--count", type=int, default=50)
    dl.add_argument("--json", action="store_true")
    dr = dsub.add_parser("retry", help="put DLQ entries back on the job stream")
    dr.add_argument("entry_ids", nargs="*", help="DLQ entry ids (default: all with --all)")
    dr.add_argument("--all", action="store_true")
    dr.add_argument("--model", default=None)
    dp = dsub.add_parser("purge", help="delete DLQ entries")
    dp.add_argument("--model", default=None)
    dp.add_argument("--yes", action="store_true", help="do not ask")

    doc = sub.add_parser("doctor", help="read a worker's metrics and say which limit is the bottleneck")
    doc.add_argument("--metrics-url", default=None, help="default: $INFERQ_METRICS_URL or http://127.0.0.1:9400/metrics")
    doc.add_argument("--interval", type=float, default=5.0, help="seconds between the two samples")
    doc.add_argument("--json", action="store_true")

    from inferq.cli_batch import add_arguments as add_batch_arguments

    add_batch_arguments(sub.add_parser("batch", help="OpenAI Batch API of a gateway: submit, status, download, cancel"))

    # Listed for --help only: main() hands `bench ...` to inferq.bench.cli untouched.
    sub.add_parser("bench", help="benchmarks: serve (load-test a running inferq), offline, ... "
                   "(`inferq bench --help` lists them)", add_help=False)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `inferq worker ...` passes everything through untouched (incl. --help).
    if argv and argv[0] == "worker":
        from inferq.cli_jobs import run_worker

        return run_worker(argv[1:])
    # `inferq bench COMMAND ...` has its own dispatch (each benchmark parses its own arguments).
    if argv and argv[0] == "bench":
        from inferq.bench.cli import main as bench_main

        return bench_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return _dispatch(args, parser)
    except KeyboardInterrupt:
        return 130


def _dispatch(args, parser) -> int:
    cmd = args.command
    if cmd == "up":
        from inferq.up import UpOptions, run_up

        return run_up(UpOptions.from_args(args))
    if cmd == "gateway":
        from inferq.producer.gateway.cli import run as run_gateway

        return run_gateway(args)
    if cmd in ("submit", "stream", "cancel"):
        from inferq import cli_jobs

        return getattr(cli_jobs, f"cmd_{cmd}")(args)
    if cmd in ("status", "dlq"):
        from inferq import cli_queue

        if cmd == "dlq" and not args.dlq_command:
            parser.parse_args(["dlq", "--help"])
        return getattr(cli_queue, f"cmd_{cmd}")(args)
    if cmd == "batch":
        from inferq.cli_batch import cmd_batch

        return cmd_batch(args)
    if cmd == "doctor":
        from inferq.doctor import cmd_doctor

        return cmd_doctor(args)
    parser.error(f"unknown command {cmd}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
