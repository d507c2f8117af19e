"""inferq vs llama.cpp's ``llama-server`` on the same GGUF file, the same cores, the
same HTTP path: both serve OpenAI ``/v1/completions`` and one client (inferq bench
serve's HTTPBackend, streaming) sends both the same requests, greedy with EOS ignored.

    inferq bench llama-cpp-peer [--threads 1,2] [--quants Q4_1] [--repeats 3]
        [--workloads single,mixed] [--llama-cpp-dir DIR] [--out DIR]

Workloads (token-id prompts, fresh random ids each repeat so no prefix cache hits,
lengths fixed by the seed):

- ``single``: one request, 32 prompt tokens, 256 out;
- ``mixed``: 24 requests sent at once, prompts 32-384 tokens, outputs 24-160
  (uniform, seed 0).

inferq runs as ``inferq up`` (embedded Redis, one worker, the gateway) with
``--torch-threads N``; llama.cpp as ``llama-server -t N --threads-batch N -np 24
-c 24*640 --cache-ram 0 --load-mode none``. Both are started once per (threads, file) and each repeat
runs llama.cpp then inferq, so drift on a shared machine hits both alike. Per run:
output tok/s (all output tokens / wall time of the run) and the median over requests
of the per-token latency (TPOT: (last chunk - first chunk) / (tokens - 1)); the table
gives the median over repeats and inferq / llama.cpp ratios. Every request must come
back with exactly its requested token count, else the run fails.

inferq's side runs in each GGUF mode this checkout has (``OUR_MODES``): the weights
dequantized to bfloat16 at load, and native (kept as stored, quantized CPU kernels). Files: the bundled Q4_1 GGUF, other types requantized
from it by llama-quantize (inferq.bench.llama_cpp_build). OUT (default
bench-llama-cpp) gets results.json and the server logs.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from inferq.bench.datasets import FIRST_ORDINARY_TOKEN, BenchRequest
from inferq.bench.llama_cpp_build import QUANT_TYPES
from inferq.bench.metrics import compute_metrics
from inferq.bench.serve_runs import wait_http
from inferq.ports import free_port
from inferq.processes import terminate

SERVED = "smollm2"
SLOTS = 24
SLOT_CTX = 640  # the longest mixed request is 384 + 160 tokens
VOCAB = 49152


@dataclass(frozen=True)
class Workload:
    name: str
    requests: int
    input_range: tuple[int, int]
    output_range: tuple[int, int]

    def lengths(self, seed: int = 0) -> list[tuple[int, int]]:
        rng = random.Random(seed)
        return [(rng.randint(*self.input_range), rng.randint(*self.output_range)) for _ in range(self.requests)]

    def requests_for(self, repeat: int) -> list[BenchRequest]:
        """The same lengths every repeat, fresh prompt token ids."""
        rng = random.Random(1000 + repeat)
        return [BenchRequest([rng.randrange(FIRST_ORDINARY_TOKEN, VOCAB) for _ in range(i)], o, i)
                for i, o in self.lengths()]


WORKLOADS = {
    "single": Workload("single", 1, (32, 32), (256, 256)),
    "mixed": Workload("mixed", SLOTS, (32, 384), (24, 160)),
}
# inferq's ways of running a GGUF: name -> (compute dtype, $INFERQ_GGUF_WEIGHTS).
# dequantize: the weights dequantized at load and held in the dtype; native: kept as
# stored, the linears on the quantized CPU kernels (gpuworker/models/quant_linear.py).
GGUF_WEIGHTS_ENV = "INFERQ_GGUF_WEIGHTS"
# A CPU without bf16 hardware (AVX2 only) runs the engine in float32 (bf16 would be emulated, its
# attention on scalar loops): the fp32 modes, the same weights.
OUR_MODES = {"bf16-dequantized": ("bfloat16", "dequantize"), "native": ("bfloat16", "native"),
             "fp32-dequantized": ("float32", "dequantize"), "native-fp32": ("float32", "native")}


def cpu_has_bf16() -> bool:
    from inferq.kernels.cpu import loader

    return loader.cpu_has("avx512_bf16") or loader.cpu_has("amx_bf16")


def available_modes() -> list[str]:
    """The modes this checkout and CPU have, the engine's natural dtype here first (bf16
    where the CPU has bf16 hardware, else float32): native needs the GGUF loader's native
    path and its kernels built."""
    from inferq.gpuworker.models import gguf_loader

    bf16 = cpu_has_bf16()
    modes = ["bf16-dequantized" if bf16 else "fp32-dequantized"]
    if "native" in getattr(gguf_loader, "WEIGHT_MODES", ()):
        from inferq.gpuworker.models import quant_linear

        if quant_linear.load() is not None:
            modes.append("native" if bf16 else "native-fp32")
    return modes


def _csv(text: str, allowed: Optional[set] = None, kind=str) -> list:
    items = [kind(x.strip()) for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError("needs at least one entry")
    bad = [x for x in items if allowed is not None and x not in allowed]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(map(str, bad))}; choose from {', '.join(sorted(allowed))}")
    return items


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="inferq bench llama-cpp-peer", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=lambda s: _csv(s, kind=int), default=[1, 2], help="compute threads to run at")
    ap.add_argument("--quants", type=lambda s: [] if s.lower() == "none" else _csv(s.upper(), {"Q4_1", *QUANT_TYPES}),
                    default=["Q4_1"], help="GGUF types (Q4_1: the bundled file; others requantized from it; none)")
    ap.add_argument("--synthetic", type=_csv, default=[], metavar="SHAPE:TYPE,...",
                    help="also (or with --quants none: only) GGUFs of a real model's shape with random blocks "
                         "(inferq.bench.synthetic_gguf), e.g. llama-8b:Q4_K_M")
    ap.add_argument("--workloads", type=lambda s: _csv(s, set(WORKLOADS)), default=list(WORKLOADS))
    ap.add_argument("--modes", type=lambda s: _csv(s, set(OUR_MODES)), default=None,
                    help=f"inferq's GGUF modes, of {', '.join(OUR_MODES)} (default: every one this checkout has)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--single-output", type=int, default=WORKLOADS["single"].output_range[0],
                    help="output tokens of the single workload (fewer for a model that decodes at ~1 tok/s)")
    ap.add_argument("--llama-cpp-dir", default=None, help="folder with llama.cpp's tools (default: PATH or the cached build)")
    ap.add_argument("--out", default="bench-llama-cpp", help="result folder")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one request may take")
    args = ap.parse_args(argv)
    from inferq.bench.synthetic_gguf import FILE_TYPES
    from inferq.bench.random_model_shapes import SHAPES

    for spec in args.synthetic:
        shape, _, ftype = spec.partition(":")
        if shape not in SHAPES or ftype not in FILE_TYPES:
            ap.error(f"--synthetic {spec!r}: expected SHAPE:TYPE with SHAPE of {', '.join(SHAPES)} "
                     f"and TYPE of {', '.join(FILE_TYPES)}")
    if not args.quants and not args.synthetic:
        ap.error("no files: give --quants or --synthetic")
    if args.single_output < 2:
        ap.error("--single-output must be at least 2 (TPOT needs two tokens)")
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    if any(t < 1 for t in args.threads):
        ap.error("--threads must be at least 1")
    return args


def run_once(base_url: str, requests: list[BenchRequest], timeout: float) -> dict:
    """All requests at once through the streaming HTTP client; exact token counts checked."""
    from inferq.bench.backends import HTTPBackend
    from inferq.bench.serve import run_schedule

    async def go():
        backend = HTTPBackend(base_url, SERVED, timeout)
        try:
            return await run_schedule(backend, requests, [0.0] * len(requests))
        finally:
            await backend.close()

    records, _, duration = asyncio.run(go())
    for req, rec in zip(requests, records):
        if not rec.success or rec.output_tokens != req.output_len:
            raise RuntimeError(f"{base_url}: a request asked for {req.output_len} tokens and got "
                               f"{rec.output_tokens} ({rec.error or 'no error'})")
    m = compute_metrics(records, duration, percentiles=[50])
    return {"duration_s": duration, "output_tok_s": m["output_throughput"], "tpot_ms": m["tpot_ms"]["median"],
            "ttft_ms": m["ttft_ms"]["median"], "output_tokens": m["total_output_tokens"]}


def warm(base_url: str, timeout: float) -> None:
    run_once(base_url, Workload("warm-up", 2, (32, 32), (8, 8)).requests_for(-1), timeout)


class LlamaServer:
    def __init__(self, bin_dir: Path, gguf: Path, threads: int, log: Path):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [str(bin_dir / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
               "-t", str(threads), "--threads-batch", str(threads), "-np", str(SLOTS), "-c", str(SLOTS * SLOT_CTX),
               "--cache-ram", "0", "--alias", SERVED, "--no-webui",
               # The weights in the process's own memory, as inferq's: a mapped file's pages
               # are dropped under memory pressure and then re-read from disk every token.
               "--load-mode", "none"]
        with open(log, "wb") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        try:
            wait_http(f"{self.base_url}/v1/models", self.proc, 300, log)
        except RuntimeError:
            if self.proc.returncode == -signal.SIGILL:
                raise RuntimeError(f"llama-server died of SIGILL ({log}): this CPU's AMX tiles fault for llama.cpp "
                                   "(seen under KVM); build it without them: python -m inferq.bench.llama_cpp_build "
                                   "--no-amx, then pass the folder it prints as --llama-cpp-dir") from None
            raise

    def close(self) -> None:
        terminate(self.proc, 30)

    def memory(self) -> dict:
        return server_memory(self.proc.pid)


class InferqUp:
    """``inferq up`` on free ports with its data in a temporary folder."""

    def __init__(self, gguf: Path, threads: int, mode: str, log: Path):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.data = tempfile.mkdtemp(prefix="inferq-llama-peer-")
        cmd = [sys.executable, "-m", "inferq.cli", "up", "--model", str(gguf), "--served-model-name", SERVED,
               "--port", str(self.port), "--redis-port", "0", "--metrics-port", "0", "--data-dir", self.data,
               f"--worker-arg=--torch-threads={threads}", f"--worker-arg=--dtype={OUR_MODES[mode][0]}"]
        # Its own embedded Redis, whatever Redis the calling shell points at.
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_REDIS")}
        env[GGUF_WEIGHTS_ENV] = OUR_MODES[mode][1]
        with open(log, "wb") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        # /ready answers 2xx once a live worker serves the model (the gateway starts first).
        wait_http(f"{self.base_url}/ready", self.proc, 600, log)

    def memory(self) -> dict:
        return server_memory(self.proc.pid)

    def close(self) -> None:
        self.proc.send_signal(signal.SIGINT)  # as Ctrl-C: gateway, worker, then Redis stop in order
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.data, ignore_errors=True)


def server_memory(pid: int) -> dict:
    """Resident memory of a server and its children (inferq: gateway, Redis, worker), and of
    its largest process (inferq's worker, where the weights and KV cache live)."""
    from inferq.bench.process_memory import proc_kib, process_tree, system_memory

    largest = 0
    for p in process_tree(pid):
        try:
            largest = max(largest, proc_kib(p, "VmRSS") * 1024)
        except OSError:
            pass
    return {"system_pss_mb": round(system_memory(pid).pss_bytes / 2**20), "largest_rss_mb": round(largest / 2**20)}


def summarize(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in ("output_tok_s", "tpot_ms", "ttft_ms")}


def table(rows: list[dict]) -> str:
    lines = ["| threads | workload | file | inferq mode | llama.cpp tok/s | inferq tok/s | tok/s ratio "
             "| llama.cpp TPOT ms | inferq TPOT ms | TPOT ratio |",
             "|---:|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lc, us = r["llama_cpp"], r["inferq"]
        lines.append(f"| {r['threads']} | {r['workload']} | {r['file']} | {r['mode']} | {lc['output_tok_s']:.1f} "
                     f"| {us['output_tok_s']:.1f} | {us['output_tok_s'] / lc['output_tok_s']:.2f} "
                     f"| {lc['tpot_ms']:.2f} | {us['tpot_ms']:.2f} | {us['tpot_ms'] / lc['tpot_ms']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    from inferq.bench.llama_cpp_build import quantized_copy, tools
    from inferq.gpuworker.models.loader import bundled_model_path

    modes = available_modes()
    native_here = any(OUR_MODES[m][1] == "native" for m in modes)
    for m in args.modes or []:
        if OUR_MODES[m][1] == "native" and not native_here:
            raise SystemExit(f"inferq mode {m!r} is not available here (this checkout and CPU have {', '.join(modes)})")
    modes = args.modes or modes
    bin_dir = tools(args.llama_cpp_dir)
    source = bundled_model_path()
    files = {q: source if q == "Q4_1" else quantized_copy(bin_dir, source, q) for q in args.quants}
    from inferq.bench.synthetic_gguf import synthetic_gguf

    for spec in args.synthetic:
        shape, _, ftype = spec.partition(":")
        files[spec] = synthetic_gguf(shape, ftype)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for threads in args.threads:
        for q, gguf in files.items():
            for mode in modes:
                tag = f"t{threads}-{q}-{mode}"
                llama = LlamaServer(bin_dir, gguf, threads, out / f"llama-server-{tag}.log")
                ours = None
                try:
                    warm(llama.base_url, args.timeout)
                    ours = InferqUp(gguf, threads, mode, out / f"inferq-up-{tag}.log")
                    warm(ours.base_url, args.timeout)
                    workloads = dict(WORKLOADS, single=dataclasses.replace(
                        WORKLOADS["single"], output_range=(args.single_output, args.single_output)))
                    for w in args.workloads:
                        runs = {"llama_cpp": [], "inferq": []}
                        for rep in range(args.repeats):
                            reqs = workloads[w].requests_for(rep)
                            for side, server in (("llama_cpp", llama), ("inferq", ours)):
                                runs[side].append(run_once(server.base_url, reqs, args.timeout))
                                r = runs[side][-1]
                                print(f"{tag} {w} #{rep + 1} {side}: {r['output_tok_s']:.1f} tok/s, "
                                      f"TPOT {r['tpot_ms']:.2f} ms, TTFT {r['ttft_ms']:.1f} ms", flush=True)
                        rows.append({"threads": threads, "workload": w, "file": q, "mode": mode, "runs": runs,
                                     "llama_cpp": summarize(runs["llama_cpp"]), "inferq": summarize(runs["inferq"]),
                                     "file_mb": round(gguf.stat().st_size / 2**20),
                                     "memory": {"llama_cpp": llama.memory(), "inferq": ours.memory()}})
                        print(f"{tag} {w} memory: file {rows[-1]['file_mb']} MB, {rows[-1]['memory']}", flush=True)
                        (out / "results.json").write_text(json.dumps(rows, indent=1))
                finally:
                    llama.close()
                    if ours is not None:
                        ours.close()
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
