"""A draft model proposes: outputs stay the target's (greedy), its KV follows the
target's block tables through preemption, and a useless draft costs only its
rejected proposals."""
from __future__ import annotations

import pytest
import torch

from inferq.gpuworker import LLM
from inferq.schemas import SamplingParams
from tests.engine.test_speculative import assert_same_greedy, copy_prompts


@pytest.fixture(scope="module")
def bundled():
    from inferq.gpuworker.models.loader import bundled_model_path

    return str(bundled_model_path())


def test_the_target_as_its_own_draft_accepts_everything_and_changes_nothing(bundled, smol_llm, hf_smol, mixed_prompts):
    torch.set_num_threads(1)
    greedy = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    prompts = mixed_prompts[:6] + copy_prompts(smol_llm, 2)
    # A small pool and budget: chunked prefill and preemption with the draft's KV in the same blocks.
    llm = LLM(dtype="float32", block_size=16, max_num_batched_tokens=48, num_kv_blocks=18, max_num_seqs=8,
              speculative={"method": "draft_model", "model": bundled, "k": 3})
    outs = llm.generate(prompts, greedy)
    st = llm.engine.stats()
    assert st.num_preemptions > 0
    llm.engine.check_invariants()
    assert st.num_free_blocks == st.num_blocks
    assert_same_greedy(hf_smol, prompts, outs, smol_llm.generate(prompts, greedy))
    # The same weights draft what the target decides (near-ties between batch shapes aside).
    assert st.spec.num_accepted_tokens >= 0.9 * st.spec.num_draft_tokens > 0


def test_a_random_draft_is_rejected_and_the_output_is_still_the_targets(tmp_path, smol_llm):
    from tests.tiny_models import save_tiny_model

    draft = save_tiny_model("llama", tmp_path / "draft")
    llm = LLM(dtype="float32", num_kv_blocks=128, speculative={"method": "draft_model", "model": str(draft), "k": 2})
    p = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    prompts = copy_prompts(smol_llm, 2)
    assert [o.token_ids for o in llm.generate(prompts, p)] == [o.token_ids for o in smol_llm.generate(prompts, p)]
    st = llm.engine.stats().spec
    assert st.num_drafts > 0 and st.num_accepted_tokens <= 0.2 * st.num_draft_tokens
    assert st.num_cooldowns > 0  # it stopped proposing for a while
    llm.engine.check_invariants()


def test_a_draft_with_a_larger_vocabulary_is_refused(tmp_path):
    from tests.tiny_models import save_tiny_model

    draft = save_tiny_model("llama", tmp_path / "big-vocab", vocab_size=50000)
    with pytest.raises(ValueError, match="same tokenizer"):
        LLM(dtype="float32", num_kv_blocks=16, speculative={"method": "draft_model", "model": str(draft)})
