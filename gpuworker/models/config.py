"""One normalised view of a Hugging Face ``config.json`` for the Llama family.

transformers has moved fields around between versions (``rope_theta`` +
``rope_scaling`` became ``rope_parameters`` in 5.x, ``torch_dtype`` became
``dtype``); everything downstream reads this dataclass instead of the raw dict.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from inferq.gpuworker.models.registry import check_supported

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
}


@dataclass
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # {"rope_type": "linear"|"llama3", ...}; None = plain rotary
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # bias on q/k/v projections
    o_proj_bias: bool  # bias on the output projection (Llama/Qwen3 attention_bias; never Qwen2)
    mlp_bias: bool
    qk_norm: bool  # Qwen3: RMSNorm over each head of q and k before rotary
    bos_token_id: int | None
    eos_token_ids: list[int]
    torch_dtype: torch.dtype | None
    sliding_window: int | None = None  # only set when the model really uses one

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def max_model_len(self) -> int:
        """Longest sequence we can run exactly (full attention, no sliding window)."""
        if self.sliding_window:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> "ModelConfig":
        archs = raw.get("architectures") or []
        arch = check_supported(archs, raw.get("model_type"))
        model_type = raw.get("model_type") or ""

        def need(key: str):
            if raw.get(key) is None:
                raise ValueError(f"config.json for {arch} is missing {key!r}")
            return raw[key]

        hidden = int(need("hidden_size"))
        heads = int(need("num_attention_heads"))
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        head_dim = int(raw.get("head_dim") or hidden // heads)
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")

        rope_theta, rope_scaling = _rope(raw)

        is_qwen2 = arch == "Qwen2ForCausalLM"
        attn_bias = bool(raw.get("attention_bias", False))
        sliding = None
        if is_qwen2:
            if raw.get("use_sliding_window"):
                sliding = raw.get("sliding_window")
        elif arch == "MistralForCausalLM":
            sliding = raw.get("sliding_window")

        eos = raw.get("eos_token_id")
        eos_ids = [] if eos is None else ([int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)])
        dtype_name = raw.get("dtype") or raw.get("torch_dtype")
        if isinstance(dtype_name, str):
            dtype_name = dtype_name.replace("torch.", "")

        return cls(
            architecture=arch,
            model_type=model_type,
            vocab_size=int(need("vocab_size")),
            hidden_size=hidden,
            num_layers=int(need("num_hidden_layers")),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=int(need("intermediate_size")),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(raw.get("max_position_embeddings") or 2048),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=True if is_qwen2 else attn_bias,
            o_proj_bias=False if is_qwen2 else attn_bias,
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=_DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None,
            sliding_window=int(sliding) if sliding else None,
        )


def _rope(raw: dict[str, Any]) -> tuple[float, dict | None]:
    """Return (theta, scaling) from either the 5.x ``rope_parameters`` or the older
    ``rope_theta`` / ``rope_scaling`` fields. Unknown scaling types fail loudly:
    running them as plain rotary would give silently wrong text."""
    params = raw.get("rope_parameters")
    scaling = raw.get("rope_scaling")
    theta = raw.get("rope_theta")
    if isinstance(params, dict):
        if "rope_theta" in params:
            theta = params["rope_theta"]
        scaling = scaling or params
    theta = float(theta if theta is not None else 10000.0)
    if not scaling:
        return theta, None
    rope_type = scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope scaling type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    if rope_type == "default":
        return theta, None
    out = {k: v for k, v in scaling.items() if k not in ("type", "rope_theta")}
    out["rope_type"] = rope_type
    if "factor" not in out:
        raise ValueError(f"rope scaling {rope_type!r} needs a 'factor'")
    if rope_type == "llama3":
        for key in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if key not in out:
                raise ValueError(f"llama3 rope scaling needs {key!r}")
    return theta, out
