#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "threads.h"
#include "vec_math.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#define HAVE_AVX512 1
#else
#define HAVE_AVX512 0
#endif
#if defined(__AVX512BF16__) && HAVE_AVX512
#define HAVE_DPBF16 1
#else
#define HAVE_DPBF16 0
#endif

/* loops over a block's 16 tokens unrolled by hand (their accumulators stay in registers) */
#define UNROLLED _Pragma("GCC unroll 16")

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
    /* fmaf: -fassociative-math would merge two plain products into n * ln2 rounded to
       float, an error growing with |n| (3.7e-6 relative at x = -72; 7e-8 with fmaf) */
    float r = __builtin_fmaf(n, -0.693359375f, x);
    r = __builtin_fmaf(n, 2.12194440e-4f, r);
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

#if HAVE_AVX512
/* 16 vectors -> one vector of their 16 horizontal sums (lane t = sum of v[t]) */
static inline __m512 sum16(const __m512 *v) {
    __m512 c[8], e[4], f[2];
    for (int i = 0; i < 8; ++i)
        c[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; ++i)
        e[i] = _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(c[2 * i]), _mm512_castps_pd(c[2 * i + 1]))),
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(c[2 * i]), _mm512_castps_pd(c[2 * i + 1]))));
    for (int i = 0; i < 2; ++i)
        f[i] = _mm512_add_ps(_mm512_shuffle_f32x4(e[2 * i], e[2 * i + 1], 0x88),   /* lanes 0,2 | 0,2 */
                             _mm512_shuffle_f32x4(e[2 * i], e[2 * i + 1], 0xdd));  /* lanes 1,3 | 1,3 */
    return _mm512_add_ps(_mm512_shuffle_f32x4(f[0], f[1], 0x88), _mm512_shuffle_f32x4(f[0], f[1], 0xdd));
}

/* sc[t] = exp(sc[t] - max) over len scores; returns their sum (16 lanes at a time: the
   scalar loop was most of a decode row's time at a few hundred tokens) */
static inline float softmax_numerators(float *sc, int64_t len) {
    __m512 vm = _mm512_set1_ps(-__builtin_inff());
    for (int64_t t = 0; t < len; t += 16) {
        const __mmask16 k = len - t >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (len - t)) - 1u);
        vm = _mm512_max_ps(vm, _mm512_mask_loadu_ps(vm, k, sc + t));
    }
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(vm));
    __m512 vs = _mm512_setzero_ps();
    for (int64_t t = 0; t < len; t += 16) {
        const __mmask16 k = len - t >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (len - t)) - 1u);
        const __m512 e = exp_neg16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sc + t), m));
        _mm512_mask_storeu_ps(sc + t, k, e);
        vs = _mm512_mask_add_ps(vs, k, vs, e);
    }
    return _mm512_reduce_add_ps(vs);
}
/* q.k for the n (<= 16) tokens of one block and g_n query heads: 16 tokens' dot products as 16
   vectors, summed across lanes at once (no horizontal sum per token):
   scores[g * len + t] = scale * (q_g . k_t). FMA(acc, q, k) adds STEP values' products. The 16
   tokens' sums advance side by side, STEP values at a time: one token's chain of d / STEP
   dependent FMAs at a time left the core waiting on each FMA's latency (decode attention on a
   Zen 4 1.15-1.25x faster with the cache in L3). Past a partial block's n tokens the lanes
   re-read token n - 1 (in bounds; never stored). */
#define DEFINE_DOTS(NAME, T, STEP, FMA)                                                          \
static inline __attribute__((always_inline)) void NAME(                                         \
        const T *q, const T *k, int64_t tok_stride, int64_t n, int64_t g_n, const int64_t d,    \
        float scale, float *scores, int64_t len) {                                               \
    const T *kr[16];                                                                             \
    UNROLLED for (int t = 0; t < 16; ++t) kr[t] = k + (t < n ? t : n - 1) * tok_stride;         \
    const __m512 vscale = _mm512_set1_ps(scale);                                                 \
    for (int64_t g = 0; g < g_n; ++g) {                                                          \
        const T *qg = q + g * d;                                                                 \
        __m512 acc[16];                                                                          \
        UNROLLED for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();                      \
        for (int64_t j = 0; j < d; j += STEP)                                                    \
            UNROLLED for (int t = 0; t < 16; ++t) acc[t] = FMA(acc[t], qg + j, kr[t] + j);       \
        const __m512 s = _mm512_mul_ps(sum16(acc), vscale);                                      \
        _mm512_mask_storeu_ps(scores + g * len, (__mmask16)((1u << n) - 1u), s);                 \
    }                                                                                            \
}
#define FMA_F32(a, x, y) _mm512_fmadd_ps(_mm512_loadu_ps(x), _mm512_loadu_ps(y), a)
DEFINE_DOTS(dots_f32, float, 16, FMA_F32)
/* p.v for head size 64: acc[g] (row stride MAX_D) += p[g][t] * v[t] over the n tokens of one
   block, GC query heads at a time with their accumulators in registers; LOAD16 widens 16
   values of the cache's dtype to fp32. */
#define LOAD16_F32(p) _mm512_loadu_ps(p)
#define LOAD16_BF16(p) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define DEFINE_PV64(NAME, T, LOAD16, GC)                                                        \
static inline void NAME##_##GC(const T *v, int64_t ts, int64_t n, const float *p,               \
                               int64_t len, float *acc) {                                       \
    __m512 a[GC][4];                                                                            \
    for (int g = 0; g < GC; ++g)                                                                \
        for (int j = 0; j < 4; ++j) a[g][j] = _mm512_loadu_ps(acc + g * 256 + j * 16);          \
    for (int64_t t = 0; t < n; ++t) {                                                           \
        const T *vr = v + t * ts;                                                               \
        __m512 x[4];                                                                            \
        for (int j = 0; j < 4; ++j) x[j] = LOAD16(vr + 16 * j);                                 \
        for (int g = 0; g < GC; ++g) {                                                          \
            const __m512 pb = _mm512_set1_ps(p[g * len + t]);                                   \
            for (int j = 0; j < 4; ++j) a[g][j] = _mm512_fmadd_ps(pb, x[j], a[g][j]);           \
        }                                                                                       \
    }                                                                                           \
    for (int g = 0; g < GC; ++g)                                                                \
        for (int j = 0; j < 4; ++j) _mm512_storeu_ps(acc + g * 256 + j * 16, a[g][j]);          \
}
#define DEFINE_PV64_ALL(NAME, T, LOAD16)                                                        \
DEFINE_PV64(NAME, T, LOAD16, 1) DEFINE_PV64(NAME, T, LOAD16, 2)                                 \
DEFINE_PV64(NAME, T, LOAD16, 3) DEFINE_PV64(NAME, T, LOAD16, 4)                                 \
static inline void NAME(const T *v, int64_t ts, int64_t n, const float *p, int64_t len,         \
                        float *acc, int64_t g_n) {                                              \
    for (int64_t g0 = 0; g0 < g_n; g0 += 4) {                                                   \
        const int64_t gc = g_n - g0 < 4 ? g_n - g0 : 4;                                         \
        const float *pg = p + g0 * len;                                                         \
        float *ag = acc + g0 * 256;                                                             \
        if (gc == 4) NAME##_4(v, ts, n, pg, len, ag);                                           \
        else if (gc == 3) NAME##_3(v, ts, n, pg, len, ag);                                      \
        else if (gc == 2) NAME##_2(v, ts, n, pg, len, ag);                                      \
        else NAME##_1(v, ts, n, pg, len, ag);                                                   \
    }                                                                                           \
}
DEFINE_PV64_ALL(pv64f, float, LOAD16_F32)
DEFINE_PV64_ALL(pv64, uint16_t, LOAD16_BF16)
#define FAST_PV(T, d) (sizeof(T) == 2 && (d) == 64)
#define FAST_DOTS_F32(T, d) (sizeof(T) == 4 && (d) % 16 == 0 && bs == 16)
#define FAST_PV_F32(T, d) (sizeof(T) == 4 && (d) == 64)
#elif defined(__AVX2__) && defined(__FMA__)
/* float32 on AVX2 + FMA without AVX-512 (e.g. AMD EPYC before Zen 4): the same three passes on
   8 lanes. Left to the compiler, the scalar loops below ran at ~5 GB/s of KV on a Zen 3 (a
   horizontal sum per token and head, the p.v accumulators in memory). bf16 caches keep the
   scalar loops: there is no bf16 arithmetic on these CPUs. */
#include <immintrin.h>
/* 8 vectors -> one vector of their 8 horizontal sums (lane t = sum of v[t]) */
static inline __m256 sum8(const __m256 *v) {
    const __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
    const __m256 c = _mm256_hadd_ps(v[4], v[5]), e = _mm256_hadd_ps(v[6], v[7]);
    const __m256 ab = _mm256_hadd_ps(a, b), ce = _mm256_hadd_ps(c, e); /* [v0..3 | v0..3] halves */
    return _mm256_add_ps(_mm256_permute2f128_ps(ab, ce, 0x20), _mm256_permute2f128_ps(ab, ce, 0x31));
}
/* lanes [0, n) of 8 set (n <= 8): the mask of maskload / maskstore */
static inline __m256i first_lanes(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
static inline float softmax_numerators(float *sc, int64_t len) {
    const __m256 ninf = _mm256_set1_ps(-__builtin_inff());
    __m256 vm = ninf;
    for (int64_t t = 0; t < len; t += 8) {
        const __m256i k = first_lanes(len - t);
        vm = _mm256_max_ps(vm, _mm256_blendv_ps(ninf, _mm256_maskload_ps(sc + t, k), _mm256_castsi256_ps(k)));
    }
    vm = _mm256_max_ps(vm, _mm256_permute2f128_ps(vm, vm, 1));
    vm = _mm256_max_ps(vm, _mm256_permute_ps(vm, 0x4e));
    const __m256 m = _mm256_max_ps(vm, _mm256_permute_ps(vm, 0xb1)); /* the max in every lane */
    __m256 vs = _mm256_setzero_ps();
    for (int64_t t = 0; t < len; t += 8) {
        const __m256i k = first_lanes(len - t);
        const __m256 e = _mm256_and_ps(exp_neg8(_mm256_sub_ps(_mm256_maskload_ps(sc + t, k), m)), _mm256_castsi256_ps(k));
        _mm256_maskstore_ps(sc + t, k, e);
        vs = _mm256_add_ps(vs, e);
    }
    return hsum8(vs);
}
/* q.k for the n tokens of one block, 8 at a time, and g_n query heads: the 8 tokens' dot
   products as 8 vectors, summed across lanes at once: scores[g * len + t] = scale * (q_g . k_t).
   Lanes past n re-read the last token (in bounds) and are not stored. */
static inline void dots_f32(const float *q, const float *k, int64_t tok_stride, int64_t n,
                            int64_t g_n, int64_t d, float scale, float *scores, int64_t len) {
    const __m256 vscale = _mm256_set1_ps(scale);
    for (int64_t t0 = 0; t0 < n; t0 += 8) {
        const int64_t nt = n - t0 < 8 ? n - t0 : 8;
        const float *kr[8];
        for (int t = 0; t < 8; ++t) kr[t] = k + (t0 + (t < nt ? t : nt - 1)) * tok_stride;
        for (int64_t g = 0; g < g_n; ++g) {
            const float *qg = q + g * d;
            __m256 acc[8];
            for (int t = 0; t < 8; ++t) acc[t] = _mm256_setzero_ps();
            for (int64_t j = 0; j < d; j += 8) {
                const __m256 qv = _mm256_loadu_ps(qg + j);
                for (int t = 0; t < 8; ++t) acc[t] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[t] + j), acc[t]);
            }
            _mm256_maskstore_ps(scores + g * len + t0, first_lanes(nt), _mm256_mul_ps(sum8(acc), vscale));
        }
    }
}
/* p.v for head size 64: acc[g] (row stride MAX_D) += p[g][t] * v[t] over the n tokens of one
   block, half a head (32 values) and GC <= 2 query heads at a time: 4 GC accumulators, 4 values
   and a broadcast fit the 16 registers. */
#define DEFINE_PV64_AVX2(GC)                                                                    \
static inline void pv64f_##GC(const float *v, int64_t ts, int64_t n, const float *p,            \
                              int64_t len, float *acc) {                                        \
    for (int h = 0; h < 64; h += 32) {                                                          \
        __m256 a[GC][4];                                                                        \
        for (int g = 0; g < GC; ++g)                                                            \
            for (int j = 0; j < 4; ++j) a[g][j] = _mm256_loadu_ps(acc + g * 256 + h + 8 * j);   \
        for (int64_t t = 0; t < n; ++t) {                                                       \
            __m256 x[4];                                                                        \
            for (int j = 0; j < 4; ++j) x[j] = _mm256_loadu_ps(v + t * ts + h + 8 * j);         \
            for (int g = 0; g < GC; ++g) {                                                      \
                const __m256 pb = _mm256_broadcast_ss(p + g * len + t);                         \
                for (int j = 0; j < 4; ++j) a[g][j] = _mm256_fmadd_ps(pb, x[j], a[g][j]);       \
            }                                                                                   \
        }                                                                                       \
        for (int g = 0; g < GC; ++g)                                                            \
            for (int j = 0; j < 4; ++j) _mm256_storeu_ps(acc + g * 256 + h + 8 * j, a[g][j]);   \
    }                                                                                           \
}
DEFINE_PV64_AVX2(1) DEFINE_PV64_AVX2(2)
static inline void pv64f(const float *v, int64_t ts, int64_t n, const float *p, int64_t len,
                         float *acc, int64_t g_n) {
    for (int64_t g0 = 0; g0 < g_n; g0 += 2) {
        if (g_n - g0 >= 2) pv64f_2(v, ts, n, p + g0 * len, len, acc + g0 * 256);
        else pv64f_1(v, ts, n, p + g0 * len, len, acc + g0 * 256);
    }
}
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter" /* a stub, never called (FAST_PV says 0) */
static inline void pv64(const uint16_t *v, int64_t ts, int64_t n, const float *p, int64_t len,
                        float *acc, int64_t g_n) { }
#pragma GCC diagnostic pop
#define FAST_DOTS_F32(T, d) (sizeof(T) == 4 && (d) % 8 == 0)
#define FAST_PV_F32(T, d) (sizeof(T) == 4 && (d) == 64)
#define FAST_PV(T, d) 0
#define SPREAD_FETCH 1 /* a float32 decode row's fetches ahead spread over its q.k (dots_f32_spread) */
#else
/* stubs where the fast paths are not built: never called (FAST_* say 0), their parameters unused */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
static inline void dots_f32(const float *q, const float *k, int64_t tok_stride, int64_t n,
                            int64_t g_n, int64_t d, float scale, float *scores, int64_t len) { }
static inline void pv64f(const float *v, int64_t ts, int64_t n, const float *p, int64_t len,
                         float *acc, int64_t g_n) { }
static inline void pv64(const uint16_t *v, int64_t ts, int64_t n, const float *p, int64_t len,
                        float *acc, int64_t g_n) { }
#pragma GCC diagnostic pop
#define FAST_DOTS_F32(T, d) 0
#define FAST_PV_F32(T, d) 0
#define FAST_PV(T, d) 0
static inline float softmax_numerators(float *sc, int64_t len) {
    float m = sc[0];
    for (int64_t t = 1; t < len; ++t) m = sc[t] > m ? sc[t] : m;
    float sum = 0.0f;
    for (int64_t t = 0; t < len; ++t) { float e = exp_neg(sc[t] - m); sc[t] = e; sum += e; }
    return sum;
}
#endif

/* bf16 q.k with AVX512-BF16 (vdpbf16ps: exact bf16 products, fp32 sums), d a multiple of 32:
   scores[g * len + t] = scale * (q_g . k_t) for the n tokens of one block. */
#if HAVE_DPBF16
#define FMA_BF16(a, x, y) _mm512_dpbf16_ps(a, (__m512bh)_mm512_loadu_si512(x), (__m512bh)_mm512_loadu_si512(y))
DEFINE_DOTS(dots_bf16, uint16_t, 32, FMA_BF16)
#define FAST_DOTS(T, d) (sizeof(T) == 2 && (d) % 32 == 0 && bs == 16)

#else
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter" /* a stub, never called (FAST_DOTS says 0) */
static inline void dots_bf16(const uint16_t *q, const uint16_t *k, int64_t tok_stride, int64_t n,
                             int64_t g_n, int64_t d, float scale, float *scores, int64_t len) { }
#pragma GCC diagnostic pop
#define FAST_DOTS(T, d) 0
#endif

/* The q.k (and p.v) of one block for one token's G heads, out of line for a decode row: the
   unit's loops around them keep their registers, and the 16 accumulators and key pointers
   theirs (inlined into the unit that also serves the rows kernel, they spilled: bf16 decode
   attention ~1.1x slower on a Zen 5); the rows kernel inlines them (1.03-1.07x faster so).
   The same code either way. A head size of 64 or 128 gets loops of a known trip count. */
static __attribute__((noinline)) void dots_bf16_block(const uint16_t *q, const uint16_t *k, int64_t tok_stride,
        int64_t n, int64_t g_n, int64_t d, float scale, float *scores, int64_t len) {
    if (d == 64) dots_bf16(q, k, tok_stride, n, g_n, 64, scale, scores, len);
    else if (d == 128) dots_bf16(q, k, tok_stride, n, g_n, 128, scale, scores, len);
    else dots_bf16(q, k, tok_stride, n, g_n, d, scale, scores, len);
}
static __attribute__((noinline)) void dots_f32_block(const float *q, const float *k, int64_t tok_stride,
        int64_t n, int64_t g_n, int64_t d, float scale, float *scores, int64_t len) {
    if (d == 64) dots_f32(q, k, tok_stride, n, g_n, 64, scale, scores, len);
    else if (d == 128) dots_f32(q, k, tok_stride, n, g_n, 128, scale, scores, len);
    else dots_f32(q, k, tok_stride, n, g_n, d, scale, scores, len);
}

/* p.v of one block for one token's G heads (head size 64), out of line as above */
static __attribute__((noinline)) void pv64_block(const uint16_t *v, int64_t ts, int64_t n, const float *p,
                                                 int64_t len, float *acc, int64_t g_n) {
    pv64(v, ts, n, p, len, acc, g_n);
}
static __attribute__((noinline)) void pv64f_block(const float *v, int64_t ts, int64_t n, const float *p,
                                                  int64_t len, float *acc, int64_t g_n) {
    pv64f(v, ts, n, p, len, acc, g_n);
}

/* Fetch one head's slice of n token rows (a paged block) ahead of use: blocks sit at random
   places and a head's slice is a strided piece of each row, which the hardware prefetchers
   do not follow; at a few hundred cached tokens the loads from L3/DRAM were most of the time.
   Into L2 (prefetcht1), not L1: a block's worth of prefetcht0 at once held the L1's few miss
   buffers and the loop stalled behind them (decode attention on a Zen 4 1.4x faster in fp32,
   1.9x in bf16 with L2 and the prefetches spread a head at a time). */
static inline void prefetch_rows(const void *p, int64_t n, int64_t stride_bytes, int64_t row_bytes) {
    const char *c = (const char *)p;
    for (int64_t t = 0; t < n; ++t)
        for (int64_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(c + t * stride_bytes + b, 0, 2);
}

#ifndef SPREAD_FETCH
#define SPREAD_FETCH 0
#endif
/* A float32 decode row's q.k of one block (n tokens of keys k, g_n query heads) in calls of 8
   tokens and one query head, each after its share of the fetches ahead: the next block's keys
   (n_next tokens at k_next) and this block's values v. On an AVX2-only Zen 1 the fetches a head
   at a time bought nothing (attention over a cold cache took the same time without them);
   spread, they took one sequence of 290 cached tokens from ~93 to ~80 us a layer and 19
   sequences (`inferq bench decode-attention`) from 1.43 to 1.22 ms. Only the AVX2 build spreads
   them (the AVX-512 ones were not measured so). The same arithmetic as one call: dots_f32 sums
   each group of 8 tokens and each query head on its own. */
static inline void dots_f32_spread(const float *q, const float *k, const float *k_next, int64_t n_next,
                                   const float *v, int64_t tok_stride, int64_t n, int64_t g_n, int64_t d,
                                   float scale, float *scores, int64_t len) {
    const int64_t ps = tok_stride * (int64_t)sizeof(float), pr = d * (int64_t)sizeof(float);
    for (int64_t u = 0; u < n; u += 8) {
        const int64_t m = n - u < 8 ? n - u : 8, mk = n_next > u ? (n_next - u < 8 ? n_next - u : 8) : 0;
        for (int64_t g = 0; g < g_n; ++g) {
            const int64_t k0 = mk * g / g_n, k1 = mk * (g + 1) / g_n, v0 = m * g / g_n, v1 = m * (g + 1) / g_n;
            prefetch_rows(k_next + (u + k0) * tok_stride, k1 - k0, ps, pr);
            prefetch_rows(v + (u + v0) * tok_stride, v1 - v0, ps, pr);
            dots_f32_block(q + g * d, k + u * tok_stride, tok_stride, m, 1, d, scale, scores + g * len + u, len);
        }
    }
}

#define MAX_D 256
#define MAX_G 16
#define MAX_HEADS 256 /* query heads (hq) */
#define MAX_TILE 16 /* query tokens of one sequence per unit of the rows kernel (paged_rows_*) */

/* One unit of work: the kv heads [h0, h1) of one sequence, G query heads each, for nr consecutive
   query tokens of it (a decode row: nr = 1), token r seeing len0 + r cached keys. A unit walks
   the sequence's blocks once per pass and, in each block, its heads one after another: with every
   kv head in one unit (many sequences per thread) that reads each block's token rows front to
   back, 12 KB contiguous on SmolLM2, where one head at a time read a strided third of every row
   and came back twice for the rest (the KV reads ran at half the rate one core streams); the
   tokens of a unit read each block of keys and values from L1 one after another.
   Batch invariance: a (token, query head) row's arithmetic is a function of its q, its keys and
   values alone, never of the unit, the other rows, nr or the thread split: its scores
   (dots_*: each a fixed tree of 16 lane sums), softmax over exactly its len0 + r keys
   (softmax_numerators), p.v in key order (pv64*). So a prompt token's attention is the same bits
   in a prompt chunk of any length, after any context, and as a decode row. The fast paths are
   intrinsics in a fixed order (no sum the compiler may reorder under -fassociative-math: the
   adds of sum16 and of the softmax's sums are between shuffles or masked builtins), the
   scalar ones the same loops in both copies (a decode row's, nr = 1, and the rows kernel's);
   tests/kernels/test_cpu_batch_invariance.py checks them bit for bit in the native, AVX2-only
   and scalar builds, and tests/engine/test_batch_invariance.py the engine.
   Scratch per thread: nr x hq' x lmax scores (hq' = the unit's query heads, lmax = len0 + nr - 1),
   then nr x hq' rows of MAX_D accumulators.
   The unit is its own always-inline function, called with a literal head size: gcc outlines an
   OpenMP loop's body before it inlines, so a head size fixed outside the loop reached the body
   as a variable and its loops ran unrolled by nothing. */
#define DEFINE_KERNEL(NAME, T, LOAD, STORE)                                                   \
static inline __attribute__((always_inline)) void NAME##_unit(                                 \
         const T *qrow, const int64_t q_tok_stride, T *orow, const int64_t out_tok_stride,   \
         const int64_t nr, const T *kc, const T *vc, const int32_t *table,                   \
         const int64_t len0, const int64_t h0, const int64_t h1, const int64_t hkv,          \
         const int64_t g_n, const int64_t g0, const int64_t gc, const int64_t d, const int64_t bs, \
         const float scale, float *scores, const int32_t *next_table, const int64_t next_len) { \
    float qf[MAX_G][MAX_D], kf[MAX_D];                                                        \
    const int64_t tok_stride = hkv * d; /* cache layout [blocks, bs, hkv, d] */               \
    const int64_t lmax = len0 + nr - 1, hgn = (h1 - h0) * gc;                                 \
    const int64_t rs = hgn * lmax; /* scores per token: [head h - h0][g][lmax] */             \
    float *accs = scores + nr * rs; /* [token][head h - h0][g][MAX_D] */                      \
    /* pass 1: scores; the next block's keys and this block's values fetched ahead */         \
    for (int64_t t0 = 0; t0 < lmax; t0 += bs) {                                               \
        const int64_t n = lmax - t0 < bs ? lmax - t0 : bs;                                    \
        const int64_t blk = ((int64_t)table[t0 / bs] * bs) * tok_stride;                      \
        const int64_t n2 = lmax - t0 - bs < bs ? lmax - t0 - bs : bs; /* tokens of the next block */ \
        const int64_t next = n2 > 0 ? ((int64_t)table[t0 / bs + 1] * bs) * tok_stride : 0;   \
        for (int64_t h = h0; h < h1; ++h) {                                                   \
            const int64_t base = blk + h * d;                                                 \
            /* fetched a head at a time, between the heads' dots (or spread over them) */   \
            const int spread = SPREAD_FETCH && FAST_DOTS_F32(T, d) && nr == 1;                \
            if (n2 > 0 && !spread) prefetch_rows(kc + next + h * d, n2, tok_stride * (int64_t)sizeof(T), d * (int64_t)sizeof(T)); \
            if (!spread) prefetch_rows(vc + base, n, tok_stride * (int64_t)sizeof(T), d * (int64_t)sizeof(T)); \
            for (int64_t r = t0 < len0 ? 0 : t0 - len0 + 1; r < nr; ++r) { /* tokens seeing t0 */ \
                const int64_t nn = len0 + r - t0 < bs ? len0 + r - t0 : bs;                   \
                const T *qh0 = qrow + r * q_tok_stride + (h * g_n + g0) * d;                  \
                float *sc = scores + r * rs + (h - h0) * gc * lmax;                           \
                /* a decode row calls the block's q.k out of line (*_block, see there) */     \
                if (FAST_DOTS(T, d) && nr == 1) {                                             \
                    dots_bf16_block((const uint16_t *)qh0, (const uint16_t *)(kc + base), tok_stride, nn, gc, d, \
                                    scale, sc + t0, lmax);                                    \
                } else if (FAST_DOTS(T, d)) {                                                 \
                    dots_bf16((const uint16_t *)qh0, (const uint16_t *)(kc + base), tok_stride, nn, gc, d, \
                              scale, sc + t0, lmax);                                          \
                } else if (spread) {                                                          \
                    dots_f32_spread((const float *)qh0, (const float *)(kc + base), (const float *)(kc + next + h * d), \
                                    n2, (const float *)(vc + base), tok_stride, nn, gc, d, scale, sc + t0, lmax); \
                } else if (FAST_DOTS_F32(T, d) && nr == 1) {                                  \
                    dots_f32_block((const float *)qh0, (const float *)(kc + base), tok_stride, nn, gc, d, \
                                   scale, sc + t0, lmax);                                     \
                } else if (FAST_DOTS_F32(T, d)) {                                             \
                    dots_f32((const float *)qh0, (const float *)(kc + base), tok_stride, nn, gc, d, \
                             scale, sc + t0, lmax);                                           \
                } else {                                                                      \
                    for (int64_t g = 0; g < gc; ++g)                                          \
                        for (int64_t i = 0; i < d; ++i) qf[g][i] = LOAD(qh0[g * d + i]) * scale; \
                    for (int64_t t = 0; t < nn; ++t) {                                        \
                        const T *kr = kc + base + t * tok_stride;                             \
                        for (int64_t i = 0; i < d; ++i) kf[i] = LOAD(kr[i]);                  \
                        for (int64_t g = 0; g < gc; ++g) {                                    \
                            float dot = 0.0f;                                                 \
                            for (int64_t i = 0; i < d; ++i) dot += qf[g][i] * kf[i];          \
                            sc[g * lmax + t0 + t] = dot;                                      \
                        }                                                                     \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    /* pass 2: softmax numerators and their sums */                                           \
    float inv[MAX_TILE * MAX_HEADS];                                                          \
    for (int64_t r = 0; r < nr; ++r)                                                          \
        for (int64_t hg = 0; hg < hgn; ++hg) {                                                \
            inv[r * hgn + hg] = 1.0f / softmax_numerators(scores + r * rs + hg * lmax, len0 + r); \
            for (int64_t i = 0; i < d; ++i) accs[(r * hgn + hg) * MAX_D + i] = 0.0f;          \
        }                                                                                     \
    /* pass 3: acc[g] += p[g][t] * v[t]; the next block's values fetched ahead */           \
    for (int64_t t0 = 0; t0 < lmax; t0 += bs) {                                               \
        const int64_t n = lmax - t0 < bs ? lmax - t0 : bs;                                    \
        const int64_t blk = ((int64_t)table[t0 / bs] * bs) * tok_stride;                      \
        const int64_t n2 = lmax - t0 - bs < bs ? lmax - t0 - bs : bs;                         \
        const int64_t next = n2 > 0 ? ((int64_t)table[t0 / bs + 1] * bs) * tok_stride : 0;   \
        for (int64_t h = h0; h < h1; ++h) {                                                   \
            const int64_t base = blk + h * d;                                                 \
            if (n2 > 0) prefetch_rows(vc + next + h * d, n2, tok_stride * (int64_t)sizeof(T), d * (int64_t)sizeof(T)); \
            if (t0 < next_len) /* the next unit's keys, while this pass reads from L2 */       \
                prefetch_rows(kc + ((int64_t)next_table[t0 / bs] * bs) * tok_stride + h * d,  \
                              next_len - t0 < bs ? next_len - t0 : bs, tok_stride * (int64_t)sizeof(T), d * (int64_t)sizeof(T)); \
            /* bf16 values for several tokens: widened once (exact), then the fp32 p.v, whose */ \
            /* products and sums are pv64's, in its order: the same bits */                  \
            float vw[FAST_PV(T, d) ? MAX_TILE : 1][64];                                       \
            const int widen = FAST_PV(T, d) && nr > 1 && bs <= MAX_TILE;                      \
            if (widen)                                                                        \
                for (int64_t t = 0; t < n; ++t)                                               \
                    for (int64_t i = 0; i < 64; ++i) vw[t][i] = LOAD(vc[base + t * tok_stride + i]); \
            for (int64_t r = t0 < len0 ? 0 : t0 - len0 + 1; r < nr; ++r) {                   \
                const int64_t nn = len0 + r - t0 < bs ? len0 + r - t0 : bs;                   \
                const float *p = scores + r * rs + (h - h0) * gc * lmax;                      \
                float *acc = accs + (r * hgn + (h - h0) * gc) * MAX_D;                        \
                if (widen) {                                                                  \
                    pv64f(&vw[0][0], 64, nn, p + t0, lmax, acc, gc);                          \
                } else if (FAST_PV(T, d) && nr == 1) {                                        \
                    pv64_block((const uint16_t *)(vc + base), tok_stride, nn, p + t0, lmax, acc, gc);  \
                } else if (FAST_PV(T, d)) {                                                   \
                    pv64((const uint16_t *)(vc + base), tok_stride, nn, p + t0, lmax, acc, gc);  \
                } else if (FAST_PV_F32(T, d) && nr == 1) {                                    \
                    pv64f_block((const float *)(vc + base), tok_stride, nn, p + t0, lmax, acc, gc);  \
                } else if (FAST_PV_F32(T, d)) {                                               \
                    pv64f((const float *)(vc + base), tok_stride, nn, p + t0, lmax, acc, gc);  \
                } else {                                                                      \
                    for (int64_t t = 0; t < nn; ++t) {                                        \
                        const T *vr = vc + base + t * tok_stride;                             \
                        for (int64_t i = 0; i < d; ++i) kf[i] = LOAD(vr[i]);                  \
                        for (int64_t g = 0; g < gc; ++g) {                                    \
                            const float pg = p[g * lmax + t0 + t];                            \
                            for (int64_t i = 0; i < d; ++i) acc[g * MAX_D + i] += pg * kf[i]; \
                        }                                                                     \
                    }                                                                         \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }                                                                                         \
    for (int64_t r = 0; r < nr; ++r)                                                          \
        for (int64_t hg = 0; hg < hgn; ++hg) {                                                \
            T *oh = orow + r * out_tok_stride + ((h0 + hg / gc) * g_n + g0 + hg % gc) * d;    \
            const float *a = accs + (r * hgn + hg) * MAX_D;                                   \
            for (int64_t i = 0; i < d; ++i) oh[i] = STORE(a[i] * inv[r * hgn + hg]);          \
        }                                                                                     \
}                                                                                             \
/* The unit, compiled per head size (64 and 128: loops of a known trip count, fully          \
   vectorised) and shared by the decode and the rows kernel. */                             \
DEFINE_UNIT_D(NAME, T, 64) DEFINE_UNIT_D(NAME, T, 128) DEFINE_UNIT_D(NAME, T, 0)              \
static inline void NAME##_run_unit(const T *qrow, int64_t q_tok_stride, T *orow, int64_t out_tok_stride, \
        int64_t nr, const T *kc, const T *vc, const int32_t *table, int64_t len0, int64_t h0, int64_t h1, \
        int64_t hkv, int64_t g_n, int64_t g0, int64_t gc, int64_t d, int64_t bs, float scale, float *scores, \
        const int32_t *next_table, int64_t next_len) {                                        \
    if (d == 64) NAME##_unit_d64(qrow, q_tok_stride, orow, out_tok_stride, nr, kc, vc, table, len0, h0, h1, hkv, \
                                 g_n, g0, gc, 64, bs, scale, scores, next_table, next_len);   \
    else if (d == 128) NAME##_unit_d128(qrow, q_tok_stride, orow, out_tok_stride, nr, kc, vc, table, len0, h0, h1, \
                                        hkv, g_n, g0, gc, 128, bs, scale, scores, next_table, next_len); \
    else NAME##_unit_d0(qrow, q_tok_stride, orow, out_tok_stride, nr, kc, vc, table, len0, h0, h1, hkv, \
                        g_n, g0, gc, d, bs, scale, scores, next_table, next_len);             \
}                                                                                             \
int NAME(const T *q, int64_t q_tok_stride, T *out, int64_t out_tok_stride,                     \
         const T *kc, const T *vc, const int32_t *tables, int64_t table_stride,              \
         const int64_t *q_rows, const int64_t *seq_idx, const int64_t *lens, int64_t nseq,   \
         int64_t hq, int64_t hkv, int64_t d, int64_t bs, float scale, float *scratch0) {     \
    const int64_t g_n = hq / hkv;                                                             \
    if (d > MAX_D || g_n > MAX_G || hq > MAX_HEADS || hq % hkv) return -1;                   \
    int64_t max_len = 0;                                                                      \
    for (int64_t s = 0; s < nseq; ++s) max_len = lens[s] > max_len ? lens[s] : max_len;      \
    const int64_t sstride = hq * (max_len + MAX_D);                                           \
    if (nseq >= 4 * kernel_nthreads || kernel_nthreads == 1) {                                \
        /* A whole sequence a unit, units dealt round robin (static, 1): a thread's next unit is \
           unit + threads, and while pass 3 reads this unit's values from L2 (fetched during     \
           pass 1) the memory bus would sit idle, so it fetches the next unit's keys then. */    \
        SHARED_EACH(s, nseq,                                                                  \
            const int64_t ns = s + kernel_nthreads < nseq ? s + kernel_nthreads : -1;         \
            const int32_t *next_table = ns < 0 ? tables : tables + seq_idx[ns] * table_stride; \
            const int64_t next_len = ns < 0 ? 0 : lens[ns];                                   \
            NAME##_run_unit(q + q_rows[s] * q_tok_stride, q_tok_stride, out + q_rows[s] * out_tok_stride, \
                            out_tok_stride, 1, kc, vc, tables + seq_idx[s] * table_stride, lens[s], 0, hkv, \
                            hkv, g_n, 0, g_n, d, bs, scale, scratch0 + tid * sstride, next_table, next_len); \
        );                                                                                    \
        return 0;                                                                             \
    }                                                                                         \
    /* Too few sequences for the threads: each thread a contiguous share of the (sequence, query \
       head) pairs, run as one unit per kv head it touches (its query heads of that group). Whole \
       kv heads a unit left threads idle: SmolLM2's 3 kv heads of one sequence went 2:1 over 2 \
       threads. Each query head's sums are the same whatever else its unit holds. */          \
    SHARED(nseq * hq, 1,                                                                      \
        for (int64_t f = lo; f < hi;) {                                                       \
            const int64_t s = f / hq, h = f % hq / g_n, g0 = f % g_n;                         \
            const int64_t gc = g_n - g0 < hi - f ? g_n - g0 : hi - f;                         \
            NAME##_run_unit(q + q_rows[s] * q_tok_stride, q_tok_stride, out + q_rows[s] * out_tok_stride, \
                            out_tok_stride, 1, kc, vc, tables + seq_idx[s] * table_stride, lens[s], h, h + 1, \
                            hkv, g_n, g0, gc, d, bs, scale, scratch0 + tid * sstride, tables, 0); \
            f += gc;                                                                          \
        });                                                                                   \
    return 0;                                                                                 \
}                                                                                             \
/* Prefill chunks with the decode kernel's arithmetic (the unit above): chunk c is q_lens[c]     \
   query rows from row q_start[c], at positions ctx_lens[c] .. of sequence seq_idx[c], whose     \
   keys are all in the cache (the chunk's own written first). Units: (chunk, tile of `tile`      \
   tokens, kv head), the tokens of a tile reading each block of keys and values from L1 one     \
   after another; every row gets the same bits as the decode kernel gives it (a decode row, or  \
   the same token in a chunk cut anywhere else). Scratch per thread: tile x G x (longest        \
   sequence + MAX_D) floats. Units are taken longest first (dynamic): later tiles see more keys.\
   One layer of SmolLM2 (9/3 heads of 64), bf16, 1 thread, on a Zen 5: 1.0-1.1x the time of     \
   paged_prefill.c's online-softmax tiles up to 256 tokens, 1.2-1.3x at 1,024-2,048 (the        \
   decode arithmetic's horizontal sums of q.k), 0.7x the decode kernel row by row. */           \
int NAME##_rows(const T *q, int64_t q_tok_stride, T *out, int64_t out_tok_stride,              \
                const T *kc, const T *vc, const int32_t *tables, int64_t table_stride,       \
                const int64_t *q_start, const int64_t *seq_idx, const int64_t *q_lens,       \
                const int64_t *ctx_lens, int64_t nchunks, int64_t hq, int64_t hkv, int64_t d, \
                int64_t bs, float scale, float *scratch0, int64_t tile) {                    \
    const int64_t g_n = hq / hkv;                                                             \
    if (d > MAX_D || g_n > MAX_G || hq > MAX_HEADS || hq % hkv || tile < 1 || tile > MAX_TILE) return -1; \
    int64_t max_len = 0;                                                                      \
    for (int64_t c = 0; c < nchunks; ++c)                                                     \
        max_len = ctx_lens[c] + q_lens[c] > max_len ? ctx_lens[c] + q_lens[c] : max_len;      \
    const int64_t sstride = tile * g_n * (max_len + MAX_D);                                   \
    const int64_t hpu = 1, per_tile = hkv; /* one kv head a unit: a tile's scores stay in L2 */ \
    int64_t *first = malloc((size_t)(nchunks + 1) * sizeof(int64_t)); /* first unit of chunk c */ \
    if (!first) return -2;                                                                    \
    first[0] = 0;                                                                             \
    for (int64_t c = 0; c < nchunks; ++c) first[c + 1] = first[c] + (q_lens[c] + tile - 1) / tile * per_tile; \
    const int64_t units = first[nchunks];                                                     \
    OMP(omp parallel for schedule(dynamic, 1) num_threads(kernel_nthreads))                  \
    for (int64_t w = 0; w < units; ++w) {                                                     \
        const int64_t u = units - 1 - w; /* a chunk's last tiles (the most keys) first */     \
        int64_t lo = 0, hi = nchunks - 1; /* the chunk: last c with first[c] <= u */          \
        while (lo < hi) { const int64_t mid = (lo + hi + 1) / 2; if (first[mid] <= u) lo = mid; else hi = mid - 1; } \
        const int64_t c = lo, j = (u - first[c]) / per_tile, h0 = (u - first[c]) % per_tile * hpu; \
        const int64_t r0 = j * tile, nr = q_lens[c] - r0 < tile ? q_lens[c] - r0 : tile;     \
        const int64_t row = q_start[c] + r0;                                                  \
        NAME##_run_unit(q + row * q_tok_stride, q_tok_stride, out + row * out_tok_stride, out_tok_stride, nr, \
                        kc, vc, tables + seq_idx[c] * table_stride, ctx_lens[c] + r0 + 1, h0, h0 + hpu, hkv, \
                        g_n, 0, g_n, d, bs, scale, scratch0 + thread_id() * sstride, tables, 0); \
    }                                                                                         \
    free(first);                                                                              \
    return 0;                                                                                 \
}
#define DEFINE_UNIT_D(NAME, T, D)                                                             \
static __attribute__((noinline)) void NAME##_unit_d##D(const T *qrow, int64_t q_tok_stride, T *orow, \
        int64_t out_tok_stride, int64_t nr, const T *kc, const T *vc, const int32_t *table, int64_t len0, \
        int64_t h0, int64_t h1, int64_t hkv, int64_t g_n, int64_t g0, int64_t gc, int64_t d, int64_t bs, \
        float scale, float *scores, const int32_t *next_table, int64_t next_len) {            \
    if (nr == 1) /* a decode row: the token loops gone (decode attention 1.05-1.1x faster) */ \
        NAME##_unit(qrow, q_tok_stride, orow, out_tok_stride, 1, kc, vc, table, len0, h0, h1, hkv, g_n, \
                    g0, gc, D ? D : d, bs, scale, scores, next_table, next_len);              \
    else                                                                                      \
        NAME##_unit(qrow, q_tok_stride, orow, out_tok_stride, nr, kc, vc, table, len0, h0, h1, hkv, g_n, \
                    g0, gc, D ? D : d, bs, scale, scores, next_table, next_len);              \
}

#define ID(x) (x)
DEFINE_KERNEL(paged_decode_f32, float, ID, ID)
DEFINE_KERNEL(paged_decode_bf16, uint16_t, bf2f, f2bf)


/* Rotary embedding with torch's roundings (bit-identical to llama._rotate):
   out = (swap_halves(x) * sin) + (x * cos), each product and the sum rounded to T.
   q/k: rows of heads of size d (heads contiguous); cos/sin: [rows, d] contiguous. */
#define DEFINE_ROTARY(NAME, T, LOAD, STORE)                                                    \
static inline __attribute__((always_inline)) void NAME##_heads(                                 \
        const T *x, T *o, int64_t nh, const int64_t d, const T *c, const T *s) {                \
    const int64_t half = d / 2;                                                                 \
    for (int64_t h = 0; h < nh; ++h) {                                                          \
        const T *xh = x + h * d;                                                                \
        T *oh = o + h * d;                                                                      \
        for (int64_t i = 0; i < half; ++i) { /* two loops: each half vectorises */               \
            const float a = LOAD(STORE(LOAD(xh[i + half]) * LOAD(s[i])));                       \
            const float b = LOAD(STORE(LOAD(xh[i]) * LOAD(c[i])));                              \
            oh[i] = STORE(a + b);                                                               \
        }                                                                                       \
        for (int64_t i = half; i < d; ++i) {                                                    \
            const float a = LOAD(STORE(LOAD(xh[i - half]) * LOAD(s[i])));                       \
            const float b = LOAD(STORE(LOAD(xh[i]) * LOAD(c[i])));                              \
            oh[i] = STORE(a + b);                                                               \
        }                                                                                       \
    }                                                                                           \
}                                                                                               \
int NAME(const T *q, int64_t q_stride, int64_t hq, const T *k, int64_t k_stride, int64_t hk,    \
         int64_t d, const T *cos, const T *sin, T *qo, T *ko, int64_t rows) {                   \
    SHARED(rows, rows > 1, for (int64_t r = lo; r < hi; ++r) {                                 \
        const T *c = cos + r * d, *s = sin + r * d;                                             \
        if (d == 64) {                                                                          \
            NAME##_heads(q + r * q_stride, qo + r * hq * 64, hq, 64, c, s);                     \
            NAME##_heads(k + r * k_stride, ko + r * hk * 64, hk, 64, c, s);                     \
        } else {                                                                                \
            NAME##_heads(q + r * q_stride, qo + r * hq * d, hq, d, c, s);                       \
            NAME##_heads(k + r * k_stride, ko + r * hk * d, hk, d, c, s);                       \
        }                                                                                       \
    });                                                                                         \
    return 0;                                                                                   \
}
DEFINE_ROTARY(rotary_f32, float, ID, ID)
DEFINE_ROTARY(rotary_bf16, uint16_t, bf2f, f2bf)

/* SiLU-and-mul of fused gate|up rows (gate = row[0:n], up = row[n:2n], row stride ld):
   out = T(T(silu(gate)) * up), torch's two roundings (F.silu(gate).mul_(up)). silu(x) =
   x / (1 + e^-x), written with e = exp(-|x|) <= 1 so it cannot overflow; the same result
   as torch's within an ulp or two (its exp and ours differ in the last bits). With AVX-512
   (BW, VL) each row is vec_math.h's silu_mul_row, the function the gate/up matmul applies
   when it fuses the two (linear_avx512.c): the same bits either way. */
#define DEFINE_SILU_MUL(NAME, T, LOAD, STORE, ROW)                                             \
int NAME(const T *gu, int64_t ld, int64_t n, T *out, int64_t rows) {                            \
    SHARED(rows, rows > 1, for (int64_t r = lo; r < hi; ++r) {                                 \
        const T *g = gu + r * ld, *u = g + n;                                                   \
        T *o = out + r * n;                                                                     \
        if (HAVE_SILU_ROWS) { ROW(g, u, o, n); continue; }                                      \
        for (int64_t i = 0; i < n; ++i) {                                                       \
            const float x = LOAD(g[i]);                                                         \
            const float e = exp_neg(-__builtin_fabsf(x));                                       \
            const float s = (x >= 0.0f ? x : x * e) / (1.0f + e);                               \
            o[i] = STORE(LOAD(STORE(s)) * LOAD(u[i]));                                          \
        }                                                                                       \
    });                                                                                         \
    return 0;                                                                                   \
}
#if !HAVE_SILU_ROWS /* never called (HAVE_SILU_ROWS is 0): for the compiler only */
#define silu_mul_row_f32(g, u, o, n) ((void)0)
#define silu_mul_row_bf16(g, u, o, n) ((void)0)
#endif
DEFINE_SILU_MUL(silu_mul_f32, float, ID, ID, silu_mul_row_f32)
DEFINE_SILU_MUL(silu_mul_bf16, uint16_t, bf2f, f2bf, silu_mul_row_bf16)

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

/* float32: residual += hidden (stored back; hidden may be NULL), out = w * (r * 1/sqrt(mean(r^2)
   + eps)), HF's two products; only the order of the sum of squares differs from torch's. */
static inline __attribute__((always_inline)) void add_rms_norm_row_f32(
        float *res, const float *hid, const float *w, float *out, const int64_t h, float eps) {
    float ss = 0.0f;
    if (hid) for (int64_t i = 0; i < h; ++i) res[i] = res[i] + hid[i];
    for (int64_t i = 0; i < h; ++i) ss += res[i] * res[i];
    const float inv = 1.0f / __builtin_sqrtf(ss / (float)h + eps);
    for (int64_t i = 0; i < h; ++i) out[i] = w[i] * (res[i] * inv);
}

int add_rms_norm_f32(float *res, const float *hid, const float *w, float *out, int64_t rows, int64_t h, float eps) {
    SHARED(rows, rows > 1, for (int64_t r = lo; r < hi; ++r) {
        if (h == 576) add_rms_norm_row_f32(res + r * h, hid ? hid + r * h : 0, w, out + r * h, 576, eps);
        else add_rms_norm_row_f32(res + r * h, hid ? hid + r * h : 0, w, out + r * h, h, eps);
    });
    return 0;
}

int add_rms_norm_bf16(uint16_t *res, const uint16_t *hid, const uint16_t *w, uint16_t *out,
                      int64_t rows, int64_t h, float eps) {
    if (h > 8192) return -1;
    SHARED(rows, rows > 1, for (int64_t r = lo; r < hi; ++r) {
        float rf[8192];
        if (h == 576) add_rms_norm_row(res + r * h, hid ? hid + r * h : 0, w, out + r * h, 576, eps, rf);
        else add_rms_norm_row(res + r * h, hid ? hid + r * h : 0, w, out + r * h, h, eps, rf);
    });
    return 0;
}

/* The kernels of this file that share their work in a step program's team (threads.h) */
const void *const team_kernels[] = {(const void *)paged_decode_f32, (const void *)paged_decode_bf16, (const void *)rotary_f32, (const void *)rotary_bf16, (const void *)silu_mul_f32, (const void *)silu_mul_bf16, (const void *)add_rms_norm_f32, (const void *)add_rms_norm_bf16, 0};
