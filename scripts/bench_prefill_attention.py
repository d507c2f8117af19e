#!/usr/bin/env python3
"""Micro-benchmark of one layer's prefill attention on the CPU: the C paged kernel
(a prompt's row j sees its j + 1 keys) against the batched torch path (baddbmm with
an additive causal mask, or SDPA past its size limit), SmolLM2-135M's heads (9 query,
3 kv, head size 64), one torch thread. Best of 20 calls, alternating 2 rounds.

    python scripts/bench_prefill_attention.py [--dtype float32|bfloat16] [--cases 128+3x1,256,512,128@256]

A case is a prompt length; ``@C`` gives the prompt C cached tokens of context (a later
chunk); ``+Nx1`` adds N decode rows (contexts of 150-250 tokens), as in a serving step.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

from gpuworker.attention.base import AttentionMetadata  # noqa: E402
from gpuworker.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from tests.models.paged import build_metadata  # noqa: E402  (the test suite's step builder)

BS, HQ, HK, D = 16, 9, 3, 64


def metadata(seqs: list[tuple[int, int]]) -> tuple[AttentionMetadata, int]:
    """seqs: (context, query) per sequence, blocks laid out one after another (block 0
    unused); returns the step's metadata and the number of blocks."""
    tables, nxt = [], 1
    for c, q in seqs:
        n = -(-(c + q) // BS)
        tables.append(list(range(nxt, nxt + n)))
        nxt += n
    return build_metadata(seqs, tables, BS)[0], nxt


def parse_case(text: str) -> list[tuple[int, int]]:
    head, _, decodes = text.partition("+")
    prompt, _, ctx = head.partition("@")
    seqs = [(int(ctx or 0), int(prompt))]
    if decodes:
        n = int(decodes.split("x")[0])
        seqs += [(150 + 50 * (i % 3), 1) for i in range(n)]
    return seqs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--cases", default="128+3x1,256,512,1024,2048,128@256")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dt = getattr(torch, args.dtype)
    if TorchAttentionBackend()._use_native(metadata([(0, 2)])[0], HQ, HQ // HK, dt, torch.device("cpu")) is False:
        print("the C kernel does not build here: nothing to compare")
        return 1
    print(f"{args.dtype}, ms per layer (best of 20)\n| case | torch (baddbmm / SDPA) | C kernel | ratio | max abs diff |")
    print("| --- | ---: | ---: | ---: | ---: |")
    g = torch.Generator().manual_seed(0)
    for case in args.cases.split(","):
        meta, nblocks = metadata(parse_case(case))
        t = sum(meta.query_lens_cpu)
        cache = torch.randn(2, nblocks + 1, BS, HK, D, generator=g).to(dt)
        q, k, v = (torch.randn(t, h, D, generator=g).to(dt) for h in (HQ, HK, HK))
        best, outs = {False: float("inf"), True: float("inf")}, {}
        for _ in range(2):
            for native in (False, True):
                backend = TorchAttentionBackend(native_prefill=native)
                kv = (cache[0].clone(), cache[1].clone())
                outs[native] = backend.forward(q, k, v, kv, meta, D**-0.5).float()
                for _ in range(20):
                    t0 = time.perf_counter()
                    backend.forward(q, k, v, kv, meta, D**-0.5)
                    best[native] = min(best[native], time.perf_counter() - t0)
        diff = (outs[True] - outs[False]).abs().max().item()
        print(f"| {case} | {best[False] * 1e3:.2f} | {best[True] * 1e3:.2f} | {best[False] / best[True]:.2f}x | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
