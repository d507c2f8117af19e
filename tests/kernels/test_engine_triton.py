"""The engine on the triton backend gives the same greedy tokens as on the torch backend.

A tiny random Llama (2 layers, 4 query / 2 KV heads, head size 16) so the
interpreted kernels stay fast. The token budget is small, so prompts are
chunked across steps, chunks start mid-block and share steps with decodes;
running the same prompts a second time hits the prefix cache, so attention
then starts from cached context.
"""
from __future__ import annotations

import pytest
import torch

from inferq.gpuworker import LLM
from inferq.schemas import SamplingParams
from tests.kernels.conftest import DEVICE
from tests.tiny_models import save_tiny_model

PROMPTS = [
    "The quick brown fox jumps over the lazy dog because",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22",
    "Paged attention",
    "Hello",
]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return str(save_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama")))


def run(model: str, backend: str) -> tuple[list[list[int]], list[list[int]], int]:
    llm = LLM(
        model=model,
        attention_backend=backend,
        device=str(DEVICE),
        dtype="float32",
        block_size=16,
        max_num_batched_tokens=12,  # forces chunked prefill next to decodes
        max_num_seqs=8,
        num_kv_blocks=64,
    )
    assert llm.engine.backend.name == backend
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    first = [out.token_ids for out in llm.generate(PROMPTS, params)]
    second = llm.generate(PROMPTS, params)  # same prompts again: prefix-cache hits
    cached = sum(out.num_cached_tokens for out in second)
    llm.engine.check_invariants()
    return first, [out.token_ids for out in second], cached


def test_triton_backend_generates_the_same_greedy_tokens_as_torch(tiny_llama):
    torch_first, torch_second, torch_cached = run(tiny_llama, "torch")
    triton_first, triton_second, triton_cached = run(tiny_llama, "triton")
    assert all(len(tokens) == 6 for tokens in triton_first)
    assert triton_first == torch_first
    assert triton_cached == torch_cached > 0, "the second pass should start from cached prefixes"
    assert triton_second == torch_second == torch_first
