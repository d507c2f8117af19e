"""The engine on the GPU path in batch-invariant mode (Triton attention, matmuls and RMSNorm;
kernels interpreted on CPU, compiled on a GPU): a request's greedy tokens and the logits
they were picked from, bit for bit, do not depend on the requests beside it, on how its
prompt was chunked, nor on prefix-cache hits.

The model's own ops run as on CUDA (``prepack_weights=False, cpu_kernels=False``: no CPU
kernels, so the engine routes the matmuls and norms to the Triton kernels). A tiny random
Llama with a 512-token vocabulary keeps the interpreted LM head small; prompts are token ids.
Comparing the top logits bit for bit catches a last-bit difference that a lucky greedy
margin would hide.
"""
from __future__ import annotations

import random

import pytest

from inferq.gpuworker import LLM
from inferq.gpuworker.models.batch_invariant import InvariantLinear
from inferq.schemas import SamplingParams
from tests.kernels.conftest import DEVICE
from tests.tiny_models import save_tiny_model

VOCAB = 512
PARAMS = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=2, logprobs_mode="raw_logits")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return str(save_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama-bi"), vocab_size=VOCAB))


def prompts() -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (2, 19, 33)]


def engine(model: str, dtype: str, budget: int) -> LLM:
    llm = LLM(model=model, attention_backend="triton", device=str(DEVICE), dtype=dtype, block_size=16,
              max_num_batched_tokens=budget, max_num_seqs=8, num_kv_blocks=64, batch_invariant=True,
              prepack_weights=False, cpu_kernels=False)
    assert llm.engine.backend.batch_invariant
    assert isinstance(llm.engine.model.packed_lm_head, InvariantLinear)
    return llm


def answers(outs) -> list[tuple]:
    return [(list(o.token_ids), o.logprobs) for o in outs]


def test_a_requests_tokens_and_logits_do_not_depend_on_its_batch(tiny_llama):
    dtype = "bfloat16"  # the GPU default; one dtype: the interpreter is slow (fp32: the kernel tests)
    alone_llm = engine(tiny_llama, dtype, budget=256)
    alone = answers(alone_llm.generate([p], PARAMS)[0] for p in prompts())

    # Together, with a 16-token budget: prompts cut into chunks at different places, sharing
    # steps with each other's chunks and decodes, then again from the prefix cache (each
    # prompt's full blocks cached: the rest is a chunk after a context).
    llm = engine(tiny_llama, dtype, budget=16)
    together = answers(llm.generate(prompts(), PARAMS))
    again = llm.generate(prompts(), PARAMS)
    assert sum(o.num_cached_tokens for o in again) > 0
    assert together == alone
    assert answers(again) == alone
