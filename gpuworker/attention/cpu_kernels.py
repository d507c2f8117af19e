"""Small C kernels for the CPU path: decode attention straight over the paged KV
cache, and (bfloat16) a fused residual add + RMSNorm (see llama.add_rms_norm).

The torch path gathers every decode sequence's blocks into a padded buffer
(``index_select``) and then runs SDPA over it: the K/V bytes cross memory three
times (read by the gather, written, read again by SDPA), and the gather alone was
~10 % of an offline run. This kernel reads each sequence's K and V once, through
its block table, the way vLLM's CPU paged-attention kernels do:

for each (sequence, kv head): the G query heads that share the kv head are
scored against every cached key (scores kept in fp32), softmax in two passes
(max, then exp/sum), then the G outputs accumulate ``p * v`` in fp32 and are
divided by the sum once. Inputs and outputs are float32 or bfloat16 (bf16 read
as the high half of an fp32, results rounded to nearest-even, as torch does).

It is plain C (no torch headers), compiled once with the system C compiler
(``-O3 -march=native``; about a second) into ``$INFERQ_CACHE_DIR/cpu_kernels``
(default ``~/.cache/inferq``), keyed by the source, the flags and the CPU's
feature flags, and loaded with ctypes. Where there is no compiler, the build
fails, or ``INFERQ_CPU_KERNELS=0`` is set, ``load()`` returns None and the
callers keep their torch ops. The kernels are single-threaded, so they are used
only while torch runs one thread.

No ``-ffast-math`` (its start-up code would set flush-to-zero for the whole
process): only the flags that let gcc vectorise the reductions. ``exp`` is a
Cody-Waite range reduction plus a degree-7 Taylor polynomial (relative error
< 1e-7 on the softmax's range), vectorisable where libm's ``expf`` is not.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)

_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef union { uint32_t u; float f; } fbits;

static inline float bf2f(uint16_t x) { fbits v; v.u = ((uint32_t)x) << 16; return v.f; }
static inline uint16_t f2bf(float f) {
    fbits v; v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u); /* NaN stays NaN */
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}

/* exp(x) for x <= 0 (softmax after subtracting the max). */
static inline float exp_neg(float x) {
    x = x < -87.0f ? -87.0f : x;
    /* rint, not the add-and-subtract-2^23 trick: -fassociative-math would fold that away */
    float n = __builtin_rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    fbits v; v.f = p; v.u += (uint32_t)((int32_t)n) << 23;
    return v.f;
}

#define MAX_D 256
#define MAX_G 16

/* One (sequence, kv head): G query heads of dimension D over len cached tokens. */
#define DEFINE_KERNEL(NAME, T, LOAD, STORE)                                                   \
static inline __attribute__((always_inline)) int NAME##_impl(                                  \
         const T *q, int64_t q_tok_stride, T *out, int64_t out_tok_stride,                     \
         const T *kc, const T *vc, const int32_t *tables, int64_t table_stride,              \
         const int64_t *q_rows, const int64_t *seq_idx, const int64_t *lens, int64_t nseq,   \
         int64_t hq, int64_t hkv, const int64_t d, int64_t bs, float scale, float *scratch) { \
    const int64_t g_n = hq / hkv;                                                             \
    if (d > MAX_D || g_n > MAX_G || hq % hkv) return -1;                                      \
    const int64_t tok_stride = hkv * d; /* cache layout [blocks, bs, hkv, d] */               \
    float qf[MAX_G][MAX_D], acc[MAX_G][MAX_D], kf[MAX_D];                                     \
    for (int64_t s = 0; s < nseq; ++s) {                                                      \
        const int64_t len = lens[s];                                                          \
        const int32_t *table = tables + seq_idx[s] * table_stride;                            \
        const T *qrow = q + q_rows[s] * q_tok_stride;                                         \
        T *orow = out + q_rows[s] * out_tok_stride;                                           \
        for (int64_t h = 0; h < hkv; ++h) {                                                   \
            for (int64_t g = 0; g < g_n; ++g) {                                               \
                const T *qh = qrow + (h * g_n + g) * d;                                       \
                for (int64_t i = 0; i < d; ++i) qf[g][i] = LOAD(qh[i]) * scale;               \
            }                                                                                 \
            /* pass 1: scores[g][t] */                                                        \
            for (int64_t t0 = 0; t0 < len; t0 += bs) {                                        \
                const int64_t n = len - t0 < bs ? len - t0 : bs;                              \
                const int64_t base = ((int64_t)table[t0 / bs] * bs) * tok_stride + h * d;     \
                for (int64_t t = 0; t < n; ++t) {                                             \
                    const T *kr = kc + base + t * tok_stride;                                 \
                    for (int64_t i = 0; i < d; ++i) kf[i] = LOAD(kr[i]);                      \
                    for (int64_t g = 0; g < g_n; ++g) {                                       \
                        float dot = 0.0f;                                                     \
                        for (int64_t i = 0; i < d; ++i) dot += qf[g][i] * kf[i];              \
                        scratch[g * len + t0 + t] = dot;                                      \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
            /* pass 2: softmax numerators and their sums */                                   \
            float inv[MAX_G];                                                                 \
            for (int64_t g = 0; g < g_n; ++g) {                                               \
                float *sc = scratch + g * len;                                                \
                float m = sc[0];                                                              \
                for (int64_t t = 1; t < len; ++t) m = sc[t] > m ? sc[t] : m;                  \
                float sum = 0.0f;                                                             \
                for (int64_t t = 0; t < len; ++t) { float e = exp_neg(sc[t] - m); sc[t] = e; sum += e; } \
                inv[g] = 1.0f / sum;                                                          \
                for (int64_t i = 0; i < d; ++i) acc[g][i] = 0.0f;                             \
            }                                                                                 \
            /* pass 3: acc[g] += p[g][t] * v[t] */                                            \
            for (int64_t t0 = 0; t0 < len; t0 += bs) {                                        \
                const int64_t n = len - t0 < bs ? len - t0 : bs;                              \
                const int64_t base = ((int64_t)table[t0 / bs] * bs) * tok_stride + h * d;     \
                for (int64_t t = 0; t < n; ++t) {                                             \
                    const T *vr = vc + base + t * tok_stride;                                 \
                    for (int64_t i = 0; i < d; ++i) kf[i] = LOAD(vr[i]);                      \
                    for (int64_t g = 0; g < g_n; ++g) {                                       \
                        const float p = scratch[g * len + t0 + t];                            \
                        for (int64_t i = 0; i < d; ++i) acc[g][i] += p * kf[i];               \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
            for (int64_t g = 0; g < g_n; ++g) {                                               \
                T *oh = orow + (h * g_n + g) * d;                                             \
                for (int64_t i = 0; i < d; ++i) oh[i] = STORE(acc[g][i] * inv[g]);            \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    return 0;                                                                                 \
}                                                                                             \
/* head sizes 64 and 128 get loops of a known trip count (fully vectorised) */               \
int NAME(const T *q, int64_t q_tok_stride, T *out, int64_t out_tok_stride,                     \
         const T *kc, const T *vc, const int32_t *tables, int64_t table_stride,              \
         const int64_t *q_rows, const int64_t *seq_idx, const int64_t *lens, int64_t nseq,   \
         int64_t hq, int64_t hkv, int64_t d, int64_t bs, float scale, float *scratch) {      \
    if (d == 64)                                                                              \
        return NAME##_impl(q, q_tok_stride, out, out_tok_stride, kc, vc, tables, table_stride, \
                           q_rows, seq_idx, lens, nseq, hq, hkv, 64, bs, scale, scratch);    \
    if (d == 128)                                                                             \
        return NAME##_impl(q, q_tok_stride, out, out_tok_stride, kc, vc, tables, table_stride, \
                           q_rows, seq_idx, lens, nseq, hq, hkv, 128, bs, scale, scratch);   \
    return NAME##_impl(q, q_tok_stride, out, out_tok_stride, kc, vc, tables, table_stride,   \
                       q_rows, seq_idx, lens, nseq, hq, hkv, d, bs, scale, scratch);         \
}

#define ID(x) (x)
DEFINE_KERNEL(paged_decode_f32, float, ID, ID)
DEFINE_KERNEL(paged_decode_bf16, uint16_t, bf2f, f2bf)

/* bfloat16 residual add + RMSNorm with HF LlamaRMSNorm's roundings:
   residual = bf16(residual + hidden) (stored back; hidden may be NULL),
   y = bf16(r * 1/sqrt(mean(r^2) + eps)) in fp32, out = bf16(weight * y). */
static inline __attribute__((always_inline)) void add_rms_norm_row(
        uint16_t *res, const uint16_t *hid, const uint16_t *w, uint16_t *out, const int64_t h, float eps,
        float *rf) {
    float ss = 0.0f;
    if (hid) {
        for (int64_t i = 0; i < h; ++i) { uint16_t r = f2bf(bf2f(res[i]) + bf2f(hid[i])); res[i] = r; rf[i] = bf2f(r); }
    } else {
        for (int64_t i = 0; i < h; ++i) rf[i] = bf2f(res[i]);
    }
    for (int64_t i = 0; i < h; ++i) ss += rf[i] * rf[i];
    const float inv = 1.0f / __builtin_sqrtf(ss / (float)h + eps);
    for (int64_t i = 0; i < h; ++i) out[i] = f2bf(bf2f(w[i]) * bf2f(f2bf(rf[i] * inv)));
}

int add_rms_norm_bf16(uint16_t *res, const uint16_t *hid, const uint16_t *w, uint16_t *out,
                      int64_t rows, int64_t h, float eps) {
    float rf[8192];
    if (h > 8192) return -1;
    for (int64_t r = 0; r < rows; ++r) {
        if (h == 576) add_rms_norm_row(res + r * h, hid ? hid + r * h : 0, w, out + r * h, 576, eps, rf);
        else add_rms_norm_row(res + r * h, hid ? hid + r * h : 0, w, out + r * h, h, eps, rf);
    }
    return 0;
}
"""

_FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-fPIC", "-shared", "-std=c11", "-fno-math-errno", "-fno-trapping-math",
          "-fno-signed-zeros", "-fassociative-math"]

_lock = threading.Lock()
_loaded: "DecodeKernel | None | bool" = False  # False = not tried yet


class DecodeKernel:
    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        self.path = path
        argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                    ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p]
        self.fns = {}
        for name in ("paged_decode_f32", "paged_decode_bf16"):
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
            self.fns[name] = fn
        fn = lib.add_rms_norm_bf16
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_int64, ctypes.c_int64, ctypes.c_float]
        fn.restype = ctypes.c_int
        self.add_rms_norm_bf16 = fn


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _cache_dir() -> Path:
    # the same root as the GGUF conversions (gguf_loader): $INFERQ_CACHE_DIR or ~/.cache/inferq
    return Path(os.environ.get("INFERQ_CACHE_DIR") or Path.home() / ".cache" / "inferq") / "cpu_kernels"


def _build() -> DecodeKernel | None:
    if os.environ.get("INFERQ_CPU_KERNELS", "1").lower() in ("0", "false", "no", "off"):
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        log.info("no C compiler: CPU decode attention stays on the torch path")
        return None
    key = hashlib.sha256("\0".join([_SOURCE, cc, *_FLAGS, _cpu_flags()]).encode()).hexdigest()[:16]
    folder = _cache_dir()
    path = folder / f"paged_decode_{key}.so"
    try:
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=folder) as tmp:
                src = Path(tmp) / "paged_decode.c"
                src.write_text(_SOURCE)
                so = Path(tmp) / "paged_decode.so"
                subprocess.run([cc, *_FLAGS, str(src), "-o", str(so), "-lm"], check=True, capture_output=True,
                               timeout=120)
                os.replace(so, path)  # atomic: a concurrent builder sees all or nothing
        return DecodeKernel(ctypes.CDLL(str(path)), path)
    except Exception as e:  # no usable compiler, read-only cache, a failed load: stay on torch
        detail = getattr(e, "stderr", b"") or b""
        log.warning("CPU decode attention kernel unavailable (%s %s); using the torch path",
                    e, detail.decode(errors="replace")[:500])
        return None


def load() -> DecodeKernel | None:
    """The compiled kernel (built on first use), or None where it cannot be had."""
    global _loaded
    with _lock:
        if _loaded is False:
            _loaded = _build()
        return _loaded  # type: ignore[return-value]
