"""Synthetic GGUFs (inferq.bench.synthetic_gguf): a small llama shape written with random
Q4_K_M blocks has llama-quantize's per-tensor types, a padded tokenizer, and loads and
generates in inferq with its blocks kept as stored."""
import dataclasses

import numpy as np
import pytest

from inferq.bench import synthetic_gguf
from inferq.bench.random_model_shapes import SHAPES

SMALL = dataclasses.replace(SHAPES["llama-8b"], hidden_size=256, num_layers=16, num_heads=4, num_kv_heads=2,
                            intermediate_size=512, vocab_size=49152 + 64, max_position_embeddings=2048)


def test_q4_k_m_types_follow_llama_quantize():
    types = {name: t for name, t, _, _ in synthetic_gguf.tensors_of(SMALL, "Q4_K_M")}
    # 16 layers: the first and last eighth (0, 1, 14, 15) and every third between (4, 7, 10, 13)
    more_bits = [i for i in range(16) if types[f"blk.{i}.ffn_down.weight"] == "Q6_K"]
    assert more_bits == [0, 1, 4, 7, 10, 13, 14, 15]
    assert [i for i in range(16) if types[f"blk.{i}.attn_v.weight"] == "Q6_K"] == more_bits
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    assert {types[f"blk.3.{n}.weight"] for n in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up")} == {"Q4_K"}


def test_random_blocks_have_finite_small_scales():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    rng = np.random.default_rng(0)
    for qtype in ("Q4_K", "Q6_K", "Q8_0"):
        blocks = synthetic_gguf.random_blocks(qtype, 8, 512, rng)
        w = dequantize(blocks, GGMLQuantizationType[qtype])
        assert w.shape == (8, 512) and np.isfinite(w).all() and np.abs(w).max() < 1.0 and w.std() > 0


def test_written_file_loads_natively_and_generates(tmp_path, monkeypatch):
    from gguf import GGUFReader

    path = tmp_path / "small.gguf"
    synthetic_gguf.write(path, SMALL, "Q4_K_M")
    reader = GGUFReader(str(path))
    assert len(reader.fields["tokenizer.ggml.tokens"].data) == SMALL.vocab_size
    assert reader.fields["tokenizer.ggml.token_type"].contents()[-1] == synthetic_gguf.TOKEN_TYPE_NORMAL
    assert {t.tensor_type.name for t in reader.tensors} == {"Q4_K", "Q6_K", "F32"}
    del reader

    from inferq.gpuworker.models import quant_linear

    if quant_linear.load() is None:
        pytest.skip("no quantized CPU kernels on this machine (no compiler or no AVX2)")
    monkeypatch.setenv("INFERQ_GGUF_WEIGHTS", "native")
    from inferq.gpuworker import LLM
    from inferq.schemas import SamplingParams

    llm = LLM(model=str(path), dtype="bfloat16", kv_cache_memory=16 << 20)
    assert llm.engine.model.packing == "gguf-native"
    (out,) = llm.generate(["hello"], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    assert len(out.token_ids) == 6
    assert llm.engine.tokenizer.decode([SMALL.vocab_size - 1]) == "[PAD63]"  # a padding id streams as text


def test_unknown_shape_or_type_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown shape"):
        synthetic_gguf.synthetic_gguf("llama-9000", "Q4_K_M", tmp_path)
    with pytest.raises(ValueError, match="unknown file type"):
        synthetic_gguf.synthetic_gguf("llama-8b", "IQ2_XS", tmp_path)
