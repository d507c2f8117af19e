"""GGUF weights run as stored (gguf_loader native mode + quant_linear): the bundled Q4_1
SmolLM2 against its dequantized load, tiny models of every other type (made here with the
``gguf`` package: its quantizers, or random K-quant blocks), the memory a native load holds,
and the clear refusal of a type without a kernel.

Tolerances: with float activations the native model computes the dequantized model's
products (sums in another order), so greedy tokens are identical; with int8 activations
(the default, llama.cpp's arithmetic) each matmul carries x's int8 rounding (~0.5%), which
compounds over SmolLM2's 30 layers to ~5% (relative L2) on the logits: checked below 12%, and
the native argmax among the dequantized model's top 5 at >= 90% of positions."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from inferq.gpuworker.attention.base import get_backend
from inferq.gpuworker.models import gguf_loader
from inferq.gpuworker.models import quant_linear as ql
from inferq.gpuworker.models.config import ModelConfig
from inferq.gpuworker.models.llama import LlamaForCausalLM
from inferq.gpuworker.models.loader import bundled_model_path, load_model
from inferq.gpuworker.models.weight_memory import held_bytes
from inferq.kernels.cpu import quant_reference as ref
from tests import quant_kernels
from tests.kernels.test_gguf_quant import random_packed
from tests.models.paged import PagedDriver

pytestmark = quant_kernels.needed()

PROMPTS = ["<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
           "def fibonacci(n):\n    if n < 2:\n        return n\n    return"]


@pytest.fixture(scope="module")
def native():
    return load_model(gguf_weights="native")


@pytest.fixture(scope="module")
def dequantized():
    return load_model(gguf_weights="dequantize")


def test_native_load_holds_the_files_blocks_only(native):
    model = native.model
    assert model.packing == "gguf-native"
    for layer in model.layers:
        assert all(getattr(layer, a) is None for a in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))
        assert all(isinstance(layer.packed[k], ql.QuantLinear) for k in ("qkv", "o", "gate_up", "down"))
    assert model.embed_tokens is None and model.lm_head is None  # tied: one Q8_0 table for both
    assert model.packed_lm_head is model.packed_embed
    size = bundled_model_path().stat().st_size
    # 98.4 MB file -> 100.8 MB held (the 16-row layout adds Q8_0's offsets); a bf16 copy would be 270 MB
    assert held_bytes(model) <= 1.05 * size


def test_embedding_rows_are_the_dequantized_ones(native, dequantized):
    ids = torch.tensor([0, 1, 17, 500, 49151])
    assert torch.equal(native.model.embed(ids), dequantized.model.embed(ids))


def test_prompt_logits_close_to_the_dequantized_model(native, dequantized):
    tok = native.tokenizer
    for prompt in PROMPTS:
        ids = tok(prompt).input_ids
        got = PagedDriver(native.model, native.model.backend).step([(0, ids)])[0]
        want = PagedDriver(dequantized.model, dequantized.model.backend).step([(0, ids)])[0]
        rel = ((got - want).norm(dim=-1) / want.norm(dim=-1)).max().item()
        assert rel < 0.12, rel
        top5 = want.topk(5, dim=-1).indices
        hit = (top5 == got.argmax(-1, keepdim=True)).any(-1).float().mean().item()
        assert hit >= 0.9, hit


def _greedy(monkeypatch, weights: str, activations: str | None = None) -> list[list[int]]:
    from inferq.gpuworker.llm import LLM
    from inferq.schemas import SamplingParams

    monkeypatch.setenv("INFERQ_GGUF_WEIGHTS", weights)
    if activations:
        monkeypatch.setenv(ql.ACTIVATIONS_ENV, activations)
    # float32: the dequantized twin exact (bf16 would round it); a small KV cache (the machine is shared)
    llm = LLM(str(bundled_model_path()), dtype="float32", num_kv_blocks=64, max_num_seqs=4)
    assert (llm.engine.model.packing == "gguf-native") == (weights == "native")
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=24, temperature=0))
    return [o.token_ids for o in outs]


def test_greedy_tokens_native_float_activations_equal_dequantized(monkeypatch):
    native = _greedy(monkeypatch, "native", "float")
    assert native == _greedy(monkeypatch, "dequantize")
    assert all(len(t) > 5 for t in native)


def test_memory_of_a_native_load_is_about_the_file(tmp_path):
    """Resident set added by load_model (its tokenizer's own cost taken out) <= 1.15 x the file."""
    script = textwrap.dedent("""
        import gc, sys
        from inferq.gpuworker.engine import host_malloc
        from inferq.gpuworker.models import gguf_loader, quant_linear
        from inferq.gpuworker.models.loader import bundled_model_path, load_model, load_tokenizer

        def rss():
            gc.collect(); host_malloc.release_free_memory()
            return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS"))

        quant_linear.load()
        folder = gguf_loader.metadata_folder(bundled_model_path())
        warm = load_tokenizer(folder)  # imports and caches warmed
        r0 = rss(); tok = load_tokenizer(folder); r1 = rss(); del tok
        r2 = rss(); model = load_model(gguf_weights="native"); r3 = rss()
        print((r3 - r2) - (r1 - r0))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    added = int(done.stdout.strip().splitlines()[-1])
    size = bundled_model_path().stat().st_size
    assert added <= 1.15 * size, f"{added / 1e6:.1f} MB resident for a {size / 1e6:.1f} MB file"


# ---------------------------------------------------------------- tiny models of every type

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 300, "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "rope_theta": 10000.0,
        "hidden_act": "silu", "dtype": "float32"}
# per tensor kind, the type it is stored in: Q4_K_M's mix (v and down in Q6_K), and one type throughout
MIXES = {
    "Q4_K_M": {"embed": "Q4_K", "q": "Q4_K", "k": "Q4_K", "v": "Q6_K", "o": "Q4_K", "gate": "Q4_K", "up": "Q4_K",
               "down": "Q6_K", "head": "Q6_K"},
    **{t: {kind: t for kind in ("embed", "q", "k", "v", "o", "gate", "up", "down", "head")}
       for t in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q5_K")},
}


def _tiny_weights(mix: dict, tied: bool, seed: int = 0):
    """(native tensors as gguf_loader.native_tensors gives them, the same weights dequantized)."""
    h, inter, q, kv = TINY["hidden_size"], TINY["intermediate_size"], 4 * 64, 2 * 64
    shapes = {"q": ("self_attn.q_proj", q, h), "k": ("self_attn.k_proj", kv, h), "v": ("self_attn.v_proj", kv, h),
              "o": ("self_attn.o_proj", h, q), "gate": ("mlp.gate_proj", inter, h), "up": ("mlp.up_proj", inter, h),
              "down": ("mlp.down_proj", h, inter)}
    native, plain = {}, {}
    gen = torch.Generator().manual_seed(seed)

    def add(name, kind, n, k, s):
        packed = random_packed(mix[kind], n, k, seed=s)
        native[name] = (packed, ref.SUPPORTED[mix[kind]], k)
        plain[name] = torch.from_numpy(ref.dequantize(packed, ref.SUPPORTED[mix[kind]], k).copy())

    add("model.embed_tokens.weight", "embed", TINY["vocab_size"], h, 99)
    if not tied:
        add("lm_head.weight", "head", TINY["vocab_size"], h, 98)
    for i in range(TINY["num_hidden_layers"]):
        for j, (kind, (mod, n, k)) in enumerate(shapes.items()):
            add(f"model.layers.{i}.{mod}.weight", kind, n, k, 10 * i + j)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            native[f"model.layers.{i}.{norm}.weight"] = 1 + 0.1 * torch.randn(h, generator=gen)
    native["model.norm.weight"] = 1 + 0.1 * torch.randn(h, generator=gen)
    plain.update({k: v for k, v in native.items() if isinstance(v, torch.Tensor)})
    return native, plain


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("activations", ["int8", "float"])
def test_tiny_model_of_each_type_matches_its_dequantized_weights(mix, activations):
    tied = mix != "Q4_K_M"
    cfg = ModelConfig.from_hf({**TINY, "tie_word_embeddings": tied})
    native_w, plain_w = _tiny_weights(MIXES[mix], tied)
    backend = get_backend("torch")
    ours = LlamaForCausalLM(cfg, backend)
    ql.install(ours, native_w, ql.load(), activations)
    twin = LlamaForCausalLM(cfg, backend)
    twin.load_weights(plain_w.items())
    ids = [3, 17, 250, 299, 0, 42, 7, 7, 100]
    got = PagedDriver(ours, backend).step([(0, ids)])[0]
    want = PagedDriver(twin, backend).step([(0, ids)])[0]
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < (0.05 if activations == "int8" else 1e-5), rel
    if activations == "float":
        assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_f16_weights_keep_their_width_and_give_their_float32_copys_bits():
    """A GGUF's F16 matrices on a float32 engine give their float32 copy's bits: on the AVX2
    build read as float16 panels (half the bytes), elsewhere widened to float32 at load."""
    from inferq.gpuworker.models import cpu_linear

    lib = cpu_linear.load()
    assert lib is not None, "the quantized kernels build here (module condition), so the float ones do"
    half_width = bool(getattr(lib, "f16", False))
    cfg = ModelConfig.from_hf({**TINY, "tie_word_embeddings": True})
    native16, _ = _tiny_weights(MIXES["Q8_0"], tied=True)
    gen = torch.Generator().manual_seed(5)
    for name, v in list(native16.items()):
        if isinstance(v, tuple):  # every matrix F16 instead
            native16[name] = (0.05 * torch.randn(v[0].shape[0], v[2], generator=gen)).half()
    native32 = {k: v.float() if v.dtype == torch.float16 else v for k, v in native16.items()}
    backend = get_backend("torch")
    models = []
    for weights in (native16, native32):
        model = LlamaForCausalLM(cfg, backend)
        ql.install(model, weights, ql.load())
        models.append(model)
    seg16, seg32 = (m.layers[0].packed["gate_up"].segments[0] for m in models)
    assert seg16.packed_weight.layout == ("f16" if half_width else "f32") and seg32.packed_weight.layout == "f32"
    assert seg16.packed_weight.nbytes * (2 if half_width else 1) == seg32.packed_weight.nbytes
    ids = [3, 17, 250, 299, 0, 42, 7, 7, 100]
    got, want = (PagedDriver(m, backend).step([(0, ids)])[0] for m in models)
    assert torch.equal(got, want)


def test_a_type_without_a_kernel_fails_at_load_naming_the_tensor(tmp_path):
    from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

    path = tmp_path / "q2k.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(256, dtype=np.float32))
    writer.add_tensor("blk.0.ffn_up.weight", np.zeros((4, 84), dtype=np.uint8),
                      raw_dtype=GGMLQuantizationType.Q2_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    table = gguf_loader.tensor_table(GGUFReader(str(path)))
    with pytest.raises(ValueError, match=r"'blk.0.ffn_up.weight' is Q2_K, which has no native CPU kernel.*"
                                         r"INFERQ_GGUF_WEIGHTS=dequantize"):
        gguf_loader.native_tensors(path, {**TINY, "gguf_architecture": "llama"}, table)


def test_weights_setting(monkeypatch):
    monkeypatch.delenv(gguf_loader.WEIGHTS_ENV, raising=False)
    assert gguf_loader.weights_mode("cuda") == "dequantize"
    assert gguf_loader.weights_mode("cpu") == "dequantize"  # the default (see DEFAULT_MODE's reasons)
    assert gguf_loader.weights_mode("cpu", "auto") == "native"  # the kernels build here (module skip)
    assert gguf_loader.weights_mode("cuda", "auto") == "dequantize"
    assert gguf_loader.weights_mode("cpu", "dequantize") == "dequantize"
    assert gguf_loader.weights_mode("cpu", "native") == "native"
    monkeypatch.setenv(gguf_loader.WEIGHTS_ENV, "dequantize")
    assert gguf_loader.weights_mode("cpu") == "dequantize"
    with pytest.raises(ValueError, match="expected one of native, dequantize, auto"):
        gguf_loader.weights_mode("cpu", "fp8")


@pytest.mark.parametrize("activations", ["int8", "float"])
def test_neighbouring_segments_of_one_type_run_as_one_matmul_with_the_same_bits(activations):
    """q, k and v (gate and up) of one type become one weight, one kernel call; Q4_K_M's v in
    Q6_K stays its own. The stacked weight gives each segment's own results bit for bit."""
    lib = ql.load()
    h = 256
    segs = lambda types: [ql.QuantWeight(random_packed(t, n, h, seed=i), ref.SUPPORTED[t], h, f"s{i}")  # noqa: E731
                          for i, (t, n) in enumerate(zip(types, (256, 128, 128)))]
    x = torch.randn(5, h, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    for types, merged_types in ((("Q4_1",) * 3, ["Q4_1"]), (("Q4_K", "Q4_K", "Q6_K"), ["Q4_K", "Q6_K"])):
        lin = ql.QuantLinear(lib, segs(types), torch.bfloat16, activations)
        assert [s.type_name for s in lin.segments] == merged_types
        assert lin.n == 512 and lin.segments[0].name == ("s0+s1+s2" if len(merged_types) == 1 else "s0+s1")
        alone = torch.cat([ql.QuantLinear(lib, [s], torch.bfloat16, activations)(x) for s in segs(types)], dim=1)
        assert torch.equal(lin(x), alone)
