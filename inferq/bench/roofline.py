"""A scaling model of the CPU path (``inferq bench roofline``): what a step costs in bytes and
FLOPs, measured ceilings of this machine at 1..N threads, and the projection to larger servers.

Per decode step of a batch of B sequences with L tokens of context each:

* matmuls read every weight once (P parameters x the dtype's bytes) and do 2·B·P FLOPs:
  memory-bound while B is below the machine's balance (peak FLOP/s over bandwidth, per byte
  of weight: bf16 halves the bytes, so its ridge is half fp32's B);
* attention reads B·L tokens of KV (2 · layers · kv_heads · head_dim · dtype bytes each) and
  does 4 · B · L · layers · heads · head_dim FLOPs: about one FLOP per byte whatever B is, so
  always memory-bound;
* a prompt step of T tokens does 2·T·P FLOPs on one read of the weights: compute-bound from
  a few dozen tokens on.

A step's time is modelled as max(bytes / bandwidth, FLOPs / compute) per kernel class, with
bandwidth and compute measured here at each thread count (the same kernels the engine runs:
the packed matmul at 1 row streams weights, at 512 rows it computes) and, for a server,
compute scaled by cores and bandwidth by cores up to the socket's DRAM bandwidth.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import torch

from inferq.bench.offline import warm_median_s
from inferq.bench.random_model_shapes import SHAPES, Shape, parameter_count

# The bundled model (HuggingFaceTB/SmolLM2-135M-Instruct's config), beside the random-weight shapes.
SMOLLM2 = Shape(architecture="LlamaForCausalLM", hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3,
                intermediate_size=1536, vocab_size=49152, rope_theta=100000.0, tie_word_embeddings=True,
                max_position_embeddings=8192, rms_norm_eps=1e-5)
MODELS = {"smollm2-135m": SMOLLM2, **SHAPES}


@dataclass(frozen=True)
class Machine:
    name: str
    cores: int
    gbs: float  # DRAM bandwidth the matmuls' weight stream gets, GB/s
    gflops: float  # fp32 matmul compute, GFLOP/s (bf16 on AVX512-BF16 is ~2x; not modelled)


def step_cost(shape: Shape, batch: int, context: int, dtype_bytes: int) -> dict:
    """Bytes and FLOPs of one decode step, per kernel class."""
    # matmuls read the layers' weights and the LM head (with tied embeddings the embedding
    # matrix is the LM head; an untied embedding is only looked up, B rows of it)
    matmul_params = parameter_count(shape) - (0 if shape.tie_word_embeddings else shape.vocab_size * shape.hidden_size)
    kv_per_token = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * dtype_bytes
    attn_flops = 4 * batch * context * shape.num_layers * shape.num_heads * shape.head_dim
    return {"matmul_bytes": matmul_params * dtype_bytes, "matmul_flops": 2 * batch * matmul_params,
            "attn_bytes": batch * context * kv_per_token, "attn_flops": attn_flops}


def step_ms(cost: dict, m: Machine) -> dict:
    """Modelled milliseconds per kernel class and which ceiling binds."""
    out = {}
    for k in ("matmul", "attn"):
        mem = cost[f"{k}_bytes"] / (m.gbs * 1e9) * 1e3
        comp = cost[f"{k}_flops"] / (m.gflops * 1e9) * 1e3
        out[k] = (max(mem, comp), "memory" if mem >= comp else "compute")
    return out


class WeightStream:
    """The weight stream the matmul kernels get: packed copies of SmolLM2's MLP weight
    (1536 x 576) in ``dtype``, 226 MB in all (past every cache), each read once per pass
    by the engine's own kernel at ``rows`` rows. ``gbs()`` measures it (median of a few
    passes after a warm one): the ceiling a decode step's weight reads are held to."""

    SHAPE = (1536, 576)

    def __init__(self, dtype: torch.dtype = torch.float32, rows: int = 1, total_bytes: int = 226_492_416):
        from inferq.gpuworker.models import cpu_linear

        lib = cpu_linear.load()
        probe = torch.empty(self.SHAPE, dtype=dtype)
        if lib is None or not cpu_linear.can_pack(lib, probe):
            raise SystemExit(f"the {dtype} matmul kernel is not available on this CPU")
        count = max(1, -(-total_bytes // (probe.numel() * probe.element_size())))
        self.packed = [cpu_linear.PackedWeight(lib, torch.randn(self.SHAPE).to(dtype)) for _ in range(count)]
        self.nbytes = sum(p.nbytes for p in self.packed)
        self.x = torch.randn(rows, self.SHAPE[1]).to(dtype)
        self.y = torch.empty(rows, self.SHAPE[0], dtype=dtype)
        # the kernel calls themselves, arguments made once: the stream, not the Python around it
        x, y = self.x, self.y
        self._calls = [(p._run, (x.data_ptr(), x.stride(0), rows, p.packed.data_ptr(), p.n, p.k, None,
                                 y.data_ptr(), p.n)) for p in self.packed]
        self._lib = lib

    def _pass(self) -> None:
        for fn, args in self._calls:
            fn(*args)

    def gbs(self, repeats: int = 3) -> float:
        from inferq.kernels.cpu import loader

        loader.sync_threads(self._lib)
        return self.nbytes / warm_median_s(self._pass, repeats) / 1e9


def measure(threads: int) -> Machine:
    """This machine at ``threads`` threads, through the engine's own fp32 matmul kernel."""
    torch.set_num_threads(threads)
    # 64 weights of SmolLM2's MLP shape (1536 x 576 fp32, 226 MB): past every cache
    gbs = WeightStream(torch.float32).gbs()
    few = WeightStream(torch.float32, rows=512, total_bytes=8 * 1536 * 576 * 4)
    # compute: 512 rows on 8 weights (the weight is read once per row block)
    gflops = 2 * 512 * 1536 * 576 * len(few.packed) / warm_median_s(few._pass) / 1e9
    return Machine(f"this machine, {threads} thread(s)", threads, gbs, gflops)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="inferq bench roofline", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", default="1,2", help="thread counts to measure here")
    p.add_argument("--model", default="smollm2-135m", choices=sorted(MODELS))
    p.add_argument("--batches", default="1,8,32,128")
    p.add_argument("--context", type=int, default=512, help="tokens of context per sequence")
    p.add_argument("--dtype-bytes", type=int, default=4)
    p.add_argument("--server", action="append", default=[],
                   help="NAME:CORES:SOCKET_GBS projected from the last measured per-core figures "
                        "(default: 16, 32 and 64 cores of a 12-channel DDR5 socket, 460 GB/s)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    measured = [measure(int(t)) for t in args.threads.split(",")]
    per_core = measured[0]
    servers = args.server or [f"{c} cores:{c}:460" for c in (16, 32, 64)]
    machines = list(measured)
    for s in servers:
        name, cores, socket = s.rsplit(":", 2)
        cores, socket = int(cores), float(socket)
        machines.append(Machine(f"{name} (projected)", cores, min(cores * per_core.gbs, socket),
                                cores * per_core.gflops))
    shape = MODELS[args.model]
    print(f"{args.model}, {args.dtype_bytes}-byte weights and KV, {args.context} tokens of context per sequence")
    print()
    print("| machine | weight stream GB/s | matmul GFLOP/s | ridge batch |")
    print("| --- | ---: | ---: | ---: |")
    for m in machines:
        ridge = m.gflops * args.dtype_bytes / (2 * m.gbs)
        print(f"| {m.name} | {m.gbs:.1f} | {m.gflops:.0f} | {ridge:.0f} |")
    print()
    print("| machine | batch | matmuls ms (bound) | attention ms (bound) | step ms | tok/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for m in machines:
        for b in (int(x) for x in args.batches.split(",")):
            t = step_ms(step_cost(shape, b, args.context, args.dtype_bytes), m)
            total = t["matmul"][0] + t["attn"][0]
            rows.append({"machine": m.name, "batch": b, "matmul_ms": t["matmul"][0], "attn_ms": t["attn"][0]})
            print(f"| {m.name} | {b} | {t['matmul'][0]:.1f} ({t['matmul'][1]}) | {t['attn'][0]:.2f} "
                  f"({t['attn'][1]}) | {total:.1f} | {b / total * 1e3:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machines": [m.__dict__ for m in machines], "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
