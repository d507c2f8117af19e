"""The C kernels of the CPU path (gpuworker/attention/cpu_kernels.py) against the torch
ops they replace in the model: rotary (bit-identical, float32 and bfloat16), SiLU-and-mul
(torch's roundings, our exp) and the fused residual add + RMSNorm (the same roundings;
only the order of the fp32 sum of squares differs). The decode-attention kernel is tested in test_torch_backend."""
from __future__ import annotations

import pytest
import torch

from inferq.gpuworker.models.llama import _rotate, add_rms_norm, rms_norm, rotate_qk, silu_and_mul


@pytest.fixture
def kernels():
    from inferq.gpuworker.attention import cpu_kernels

    k = cpu_kernels.load()
    if k is None:
        # With a compiler a failed build is a bug; without one the torch ops are the product.
        assert cpu_kernels.compiler() is None, "a C compiler is on PATH but the CPU kernels did not build"
        pytest.skip("no C compiler on this machine: inferq runs the torch ops instead, which the other tests cover")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the kernels are taken only with one torch thread
    yield k
    torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 32])
def test_rotary_kernel_is_bit_identical(kernels, dtype, head_dim):
    g = torch.Generator().manual_seed(0)
    t, hq, hk = 37, 9, 3
    qkv = (torch.randn(t, (hq + 2 * hk) * head_dim, generator=g) * 3).to(dtype)
    q, k, _ = qkv.split((hq * head_dim, hk * head_dim, hk * head_dim), dim=-1)
    q, k = q.view(t, hq, head_dim), k.view(t, hk, head_dim)  # strided views, as in the model
    ang = torch.rand(t, 1, head_dim // 2, generator=g) * 100
    cos = torch.cat((ang.cos(), ang.cos()), -1).to(dtype)
    sin = torch.cat((-ang.sin(), ang.sin()), -1).to(dtype)
    qo, ko = rotate_qk(q, k, cos, sin, kernels)
    assert torch.equal(qo, _rotate(q, cos, sin)) and torch.equal(ko, _rotate(k, cos, sin))
    assert qo.is_contiguous() and ko.is_contiguous()


@pytest.mark.parametrize("rows", [1, 32, 300])
@pytest.mark.parametrize("h", [576, 200])
def test_add_rms_norm_f32_kernel_matches_torch(kernels, rows, h):
    g = torch.Generator().manual_seed(rows)
    res, hid = torch.randn(rows, h, generator=g) * 3, torch.randn(rows, h, generator=g)
    w = torch.randn(h, generator=g) * 0.3 + 1
    out_k, res_k = add_rms_norm(res.clone(), hid, w, 1e-5, kernels)
    ref_res = res.clone().add_(hid)
    ref = rms_norm(ref_res, w, 1e-5)
    assert torch.equal(res_k, ref_res)  # the residual add is elementwise: exact
    # only the sum of squares is added in another order: a few float32 ulps of the output
    assert torch.allclose(out_k, ref, rtol=4e-7 * 4, atol=1e-6), (out_k - ref).abs().max()
    out_n, res_n = add_rms_norm(res.clone(), None, w, 1e-5, kernels)  # first layer: no add
    assert torch.equal(res_n, res) and torch.allclose(out_n, rms_norm(res, w, 1e-5), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7, 131])
def test_silu_and_mul_kernel_matches_torch(kernels, dtype, rows):
    g = torch.Generator().manual_seed(rows)
    inter = 1536
    wide = torch.randn(rows, 2 * inter + 64, generator=g) * 6  # includes |x| > 20 and exact zeros below
    wide[0, :8] = torch.tensor([0.0, -0.0, 88.0, -88.0, 100.0, -100.0, 1e-30, -1e-30])
    gate_up = wide[:, : 2 * inter].to(dtype)  # a strided view, as a split of a wider tensor gives
    got = silu_and_mul(gate_up, kernels)
    gate, up = gate_up.chunk(2, dim=-1)
    ref = torch.nn.functional.silu(gate).mul_(up)
    assert got.shape == ref.shape and got.is_contiguous() and torch.isfinite(got).all()
    if dtype == torch.float32:  # our exp against torch's: an ulp or two of silu, then one product
        assert torch.allclose(got, ref, rtol=1e-6, atol=1e-30), (got - ref).abs().max()
    else:  # the same two roundings to bf16: equal but where silu's last bits cross a rounding edge
        assert (got == ref).float().mean().item() >= 0.99
        assert torch.allclose(got.float(), ref.float(), rtol=2**-7, atol=1e-30)


@pytest.mark.parametrize("rows", [1, 32, 300])
def test_add_rms_norm_kernel_matches_torch(kernels, rows):
    g = torch.Generator().manual_seed(rows)
    h = 576
    res = (torch.randn(rows, h, generator=g) * 3).to(torch.bfloat16)
    hid = torch.randn(rows, h, generator=g).to(torch.bfloat16)
    w = (torch.randn(h, generator=g) * 0.3 + 1).to(torch.bfloat16)
    out_k, res_k = add_rms_norm(res.clone(), hid, w, 1e-5, kernels)
    ref_res = res.clone().add_(hid)
    ref = rms_norm(ref_res, w, 1e-5)
    assert torch.equal(res_k, ref_res)  # the residual add is elementwise: exact
    same = (out_k == ref).float().mean().item()
    assert same >= 0.999, f"only {same:.5f} of the outputs equal"
    assert (out_k.float() - ref.float()).abs().max().item() <= 0.07  # at most ~one bf16 ulp of |y| < 8
    out_n, res_n = add_rms_norm(res.clone(), None, w, 1e-5, kernels)  # first layer: no add
    assert torch.equal(res_n, res)
    assert (out_n == rms_norm(res, w, 1e-5)).float().mean().item() >= 0.999
