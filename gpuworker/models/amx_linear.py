"""bfloat16 matmuls of decode-sized batches on Intel AMX, streaming each weight once.

A decode step of a small model is a read of every weight for a few rows of
activations: at 32 rows, SmolLM2-135M's 270 MB of bf16 weights take ~40 ms
through oneDNN (~6.5 GB/s), while a plain streaming read of the same bytes runs at
~9 GB/s on one core here. This kernel gets closer to the read: the weight is
packed once into AMX B tiles, laid out panel by panel (32 output columns x all of
K, contiguous), so a matmul is one sequential pass over the weight with software
prefetch a few tiles ahead; each 32-row chunk of activations reuses the panel
from L1/L2 (a tail chunk is zero-padded, so every tile has the same shape).
Accumulation is fp32 in the tiles (``tdpbf16ps``); bias is added in fp32 and the
result rounded to nearest-even bf16, as oneDNN does: on this machine the outputs
equal ``F.linear``'s for up to 32 rows (tested within a bf16 ulp).

Used for row counts up to ``MAX_ROWS`` while torch runs one thread (the kernel
is single-threaded); larger batches (prompt chunks) stay on ``F.linear``, which
is as fast as a prepacked oneDNN weight there. Built like the other C kernels
(gpuworker/attention/cpu_kernels.py), only on CPUs whose /proc/cpuinfo lists
``amx_tile`` and ``amx_bf16`` and whose kernel grants the process AMX state
(``arch_prctl(ARCH_REQ_XCOMP_PERM)``).
"""
from __future__ import annotations

import ctypes
import threading

import torch

from gpuworker.attention import cpu_kernels

# Beyond this many rows oneDNN/F.linear wins (the panel is reused from cache, and
# this kernel's compute rate, ~350 GFLOP/s, is below oneDNN's at large batches).
MAX_ROWS = 32

_SOURCE = r"""
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

/* Linux hands out AMX state only to a process that asks (ARCH_REQ_XCOMP_PERM, XTILEDATA). */
int amx_enable(void) { return syscall(SYS_arch_prctl, 0x1023, 18) == 0 ? 0 : -1; }

/* W[n,k] row-major -> [n/32 panels][k/32][2 tiles][16 k-pairs][16 columns][2]: a panel is contiguous. */
int amx_pack_bf16(const uint16_t *w, int64_t n, int64_t k, uint16_t *out) {
    if (n % 32 || k % 32) return -1;
    int64_t kb_n = k / 32;
    for (int64_t nb = 0; nb < n / 32; ++nb)
        for (int64_t kb = 0; kb < kb_n; ++kb)
            for (int t = 0; t < 2; ++t) {
                uint16_t *tile = out + ((nb * kb_n + kb) * 2 + t) * 512;
                for (int r = 0; r < 16; ++r)
                    for (int c = 0; c < 16; ++c)
                        for (int j = 0; j < 2; ++j)
                            tile[r * 32 + c * 2 + j] = w[(nb * 32 + t * 16 + c) * k + kb * 32 + 2 * r + j];
            }
    return 0;
}

static inline void store_rows(const float *c, int rows, int64_t col0, const uint16_t *bias, uint16_t *y, int64_t ldy) {
    __m512 b = _mm512_setzero_ps();
    if (bias) b = _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(bias + col0))), 16));
    for (int r = 0; r < rows; ++r) {
        __m512 v = _mm512_add_ps(_mm512_loadu_ps(c + r * 16), b);
        _mm256_storeu_si256((__m256i *)(y + r * ldy + col0), (__m256i)_mm512_cvtneps_pbh(v));
    }
}

/* y[m,n] = x[m,k] @ W^T (+ bias): bf16 in and out, fp32 accumulation. Tiles: tmm0-3 C
   (rows 0-15 / 16-31 x columns 0-15 / 16-31 of the panel), tmm4-5 A, tmm6-7 B. */
int amx_linear_bf16(const uint16_t *x, int64_t ldx, int64_t m, const uint16_t *wp, int64_t n, int64_t k,
                    const uint16_t *bias, uint16_t *y, int64_t ldy) {
    if (n % 32 || k % 32 || m <= 0) return -1;
    int64_t kb_n = k / 32, full = m / 32 * 32, tail = m - full;
    uint16_t *pad = 0;
    if (tail) {
        pad = (uint16_t *)aligned_alloc(64, (size_t)(32 * k * 2 + 63) / 64 * 64);
        if (!pad) return -2;
        memset(pad, 0, 32 * k * 2);
        for (int64_t r = 0; r < tail; ++r) memcpy(pad + r * k, x + (full + r) * ldx, k * 2);
    }
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int i = 0; i < 8; ++i) { cfg.rows[i] = 16; cfg.colsb[i] = 64; }
    _tile_loadconfig(&cfg);
    float c[4][256] __attribute__((aligned(64)));
    for (int64_t nb = 0; nb < n / 32; ++nb) {
        const uint16_t *b = wp + nb * kb_n * 1024;
        for (int64_t m0 = 0; m0 < m; m0 += 32) {
            const uint16_t *xa = m0 < full ? x + m0 * ldx : pad;
            int64_t lda = m0 < full ? ldx : k;
            const uint16_t *xb = xa + 16 * lda;
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            for (int64_t kb = 0; kb < kb_n; ++kb) {
                if (m0 == 0) {  /* first pass over the panel: fetch 4 tile pairs (8 KB) ahead */
                    const char *p = (const char *)(b + kb * 1024) + 4 * 2048;
                    for (int i = 0; i < 2048; i += 64) _mm_prefetch(p + i, _MM_HINT_T0);
                }
                _tile_loadd(6, b + kb * 1024, 64);
                _tile_loadd(7, b + kb * 1024 + 512, 64);
                _tile_loadd(4, xa + kb * 32, lda * 2);
                _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
                _tile_loadd(5, xb + kb * 32, lda * 2);
                _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
            }
            int rows = m - m0 < 32 ? (int)(m - m0) : 32;
            int r0 = rows < 16 ? rows : 16, r1 = rows - r0;
            _tile_stored(0, c[0], 64); _tile_stored(1, c[1], 64);
            store_rows(c[0], r0, nb * 32, bias, y + m0 * ldy, ldy);
            store_rows(c[1], r0, nb * 32 + 16, bias, y + m0 * ldy, ldy);
            if (r1) {
                _tile_stored(2, c[2], 64); _tile_stored(3, c[3], 64);
                store_rows(c[2], r1, nb * 32, bias, y + (m0 + 16) * ldy, ldy);
                store_rows(c[3], r1, nb * 32 + 16, bias, y + (m0 + 16) * ldy, ldy);
            }
        }
    }
    _tile_release();
    free(pad);
    return 0;
}
"""

_FLAGS = ["-O3", "-march=native", "-mamx-tile", "-mamx-bf16", "-mavx512bf16", "-fPIC", "-shared", "-std=gnu11"]

_lock = threading.Lock()
_loaded: "ctypes.CDLL | None | bool" = False  # False = not tried yet


def load() -> ctypes.CDLL | None:
    """The compiled kernel with AMX granted to this process, or None where it cannot be had."""
    global _loaded
    with _lock:
        if _loaded is False:
            _loaded = _build()
        return _loaded  # type: ignore[return-value]


def _build() -> ctypes.CDLL | None:
    if not cpu_kernels.enabled() or not cpu_kernels.cpu_has("amx_tile", "amx_bf16", "avx512_bf16"):
        return None
    lib = cpu_kernels.build_shared("amx_linear", _SOURCE, _FLAGS)
    if lib is None or lib.amx_enable() != 0:
        return None
    p, i = ctypes.c_void_p, ctypes.c_int64
    lib.amx_pack_bf16.argtypes = [p, i, i, p]
    lib.amx_pack_bf16.restype = ctypes.c_int
    lib.amx_linear_bf16.argtypes = [p, i, i, p, i, i, p, p, i]
    lib.amx_linear_bf16.restype = ctypes.c_int
    return lib


class AmxWeight:
    """One weight packed into AMX tiles; ``applies(x)`` says whether a call may use it."""

    def __init__(self, lib: ctypes.CDLL, weight: torch.Tensor) -> None:
        self.lib = lib
        self.n, self.k = weight.shape
        w = weight.detach().contiguous()
        self.packed = torch.empty_like(w)
        if lib.amx_pack_bf16(w.data_ptr(), self.n, self.k, self.packed.data_ptr()) != 0:
            raise ValueError(f"shape {tuple(weight.shape)} does not tile (needs multiples of 32)")

    def applies(self, x: torch.Tensor) -> bool:
        return (x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.dtype == torch.bfloat16 and x.stride(1) == 1
                and torch.get_num_threads() == 1)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = torch.empty(x.shape[0], self.n, dtype=torch.bfloat16)
        rc = self.lib.amx_linear_bf16(x.data_ptr(), x.stride(0), x.shape[0], self.packed.data_ptr(), self.n, self.k,
                                      None if bias is None else bias.data_ptr(), y.data_ptr(), self.n)
        if rc != 0:
            raise RuntimeError(f"AMX matmul failed (rc {rc}) for x {tuple(x.shape)} and weight ({self.n}, {self.k})")
        return y


def can_pack(weight: torch.Tensor) -> bool:
    return (weight.dim() == 2 and weight.dtype == torch.bfloat16 and weight.device.type == "cpu"
            and weight.shape[0] % 32 == 0 and weight.shape[1] % 32 == 0)
