"""HF folders quantized at load (``quantization=``): int8 / int4 on the quantized CPU kernels,
fp8 / int8 / int4 on the weight-only Triton matmul (interpreted on CPU).

The oracle is the same model loaded plain from a folder whose weights were replaced by the
quantized values dequantized to float32 (what ``quantization=`` should compute, written by
the test): with float activations the CPU kernels compute exactly those products (sums in
another order), so the greedy tokens are the oracle's and the logits agree to ~1e-4. The
Triton kernel scales the fp32 sums instead of the weights (bf16 activations here): tokens
equal, logits within a few percent (the oracle's weights are rounded to bf16, the kernel's are not). The weight bytes held are checked against the plain
model's.
"""
from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from inferq.gpuworker import LLM
from inferq.gpuworker.models import quant_linear as ql
from inferq.gpuworker.models.weight_memory import held_bytes
from inferq.kernels.weight_only_matmul import dequantize_weight, quantize_weight
from inferq.schemas import SamplingParams
from tests import quant_kernels
from tests.kernels.conftest import DEVICE
from tests.tiny_models import save_tiny_model

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3, logprobs_mode="raw_logits")
PROMPTS = [[5, 400, 17, 242, 33], [12, 7, 7, 300, 200, 31, 8, 99, 100]]  # ids < 512: the Triton test's vocabulary
cpu_kernels = quant_kernels.needed()


def _ggml_roundtrip(w: torch.Tensor, type_name: str) -> torch.Tensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    qtype = GGMLQuantizationType[type_name]
    return torch.from_numpy(dequantize(quantize(w.float().numpy(), qtype), qtype)).reshape(w.shape).float()


def oracle_folder(src, dst, project) -> str:
    """``src`` with every projection (and the LM head, given to ``project`` as "lm_head") replaced
    by ``project(name, weight)``: the dequantized weights ``quantization=`` should compute with."""
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    for name, w in tensors.items():
        if any(f".{p}." in name for p in PROJECTIONS):
            tensors[name] = project("projection", w).contiguous()
        elif name == "lm_head.weight" or (name == "model.embed_tokens.weight" and "lm_head.weight" not in tensors):
            tensors[name] = project("lm_head", w).contiguous()
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return str(dst)


def run(llm: LLM):
    return [(list(o.token_ids), o.logprobs) for o in llm.generate(PROMPTS, PARAMS)]


def assert_close_answers(got, want, atol, rtol=0.0):
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got, want):
        assert tokens == want_tokens
        for step, want_step in zip(logprobs, want_logprobs):
            assert step.keys() == want_step.keys()
            for token, value in step.items():
                assert abs(value - want_step[token]) <= atol + rtol * abs(want_step[token]), (token, value, want_step[token])


@cpu_kernels
@pytest.mark.parametrize("arch,method", [("llama", "int8"), ("mistral", "int8"), ("llama", "int4")])
def test_cpu_quantized_weights_compute_the_dequantized_model(tmp_path, monkeypatch, arch, method):
    monkeypatch.setenv(ql.ACTIVATIONS_ENV, "float")  # x unrounded: the oracle's products exactly
    src = save_tiny_model(arch, tmp_path / arch)
    block = {"int8": "Q8_0", "int4": "Q4_0"}[method]
    oracle = oracle_folder(src, tmp_path / "oracle",
                           lambda kind, w: _ggml_roundtrip(w, block if kind == "projection" else "Q8_0"))
    common = dict(device="cpu", dtype="float32", max_num_batched_tokens=64, num_kv_blocks=64)
    plain = LLM(model=str(src), **common)
    quantized = LLM(model=str(src), quantization=method, **common)
    model = quantized.engine.model
    assert model.packing.startswith(method)
    assert all(isinstance(layer.packed["qkv"], ql.QuantLinear) and layer.qkv_proj is None for layer in model.layers)
    assert_close_answers(run(quantized), run(LLM(model=oracle, **common)), atol=2e-4)
    # The layers' weights: Q8_0 is 34 bytes a block of 32 (0.27x fp32), Q4_0 18 (0.14x); norms stay float.
    ratio = held_bytes(model.layers) / held_bytes(plain.engine.model.layers)
    assert ratio < (0.28 if method == "int8" else 0.16), ratio


@cpu_kernels
def test_int8_activations_stay_near_the_float_model(tmp_path):
    src = save_tiny_model("llama", tmp_path / "llama")
    common = dict(device="cpu", dtype="float32", max_num_batched_tokens=64, num_kv_blocks=64)
    (tokens, logprobs), = [(list(o.token_ids), o.logprobs)
                           for o in LLM(model=str(src), quantization="int8", **common).generate(PROMPTS[:1], PARAMS)]
    (want, want_logprobs), = run(LLM(model=str(src), **common))[:1]
    # int8 weights and int8 activations (~0.5% per matmul each): near-tied tokens of a random model
    # may swap, so the first pick is one of the float model's top 3, its logit within a few percent.
    first, want_first = logprobs[0], want_logprobs[0]
    assert tokens[0] in want_first
    assert abs(first[tokens[0]] - want_first[tokens[0]]) <= 0.05 * abs(want_first[tokens[0]]) + 0.05


def test_fp8_has_no_cpu_kernel_and_gguf_files_refuse_quantization(tmp_path):
    src = save_tiny_model("llama", tmp_path / "llama")
    with pytest.raises(ValueError, match="fp8 runs on CUDA"):
        LLM(model=str(src), quantization="fp8", device="cpu", num_kv_blocks=16)
    with pytest.raises(ValueError, match="expected one of int8, int4, fp8"):
        LLM(model=str(src), quantization="nf4", device="cpu", num_kv_blocks=16)


@pytest.mark.parametrize("method", ["fp8", "int4"])
def test_triton_weight_only_path_computes_the_dequantized_model(tmp_path, method):
    """The GPU path's ops (interpreted here): batch-invariant mode, the projections on the
    weight-only matmul, the LM head left in bf16 (as vLLM leaves it)."""
    src = save_tiny_model("llama", tmp_path / "llama", vocab_size=512)
    group = 64  # tiny widths 64 and 128: _int4_group's pick

    def project(kind, w):
        if kind == "lm_head":
            return w
        return dequantize_weight(quantize_weight(w, method, group_size=group if method == "int4" else 0))

    oracle = oracle_folder(src, tmp_path / "oracle", project)
    common = dict(attention_backend="triton", device=str(DEVICE), dtype="bfloat16", block_size=16,
                  max_num_batched_tokens=64, max_num_seqs=4, num_kv_blocks=32, batch_invariant=True,
                  prepack_weights=False, cpu_kernels=False)
    quantized = LLM(model=str(src), quantization=method, **common)
    assert all(layer.qkv_proj is None for layer in quantized.engine.model.layers)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=2, logprobs_mode="raw_logits")
    got = [(list(o.token_ids), o.logprobs) for o in quantized.generate(PROMPTS, params)]
    alone = [(list(o.token_ids), o.logprobs) for o in (quantized.generate([p], params)[0] for p in PROMPTS)]
    assert got == alone  # a row's bits do not depend on its batch
    want = [(list(o.token_ids), o.logprobs) for o in LLM(model=oracle, **common).generate(PROMPTS, params)]
    # The oracle's weights are dequantized then rounded to bf16 (0.4% each); the kernel keeps q exact
    # and scales fp32 sums: logits of magnitude ~25 differ by up to a few bf16 steps (0.125 there).
    assert_close_answers(got, want, atol=0.25, rtol=0.05)
