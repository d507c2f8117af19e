/* Matmuls on GGUF-quantized weights as they are stored: y[m,n] = x[m,k] @ W^T, W[n,k] in one
   of the block formats of quant_blocks.h (rows of blocks, the file's own bytes). The weights
   are unpacked in registers, never written out dequantized: a decode step of one sequence
   reads 4-8 bits per weight instead of 16 (bf16).

   The activations are quantized first (quant_x), as llama.cpp does: each row in blocks of 32,
   int8 q = round(x / d), d = max|x| / 127, with d * sum(q) of each half block beside them. A
   32-element sub-block of a weight row is then one integer dot product of its unsigned q with
   x's int8 (vpdpbusd on AVX512-VNNI, vpmaddubsw + vpmaddwd on AVX2; Q8_0 takes |w| against
   sign(x, w)) into eight int32 lanes, scaled in float by d_x * (the weight's scale) and
   accumulated per lane; the weight's offset (Q4_1's min, Q4_0's -8 d, a K-quant's -dmin * m)
   adds offset * d_x * sum(q_x). Each output is one tile lane's sum over k in block order,
   then one fixed horizontal sum: its arithmetic is the same whatever the row count m, the
   tile it falls in or the thread that runs it (batch invariance, docs/kernels.md).

   Built twice by gpuworker/models/quant_linear.py: with AVX512-VNNI + VL (256-bit vpdpbusd)
   and with AVX2 + FMA + F16C; the #if below picks the dot product. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include "threads.h"
#include "quant_blocks.h"

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define QUANT_ISA "avx512_vnni"
#define RM_MAX 4 /* x rows per tile: 4 weight rows x 4 rows of x = 16 accumulators (32 ymm) */
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}
#else
#define QUANT_ISA "avx2"
#define RM_MAX 2 /* 16 ymm registers: 4 x 2 accumulators, the 4 weight vectors, x and a product */
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
    /* pairs of u8 * s8 as int16 (no saturation: |w| <= 128 against |x| <= 127), then pairs of those */
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
#endif
#define RN 4  /* weight rows per tile */
#define X_BLOCK_ROWS 64 /* rows of x per pass over the weights (64 x k int8 stays in L2) */

const char *quant_isa(void) { return QUANT_ISA; }

/* ---------------------------------------------------------------- activations */

/* 8 elements of x from `at` as float32 (bfloat16 where bf16: its bits are float32's top half). */
static inline __m256 x8(const void *x, int bf16, int64_t at) {
    if (bf16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)x + at))), 16));
    return _mm256_loadu_ps((const float *)x + at);
}

static inline int hsum8_epi32(__m256i v) {
    __m128i a = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    a = _mm_add_epi32(a, _mm_unpackhi_epi64(a, a));
    return _mm_cvtsi128_si32(_mm_add_epi32(a, _mm_shuffle_epi32(a, 1)));
}

/* x (float32, or bfloat16 where x_bf16) -> xq[m][k] int8, xd[m][k/32] the block scales, and
   xs[m][k/32][4]: d * (sum of q over elements 0-15, over 16-31, over all 32), 0. Per block:
   d = max|x| / 127, q = x * (1 / d) rounded half to even (vcvtps2dq, as numpy's rint). */
void quant_x(const void *x, int64_t ldx, int x_bf16, int64_t m, int64_t k, int8_t *xq, float *xd, float *xs) {
    const int64_t nb = k / 32;
    OMP(omp parallel for schedule(static) num_threads(kernel_nthreads) if (m > 1))
    for (int64_t r = 0; r < m; ++r) {
        for (int64_t b = 0; b < nb; ++b) {
            const __m256 sign = _mm256_set1_ps(-0.0f);
            __m256 v[4], mx = _mm256_setzero_ps();
            for (int c = 0; c < 4; ++c) {
                v[c] = x8(x, x_bf16, r * ldx + b * 32 + 8 * c);
                mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[c]));
            }
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            __m256i q[4];
            for (int c = 0; c < 4; ++c) q[c] = _mm256_cvtps_epi32(_mm256_mul_ps(v[c], _mm256_set1_ps(id)));
            /* |q| <= 127: the packs do not saturate; the permute undoes their lane interleave */
            const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(xq + r * k + b * 32),
                                _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
            const int s0 = hsum8_epi32(_mm256_add_epi32(q[0], q[1])), s1 = hsum8_epi32(_mm256_add_epi32(q[2], q[3]));
            xd[r * nb + b] = d;
            float *s = xs + (r * nb + b) * 4;
            s[0] = d * (float)s0; s[1] = d * (float)s1; s[2] = d * (float)(s0 + s1); s[3] = 0.0f;
        }
    }
}

/* ---------------------------------------------------------------- weights */

/* Per 32-element sub-block j of one block (group) of type T: sc[2j], sc[2j+1] the scale of its
   two halves (equal but for Q6_K, whose scales are per 16), of[j] its offset. */
static inline __attribute__((always_inline)) void prep(const int T, const uint8_t *p, float *sc, float *of) {
    switch (T) {
    case GGML_Q4_0: { const float d = f16_to_f32(((const blk_q4_0 *)p)->d); sc[0] = sc[1] = d; of[0] = -8.0f * d; break; }
    case GGML_Q5_0: { const float d = f16_to_f32(((const blk_q5_0 *)p)->d); sc[0] = sc[1] = d; of[0] = -16.0f * d; break; }
    case GGML_Q8_0: { const float d = f16_to_f32(((const blk_q8_0 *)p)->d); sc[0] = sc[1] = d; of[0] = 0.0f; break; }
    case GGML_Q4_1: { const blk_q4_1 *b = (const blk_q4_1 *)p; sc[0] = sc[1] = f16_to_f32(b->d); of[0] = f16_to_f32(b->m); break; }
    case GGML_Q5_1: { const blk_q5_1 *b = (const blk_q5_1 *)p; sc[0] = sc[1] = f16_to_f32(b->d); of[0] = f16_to_f32(b->m); break; }
    case GGML_Q4_K: case GGML_Q5_K: {
        /* Q4_K and Q5_K share the header: d, dmin, 12 bytes of 6-bit scales and mins */
        const blk_q4_k *b = (const blk_q4_k *)p;
        const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
        for (int j = 0; j < 8; ++j) {
            int s, mn;
            k4_scale_min(b->scales, j, &s, &mn);
            sc[2 * j] = sc[2 * j + 1] = d * (float)s;
            of[j] = -(dmin * (float)mn);
        }
        break;
    }
    case GGML_Q6_K: {
        const blk_q6_k *b = (const blk_q6_k *)p;
        const float d = f16_to_f32(b->d);
        for (int j = 0; j < 16; ++j) sc[j] = d * (float)b->scales[j];
        for (int j = 0; j < 8; ++j) of[j] = 0.0f; /* the -32 goes per half: see the tile */
        break;
    }
    }
}

static inline __attribute__((always_inline)) __m256i unpack(const int T, const uint8_t *p, int j) {
    switch (T) {
    case GGML_Q4_0: return nibbles_32(((const blk_q4_0 *)p)->qs);
    case GGML_Q4_1: return nibbles_32(((const blk_q4_1 *)p)->qs);
    case GGML_Q5_0: return _mm256_or_si256(nibbles_32(((const blk_q5_0 *)p)->qs), fifth_bits_32(((const blk_q5_0 *)p)->qh));
    case GGML_Q5_1: return _mm256_or_si256(nibbles_32(((const blk_q5_1 *)p)->qs), fifth_bits_32(((const blk_q5_1 *)p)->qh));
    case GGML_Q8_0: return _mm256_loadu_si256((const __m256i *)((const blk_q8_0 *)p)->qs);
    case GGML_Q4_K: return k_nibbles(((const blk_q4_k *)p)->qs, j);
    case GGML_Q5_K: return _mm256_or_si256(k_nibbles(((const blk_q5_k *)p)->qs, j), q5k_fifth(((const blk_q5_k *)p)->qh, j));
    case GGML_Q6_K: return q6k_group((const blk_q6_k *)p, j);
    }
    return _mm256_setzero_si256();
}

static inline __attribute__((always_inline)) __m256i qdot(const int T, __m256i q, __m256i x) {
    if (T == GGML_Q8_0) return dot_u8s8(_mm256_abs_epi8(q), _mm256_sign_epi8(x, q));
    return dot_u8s8(q, x);
}

/* The 8 lanes' sum, in one fixed order. */
static inline float hsum8(__m256 v) {
    const __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* l0+l4 .. l3+l7 */
    const __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));                              /* (0+4)+(2+6), (1+5)+(3+7) */
    return _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)));
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);                /* round to nearest even */
}

/* rn weight rows x rm rows of x, all of k: out[r * rm + i] = row i of x . weight row r. */
static inline __attribute__((always_inline)) void qtile(const int T, const int rn, const int rm,
        const uint8_t *w, int64_t row_bytes, int64_t k, const int8_t *xq, const float *xd, const float *xs,
        float *out) {
    const int subs = qblock_elems(T) / 32, gbytes = qblock_bytes(T);
    const int64_t groups = k / qblock_elems(T), nb = k / 32;
    __m256 acc[RN][RM_MAX];
    float off[RN][RM_MAX];
    for (int r = 0; r < rn; ++r)
        for (int i = 0; i < rm; ++i) { acc[r][i] = _mm256_setzero_ps(); off[r][i] = 0.0f; }
    for (int64_t g = 0; g < groups; ++g) {
        float sc[RN][16], of[RN][8];
        const uint8_t *p[RN];
        for (int r = 0; r < rn; ++r) {
            p[r] = w + r * row_bytes + g * gbytes;
            prep(T, p[r], sc[r], of[r]);
        }
        for (int j = 0; j < subs; ++j) {
            const int64_t xb = g * subs + j;
            __m256i q[RN];
            for (int r = 0; r < rn; ++r) q[r] = unpack(T, p[r], j);
            for (int i = 0; i < rm; ++i) {
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + i * k + xb * 32));
                const float dx = xd[i * nb + xb];
                const float *s = xs + (i * nb + xb) * 4;
                for (int r = 0; r < rn; ++r) {
                    const __m256 prod = _mm256_cvtepi32_ps(qdot(T, q[r], xv));
                    const __m256 scale = T == GGML_Q6_K
                        ? _mm256_set_m128(_mm_set1_ps(sc[r][2 * j + 1] * dx), _mm_set1_ps(sc[r][2 * j] * dx))
                        : _mm256_set1_ps(sc[r][2 * j] * dx);
                    acc[r][i] = _mm256_fmadd_ps(prod, scale, acc[r][i]);
                    if (T == GGML_Q6_K) /* q - 32 per half of 16, each with its own scale */
                        off[r][i] += -32.0f * sc[r][2 * j] * s[0] + -32.0f * sc[r][2 * j + 1] * s[1];
                    else if (T != GGML_Q8_0)
                        off[r][i] += of[r][j] * s[2];
                }
            }
        }
    }
    for (int r = 0; r < rn; ++r)
        for (int i = 0; i < rm; ++i) out[r * rm + i] = hsum8(acc[r][i]) + off[r][i];
}

typedef void (*tile_fn)(const uint8_t *, int64_t, int64_t, const int8_t *, const float *, const float *, float *);
#define TILE(T, R, M) \
    static void tile_##T##_##R##_##M(const uint8_t *w, int64_t rb, int64_t k, const int8_t *xq, const float *xd, \
                                     const float *xs, float *out) { qtile(T, R, M, w, rb, k, xq, xd, xs, out); }
#if RM_MAX == 4
#define TILES(T) TILE(T, 1, 1) TILE(T, 1, 2) TILE(T, 1, 3) TILE(T, 1, 4) TILE(T, 4, 1) TILE(T, 4, 2) TILE(T, 4, 3) TILE(T, 4, 4)
#define TABLE(T) {{0, tile_##T##_1_1, tile_##T##_1_2, tile_##T##_1_3, tile_##T##_1_4}, \
                  {0, tile_##T##_4_1, tile_##T##_4_2, tile_##T##_4_3, tile_##T##_4_4}}
#else
#define TILES(T) TILE(T, 1, 1) TILE(T, 1, 2) TILE(T, 4, 1) TILE(T, 4, 2)
#define TABLE(T) {{0, tile_##T##_1_1, tile_##T##_1_2}, {0, tile_##T##_4_1, tile_##T##_4_2}}
#endif
TILES(GGML_Q4_0) TILES(GGML_Q4_1) TILES(GGML_Q5_0) TILES(GGML_Q5_1) TILES(GGML_Q8_0)
TILES(GGML_Q4_K) TILES(GGML_Q5_K) TILES(GGML_Q6_K)
static const tile_fn TILE_Q4_0[2][RM_MAX + 1] = TABLE(GGML_Q4_0), TILE_Q4_1[2][RM_MAX + 1] = TABLE(GGML_Q4_1),
    TILE_Q5_0[2][RM_MAX + 1] = TABLE(GGML_Q5_0), TILE_Q5_1[2][RM_MAX + 1] = TABLE(GGML_Q5_1),
    TILE_Q8_0[2][RM_MAX + 1] = TABLE(GGML_Q8_0), TILE_Q4_K[2][RM_MAX + 1] = TABLE(GGML_Q4_K),
    TILE_Q5_K[2][RM_MAX + 1] = TABLE(GGML_Q5_K), TILE_Q6_K[2][RM_MAX + 1] = TABLE(GGML_Q6_K);

static const tile_fn (*tiles_of(int type))[RM_MAX + 1] {
    switch (type) {
    case GGML_Q4_0: return TILE_Q4_0;
    case GGML_Q4_1: return TILE_Q4_1;
    case GGML_Q5_0: return TILE_Q5_0;
    case GGML_Q5_1: return TILE_Q5_1;
    case GGML_Q8_0: return TILE_Q8_0;
    case GGML_Q4_K: return TILE_Q4_K;
    case GGML_Q5_K: return TILE_Q5_K;
    case GGML_Q6_K: return TILE_Q6_K;
    }
    return 0;
}

/* y[m, n] (float32, or bfloat16 where y_bf16; row stride ldy) = x @ W^T with x as quant_x left
   it and W[n, k] rows of `type` blocks. Threads split the 4-row tiles of W (each output is one
   thread's, summed as with one thread: the same bits at any thread count). Returns 0, or -1
   for an unknown type or a k that is not a whole number of blocks. */
int quant_linear(int type, const int8_t *xq, const float *xd, const float *xs, int64_t m, int64_t k,
                 const uint8_t *w, int64_t n, void *y, int64_t ldy, int y_bf16) {
    const tile_fn (*tab)[RM_MAX + 1] = tiles_of(type);
    if (!tab || k <= 0 || k % qblock_elems(type) || m < 0 || n < 0) return -1;
    const int64_t row_bytes = k / qblock_elems(type) * qblock_bytes(type), nb = k / 32;
    const int64_t tiles = (n + RN - 1) / RN;
    OMP(omp parallel num_threads(kernel_nthreads) if (n >= 2 * RN))
    for (int64_t m0 = 0; m0 < m; m0 += X_BLOCK_ROWS) {
        const int64_t m1 = m - m0 < X_BLOCK_ROWS ? m : m0 + X_BLOCK_ROWS;
        OMP(omp for schedule(static))
        for (int64_t t = 0; t < tiles; ++t) {
            const int64_t n0 = t * RN, rn = n - n0 < RN ? n - n0 : RN;
            for (int64_t i0 = m0; i0 < m1; i0 += RM_MAX) {
                const int rm = (int)(m1 - i0 < RM_MAX ? m1 - i0 : RM_MAX);
                float out[RN * RM_MAX];
                const int8_t *xr = xq + i0 * k;
                const float *dr = xd + i0 * nb, *sr = xs + i0 * nb * 4;
                if (rn == RN) {
                    tab[1][rm](w + n0 * row_bytes, row_bytes, k, xr, dr, sr, out);
                } else {
                    for (int64_t r = 0; r < rn; ++r) tab[0][rm](w + (n0 + r) * row_bytes, row_bytes, k, xr, dr, sr, out + r * rm);
                }
                for (int64_t r = 0; r < rn; ++r)
                    for (int i = 0; i < rm; ++i) {
                        const int64_t at = (i0 + i) * ldy + n0 + r;
                        if (y_bf16) ((uint16_t *)y)[at] = f32_to_bf16(out[r * rm + i]);
                        else ((float *)y)[at] = out[r * rm + i];
                    }
            }
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- float activations */

/* The same weights against float32 x, unquantized: each sub-block's q widened to float and
   scaled (w = q * scale + offset, one FMA) in registers, then FMAs with x, two accumulators
   per output (the even and odd vectors of a block). Exact to float32 summation, where the
   int8 path above carries x's quantization error (about 0.5% per matmul). */
#ifdef __AVX512F__
typedef __m512 vf;
#define VF_LANES 16
#define VF_FMA _mm512_fmadd_ps
#define VF_SET1 _mm512_set1_ps
#define VF_LOAD _mm512_loadu_ps
#define VF_ZERO _mm512_setzero_ps
#define RMF_MAX 2 /* 4 weight rows x 2 rows of x x 2 accumulators = 16 zmm */
static inline float vf_hsum(vf a, vf b) {
    const __m512 v = _mm512_add_ps(a, b);
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}
/* elements 16c .. 16c+15 of the 32 bytes q as floats (signed bytes where sgn) */
static inline __attribute__((always_inline)) vf widen(__m256i q, int c, int sgn) {
    const __m128i h = c ? _mm256_extracti128_si256(q, 1) : _mm256_castsi256_si128(q);
    return _mm512_cvtepi32_ps(sgn ? _mm512_cvtepi8_epi32(h) : _mm512_cvtepu8_epi32(h));
}
#else
typedef __m256 vf;
#define VF_LANES 8
#define VF_FMA _mm256_fmadd_ps
#define VF_SET1 _mm256_set1_ps
#define VF_LOAD _mm256_loadu_ps
#define VF_ZERO _mm256_setzero_ps
#define RMF_MAX 2
static inline float vf_hsum(vf a, vf b) { return hsum8(_mm256_add_ps(a, b)); }
static inline __attribute__((always_inline)) vf widen(__m256i q, int c, int sgn) {
    __m128i h = c >= 2 ? _mm256_extracti128_si256(q, 1) : _mm256_castsi256_si128(q);
    if (c & 1) h = _mm_srli_si128(h, 8);
    return _mm256_cvtepi32_ps(sgn ? _mm256_cvtepi8_epi32(h) : _mm256_cvtepu8_epi32(h));
}
#endif
#define CHUNKS (32 / VF_LANES)

static inline __attribute__((always_inline)) void ftile(const int T, const int rn, const int rm,
        const uint8_t *w, int64_t row_bytes, int64_t k, const float *x, int64_t ldx, float *out) {
    const int subs = qblock_elems(T) / 32, gbytes = qblock_bytes(T);
    const int64_t groups = k / qblock_elems(T);
    vf acc[RN][RMF_MAX][2];
    for (int r = 0; r < rn; ++r)
        for (int i = 0; i < rm; ++i) acc[r][i][0] = acc[r][i][1] = VF_ZERO();
    for (int64_t g = 0; g < groups; ++g) {
        float sc[RN][16], of[RN][8];
        const uint8_t *p[RN];
        for (int r = 0; r < rn; ++r) {
            p[r] = w + r * row_bytes + g * gbytes;
            prep(T, p[r], sc[r], of[r]);
        }
        for (int j = 0; j < subs; ++j) {
            const int64_t e0 = (g * subs + j) * 32;
            __m256i q[RN];
            for (int r = 0; r < rn; ++r) q[r] = unpack(T, p[r], j);
            for (int c = 0; c < CHUNKS; ++c) {
                const int half = c * VF_LANES / 16;
                vf wv[RN];
                for (int r = 0; r < rn; ++r) {
                    const float s = sc[r][2 * j + half];
                    const float o = T == GGML_Q6_K ? -32.0f * s : T == GGML_Q8_0 ? 0.0f : of[r][j];
                    wv[r] = VF_FMA(widen(q[r], c, T == GGML_Q8_0), VF_SET1(s), VF_SET1(o));
                }
                for (int i = 0; i < rm; ++i) {
                    const vf xv = VF_LOAD(x + i * ldx + e0 + c * VF_LANES);
                    for (int r = 0; r < rn; ++r) acc[r][i][c & 1] = VF_FMA(wv[r], xv, acc[r][i][c & 1]);
                }
            }
        }
    }
    for (int r = 0; r < rn; ++r)
        for (int i = 0; i < rm; ++i) out[r * rm + i] = vf_hsum(acc[r][i][0], acc[r][i][1]);
}

typedef void (*ftile_fn)(const uint8_t *, int64_t, int64_t, const float *, int64_t, float *);
#define FTILE(T, R, M) \
    static void ftile_##T##_##R##_##M(const uint8_t *w, int64_t rb, int64_t k, const float *x, int64_t ldx, \
                                      float *out) { ftile(T, R, M, w, rb, k, x, ldx, out); }
#define FTILES(T) FTILE(T, 1, 1) FTILE(T, 1, 2) FTILE(T, 4, 1) FTILE(T, 4, 2)
#define FTABLE(T) {{0, ftile_##T##_1_1, ftile_##T##_1_2}, {0, ftile_##T##_4_1, ftile_##T##_4_2}}
FTILES(GGML_Q4_0) FTILES(GGML_Q4_1) FTILES(GGML_Q5_0) FTILES(GGML_Q5_1) FTILES(GGML_Q8_0)
FTILES(GGML_Q4_K) FTILES(GGML_Q5_K) FTILES(GGML_Q6_K)
static const ftile_fn FTILE_Q4_0[2][RMF_MAX + 1] = FTABLE(GGML_Q4_0), FTILE_Q4_1[2][RMF_MAX + 1] = FTABLE(GGML_Q4_1),
    FTILE_Q5_0[2][RMF_MAX + 1] = FTABLE(GGML_Q5_0), FTILE_Q5_1[2][RMF_MAX + 1] = FTABLE(GGML_Q5_1),
    FTILE_Q8_0[2][RMF_MAX + 1] = FTABLE(GGML_Q8_0), FTILE_Q4_K[2][RMF_MAX + 1] = FTABLE(GGML_Q4_K),
    FTILE_Q5_K[2][RMF_MAX + 1] = FTABLE(GGML_Q5_K), FTILE_Q6_K[2][RMF_MAX + 1] = FTABLE(GGML_Q6_K);

static const ftile_fn (*ftiles_of(int type))[RMF_MAX + 1] {
    switch (type) {
    case GGML_Q4_0: return FTILE_Q4_0;
    case GGML_Q4_1: return FTILE_Q4_1;
    case GGML_Q5_0: return FTILE_Q5_0;
    case GGML_Q5_1: return FTILE_Q5_1;
    case GGML_Q8_0: return FTILE_Q8_0;
    case GGML_Q4_K: return FTILE_Q4_K;
    case GGML_Q5_K: return FTILE_Q5_K;
    case GGML_Q6_K: return FTILE_Q6_K;
    }
    return 0;
}

/* y[m, n] = x @ W^T with x float32 [m, k] (row stride ldx), as quant_linear otherwise. */
int quant_linear_f32(int type, const float *x, int64_t ldx, int64_t m, int64_t k,
                     const uint8_t *w, int64_t n, void *y, int64_t ldy, int y_bf16) {
    const ftile_fn (*tab)[RMF_MAX + 1] = ftiles_of(type);
    if (!tab || k <= 0 || k % qblock_elems(type) || m < 0 || n < 0) return -1;
    const int64_t row_bytes = k / qblock_elems(type) * qblock_bytes(type);
    const int64_t tiles = (n + RN - 1) / RN;
    OMP(omp parallel num_threads(kernel_nthreads) if (n >= 2 * RN))
    for (int64_t m0 = 0; m0 < m; m0 += X_BLOCK_ROWS) {
        const int64_t m1 = m - m0 < X_BLOCK_ROWS ? m : m0 + X_BLOCK_ROWS;
        OMP(omp for schedule(static))
        for (int64_t t = 0; t < tiles; ++t) {
            const int64_t n0 = t * RN, rn = n - n0 < RN ? n - n0 : RN;
            for (int64_t i0 = m0; i0 < m1; i0 += RMF_MAX) {
                const int rm = (int)(m1 - i0 < RMF_MAX ? m1 - i0 : RMF_MAX);
                float out[RN * RMF_MAX];
                if (rn == RN) {
                    tab[1][rm](w + n0 * row_bytes, row_bytes, k, x + i0 * ldx, ldx, out);
                } else {
                    for (int64_t r = 0; r < rn; ++r) tab[0][rm](w + (n0 + r) * row_bytes, row_bytes, k, x + i0 * ldx, ldx, out + r * rm);
                }
                for (int64_t r = 0; r < rn; ++r)
                    for (int i = 0; i < rm; ++i) {
                        const int64_t at = (i0 + i) * ldy + n0 + r;
                        if (y_bf16) ((uint16_t *)y)[at] = f32_to_bf16(out[r * rm + i]);
                        else ((float *)y)[at] = out[r * rm + i];
                    }
            }
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- 16-row interleaved (AVX512-VNNI) */

/* Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 repacked once at load for a 512-bit dot: rows in groups of
   16, and per group and 32-element block one record: the 16 rows' scales d (f16 [16]), their
   offsets o (f16 [16]: Q4_1's and Q5_1's m, Q4_0's -8 d, Q5_0's -16 d, Q8_0's -128 d), then the
   weights as unsigned q (the weight is d * q + o), 4 bytes (4 elements) of each of the 16 rows
   per 64-byte vector: Q8_0 8 vectors (element 4t + b of row r at byte 4r + b of vector t, as
   w + 128); Q4_x and Q5_x 4 vectors of nibbles (vector p: element 8p + b in the low nibble of
   byte 4r + b, element 8p + 4 + b in the high), Q5_x then one vector of fifth bits (bits 2p and
   2p + 1 of byte 4r + b: those of vector p's low and high nibble, as Q5_K's below). One
   vpdpbusd then serves 16 rows against 4 of x's bytes (broadcast): the scales, the
   integer-to-float conversion and the accumulation are vector operations over the 16 rows,
   where the row layout spends them per row (about 5x fewer instructions per weight). The
   record is the same bytes as the file's blocks, plus the offsets (Q4_0 4.5 -> 5 bits a weight,
   Q5_0 5.5 -> 6, Q5_1 6 -> 6, Q8_0 8.5 -> 9); rows past n are zero. */
#define G16 16
/* K-quants (Q4_K, Q5_K, Q6_K) keep their two-level scales: per group and super-block of 256,
   the 16 rows' d and dmin (f16 [16] each), then per 32-element sub-block their 6-bit scales
   and mins (u8 [16] each; Q6_K: the int8 scales of its two halves of 16), the low nibbles as
   above (4 vectors) and the fifth bits (Q5_K: one vector, bits 2p and 2p + 1 of byte 4r + b
   for the low and high nibble of vector p) or the top two bits (Q6_K: two vectors, nibble
   p % 2 of byte 4r + b of vector p / 2: bits 0-1 for the low nibble's element, 2-3 for the
   high's). Scales are computed in the kernel as the row kernel does (d * sc, dmin * m, in
   float32): the same weights, 4.625 bits a weight for Q4_K (the file: 4.5). */
static inline int k16_sub_bytes(int type) {
    return type == GGML_Q4_K ? 32 + 256 : type == GGML_Q5_K ? 32 + 256 + 64 : type == GGML_Q6_K ? 32 + 256 + 128 : 0;
}
static inline int rec16_bytes(int type) { /* per group and 32 elements (K-quants: per 256) */
    if (k16_sub_bytes(type)) return 64 + 8 * k16_sub_bytes(type);
    switch (type) {
    case GGML_Q8_0: return 64 + 512;
    case GGML_Q4_0: case GGML_Q4_1: return 64 + 256;
    case GGML_Q5_0: case GGML_Q5_1: return 64 + 256 + 64; /* the nibbles, then the fifth-bit plane */
    default: return 0;
    }
}

/* The unsigned q (0-63) of the 256 elements of one K-quant super-block, its per-sub-block
   scales (sc: Q6_K's 16 signed half scales) and mins, as the row kernel reads them. */
static void k_block_q(int type, const uint8_t *p, uint8_t *q, int *sc, int *mn, uint16_t *d, uint16_t *dmin) {
    if (type == GGML_Q6_K) {
        const blk_q6_k *b = (const blk_q6_k *)p;
        *d = b->d; *dmin = 0;
        for (int j = 0; j < 16; ++j) sc[j] = b->scales[j];
        for (int g = 0; g < 8; ++g) {
            const int h = g >> 2, i = g & 3;
            for (int l = 0; l < 32; ++l)
                q[32 * g + l] = (uint8_t)(((b->ql[64 * h + 32 * (i & 1) + l] >> (4 * (i >> 1))) & 15) |
                                          (((b->qh[32 * h + l] >> (2 * i)) & 3) << 4));
        }
        return;
    }
    const blk_q4_k *b = (const blk_q4_k *)p;
    const uint8_t *qs = type == GGML_Q4_K ? b->qs : ((const blk_q5_k *)p)->qs;
    *d = b->d; *dmin = b->dmin;
    for (int j = 0; j < 8; ++j) {
        k4_scale_min(b->scales, j, sc + j, mn + j);
        for (int l = 0; l < 32; ++l) {
            int v = (qs[32 * (j >> 1) + l] >> (4 * (j & 1))) & 15;
            if (type == GGML_Q5_K) v |= ((((const blk_q5_k *)p)->qh[l] >> j) & 1) << 4;
            q[32 * j + l] = (uint8_t)v;
        }
    }
}

static void repack16_k(int type, const uint8_t *w, int64_t n, int64_t k, uint8_t *out) {
    const int rb = rec16_bytes(type), sb = k16_sub_bytes(type);
    const int64_t nsb = k / 256, row_bytes = nsb * qblock_bytes(type), groups = (n + G16 - 1) / G16;
    for (int64_t g = 0; g < groups; ++g)
        for (int64_t s = 0; s < nsb; ++s) {
            uint8_t *rec = out + (g * nsb + s) * rb;
            for (int r = 0; r < G16 && g * G16 + r < n; ++r) {
                uint8_t q[256];
                int sc[16], mn[8];
                k_block_q(type, w + (g * G16 + r) * row_bytes + s * qblock_bytes(type), q, sc, mn,
                          (uint16_t *)rec + r, (uint16_t *)(rec + 32) + r);
                for (int j = 0; j < 8; ++j) {
                    uint8_t *sub = rec + 64 + j * sb, *lo = sub + 32, *hi = sub + 32 + 256;
                    const uint8_t *e = q + 32 * j;
                    if (type == GGML_Q6_K) { sub[r] = (uint8_t)(int8_t)sc[2 * j]; sub[16 + r] = (uint8_t)(int8_t)sc[2 * j + 1]; }
                    else { sub[r] = (uint8_t)sc[j]; sub[16 + r] = (uint8_t)mn[j]; }
                    for (int v = 0; v < 4; ++v)
                        for (int i = 0; i < 4; ++i) {
                            const int a = e[8 * v + i], c = e[8 * v + 4 + i];
                            lo[v * 64 + 4 * r + i] = (uint8_t)((a & 15) | (c & 15) << 4);
                            if (type == GGML_Q5_K)
                                hi[4 * r + i] |= (uint8_t)(((a >> 4) & 1) << (2 * v) | ((c >> 4) & 1) << (2 * v + 1));
                            else if (type == GGML_Q6_K)
                                hi[(v >> 1) * 64 + 4 * r + i] |= (uint8_t)(((a >> 4) | (c >> 4) << 2) << (4 * (v & 1)));
                        }
                }
            }
        }
}

int64_t quant_repack16_bytes(int type, int64_t n, int64_t k) {
    if (!rec16_bytes(type) || k % qblock_elems(type)) return -1;
    return (n + G16 - 1) / G16 * (k / qblock_elems(type)) * rec16_bytes(type);
}

int quant_repack16(int type, const uint8_t *w, int64_t n, int64_t k, uint8_t *out) {
    const int rb = rec16_bytes(type);
    if (!rb || k % qblock_elems(type)) return -1;
    memset(out, 0, (size_t)quant_repack16_bytes(type, n, k));
    if (k16_sub_bytes(type)) {
        repack16_k(type, w, n, k, out);
        return 0;
    }
    const int64_t nb = k / 32, row_bytes = nb * qblock_bytes(type), groups = (n + G16 - 1) / G16;
    for (int64_t g = 0; g < groups; ++g)
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t *rec = out + (g * nb + b) * rb;
            uint16_t *d = (uint16_t *)rec, *o = (uint16_t *)(rec + 32);
            uint8_t *q = rec + 64;
            for (int r = 0; r < G16 && g * G16 + r < n; ++r) {
                const uint8_t *p = w + (g * G16 + r) * row_bytes + b * qblock_bytes(type);
                uint8_t e[32]; /* unsigned q of the 32 elements */
                if (type == GGML_Q8_0) {
                    const blk_q8_0 *blk = (const blk_q8_0 *)p;
                    d[r] = blk->d;
                    o[r] = _cvtss_sh(-128.0f * f16_to_f32(blk->d), 0);
                    for (int i = 0; i < 32; ++i) e[i] = (uint8_t)(blk->qs[i] + 128);
                    for (int t = 0; t < 8; ++t)
                        for (int i = 0; i < 4; ++i) q[t * 64 + 4 * r + i] = e[4 * t + i];
                } else {
                    const uint8_t *qs;
                    uint32_t qh = 0; /* bit i: element i's fifth bit (Q5_0 / Q5_1) */
                    switch (type) {
                    case GGML_Q4_0: qs = ((const blk_q4_0 *)p)->qs; break;
                    case GGML_Q4_1: qs = ((const blk_q4_1 *)p)->qs; break;
                    case GGML_Q5_0: qs = ((const blk_q5_0 *)p)->qs; memcpy(&qh, ((const blk_q5_0 *)p)->qh, 4); break;
                    default: qs = ((const blk_q5_1 *)p)->qs; memcpy(&qh, ((const blk_q5_1 *)p)->qh, 4); break;
                    }
                    d[r] = ((const uint16_t *)p)[0]; /* d leads every one of these blocks */
                    /* -8 d and -16 d are exact in f16 (a power of two times an f16) */
                    o[r] = type == GGML_Q4_0 ? _cvtss_sh(-8.0f * f16_to_f32(d[r]), 0)
                         : type == GGML_Q5_0 ? _cvtss_sh(-16.0f * f16_to_f32(d[r]), 0)
                         : ((const uint16_t *)p)[1]; /* Q4_1 / Q5_1: m */
                    for (int i = 0; i < 16; ++i) {
                        e[i] = (uint8_t)((qs[i] & 15) | ((qh >> i) & 1) << 4);
                        e[i + 16] = (uint8_t)((qs[i] >> 4) | ((qh >> (i + 16)) & 1) << 4);
                    }
                    for (int v = 0; v < 4; ++v)
                        for (int i = 0; i < 4; ++i) {
                            const int a = e[8 * v + i], c = e[8 * v + 4 + i];
                            q[v * 64 + 4 * r + i] = (uint8_t)((a & 15) | (c & 15) << 4);
                            /* the fifth bits as Q5_K's plane: bits 2v, 2v + 1 for the low, high nibble */
                            q[256 + 4 * r + i] |= (uint8_t)((a >> 4) << (2 * v) | (c >> 4) << (2 * v + 1));
                        }
                }
            }
        }
    return 0;
}

/* Row `row` of a repacked table as floats, the same values as dequant_block's. */
static void repacked_row(int type, const uint8_t *wp, int64_t k, int64_t row, float *out) {
    const int rb = rec16_bytes(type);
    if (k16_sub_bytes(type)) {
        const int sb = k16_sub_bytes(type), r = (int)(row % G16);
        for (int64_t s = 0; s < k / 256; ++s) {
            const uint8_t *rec = wp + ((row / G16) * (k / 256) + s) * rb;
            const float d = f16_to_f32(((const uint16_t *)rec)[r]), dmin = f16_to_f32(((const uint16_t *)(rec + 32))[r]);
            for (int j = 0; j < 8; ++j) {
                const uint8_t *sub = rec + 64 + j * sb, *lo = sub + 32, *hi = sub + 32 + 256;
                for (int e = 0; e < 32; ++e) {
                    const int v = e / 8, i = e % 4, high = (e % 8) >= 4;
                    int q = (lo[v * 64 + 4 * r + i] >> (4 * high)) & 15;
                    if (type == GGML_Q5_K) q |= ((hi[4 * r + i] >> (2 * v + high)) & 1) << 4;
                    if (type == GGML_Q6_K) q |= ((hi[(v >> 1) * 64 + 4 * r + i] >> (4 * (v & 1) + 2 * high)) & 3) << 4;
                    float x;
                    if (type == GGML_Q6_K) x = d * (float)(int8_t)sub[e < 16 ? r : 16 + r] * (float)(q - 32);
                    else x = d * (float)sub[r] * (float)q - dmin * (float)sub[16 + r];
                    out[s * 256 + j * 32 + e] = x;
                }
            }
        }
        return;
    }
    const int64_t nb = k / 32, g = row / G16;
    const int r = (int)(row % G16);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *rec = wp + (g * nb + b) * rb;
        const float d = f16_to_f32(((const uint16_t *)rec)[r]), o = f16_to_f32(((const uint16_t *)(rec + 32))[r]);
        const uint8_t *q = rec + 64;
        for (int e = 0; e < 32; ++e) {
            float v;
            if (type == GGML_Q8_0) {
                v = d * (float)((int)q[(e / 4) * 64 + 4 * r + e % 4] - 128);
            } else {
                const int v4 = e / 8, high = (e % 8) >= 4, byte = q[v4 * 64 + 4 * r + e % 4];
                int nib = high ? byte >> 4 : byte & 15;
                if (type == GGML_Q5_0 || type == GGML_Q5_1) nib |= ((q[256 + 4 * r + e % 4] >> (2 * v4 + high)) & 1) << 4;
                v = type == GGML_Q4_0 ? d * (float)(nib - 8) : type == GGML_Q5_0 ? d * (float)(nib - 16) : d * (float)nib + o;
            }
            out[b * 32 + e] = v;
        }
    }
}

int quant_rows16(int type, const uint8_t *wp, int64_t k, const int64_t *ids, int64_t n_ids, void *out, int out_bf16) {
    if (!rec16_bytes(type) || k % qblock_elems(type)) return -1;
    for (int64_t i = 0; i < n_ids; ++i) {
        float v[k];
        repacked_row(type, wp, k, ids[i], v);
        for (int64_t e = 0; e < k; ++e) {
            if (out_bf16) ((uint16_t *)out)[i * k + e] = f32_to_bf16(v[e]);
            else ((float *)out)[i * k + e] = v[e];
        }
    }
    return 0;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define HAVE_REPACK16 1

/* Vector p (0-3) of a Q4_0 / Q4_1 / Q5_0 / Q5_1 record's weights as bytes: *vl the elements
   8p + b, *vh the elements 8p + 4 + b (b = 0-3) of the 16 rows, 4 bytes a row. */
static inline __attribute__((always_inline)) void g16_vectors(const int T, const uint8_t *rec, int p,
        __m512i *vl, __m512i *vh) {
    const __m512i low = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1);
    const __m512i v = _mm512_loadu_si512((const void *)(rec + 64 + 64 * p));
    *vl = _mm512_and_si512(v, low);
    *vh = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    if (T == GGML_Q5_0 || T == GGML_Q5_1) {
        const __m512i h = _mm512_srli_epi16(_mm512_loadu_si512((const void *)(rec + 64 + 256)), 2 * p);
        *vl = _mm512_or_si512(*vl, _mm512_slli_epi16(_mm512_and_si512(h, one), 4));
        *vh = _mm512_or_si512(*vh, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, 1), one), 4));
    }
}

/* The same for the record `sub` of one K-quant sub-block. */
static inline __attribute__((always_inline)) void g16k_vectors(const int T, const uint8_t *sub, int p,
        __m512i *vl, __m512i *vh) {
    const __m512i low = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1), three = _mm512_set1_epi8(3);
    const __m512i v = _mm512_loadu_si512((const void *)(sub + 32 + 64 * p));
    *vl = _mm512_and_si512(v, low);
    *vh = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    if (T == GGML_Q5_K) {
        const __m512i h = _mm512_srli_epi16(_mm512_loadu_si512((const void *)(sub + 32 + 256)), 2 * p);
        *vl = _mm512_or_si512(*vl, _mm512_slli_epi16(_mm512_and_si512(h, one), 4));
        *vh = _mm512_or_si512(*vh, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, 1), one), 4));
    } else if (T == GGML_Q6_K) {
        __m512i h = _mm512_loadu_si512((const void *)(sub + 32 + 256 + 64 * (p >> 1)));
        if (p & 1) h = _mm512_srli_epi16(h, 4);
        *vl = _mm512_or_si512(*vl, _mm512_slli_epi16(_mm512_and_si512(h, three), 4));
        *vh = _mm512_or_si512(*vh, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, 2), three), 4));
    }
}

/* A K-quant sub-block's scales over the 16 rows, in float32 as the row kernel has them: *sa is
   d * sc (Q6_K: that of elements 0-15); *sb Q6_K's d * sc of elements 16-31, else the offset
   -(dmin * m). */
static inline __attribute__((always_inline)) void g16k_scales(const int T, const uint8_t *sub, __m512 d, __m512 dmin,
        __m512 *sa, __m512 *sb) {
    if (T == GGML_Q6_K) {
        *sa = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)sub))));
        *sb = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sub + 16)))));
    } else {
        *sa = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sub))));
        *sb = _mm512_sub_ps(_mm512_setzero_ps(),
            _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sub + 16))))));
    }
}

/* One group of 16 weight rows x rm rows of x (x as quant_x left it): acc[i] lane r = y[i][row r]. */
static inline __attribute__((always_inline)) void g16_tile(const int T, const int rm, const uint8_t *wp, int64_t nb,
        const int8_t *xq, int64_t k, const float *xd, const float *xs, __m512 *acc) {
    const int rb = rec16_bytes(T);
    for (int i = 0; i < rm; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *rec = wp + b * rb;
        if (b + 4 < nb) _mm_prefetch((const char *)(rec + 4 * rb), _MM_HINT_T0);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rec));
        const __m512 o = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 32)));
        __m512i lo[RM_MAX], hi[RM_MAX]; /* two chains per row of x: half the dependent vpdpbusd */
        for (int i = 0; i < rm; ++i) lo[i] = hi[i] = _mm512_setzero_si512();
        if (T == GGML_Q8_0) {
            for (int t = 0; t < 8; ++t) {
                const __m512i v = _mm512_loadu_si512((const void *)(rec + 64 + 64 * t));
                for (int i = 0; i < rm; ++i) {
                    int32_t x4;
                    memcpy(&x4, xq + i * k + b * 32 + 4 * t, 4);
                    if (t & 1) hi[i] = _mm512_dpbusd_epi32(hi[i], v, _mm512_set1_epi32(x4));
                    else lo[i] = _mm512_dpbusd_epi32(lo[i], v, _mm512_set1_epi32(x4));
                }
            }
        } else {
            for (int p = 0; p < 4; ++p) {
                __m512i vl, vh;
                g16_vectors(T, rec, p, &vl, &vh);
                for (int i = 0; i < rm; ++i) {
                    int32_t xa, xb;
                    memcpy(&xa, xq + i * k + b * 32 + 8 * p, 4);
                    memcpy(&xb, xq + i * k + b * 32 + 8 * p + 4, 4);
                    lo[i] = _mm512_dpbusd_epi32(lo[i], vl, _mm512_set1_epi32(xa));
                    hi[i] = _mm512_dpbusd_epi32(hi[i], vh, _mm512_set1_epi32(xb));
                }
            }
        }
        for (int i = 0; i < rm; ++i) {
            const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(lo[i], hi[i]));
            acc[i] = _mm512_fmadd_ps(dot, _mm512_mul_ps(d, _mm512_set1_ps(xd[i * nb + b])), acc[i]);
            acc[i] = _mm512_fmadd_ps(o, _mm512_set1_ps(xs[(i * nb + b) * 4 + 2]), acc[i]);
        }
    }
}

/* The same for a K-quant group (nb: k / 32; the records are per super-block of 256). Q4_K and
   Q5_K: one scale and one min per sub-block (two chains: low and high nibbles); Q6_K: a scale
   per half sub-block (chains: elements 0-15, 16-31), its -32 per half. */
static inline __attribute__((always_inline)) void g16k_tile(const int T, const int rm, const uint8_t *wp, int64_t nb,
        const int8_t *xq, int64_t k, const float *xd, const float *xs, __m512 *acc) {
    const int rb = rec16_bytes(T), sbytes = k16_sub_bytes(T);
    for (int i = 0; i < rm; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t s = 0; s < nb / 8; ++s) {
        const uint8_t *rec = wp + s * rb;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rec));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 32)));
        for (int j = 0; j < 8; ++j) {
            const uint8_t *sub = rec + 64 + j * sbytes;
            for (int f = 0; f < sbytes; f += 64) _mm_prefetch((const char *)(sub + 2 * sbytes + f), _MM_HINT_T0);
            __m512 sa, sb; /* Q6_K: the two halves' scales; else the scale and the offset */
            g16k_scales(T, sub, d, dmin, &sa, &sb);
            __m512i c0[RM_MAX], c1[RM_MAX];
            for (int i = 0; i < rm; ++i) c0[i] = c1[i] = _mm512_setzero_si512();
            for (int p = 0; p < 4; ++p) {
                __m512i vl, vh;
                g16k_vectors(T, sub, p, &vl, &vh);
                for (int i = 0; i < rm; ++i) {
                    int32_t xa, xb;
                    memcpy(&xa, xq + i * k + (s * 8 + j) * 32 + 8 * p, 4);
                    memcpy(&xb, xq + i * k + (s * 8 + j) * 32 + 8 * p + 4, 4);
                    if (T == GGML_Q6_K && p >= 2) {
                        c1[i] = _mm512_dpbusd_epi32(c1[i], vl, _mm512_set1_epi32(xa));
                        c1[i] = _mm512_dpbusd_epi32(c1[i], vh, _mm512_set1_epi32(xb));
                    } else if (T == GGML_Q6_K) {
                        c0[i] = _mm512_dpbusd_epi32(c0[i], vl, _mm512_set1_epi32(xa));
                        c0[i] = _mm512_dpbusd_epi32(c0[i], vh, _mm512_set1_epi32(xb));
                    } else {
                        c0[i] = _mm512_dpbusd_epi32(c0[i], vl, _mm512_set1_epi32(xa));
                        c1[i] = _mm512_dpbusd_epi32(c1[i], vh, _mm512_set1_epi32(xb));
                    }
                }
            }
            for (int i = 0; i < rm; ++i) {
                const int64_t xb = s * 8 + j;
                const __m512 dx = _mm512_set1_ps(xd[i * nb + xb]);
                const float *xsp = xs + (i * nb + xb) * 4;
                if (T == GGML_Q6_K) {
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c0[i]), _mm512_mul_ps(sa, dx), acc[i]);
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c1[i]), _mm512_mul_ps(sb, dx), acc[i]);
                    acc[i] = _mm512_fmadd_ps(sa, _mm512_set1_ps(-32.0f * xsp[0]), acc[i]);
                    acc[i] = _mm512_fmadd_ps(sb, _mm512_set1_ps(-32.0f * xsp[1]), acc[i]);
                } else {
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(c0[i], c1[i])), _mm512_mul_ps(sa, dx), acc[i]);
                    acc[i] = _mm512_fmadd_ps(sb, _mm512_set1_ps(xsp[2]), acc[i]);
                }
            }
        }
    }
}

/* Many rows of x (prompts, batches): the tiles above unpack a group's blocks again for every
   RM_MAX rows of x. Instead each thread unpacks a slice of k of its group once into a scratch
   of plain bytes and float scales (L1), then runs the rows of x against it, XR at a time (16
   on AMX, below), their partial sums kept between slices in memory. Per 32-element block the scratch holds 8 vectors
   of unsigned q (vector t: elements 4t .. 4t + 3 of each row, 4 bytes a row), then the two
   float vectors the tiles above scale with: a (d; a K-quant's d * sc; Q6_K's of elements 0-15)
   and b (the offset o; a K-quant's -(dmin * m); Q6_K's scale of elements 16-31). Each output
   gets the same float operations in the same order as there (integer sums split into other
   chains are the same integers): the same bits whatever m. */
#define SCR_BLOCK (512 + 128)
#define SCR_BLOCKS 32 /* blocks per slice of k (a multiple of a K-quant's 8): 20 KiB */
#define XR 8          /* rows of x per scratch tile: 8 accumulators and 8 integer chains */
#define SCR_MIN_ROWS 16 /* fewer rows run the in-register tiles (measured: docs/kernels.md) */
#define SCR_X_ROWS 256  /* rows of x per unpacking of the weights (256 x k int8 in L2) */

static inline __attribute__((always_inline)) void g16_unpack(const int T, const uint8_t *wp, int64_t b0, int64_t kn,
        uint8_t *scr) {
    const int rb = rec16_bytes(T);
    if (k16_sub_bytes(T)) {
        const int sbytes = k16_sub_bytes(T);
        for (int64_t s = b0 / 8; s < (b0 + kn) / 8; ++s) {
            const uint8_t *rec = wp + s * rb;
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rec));
            const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 32)));
            for (int j = 0; j < 8; ++j) {
                const uint8_t *sub = rec + 64 + j * sbytes;
                uint8_t *out = scr + (s * 8 + j - b0) * SCR_BLOCK;
                for (int f = 0; f < sbytes; f += 64) _mm_prefetch((const char *)(sub + 2 * sbytes + f), _MM_HINT_T0);
                __m512 sa, sb;
                g16k_scales(T, sub, d, dmin, &sa, &sb);
                _mm512_store_ps((float *)(out + 512), sa);
                _mm512_store_ps((float *)(out + 576), sb);
                for (int p = 0; p < 4; ++p) {
                    __m512i vl, vh;
                    g16k_vectors(T, sub, p, &vl, &vh);
                    _mm512_store_si512((void *)(out + 128 * p), vl);
                    _mm512_store_si512((void *)(out + 128 * p + 64), vh);
                }
            }
        }
        return;
    }
    for (int64_t b = b0; b < b0 + kn; ++b) {
        const uint8_t *rec = wp + b * rb;
        uint8_t *out = scr + (b - b0) * SCR_BLOCK;
        for (int f = 0; f < rb; f += 64) _mm_prefetch((const char *)(rec + 4 * rb + f), _MM_HINT_T0);
        _mm512_store_ps((float *)(out + 512), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rec)));
        _mm512_store_ps((float *)(out + 576), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 32))));
        if (T == GGML_Q8_0) {
            memcpy(out, rec + 64, 512);
            continue;
        }
        for (int p = 0; p < 4; ++p) {
            __m512i vl, vh;
            g16_vectors(T, rec, p, &vl, &vh);
            _mm512_store_si512((void *)(out + 128 * p), vl);
            _mm512_store_si512((void *)(out + 128 * p + 64), vh);
        }
    }
}

/* rm rows of x against kn scratch blocks; acc_mem holds the rows' partial sums (16 floats a
   row) in and out. six: Q6_K's two half-block scales. xd / xs rows are nb blocks apart. */
static inline __attribute__((always_inline)) void g16s_tile(const int six, const int rm, const uint8_t *scr, int64_t kn,
        const int8_t *xq, int64_t k, const float *xd, const float *xs, int64_t nb, float *acc_mem) {
    __m512 acc[XR];
    for (int i = 0; i < rm; ++i) acc[i] = _mm512_load_ps(acc_mem + 16 * i);
    for (int64_t b = 0; b < kn; ++b) {
        const uint8_t *rec = scr + b * SCR_BLOCK;
        const __m512 fa = _mm512_load_ps((const float *)(rec + 512)), fb = _mm512_load_ps((const float *)(rec + 576));
        __m512i c[XR]; /* one chain per row of x: XR independent chains */
        for (int i = 0; i < rm; ++i) c[i] = _mm512_setzero_si512();
        for (int t = 0; t < 8; ++t) {
            const __m512i v = _mm512_load_si512((const void *)(rec + 64 * t));
            for (int i = 0; i < rm; ++i) {
                int32_t x4;
                memcpy(&x4, xq + i * k + b * 32 + 4 * t, 4);
                c[i] = _mm512_dpbusd_epi32(c[i], v, _mm512_set1_epi32(x4));
            }
            if (six && t == 3) /* Q6_K: elements 0-15 scaled apart from 16-31 */
                for (int i = 0; i < rm; ++i) {
                    acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[i]), _mm512_mul_ps(fa, _mm512_set1_ps(xd[i * nb + b])), acc[i]);
                    c[i] = _mm512_setzero_si512();
                }
        }
        for (int i = 0; i < rm; ++i) {
            const __m512 dx = _mm512_set1_ps(xd[i * nb + b]);
            const float *xsp = xs + (i * nb + b) * 4;
            if (six) {
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[i]), _mm512_mul_ps(fb, dx), acc[i]);
                acc[i] = _mm512_fmadd_ps(fa, _mm512_set1_ps(-32.0f * xsp[0]), acc[i]);
                acc[i] = _mm512_fmadd_ps(fb, _mm512_set1_ps(-32.0f * xsp[1]), acc[i]);
            } else {
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[i]), _mm512_mul_ps(fa, dx), acc[i]);
                acc[i] = _mm512_fmadd_ps(fb, _mm512_set1_ps(xsp[2]), acc[i]);
            }
        }
    }
    for (int i = 0; i < rm; ++i) _mm512_store_ps(acc_mem + 16 * i, acc[i]);
}

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
/* AMX (Sapphire Rapids on): 16 rows of x against a scratch slice, one tile dot product per
   block (tdpbsud: x's int8 rows against the scratch's unsigned q, which is laid out as AMX's B
   tile wants, 4 bytes of each of the 16 weight rows per 64-byte row). Its int32 sums are
   vpdpbusd's (exact integers); they leave through memory and are scaled per row of x by the
   float operations of the vector tiles, in the same order. Two dot products in flight: blocks
   b and b + 1, or Q6_K's two halves of block b. */
#define HAVE_AMX_INT8 1
typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) amx_tilecfg;

/* Linux hands out AMX state only to a process that asks (once; the grant is per process). */
static int amx_state = 0; /* 0: not asked yet, 1: granted and used, -1: refused or turned off */
static int amx_ready(void) {
    int s = __atomic_load_n(&amx_state, __ATOMIC_RELAXED);
    if (!s) {
        s = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0 ? 1 : -1;
        __atomic_store_n(&amx_state, s, __ATOMIC_RELAXED);
    }
    return s > 0;
}

/* Tile state is per thread. tmm0 / tmm3: 16 rows of x (a block's 32 bytes; Q6_K a half's 16),
   tmm1 / tmm4: the scratch's q (8 rows of 64 bytes; Q6_K 4), tmm2 / tmm5 and tmm6 / tmm7: the
   int32 sums (16 x 16) of two steps. */
static void amx_setup(int six) {
    amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; ++t) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    cfg.colsb[0] = cfg.colsb[3] = six ? 16 : 32;
    cfg.rows[1] = cfg.rows[4] = six ? 4 : 8;
    _tile_loadconfig(&cfg);
}

/* One scratch block's int32 sums (dots: 16 rows of x x 16 weight rows; Q6_K: its two halves)
   into the 16 rows' accumulators, with g16s_tile's float operations. */
static inline __attribute__((always_inline)) void amx_scale(const int six, const int32_t *d0, const int32_t *d1,
        const uint8_t *rec, const float *xd, const float *xs, int64_t nb, int64_t b, __m512 *acc) {
    const __m512 fa = _mm512_load_ps((const float *)(rec + 512)), fb = _mm512_load_ps((const float *)(rec + 576));
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
        const __m512 dx = _mm512_set1_ps(xd[i * nb + b]);
        const float *xsp = xs + (i * nb + b) * 4;
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)(d0 + 16 * i))),
                                 _mm512_mul_ps(fa, dx), acc[i]);
        if (six) {
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)(d1 + 16 * i))),
                                     _mm512_mul_ps(fb, dx), acc[i]);
            acc[i] = _mm512_fmadd_ps(fa, _mm512_set1_ps(-32.0f * xsp[0]), acc[i]);
            acc[i] = _mm512_fmadd_ps(fb, _mm512_set1_ps(-32.0f * xsp[1]), acc[i]);
        } else {
            acc[i] = _mm512_fmadd_ps(fb, _mm512_set1_ps(xsp[2]), acc[i]);
        }
    }
}

/* g16s_tile for 16 rows of x (amx_setup(six) done by the calling thread). Pipelined over
   steps (blocks b, b + 1; Q6_K: block b): step s's dot products go into tmm2 / tmm5 or tmm6 /
   tmm7 by its parity while step s - 1's leave the other pair for memory and step s - 2's,
   there already, are scaled. */
#define AMX_STEP(C0, C1, S0, S1, P) do { \
    const int live = b < kn, two = live && (six || b + 1 < kn); \
    if (live) { \
        _tile_loadd(0, xq + b * 32, k); \
        _tile_loadd(1, scr + b * SCR_BLOCK, 64); \
        _tile_zero(C0); \
        _tile_dpbsud(C0, 0, 1); \
    } \
    if (two) { \
        _tile_loadd(3, xq + b * 32 + (six ? 16 : 32), k); \
        _tile_loadd(4, scr + b * SCR_BLOCK + (six ? 256 : SCR_BLOCK), 64); \
        _tile_zero(C1); \
        _tile_dpbsud(C1, 3, 4); \
    } \
    if (h1 >= 0) { \
        _tile_stored(S0, dots[(P) ^ 1][0], 64); \
        if (h1_two) _tile_stored(S1, dots[(P) ^ 1][1], 64); \
    } \
    if (h2 >= 0) { \
        const uint8_t *rec = scr + h2 * SCR_BLOCK; \
        amx_scale(six, dots[P][0], dots[P][1], rec, xd, xs, nb, h2, acc); \
        if (!six && h2_two) amx_scale(0, dots[P][1], 0, rec + SCR_BLOCK, xd, xs, nb, h2 + 1, acc); \
    } \
    if (!live && h1 < 0) goto done; \
    h2 = h1; \
    h2_two = h1_two; \
    h1 = live ? b : -1; \
    h1_two = two; \
    b += six ? 1 : 2; \
} while (0)
static inline __attribute__((always_inline)) void amx_tile(const int six, const uint8_t *scr, int64_t kn,
        const int8_t *xq, int64_t k, const float *xd, const float *xs, int64_t nb, float *acc_mem) {
    int32_t dots[2][2][256] __attribute__((aligned(64))); /* [step parity][first, second dot product] */
    __m512 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_load_ps(acc_mem + 16 * i);
    /* h1: the first block of step s - 1 (its sums still in tiles), h2: of step s - 2; -1: none */
    int64_t h1 = -1, h2 = -1, b = 0;
    int h1_two = 0, h2_two = 0;
    for (;;) {
        AMX_STEP(2, 5, 6, 7, 0);
        AMX_STEP(6, 7, 2, 5, 1);
    }
done:
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) _mm512_store_ps(acc_mem + 16 * i, acc[i]);
}
#undef AMX_STEP
static void amx_tile_0(const uint8_t *scr, int64_t kn, const int8_t *xq, int64_t k, const float *xd, const float *xs,
                       int64_t nb, float *acc) { amx_tile(0, scr, kn, xq, k, xd, xs, nb, acc); }
static void amx_tile_1(const uint8_t *scr, int64_t kn, const int8_t *xq, int64_t k, const float *xd, const float *xs,
                       int64_t nb, float *acc) { amx_tile(1, scr, kn, xq, k, xd, xs, nb, acc); }
#else
#define HAVE_AMX_INT8 0
static int amx_state = -1;
static int amx_ready(void) { return 0; }
#endif

/* Whether quant_linear16 runs 16 rows of x at a time on AMX where it can: mode 0 turns that off,
   1 on (where this CPU and the kernel allow), -1 only asks. Returns the state after. */
int quant_amx(int mode) {
    if (mode == 0) __atomic_store_n(&amx_state, -1, __ATOMIC_RELAXED);
    if (mode == 1 && HAVE_AMX_INT8) __atomic_store_n(&amx_state, 0, __ATOMIC_RELAXED);
    return amx_ready();
}

typedef void (*g16_fn)(const uint8_t *, int64_t, const int8_t *, int64_t, const float *, const float *, __m512 *);
typedef void (*g16u_fn)(const uint8_t *, int64_t, int64_t, uint8_t *);
typedef void (*g16s_fn)(const uint8_t *, int64_t, const int8_t *, int64_t, const float *, const float *, int64_t, float *);
typedef struct {
    g16_fn tile[RM_MAX + 1]; /* in registers, by rows of x */
    g16u_fn unpack;          /* to the scratch */
    int six;                 /* Q6_K's scratch tiles */
} g16_kernels;
#define G16FN(T, M) static void g16_##T##_##M(const uint8_t *wp, int64_t nb, const int8_t *xq, int64_t k, \
    const float *xd, const float *xs, __m512 *acc) { \
    if (k16_sub_bytes(T)) g16k_tile(T, M, wp, nb, xq, k, xd, xs, acc); else g16_tile(T, M, wp, nb, xq, k, xd, xs, acc); }
#define G16TYPE(T) G16FN(T, 1) G16FN(T, 2) G16FN(T, 3) G16FN(T, 4) \
    static void g16u_##T(const uint8_t *wp, int64_t b0, int64_t kn, uint8_t *scr) { g16_unpack(T, wp, b0, kn, scr); } \
    static const g16_kernels G16_##T = {{0, g16_##T##_1, g16_##T##_2, g16_##T##_3, g16_##T##_4}, g16u_##T, T == GGML_Q6_K};
G16TYPE(GGML_Q4_0) G16TYPE(GGML_Q4_1) G16TYPE(GGML_Q5_0) G16TYPE(GGML_Q5_1) G16TYPE(GGML_Q8_0)
G16TYPE(GGML_Q4_K) G16TYPE(GGML_Q5_K) G16TYPE(GGML_Q6_K)
#define G16SFN(S, M) static void g16s_##S##_##M(const uint8_t *scr, int64_t kn, const int8_t *xq, int64_t k, \
    const float *xd, const float *xs, int64_t nb, float *acc) { g16s_tile(S, M, scr, kn, xq, k, xd, xs, nb, acc); }
#define G16SFNS(S) G16SFN(S, 1) G16SFN(S, 2) G16SFN(S, 3) G16SFN(S, 4) G16SFN(S, 5) G16SFN(S, 6) G16SFN(S, 7) G16SFN(S, 8)
G16SFNS(0) G16SFNS(1)
#define G16STAB(S) {0, g16s_##S##_1, g16s_##S##_2, g16s_##S##_3, g16s_##S##_4, g16s_##S##_5, g16s_##S##_6, \
                    g16s_##S##_7, g16s_##S##_8}
static const g16s_fn G16S[2][XR + 1] = {G16STAB(0), G16STAB(1)};

static const g16_kernels *g16_of(int type) {
    switch (type) {
    case GGML_Q4_0: return &G16_GGML_Q4_0;
    case GGML_Q4_1: return &G16_GGML_Q4_1;
    case GGML_Q5_0: return &G16_GGML_Q5_0;
    case GGML_Q5_1: return &G16_GGML_Q5_1;
    case GGML_Q8_0: return &G16_GGML_Q8_0;
    case GGML_Q4_K: return &G16_GGML_Q4_K;
    case GGML_Q5_K: return &G16_GGML_Q5_K;
    case GGML_Q6_K: return &G16_GGML_Q6_K;
    }
    return 0;
}

static void store_row16(const float *out, int64_t rn, void *y, int64_t at, int y_bf16) {
    for (int64_t r = 0; r < rn; ++r) {
        if (y_bf16) ((uint16_t *)y)[at + r] = f32_to_bf16(out[r]);
        else ((float *)y)[at + r] = out[r];
    }
}

/* Rows m0 .. m1 - 1 of y's columns n0 .. n0 + rn - 1 from one group (wg): the in-register
   tiles, RM_MAX rows of x at a time. */
static void g16_group_regs(const g16_kernels *kern, const uint8_t *wg, int64_t nb, const int8_t *xq, int64_t k,
        const float *xd, const float *xs, int64_t m0, int64_t m1, int64_t n0, int64_t rn, void *y, int64_t ldy,
        int y_bf16) {
    for (int64_t i0 = m0; i0 < m1; i0 += RM_MAX) {
        const int rm = (int)(m1 - i0 < RM_MAX ? m1 - i0 : RM_MAX);
        __m512 acc[RM_MAX];
        kern->tile[rm](wg, nb, xq + i0 * k, k, xd + i0 * nb, xs + i0 * nb * 4, acc);
        for (int i = 0; i < rm; ++i) {
            float out[G16];
            _mm512_storeu_ps(out, acc[i]);
            store_row16(out, rn, y, (i0 + i) * ldy + n0, y_bf16);
        }
    }
}

/* The same through the scratch: each slice of k unpacked once, then every row of x against it
   (16 at a time on AMX where amx, the calling thread's tiles set up; else XR at a time). */
static void g16_group_scratch(const g16_kernels *kern, int amx, const uint8_t *wg, int64_t nb, const int8_t *xq,
        int64_t k, const float *xd, const float *xs, int64_t m0, int64_t m1, int64_t n0, int64_t rn, void *y,
        int64_t ldy, int y_bf16) {
    uint8_t scr[SCR_BLOCKS * SCR_BLOCK] __attribute__((aligned(64)));
    float acc[SCR_X_ROWS * G16] __attribute__((aligned(64)));
    memset(acc, 0, sizeof acc);
    for (int64_t b0 = 0; b0 < nb; b0 += SCR_BLOCKS) {
        const int64_t kn = nb - b0 < SCR_BLOCKS ? nb - b0 : SCR_BLOCKS;
        kern->unpack(wg, b0, kn, scr);
        for (int64_t i0 = m0; i0 < m1;) {
            const int8_t *xr = xq + i0 * k + b0 * 32;
            const float *dr = xd + i0 * nb + b0, *sr = xs + (i0 * nb + b0) * 4;
            float *ar = acc + (i0 - m0) * G16;
#if HAVE_AMX_INT8
            if (amx && m1 - i0 >= G16) {
                (kern->six ? amx_tile_1 : amx_tile_0)(scr, kn, xr, k, dr, sr, nb, ar);
                i0 += G16;
                continue;
            }
#else
            (void)amx;
#endif
            const int rm = (int)(m1 - i0 < XR ? m1 - i0 : XR);
            G16S[kern->six][rm](scr, kn, xr, k, dr, sr, nb, ar);
            i0 += rm;
        }
    }
    for (int64_t i = m0; i < m1; ++i) store_row16(acc + (i - m0) * G16, rn, y, i * ldy + n0, y_bf16);
}

/* y[m, n] = x @ W^T on a repacked W (quant_repack16), x as quant_x left it. Threads split the
   16-row groups; each output is one lane's sum over k in block order, whatever m or thread. */
int quant_linear16(int type, const int8_t *xq, const float *xd, const float *xs, int64_t m, int64_t k,
                   const uint8_t *wp, int64_t n, void *y, int64_t ldy, int y_bf16) {
    const g16_kernels *kern = g16_of(type);
    if (!kern || k <= 0 || k % qblock_elems(type) || m < 0 || n < 0) return -1;
    const int64_t nb = k / 32, groups = (n + G16 - 1) / G16, rec_group = k / qblock_elems(type) * rec16_bytes(type);
    const int amx = m >= G16 && amx_ready();
    const int64_t xrows = m >= SCR_MIN_ROWS ? SCR_X_ROWS : X_BLOCK_ROWS;
    OMP(omp parallel num_threads(kernel_nthreads) if (groups >= 2))
    {
#if HAVE_AMX_INT8
        if (amx) amx_setup(kern->six); /* tile state is per thread */
#endif
        for (int64_t m0 = 0; m0 < m; m0 += xrows) {
            const int64_t m1 = m - m0 < xrows ? m : m0 + xrows;
            OMP(omp for schedule(static))
            for (int64_t g = 0; g < groups; ++g) {
                const int64_t n0 = g * G16, rn = n - n0 < G16 ? n - n0 : G16;
                if (m1 - m0 >= SCR_MIN_ROWS)
                    g16_group_scratch(kern, amx, wp + g * rec_group, nb, xq, k, xd, xs, m0, m1, n0, rn, y, ldy, y_bf16);
                else
                    g16_group_regs(kern, wp + g * rec_group, nb, xq, k, xd, xs, m0, m1, n0, rn, y, ldy, y_bf16);
            }
        }
#if HAVE_AMX_INT8
        if (amx) _tile_release();
#endif
    }
    return 0;
}
#else
#define HAVE_REPACK16 0
int quant_linear16(int type, const int8_t *xq, const float *xd, const float *xs, int64_t m, int64_t k,
                   const uint8_t *wp, int64_t n, void *y, int64_t ldy, int y_bf16) {
    (void)type; (void)xq; (void)xd; (void)xs; (void)m; (void)k; (void)wp; (void)n; (void)y; (void)ldy; (void)y_bf16;
    return -1;
}
int quant_amx(int mode) { (void)mode; return 0; }
#endif
int quant_has_repack16(void) { return HAVE_REPACK16; }

/* ---------------------------------------------------------------- rows (the embedding) */

/* One block's 32 * subs weights as floats, computed as gguf's numpy dequantizers do (the same
   roundings: (d * q) + m, (d * sc) * q - dmin * m, ...). */
static void dequant_block(int type, const uint8_t *p, float *out) {
    switch (type) {
    case GGML_Q4_0: { const blk_q4_0 *b = (const blk_q4_0 *)p; const float d = f16_to_f32(b->d);
        for (int i = 0; i < 16; ++i) { out[i] = d * (float)((b->qs[i] & 15) - 8); out[i + 16] = d * (float)((b->qs[i] >> 4) - 8); }
        break; }
    case GGML_Q4_1: { const blk_q4_1 *b = (const blk_q4_1 *)p; const float d = f16_to_f32(b->d), mn = f16_to_f32(b->m);
        for (int i = 0; i < 16; ++i) { out[i] = d * (float)(b->qs[i] & 15) + mn; out[i + 16] = d * (float)(b->qs[i] >> 4) + mn; }
        break; }
    case GGML_Q5_0: { const blk_q5_0 *b = (const blk_q5_0 *)p; const float d = f16_to_f32(b->d); uint32_t h; memcpy(&h, b->qh, 4);
        for (int i = 0; i < 16; ++i) {
            out[i] = d * (float)((int)((b->qs[i] & 15) | ((h >> i & 1) << 4)) - 16);
            out[i + 16] = d * (float)((int)((b->qs[i] >> 4) | ((h >> (i + 16) & 1) << 4)) - 16);
        }
        break; }
    case GGML_Q5_1: { const blk_q5_1 *b = (const blk_q5_1 *)p; const float d = f16_to_f32(b->d), mn = f16_to_f32(b->m);
        uint32_t h; memcpy(&h, b->qh, 4);
        for (int i = 0; i < 16; ++i) {
            out[i] = d * (float)((b->qs[i] & 15) | ((h >> i & 1) << 4)) + mn;
            out[i + 16] = d * (float)((b->qs[i] >> 4) | ((h >> (i + 16) & 1) << 4)) + mn;
        }
        break; }
    case GGML_Q8_0: { const blk_q8_0 *b = (const blk_q8_0 *)p; const float d = f16_to_f32(b->d);
        for (int i = 0; i < 32; ++i) out[i] = d * (float)b->qs[i];
        break; }
    case GGML_Q4_K: case GGML_Q5_K: {
        const blk_q4_k *b = (const blk_q4_k *)p;
        const uint8_t *qs = type == GGML_Q4_K ? b->qs : ((const blk_q5_k *)p)->qs;
        const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
        for (int j = 0; j < 8; ++j) {
            int s, mn;
            k4_scale_min(b->scales, j, &s, &mn);
            const float ds = d * (float)s, dm = dmin * (float)mn;
            for (int l = 0; l < 32; ++l) {
                int q = (qs[32 * (j >> 1) + l] >> (4 * (j & 1))) & 15;
                if (type == GGML_Q5_K) q |= ((((const blk_q5_k *)p)->qh[l] >> j) & 1) << 4;
                out[32 * j + l] = ds * (float)q - dm;
            }
        }
        break; }
    case GGML_Q6_K: {
        const blk_q6_k *b = (const blk_q6_k *)p;
        const float d = f16_to_f32(b->d);
        for (int g = 0; g < 8; ++g) {
            const int h = g >> 2, i = g & 3;
            for (int l = 0; l < 32; ++l) {
                const int nib = (b->ql[64 * h + 32 * (i & 1) + l] >> (4 * (i >> 1))) & 15;
                const int top = (b->qh[32 * h + l] >> (2 * i)) & 3;
                const int e = 32 * g + l;
                out[e] = d * (float)b->scales[e / 16] * (float)((nib | top << 4) - 32);
            }
        }
        break; }
    default: memset(out, 0, 256 * sizeof(float)); /* not reached: quant_rows checks the type */
    }
}

/* out[i, :] = row ids[i] of W[., k] as floats (float32, or bfloat16 where out_bf16): an
   embedding lookup on the packed table. Returns 0, or -1 as quant_linear does. */
int quant_rows(int type, const uint8_t *w, int64_t k, const int64_t *ids, int64_t n_ids, void *out, int out_bf16) {
    if (!qblock_bytes(type) || k <= 0 || k % qblock_elems(type)) return -1;
    const int e = qblock_elems(type), bytes = qblock_bytes(type);
    const int64_t row_bytes = k / e * bytes;
    for (int64_t i = 0; i < n_ids; ++i) {
        const uint8_t *row = w + ids[i] * row_bytes;
        for (int64_t g = 0; g < k / e; ++g) {
            float v[256];
            dequant_block(type, row + g * bytes, v);
            for (int l = 0; l < e; ++l) {
                const int64_t at = i * k + g * e + l;
                if (out_bf16) ((uint16_t *)out)[at] = f32_to_bf16(v[l]);
                else ((float *)out)[at] = v[l];
            }
        }
    }
    return 0;
}
