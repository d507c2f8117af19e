"""GGUF name/layout mapping for every GGUF architecture we accept.

Each tiny HF model is written out the way llama.cpp's converter would (its tensor
names, q/k rows permuted for "llama", Llama 3 rope scaling as a rope_freqs tensor),
then read back through our GGUF reader: config and tensors must come back equal
to the HF originals. The bundled SmolLM2 test covers real quantised data."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from inferq.gpuworker.models.config import ModelConfig
from inferq.gpuworker.models.gguf_loader import gguf_config, gguf_tensors
from inferq.gpuworker.models.llama import rope_inv_freq
from tests.tiny_models import save_tiny_model

TO_GGUF = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}
LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_name(hf: str) -> str:
    base, kind = hf.rsplit(".", 1)
    top = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    if base in top:
        return f"{top[base]}.{kind}"
    _, _, layer, rest = base.split(".", 3)
    return f"blk.{layer}.{TO_GGUF[rest]}.{kind}"


def write_like_llama_cpp(path, arch: str, hf_cfg: dict, tensors: dict[str, torch.Tensor], rope_freqs=None):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(hf_cfg["num_hidden_layers"])
    w.add_context_length(hf_cfg["max_position_embeddings"])
    w.add_embedding_length(hf_cfg["hidden_size"])
    w.add_feed_forward_length(hf_cfg["intermediate_size"])
    w.add_head_count(hf_cfg["num_attention_heads"])
    w.add_head_count_kv(hf_cfg["num_key_value_heads"])
    w.add_key_length(hf_cfg["head_dim"])
    w.add_layer_norm_rms_eps(hf_cfg["rms_norm_eps"])
    w.add_rope_freq_base(hf_cfg["rope_parameters"]["rope_theta"])
    w.add_vocab_size(hf_cfg["vocab_size"])
    w.add_bos_token_id(hf_cfg["bos_token_id"])
    w.add_eos_token_id(hf_cfg["eos_token_id"])
    for name, t in tensors.items():
        a = t.numpy()
        if arch == "llama" and ".q_proj." in name:
            a = llama_cpp_permute(a, hf_cfg["num_attention_heads"])
        elif arch == "llama" and ".k_proj." in name:
            a = llama_cpp_permute(a, hf_cfg["num_key_value_heads"])
        w.add_tensor(gguf_name(name), np.ascontiguousarray(a))
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_gguf_round_trip_restores_hf_config_and_tensors(arch, tmp_path):
    from gguf import GGUFReader

    overrides = {"rope_scaling": None} if arch == "llama" else {}
    folder = save_tiny_model(arch, tmp_path / "hf", **overrides)
    hf_cfg = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    path = tmp_path / f"{arch}.gguf"
    write_like_llama_cpp(path, arch, hf_cfg, tensors)

    reader = GGUFReader(str(path))
    cfg = gguf_config(reader)
    back = gguf_tensors(reader, cfg)
    assert sorted(back) == sorted(tensors)
    for name, t in tensors.items():
        assert torch.equal(back[name], t), name
    ours, original = ModelConfig.from_hf(cfg), ModelConfig.from_hf(hf_cfg)
    for field in ("architecture", "num_layers", "num_heads", "num_kv_heads", "head_dim", "hidden_size",
                  "intermediate_size", "rope_theta", "rope_scaling", "tie_word_embeddings", "attention_bias",
                  "qk_norm", "max_position_embeddings", "bos_token_id", "eos_token_ids"):
        assert getattr(ours, field) == getattr(original, field), field
    assert math.isclose(ours.rms_norm_eps, original.rms_norm_eps, rel_tol=1e-6)


def test_llama3_rope_freqs_tensor_becomes_llama3_scaling(tmp_path):
    from gguf import GGUFReader

    folder = save_tiny_model("llama", tmp_path / "hf", rope_scaling=LLAMA31, max_position_embeddings=131072)
    hf_cfg = json.loads((folder / "config.json").read_text())
    ours_cfg = ModelConfig.from_hf(hf_cfg)
    plain = ModelConfig.from_hf({**hf_cfg, "rope_parameters": {"rope_type": "default", "rope_theta": ours_cfg.rope_theta}})
    # llama.cpp stores the per-frequency divisor original/scaled
    factors = (rope_inv_freq(plain) / rope_inv_freq(ours_cfg)).numpy().astype(np.float32)
    path = tmp_path / "l31.gguf"
    write_like_llama_cpp(path, "llama", hf_cfg, load_file(str(folder / "model.safetensors")), rope_freqs=factors)
    reader = GGUFReader(str(path))
    cfg = gguf_config(reader)
    gguf_tensors(reader, cfg)
    assert ModelConfig.from_hf(cfg).rope_scaling == ours_cfg.rope_scaling


def test_unknown_rope_freqs_are_rejected(tmp_path):
    from gguf import GGUFReader

    folder = save_tiny_model("llama", tmp_path / "hf", rope_scaling=None)
    hf_cfg = json.loads((folder / "config.json").read_text())
    path = tmp_path / "odd.gguf"
    odd = np.linspace(1.0, 3.0, hf_cfg["head_dim"] // 2, dtype=np.float32)
    write_like_llama_cpp(path, "llama", hf_cfg, load_file(str(folder / "model.safetensors")), rope_freqs=odd)
    reader = GGUFReader(str(path))
    with pytest.raises(ValueError, match="rope_freqs"):
        gguf_tensors(reader, gguf_config(reader))
