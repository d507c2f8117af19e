"""Structured outputs: what a JSON Schema on every request costs, side by side.

One mix of chat requests (the tests' eleven schemas and prompts, cycled), greedy,
prefix caching off. Rows, interleaved run by run so every system sees the same
machine load:

* inferq with a JSON Schema on every request (stops where the grammar ends);
* inferq unconstrained, each request held to exactly the token count its
  constrained run made (EOS ignored): the same tokens and batch shapes, without
  masks, so the ratio is the constraint's cost alone;
* with ``--peers vllm``: vLLM's CPU build with the same schemas (its default
  backend, one-line JSON as here) and unconstrained at the same lengths.

Plus compile time: cold (first use of each schema) and cached (a copy).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="inferq bench structured", description=__doc__.splitlines()[0])
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--peers", default="none", help="vllm or none")
    p.add_argument("--vllm-python", default=None)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from inferq.gpuworker import LLM
    from inferq.bench.structured_cases import PROMPTS, SCHEMAS
    from inferq.gpuworker.engine.grammar import GrammarCompiler
    from inferq.gpuworker.models.loader import resolve_model_folder
    from inferq.schemas import SamplingParams, StructuredOutputs

    llm = LLM(dtype=args.dtype, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              enable_prefix_caching=False)
    eng = llm.engine
    names = [list(SCHEMAS)[i % len(SCHEMAS)] for i in range(args.num_requests)]
    prompts = [llm.apply_chat_template([{"role": "user", "content": f"Request {i}. {PROMPTS[n]}"}])
               for i, n in enumerate(names)]
    constraints = [StructuredOutputs(json=SCHEMAS[n]) for n in names]

    # Compile time: a fresh compiler (cold: tokenizer info already built), then hits.
    g = GrammarCompiler(eng.tokenizer, eng.model_config.vocab_size, eng.eos_token_ids)
    g.tokenizer  # noqa: B018  (built once per process, not per schema)
    cold, hot = [], []
    for name in SCHEMAS:
        so = StructuredOutputs(json=SCHEMAS[name])
        t = time.perf_counter()
        g.matcher(so)
        cold.append(time.perf_counter() - t)
        t = time.perf_counter()
        g.matcher(so)
        hot.append(time.perf_counter() - t)

    constrained = [SamplingParams(max_tokens=args.max_tokens, temperature=0, structured_outputs=c) for c in constraints]
    warm = llm.generate(prompts[:4], constrained[:4])  # also compiles this mix's grammars
    del warm
    first = llm.generate(prompts, constrained)
    lens = [len(o.token_ids) for o in first]
    finished = sum(o.finish_reason == "stop" for o in first)
    free = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in lens]
    total = sum(lens)

    vllm = None
    if args.peers == "vllm":
        from inferq.bench.vllm_peer import VllmPeer, vllm_python

        folder, _, _ = resolve_model_folder(None)
        vllm_c = VllmPeer(vllm_python(args.vllm_python), str(folder), prompts, [args.max_tokens] * len(prompts),
                          dtype=args.dtype, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens, threads=args.threads,
                          constraints=[{"json": SCHEMAS[n]} for n in names])
        vllm_f = VllmPeer(vllm_python(args.vllm_python), str(folder), prompts, lens, dtype=args.dtype,
                          max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                          threads=args.threads)
        vllm = (vllm_c, vllm_f)
    rows: dict[str, list[tuple[float, int]]] = {"inferq, JSON Schema on every request": [],
                                                 "inferq, unconstrained (same lengths)": []}
    if vllm:
        rows["vLLM, JSON Schema on every request"] = []
        rows["vLLM, unconstrained (same lengths)"] = []
    try:
        for _ in range(args.repeats):
            t = time.perf_counter()
            outs = llm.generate(prompts, constrained)
            rows["inferq, JSON Schema on every request"].append((time.perf_counter() - t, sum(len(o.token_ids) for o in outs)))
            t = time.perf_counter()
            llm.generate(prompts, free)
            rows["inferq, unconstrained (same lengths)"].append((time.perf_counter() - t, total))
            if vllm:
                rows["vLLM, JSON Schema on every request"].append(vllm[0].run_counted())
                rows["vLLM, unconstrained (same lengths)"].append(vllm[1].run_counted())
    finally:
        if vllm:
            for v in vllm:
                v.close()

    dtype = str(next(eng.model.parameters()).dtype).removeprefix("torch.")
    print(f"{args.num_requests} chat requests, {len(SCHEMAS)} schemas cycled, greedy, {dtype}, {args.threads} thread(s); "
          f"inferq's constrained run: {total} output tokens, {finished}/{len(first)} ended by their grammar")
    print()
    print("| system | median wall s | output tokens | output tok/s | vs inferq unconstrained |")
    print("| --- | ---: | ---: | ---: | ---: |")
    tps = {k: statistics.median(tok / s for s, tok in v) for k, v in rows.items()}
    base = tps["inferq, unconstrained (same lengths)"]
    for k, v in rows.items():
        print(f"| {k} | {statistics.median(s for s, _ in v):.2f} | {v[-1][1]} | {tps[k]:.1f} | {tps[k] / base:.2f}x |")
    if vllm:
        print()
        print(f"inferq / vLLM, both constrained: {tps['inferq, JSON Schema on every request'] / tps['vLLM, JSON Schema on every request']:.2f}x tok/s")
    print()
    print(f"compile (llguidance matcher, {len(SCHEMAS)} schemas): cold median {statistics.median(cold) * 1e3:.2f} ms "
          f"(max {max(cold) * 1e3:.2f} ms), cached median {statistics.median(hot) * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
