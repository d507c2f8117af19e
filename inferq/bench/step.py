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

    from inferq.gpuworker.models.loader import bundled_model_path, converted_folder

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


# --penalties: what chat front ends commonly send (repetition as in HF/vLLM, OpenAI's two).
PENALTIES = dict(repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.2)


class StandInModel:
    """``--host-only``: the model replaced by a stand-in that costs nothing and
    touches little memory, so the columns show the host's work as a GPU host would
    see it (there the forward runs on the device and leaves the CPU's caches alone;
    here a real forward on the same core evicts them, and the host columns pay
    that too). Logits are overlapping views of one small buffer, row i peaking at
    token ``_PEAK - 97 i``: greedy picks ordinary tokens, so the detokenizer and
    the stop checks do their usual work."""

    _PEAK, _STRIDE = 40_000, 97

    def __init__(self, vocab: int, max_rows: int):
        if self._PEAK - self._STRIDE * (max_rows - 1) < 0 or self._PEAK >= vocab:
            raise ValueError(f"--host-only needs a vocabulary over {self._PEAK} tokens and at most "
                             f"{self._PEAK // self._STRIDE + 1} rows")
        self.vocab = vocab
        self.buf = torch.zeros(vocab + self._STRIDE * max_rows)
        self.buf[self._PEAK] = 1.0

    def __call__(self, ids, positions, kv_caches, meta):
        return torch.zeros(ids.shape[0], 1)

    def lm_logits(self, hidden):
        return self.buf.as_strided((hidden.shape[0], self.vocab), (self._STRIDE, 1))

    def compute_logits(self, hidden):  # the sampling path wants contiguous fp32 rows
        return self.lm_logits(hidden).contiguous()


def prefill_steps(batch: int, prompt_len: int, budget: int) -> int:
    return -(-batch * prompt_len // budget) + 1


def measure(llm, batch: int, prompt_len: int, steps: int, sampling: bool, seed: int = 0,
            penalties: bool = False) -> dict:
    from inferq.schemas import SamplingParams

    eng = llm.engine
    rng = random.Random(seed)
    vocab = eng.model_config.vocab_size
    extra = PENALTIES if penalties else {}
    # Early requests decode while later prompts prefill: room for that, so that all
    # `batch` requests are still running through the measured steps.
    max_tokens = steps + 8 + prefill_steps(batch, prompt_len, eng.scheduler.max_num_batched_tokens)
    params = (SamplingParams(max_tokens=max_tokens, temperature=0.8, top_p=0.95, ignore_eos=True, **extra)
              if sampling else SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **extra))
    for i in range(batch):
        eng.add_request(f"s{batch}-{i}", [rng.randrange(1000, vocab) for _ in range(prompt_len)], params)
    # Prefill until every request is decoding (with the real model: the KV cache
    # holds real values whatever the measured steps then run).
    model = eng.runner.model
    eng.runner.model = getattr(model, "real_model", model)
    while eng.scheduler.num_waiting or any(
        r.num_computed_tokens < r.num_tokens - 1 for r in eng.requests.values()
    ):
        eng.step()
    eng.runner.model = model
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
    p.add_argument("--host-only", action="store_true",
                   help="decode steps with a stand-in for the model (no compute, little memory): the host's "
                        "work alone, as on a GPU box")
    p.add_argument("--penalties", action="store_true",
                   help="every request also asks for repetition 1.1, frequency 0.2 and presence 0.2 penalties")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default=None)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from inferq.gpuworker import LLM

    sizes = [int(x) for x in args.batch_sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="inferq-step-") as tmp:
        model = args.model or str(make_tiny_model(Path(tmp) / "tiny"))
        biggest = max(sizes)
        budget = max(2048, biggest)
        blocks_per_seq = -(-(args.prompt_len + args.steps + 16 + prefill_steps(biggest, args.prompt_len, budget)) // 16)
        llm = LLM(model=model, dtype=args.dtype, device=args.device, max_num_seqs=biggest,
                  max_num_batched_tokens=budget, num_kv_blocks=biggest * blocks_per_seq + 16,
                  enable_prefix_caching=False)
        if args.host_only:
            stand_in = StandInModel(llm.engine.model_config.vocab_size, biggest)
            stand_in.real_model = llm.engine.runner.model
            llm.engine.runner.model = stand_in
        measure(llm, min(sizes), args.prompt_len, 5, args.sampling, penalties=args.penalties)  # warm-up
        results = [measure(llm, b, args.prompt_len, args.steps, args.sampling, penalties=args.penalties)
                   for b in sizes]
    eng = llm.engine
    print(f"decode steps on {'a tiny random Llama (2 layers, hidden 64)' if not args.model else args.model}, "
          f"{eng.device}, {eng.dtype}, {args.threads} thread(s), prompt {args.prompt_len}, "
          f"{'sampling (T=0.8, top-p 0.95)' if args.sampling else 'greedy'}"
          f"{' with repetition/frequency/presence penalties' if args.penalties else ''}; medians of {args.steps} steps"
          f"{'; HOST ONLY: the model is a stand-in (forward and sample columns are not model compute)' if args.host_only else ''}")
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
