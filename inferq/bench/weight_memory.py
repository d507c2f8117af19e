"""Memory of an ``LLM(...)`` engine on the bundled model: the process's VmRSS after the
imports and after the engine is built (weights loaded and prepacked, KV cache allocated),
beside one plain copy of the weights and the KV cache's bytes. Prints one JSON line.

    inferq bench weight-memory [--dtype float32|bfloat16] [--no-prepack] [--kv-mb 64]
"""
import argparse
import gc
import json
import os
import sys


def rss_bytes() -> int:
    from inferq.bench.process_memory import proc_kib

    return proc_kib(os.getpid(), "VmRSS") * 1024


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="inferq bench weight-memory", description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--no-prepack", action="store_true", help="keep the plain weights (prepack_weights=False)")
    ap.add_argument("--kv-mb", type=int, default=64, help="KV cache size (MB)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from inferq.gpuworker import LLM
    from inferq.gpuworker.models.weight_memory import held_bytes, kv_cache_bytes, one_copy_bytes

    before = rss_bytes()
    llm = LLM(dtype=args.dtype, kv_cache_memory=args.kv_mb << 20, prepack_weights=not args.no_prepack)
    gc.collect()
    after = rss_bytes()
    eng = llm.engine
    kv = kv_cache_bytes(eng)
    print(json.dumps({
        "dtype": args.dtype, "packing": getattr(eng.model, "packing", None),
        "rss_before_mb": round(before / 2**20), "rss_after_mb": round(after / 2**20),
        "rss_delta_mb": round((after - before) / 2**20), "one_copy_mb": round(one_copy_bytes(eng.model) / 2**20),
        "model_tensors_mb": round(held_bytes(eng.model) / 2**20), "kv_cache_mb": round(kv / 2**20),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
