"""Turn a llama.cpp GGUF file into a plain Hugging Face folder (config.json,
fp32 model.safetensors, tokenizer files with the chat template).

Parsing and dequantising a GGUF takes ~15 s, so ``converted_folder`` does it once
per file and caches the result under ``$INFERQ_CACHE_DIR`` (default
``~/.cache/inferq``), keyed by file name, size and mtime. The cache is written to
a temporary folder and renamed into place, so a crash or a concurrent converter
never leaves a half-written folder behind.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

# llama.cpp architecture -> (HF architecture, HF model_type)
GGUF_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}
# Mistral GGUFs use the "llama" architecture. Only llama.cpp's llama converter
# permutes q/k rows for its rotary layout; qwen2/qwen3 keep HF's order.
_PERMUTED_ARCHS = {"llama"}

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def cache_root() -> Path:
    return Path(os.environ.get("INFERQ_CACHE_DIR") or Path.home() / ".cache" / "inferq")


def cache_key(gguf_path: Path) -> str:
    st = gguf_path.stat()
    digest = hashlib.sha256(f"{gguf_path.name}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return f"{gguf_path.stem}-{digest}"


def converted_folder(gguf_path: str | Path) -> Path:
    """The HF folder holding this GGUF's weights, converting it on first use."""
    gguf_path = Path(gguf_path).expanduser().resolve()
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    root = cache_root() / "gguf"
    final = root / cache_key(gguf_path)
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        convert_gguf(gguf_path, tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").is_file():  # not a lost race: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def reverse_rotary_permutation(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation. HF pairs dimension i with i + D/2 of a
    head; llama.cpp interleaves them (2i, 2i+1). Rows of one head are reordered back."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _gguf_eos_ids(reader) -> list[int] | int | None:
    ids = [_field(reader, f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")]
    ids = list(dict.fromkeys(int(i) for i in ids if i is not None))
    return None if not ids else ids[0] if len(ids) == 1 else ids


def gguf_config(reader) -> dict:
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        supported = ", ".join(sorted(GGUF_ARCHITECTURES))
        raise ValueError(f"unsupported GGUF architecture {arch!r}; inferq supports GGUF architectures: {supported}")
    hf_arch, model_type = GGUF_ARCHITECTURES[arch]

    def meta(key: str, default=None):
        return _field(reader, f"{arch}.{key}", default)

    tensor_names = {t.name for t in reader.tensors}
    heads = int(meta("attention.head_count"))
    hidden = int(meta("embedding_length"))
    vocab = meta("vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    cfg = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(meta("feed_forward_length")),
        "num_hidden_layers": int(meta("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta("attention.head_count_kv", heads)),
        "head_dim": int(meta("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(meta("context_length", 2048)),
        "rope_theta": float(meta("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        # llama.cpp's end-of-turn / end-of-message ids end a reply too (Llama 3's <|eot_id|>).
        "eos_token_id": _gguf_eos_ids(reader),
        "hidden_act": "silu",
        "dtype": "float32",
    }
    if model_type == "qwen2":
        cfg["use_sliding_window"] = False
    scaling_type = meta("rope.scaling.type")
    if scaling_type == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(meta("rope.scaling.factor"))}
    elif scaling_type not in (None, "none"):
        raise ValueError(f"GGUF rope scaling {scaling_type!r} is not supported")
    return cfg


def _llama3_scaling_from_factors(cfg: dict, factors: np.ndarray) -> dict:
    """llama.cpp bakes Llama 3.1+ rope scaling into a ``rope_freqs`` tensor of
    per-frequency divisors. Recover the HF parameters (Meta ships one setting per
    factor) and check they reproduce the tensor."""
    from inferq.gpuworker.models.config import ModelConfig
    from inferq.gpuworker.models.llama import rope_inv_freq

    factor = float(factors.max())
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    probe = ModelConfig.from_hf({**cfg, "rope_scaling": scaling})
    plain = ModelConfig.from_hf({**cfg, "rope_scaling": None})
    ratio = (rope_inv_freq(plain) / rope_inv_freq(probe)).numpy()
    if ratio.shape != factors.shape or not np.allclose(ratio, factors, rtol=1e-3):
        raise ValueError("GGUF rope_freqs does not match Llama 3 rope scaling; this rope variant is not supported")
    return scaling


def gguf_tensors(reader, cfg: dict) -> dict[str, torch.Tensor]:
    from gguf.quants import dequantize

    arch = _field(reader, "general.architecture")
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        base, _, kind = t.name.rpartition(".")
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if base == "rope_freqs":
            cfg["rope_scaling"] = _llama3_scaling_from_factors(cfg, w)
            continue
        if base in _TOP_NAMES:
            name = f"{_TOP_NAMES[base]}.{kind}"
        else:
            parts = base.split(".")
            if len(parts) != 3 or parts[0] != "blk" or parts[2] not in _LAYER_NAMES:
                raise ValueError(f"unexpected GGUF tensor {t.name!r}")
            name = f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{kind}"
            if arch in _PERMUTED_ARCHS and parts[2] == "attn_q":
                w = reverse_rotary_permutation(w, cfg["num_attention_heads"])
            elif arch in _PERMUTED_ARCHS and parts[2] == "attn_k":
                w = reverse_rotary_permutation(w, cfg["num_key_value_heads"])
        out[name] = torch.from_numpy(np.array(w, dtype=np.float32, order="C", copy=True))
    return out


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    from gguf import GGUFReader
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    reader = GGUFReader(str(gguf_path))
    cfg = gguf_config(reader)
    tensors = gguf_tensors(reader, cfg)
    del reader
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tokenizer.save_pretrained(str(out_dir))
    cfg["source_gguf"] = gguf_path.name
    # config.json last: its presence marks a complete folder
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
