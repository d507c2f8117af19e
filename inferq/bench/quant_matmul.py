"""GGUF quantized matmuls (gpuworker/models/quant_linear.py) against the bf16 panels of
cpu_linear (float32 ones on a CPU without bf16), on SmolLM2-135M's 30 layers of projections (qkv, o, gate|up, down).

    inferq bench quant-matmul --types Q4_1,Q8_0 --rows 1,8,64 [--isa avx2]

Per type and row count: one pass over every layer's weights with int8 activations (the
default: the 16-row layout where the type has one, else the file's rows) and with float
activations (the row kernel), and the bf16 (or float32) panels once per row count. Times are the best of
``--repeats`` passes in CPU time of the calling thread (``time.thread_time``: on a shared
machine other processes' time slices do not count; memory contention still does), at
``--threads`` (default 1). Weights are random blocks of each type. ``--calls kernel`` times the
int8 column as the decode replay runs it: the kernels' own ctypes calls on fixed buffers
(``QuantLinear.replay_calls``), without the module call's Python and tensors around each.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from inferq.gpuworker.models import cpu_linear
from inferq.gpuworker.models import quant_linear as ql
from inferq.kernels.cpu import loader
from inferq.kernels.cpu import quant_reference as ref

SMOLLM2_LAYER = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate|up, down


def random_blocks(name: str, n: int, k: int, seed: int) -> torch.Tensor:
    """``[n, row_bytes]`` of random valid ``name`` blocks (random bytes, small f16 scales)."""
    rng = np.random.default_rng(seed)
    elems, nbytes = ref.block_shape(ref.SUPPORTED[name])
    raw = rng.integers(0, 256, size=(n, k // elems, nbytes), dtype=np.uint8)
    scales = rng.uniform(5e-4, 2e-3, size=raw.shape[:2]).astype(np.float16).view(np.uint8).reshape(*raw.shape[:2], 2)
    if name == "Q6_K":
        raw[..., nbytes - 2:] = scales
    else:  # d first; Q4_1 / Q5_1 / K-quants: the min or dmin after it
        raw[..., 0:2] = scales
        if name in ("Q4_1", "Q5_1", "Q4_K", "Q5_K"):
            raw[..., 2:4] = scales
    return torch.from_numpy(raw.reshape(n, -1))


def best_cpu_s(fn, repeats: int) -> float:
    fn()  # warm: builds, page faults
    best = float("inf")
    for _ in range(repeats):
        t = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t)
    return best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="inferq bench quant-matmul", description=__doc__.splitlines()[0])
    p.add_argument("--types", default="Q4_1,Q8_0,Q4_K,Q6_K")
    p.add_argument("--rows", default="1,8,64")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--isa", default=None, choices=["avx512_vnni", "avx2"], help="force a build (default: the best here)")
    p.add_argument("--int8-layout", default="x16", choices=["x16", "rows"],
                   help="int8 activations on the 16-row layout (what the engine runs) or on the file's rows")
    p.add_argument("--calls", default="module", choices=["module", "kernel"],
                   help="int8 column: QuantLinear's call (module) or its kernels' raw calls, as the decode replay "
                        "makes them (kernel)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    lib = ql.load(args.isa)
    if lib is None:
        raise SystemExit("the quantized kernels do not build here")
    if args.int8_layout == "rows":
        lib.repack16 = False  # this process only: QuantLinear keeps the file's rows
    rows = [int(r) for r in args.rows.split(",")]
    shapes = SMOLLM2_LAYER * args.layers
    print(f"kernels: {lib.isa}; {args.threads} thread(s); {args.layers} layers of SmolLM2-135M's projections; "
          f"CPU ms per pass (best of {args.repeats}), weight GB/s")
    print("| weights | rows | int8 activations ms (GB/s) | float activations ms (GB/s) | layout (int8) |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name in args.types.split(","):
        elems = ref.block_shape(ref.SUPPORTED[name])[0]
        blocks = [(random_blocks(name, n, -(-k // elems) * elems, i % 4), -(-k // elems) * elems)
                  for i, (n, k) in enumerate(shapes)]
        nbytes = sum(b.numel() for b, _ in blocks)
        for m in rows:
            xs = [torch.randn(m, k) for _, k in blocks]
            cells, layout = [], ""
            for act in ("int8", "float"):
                lins = [ql.QuantLinear(lib, [ql.QuantWeight(b, ref.SUPPORTED[name], k)], torch.float32, act)
                        for b, k in blocks]
                layout = layout or lins[0].segments[0].layout
                if args.calls == "kernel" and act == "int8":
                    ys = [torch.empty(m, lin.n) for lin in lins]  # kept: the calls hold their addresses
                    made = [lin.replay_calls(x, y) for lin, x, y in zip(lins, xs, ys)]
                    calls = [call for kernel_calls, _ in made for call in kernel_calls]
                    if hasattr(lib, "threads"):
                        loader.sync_threads(lib)
                    s = best_cpu_s(lambda: [fn(*a) for fn, a in calls], args.repeats)
                else:
                    s = best_cpu_s(lambda: [lin(x) for lin, x in zip(lins, xs)], args.repeats)
                cells.append(f"{s * 1e3:.1f} ({nbytes / s / 1e9:.1f})")
            print(f"| {name} | {m} | {cells[0]} | {cells[1]} | {layout} |", flush=True)
    clib = cpu_linear.load()
    if clib is not None:
        # the dequantized model's matmuls: bf16 panels where the CPU has them, else float32
        # (AVX2-only CPUs run the engine in float32: bf16 would be emulated)
        dtype, label = (torch.bfloat16, f"bf16 panels ({clib.bf16})") if clib.bf16 else (torch.float32, f"fp32 panels ({clib.isa})")
        ws = [cpu_linear.PackedWeight(clib, torch.randn(n, k).to(dtype)) for n, k in shapes]
        nbytes = sum(w.nbytes for w in ws)
        for m in rows:
            xs = [torch.randn(m, w.k).to(dtype) for w in ws]
            s = best_cpu_s(lambda: [w(x, None) for w, x in zip(ws, xs)], args.repeats)
            print(f"| {label} | {m} | {s * 1e3:.1f} ({nbytes / s / 1e9:.1f}) | | |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
