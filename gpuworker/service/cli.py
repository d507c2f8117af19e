"""``python -m gpuworker.service`` / ``inferq worker``: flags override INFERQ_* env."""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from pydantic import ValidationError

FLAGS = [
    # (flag, settings field, type, help)
    ("--redis-url", "redis_url", str, "redis://[user:pass@]host:port/db or rediss:// (env INFERQ_REDIS_URL)"),
    ("--model", "model", str, "HF folder or .gguf file; empty for the bundled SmolLM2-135M-Instruct"),
    ("--served-model-name", "served_model_name", str, "queue/model name jobs use"),
    ("--attention-backend", "attention_backend", str, "torch | triton (default: triton on CUDA, torch on CPU)"),
    ("--max-num-seqs", "max_num_seqs", int, "most jobs in the engine at once (also the intake capacity)"),
    ("--max-num-batched-tokens", "max_num_batched_tokens", int, "token budget of one engine step"),
    ("--num-kv-blocks", "num_kv_blocks", int, "KV cache blocks (default: sized from memory)"),
    ("--block-size", "block_size", int, "tokens per KV block"),
    ("--max-model-len", "max_model_len", int, "cap on prompt + output tokens"),
    ("--device", "device", str, "cpu | cuda | cuda:N"),
    ("--dtype", "dtype", str, "auto (bfloat16 on CUDA or a CPU with AVX512-BF16/AMX, else float32) | float32 | bfloat16 | float16"),
    ("--metrics-port", "metrics_port", int, "Prometheus port (0 = off)"),
    ("--lease-seconds", "lease_seconds", float, "lease length; dead workers' jobs are reclaimed after 3 leases"),
    ("--max-deliveries", "max_deliveries", int, "deliveries before a job goes to the DLQ"),
    ("--drain-timeout", "drain_timeout", float, "seconds to finish in-flight jobs on SIGTERM"),
    ("--worker-id", "worker_id", str, "stable consumer name (default host-pid)"),
    ("--reply-ttl", "reply_ttl", int, "seconds a reply stream lives after done/error"),
    ("--reply-maxlen", "reply_maxlen", int, "approximate bound on entries per reply stream"),
    ("--block-ms", "block_ms", int, "XREADGROUP BLOCK in ms"),
    ("--log-level", "log_level", str, "debug | info | warning | error"),
]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="inferq worker", description="Run an inferq GPU worker on a Redis job stream.")
    for flag, dest, typ, help_ in FLAGS:
        p.add_argument(flag, dest=dest, type=typ, default=None, help=help_)
    p.add_argument("--coalesce-deltas", dest="coalesce_deltas", action=argparse.BooleanOptionalAction, default=None,
                   help="merge a job's deltas within one publish round trip (large batches)")
    p.add_argument("--check-invariants", dest="check_invariants", action=argparse.BooleanOptionalAction,
                   default=None, help="verify the KV block pool after aborts and when idle (debugging)")
    p.add_argument("--log-json", dest="log_json", action=argparse.BooleanOptionalAction, default=None,
                   help="JSON log lines (default) or console")
    p.add_argument("--log-prompts", dest="log_prompts", action=argparse.BooleanOptionalAction, default=None,
                   help="include prompts in logs (off by default)")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    from gpuworker.logging import configure
    from gpuworker.service.settings import WorkerSettings

    given = {k: v for k, v in vars(args).items() if v is not None}
    try:
        settings = WorkerSettings(**given)
    except ValidationError as e:
        print(f"inferq worker: invalid configuration:\n{e}", file=sys.stderr)
        return 2
    configure(settings.log_level, settings.log_json)
    from gpuworker.service.worker import Worker

    import redis

    worker = Worker(settings)
    try:
        return worker.run()
    except redis.AuthenticationError as e:
        print(f"inferq worker: Redis refused the credentials ({e}); check INFERQ_REDIS_URL / INFERQ_REDIS_PASSWORD",
              file=sys.stderr)
        return 1
    except redis.ConnectionError as e:
        print(f"inferq worker: cannot reach Redis at {settings.safe_dump()['redis_url']}: {e}", file=sys.stderr)
        return 1
