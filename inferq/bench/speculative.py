"""Speculative decoding: n-gram prompt lookup against plain decoding, side by side.

Two workloads, each at several batch sizes (requests are run in waves of that
many at once, so "batch 8" means 8 sequences decode together):

* copy-heavy: chat requests that rewrite, extract from, quote or summarise a
  500-1,500 token document (inferq.bench.copy_documents);
* random: random prompt token ids (as ``inferq bench offline``), sampled at
  temperature 1 (greedy, this small model falls into loops that prompt lookup
  predicts): the output repeats next to nothing, so nearly every proposal fails
  and the row measures what speculation costs when it cannot pay.

Copy is greedy. Every system makes the same number of tokens per request (the
plain engine's own greedy lengths on the copy workload, fixed lengths on the
random one, EOS ignored), so tokens/s compare the same work. "decode tok/s"
leaves out the time to first token (a prompt-only pass of the same waves, timed
per system), which speculation cannot change: 700-1,400 prompt tokens cost
about as much as the answer here. Runs alternate system by
system, repeat by repeat, on the same machine load. With ``--peers vllm``:
vLLM's CPU build, plain and with its n-gram speculation (the same k and n range).
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="inferq bench speculative", description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,8,32", help="comma-separated batch sizes")
    p.add_argument("--workloads", default="copy,random")
    p.add_argument("--num-requests", type=int, default=8, help="requests per workload (at least one wave of the largest batch)")
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--min-n", type=int, default=2)
    p.add_argument("--max-n", type=int, default=4)
    p.add_argument("--max-batch", type=int, default=None, help="speculation's global switch-off (default: the engine's)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--peers", default="none", help="vllm or none")
    p.add_argument("--vllm-python", default=None)
    p.add_argument("--peer-batches", default="1", help="batch sizes at which the vLLM peers run (each cell starts 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--doc-lines", default="16,40", help="copy workload: lines per document, min,max (700-1,400 tokens)")
    p.add_argument("--random-prompt", default="500,1500", help="random workload: prompt tokens, min,max")
    return p.parse_args(argv)


def _waves(llm, prompts, params, batch: int):
    outs = []
    for i in range(0, len(prompts), batch):
        outs += llm.generate(prompts[i : i + batch], params[i : i + batch])
    return outs


def _start_peers(args, workload: str, batch: int, prompts, lens, vspec, temperature: float) -> dict:
    """vLLM plain, with n-gram speculation, and a first-token-only pass (for the decode rate)."""
    from inferq.bench.vllm_peer import VllmPeer, vllm_python
    from inferq.gpuworker.models.loader import resolve_model_folder

    folder, _, _ = resolve_model_folder(None)
    peers = {}
    for name, sc, out_lens in (("vLLM", None, lens), ("vLLM + n-gram", vspec, lens), ("prefill", None, [1] * len(lens))):
        try:
            peers[name] = VllmPeer(vllm_python(args.vllm_python), str(folder), prompts, out_lens, dtype=args.dtype,
                                   max_num_seqs=batch, max_num_batched_tokens=2048, threads=args.threads,
                                   speculative=sc, batch=batch, temperature=temperature, kv_cache_gib=1)
            peers[name].times = []
        except RuntimeError as e:
            print(f"vLLM peer {name!r} (batch {batch}, {workload}) did not start: {str(e).splitlines()[0]}",
                  file=sys.stderr)
    if "prefill" not in peers:  # no decode rate without it
        for p in peers.values():
            p.close()
        return {}
    return peers


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from inferq.gpuworker import LLM
    from inferq.bench.copy_documents import copy_chats
    from inferq.schemas import SamplingParams

    batches = [int(b) for b in args.batches.split(",")]
    n_req = max(args.num_requests, max(batches))
    spec = {"method": "ngram", "k": args.k, "min_n": args.min_n, "max_n": args.max_n}
    if args.max_batch:
        spec["max_batch"] = args.max_batch
    # 1 GiB of KV each (~23,000 fp32 tokens): two engines and three vLLM peers fit in 24 GiB.
    common = dict(dtype=args.dtype, max_num_seqs=max(batches), max_num_batched_tokens=2048, enable_prefix_caching=False,
                  kv_cache_memory=1 << 30)
    plain = LLM(**common)
    specul = LLM(**common, speculative=spec)
    switch_off = specul.engine.spec.config.max_batch

    workloads = {}
    if "copy" in args.workloads:
        lo, hi = (int(x) for x in args.doc_lines.split(","))
        prompts = [plain.apply_chat_template(c) for c in copy_chats(n_req, seed=args.seed, min_lines=lo, max_lines=hi)]
        first = plain.generate(prompts, SamplingParams(max_tokens=args.max_tokens, temperature=0))
        lens = [max(1, len(o.token_ids)) for o in first]
        workloads["copy"] = (prompts, lens, 0.0)
    if "random" in args.workloads:
        rng = random.Random(args.seed)
        vocab = len(plain.tokenizer)
        lo, hi = (int(x) for x in args.random_prompt.split(","))
        prompts = [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n_req)]
        workloads["random"] = (prompts, [args.max_tokens] * n_req, 1.0)  # sampled: the output repeats nothing

    vspec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": args.min_n,
             "prompt_lookup_max": args.max_n}
    peer_batches = {int(b) for b in args.peer_batches.split(",")} if args.peers == "vllm" else set()

    print(f"SmolLM2-135M-Instruct, {args.dtype}, {args.threads} thread(s), greedy; n-gram k={args.k} "
          f"n={args.min_n}..{args.max_n}, speculation off above {switch_off} running requests; "
          f"{n_req} requests per workload in waves of the batch size")
    print()
    print("| workload | batch | system | median wall s | output tok/s | decode tok/s | decode vs plain inferq "
          "| proposed | accepted | acceptance |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for w, (prompts, lens, temp) in workloads.items():
        params = [SamplingParams(max_tokens=n, temperature=temp, seed=i if temp else None, ignore_eos=True)
                  for i, n in enumerate(lens)]
        first_only = [SamplingParams(max_tokens=1, temperature=0, ignore_eos=True) for _ in lens]
        total = sum(lens)
        for b in batches:
            peers = _start_peers(args, w, b, prompts, lens, vspec, temp) if b in peer_batches else {}
            try:
                runs = {"inferq": [], "inferq + n-gram": [], **{k: [] for k in peers if k != "prefill"}}
                prefill = []
                s0 = specul.engine.stats().spec
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    _waves(plain, prompts, first_only, b)
                    prefill.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    _waves(plain, prompts, params, b)
                    runs["inferq"].append(time.perf_counter() - t)
                    t = time.perf_counter()
                    outs = _waves(specul, prompts, params, b)
                    runs["inferq + n-gram"].append(time.perf_counter() - t)
                    assert sum(len(o.token_ids) for o in outs) == total
                    for k, peer in peers.items():
                        if k == "prefill":
                            peers["prefill"].times.append(peer.run())
                        else:
                            runs[k].append(peer.run())
                s1 = specul.engine.stats().spec
            finally:
                for peer in peers.values():
                    peer.close()
            proposed = (s1.num_draft_tokens - s0.num_draft_tokens) // args.repeats
            accepted = (s1.num_accepted_tokens - s0.num_accepted_tokens) // args.repeats
            first_s = {"inferq": statistics.median(prefill)}
            if "prefill" in peers:
                first_s["vLLM"] = statistics.median(peers["prefill"].times)
            decode = {}
            for k, v in runs.items():
                wall = statistics.median(v)
                decode[k] = (total - len(lens)) / max(1e-9, wall - first_s["vLLM" if k.startswith("vLLM") else "inferq"])
            for k, v in runs.items():
                wall = statistics.median(v)
                extra = ("| - | - | - |" if k not in ("inferq + n-gram",) else
                         f"| {proposed} | {accepted} | {accepted / proposed:.0%} |" if proposed else "| 0 | 0 | - |")
                print(f"| {w} | {b} | {k} | {wall:.2f} | {total / wall:.1f} | {decode[k]:.1f} | "
                      f"{decode[k] / decode['inferq']:.2f}x {extra}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
