"""The shapes of real models, for random-weight benchmark folders
(``inferq bench offline --random-model NAME``).

Numbers copied from each model's published config.json on the Hugging Face Hub
(meta-llama/Llama-3.2-1B, Qwen/Qwen2.5-0.5B, meta-llama/Llama-3.1-8B); nothing
is downloaded. A ``Shape`` is a plain value, so a test can ``replace`` it with a
tiny one and write a folder in a second.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Shape:
    architecture: str  # LlamaForCausalLM | Qwen2ForCausalLM
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    rms_norm_eps: float
    rope_scaling: dict | None = field(default=None, hash=False)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def qkv_bias(self) -> bool:  # Qwen2 has biases on q/k/v (and nowhere else); Llama has none
        return self.architecture == "Qwen2ForCausalLM"

    def fingerprint(self) -> str:
        """Short hash of the shape: part of the cache folder's name, so a changed table
        never reuses a folder written for the old numbers."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:10]

    def hf_config(self, bos_token_id: int | None, eos_token_id: int | None, dtype: str) -> dict:
        """config.json as the Hub has it (legacy rope_theta / rope_scaling keys, which
        every transformers version and vLLM read)."""
        qwen = self.architecture == "Qwen2ForCausalLM"
        cfg = {
            "architectures": [self.architecture],
            "model_type": "qwen2" if qwen else "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "initializer_range": 0.02,
            "bos_token_id": bos_token_id,
            "eos_token_id": eos_token_id,
            "torch_dtype": dtype,
            "use_cache": True,
        }
        if qwen:
            cfg.update(use_sliding_window=False, sliding_window=self.max_position_embeddings,
                       max_window_layers=self.num_layers)
        else:
            cfg.update(attention_bias=False, mlp_bias=False, attention_dropout=0.0, pretraining_tp=1)
        return cfg


_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}

SHAPES: dict[str, Shape] = {
    "llama-1b": Shape(  # meta-llama/Llama-3.2-1B
        architecture="LlamaForCausalLM", hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8,
        intermediate_size=8192, vocab_size=128256, rope_theta=500000.0, tie_word_embeddings=True,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_scaling={**_LLAMA3_ROPE, "factor": 32.0},
    ),
    "qwen2.5-0.5b": Shape(  # Qwen/Qwen2.5-0.5B
        architecture="Qwen2ForCausalLM", hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
        intermediate_size=4864, vocab_size=151936, rope_theta=1000000.0, tie_word_embeddings=True,
        max_position_embeddings=32768, rms_norm_eps=1e-6,
    ),
    "llama-8b": Shape(  # meta-llama/Llama-3.1-8B
        architecture="LlamaForCausalLM", hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
        intermediate_size=14336, vocab_size=128256, rope_theta=500000.0, tie_word_embeddings=False,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_scaling={**_LLAMA3_ROPE, "factor": 8.0},
    ),
}


def parameter_count(shape: Shape) -> int:
    h, kv = shape.hidden_size, shape.num_kv_heads * shape.head_dim
    attn = h * h * 2 + h * kv * 2 + (h + 2 * kv if shape.qkv_bias else 0)
    mlp = 3 * h * shape.intermediate_size
    layer = attn + mlp + 2 * h
    head = 0 if shape.tie_word_embeddings else shape.vocab_size * h
    return shape.vocab_size * h + shape.num_layers * layer + h + head
