"""Offline throughput: our engine vs HF ``generate`` (static padded batches) vs
HF ``generate_batch`` (transformers' continuous batching), side by side in one
run on the same weights, dtype and threads.

Workload as nano-vllm's bench: random prompt token ids, per-request input and
output lengths drawn uniformly, EOS ignored so every system makes the same
tokens. Throughput = requested output tokens / wall time (padding and the
extra tokens a static batch makes for its slowest member do not count).
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch

from inferq.bench.process_memory import SystemMemory, gib, system_memory
from inferq.bench.random_model_shapes import SHAPES


@dataclass
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


def make_workload(n: int, min_in: int, max_in: int, min_out: int, max_out: int, vocab: int, seed: int) -> Workload:
    rng = random.Random(seed)
    # Stay clear of the special tokens at the start of the vocabulary.
    lo, hi = min(1000, vocab // 4), vocab - 1
    prompts = [[rng.randint(lo, hi) for _ in range(rng.randint(min_in, max_in))] for _ in range(n)]
    outs = [rng.randint(min_out, max_out) for _ in range(n)]
    return Workload(prompts, outs)


@dataclass
class Result:
    system: str
    seconds: list[float]
    output_tokens: int
    memory: SystemMemory | None = None  # after its runs (inferq and vLLM only)

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.median_s


def timed(fn: Callable[[], None], repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def warm_median_s(fn: Callable[[], object], repeats: int = 5) -> float:
    """Median seconds of ``repeats`` calls after one untimed warm-up call (micro-benchmarks)."""
    fn()
    return statistics.median(timed(fn, repeats))


# -- systems ------------------------------------------------------------------
def run_inferq(llm, wl: Workload) -> None:
    from inferq.schemas import SamplingParams

    params = [SamplingParams(max_tokens=o, temperature=0, ignore_eos=True) for o in wl.output_lens]
    outs = llm.generate(wl.prompts, params)
    got = sum(len(o.token_ids) for o in outs)
    assert got == wl.output_tokens, f"inferq made {got} tokens, expected {wl.output_tokens}"


def run_hf_static(model, wl: Workload, batch_size: int, pad_id: int) -> None:
    """Arrival-order batches, left-padded; each batch runs to its longest output."""
    dev = next(model.parameters()).device
    for i in range(0, len(wl.prompts), batch_size):
        batch = wl.prompts[i : i + batch_size]
        outs = wl.output_lens[i : i + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, p in enumerate(batch):
            ids[r, width - len(p) :] = torch.tensor(p)
            mask[r, width - len(p) :] = 1
        n = max(outs)
        model.generate(
            input_ids=ids.to(dev), attention_mask=mask.to(dev), max_new_tokens=n, min_new_tokens=n,
            do_sample=False, pad_token_id=pad_id,
        )


def run_hf_generate_batch(model, wl: Workload, max_batch_tokens: int, num_blocks: int, page_size: int) -> None:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = GenerationConfig(do_sample=False, max_new_tokens=max(wl.output_lens), eos_token_id=None)
    cb = ContinuousBatchingConfig(num_blocks=num_blocks, max_batch_tokens=max_batch_tokens, page_size=page_size)
    with model.continuous_batching_context_manager(
        generation_config=gen, continuous_batching_config=cb, block=True, timeout=30
    ) as manager:
        ids = [
            manager.add_request(p, request_id=f"r{i}", max_new_tokens=o)
            for i, (p, o) in enumerate(zip(wl.prompts, wl.output_lens))
        ]
        done, made = set(), 0
        while len(done) < len(ids):
            res = manager.get_result(timeout=5)
            if res is None:
                if not manager.is_running():
                    raise RuntimeError("generate_batch's generation thread stopped")
                continue
            if res.is_finished():
                done.add(res.request_id)
                made += len(res.generated_tokens)
    assert made == wl.output_tokens, f"generate_batch made {made} tokens, expected {wl.output_tokens}"


# -- driver -------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="inferq bench offline", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="HF folder or .gguf (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--random-model", default=None, choices=sorted(SHAPES),
                   help="instead of --model: random weights in that real model's shape, written once "
                        "(see inferq.bench.random_model) in the benchmark's dtype")
    p.add_argument("--random-model-dir", default=None,
                   help="where random-weight folders are cached (default: ~/.cache/inferq/random-models)")
    p.add_argument("--random-model-seed", type=int, default=0)
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--min-input", type=int, default=16)
    p.add_argument("--max-input", type=int, default=512)
    p.add_argument("--min-output", type=int, default=16)
    p.add_argument("--max-output", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch threads, the same for every system")
    p.add_argument("--repeats", type=int, default=1, help="runs per system; the median is reported")
    p.add_argument("--dtype", default=None, help="auto (default: bfloat16 on CUDA or CPUs with AVX512-BF16/AMX, else float32) | float32 | bfloat16 | float16")
    p.add_argument("--device", default=None)
    p.add_argument("--quantization", default=None, choices=["int8", "int4", "fp8"],
                   help="quantize an HF folder's weights at load (inferq's side only; the HF peers stay unquantized)")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--static-batch-size", type=int, default=16)
    p.add_argument("--peers", default="static,generate_batch",
                   help="comma list: static, generate_batch, vllm (its own venv, see --vllm-python), or none")
    p.add_argument("--vllm-python", default=None,
                   help="Python of vLLM's virtual environment (default: $INFERQ_VLLM_PYTHON; scripts/setup_vllm_peer.sh makes one)")
    p.add_argument("--vllm-after-inferq", action="store_true",
                   help="run inferq's repeats, free its engine, then start vLLM for its repeats (not interleaved): "
                        "for models too large to hold in both systems at once")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--step", action="store_true",
                   help="instead: per-step host time at batch 1/64/256 on a tiny model (see `--step --help`)")
    return p.parse_args(argv)


def random_folder(args):
    """The cached random-weight folder for --random-model, in the dtype the engine will run."""
    from inferq.bench.random_model import random_model_folder
    from inferq.gpuworker.config import EngineConfig

    cfg = EngineConfig(dtype=args.dtype, device=args.device)
    dtype = cfg.resolved_dtype(cfg.resolved_device())
    return random_model_folder(args.random_model, dtype=str(dtype).removeprefix("torch."),
                               seed=args.random_model_seed, root=args.random_model_dir)


def _longest(*workloads: Workload) -> int:
    """Tokens of the longest request (its warm-up makes up to 8 per prompt): vLLM's
    max_model_len, since a real model's 32k-128k context would not fit its KV cache space."""
    return max(len(p) + max(o, 8) for wl in workloads for p, o in zip(wl.prompts, wl.output_lens))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--step" in argv:  # the per-step host overhead benchmark (inferq.bench.step, also `inferq bench step`)
        from inferq.bench.step import main as step_main

        argv.remove("--step")
        return step_main(argv)
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from inferq.gpuworker import LLM
    from inferq.gpuworker.engine import host_malloc
    from inferq.gpuworker.models.loader import resolve_model_folder
    from inferq.gpuworker.models.weight_memory import held_bytes, kv_cache_bytes, one_copy_bytes

    if args.random_model:
        if args.model:
            raise SystemExit("give --model or --random-model, not both")
        args.model = str(random_folder(args))

    llm = LLM(
        model=args.model, dtype=args.dtype, device=args.device, quantization=args.quantization,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=False,  # random prompts share nothing; keep the comparison about batching
    )
    eng = llm.engine
    dtype = next(eng.model.parameters()).dtype
    device, tokenizer, eos_ids = eng.device, eng.tokenizer, eng.eos_token_ids  # for the HF peers after eng is freed
    # Prompt ids below both the model's rows and the tokenizer's size (a random-weight folder
    # keeps the real vocabulary with the bundled, smaller tokenizer; vLLM rejects unknown ids).
    vocab = min(eng.model_config.vocab_size, len(eng.tokenizer))
    wl = make_workload(args.num_requests, args.min_input, args.max_input, args.min_output, args.max_output,
                       vocab, args.seed)
    print(f"workload: {args.num_requests} requests, {wl.prompt_tokens} prompt tokens, {wl.output_tokens} output tokens; "
          f"device {eng.device}, {dtype}, {args.threads} torch threads", flush=True)

    warm = make_workload(4, 8, 32, 4, 8, vocab, args.seed + 1)
    peers = [x for x in args.peers.split(",") if x and x != "none"]
    unknown = set(peers) - {"static", "generate_batch", "vllm"}
    if unknown:
        raise SystemExit(f"unknown peer(s) {sorted(unknown)}; choose static, generate_batch, vllm")
    vllm = None
    start_vllm = None
    if "vllm" in peers:
        from inferq.bench.vllm_peer import VllmPeer, vllm_python

        folder, _, _ = resolve_model_folder(args.model)
        peer_kwargs = dict(dtype=str(dtype).removeprefix("torch."), max_num_seqs=args.max_num_seqs,
                           max_num_batched_tokens=args.max_num_batched_tokens, threads=args.threads,
                           max_model_len=min(eng.model_config.max_model_len, _longest(wl, warm)))

        def start_vllm():
            peer = VllmPeer(vllm_python(args.vllm_python), str(folder), wl.prompts, wl.output_lens, **peer_kwargs)
            print(f"  vLLM ready after {peer.startup_s:.0f} s (load, compile, warm-up)", flush=True)
            return peer

        if not args.vllm_after_inferq:
            vllm = start_vllm()
    run_inferq(llm, warm)
    ours_s, vllm_s = [], []
    try:
        # Interleaved (inferq, vLLM, inferq, vLLM, ...): both see the same machine load.
        for _ in range(args.repeats):
            ours_s += timed(lambda: run_inferq(llm, wl), 1)
            if vllm is not None:
                vllm_s.append(vllm.run())
        mem = system_memory(include_children=False)  # the engine lives in this process
        results = [Result("inferq", ours_s, wl.output_tokens, mem)]
        print(f"  inferq: {results[-1].median_s:.1f} s {[round(x, 1) for x in ours_s]}; memory: {mem.describe()}; "
              f"weights {gib(held_bytes(eng.model))} GiB held ({gib(one_copy_bytes(eng.model))} GiB unquantized), "
              f"KV cache {gib(kv_cache_bytes(eng))} GiB", flush=True)
        if start_vllm is not None and args.vllm_after_inferq:
            # One system in memory at a time (a model too large for both side by side).
            llm = eng = None
            gc.collect()
            host_malloc.release_free_memory()  # the engine keeps freed memory for reuse: hand it back
            vllm = start_vllm()
            vllm_s = [vllm.run() for _ in range(args.repeats)]
        if vllm is not None:
            mem = system_memory(vllm.proc.pid)
            results.append(Result("vLLM LLM.generate", vllm_s, wl.output_tokens, mem))
            print(f"  {results[-1].system}: {results[-1].median_s:.1f} s {[round(x, 1) for x in vllm_s]}; "
                  f"memory: {mem.describe()}", flush=True)
    finally:
        if vllm is not None:
            vllm.close()
    peers = [x for x in peers if x != "vllm"]
    if peers:
        from transformers import AutoModelForCausalLM

        folder, _, _ = resolve_model_folder(args.model)
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa").to(device).eval()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
        llm = eng = None  # free the KV cache before the peers allocate theirs
        if "static" in peers:
            run_hf_static(hf, warm, args.static_batch_size, pad)
            secs = timed(lambda: run_hf_static(hf, wl, args.static_batch_size, pad), args.repeats)
            results.append(Result(f"HF generate (static batches of {args.static_batch_size})", secs, wl.output_tokens))
            print(f"  {results[-1].system}: {results[-1].median_s:.1f} s", flush=True)
        if "generate_batch" in peers:
            longest = max(len(p) + o for p, o in zip(wl.prompts, wl.output_lens))
            page = 16
            blocks = args.num_requests * (-(-longest // page))  # room for everything: no eviction
            secs = timed(lambda: run_hf_generate_batch(hf, wl, args.max_num_batched_tokens, blocks, page), args.repeats)
            results.append(Result("HF generate_batch (continuous batching)", secs, wl.output_tokens))
            print(f"  {results[-1].system}: {results[-1].median_s:.1f} s", flush=True)

    ours = results[0].tokens_per_s
    print()
    print("| system | median wall s | output tok/s | inferq speed-up | resident GiB (PSS) | peak GiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        mem = (f"{gib(r.memory.pss_bytes)} | {gib(r.memory.peak_bytes)}" if r.memory else "- | -")
        print(f"| {r.system} | {r.median_s:.1f} | {r.tokens_per_s:.1f} | {ours / r.tokens_per_s:.2f}x | {mem} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": [asdict(r) | {"tokens_per_s": r.tokens_per_s} for r in results]}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
