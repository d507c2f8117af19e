"""Gateway (OpenAI HTTP) vs SDK (Redis) on one `inferq up`, the gateway issue's serving
workload (64 prompts of 128 random token ids, 64 out, 4 req/s): 6 runs alternating
gateway, SDK, ..., a fresh dataset file per run so no run hits the prefix cache another
run filled.

    inferq bench gateway-vs-sdk [OUT]        (default bench-gateway-vs-sdk)

`inferq up` (OMP_NUM_THREADS=1, served as smollm2) listens on fixed ports, gateway 8131,
Redis 6391, metrics 9431, with its data in /tmp/gwdata, wiped first; its log is
OUT/up.log. Each run leaves OUT/ds-K.jsonl, OUT/NAME-K.json and OUT/NAME-K.txt.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from inferq.bench.serve_runs import bench_serve, summary_value, wait_http

SERVED = "smollm2"


def write_dataset(path: Path, seed: int, prompts: int = 64, input_len: int = 128, output_len: int = 64) -> Path:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(prompts):
            ids = [rng.randint(1000, 49151) for _ in range(input_len)]
            f.write(json.dumps({"prompt_token_ids": ids, "max_tokens": output_len}) + "\n")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="inferq bench gateway-vs-sdk", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default="bench-gateway-vs-sdk", help="result folder")
    ap.add_argument("--runs", type=int, default=6, help="odd runs: gateway, even runs: SDK")
    ap.add_argument("--port", type=int, default=8131, help="gateway port of `inferq up`")
    ap.add_argument("--redis-port", type=int, default=6391)
    ap.add_argument("--metrics-port", type=int, default=9431)
    ap.add_argument("--data-dir", default="/tmp/gwdata", help="`inferq up --data-dir` (wiped first)")
    args = ap.parse_args(argv)
    out, data_dir = Path(args.out), Path(args.data_dir)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(data_dir, ignore_errors=True)
    base_url = f"http://127.0.0.1:{args.port}"
    with open(out / "up.log", "wb") as log:
        up = subprocess.Popen([sys.executable, "-m", "inferq.cli", "up", "--served-model-name", SERVED,
                               "--port", str(args.port), "--redis-port", str(args.redis_port),
                               "--metrics-port", str(args.metrics_port), "--data-dir", str(data_dir)],
                              env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(f"{base_url}/v1/models", up, 300, out / "up.log")
        for k in range(1, args.runs + 1):
            dataset = write_dataset(out / f"ds-{k}.jsonl", seed=k * 7919)
            if k % 2:
                name, target = "gateway", ["--backend", "http", "--base-url", base_url]
            else:
                password = (data_dir / "redis" / "password").read_text().strip()
                name, target = "sdk", ["--backend", "redis",
                                       "--redis-url", f"redis://:{password}@127.0.0.1:{args.redis_port}/0"]
            summary = bench_serve([*target, "--model", SERVED, "--dataset", "jsonl", "--dataset-path", str(dataset),
                                   "--num-prompts", "64", "--request-rate", "4", "--num-warmups", "2", "--seed", "0",
                                   "--percentiles", "50,90,99", "--no-progress", "--no-figure"],
                                  out / f"{name}-{k}.json", echo=False)
            print(f"{name} {k}: {summary_value(summary, 'Output token throughput')} tok/s, "
                  f"median TTFT {summary_value(summary, 'Median TTFT')} ms", flush=True)
    finally:
        up.send_signal(signal.SIGINT)  # as Ctrl-C: `inferq up` stops the worker, gateway and Redis
        try:
            up.wait(120)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
