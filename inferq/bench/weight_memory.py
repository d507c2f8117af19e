"""Memory of an ``LLM(...)`` engine: the process's VmRSS after the imports and after the
engine is built (weights loaded and prepacked, KV cache allocated), beside one plain copy of
the weights and the KV cache's bytes; for a GGUF file also its size and RSS / (file + KV
cache). Prints one JSON line.

    inferq bench weight-memory [--model PATH] [--dtype float32|bfloat16] [--no-prepack] [--kv-mb 64]

``--model`` defaults to the bundled model; a GGUF is loaded as $INFERQ_GGUF_WEIGHTS says
(``native``: its blocks as stored).
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
    ap.add_argument("--model", default=None, help="model folder or GGUF file (default: the bundled model)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    from inferq.gpuworker import LLM
    from inferq.bench.process_memory import proc_kib
    from inferq.gpuworker.models.weight_memory import held_bytes, kv_cache_bytes, one_copy_bytes

    before = rss_bytes()
    kwargs = {"model": args.model} if args.model else {}
    llm = LLM(dtype=args.dtype, kv_cache_memory=args.kv_mb << 20, prepack_weights=not args.no_prepack, **kwargs)
    gc.collect()
    after = rss_bytes()
    eng = llm.engine
    kv = kv_cache_bytes(eng)
    gguf = {}
    if args.model and args.model.endswith(".gguf"):
        size = os.path.getsize(args.model)
        gguf = {"file_mb": round(size / 2**20), "rss_after_over_file_plus_kv": round(after / (size + kv), 3),
                "peak_rss_mb": round(proc_kib(os.getpid(), "VmHWM") / 1024)}
    print(json.dumps({
        "dtype": args.dtype, "packing": getattr(eng.model, "packing", None),
        "rss_before_mb": round(before / 2**20), "rss_after_mb": round(after / 2**20),
        "rss_delta_mb": round((after - before) / 2**20), "one_copy_mb": round(one_copy_bytes(eng.model) / 2**20),
        "model_tensors_mb": round(held_bytes(eng.model) / 2**20), "kv_cache_mb": round(kv / 2**20), **gguf,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
