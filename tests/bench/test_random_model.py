"""Random-weight folders of real model shapes (`bench offline --random-model`).

The shape tables are checked against the published configs (numbers copied
here by hand); a tiny variant of the Qwen2 shape (real 151936-row vocabulary,
q/k/v bias) is written for real, loaded by the engine and reused from cache.
"""
from __future__ import annotations

import dataclasses
import json

import pytest
from safetensors import safe_open

from inferq.bench.random_model import random_model_folder
from inferq.bench.random_model_shapes import SHAPES, parameter_count
from inferq.gpuworker.models.config import ModelConfig

# name: (hidden, layers, heads, kv heads, intermediate, vocab, tied, rope_theta, arch)
PUBLISHED = {
    "llama-1b": (2048, 16, 32, 8, 8192, 128256, True, 500000.0, "LlamaForCausalLM"),  # Llama-3.2-1B
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151936, True, 1000000.0, "Qwen2ForCausalLM"),  # Qwen2.5-0.5B
    "llama-8b": (4096, 32, 32, 8, 14336, 128256, False, 500000.0, "LlamaForCausalLM"),  # Llama-3.1-8B
}
# Published parameter counts (embedding counted once when tied), to the nearest million.
PUBLISHED_PARAMS_M = {"llama-1b": 1236, "qwen2.5-0.5b": 494, "llama-8b": 8030}

TINY = dataclasses.replace(SHAPES["qwen2.5-0.5b"], hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1,
                           intermediate_size=256)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shape_tables_equal_published_configs(name):
    hidden, layers, heads, kv, inter, vocab, tied, theta, arch = PUBLISHED[name]
    cfg = ModelConfig.from_hf(SHAPES[name].hf_config(1, 2, "bfloat16"))  # read as the engine reads it
    got = (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size, cfg.vocab_size,
           cfg.tie_word_embeddings, cfg.rope_theta, cfg.architecture)
    assert got == PUBLISHED[name]
    assert cfg.head_dim == {"llama-8b": 128}.get(name, 64)
    assert cfg.attention_bias == (arch == "Qwen2ForCausalLM") and not cfg.o_proj_bias and not cfg.mlp_bias
    assert round(parameter_count(SHAPES[name]) / 1e6) == PUBLISHED_PARAMS_M[name]


def test_llama_shapes_use_llama3_rope_scaling():
    common = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    assert ModelConfig.from_hf(SHAPES["llama-1b"].hf_config(1, 2, "float32")).rope_scaling == {**common, "factor": 32.0}
    assert ModelConfig.from_hf(SHAPES["llama-8b"].hf_config(1, 2, "float32")).rope_scaling == {**common, "factor": 8.0}
    assert ModelConfig.from_hf(SHAPES["qwen2.5-0.5b"].hf_config(1, 2, "float32")).rope_scaling is None


def _tree(root):
    return {p.relative_to(root): p.stat().st_mtime_ns for p in root.rglob("*")}


def test_tiny_folder_loads_in_the_engine_and_is_written_once(tmp_path):
    from inferq.gpuworker import LLM
    from inferq.schemas import SamplingParams

    logs = []
    folder = random_model_folder("tiny-qwen2", dtype="float32", root=tmp_path, shape=TINY, log=logs.append)
    assert len(logs) == 1 and folder.parent == tmp_path
    raw = json.loads((folder / "config.json").read_text())
    assert raw["architectures"] == ["Qwen2ForCausalLM"] and raw["vocab_size"] == 151936
    assert (raw["hidden_size"], raw["num_hidden_layers"], raw["intermediate_size"]) == (128, 2, 256)
    assert raw["tie_word_embeddings"] is True and raw["torch_dtype"] == "float32"

    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == parameter_count(TINY) * 4
    assert "model.layers.1.self_attn.k_proj.bias" in index["weight_map"] and "lm_head.weight" not in index["weight_map"]
    with safe_open(str(folder / index["weight_map"]["model.layers.0.mlp.up_proj.weight"]), "pt") as f:
        w = f.get_tensor("model.layers.0.mlp.up_proj.weight")
    assert tuple(w.shape) == (256, 128) and abs(w.std().item() - 0.02) < 0.002

    # Second call: the cached folder, nothing written.
    before = _tree(tmp_path)
    assert random_model_folder("tiny-qwen2", dtype="float32", root=tmp_path, shape=TINY, log=logs.append) == folder
    assert len(logs) == 1 and _tree(tmp_path) == before

    llm = LLM(model=str(folder), dtype="float32", device="cpu")
    mc = llm.engine.model_config
    assert (mc.vocab_size, mc.hidden_size, mc.num_kv_heads, mc.attention_bias) == (151936, 128, 1, True)
    assert len(llm.engine.tokenizer) == 49152 < mc.vocab_size  # the bundled tokenizer, smaller than the rows
    # A prompt id past the tokenizer but inside the vocabulary is accepted; outputs may land
    # anywhere in the 151936 rows and still decode.
    outs = llm.generate([[1000, 2000, 150000], [5, 6, 7, 8]],
                        [SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)] * 2)
    assert [len(o.token_ids) for o in outs] == [6, 6]
    assert all(0 <= t < 151936 for o in outs for t in o.token_ids)


def test_same_seed_same_weights_other_seed_differs(tmp_path):
    def up_proj(seed, where):
        folder = random_model_folder("tiny-qwen2", dtype="bfloat16", seed=seed, root=tmp_path / where, shape=TINY,
                                     log=lambda _: None)
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        with safe_open(str(folder / index["weight_map"]["model.layers.1.mlp.up_proj.weight"]), "pt") as f:
            return f.get_tensor("model.layers.1.mlp.up_proj.weight")

    a, b, c = up_proj(0, "a"), up_proj(0, "b"), up_proj(1, "c")
    assert str(a.dtype) == "torch.bfloat16"
    assert a.equal(b) and not a.equal(c)


def test_unknown_name_and_dtype_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown random model 'llama-70b'; choose from llama-1b"):
        random_model_folder("llama-70b", root=tmp_path)
    with pytest.raises(ValueError, match="dtype must be one of"):
        random_model_folder("llama-1b", dtype="int8", root=tmp_path)
    assert not any(tmp_path.iterdir())


def test_bench_offline_cli_random_model(tmp_path, monkeypatch, capsys):
    """`inferq bench offline --random-model NAME`: a tiny shape added to the table, so the
    run is the real path (folder written in the bench's dtype, engine loads it) in seconds."""
    from inferq.cli import main as inferq

    monkeypatch.setitem(SHAPES, "tiny-test", TINY)
    out = tmp_path / "offline.json"
    argv = ["bench", "offline", "--random-model", "tiny-test", "--random-model-dir", str(tmp_path / "models"),
            "--dtype", "float32", "--num-requests", "3", "--min-input", "4", "--max-input", "8", "--min-output", "2",
            "--max-output", "4", "--threads", "1", "--peers", "none", "--json", str(out)]
    assert inferq(argv) == 0
    assert "| inferq |" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["results"][0]["output_tokens"] >= 6
    assert doc["args"]["model"].startswith(str(tmp_path / "models" / "tiny-test-float32-seed0-"))
    with pytest.raises(SystemExit, match="not both"):
        inferq(argv + ["--model", str(tmp_path)])
