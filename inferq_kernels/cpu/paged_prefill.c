/* Tiled causal prefill attention straight over the paged KV cache (float32, bfloat16).

   A step's prefill chunks: chunk s has q_lens[s] query rows starting at row q_start[s] of q/out,
   at positions ctx_lens[s] .. ctx_lens[s] + q_lens[s] - 1 of sequence seq_idx[s], whose keys
   0 .. ctx + q_len - 1 are all in the cache already (the backend writes the chunk's own k/v
   first) and are read through its block table; layout [blocks, bs, hkv, d].

   Work item = (chunk, kv head, tile of LANES rows), a row being one (query token, query head)
   of the G heads that share the kv head (rows token-major: r = q * G + g). The tile keeps its
   rows in vector lanes, transposed: QT[i] = the rows' element i (times scale), OT[i] the same for
   the output, so that every step is a broadcast-FMA over whole vectors:
     S[t]   = sum_i QT[i] * k_t[i]           LANES rows x KT keys in KT accumulators
     causal mask (key pos > row pos -> -inf), only where a key chunk crosses the tile's first row
     m' = max(m, max_t S[t]); a = exp(m - m'); P[t] = exp(S[t] - m'); l = l * a + sum_t P[t]
     OT[i]  = OT[i] * a + sum_t v_t[i] * P[t]
   and out[row][i] = OT[i][row] / l[row] at the end (online softmax, one pass over the keys).
   Keys are walked in KT-key chunks, copied (bf16: widened) to a small fp32 buffer first, so any
   block size works and keys past the end are exact zeros; with AVX512-BF16 the bf16 q.k runs
   on vdpbf16ps straight from the cache instead (K is not copied, V still is).

   Vectors are GCC vector extensions of LANES floats: 16 (one zmm) where AVX-512 is on, else 8
   (one ymm with AVX2; other ISAs get what the compiler makes of them); built with
   -ffp-contract=fast so a * b + c is one FMA. No -fassociative-math: every sum has a fixed
   order. OpenMP splits work items, never a sum: bit-identical at any thread count. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "threads.h"

#if defined(__AVX512F__)
#define LANES 16
#define DC 8 /* output elements per PV step: DC accumulators + KT probabilities in registers */
#else
#define LANES 8
#define DC 4
#endif
#define KT LANES /* keys per chunk */
#define MAX_D 256

typedef float vf __attribute__((vector_size(LANES * 4)));
typedef int32_t vi __attribute__((vector_size(LANES * 4)));

typedef union { uint32_t u; float f; } fbits;
static inline float bf2f(uint16_t x) { fbits v; v.u = ((uint32_t)x) << 16; return v.f; }
static inline uint16_t f2bf(float f) {
    fbits v; v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u); /* NaN stays NaN */
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}

static inline vf vsplat(float x) { return (vf){} + x; }
static inline vf vsel(vi m, vf a, vf b) { return (vf)((m & (vi)a) | (~m & (vi)b)); }
static inline vf vmax(vf a, vf b) { return vsel(a > b, a, b); }

/* exp(x) for x <= 0 (or -inf): Cody-Waite reduction by ln 2 and a degree-7 Taylor polynomial,
   the same constants as paged_decode.c's exp_neg (relative error < 1e-7 on [-87, 0]). */
static inline vf vexp_neg(vf x) {
    x = vmax(x, vsplat(-87.0f));
    const vi ni = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, vi); /* trunc of y - .5 = round, y <= 0 */
    const vf n = __builtin_convertvector(ni, vf);
    vf r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    vf p = vsplat(1.0f / 5040.0f);
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    return (vf)((vi)p + (ni << 23));
}

/* bf16 q.k with AVX512-BF16 (vdpbf16ps: exact bf16 products, fp32 sums, two elements a step):
   S[t] += sum over element pairs of QP[pair] (the lanes' q pairs) . kp[t][pair] (broadcast). */
#if defined(__AVX512BF16__) && LANES == 16
#include <immintrin.h>
#define HAVE_DPBF16 1
typedef uint32_t u32_alias __attribute__((may_alias));
static inline __attribute__((always_inline)) void qk_dpbf16(vf *S, const uint32_t (*QP)[LANES],
                                                            const u32_alias *const *kp, int64_t d2) {
    __m512 acc[KT];
    for (int t = 0; t < KT; ++t) acc[t] = (__m512)S[t];
    for (int64_t i = 0; i < d2; ++i) {
        const __m512bh qv = (__m512bh)_mm512_loadu_si512(QP[i]);
        _Pragma("GCC unroll 16") for (int t = 0; t < KT; ++t)
            acc[t] = _mm512_dpbf16_ps(acc[t], qv, (__m512bh)_mm512_set1_epi32((int)kp[t][i]));
    }
    for (int t = 0; t < KT; ++t) S[t] = (vf)acc[t];
}
#else
#define HAVE_DPBF16 0
typedef uint32_t u32_alias __attribute__((may_alias));
static inline void qk_dpbf16(vf *S, const uint32_t (*QP)[LANES], const u32_alias *const *kp, int64_t d2) {
    (void)S; (void)QP; (void)kp; (void)d2;
}
#endif
static const uint32_t zero_row[MAX_D / 2];

static inline float hmax(vf v) { float m = v[0]; for (int l = 1; l < LANES; ++l) m = v[l] > m ? v[l] : m; return m; }

/* One work item. */
/* DP: 1 = q.k on vdpbf16ps (bf16 where the CPU has it), else in fp32 after widening */
#define DEFINE_TILE(NAME, T, LOAD, STORE, DP)                                                     \
static inline __attribute__((always_inline)) void NAME##_tile(                                   \
        const T *q, int64_t q_stride, T *out, int64_t out_stride, const T *kc, const T *vc,     \
        const int32_t *table, int64_t ctx, int64_t q_len, int64_t r0, int64_t h, int64_t g_n,   \
        const int64_t d, int64_t bs, int64_t tok_stride, float scale, const int dp) {                         \
    vf QT[MAX_D], OT[MAX_D];                                                                     \
    float kf[KT][MAX_D], vv[KT][MAX_D];                                                          \
    uint32_t QP[DP ? MAX_D / 2 : 1][LANES]; /* DP: the lanes' q as bf16 pairs, unscaled */       \
    const u32_alias *kp[KT]; /* DP: each key's row in the cache (zero_row past the keys) */      \
    const int64_t rows = q_len * g_n - r0 < LANES ? q_len * g_n - r0 : LANES;                    \
    vi pos; /* each lane's query position (unused lanes repeat the last row) */                  \
    for (int l = 0; l < LANES; ++l) {                                                            \
        const int64_t r = r0 + (l < rows ? l : rows - 1);                                        \
        pos[l] = (int32_t)(ctx + r / g_n);                                                       \
    }                                                                                            \
    for (int64_t i = 0; i < d; ++i) QT[i] = vsplat(0.0f);                                        \
    for (int l = 0; l < rows; ++l) {                                                             \
        const int64_t r = r0 + l;                                                                \
        const T *qr = q + (r / g_n) * q_stride + (h * g_n + r % g_n) * d;                        \
        for (int64_t i = 0; i < d; ++i) QT[i][l] = LOAD(qr[i]) * scale;                          \
        if (dp) for (int64_t i = 0; i < d / 2; ++i) QP[i][l] = ((const u32_alias *)qr)[i];      \
    }                                                                                            \
    if (dp) for (int l = rows; l < LANES; ++l) for (int64_t i = 0; i < d / 2; ++i) QP[i][l] = 0; \
    for (int64_t i = 0; i < d; ++i) OT[i] = vsplat(0.0f);                                        \
    vf m = vsplat(-__builtin_inff()), lsum = vsplat(0.0f);                                       \
    const int64_t first = pos[0], kend = (int64_t)pos[LANES - 1] + 1; /* keys the tile sees */   \
    for (int64_t t0 = 0; t0 < kend; t0 += KT) {                                                  \
        const int64_t n = kend - t0 < KT ? kend - t0 : KT;                                       \
        for (int64_t t = 0; t < KT; ++t) {                                                       \
            if (t < n) {                                                                         \
                const int64_t j = t0 + t;                                                        \
                const int64_t off = ((int64_t)table[j / bs] * bs + j % bs) * tok_stride + h * d; \
                if (dp) kp[t] = (const u32_alias *)(kc + off);                                   \
                else for (int64_t i = 0; i < d; ++i) kf[t][i] = LOAD(kc[off + i]);               \
                for (int64_t i = 0; i < d; ++i) vv[t][i] = LOAD(vc[off + i]);                    \
            } else {                                                                             \
                if (dp) kp[t] = zero_row;                                                        \
                else for (int64_t i = 0; i < d; ++i) kf[t][i] = 0.0f;                            \
                for (int64_t i = 0; i < d; ++i) vv[t][i] = 0.0f;                                 \
            }                                                                                    \
        }                                                                                        \
        vf S[KT];                                                                                \
        _Pragma("GCC unroll 16") for (int t = 0; t < KT; ++t) S[t] = vsplat(0.0f);               \
        if (dp) {                                                                                \
            qk_dpbf16(S, (const uint32_t (*)[LANES])QP, kp, d / 2);                              \
            _Pragma("GCC unroll 16") for (int t = 0; t < KT; ++t) S[t] *= scale;                 \
        } else {                                                                                 \
            for (int64_t i = 0; i < d; ++i) {                                                    \
                const vf qi = QT[i];                                                             \
                _Pragma("GCC unroll 16") for (int t = 0; t < KT; ++t) S[t] += qi * kf[t][i];     \
            }                                                                                    \
        }                                                                                        \
        if (t0 + KT - 1 > first) { /* the chunk reaches past the tile's first row: mask */       \
            _Pragma("GCC unroll 16") for (int t = 0; t < KT; ++t)                                \
                S[t] = vsel(pos >= (int32_t)(t0 + t), S[t], vsplat(-__builtin_inff()));          \
        }                                                                                        \
        vf bm = S[0];                                                                            \
        _Pragma("GCC unroll 16") for (int t = 1; t < KT; ++t) bm = vmax(bm, S[t]);               \
        const vf m2 = vmax(m, bm);                                                               \
        const vf a = vexp_neg(m - m2);                                                           \
        m = m2;                                                                                  \
        vf ps = vsplat(0.0f);                                                                    \
        _Pragma("GCC unroll 16") for (int t = 0; t < KT; ++t) {                                  \
            S[t] = vsel(S[t] == -__builtin_inff(), vsplat(0.0f), vexp_neg(S[t] - m2));           \
            ps += S[t];                                                                          \
        }                                                                                        \
        lsum = lsum * a + ps;                                                                    \
        int64_t i = 0;                                                                           \
        for (; i + DC <= d; i += DC) {                                                           \
            vf acc[DC];                                                                          \
            _Pragma("GCC unroll 8") for (int c = 0; c < DC; ++c) acc[c] = OT[i + c] * a;         \
            _Pragma("GCC unroll 16") for (int t = 0; t < KT; ++t)                                \
                _Pragma("GCC unroll 8") for (int c = 0; c < DC; ++c) acc[c] += S[t] * vv[t][i + c]; \
            _Pragma("GCC unroll 8") for (int c = 0; c < DC; ++c) OT[i + c] = acc[c];             \
        }                                                                                        \
        for (; i < d; ++i) {                                                                     \
            vf acc = OT[i] * a;                                                                  \
            for (int t = 0; t < KT; ++t) acc += S[t] * vv[t][i];                                 \
            OT[i] = acc;                                                                         \
        }                                                                                        \
    }                                                                                            \
    const vf inv = 1.0f / lsum;                                                                  \
    for (int l = 0; l < rows; ++l) {                                                             \
        const int64_t r = r0 + l;                                                                \
        T *orow = out + (r / g_n) * out_stride + (h * g_n + r % g_n) * d;                        \
        for (int64_t i = 0; i < d; ++i) orow[i] = STORE(OT[i][l] * inv[l]);                      \
    }                                                                                            \
}                                                                                                \
int NAME(const T *q, int64_t q_stride, T *out, int64_t out_stride, const T *kc, const T *vc,     \
         const int32_t *tables, int64_t table_stride, const int64_t *q_start,                   \
         const int64_t *seq_idx, const int64_t *q_lens, const int64_t *ctx_lens, int64_t nchunks,\
         int64_t hq, int64_t hkv, int64_t d, int64_t bs, float scale) {                         \
    if (d > MAX_D || d < 1 || hkv < 1 || hq % hkv || bs < 1) return -1;                          \
    const int64_t g_n = hq / hkv, tok_stride = hkv * d;                                          \
    /* items in (chunk, kv head, tile) order: a head's tiles run one after another, while its   \
       K/V are in cache; first[s] = the first item of chunk s */                                 \
    int64_t *first = malloc((size_t)(nchunks + 1) * sizeof(int64_t));                            \
    if (!first) return -2;                                                                       \
    first[0] = 0;                                                                                \
    for (int64_t s = 0; s < nchunks; ++s)                                                        \
        first[s + 1] = first[s] + hkv * ((q_lens[s] * g_n + LANES - 1) / LANES);                 \
    OMP(omp parallel for schedule(dynamic, 1) num_threads(kernel_nthreads))                      \
    for (int64_t w = 0; w < first[nchunks]; ++w) {                                               \
        int64_t lo = 0, hi = nchunks - 1; /* the chunk: last s with first[s] <= w */             \
        while (lo < hi) { const int64_t mid = (lo + hi + 1) / 2; if (first[mid] <= w) lo = mid; else hi = mid - 1; } \
        const int64_t s = lo, tiles = (q_lens[s] * g_n + LANES - 1) / LANES;                     \
        const int64_t h = (w - first[s]) / tiles, r0 = ((w - first[s]) % tiles) * LANES;         \
        const T *qs = q + q_start[s] * q_stride;                                                 \
        T *os = out + q_start[s] * out_stride;                                                   \
        const int32_t *table = tables + seq_idx[s] * table_stride;                               \
        if (d == 64)                                                                             \
            NAME##_tile(qs, q_stride, os, out_stride, kc, vc, table, ctx_lens[s], q_lens[s], r0, h, \
                        g_n, 64, bs, tok_stride, scale, DP);                                         \
        else if (d == 128)                                                                       \
            NAME##_tile(qs, q_stride, os, out_stride, kc, vc, table, ctx_lens[s], q_lens[s], r0, h, \
                        g_n, 128, bs, tok_stride, scale, DP);                                        \
        else                                                                                     \
            NAME##_tile(qs, q_stride, os, out_stride, kc, vc, table, ctx_lens[s], q_lens[s], r0, h, \
                        g_n, d, bs, tok_stride, scale, DP && d % 2 == 0);                                          \
    }                                                                                            \
    free(first);                                                                                 \
    return 0;                                                                                    \
}

#define ID(x) (x)
DEFINE_TILE(paged_prefill_f32, float, ID, ID, 0)
DEFINE_TILE(paged_prefill_bf16, uint16_t, bf2f, f2bf, HAVE_DPBF16)
