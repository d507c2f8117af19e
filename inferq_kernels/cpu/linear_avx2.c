#include <immintrin.h>
#include <stdint.h>
#include "threads.h"

/* W[n,k] row-major -> [n/16 panels][k][16]: a panel is contiguous, one 64-byte line per k. */
int f32_pack(const float *w, int64_t n, int64_t k, float *out) {
    if (n % 16) return -1;
    for (int64_t nb = 0; nb < n / 16; ++nb)
        for (int64_t kk = 0; kk < k; ++kk)
            for (int c = 0; c < 16; ++c) out[(nb * k + kk) * 16 + c] = w[(nb * 16 + c) * k + kk];
    return 0;
}

#define KB 64 /* k summed in blocks of KB, the blocks added in order (rounding error like MKL's) */
#define DEFINE_MK(MR)                                                                            \
static void mk_##MR(const float *x, int64_t ldx, const float *b, int64_t k, int first,           \
                    const float *bias, float *y, int64_t ldy) {                                  \
    for (int64_t k0 = 0; k0 < k; k0 += KB) {                                                     \
        const int64_t k1 = k - k0 < KB ? k : k0 + KB;                                            \
        __m256 a0[MR], a1[MR];                                                                   \
        for (int r = 0; r < MR; ++r) { a0[r] = _mm256_setzero_ps(); a1[r] = _mm256_setzero_ps(); } \
        for (int64_t kk = k0; kk < k1; ++kk) {                                                   \
            if (first) _mm_prefetch((const char *)(b + (kk + 32) * 16), _MM_HINT_T0);            \
            const __m256 w0 = _mm256_loadu_ps(b + kk * 16), w1 = _mm256_loadu_ps(b + kk * 16 + 8); \
            for (int r = 0; r < MR; ++r) {                                                       \
                const __m256 xb = _mm256_broadcast_ss(x + r * ldx + kk);                         \
                a0[r] = _mm256_fmadd_ps(xb, w0, a0[r]);                                          \
                a1[r] = _mm256_fmadd_ps(xb, w1, a1[r]);                                          \
            }                                                                                    \
        }                                                                                        \
        for (int r = 0; r < MR; ++r) {                                                           \
            float *yr = y + r * ldy;                                                             \
            if (k0) { a0[r] = _mm256_add_ps(_mm256_loadu_ps(yr), a0[r]);                         \
                      a1[r] = _mm256_add_ps(_mm256_loadu_ps(yr + 8), a1[r]); }                   \
            if (k1 == k && bias) { a0[r] = _mm256_add_ps(a0[r], _mm256_loadu_ps(bias));           \
                                   a1[r] = _mm256_add_ps(a1[r], _mm256_loadu_ps(bias + 8)); }     \
            _mm256_storeu_ps(yr, a0[r]);                                                         \
            _mm256_storeu_ps(yr + 8, a1[r]);                                                     \
        }                                                                                        \
    }                                                                                            \
}
DEFINE_MK(1) DEFINE_MK(2) DEFINE_MK(3) DEFINE_MK(4) DEFINE_MK(5) DEFINE_MK(6)
typedef void (*mk_fn)(const float *, int64_t, const float *, int64_t, int, const float *, float *, int64_t);
static const mk_fn MK[7] = {0, mk_1, mk_2, mk_3, mk_4, mk_5, mk_6};

/* y[m,n] = x[m,k] @ W^T (+ bias): one 16-column panel at a time, streamed once (prefetched on
   the first row chunk), rows in chunks of 6 reusing the panel from L1/L2. Threads split the
   panels, and the rows too where the panels alone are too few for the threads (a narrow
   projection on a many-core server). Blocking the rows so the activations stay in L2, as the
   AVX-512 kernel does, was measured on a Zen 3 and was no faster (1.15x slower at 128-256 rows). */
int f32_linear(const float *x, int64_t ldx, int64_t m, const float *wp, int64_t n, int64_t k,
               const float *bias, float *y, int64_t ldy) {
    if (n % 16 || m <= 0) return -1;
    const int64_t panels = n / 16, mc = row_block(m, m, panels, 6), blocks = (m + mc - 1) / mc;
    OMP(omp parallel for collapse(2) schedule(static) num_threads(kernel_nthreads))
    for (int64_t rb = 0; rb < blocks; ++rb)
        for (int64_t nb = 0; nb < panels; ++nb) {
            const float *b = wp + nb * k * 16;
            const int64_t mb = rb * mc, me = m - mb < mc ? m : mb + mc;
            for (int64_t m0 = mb; m0 < me; m0 += 6) {
                const int mr = me - m0 < 6 ? (int)(me - m0) : 6;
                MK[mr](x + m0 * ldx, ldx, b, k, m0 == mb, bias ? bias + nb * 16 : 0, y + m0 * ldy + nb * 16, ldy);
            }
        }
    return 0;
}
