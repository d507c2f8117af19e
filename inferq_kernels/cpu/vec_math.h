/* Vector math shared by the kernels of more than one source (paged_decode.c, linear_avx512.c):
   one definition, so that SiLU-and-mul run on its own and SiLU-and-mul fused into the gate/up
   matmul give the same bits. Every FMA is written out as an intrinsic: the two sources are built
   with different contraction defaults (-std=c11 contracts nothing, -std=gnu11 everything). The
   loader inlines this file into each source before hashing and building it. */

/* The vector exp_neg's (exp_neg16, exp_neg8) range reduction r = x - n ln2 (ln2 in two parts)
   and degree-7 Taylor polynomial of e^r by Horner's rule, one FMA a step, for the intrinsic
   family P (_mm512 or _mm256): the scalar exp_neg's constants, in the same order. */
#define EXP_REDUCE(P, n, x) P##_fmadd_ps(n, P##_set1_ps(2.12194440e-4f), P##_fmadd_ps(n, P##_set1_ps(-0.693359375f), x))
#define EXP_POLY(P, r)                                                                           \
    P##_fmadd_ps(P##_fmadd_ps(P##_fmadd_ps(P##_fmadd_ps(P##_fmadd_ps(P##_fmadd_ps(P##_fmadd_ps(  \
        P##_set1_ps(1.0f / 5040.0f), r, P##_set1_ps(1.0f / 720.0f)), r, P##_set1_ps(1.0f / 120.0f)), \
        r, P##_set1_ps(1.0f / 24.0f)), r, P##_set1_ps(1.0f / 6.0f)), r, P##_set1_ps(0.5f)),        \
        r, P##_set1_ps(1.0f)), r, P##_set1_ps(1.0f))

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>
/* e^x for x <= 0 on 8 lanes (AVX2 + FMA): exp_neg16's operations */
static inline __m256 exp_neg8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 r = EXP_REDUCE(_mm256, n, x), p = EXP_POLY(_mm256, r);
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}
#endif

#if defined(__AVX512F__)
#include <immintrin.h>

/* e^x for x <= 0 on 16 lanes (x below -87 is taken as -87) */
static inline __m512 exp_neg16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = EXP_REDUCE(_mm512, n, x), p = EXP_POLY(_mm512, r);
    const __m512i e = _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23);
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), e));
}

#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define HAVE_SILU_ROWS 1
/* silu(x) = x / (1 + e^-x), written with e = exp(-|x|) <= 1 so that it cannot overflow:
   x / (1 + e) for x >= 0, x e / (1 + e) below (within an ulp or two of torch's silu) */
static inline __m512 silu16(__m512 x) {
    const __m512 e = exp_neg16(_mm512_castsi512_ps(
        _mm512_or_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u))));  /* -|x| */
    const __m512 num = _mm512_mask_mul_ps(x, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), x, e);
    return _mm512_div_ps(num, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* bf16 <-> fp32 on 16 lanes: the scalar bf2f / f2bf (round to nearest even; a NaN stays a NaN) */
static inline __m512 bf16x16_load(const uint16_t *p, __mmask16 k) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p)), 16));
}
static inline __m256i f32x16_to_bf16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

static inline __mmask16 first_lanes16(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }

/* o[i] = silu(g[i]) * u[i] over n values, torch's roundings: fp32 products as they fall; in
   bf16, silu rounded to bf16, then the product rounded (F.silu(gate).mul_(up)) */
static inline void silu_mul_row_f32(const float *g, const float *u, float *o, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = first_lanes16(n - i);
        const __m512 s = silu16(_mm512_maskz_loadu_ps(k, g + i));
        _mm512_mask_storeu_ps(o + i, k, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(k, u + i)));
    }
}
static inline void silu_mul_row_bf16(const uint16_t *g, const uint16_t *u, uint16_t *o, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 k = first_lanes16(n - i);
        const __m512 s = silu16(bf16x16_load(g + i, k));
        const __m512 sb = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(f32x16_to_bf16(s)), 16));
        _mm256_mask_storeu_epi16(o + i, k, f32x16_to_bf16(_mm512_mul_ps(sb, bf16x16_load(u + i, k))));
    }
}
#else
#define HAVE_SILU_ROWS 0
#endif
