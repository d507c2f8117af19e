/* Greedy sampling on the CPU: the index of each row's largest logit (gpuworker/engine/sampler.py
   greedy_argmax). torch's argmax and max(dim) reduce element by element (~1.7-2.7 ns a logit:
   45-85 us for a 49,152-token vocabulary, ~1 % of a small model's batch-1 step); here one
   vectorised pass finds the row's maximum and a second, over the same row still in L2, its
   first position.
   torch.argmax's answer exactly: the first index among equal maxima (+0 and -0 are equal), and
   a row holding a NaN gives its first NaN (NaN counts as the largest). bfloat16 logits are
   widened to float32, which is exact. */
#include <stdint.h>
#include <string.h>
#include "threads.h"
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

static inline float bf16_to_f32(uint16_t x) {
    const uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The row's first NaN (called only where it has one). */
#define FIRST_NAN(LOAD)                                                                      \
    for (int64_t i = 0; i < n; ++i) {                                                        \
        const float v = LOAD(row, i);                                                        \
        if (v != v) return i;                                                                \
    }                                                                                        \
    return -1;

#define LOAD_F32(row, i) (row)[i]
#define LOAD_BF16(row, i) bf16_to_f32((row)[i])

/* A row with no NaN: the first index holding its maximum m. */
#define FIRST_EQUAL(LOAD)                                                                    \
    for (int64_t i = 0; i < n; ++i)                                                          \
        if (LOAD(row, i) == m) return i;                                                     \
    return 0;

#if defined(__AVX512F__)
#define LANES 16
typedef __m512 vf;
static inline vf load_f32(const float *p) { return _mm512_loadu_ps(p); }
static inline vf load_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline int any_nan(vf v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) != 0; }
static inline float hmax(vf v) { return _mm512_reduce_max_ps(v); }
static inline vf splat(float x) { return _mm512_set1_ps(x); }
static inline int first_eq(vf v, vf m) { /* lane of the first v == m, or -1 */
    const unsigned k = _mm512_cmp_ps_mask(v, m, _CMP_EQ_OQ);
    return k ? __builtin_ctz(k) : -1;
}
#elif defined(__AVX2__)
#define LANES 8
typedef __m256 vf;
static inline vf load_f32(const float *p) { return _mm256_loadu_ps(p); }
static inline vf load_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline int any_nan(vf v) { return _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0; }
static inline float hmax(vf v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}
static inline vf splat(float x) { return _mm256_set1_ps(x); }
static inline int first_eq(vf v, vf m) {
    const unsigned k = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(v, m, _CMP_EQ_OQ));
    return k ? __builtin_ctz(k) : -1;
}
#endif

/* One row of n values: its argmax. VLOAD widens LANES values to float32, LOAD one. */
#ifdef LANES
#define ROW_ARGMAX(NAME, T, VLOAD, LOAD)                                                      \
static int64_t NAME(const T *row, int64_t n) {                                                \
    const int64_t nv = n / LANES * LANES;                                                     \
    float m;                                                                                  \
    int nan = 0;                                                                              \
    if (nv) {                                                                                 \
        /* four chains of maxima; NaN is tested per vector (max drops it from one operand) */ \
        vf acc[4] = {VLOAD(row), VLOAD(row), VLOAD(row), VLOAD(row)};                         \
        nan = any_nan(acc[0]);                                                                \
        int64_t i = LANES;                                                                    \
        for (; i + 4 * LANES <= nv; i += 4 * LANES)                                           \
            for (int j = 0; j < 4; ++j) {                                                     \
                const vf v = VLOAD(row + i + j * LANES);                                      \
                nan |= any_nan(v);                                                            \
                acc[j] = vmax(acc[j], v);                                                     \
            }                                                                                 \
        for (; i < nv; i += LANES) {                                                          \
            const vf v = VLOAD(row + i);                                                      \
            nan |= any_nan(v);                                                                \
            acc[0] = vmax(acc[0], v);                                                         \
        }                                                                                     \
        m = hmax(vmax(vmax(acc[0], acc[1]), vmax(acc[2], acc[3])));                           \
    } else {                                                                                  \
        m = LOAD(row, 0);                                                                     \
    }                                                                                         \
    for (int64_t i = nv; i < n; ++i) {                                                        \
        const float v = LOAD(row, i);                                                         \
        nan |= v != v;                                                                        \
        m = v > m ? v : m;                                                                    \
    }                                                                                         \
    if (nan) { FIRST_NAN(LOAD) }                                                              \
    const vf mv = splat(m);                                                                   \
    for (int64_t i = 0; i < nv; i += LANES) {                                                 \
        const int lane = first_eq(VLOAD(row + i), mv);                                        \
        if (lane >= 0) return i + lane;                                                       \
    }                                                                                         \
    for (int64_t i = nv; i < n; ++i)                                                          \
        if (LOAD(row, i) == m) return i;                                                      \
    return 0;                                                                                 \
}
ROW_ARGMAX(row_argmax_f32, float, load_f32, LOAD_F32)
ROW_ARGMAX(row_argmax_bf16, uint16_t, load_bf16, LOAD_BF16)
#else
#define ROW_ARGMAX(NAME, T, LOAD)                                                             \
static int64_t NAME(const T *row, int64_t n) {                                                \
    float m = LOAD(row, 0);                                                                   \
    for (int64_t i = 0; i < n; ++i) {                                                         \
        const float v = LOAD(row, i);                                                         \
        if (v != v) { FIRST_NAN(LOAD) }                                                       \
        m = v > m ? v : m;                                                                    \
    }                                                                                         \
    FIRST_EQUAL(LOAD)                                                                         \
}
ROW_ARGMAX(row_argmax_f32, float, LOAD_F32)
ROW_ARGMAX(row_argmax_bf16, uint16_t, LOAD_BF16)
#endif

/* out[r] = argmax of row r (rows of n values, row r at x + r * ld). Returns 0, or -1 for n < 1. */
int argmax_rows_f32(const float *x, int64_t ld, int64_t rows, int64_t n, int64_t *out) {
    if (n < 1) return -1;
    SHARED(rows, rows > 1, for (int64_t r = lo; r < hi; ++r) out[r] = row_argmax_f32(x + r * ld, n););
    return 0;
}

int argmax_rows_bf16(const uint16_t *x, int64_t ld, int64_t rows, int64_t n, int64_t *out) {
    if (n < 1) return -1;
    SHARED(rows, rows > 1, for (int64_t r = lo; r < hi; ++r) out[r] = row_argmax_bf16(x + r * ld, n););
    return 0;
}

/* The kernels of this file that share their work in a step program's team (threads.h) */
const void *const team_kernels[] = {(const void *)argmax_rows_f32, (const void *)argmax_rows_bf16, 0};
