"""Serving benchmark: inferq through Redis (producer SDK) vs `vllm serve` (OpenAI HTTP),
same model folder, same dtype, same arrivals, one server at a time on this machine,
alternating rounds so machine noise hits both alike. vLLM runs from its own venv
(scripts/setup_vllm_peer.sh); it is never a dependency of inferq.

    inferq bench serve-vs-vllm [ROUNDS]        (default 2)
        [--vllm-python PY] [--model-dir DIR] [--out DIR] [--num-prompts 64] [--input-len 128]
        [--output-len 64] [--rate 4] [--dtype bfloat16] [--kv-gib 2] [--worker-threads N]

--vllm-python defaults to $VLLM_PYTHON, else $INFERQ_VLLM_PYTHON, else
~/.venvs/inferq-vllm-peer/bin/python; --model-dir to the bundled SmolLM2 converted to an
HF folder (as bench offline uses); --worker-threads to the worker's own (all cores but
one, as vLLM keeps one core for its front end). Per round R, OUT (default bench-serve-vllm)
gets vllm-R.{log,json,txt}, redis-R.log and inferq-R.{log,json,txt}.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from inferq.bench.serve_runs import bench_serve, wait_http
from inferq.ports import free_port
from inferq.processes import terminate

SERVED = "smollm2"


def default_vllm_python() -> str:
    return (os.environ.get("VLLM_PYTHON") or os.environ.get("INFERQ_VLLM_PYTHON")
            or str(Path.home() / ".venvs" / "inferq-vllm-peer" / "bin" / "python"))


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="inferq bench serve-vs-vllm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rounds", nargs="?", type=int, default=2, help="vLLM then inferq, this many times")
    ap.add_argument("--vllm-python", default=None, help="Python of vLLM's virtual environment")
    ap.add_argument("--model-dir", default=None, help="HF model folder both servers load")
    ap.add_argument("--out", default="bench-serve-vllm", help="result folder")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rate", type=float, default=4, help="requests/s")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kv-gib", type=int, default=2, help="vLLM's VLLM_CPU_KVCACHE_SPACE")
    ap.add_argument("--worker-threads", type=int, default=None, help="the inferq worker's --torch-threads")
    return ap.parse_args(argv)


def run_vllm(args, model_dir: str, vllm_python: str, out: Path, rnd: int, workload: list[str]) -> None:
    """`vllm serve`'s OpenAI server, through `inferq bench serve --backend http`."""
    port = free_port()
    log = out / f"vllm-{rnd}.log"
    with open(log, "wb") as f:
        server = subprocess.Popen([vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                                   "--served-model-name", SERVED, "--dtype", args.dtype, "--port", str(port)],
                                  env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(args.kv_gib)),
                                  stdout=f, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", server, 900, log)
        bench_serve(["--backend", "http", "--base-url", f"http://127.0.0.1:{port}", *workload],
                    out / f"vllm-{rnd}.json")
    finally:
        terminate(server, 60)


def run_inferq(args, model_dir: str, out: Path, rnd: int, workload: list[str]) -> None:
    """A private redis-server and one worker, through `inferq bench serve --backend redis`."""
    from inferq.producer import Producer

    redis_server = shutil.which("redis-server")
    if redis_server is None:
        raise SystemExit("no redis-server on PATH")
    rport = free_port()
    url = f"redis://127.0.0.1:{rport}/0"
    with open(out / f"redis-{rnd}.log", "wb") as f:
        redis = subprocess.Popen([redis_server, "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no"], stdout=f, stderr=subprocess.STDOUT)
    worker = None
    try:
        threads = ["--torch-threads", str(args.worker_threads)] if args.worker_threads else []
        log = out / f"inferq-{rnd}.log"
        with open(log, "wb") as f:
            worker = subprocess.Popen([sys.executable, "-m", "inferq.gpuworker.service", *threads, "--redis-url", url,
                                       "--model", model_dir, "--served-model-name", SERVED, "--dtype", args.dtype,
                                       "--metrics-port", "0"], stdout=f, stderr=subprocess.STDOUT)
        producer = Producer(url, default_model=SERVED)
        try:
            while not _workers(producer):
                if worker.poll() is not None:
                    raise RuntimeError(f"worker exited ({worker.returncode}); see {log}")
                time.sleep(1)
        finally:
            producer.close()
        bench_serve(["--backend", "redis", "--redis-url", url, *workload], out / f"inferq-{rnd}.json")
    finally:
        if worker is not None:
            terminate(worker, 60)
        terminate(redis, 10)


def _workers(producer) -> dict:
    import redis

    try:
        return producer.workers()
    except redis.ConnectionError:  # redis-server still starting
        return {}


def main(argv=None) -> int:
    args = parse_args(argv)
    from inferq.bench.vllm_peer import vllm_python

    python = vllm_python(args.vllm_python or default_vllm_python())
    if args.model_dir:
        model_dir = args.model_dir
    else:
        from inferq.gpuworker.models.loader import resolve_model_folder

        model_dir = str(resolve_model_folder(None)[0])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workload = ["--model", SERVED, "--num-prompts", str(args.num_prompts), "--random-input-len", str(args.input_len),
                "--random-output-len", str(args.output_len), "--request-rate", str(args.rate), "--num-warmups", "2",
                "--seed", "0", "--percentiles", "50,90,99", "--no-progress", "--no-figure"]
    for rnd in range(1, args.rounds + 1):
        run_vllm(args, model_dir, python, out, rnd, workload)
        run_inferq(args, model_dir, out, rnd, workload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
