"""Pooling requests (embeddings) through the whole engine: chunked prefill, paged KV,
preemption and prefix-cache hits, against HF transformers' final hidden states
(after the last norm) on the same random weights, float32."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from inferq.gpuworker import LLM
from inferq.gpuworker.engine.pooling import Pooling
from inferq.schemas import SamplingParams
from tests.tiny_models import save_tiny_model

# Our float32 kernels and HF's sum in different orders: the vectors agree to about
# 1e-6 per component (unit vectors of 64 components); this leaves room.
ATOL = 2e-5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.set_num_threads(1)
    folder = save_tiny_model("qwen3", tmp_path_factory.mktemp("pool") / "qwen3", max_position_embeddings=256)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
    return folder, hf


@torch.inference_mode()
def hf_vector(hf, ids: list[int], pooling: str, normalize: bool = True) -> np.ndarray:
    hidden = hf.model(torch.tensor([ids])).last_hidden_state[0].double()
    v = hidden.mean(0) if pooling == "mean" else hidden[-1]
    if normalize:
        v = v / v.norm()
    return v.float().numpy()


def prompts_for(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 3, 15, 16, 17, 33, 64, 70, 95] + [rng.randint(2, 90) for _ in range(n - 9)]
    return [[rng.randint(1000, 40000) for _ in range(k)] for k in lengths]


def run_all(eng) -> dict:
    """Step until idle; the vector of every pooling request, by request id."""
    got = {}
    while eng.has_unfinished():
        for d in eng.step():
            if d.embedding is not None:
                assert d.finished and d.new_token_ids == [] and d.finish_reason == "stop" and d.num_output_tokens == 0
                got[d.request_id] = d.embedding
    return got


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_embed_equals_hf_under_chunking_preemption_and_prefix_hits(tiny, pooling):
    folder, hf = tiny
    prompts = [p[:100] for p in prompts_for(16, seed=3)]
    for i in (1, 5, 9):  # a shared prefix: prefix-cache hits mid-run
        prompts[i] = prompts[6][:48] + prompts[i][:40]
    # A small cache and budget: chunked prompts, and growing generations preempt them.
    llm = LLM(model=str(folder), dtype="float32", block_size=16, max_num_batched_tokens=24, num_kv_blocks=10,
              max_num_seqs=16)
    eng = llm.engine
    for i in range(4):
        eng.add_request(f"gen-{i}", prompts[12 + i][:20], SamplingParams(max_tokens=60, temperature=0, ignore_eos=True))
    for i, p in enumerate(prompts[:12]):
        eng.add_request(f"emb-{i}", p, pooling=Pooling(pooling))
    got = run_all(eng)
    stats = eng.stats()
    assert stats.num_preemptions > 0  # the sums restart cleanly after a preemption
    assert stats.prefix_cache_hits > 0
    eng.check_invariants()
    assert stats.num_free_blocks == stats.num_blocks
    assert sorted(got) == sorted(f"emb-{i}" for i in range(12))
    for i, p in enumerate(prompts[:12]):
        v = got[f"emb-{i}"]
        assert v.dtype == np.float32 and v.shape == (64,)
        np.testing.assert_allclose(v, hf_vector(hf, p, pooling), atol=ATOL, rtol=0)
        assert abs(np.linalg.norm(v) - 1.0) < 1e-5


def test_llm_embed_in_order(tiny):
    folder, hf = tiny
    prompts = prompts_for(9, seed=4)
    outs = LLM(model=str(folder), dtype="float32", num_kv_blocks=64).embed(prompts, pooling="mean")
    for p, o in zip(prompts, outs):
        assert o.prompt_token_ids == p
        np.testing.assert_allclose(o.embedding, hf_vector(hf, p, "mean"), atol=ATOL, rtol=0)


def test_unnormalised_mean_and_engine_default(tiny):
    folder, hf = tiny
    p = prompts_for(9, seed=5)[6]
    llm = LLM(model=str(folder), dtype="float32", num_kv_blocks=64, pooling="mean")
    (out,) = llm.embed(p, normalize=False)  # pooling None: the engine's default, mean here
    np.testing.assert_allclose(out.embedding, hf_vector(hf, p, "mean", normalize=False), atol=1e-4, rtol=1e-5)
    assert abs(np.linalg.norm(out.embedding) - 1.0) > 1e-3


def test_embedding_is_batch_and_chunk_invariant(tiny):
    """The same input gives the same bits alone, in small chunks, and beside running
    generations; the generations make the same tokens as without it."""
    folder, _ = tiny
    prompts = prompts_for(12, seed=7)
    target = prompts[7]
    alone = LLM(model=str(folder), dtype="float32", num_kv_blocks=64)
    expected = {kind: alone.embed(target, pooling=kind)[0].embedding for kind in ("mean", "last")}
    greedy = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    plain = [o.token_ids for o in alone.generate(prompts[:6], greedy)]

    eng = LLM(model=str(folder), dtype="float32", num_kv_blocks=64, max_num_batched_tokens=24).engine
    tokens = {f"gen-{i}": [] for i in range(6)}
    for i, p in enumerate(prompts[:6]):
        eng.add_request(f"gen-{i}", p, greedy)
    got = {}
    for step in range(10_000):
        if step == 3:  # generations are decoding when the embeddings arrive
            for kind in ("mean", "last"):
                eng.add_request(f"emb-{kind}", target, pooling=Pooling(kind))
        if step > 3 and not eng.has_unfinished():
            break
        for d in eng.step():
            if d.embedding is not None:
                got[d.request_id] = d.embedding
            else:
                tokens[d.request_id] += d.new_token_ids
    assert [tokens[f"gen-{i}"] for i in range(6)] == plain
    for kind in ("mean", "last"):
        assert np.array_equal(got[f"emb-{kind}"], np.asarray(expected[kind], dtype=np.float32)), kind


def test_context_limit_for_pooling_requests(tiny):
    folder, hf = tiny
    llm = LLM(model=str(folder), dtype="float32", num_kv_blocks=64, max_model_len=32)
    full = prompts_for(9, seed=1)[7][:32]
    # Nothing is generated: an input may fill the whole context (a generation prompt may not).
    (out,) = llm.embed(full, pooling="last")
    np.testing.assert_allclose(out.embedding, hf_vector(hf, full, "last"), atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.engine.add_request("too-long", full + [5], pooling=Pooling("mean"))
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate([full])
    with pytest.raises(ValueError, match="unknown pooling"):
        Pooling("cls")


def test_pooling_requests_never_speculate(tiny):
    """With speculative decoding on, a prompt whose last chunk is one token looks like a
    decode to the proposer; a pooling request must still pool its prompt and nothing else."""
    folder, hf = tiny
    prompt = [5, 6, 7, 8] * 6 + [5]  # repetitive: the n-gram proposer would find a draft
    plain = LLM(model=str(folder), dtype="float32", num_kv_blocks=64).embed(prompt, pooling="mean")[0].embedding
    spec = LLM(model=str(folder), dtype="float32", num_kv_blocks=64, max_num_batched_tokens=24,
               speculative={"method": "ngram", "k": 4})
    for pooling in ("mean", "last"):
        (out,) = spec.embed(prompt, pooling=pooling)
        np.testing.assert_allclose(out.embedding, hf_vector(hf, prompt, pooling), atol=ATOL, rtol=0)
    assert spec.embed(prompt, pooling="mean")[0].embedding == plain
