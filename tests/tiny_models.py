"""Tiny random Llama-family models saved as real Hugging Face folders.

    from tests.tiny_models import save_tiny_model, TINY_ARCHS
    folder = save_tiny_model("qwen3", tmp_path / "qwen3")   # ~0.5 s once the tokenizer is cached
    LLM(model=str(folder))                                  # our engine
    AutoModelForCausalLM.from_pretrained(folder)            # the HF oracle, same weights

Each folder has config.json, model.safetensors (fp32) and the SmolLM2 tokenizer
(vocab 49152, chat template included), copied from the converted bundled GGUF
(the first call in a fresh cache converts it: ~20 s). Every arch exercises its own
switch: llama = llama3 rope scaling + untied lm_head; mistral = tied embeddings;
qwen2 = q/k/v bias; qwen3 = q/k norm + explicit head_dim != hidden/heads.

Weights are drawn wider than HF's init (std 1/sqrt(fan_in), embeddings and lm_head N(0,1),
norm weights 1 +- 0.1, non-zero biases) so logits have a real spread and greedy
decoding is not a coin toss between near-tied tokens. ``**overrides`` go to the
transformers config (e.g. ``num_hidden_layers=4``, ``max_position_embeddings=1024``).
"""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import torch

TINY_ARCHS = ("llama", "mistral", "qwen2", "qwen3")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")

_BASE = dict(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)


def _config(arch: str, overrides: dict):
    import transformers

    if arch == "llama":
        cls = transformers.LlamaConfig
        extra = dict(
            tie_word_embeddings=False,
            # original length well below the test lengths, so the scaling matters
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        )
    elif arch == "mistral":
        cls = transformers.MistralConfig
        extra = dict(tie_word_embeddings=True, sliding_window=None)
    elif arch == "qwen2":
        cls = transformers.Qwen2Config
        extra = dict(tie_word_embeddings=False, use_sliding_window=False)
    elif arch == "qwen3":
        cls = transformers.Qwen3Config
        extra = dict(tie_word_embeddings=True, head_dim=32, use_sliding_window=False)
    else:
        raise ValueError(f"unknown tiny arch {arch!r}; choose from {', '.join(TINY_ARCHS)}")
    kwargs = {**_BASE, **extra, **overrides}
    rope_scaling = kwargs.pop("rope_scaling", None)
    rope_theta = kwargs.pop("rope_theta")
    cfg = cls(**kwargs)
    # transformers 5 keeps theta and scaling together in rope_parameters
    cfg.rope_parameters = {"rope_type": "default", **(rope_scaling or {}), "rope_theta": rope_theta}
    return cfg


def _randomise(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))


def tokenizer_source() -> Path:
    """Folder with the SmolLM2 tokenizer files (the converted bundled GGUF)."""
    from inferq.gpuworker.models.loader import bundled_model_path, converted_folder

    return converted_folder(bundled_model_path())


def save_tiny_model(arch: str, folder: Path, seed: int = 0, **overrides) -> Path:
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    cfg = _config(arch, overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    _randomise(model, seed)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    src = tokenizer_source()
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, folder / name)
    return folder
