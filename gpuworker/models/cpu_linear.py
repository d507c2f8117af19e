"""Matmuls of decode-sized batches on the CPU, streaming each weight once.

A decode step of a small model is a read of every weight for a few rows of
activations. At 32 rows, SmolLM2-135M's bf16 weights (270 MB) took ~40 ms through
oneDNN (~6.5 GB/s) where a plain streaming read of the same bytes runs at ~9 GB/s
on one core here; in float32, MKL's sgemm ran at ~45 GFLOP/s at 16-32 rows, about
a third of one core's FMA peak. Four kernels, each reading a weight packed once into
panels of 32 output columns x all of K (contiguous, so a matmul is one sequential
pass with software prefetch), each row chunk reusing the panel from L1/L2:

* bfloat16 on Intel AMX: the panel as pairs of B tiles, 32-row chunks of x as A
  tiles (a tail chunk zero-padded; a chunk of 1-16 rows runs two tile products a k block,
  not four), fp32 accumulation in the tiles (``tdpbf16ps``), bias in fp32, one rounding to
  bf16 as oneDNN does. On a 2-vCPU Xeon (Emerald Rapids), SmolLM2's projections: 1.2-1.6x
  oneDNN's prepacked speed at 1-32 rows, 0.8-0.95x at 128-512 (inferq bench cpu-matmul); it runs
  every batch size since its panels are the only copy of the weights.
* bfloat16 on AVX512-BF16 without AMX (e.g. AMD Zen 4 and 5): the panel as [K/2][32][2]
  (one k pair of 32 columns per 128 bytes), 14 rows x 32 columns of fp32 accumulators,
  ``vdpbf16ps`` with each row's k pair broadcast; bias in fp32, one rounding to bf16,
  as oneDNN does (equal to it or one ulp apart). On a 2-core Zen 5: 1.25-1.5x oneDNN's
  packing at 1-32 rows, and equal up to 2,048 rows, so it runs every batch size there.
* float32 on AVX-512: 14 rows x 32 columns of accumulators in registers, K summed
  in blocks of 64 that are then added in order (a rounding error like MKL's, not a
  576-long chain). 1.4-2x ``F.linear`` at 1-64 rows (not bit-identical to it). Off
  Intel, MKL (``F.linear``) takes a generic path, 2.2x slower than this kernel at
  128-2,048 rows on a 2-core Zen 5, so there the kernel runs every batch size.
* float32 on AVX2 + FMA without AVX-512 (e.g. AMD EPYC before Zen 4): 16-column panels,
  6 x 16 accumulators, blocked as a GEMM past one row chunk (each panel's 64-long k blocks
  read from L1 by every row chunk, rows in L2-sized blocks); 1.1-2x ``F.linear`` (MKL) at
  1-64 rows on a 2-core EPYC (inferq bench cpu-matmul), level with it or faster past
  that and 1.3-1.6x MKL on its panels, so there it runs every batch size.

The packed panels replace the plain weight (one copy of the weights in memory):
``PackedWeight`` runs every batch size on its kernel, on ``torch.get_num_threads()``
threads (OpenMP, split over output panels: each output summed in the one-thread order, so
bit-identical at any thread count; one thread where the build has no OpenMP). Each output is
summed over k in one order whatever the row count (the narrow and the blocked kernels, k
slices and row blocks all keep it), so a row's result does not depend on the batch: the
engine's batch invariance (docs/kernels.md). Only where ``max_rows`` is capped by hand
(``inferq bench prompt-step --matmul-kernel-rows``) do the float32 panels go to MKL past it,
as they lie: ``[n/P][k][P]`` is a batch of ``k x P`` matrices, so ``x @ panels`` is one batched
matmul with no copy of the weight (inferq bench cpu-matmul's "MKL on panels" column); that
path is not batch-invariant. ``rows(ids)`` reads rows of the weight back
out of the panels (the embedding of a tied LM head). The C is in inferq_kernels/cpu/linear_avx512.c and
inferq_kernels/cpu/linear_avx2.c, built by inferq_kernels/cpu/loader.py: on CPUs with AVX-512F (else AVX2 + FMA), AMX only where
/proc/cpuinfo lists it and Linux grants the process AMX state
(``arch_prctl(ARCH_REQ_XCOMP_PERM)``); ``lib.bf16`` names the bf16 kernel ("amx",
"avx512_bf16" or None).
"""
from __future__ import annotations

import ctypes
import threading

import torch

from inferq.gpuworker.attention import cpu_kernels
from inferq.kernels.cpu import loader

_FLAGS = ["-O3", "-march=native", "-mamx-tile", "-mamx-bf16", "-mavx512bf16", "-std=gnu11"]

# float32 on CPUs with AVX2 + FMA but no AVX-512 (e.g. AMD EPYC before Zen 4): the same
# scheme with 16-column panels and 6 x 16 accumulators (inferq_kernels/cpu/linear_avx2.c).
# Built without -march=native so an AVX-512 build machine cannot slip wider code in.
_FLAGS_AVX2 = ["-O3", "-mavx2", "-mfma", "-mf16c", "-std=gnu11"]

_lock = threading.Lock()
_loaded: "ctypes.CDLL | None | bool" = False  # False = not tried yet

# Every kernel runs every batch size (in chunks of this many rows): a row's result is then the
# same bits whatever the batch (batch invariance: the kernels sum each output over k in one
# order, whatever the row count, row block or thread; docs/kernels.md). The AVX512-BF16 kernel:
# on a 2-core Zen 5 it streamed the weights 1.25-1.5x faster than oneDNN's packing at 1-32
# rows and matched it up to 2,048 (inferq bench cpu-matmul). The AMX one: its panels are the
# only copy of the weights, so it takes prompt chunks too.
ALL_ROWS = 1 << 16
MAX_ROWS_DP_BF16 = MAX_ROWS_AMX_BF16 = ALL_ROWS
# Off Intel, MKL's sgemm (torch's float32 F.linear) takes a generic code path: on a 2-core
# Zen 5 the AVX-512 kernel was 2.2x faster at 128-2,048 rows. (oneDNN's fp32 packing was
# ~1.15x the kernel at 2,048 rows, but it builds a primitive per distinct batch size: a
# worker's memory grew by ~430 MB over 12,000 jobs, and its results change with the batch.)
MAX_ROWS_AVX512_F32_OFF_INTEL = ALL_ROWS
# On Intel MKL's sgemm was faster than the kernel past 64 rows (prompt chunks), and went there
# until the engine became batch-invariant: MKL's sums are not the kernel's, so a token's bits
# depended on whether its step had more than 64 rows. Not re-measured since (no Intel CPU).
MAX_ROWS_AVX512_F32_INTEL = ALL_ROWS
# The AVX2 kernel: on a 2-core Zen 3 (inferq bench cpu-matmul --dtype float32 --no-lm-head)
# level with F.linear on the plain weights at 256-1,024 rows, but 1.33x / 1.56x faster than
# MKL on its panels (the one copy there is), which a 2,048-token prompt step went to when
# this stopped at 320 rows: prompts-only ran at 0.81x vLLM.
MAX_ROWS_AVX2_F32 = ALL_ROWS


def f32_max_rows(lib: ctypes.CDLL) -> int:
    """Rows per call of the float32 kernel (past them: calls of that many rows)."""
    if lib.isa == "avx2":
        return MAX_ROWS_AVX2_F32
    return MAX_ROWS_AVX512_F32_INTEL if cpu_kernels.cpu_vendor() == "GenuineIntel" else MAX_ROWS_AVX512_F32_OFF_INTEL


def load() -> ctypes.CDLL | None:
    """The compiled kernels (``lib.amx``: whether AMX is usable), or None where they cannot be had."""
    global _loaded
    with _lock:
        if _loaded is False:
            _loaded = _build()
        return _loaded  # type: ignore[return-value]


def _build() -> ctypes.CDLL | None:
    if not cpu_kernels.enabled():
        return None
    avx512 = cpu_kernels.cpu_has("avx512f")
    if avx512:
        lib = loader.build("linear_avx512", _FLAGS)
    elif cpu_kernels.cpu_has("avx2", "fma"):
        lib = loader.build("linear_avx2", _FLAGS_AVX2)
    else:
        return None
    if lib is None:
        return None
    declare(lib, "avx512" if avx512 else "avx2")
    lib.amx = avx512 and cpu_kernels.cpu_has("amx_tile", "amx_bf16", "avx512_bf16") and lib.amx_enable() == 0
    lib.f16 = not avx512 and cpu_kernels.cpu_has("f16c")  # float16 panels (f16_linear), AVX2 build
    lib.bf16 = "amx" if lib.amx else ("avx512_bf16" if avx512 and cpu_kernels.cpu_has("avx512_bf16") else None)
    return lib


def declare(lib: ctypes.CDLL, isa: str) -> None:
    """Give a built linear_<isa>.c its ctypes signatures and ``lib.isa``."""
    p, i = ctypes.c_void_p, ctypes.c_int64
    fns = (("amx_pack_bf16", "dp_pack_bf16", "f32_pack", "amx_linear_bf16", "dp_linear_bf16", "f32_linear")
           if isa == "avx512" else ("f32_pack", "f32_linear", "f16_pack", "f16_linear"))
    for name in fns:
        getattr(lib, name).argtypes = [p, i, i, p] if "pack" in name else [p, i, i, p, i, i, p, p, i]
        getattr(lib, name).restype = ctypes.c_int
    lib.isa = isa
    # The gate/up matmul with SiLU-and-mul fused (PackedGateUp), by the weight's layout: (fused,
    # silu_pairs); built where the compiler has AVX-512 BW and VL (vec_math.h).
    lib.silu_fused = {}
    if isa == "avx512" and hasattr(lib, "f32_linear_silu"):
        for layout, fused, pairs in (("f32", "f32_linear_silu", "f32_silu_pairs"),
                                     ("avx512_bf16", "dp_linear_bf16_silu", "bf16_silu_pairs"),
                                     ("amx", "amx_linear_bf16_silu", "bf16_silu_pairs")):
            f, g = getattr(lib, fused), getattr(lib, pairs)
            f.argtypes, g.argtypes = [p, i, i, p, i, i, p, i], [p, i, i, i, p, i]
            f.restype = g.restype = ctypes.c_int
            lib.silu_fused[layout] = (f, g)


def can_pack(lib: ctypes.CDLL, weight: torch.Tensor) -> bool:
    """Whether ``weight`` has a kernel here: a CPU matrix of 32k rows (and 32k columns in bf16);
    a float16 one (a GGUF's F16 weights, float32 activations) on the AVX2 build."""
    if weight.dim() != 2 or weight.device.type != "cpu" or weight.shape[0] % 32:
        return False
    if weight.dtype == torch.float16:
        return getattr(lib, "f16", False)
    if weight.dtype == torch.bfloat16:
        return weight.shape[1] % (32 if lib.bf16 == "amx" else 2) == 0 if lib.bf16 else False
    return weight.dtype == torch.float32


class PackedWeight:
    """One weight packed for its kernel, in place of the plain tensor: a call takes any
    batch; ``applies(x)`` says whether the kernel itself runs it; ``rows(ids)`` and
    ``unpacked()`` read the plain weight back."""

    def __init__(self, lib: ctypes.CDLL, weight: torch.Tensor) -> None:
        if not can_pack(lib, weight):
            raise ValueError(f"no CPU kernel for a {weight.dtype} weight of shape {tuple(weight.shape)} "
                             "(needs multiples of 32; bf16 needs AMX or AVX512-BF16)")
        self.lib = lib
        self.dtype = torch.float32 if weight.dtype == torch.float16 else weight.dtype  # of x and y
        self.n, self.k = weight.shape
        if weight.dtype == torch.float16:  # AVX2: the float32 kernel on half-width panels
            self.layout = "f16"
            self.max_rows = f32_max_rows(lib)
            self._pack, self._run = lib.f16_pack, lib.f16_linear
        elif self.dtype == torch.bfloat16:
            self.layout = lib.bf16  # "amx" or "avx512_bf16"
            self.max_rows = MAX_ROWS_AMX_BF16 if lib.bf16 == "amx" else MAX_ROWS_DP_BF16
            self._pack, self._run = ((lib.amx_pack_bf16, lib.amx_linear_bf16) if lib.bf16 == "amx"
                                     else (lib.dp_pack_bf16, lib.dp_linear_bf16))
        else:
            self.layout = "f32"
            self.max_rows = f32_max_rows(lib)
            self._pack, self._run = lib.f32_pack, lib.f32_linear
        self.panel = 16 if lib.isa == "avx2" and self.layout in ("f32", "f16") else 32  # output columns per panel
        w = weight.detach().contiguous()
        self.packed = torch.empty_like(w)
        self._pack(w.data_ptr(), self.n, self.k, self.packed.data_ptr())

    @property
    def nbytes(self) -> int:
        return self.packed.numel() * self.packed.element_size()

    def applies(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
        return (x.dim() == 2 and 0 < x.shape[0] <= self.max_rows and x.dtype == self.dtype and x.stride(1) == 1
                and (bias is None or (bias.dtype == self.dtype and bias.is_contiguous())))

    def _checked(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` as the kernels read it (rows with unit stride), or a TypeError / ValueError
        where it or ``bias`` does not fit this weight."""
        if x.dtype != self.dtype or (bias is not None and bias.dtype != self.dtype):
            raise TypeError(f"a {self.dtype} packed weight got x {x.dtype}"
                            + ("" if bias is None else f" and bias {bias.dtype}"))
        if x.dim() != 2 or x.shape[1] != self.k:
            raise ValueError(f"x {tuple(x.shape)} does not fit a packed weight ({self.n}, {self.k})")
        return x if x.stride(1) == 1 else x.contiguous()

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``F.linear(x, weight, bias)`` for a 2-D ``x`` of any row count."""
        x = self._checked(x, bias)
        if bias is not None:
            bias = bias.contiguous()
        m = x.shape[0]
        if m == 0:
            return x.new_empty(0, self.n)
        if m <= self.max_rows:
            return self._kernel(x, bias)
        if self.layout == "f32" and self.max_rows < ALL_ROWS:  # a cap set by hand (inferq bench prompt-step)
            return self._mkl_on_panels(x, bias)
        return torch.cat([self._kernel(x[i:i + self.max_rows], bias) for i in range(0, m, self.max_rows)])

    def _kernel(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        loader.sync_threads(self.lib)
        y = torch.empty(x.shape[0], self.n, dtype=self.dtype)
        rc = self._run(x.data_ptr(), x.stride(0), x.shape[0], self.packed.data_ptr(), self.n, self.k,
                       None if bias is None else bias.data_ptr(), y.data_ptr(), self.n)
        if rc != 0:
            raise RuntimeError(f"CPU matmul failed (rc {rc}) for x {tuple(x.shape)} and weight ({self.n}, {self.k})")
        return y

    def _mkl_on_panels(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # [n/P][k][P] is a batch of n/P (k x P) matrices: one bmm, the weight read where it lies.
        p = self.panel
        y = torch.matmul(x, self.packed.view(self.n // p, self.k, p))  # [n/P, m, P]
        y = y.permute(1, 0, 2).reshape(x.shape[0], self.n)
        return y if bias is None else y.add_(bias)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """``weight[ids]`` (exact copies), gathered from the panels: an embedding lookup."""
        ids = ids.reshape(-1)
        if self.layout in ("f32", "f16"):  # [n/P][k][P]
            p = self.panel
            return self.packed.view(self.n // p, self.k, p)[ids // p, :, ids % p].to(self.dtype)
        if self.layout == "avx512_bf16":  # [n/32][k/2][32][2]
            got = self.packed.view(self.n // 32, self.k // 2, 32, 2)[ids // 32, :, ids % 32, :]
        else:  # amx: [n/32][k/32][2 tiles][16 k pairs][16 columns][2]
            got = self.packed.view(self.n // 32, self.k // 32, 2, 16, 16, 2)[ids // 32, :, ids % 32 // 16, :, ids % 16, :]
        return got.reshape(ids.shape[0], self.k)

    def unpacked(self) -> torch.Tensor:
        """The plain ``[n, k]`` weight (a new tensor: for tests and checks, not the hot path)."""
        return self.rows(torch.arange(self.n))


def layout_of(lib: ctypes.CDLL, dtype: torch.dtype) -> str | None:
    """How a weight of ``dtype`` is packed here: "f32", "amx", "avx512_bf16", or None."""
    return "f32" if dtype == torch.float32 else (lib.bf16 if dtype == torch.bfloat16 else None)


def can_fuse_gate_up(lib: ctypes.CDLL, weight: torch.Tensor) -> bool:
    """Whether the MLP's gate|up weight ``[2I, k]`` can be a PackedGateUp here: the AVX-512
    fp32 kernel, the AVX512-BF16 one or the AMX one, I a multiple of 32."""
    return (can_pack(lib, weight) and weight.shape[0] % 64 == 0
            and layout_of(lib, weight.dtype) in getattr(lib, "silu_fused", {}))


class PackedGateUp(PackedWeight):
    """The MLP's fused gate|up weight ``[2I, k]`` (gate rows first), packed with the gate and
    up panels interleaved (32 gate columns, then the same 32 of up), so that ``silu_mul(x)``,
    ``F.silu(x @ gate^T) * (x @ up^T)``, is one kernel that never writes the ``[m, 2I]``
    gate/up output (inferq_kernels/cpu/linear_avx512.c, ``*_linear_*silu``): the same bits as
    the matmul followed by the SiLU-and-mul kernel. A plain call, ``rows`` and ``unpacked``
    keep the weight's own column order."""

    def __init__(self, lib: ctypes.CDLL, weight: torch.Tensor) -> None:
        if not can_fuse_gate_up(lib, weight):
            raise ValueError(f"no fused gate/up kernel for a {weight.dtype} weight of shape {tuple(weight.shape)}")
        n = weight.shape[0]
        self.inter = n // 2
        # packed row p holds weight row order[p]: [gate 0:32, up 0:32, gate 32:64, up 32:64, ...]
        order = torch.arange(n).view(2, n // 64, 32).transpose(0, 1).reshape(n)
        super().__init__(lib, weight.detach()[order])
        self._order = order
        self._position = torch.argsort(order)  # weight row r sits at packed row position[r]

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = super().__call__(x, None if bias is None else bias[self._order])
        return y.index_select(1, self._position)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return super().rows(self._position[ids.reshape(-1)])

    def silu_mul(self, x: torch.Tensor) -> torch.Tensor:
        """``F.silu(gate) * up`` of ``x @ W^T`` (no bias), ``[m, I]``."""
        x = self._checked(x)
        m = x.shape[0]
        out = torch.empty(m, self.inter, dtype=self.dtype)
        if m == 0:
            return out
        fused, pairs = self.lib.silu_fused[self.layout]
        loader.sync_threads(self.lib)
        if m <= self.max_rows:
            rc = fused(x.data_ptr(), x.stride(0), m, self.packed.data_ptr(), self.n, self.k, out.data_ptr(), self.inter)
            if rc == 0:
                return out
            if rc < 0:
                raise RuntimeError(f"fused gate/up kernel failed (rc {rc}) for x {tuple(x.shape)}")
        y = PackedWeight.__call__(self, x, None)  # the interleaved order; then SiLU-and-mul on it
        pairs(y.data_ptr(), y.stride(0), m, self.n, out.data_ptr(), self.inter)
        return out
