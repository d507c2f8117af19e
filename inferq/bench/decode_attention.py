"""Micro-benchmark of decode attention on the CPU, as a decode step of the offline mix
sees it: --seqs sequences of 60-380 cached tokens (seeded), one query row each,
SmolLM2-135M's heads (9 query, 3 kv, head size 64), paged blocks of 16 at shuffled
places, one cache per layer for --layers layers so the keys and values come from
memory as in the model (--layers 1: they stay in the caches). One torch thread; the
median over --passes passes of the time per layer, through the backend (the C kernel where
it builds, with the plan and the k/v writes; --torch: the gather + SDPA path).

    inferq bench decode-attention [--dtype float32|bfloat16] [--layers 30] [--passes 7] [--torch]
"""
import argparse
import random
import statistics
import sys
import time

BS, HQ, HK, D = 16, 9, 3, 64


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="inferq bench decode-attention", description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--seqs", type=int, default=19)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--passes", type=int, default=7, help="timed passes over the layers (the median is shown)")
    ap.add_argument("--torch", action="store_true", help="the gather + SDPA path instead of the C kernel")
    args = ap.parse_args(argv)
    import torch

    from inferq.bench.paged_metadata import build_metadata
    from inferq.gpuworker.attention.torch_backend import TorchAttentionBackend

    torch.set_num_threads(1)
    dt = getattr(torch, args.dtype)
    rng = random.Random(0)
    lens = [rng.randint(60, 380) for _ in range(args.seqs)]
    num_blocks = sum(-(-n // BS) for n in lens) + 8
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-n // BS))] for n in lens]
    backend = TorchAttentionBackend(native_decode=not args.torch)
    caches = []
    for _ in range(args.layers):
        (kc, vc), = backend.allocate_kv_cache(1, num_blocks, BS, HK, D, dt, torch.device("cpu"))
        kc.copy_(torch.randn(kc.shape))
        vc.copy_(torch.randn(vc.shape))
        caches.append((kc, vc))
    meta, _ = build_metadata([(n - 1, 1) for n in lens], tables, BS)
    q = torch.randn(len(lens), HQ, D).to(dt)
    k, v = torch.randn(len(lens), HK, D).to(dt), torch.randn(len(lens), HK, D).to(dt)
    per_layer = []
    for _ in range(args.passes):
        t = time.perf_counter()
        for cache in caches:
            backend.forward(q, k, v, cache, meta, D**-0.5)
        per_layer.append((time.perf_counter() - t) / len(caches))
    path = "torch (gather + SDPA)" if args.torch else ("C kernel" if backend._plan.native is not None else "torch")
    print(f"{args.dtype}, {path}: {statistics.median(per_layer) * 1e3:.3f} ms per layer "
          f"({len(lens)} sequences, {sum(lens) / len(lens):.0f} cached tokens on average, {args.layers} layers' caches)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
