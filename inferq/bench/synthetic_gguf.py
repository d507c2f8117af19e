"""GGUF files of a real model's shape filled with random quantized blocks, for benchmarks.

    python -m inferq.bench.synthetic_gguf --shape llama-8b --type Q4_K_M

prints the path of ``<root>/<shape>-<type>-seed<seed>-<shape hash>.gguf`` (written once;
root: ``$INFERQ_CACHE_DIR/synthetic-gguf``, default ``~/.cache/inferq``). Nothing is
downloaded: a decode step's time depends on the tensor types and shapes, not on the
values, so random blocks (scales fixed to small finite values, so activations stay
finite) measure what a published file of that shape and type would, in llama.cpp and in
inferq alike. The tokenizer is the bundled SmolLM2 one, its token list padded with
``[PAD<i>]`` tokens up to the shape's vocabulary, as llama.cpp's converter pads one, but as
ordinary tokens: a random model's greedy output is often one such id over and over, and
both servers must stream it as text for a client to see and time each token.

Types per tensor follow llama-quantize's recipe for the file type (Q4_K_M: Q4_K
everywhere except the LM head and, in the first and last eighth of the layers and every
third one between, ``attn_v`` and ``ffn_down``, which are Q6_K). Tensors are written one
at a time, so memory stays at one tensor.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np

from inferq.bench.random_model_shapes import SHAPES, Shape

FILE_TYPES = {"Q4_K_M": 15, "Q8_0": 7, "Q4_0": 2}
TOKEN_TYPE_NORMAL = 1
_SCALE = np.float16(2.0 ** -14)  # keeps every dequantized weight well inside bf16/f16 range


def tensor_type(file_type: str, name: str, layer: int | None, n_layers: int) -> str:
    if file_type != "Q4_K_M":
        return "Q6_K" if name == "output.weight" and file_type == "Q4_0" else file_type
    if name == "output.weight":
        return "Q6_K"
    if layer is not None and name.endswith(("attn_v.weight", "ffn_down.weight")):
        if layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2:
            return "Q6_K"
    return "Q4_K"


def tensors_of(shape: Shape, file_type: str) -> list[tuple[str, str, int, int]]:
    """(gguf name, type, rows, k) of every weight matrix, in the file's order."""
    h, kv = shape.hidden_size, shape.num_kv_heads * shape.head_dim
    mats = [("token_embd.weight", None, shape.vocab_size, h)]
    for i in range(shape.num_layers):
        p = f"blk.{i}."
        mats += [(p + "attn_q.weight", i, h, h), (p + "attn_k.weight", i, kv, h), (p + "attn_v.weight", i, kv, h),
                 (p + "attn_output.weight", i, h, h), (p + "ffn_gate.weight", i, shape.intermediate_size, h),
                 (p + "ffn_up.weight", i, shape.intermediate_size, h),
                 (p + "ffn_down.weight", i, h, shape.intermediate_size)]
    if not shape.tie_word_embeddings:
        mats.append(("output.weight", None, shape.vocab_size, h))
    return [(n, tensor_type(file_type, n, i, shape.num_layers), rows, k) for n, i, rows, k in mats]


def random_blocks(qtype: str, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """``[rows, row_bytes]`` uint8 of random blocks of ``qtype`` with finite, small scales."""
    from gguf import GGMLQuantizationType
    from gguf.constants import GGML_QUANT_SIZES

    elems, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    blocks = rng.integers(0, 256, size=(rows, k // elems, nbytes), dtype=np.uint8)
    scale = np.frombuffer(_SCALE.tobytes(), dtype=np.uint8)
    # where each type keeps its f16 scale(s): (byte offsets in the block)
    at = {"Q4_K": (0, 2), "Q6_K": (nbytes - 2,), "Q8_0": (0,), "Q4_0": (0,)}[qtype]
    for off in at:
        blocks[:, :, off:off + 2] = scale
    return blocks.reshape(rows, -1)


def _tokenizer_fields(vocab: int) -> dict:
    from gguf import GGUFReader

    from inferq.gpuworker.models.loader import bundled_model_path

    reader = GGUFReader(str(bundled_model_path()))
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            out[key] = field.contents()
    pad = vocab - len(out["tokenizer.ggml.tokens"])
    if pad < 0:
        raise ValueError(f"vocabulary {vocab} is smaller than the bundled tokenizer's")
    out["tokenizer.ggml.tokens"] = list(out["tokenizer.ggml.tokens"]) + [f"[PAD{i}]" for i in range(pad)]
    out["tokenizer.ggml.token_type"] = list(out["tokenizer.ggml.token_type"]) + [TOKEN_TYPE_NORMAL] * pad
    return out


def write(path: Path, shape: Shape, file_type: str, seed: int = 0) -> None:
    from gguf import GGMLQuantizationType, GGUFWriter

    if shape.architecture != "LlamaForCausalLM":
        raise ValueError("synthetic GGUFs are written for llama shapes only")
    w = GGUFWriter(str(path), "llama")
    w.add_name(f"synthetic {file_type}")
    w.add_block_count(shape.num_layers)
    w.add_context_length(shape.max_position_embeddings)
    w.add_embedding_length(shape.hidden_size)
    w.add_feed_forward_length(shape.intermediate_size)
    w.add_head_count(shape.num_heads)
    w.add_head_count_kv(shape.num_kv_heads)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(shape.rms_norm_eps)
    w.add_vocab_size(shape.vocab_size)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_file_type(FILE_TYPES[file_type])
    w.add_quantization_version(2)
    for key, value in _tokenizer_fields(shape.vocab_size).items():
        if isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_string(key, value)
    from gguf.constants import GGML_QUANT_SIZES

    mats = tensors_of(shape, file_type)
    norms = ["output_norm.weight"] + [f"blk.{i}.{n}.weight" for i in range(shape.num_layers)
                                      for n in ("attn_norm", "ffn_norm")]
    for name, qtype, rows, k in mats:
        elems, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
        w.add_tensor_info(name, (rows, k // elems * nbytes), np.dtype(np.uint8), rows * (k // elems) * nbytes,
                          raw_dtype=GGMLQuantizationType[qtype])
    for name in norms:
        w.add_tensor_info(name, (shape.hidden_size,), np.dtype(np.float32), shape.hidden_size * 4)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, qtype, rows, k in mats:
        w.write_tensor_data(random_blocks(qtype, rows, k, np.random.default_rng([seed, zlib.crc32(name.encode())])))
    for _ in norms:
        w.write_tensor_data(np.ones(shape.hidden_size, dtype=np.float32))
    w.close()


def synthetic_gguf(shape_name: str, file_type: str = "Q4_K_M", root: str | Path | None = None, seed: int = 0) -> Path:
    """The file for (shape, type, seed), written once under ``root``."""
    if shape_name not in SHAPES:
        raise ValueError(f"unknown shape {shape_name!r}; choose from {', '.join(SHAPES)}")
    if file_type not in FILE_TYPES:
        raise ValueError(f"unknown file type {file_type!r}; choose from {', '.join(FILE_TYPES)}")
    shape = SHAPES[shape_name]
    if root is None:
        from inferq.gpuworker.models.gguf_loader import cache_root

        root = cache_root() / "synthetic-gguf"
    root = Path(root)
    path = root / f"{shape_name}-{file_type}-seed{seed}-{shape.fingerprint()}.gguf"
    if path.exists():
        return path
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=root, suffix=".gguf.partial")
    os.close(fd)
    try:
        write(Path(tmp), shape, file_type, seed)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)  # the finished file appears whole, never half-written
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="inferq bench synthetic-gguf", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-8b", choices=sorted(SHAPES))
    ap.add_argument("--type", default="Q4_K_M", choices=sorted(FILE_TYPES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--root", default=None, help="folder for the files (default: the inferq cache)")
    args = ap.parse_args(argv)
    print(synthetic_gguf(args.shape, args.type, args.root, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
