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
   and with AVX2 + FMA + F16C; the #if below picks the dot product. The row kernels here run
   float activations and the file's row layout; int8 activations run the 16-row layout
   (quant_repack16.h) of quant_g16_avx512.h or quant_g16_avx2.h. */
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
    SHARED(m, m > 1, for (int64_t r = lo; r < hi; ++r) {
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
    });
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

/* rn outputs of one row of y from at (float32, or bfloat16 where y_bf16). */
static void store_row16(const float *out, int64_t rn, void *y, int64_t at, int y_bf16) {
    for (int64_t r = 0; r < rn; ++r) {
        if (y_bf16) ((uint16_t *)y)[at + r] = f32_to_bf16(out[r]);
        else ((float *)y)[at + r] = out[r];
    }
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
    SHARED(tiles, n >= 2 * RN, for (int64_t m0 = 0; m0 < m; m0 += X_BLOCK_ROWS) {
        const int64_t m1 = m - m0 < X_BLOCK_ROWS ? m : m0 + X_BLOCK_ROWS;
        for (int64_t t = lo; t < hi; ++t) {
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
    });
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
    SHARED(tiles, n >= 2 * RN, for (int64_t m0 = 0; m0 < m; m0 += X_BLOCK_ROWS) {
        const int64_t m1 = m - m0 < X_BLOCK_ROWS ? m : m0 + X_BLOCK_ROWS;
        for (int64_t t = lo; t < hi; ++t) {
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
    });
    return 0;
}

#include "quant_repack16.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include "quant_g16_avx512.h"
#else
#include "quant_g16_avx2.h"
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

/* out[i, :] = row ids[i] of W[n, k] as floats (float32, or bfloat16 where out_bf16): an
   embedding lookup on the packed table. Returns 0, -1 as quant_linear does, or -2 for an id
   outside [0, n) (nothing written). */
int quant_rows(int type, const uint8_t *w, int64_t n, int64_t k, const int64_t *ids, int64_t n_ids, void *out,
               int out_bf16) {
    if (!qblock_bytes(type) || k <= 0 || k % qblock_elems(type)) return -1;
    for (int64_t i = 0; i < n_ids; ++i)
        if (ids[i] < 0 || ids[i] >= n) return -2;
    const int e = qblock_elems(type), bytes = qblock_bytes(type);
    const int64_t row_bytes = k / e * bytes;
    SHARED(n_ids, n_ids > 1, for (int64_t i = lo; i < hi; ++i) {
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
    });
    return 0;
}

/* The kernels of this file that share their work in a step program's team (threads.h) */
const void *const team_kernels[] = {(const void *)quant_x, (const void *)quant_linear, (const void *)quant_linear_f32,
                                    (const void *)quant_rows, (const void *)quant_linear16,
                                    (const void *)quant_rows16, 0};
