"""Micro-benchmark of decode-sized CPU matmuls: SmolLM2-135M's 30 layers of projections
(qkv, o, gate_up, down, 30 distinct weights each so nothing stays cached) plus its LM
head, one torch thread, through our kernels (inferq.gpuworker.models.cpu_linear), oneDNN's
prepacked weights (what vLLM runs on a CPU) and F.linear; in float32 also MKL reading our
panels as a batch of matrices (what PackedWeight runs past the kernel's max_rows on Intel
and AVX2). Then a tied embedding's lookup: F.embedding against rows gathered from the LM
head's panels. Medians of 5 passes. --shapes llama-1b: Llama-3.2-1B's projections instead
(4 layers of them, ~1 GB in fp32: past the L3 as 30 of SmolLM2's are).

    inferq bench cpu-matmul [--dtype bfloat16|float32] [--rows 1,8,32,64] [--no-lm-head | --embedding]
                            [--shapes smollm2|llama-1b]
"""
import argparse
import sys

import torch
import torch.nn.functional as F

from inferq.bench.offline import warm_median_s as median_s
from inferq.gpuworker.engine import host_malloc
from inferq.gpuworker.models import cpu_linear

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}
SHAPES_BY_MODEL = {  # (shapes, layers)
    "smollm2": (SHAPES, 30),
    "llama-1b": ({"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192),
                  "lm_head": (128256, 2048)}, 4),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="inferq bench cpu-matmul", description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--rows", default="1,8,32,64")
    ap.add_argument("--no-lm-head", action="store_true", help="projections only (a prompt step's LM head "
                    "sees one row per sequence)")
    ap.add_argument("--embedding", action="store_true", help="only the embedding lookup, for --rows tokens")
    ap.add_argument("--shapes", default="smollm2", choices=sorted(SHAPES_BY_MODEL))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    host_malloc.retain_freed_memory()  # as the engine does: outputs reuse freed pages, no page faults timed
    dt = getattr(torch, args.dtype)
    lib = cpu_linear.load()
    shapes, layers = SHAPES_BY_MODEL[args.shapes]
    weights = {name: [torch.randn(n, k).to(dt) for _ in range(1 if name == "lm_head" else layers)]
               for name, (n, k) in shapes.items() if not (args.no_lm_head and name == "lm_head")}
    gb = sum(w.numel() * w.element_size() for ws in weights.values() for w in ws) / 1e9
    systems = {"F.linear": lambda x, w: F.linear(x, w)}
    packs = {}
    if lib is not None and all(cpu_linear.can_pack(lib, w) for ws in weights.values() for w in ws):
        packs["ours"] = {id(w): cpu_linear.PackedWeight(lib, w) for ws in weights.values() for w in ws}
        systems["ours"] = lambda x, w: packs["ours"][id(w)]._kernel(x, None)
        if dt == torch.float32:
            systems["MKL on panels"] = lambda x, w: packs["ours"][id(w)]._mkl_on_panels(x, None)
    if hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):  # vLLM's CPU path, both dtypes
        packs["onednn"] = {id(w): torch.ops.mkldnn._reorder_linear_weight(w, 32) for ws in weights.values() for w in ws}
        systems["oneDNN prepacked"] = lambda x, w: torch.ops.mkldnn._linear_pointwise(
            x, packs["onednn"][id(w)], None, "none", [], "")
    print(f"{args.dtype}, weights {gb * 1e3:.0f} MB, 1 thread; ms per pass (GB/s of weights read)")
    print("| rows | " + " | ".join(systems) + " |")
    print("| ---: |" + " ---: |" * len(systems))
    for rows in (int(r) for r in args.rows.split(",") if not args.embedding):
        xs = {k: torch.randn(rows, k).to(dt) for k in {k for _, k in shapes.values()}}
        cells = []
        for fn in systems.values():
            s = median_s(lambda: [fn(xs[w.shape[1]], w) for ws in weights.values() for w in ws])
            cells.append(f"{s * 1e3:.1f} ({gb / s:.1f})")
        print(f"| {rows} | " + " | ".join(cells) + " |")
    if "ours" in packs and "lm_head" in weights:
        table = weights["lm_head"][0]
        head = packs["ours"][id(table)]
        print("\nembedding lookup (ms): | tokens | F.embedding | rows from the panels |")
        for rows in (int(r) for r in args.rows.split(",")):
            ids = torch.randint(0, table.shape[0], (rows,))
            plain_s, panel_s = median_s(lambda: F.embedding(ids, table)), median_s(lambda: head.rows(ids))
            print(f"| {rows} | {plain_s * 1e3:.3f} | {panel_s * 1e3:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
