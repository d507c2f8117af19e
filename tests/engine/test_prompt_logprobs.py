"""Prompt logprobs against HF's teacher-forced log-softmax (fp32, same weights).

Bound: |ours - HF| <= 2e-3 nats for every recorded entry (the actual prompt
token and the top-N). Both sides are fp32 on CPU; they differ only in
summation order (our attention and matmul kernels vs HF's sdpa), which moves
logits by ~1e-5..1e-4 on this model; 2e-3 leaves room without hiding a wrong
position (an off-by-one shifts values by whole nats). The top-N ids must be
HF's top-N, except where HF's own logprobs are within 2e-3 (a near-tie).
"""
from __future__ import annotations

import pytest
import torch

from inferq.schemas import SamplingParams

BOUND = 2e-3


@torch.inference_mode()
def hf_prompt_logprobs(model, ids: list[int]) -> torch.Tensor:
    logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)  # row j: distribution of token j + 1


def check_against_hf(prompt_lps, ids, ref, n):
    assert len(prompt_lps) == len(ids) and prompt_lps[0] is None
    worst = 0.0
    for j in range(1, len(ids)):
        entry = prompt_lps[j]
        row = ref[j - 1]
        assert ids[j] in entry
        for tid, v in entry.items():
            worst = max(worst, abs(v - float(row[tid])))
        top = sorted((t for t in entry if t != ids[j] or len(entry) == n), key=lambda t: -entry[t])[:n]
        hf_top = row.topk(n)
        for k, (t, want) in enumerate(zip(top, hf_top.indices.tolist())):
            if t != want:  # allowed only as a near-tie in HF's own numbers
                assert abs(float(row[t]) - float(row[want])) <= BOUND, (j, k, t, want)
    assert worst <= BOUND, worst
    return worst


def test_prompt_logprobs_equal_hf_teacher_forced(smol_llm, hf_smol):
    tok = smol_llm.tokenizer
    text = " ".join(f"Line {i}: the lighthouse keeper counts {i * 7} ships in the harbour." for i in range(20))
    ids = tok(text).input_ids
    assert len(ids) > 256  # longer than the engine's token budget: prefilled in chunks
    out = smol_llm.generate([ids], SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=3))[0]
    check_against_hf(out.prompt_logprobs, ids, hf_prompt_logprobs(hf_smol, ids), 3)
    # Again: the prompt's blocks are now in the prefix cache, but prompt logprobs still cover every token.
    again = smol_llm.generate([ids], SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=3))[0]
    assert again.prompt_logprobs == out.prompt_logprobs
    # Without prompt_logprobs the same prompt does hit the cache.
    plain = smol_llm.generate([ids], SamplingParams(max_tokens=2, temperature=0))[0]
    assert plain.prompt_logprobs is None and plain.num_cached_tokens > 0


def test_prompt_logprobs_zero_gives_the_actual_tokens_only(smol_llm, hf_smol):
    ids = smol_llm.tokenizer("The capital of France is Paris.").input_ids
    outs = smol_llm.generate([ids, ids], [SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0),
                                          SamplingParams(max_tokens=1, temperature=0)])
    lps = outs[0].prompt_logprobs
    assert outs[1].prompt_logprobs is None
    ref = hf_prompt_logprobs(hf_smol, ids)
    assert lps[0] is None
    for j in range(1, len(ids)):
        assert list(lps[j]) == [ids[j]]
        assert lps[j][ids[j]] == pytest.approx(float(ref[j - 1, ids[j]]), abs=BOUND)


def test_prompt_logprobs_survive_chunking_preemption_and_shared_prefixes(tmp_path):
    """A tiny random Llama under a 40-token budget (chunks), 20 KV blocks
    (preemptions) and cached shared prefixes: every request's prompt logprobs still
    cover each prompt token once, and equal HF's teacher-forced log-softmax within
    the same bound."""
    import random

    from transformers import AutoModelForCausalLM

    from inferq.gpuworker import LLM
    from tests.tiny_models import save_tiny_model

    torch.set_num_threads(1)
    folder = save_tiny_model("llama", tmp_path / "llama")
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
    rng = random.Random(4)
    prompts = [[rng.randint(1000, 40000) for _ in range(k)] for k in (3, 17, 33, 64, 70, 95, 50, 40)]
    for i in (1, 4, 6):
        prompts[i] = prompts[5][:48] + prompts[i]
    llm = LLM(model=str(folder), dtype="float32", block_size=16, max_num_batched_tokens=40, num_kv_blocks=20, max_num_seqs=8)
    # A warm-up puts the shared prefix in the cache; every request then asks, so
    # whichever is preempted asked, and none may take hits over missing positions.
    llm.generate([prompts[5]], SamplingParams(max_tokens=1, temperature=0))
    outs = llm.generate(prompts, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, prompt_logprobs=2))
    stats = llm.engine.stats()
    assert stats.num_preemptions > 0
    llm.engine.check_invariants()
    for ids, out in zip(prompts, outs):
        check_against_hf(out.prompt_logprobs, ids, hf_prompt_logprobs(hf, ids), 2)
