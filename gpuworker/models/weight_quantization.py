"""Quantize an HF folder's weights at load (``quantization="int8" | "int4" | "fp8"``).

A decode step reads every projection weight once, so fewer weight bytes are a faster step
and room for more KV cache. Round-to-nearest, symmetric, absmax scales, no calibration data:

* CPU: the projections become GGUF blocks and run on the quantized CPU kernels
  (quant_linear.QuantLinear, the code a GGUF file's weights run on): int8 is Q8_0 (groups of
  32, one fp16 scale each), int4 is Q4_0 (the same groups, 4 bits). The LM head (and a tied
  embedding, read from the same blocks) is Q8_0 either way, as llama.cpp keeps its output
  layer at 6-8 bits. fp8 has no CPU kernel.
* CUDA: the four projections of each layer stay packed in GPU memory and run on the
  weight-only Triton matmul (inferq.kernels.weight_only_matmul): fp8 e4m3 or int8 with a scale
  per output channel, int4 with a scale per output channel and group of 128 (or 64/32
  where K asks). The LM head and embedding stay in the model dtype, as vLLM leaves them.

Both paths keep a row's bits independent of its batch (tiles and K order fixed), so the
engine's batch invariance holds with quantized weights too.
"""
from __future__ import annotations

import numpy as np
import torch

METHODS = ("int8", "int4", "fp8")
_CPU_TYPES = {"int8": "Q8_0", "int4": "Q4_0"}
_CPU_HEAD_TYPE = "Q8_0"
_PROJECTIONS = {"qkv": "qkv_proj", "o": "o_proj", "gate_up": "gate_up_proj", "down": "down_proj"}


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"quantization={method!r}: expected one of {', '.join(METHODS)} (or none)")
    return method


class WeightOnlyLinear:
    """A projection on the weight-only Triton matmul; sits in ``layer.packed`` like a prepacked weight."""

    def __init__(self, qweight) -> None:
        self.qweight = qweight

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        from inferq.kernels.weight_only_matmul import weight_only_linear

        return weight_only_linear(x, self.qweight, bias)


def _int4_group(k: int) -> int:
    for group in (128, 64, 32):
        if k % group == 0:
            return group
    raise ValueError(f"int4 weights need an input width that is a multiple of 32, got {k}")


@torch.inference_mode()
def quantize_model(model, method: str, kernels: str | None = None) -> str:
    """Quantize a loaded LlamaForCausalLM's weights in place, one weight at a time (the peak is
    the model plus one weight). ``kernels``: "cpu" (the quantized CPU kernels) or "triton";
    default from the model's device. Returns the packing name the engine logs."""
    check_method(method)
    kernels = kernels or ("triton" if model.norm.device.type == "cuda" else "cpu")
    if kernels == "cpu":
        return _quantize_for_cpu(model, method)
    if kernels == "triton":
        return _quantize_for_triton(model, method)
    raise ValueError(f"kernels={kernels!r}: expected cpu or triton")


def _quantize_for_triton(model, method: str) -> str:
    from inferq.kernels.weight_only_matmul import quantize_weight

    for layer in model.layers:
        for name, attr in _PROJECTIONS.items():
            weight = getattr(layer, attr)
            qweight = quantize_weight(weight, method, group_size=_int4_group(weight.shape[1]) if method == "int4" else 0)
            setattr(layer, attr, None)
            layer.register_buffer(f"{attr}_q", qweight.values, persistent=False)  # counted as the model's bytes
            layer.register_buffer(f"{attr}_scales", qweight.scales, persistent=False)
            layer.packed[name] = WeightOnlyLinear(qweight)
    return f"weight-only {method} (Triton)"


def _ggml_blocks(weight: torch.Tensor, type_name: str, name: str):
    """``weight`` [n, k] as GGUF blocks of ``type_name``: QuantWeight's (bytes [n, row_bytes], type)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from inferq.gpuworker.models.quant_linear import QuantWeight

    if weight.shape[1] % 32:
        raise ValueError(f"{name}: {type_name} blocks need an input width that is a multiple of 32, "
                         f"got {weight.shape[1]}")
    qtype = GGMLQuantizationType[type_name]
    blocks = quantize(weight.detach().to(torch.float32).cpu().numpy(), qtype)
    return QuantWeight(torch.from_numpy(np.ascontiguousarray(blocks)), int(qtype), weight.shape[1], name)


def _quantize_for_cpu(model, method: str) -> str:
    from inferq.gpuworker.models import quant_linear

    if method not in _CPU_TYPES:
        raise ValueError(f"quantization={method!r} has no CPU kernel: use int8 or int4 on CPU "
                         f"(fp8 runs on CUDA)")
    if model.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"quantized CPU weights run with float32 or bfloat16 activations, not {model.dtype}")
    lib = quant_linear.load()
    if lib is None:
        raise ValueError("quantized CPU weights need the quantized CPU kernels (a C compiler, AVX2 + F16C)")

    def replace(module, attr: str, type_name: str, name: str) -> "quant_linear.QuantLinear":
        lin = quant_linear.QuantLinear(lib, [_ggml_blocks(getattr(module, attr), type_name, name)], model.dtype)
        setattr(module, attr, None)
        for j, t in enumerate(lin.packed):
            module.register_buffer(f"{attr}_packed{j}", t, persistent=False)
        return lin

    for i, layer in enumerate(model.layers):
        for name, attr in _PROJECTIONS.items():
            layer.packed[name] = replace(layer, attr, _CPU_TYPES[method], f"model.layers.{i}.{attr}")
    tied = model.lm_head is model.embed_tokens
    model.packed_lm_head = replace(model, "lm_head", _CPU_HEAD_TYPE, "lm_head")
    if tied:  # one table: the embedding's rows come from the head's blocks
        model.embed_tokens, model.packed_embed = None, model.packed_lm_head
    model.packing = f"{method} ({_CPU_TYPES[method]} blocks)"
    return model.packing
