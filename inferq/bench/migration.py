"""What a taken-over job costs to finish: continued from its published tokens
(request migration) vs regenerated from the start, on the same engine.

A job of --prompt-len prompt tokens and --output-len output tokens is interrupted
after K of them. Continuing computes the prompt and the K tokens as one prefill,
then decodes the rest; regenerating prefills the prompt and decodes all of them
again. Sampled with a fixed seed, both give the reference run's tokens (checked).
Medians of --repeats, the two alternating; no prefix cache (a new worker has none).

    inferq bench migration [--dtype bfloat16] [--interrupt-at 32,64,96]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def finish(engine, rid: str, prompt: list[int], params, continued: list[int]) -> tuple[float, list[int]]:
    """Seconds until the request ends, and its output tokens (the continued ones first)."""
    t0 = time.perf_counter()
    engine.add_request(rid, prompt, params, continue_token_ids=continued)
    tokens = list(continued)
    while engine.has_unfinished():
        for d in engine.step():
            tokens += d.new_token_ids
    return time.perf_counter() - t0, tokens


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="inferq bench migration", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="HF folder or .gguf (default: the bundled SmolLM2)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--interrupt-at", default="16,64,112", help="K values: tokens published before the interruption")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from inferq.gpuworker import LLM
    from inferq.schemas import SamplingParams

    llm = LLM(model=args.model, dtype=args.dtype, enable_prefix_caching=False)
    eng = llm.engine
    vocab = eng.model_config.vocab_size
    prompt = torch.randint(100, min(vocab, 30_000), (args.prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    params = SamplingParams(max_tokens=args.output_len, temperature=0.8, top_p=0.95, seed=7, ignore_eos=True)
    finish(eng, "warm", prompt, params, [])
    _, reference = finish(eng, "ref", prompt, params, [])

    print(f"prompt {args.prompt_len} tokens, output {args.output_len}, {args.dtype}, {args.threads} thread(s), "
          f"medians of {args.repeats}")
    print(f"{'K':>5} {'continued s':>12} {'regenerated s':>14} {'ratio':>7}  same tokens")
    n = 0
    for k in (int(x) for x in args.interrupt_at.split(",")):
        cont, regen, same = [], [], True
        for _ in range(args.repeats):
            n += 1
            t, toks = finish(eng, f"c{n}", prompt, params, reference[:k])
            cont.append(t)
            same &= toks == reference
            t, toks = finish(eng, f"r{n}", prompt, params, [])
            regen.append(t)
            same &= toks == reference
        c, g = statistics.median(cont), statistics.median(regen)
        print(f"{k:>5} {c:>12.3f} {g:>14.3f} {g / c:>6.2f}x  {'yes' if same else 'NO'}")
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
