"""Per-step host overhead of the engine: ``inferq bench offline --step``.

Runs decode steps at fixed batch sizes (default 1, 64, 256) on a tiny random
Llama (so model compute is small and host work shows), and splits each step's
wall time into

* schedule  - the scheduler (token budget, block allocation);
* prepare   - the model runner's input build (persistent block table, slot
              mapping, the packed host->device copy);
* forward   - the model (all layers, LM head of the sampled rows);
* sample    - token choice and the one device->host copy of the ids;
* output    - per-token bookkeeping: detokenizer, stop checks, prefix-cache
              block registration, deltas;

plus the number of blocking device->host transfers per step. On a CPU the
forward and sample columns are model compute; "host" = schedule + prepare +
output (+ the sample column's host part, which on a GPU is only the copy).
Medians over ``--steps`` decode steps, after every prompt is prefilled.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch


def make_tiny_model(folder: Path, seed: int = 0) -> Path:
    """A 2-layer random Llama (hidden 64) with the bundled SmolLM2 tokenizer."""
    import transformers

    from gpuworker.models.loader import bundled_model_path, converted_folder

    src = Path(converted_folder(bundled_model_path()))
    cfg = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
        rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg)
    model.save_pretrained(folder)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (src / f).exists():
            shutil.copy(src / f, folder / f)
    return folder


def measure(llm, batch: int, prompt_len: int, steps: int, sampling: bool, seed: int = 0) -> dict:
    from schemas import SamplingParams

    eng = llm.engine
    rng = random.Random(seed)
    vocab = eng.model_config.vocab_size
    params = (SamplingParams(max_tokens=steps + 8, temperature=0.8, top_p=0.95, ignore_eos=True)
              if sampling else SamplingParams(max_tokens=steps + 8, temperature=0, ignore_eos=True))
    for i in range(batch):
        eng.add_request(f"s{batch}-{i}", [rng.randrange(1000, vocab) for _ in range(prompt_len)], params)
    # Prefill until every request is decoding.
    while eng.scheduler.num_waiting or any(
        r.num_computed_tokens < r.num_tokens - 1 for r in eng.requests.values()
    ):
        eng.step()
    rows = []
    for _ in range(steps):
        eng.step()
        sched_s, rt, out_s = eng.last_step_times
        rows.append((sched_s, rt.prepare, rt.forward, rt.sample, out_s, rt.syncs))
    for rid in list(eng.requests):
        eng.abort(rid)
    med = [statistics.median(c) for c in zip(*rows)]
    ms = [1000 * x for x in med[:5]]
    return {"batch": batch, "schedule_ms": ms[0], "prepare_ms": ms[1], "forward_ms": ms[2], "sample_ms": ms[3],
            "output_ms": ms[4], "host_ms_excl_forward": ms[0] + ms[1] + ms[3] + ms[4],
            "host_ms_excl_forward_and_sample": ms[0] + ms[1] + ms[4],
            "syncs_per_step": max(r[5] for r in rows)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="inferq bench offline --step", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="HF folder (default: a tiny random 2-layer Llama, made here)")
    p.add_argument("--batch-sizes", default="1,64,256")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--sampling", action="store_true", help="temperature 0.8, top-p 0.95 instead of greedy")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default=None)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from gpuworker import LLM

    sizes = [int(x) for x in args.batch_sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="inferq-step-") as tmp:
        model = args.model or str(make_tiny_model(Path(tmp) / "tiny"))
        biggest = max(sizes)
        blocks_per_seq = -(-(args.prompt_len + args.steps + 16) // 16)
        llm = LLM(model=model, dtype=args.dtype, device=args.device, max_num_seqs=biggest,
                  max_num_batched_tokens=max(2048, biggest), num_kv_blocks=biggest * blocks_per_seq + 16,
                  enable_prefix_caching=False)
        measure(llm, min(sizes), args.prompt_len, 5, args.sampling)  # warm-up
        results = [measure(llm, b, args.prompt_len, args.steps, args.sampling) for b in sizes]
    eng = llm.engine
    print(f"decode steps on {'a tiny random Llama (2 layers, hidden 64)' if not args.model else args.model}, "
          f"{eng.device}, {eng.dtype}, {args.threads} thread(s), prompt {args.prompt_len}, "
          f"{'sampling (T=0.8, top-p 0.95)' if args.sampling else 'greedy'}; medians of {args.steps} steps")
    print()
    print("| batch | schedule ms | prepare ms | forward ms | sample ms | output+detok ms | host excl. forward ms | blocking syncs/step |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['batch']} | {r['schedule_ms']:.3f} | {r['prepare_ms']:.3f} | {r['forward_ms']:.3f} | "
              f"{r['sample_ms']:.3f} | {r['output_ms']:.3f} | {r['host_ms_excl_forward']:.3f} | {r['syncs_per_step']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
