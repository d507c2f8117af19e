"""ModelConfig normalisation across transformers versions and architectures."""
from __future__ import annotations

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from inferq.gpuworker.models.config import ModelConfig
from inferq.gpuworker.models.llama import rope_inv_freq

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 1024}


def test_rope_parameters_and_legacy_fields_agree():
    new = ModelConfig.from_hf({**BASE, "rope_parameters": {**LLAMA3, "rope_theta": 500000.0}})
    old = ModelConfig.from_hf({**BASE, "rope_theta": 500000.0, "rope_scaling": {**LLAMA3}})
    legacy_type_key = {k: v for k, v in LLAMA3.items() if k != "rope_type"} | {"type": "llama3"}
    older = ModelConfig.from_hf({**BASE, "rope_theta": 500000.0, "rope_scaling": legacy_type_key})
    assert new == old == older
    assert new.rope_theta == 500000.0 and new.rope_scaling["rope_type"] == "llama3"


def test_default_rope_means_no_scaling():
    cfg = ModelConfig.from_hf({**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}})
    assert cfg.rope_scaling is None and cfg.rope_theta == 1e4
    assert ModelConfig.from_hf(BASE).rope_theta == 10000.0


@pytest.mark.parametrize("scaling", [LLAMA3, {"rope_type": "linear", "factor": 4.0}, None])
def test_inverse_frequencies_match_transformers(scaling):
    params = {"rope_type": "default", **(scaling or {}), "rope_theta": 500000.0}
    hf_cfg = transformers.LlamaConfig(**{k: v for k, v in BASE.items() if k not in ("architectures", "model_type")},
                                      head_dim=32, rope_parameters=params)
    ours = ModelConfig.from_hf({**hf_cfg.to_dict(), "architectures": ["LlamaForCausalLM"]})
    if scaling is None:
        expected = 1.0 / (500000.0 ** (torch.arange(0, 32, 2).float() / 32))
    else:
        expected, factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf_cfg, "cpu")
        assert factor == 1.0
    assert torch.allclose(rope_inv_freq(ours), expected, rtol=1e-6, atol=0)


def test_unsupported_rope_type_is_rejected():
    with pytest.raises(ValueError, match="yarn.*not supported"):
        ModelConfig.from_hf({**BASE, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})


def test_unsupported_architecture_names_the_supported_ones():
    with pytest.raises(ValueError) as err:
        ModelConfig.from_hf({**BASE, "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    msg = str(err.value)
    assert "GPT2LMHeadModel" in msg
    for arch in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        assert arch in msg


def test_family_switches():
    qwen2 = ModelConfig.from_hf({**BASE, "architectures": ["Qwen2ForCausalLM"], "eos_token_id": [5, 7],
                                 "use_sliding_window": False, "sliding_window": 32})
    assert qwen2.attention_bias and not qwen2.o_proj_bias and not qwen2.qk_norm
    assert qwen2.eos_token_ids == [5, 7] and qwen2.eos_token_id == 5
    assert qwen2.sliding_window is None and qwen2.max_model_len == 4096
    qwen3 = ModelConfig.from_hf({**BASE, "architectures": ["Qwen3ForCausalLM"], "head_dim": 128, "dtype": "bfloat16"})
    assert qwen3.qk_norm and qwen3.head_dim == 128 and not qwen3.attention_bias
    assert qwen3.torch_dtype == torch.bfloat16
    mistral = ModelConfig.from_hf({**BASE, "architectures": ["MistralForCausalLM"], "sliding_window": 1024})
    assert mistral.max_model_len == 1024  # full attention is exact only inside the window
    llama = ModelConfig.from_hf({**BASE, "attention_bias": True, "torch_dtype": "float16"})
    assert llama.attention_bias and llama.o_proj_bias and llama.torch_dtype == torch.float16
    assert llama.head_dim == 16 and llama.num_kv_heads == 2


def test_bad_head_counts_and_missing_fields():
    with pytest.raises(ValueError, match="multiple"):
        ModelConfig.from_hf({**BASE, "num_key_value_heads": 3})
    with pytest.raises(ValueError, match="hidden_size"):
        ModelConfig.from_hf({k: v for k, v in BASE.items() if k != "hidden_size"})
