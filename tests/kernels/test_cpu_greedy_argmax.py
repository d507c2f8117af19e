"""The C greedy argmax (inferq_kernels/cpu/greedy_argmax.c) gives torch.argmax's index for every
row: ties (the first index; +0 and -0 equal), NaN anywhere (the first NaN), -inf rows, rows
shorter than a vector and with a partial last vector, row strides, and 1 or 2 threads; in the
build this CPU gets, and as a CPU without AVX-512 (8 lanes) or without AVX2 (the scalar loop)
builds it."""
from __future__ import annotations

import ctypes

import pytest
import torch

from inferq.gpuworker.engine import cpu_argmax
from inferq.kernels.cpu import loader

BUILDS = {"native": [], "avx2": ["-mno-avx512f"], "no-simd": ["-mno-avx512f", "-mno-avx2", "-mno-fma"]}


@pytest.fixture(scope="module", params=list(BUILDS))
def fns(request):
    if cpu_argmax.load() is None:
        assert loader.compiler() is None, "a C compiler is on PATH but greedy_argmax.c did not build"
        pytest.skip("no C compiler on this machine: greedy sampling keeps torch's argmax")
    if request.param == "avx2" and not loader.cpu_has("avx2", "fma"):
        pytest.skip("no AVX2 + FMA on this CPU")
    lib = loader.build("greedy_argmax", [*cpu_argmax._FLAGS, *BUILDS[request.param]])
    assert lib is not None
    p, i = ctypes.c_void_p, ctypes.c_int64
    out = {}
    for dt, name in ((torch.float32, "argmax_rows_f32"), (torch.bfloat16, "argmax_rows_bf16")):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [p, i, i, i, p], ctypes.c_int
        out[dt] = fn
    return lib, out


def _argmax(fns, x: torch.Tensor) -> list[int]:
    lib, by_dtype = fns
    out = torch.full((x.shape[0],), -7, dtype=torch.int64)
    loader.sync_threads(lib)
    assert by_dtype[x.dtype](x.data_ptr(), x.stride(0), x.shape[0], x.shape[1], out.data_ptr()) == 0
    return out.tolist()


def _hard_rows(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(16, n, generator=g) * 0.3).to(dtype)  # bf16: many ties
    nan, inf = float("nan"), float("inf")
    x[0] = 1.0  # all tied: index 0
    x[1, -1] = 50.0  # the maximum last (the partial vector)
    x[2, n // 2 :] = 50.0  # tied maxima from the middle on
    x[3] = -inf  # every logit -inf: index 0
    x[4, 0] = nan  # NaN first
    x[5, -1] = nan  # NaN last, a larger value before it
    x[5, 0] = 1e30
    x[6, n // 3] = x[6, -1] = nan  # the first of two NaNs
    x[7] = 0.0
    x[7, : n // 2] = -0.0  # -0 before +0: equal, so index 0
    x[8] = -1.0
    x[8, n - 1] = inf  # +inf wins
    x[9, min(17, n - 1)] = 60.0  # in the second vector
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 7, 16, 17, 63, 64, 65, 200, 1025, 49152, 50_003])
def test_argmax_equals_torch(fns, dtype, n):
    x = _hard_rows(n, dtype, n)
    assert _argmax(fns, x) == x.argmax(dim=-1).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_rows_and_threads(fns, dtype):
    x = _hard_rows(3000, dtype, 3)
    view = x[:, 5:2500]  # rows 3000 apart, starting off a vector boundary
    before = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            assert _argmax(fns, view) == view.argmax(dim=-1).tolist()
    finally:
        torch.set_num_threads(before)


def test_greedy_argmax_takes_the_kernel_and_keeps_torch_for_the_rest():
    """sampler.greedy_argmax: float32 / bf16 CPU rows through the kernel (same answers), float16
    and non-unit column strides through torch's path."""
    from inferq.gpuworker.engine.sampler import greedy_argmax

    if cpu_argmax.load() is None:
        assert loader.compiler() is None, "a C compiler is on PATH but greedy_argmax.c did not build"
        pytest.skip("no C compiler on this machine: greedy sampling keeps torch's argmax")
    x = _hard_rows(4096, torch.float32, 11)
    assert cpu_argmax.argmax_rows(x) is not None
    assert greedy_argmax(x).tolist() == x.argmax(dim=-1).tolist()
    assert cpu_argmax.argmax_rows(x.half()) is None
    assert greedy_argmax(x.half()).tolist() == x.half().argmax(dim=-1).tolist()
    t = x.t().contiguous().t()  # column stride != 1
    assert cpu_argmax.argmax_rows(t) is None
    assert greedy_argmax(t).tolist() == x.argmax(dim=-1).tolist()
    assert greedy_argmax(x[:0]).tolist() == []
