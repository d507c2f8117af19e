"""Random-weight Hugging Face folders with a real model's shape, for benchmarks.

``random_model_folder("llama-1b", dtype="float32")`` writes (once) config.json,
sharded safetensors with an index, and the bundled SmolLM2 tokenizer into
``<root>/<name>-<dtype>-seed<seed>-<shape hash>`` and returns it; later calls
find the folder and write nothing. Root: ``--random-model-dir``, else
``$INFERQ_CACHE_DIR/random-models`` (default ``~/.cache/inferq/random-models``).

Speed depends on shapes, not on weight values, so small-std normal weights
(std 0.02, norms 1) do for throughput. Each tensor is drawn from its own
generator seeded by (seed, tensor name): the same seed gives the same folder
whatever the write order. One shard per layer (plus one for the embedding and
one for the head) keeps memory to a layer at a time: llama-8b is ~16 GB in
bfloat16 and never sits in RAM whole.

The vocabulary stays the real model's (128256 / 151936 rows) although the
tokenizer has 49152 tokens: the compute is the real model's, prompts are random
ids below the tokenizer's size, and generated ids past it decode to nothing.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from inferq.bench.random_model_shapes import SHAPES, Shape, parameter_count

STD = 0.02
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_root() -> Path:
    from inferq.gpuworker.models.gguf_loader import cache_root

    return cache_root() / "random-models"


def folder_name(name: str, shape: Shape, dtype: str, seed: int) -> str:
    return f"{name}-{dtype}-seed{seed}-{shape.fingerprint()}"


def random_model_folder(name: str, *, dtype: str = "bfloat16", seed: int = 0, root: str | Path | None = None,
                        shape: Shape | None = None, log=print) -> Path:
    """The cached folder for ``name`` (a key of SHAPES, or any name with an explicit
    ``shape``), written on first use. Writes go to a temporary folder renamed into
    place, so a crash never leaves a half folder that a later call would trust."""
    if shape is None:
        if name not in SHAPES:
            raise ValueError(f"unknown random model {name!r}; choose from {', '.join(SHAPES)}")
        shape = SHAPES[name]
    if dtype not in _DTYPES:
        raise ValueError(f"random model dtype must be one of {', '.join(_DTYPES)}, not {dtype!r}")
    root = Path(root).expanduser() if root else default_root()
    final = root / folder_name(name, shape, dtype, seed)
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    need = parameter_count(shape) * _DTYPES[dtype].itemsize
    free = shutil.disk_usage(root).free
    if need > free * 0.95:
        raise OSError(f"random model {name} in {dtype} needs {need / 1e9:.1f} GB; {root} has {free / 1e9:.1f} GB free")
    log(f"writing random-weight {name} ({parameter_count(shape) / 1e9:.2f} B parameters, {need / 1e9:.1f} GB "
        f"{dtype}) to {final} (once)")
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        write_random_model(shape, tmp, _DTYPES[dtype], seed)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "config.json").is_file():  # not a lost race with another writer
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _generator(seed: int, tensor_name: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}|{tensor_name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


def _normal(name: str, shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=_generator(seed, name)).mul_(STD).to(dtype)


def shard_tensors(shape: Shape, dtype: torch.dtype, seed: int):
    """(shard file name, {tensor name: tensor}) in order: embedding, each layer, head."""
    h, q, kv, inter = shape.hidden_size, shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim, shape.intermediate_size
    n = shape.num_layers + 2
    fname = lambda i: f"model-{i + 1:05d}-of-{n:05d}.safetensors"  # noqa: E731
    yield fname(0), {"model.embed_tokens.weight": _normal("model.embed_tokens.weight", (shape.vocab_size, h), dtype, seed)}
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        mats = {"self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h), "self_attn.v_proj.weight": (kv, h),
                "self_attn.o_proj.weight": (h, q), "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h),
                "mlp.down_proj.weight": (h, inter)}
        if shape.qkv_bias:
            mats.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)})
        layer = {p + k: _normal(p + k, s, dtype, seed) for k, s in mats.items()}
        layer[p + "input_layernorm.weight"] = torch.ones(h, dtype=dtype)
        layer[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=dtype)
        yield fname(i + 1), layer
    last = {"model.norm.weight": torch.ones(h, dtype=dtype)}
    if not shape.tie_word_embeddings:
        last["lm_head.weight"] = _normal("lm_head.weight", (shape.vocab_size, h), dtype, seed)
    yield fname(n - 1), last


def write_random_model(shape: Shape, folder: Path, dtype: torch.dtype, seed: int) -> None:
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = _copy_tokenizer(folder)
    weight_map, total = {}, 0
    for fname, tensors in shard_tensors(shape, dtype, seed):
        save_file(tensors, str(folder / fname), metadata={"format": "pt"})
        for k, t in tensors.items():
            weight_map[k] = fname
            total += t.numel() * t.element_size()
        del tensors  # one shard in memory at a time
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    dtype_name = str(dtype).removeprefix("torch.")
    cfg = shape.hf_config(tokenizer.bos_token_id, tokenizer.eos_token_id, dtype_name)
    cfg["inferq_random_weights"] = {"seed": seed, "std": STD}
    # config.json last: its presence marks a complete folder
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))


def _copy_tokenizer(folder: Path):
    """The bundled SmolLM2 tokenizer files (from its converted GGUF folder)."""
    from transformers import AutoTokenizer

    from inferq.gpuworker.models.loader import bundled_model_path, converted_folder

    src = converted_folder(bundled_model_path())
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, folder / name)
    return AutoTokenizer.from_pretrained(str(folder))
