"""Engine fixtures: the bundled SmolLM2 and its HF twin, loaded once per session."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def smol_folder():
    from inferq.gpuworker.models.loader import bundled_model_path, converted_folder

    return converted_folder(bundled_model_path())


@pytest.fixture(scope="session")
def hf_smol(smol_folder):
    """The same weights in HF transformers (fp32, sdpa)."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(smol_folder, dtype=torch.float32, attn_implementation="sdpa")
    return model.eval()


@pytest.fixture(scope="session")
def smol_llm():
    """A shared engine with room to spare; tests that need tight limits build their own."""
    from inferq.gpuworker import LLM

    torch.set_num_threads(1)
    return LLM(dtype="float32", num_kv_blocks=256, max_num_batched_tokens=256)


@pytest.fixture(scope="session")
def mixed_prompts(smol_llm):
    """16 prompts from 3 to ~150 tokens, chat-formatted and raw."""
    tok = smol_llm.tokenizer
    topics = ["the sea", "a red fox", "prime numbers", "Paris", "rain", "a lighthouse", "Redis streams", "bread"]
    prompts = []
    for i, t in enumerate(topics):
        prompts.append(tok(f"Tell me about {t}.").input_ids)
        long_text = " ".join([f"Sentence {j} is about {t} and nothing else." for j in range(2 + 2 * i)])
        prompts.append(smol_llm.apply_chat_template([{"role": "user", "content": long_text + " Summarise."}]))
    return prompts


@pytest.fixture(autouse=True)
def _block_pool_invariant_after_each_test(request):
    """The shared engine must be consistent and idle after every test that used it."""
    yield
    if "smol_llm" in request.fixturenames:
        eng = request.getfixturevalue("smol_llm").engine
        eng.check_invariants()
        assert not eng.has_unfinished(), "a test left requests in the shared engine"
        assert eng.stats().num_free_blocks == eng.stats().num_blocks
