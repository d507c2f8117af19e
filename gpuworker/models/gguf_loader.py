"""Read a llama.cpp GGUF file: its weights either as they are stored (native) or dequantized.

* native (``INFERQ_GGUF_WEIGHTS=native``, or ``auto``: native on a CPU where the quantized
  kernels build): ``metadata_folder`` caches config.json and the tokenizer files only, and
  ``native_tensors`` reads each weight's blocks into one copy in memory (the file's mapping
  is dropped after load); the model's linears run on them (gpuworker/models/quant_linear.py).
  A type without a kernel (IQ quants, Q2_K, Q3_K, ...) fails at load, naming the tensor.
* dequantize (the default, and on GPUs): ``converted_folder`` turns
  the file into a plain Hugging Face folder (config.json, fp32 model.safetensors, tokenizer
  files with the chat template), loaded like any other; every type gguf can read works.

Parsing and dequantising a GGUF takes ~15 s, so each folder is made once per file and cached
under ``$INFERQ_CACHE_DIR`` (default ``~/.cache/inferq``), keyed by file name, size and mtime.
It is written to a temporary folder and renamed into place, so a crash or a concurrent
converter never leaves a half-written folder behind.
"""
from __future__ import annotations

import gc
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


WEIGHTS_ENV = "INFERQ_GGUF_WEIGHTS"
WEIGHT_MODES = ("native", "dequantize")
# Dequantize until native wins on every measured axis: native is faster for one stream (1.25x
# llama.cpp vs 0.87x, docs/benchmarks.md) with a third of the memory, but its int8 activations
# move a small model's greedy answers (KL 0.007 vs 0.0016 on the bundled file, llama.cpp's level)
# and its prompt matmuls run behind the bf16 panels at 64 rows (docs/kernels.md).
DEFAULT_MODE = "dequantize"


def weights_mode(device: str = "cpu", setting: str | None = None) -> str:
    """How a GGUF's weights are loaded: ``setting`` or ``$INFERQ_GGUF_WEIGHTS`` ("native",
    "dequantize" (the default) or "auto": native on a CPU where the quantized kernels build)."""
    mode = (setting or os.environ.get(WEIGHTS_ENV) or DEFAULT_MODE).strip().lower()
    if mode not in (*WEIGHT_MODES, "auto"):
        raise ValueError(f"{WEIGHTS_ENV}={mode!r}: expected one of native, dequantize, auto")
    if mode != "auto":
        return mode
    if str(device).split(":")[0] != "cpu":
        return "dequantize"
    from inferq.gpuworker.models import quant_linear

    return "native" if quant_linear.load() is not None else "dequantize"


def converted_folder(gguf_path: str | Path) -> Path:
    """The HF folder holding this GGUF's weights, converting it on first use."""
    return _cached_folder(gguf_path, "", convert_gguf)


def metadata_folder(gguf_path: str | Path) -> Path:
    """A folder with this GGUF's config.json and tokenizer files, no weights (native loading)."""
    return _cached_folder(gguf_path, "-native", convert_metadata)


def _cached_folder(gguf_path: str | Path, suffix: str, write) -> Path:
    gguf_path = Path(gguf_path).expanduser().resolve()
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    root = cache_root() / "gguf"
    final = root / (cache_key(gguf_path) + suffix)
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        write(gguf_path, tmp)
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


def _hf_name(tensor_name: str, arch: str, cfg: dict) -> tuple[str, int | None]:
    """The HF name of a GGUF tensor and, for llama.cpp's permuted q/k rows, the head count
    to undo the permutation with (else None)."""
    base, _, kind = tensor_name.rpartition(".")
    if base in _TOP_NAMES:
        return f"{_TOP_NAMES[base]}.{kind}", None
    parts = base.split(".")
    if len(parts) != 3 or parts[0] != "blk" or parts[2] not in _LAYER_NAMES:
        raise ValueError(f"unexpected GGUF tensor {tensor_name!r}")
    heads = None
    if arch in _PERMUTED_ARCHS and parts[2] in ("attn_q", "attn_k"):
        heads = cfg["num_attention_heads" if parts[2] == "attn_q" else "num_key_value_heads"]
    return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{kind}", heads


def _rope_freqs(reader, cfg: dict) -> None:
    """Llama 3.1+ rope scaling baked into a ``rope_freqs`` tensor, into cfg."""
    from gguf.quants import dequantize

    for t in reader.tensors:
        if t.name.rpartition(".")[0] == "rope_freqs":
            cfg["rope_scaling"] = _llama3_scaling_from_factors(
                cfg, np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32))


def gguf_tensors(reader, cfg: dict) -> dict[str, torch.Tensor]:
    from gguf.quants import dequantize

    arch = _field(reader, "general.architecture")
    _rope_freqs(reader, cfg)
    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if t.name.rpartition(".")[0] == "rope_freqs":
            continue
        name, heads = _hf_name(t.name, arch, cfg)
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if heads:
            w = reverse_rotary_permutation(w, heads)
        out[name] = torch.from_numpy(np.array(w, dtype=np.float32, order="C", copy=True))
    return out


_FLOAT_TYPES = ("F32", "F16", "BF16")
TENSOR_TABLE = "gguf_tensors.json"  # in the metadata folder: tensor_table's list


def tensor_table(reader) -> list[dict]:
    """Each tensor's name, ggml type, shape (GGUF order: row length first), byte offset in
    the file and size: what native loading needs, cached beside config.json (parsing the
    metadata of a GGUF with its vocabulary takes seconds)."""
    return [{"name": t.name, "type": int(t.tensor_type), "type_name": t.tensor_type.name,
             "shape": [int(d) for d in t.shape], "offset": int(t.data_offset), "nbytes": int(t.n_bytes)}
            for t in reader.tensors]


def check_native_types(table: list[dict]) -> None:
    """Raise ValueError naming the first tensor whose type has no native CPU kernel."""
    from inferq.kernels.cpu.quant_reference import SUPPORTED

    for t in table:
        if t["type_name"] not in SUPPORTED and t["type_name"] not in _FLOAT_TYPES:
            raise ValueError(
                f"GGUF tensor {t['name']!r} is {t['type_name']}, which has no native CPU kernel (native kernels: "
                f"{', '.join(SUPPORTED)}); load this file with {WEIGHTS_ENV}=dequantize")


def native_tensors(gguf_path: Path, cfg: dict, table: list[dict]) -> dict[str, "torch.Tensor | tuple[torch.Tensor, int, int]"]:
    """Every tensor of ``table`` (``tensor_table``) under its HF name, as stored: a quantized
    weight as ``(packed uint8 [rows, row_bytes], ggml type id, k)``, one copy of the file's
    blocks (q/k rows put back in HF's order); an F16 matrix as float16, any other float tensor
    (norms, F32 / BF16 weights) as float32. The file's mapping is gone on return, so only these copies stay resident."""
    out = _read_native(gguf_path, cfg, table)
    gc.collect()  # the file's memmap is unmapped now, not at some later collection
    return out


def _read_native(gguf_path: Path, cfg: dict, table: list[dict]) -> dict:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    check_native_types(table)
    arch = cfg.get("gguf_architecture") or {v[1]: k for k, v in GGUF_ARCHITECTURES.items()}[cfg["model_type"]]
    data = np.memmap(gguf_path, dtype=np.uint8, mode="r")
    out: dict = {}
    for t in table:
        if t["name"].rpartition(".")[0] == "rope_freqs":
            continue
        name, heads = _hf_name(t["name"], arch, cfg)
        raw = data[t["offset"]:t["offset"] + t["nbytes"]]
        qtype = GGMLQuantizationType(t["type"])
        k, rows = t["shape"][0], int(np.prod(t["shape"][1:], dtype=np.int64))
        if t["type_name"] == "F16" and len(t["shape"]) == 2:  # kept at its width (quant_linear.FloatWeight)
            w = raw.view(np.float16).reshape(rows, k)
            out[name] = torch.from_numpy(np.array(reverse_rotary_permutation(w, heads) if heads else w, copy=True))
            continue
        if t["type_name"] in _FLOAT_TYPES:
            w = np.asarray(dequantize(raw.reshape(rows, -1), qtype), dtype=np.float32).reshape(rows, k)
            if len(t["shape"]) == 1:
                w = w.reshape(k)
            out[name] = torch.from_numpy(np.array(reverse_rotary_permutation(w, heads) if heads else w, copy=True))
            continue
        packed = raw.reshape(rows, -1)
        if heads:
            packed = reverse_rotary_permutation(packed, heads)
        out[name] = (torch.from_numpy(np.array(packed, dtype=np.uint8, order="C", copy=True)), t["type"], k)
    del data
    return out


def convert_metadata(gguf_path: Path, out_dir: Path) -> None:
    """config.json and the tokenizer files of a GGUF, no weights."""
    from transformers import AutoTokenizer

    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    cfg = gguf_config(reader)
    _rope_freqs(reader, cfg)
    cfg["gguf_architecture"] = _field(reader, "general.architecture")
    (out_dir / TENSOR_TABLE).write_text(json.dumps(tensor_table(reader)))
    del reader
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tokenizer.save_pretrained(str(out_dir))
    cfg["source_gguf"] = gguf_path.name
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))


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
