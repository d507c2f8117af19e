"""Micro-benchmark of one layer's prefill attention on the CPU, per prefill route of
inferq.gpuworker.attention.torch_backend: "torch" (baddbmm with an additive causal mask, SDPA past
its size limit), "rows" (the C paged-decode kernel, row j of a chunk seeing its context + j + 1
keys) and "tiled" (inferq.kernels' cpu/paged_prefill.c: query tiles x key chunks, online softmax;
in bf16 on an AMX CPU paged_prefill_amx.c, whose vector kernel "tiled-vector" still runs),
plus "auto", the backend's own choice. SmolLM2-135M's heads by default (9 query, 3 kv, head
size 64). Median of N calls per route, the routes alternating over 3 rounds (N: 20, fewer for
slow cases, at least 3).

    inferq bench prefill-attention [--dtype float32|bfloat16] [--threads 1]
        [--heads 9/3/64] [--cases 128+3x1,256,512,128@256] [--routes torch,rows,tiled,auto]

A case is a prompt length; ``@C`` gives the prompt C cached tokens of context (a later
chunk, a prefix-cache hit); ``+Nx1`` adds N decode rows (contexts of 150-250 tokens), as in a
serving step. The diff column is the largest |route - torch| over the outputs.
"""
import argparse
import statistics
import sys
import time

import torch

from inferq.bench.paged_metadata import build_metadata
from inferq.gpuworker.attention import cpu_kernels
from inferq.gpuworker.attention.base import AttentionMetadata
from inferq.gpuworker.attention.torch_backend import TorchAttentionBackend

BS = 16
DEFAULT_CASES = ("128,256,512,1024,2048,128@512,256@512,512@512,1024@512,2048@512,"
                 "128@1024,256@1024,512@1024,1024@1024,2048@1024,2@512,4@512,9@512,16@512,"
                 "128+3x1")


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="inferq bench prefill-attention", description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--heads", default="9/3/64", help="query heads / kv heads / head size")
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--routes", default="torch,rows,tiled,auto")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    hq, hk, d = (int(x) for x in args.heads.split("/"))
    dt = getattr(torch, args.dtype)
    if TorchAttentionBackend()._use_native(metadata([(0, 2)])[0], hq, hq // hk, dt, torch.device("cpu")) is False:
        print("the C kernels do not build here: nothing to compare")
        return 1
    routes = args.routes.split(",")
    print(f"{args.dtype}, {args.threads} thread(s), heads {hq}/{hk}/{d}, ms per layer (median)")
    print("| case | " + " | ".join(routes) + " | best C / torch | max diff |")
    print("| --- |" + " ---: |" * (len(routes) + 2))
    g = torch.Generator().manual_seed(0)
    for case in args.cases.split(","):
        meta, nblocks = metadata(parse_case(case))
        t = sum(meta.query_lens_cpu)
        cache = torch.randn(2, nblocks + 1, BS, hk, d, generator=g).to(dt)
        q, k, v = (torch.randn(t, h, d, generator=g).to(dt) for h in (hq, hk, hk))
        times: dict[str, list[float]] = {r: [] for r in routes}
        outs = {}
        backends = {r: TorchAttentionBackend(prefill_path={"auto": None, "tiled-vector": "tiled"}.get(r, r))
                    for r in routes}
        kern = cpu_kernels.load()
        amx = kern.prefill_amx
        kv = (cache[0].clone(), cache[1].clone())
        n_calls = 20
        for rnd in range(3):
            for r in routes:
                kern.prefill_amx = None if r == "tiled-vector" else amx  # the vector kernel, not AMX's
                outs[r] = backends[r].forward(q, k, v, kv, meta, d**-0.5).float()
                for _ in range(n_calls):
                    t0 = time.perf_counter()
                    backends[r].forward(q, k, v, kv, meta, d**-0.5)
                    times[r].append(time.perf_counter() - t0)
                if rnd == 0 and r == routes[0]:  # keep a case's rounds to ~1 s per route
                    n_calls = max(3, min(20, int(0.3 / max(times[r]))))
        kern.prefill_amx = amx
        med = {r: statistics.median(times[r]) * 1e3 for r in routes}
        base = outs.get("torch", next(iter(outs.values())))
        diff = max((o - base).abs().max().item() for o in outs.values())
        c_best = min((med[r] for r in ("rows", "tiled", "tiled-vector") if r in med), default=float("nan"))
        ratio = f"{med['torch'] / c_best:.2f}x" if "torch" in med else "n/a (no torch route)"
        print(f"| {case} | " + " | ".join(f"{med[r]:.2f}" for r in routes) + f" | {ratio} | {diff:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
