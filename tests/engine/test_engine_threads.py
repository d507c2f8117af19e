"""The engine with torch (and so the C kernels) on 2 threads still decodes greedily as HF does."""
from __future__ import annotations

import torch

from inferq.gpuworker import LLM
from inferq.schemas import SamplingParams
from tests.engine.hf_oracle import compare_greedy, hf_greedy

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def test_greedy_equals_hf_on_two_threads(mixed_prompts, hf_smol):
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        llm = LLM(dtype="float32", block_size=16, max_num_batched_tokens=48, num_kv_blocks=64, max_num_seqs=16)
        outs = llm.generate(mixed_prompts, GREEDY)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)
    verdicts = []
    for prompt, out in zip(mixed_prompts, outs):
        assert out.finish_reason == "length" and len(out.token_ids) == GREEDY.max_tokens
        verdicts.append(compare_greedy(hf_smol, prompt, out.token_ids, hf_greedy(hf_smol, prompt, GREEDY.max_tokens)))
    assert verdicts.count("equal") >= len(verdicts) - 1, verdicts
