#include <immintrin.h>
#include <stdint.h>
#include "threads.h"

/* W[n,k] row-major -> [n/16 panels][k][16]: a panel is contiguous, one 64-byte line per k. f16_pack:
   the same panels in float16 (a GGUF's F16 weights as stored: half the bytes), widened to float32
   in registers (F16C): the products and sums are those of the float32 panels of the same values. */
#define DEFINE_PACK(NAME, WT)                                                                    \
int NAME(const WT *w, int64_t n, int64_t k, WT *out) {                                           \
    if (n % 16) return -1;                                                                       \
    for (int64_t nb = 0; nb < n / 16; ++nb)                                                      \
        for (int64_t kk = 0; kk < k; ++kk)                                                       \
            for (int c = 0; c < 16; ++c) out[(nb * k + kk) * 16 + c] = w[(nb * 16 + c) * k + kk]; \
    return 0;                                                                                    \
}
DEFINE_PACK(f32_pack, float)
DEFINE_PACK(f16_pack, uint16_t)

#define KB 64 /* k summed in blocks of KB, the blocks added in order (rounding error like MKL's) */
#define MR_MAX 6 /* rows per micro-kernel call: 12 accumulators, 2 weight vectors, 1 broadcast */
#define X_BLOCK_BYTES (128 << 10) /* activations per row block: 96-192 KB measured best on a Zen 3 (L2 512 KB) */
#define L3_WEIGHT_BYTES (8 << 20) /* a weight up to this size is re-read from L3 (the rows-outer order) */
#define UNROLLED _Pragma("GCC unroll 8")

/* One k block of MR rows x 16 columns: y = (first block) or += x[:, block] @ panel[block]
   (+ bias after the last block). While it runs it prefetches npf lines of what comes next
   from pf (its share of the next k block, spread over the chunks of the row block), so the
   weight stream from DRAM overlaps the FMAs of every chunk, not only the first. */
#define W8_F32(p) _mm256_loadu_ps(p)
#define W8_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define DEFINE_MK(MR) DEFINE_MK_W(MR, float, W8_F32, )
#define DEFINE_MK_W(MR, WT, W8, SUFFIX)                                                          \
static void mk##SUFFIX##_##MR(const float *x, int64_t ldx, const WT *b, int64_t kn, int accumulate, \
                    const WT *pf, int64_t npf, const float *bias, float *y, int64_t ldy) {       \
    __m256 a0[MR], a1[MR];                                                                       \
    UNROLLED for (int r = 0; r < MR; ++r) { a0[r] = _mm256_setzero_ps(); a1[r] = _mm256_setzero_ps(); } \
    for (int64_t kk = 0; kk < kn; ++kk) {                                                        \
        if (kk < npf) _mm_prefetch((const char *)(pf + kk * 16), _MM_HINT_T0);                   \
        const __m256 w0 = W8(b + kk * 16), w1 = W8(b + kk * 16 + 8);                             \
        UNROLLED for (int r = 0; r < MR; ++r) {                                                  \
            const __m256 xb = _mm256_broadcast_ss(x + r * ldx + kk);                             \
            a0[r] = _mm256_fmadd_ps(xb, w0, a0[r]);                                              \
            a1[r] = _mm256_fmadd_ps(xb, w1, a1[r]);                                              \
        }                                                                                        \
    }                                                                                            \
    UNROLLED for (int r = 0; r < MR; ++r) {                                                      \
        float *yr = y + r * ldy;                                                                 \
        if (accumulate) { a0[r] = _mm256_add_ps(_mm256_loadu_ps(yr), a0[r]);                     \
                          a1[r] = _mm256_add_ps(_mm256_loadu_ps(yr + 8), a1[r]); }               \
        if (bias) { a0[r] = _mm256_add_ps(a0[r], _mm256_loadu_ps(bias));                         \
                    a1[r] = _mm256_add_ps(a1[r], _mm256_loadu_ps(bias + 8)); }                   \
        _mm256_storeu_ps(yr, a0[r]);                                                             \
        _mm256_storeu_ps(yr + 8, a1[r]);                                                         \
    }                                                                                            \
}
DEFINE_MK(1) DEFINE_MK(2) DEFINE_MK(3) DEFINE_MK(4) DEFINE_MK(5) DEFINE_MK(6)
#define DEFINE_MK16(MR) DEFINE_MK_W(MR, uint16_t, W8_F16, _f16)
DEFINE_MK16(1) DEFINE_MK16(2) DEFINE_MK16(3) DEFINE_MK16(4) DEFINE_MK16(5) DEFINE_MK16(6)
typedef void (*mk_fn)(const float *, int64_t, const float *, int64_t, int, const float *, int64_t,
                      const float *, float *, int64_t);
typedef void (*mk16_fn)(const float *, int64_t, const uint16_t *, int64_t, int, const uint16_t *, int64_t,
                        const float *, float *, int64_t);
static const mk_fn MK[MR_MAX + 1] = {0, mk_1, mk_2, mk_3, mk_4, mk_5, mk_6};
static const mk16_fn MK16[MR_MAX + 1] = {0, mk_f16_1, mk_f16_2, mk_f16_3, mk_f16_4, mk_f16_5, mk_f16_6};

/* y[m,n] = x[m,k] @ W^T (+ bias), blocked as a GEMM: rows in blocks whose activations stay in
   L2; for each 16-column panel one k block (KB x 16 floats, 4 KB) at a time, which every row
   chunk of the block then reads from L1. The chunks are of balanced sizes (32 rows: 6,6,5,5,5,5,
   not 6 x 5 + 2: a chunk of fewer than 4 rows waits on FMA latency). Threads split the (row
   block, panel) units: panels, and row blocks where the panels alone are too few for the
   threads (a narrow projection on a many-core server). Each output is summed over k in the
   same order whatever its chunk, block or thread: bit-identical at any batch or thread count. */
#define DEFINE_LINEAR(NAME, WT, MKS)                                                             \
int NAME(const float *x, int64_t ldx, int64_t m, const WT *wp, int64_t n, int64_t k,              \
         const float *bias, float *y, int64_t ldy) {                                              \
    if (n % 16 || m <= 0) return -1;                                                                 \
    const int64_t panels = n / 16;                                                                   \
    const int64_t mc = row_block(m, X_BLOCK_BYTES / (k * (int64_t)sizeof(float)), panels, MR_MAX);   \
    const int64_t blocks = (m + mc - 1) / mc;                                                        \
    /* A weight that stays in L3 is read again for every row block from there; a larger one          \
       (Llama-3.2-1B's projections are 16-64 MB) would come from DRAM each time: it is walked        \
       panel by panel instead, each panel (k x 64 bytes) read again from L2 by its row blocks. */    \
    const int panel_outer = n * k * (int64_t)sizeof(WT) > L3_WEIGHT_BYTES;                           \
    SHARED(blocks * panels, 1, for (int64_t u = lo; u < hi; ++u) {                                  \
        const int64_t rb = panel_outer ? u % blocks : u / panels, nb = panel_outer ? u / blocks : u % panels; \
        const WT *p = wp + nb * k * 16;                                                              \
        const int64_t mb = rb * mc, rows = (m - mb < mc ? m : mb + mc) - mb;                         \
        const int64_t chunks = (rows + MR_MAX - 1) / MR_MAX;                                         \
        for (int64_t k0 = 0; k0 < k; k0 += KB) {                                                     \
            const int64_t kn = k - k0 < KB ? k - k0 : KB;                                            \
            const float *bb = bias && k0 + kn == k ? bias + nb * 16 : 0;                             \
            for (int64_t c = 0, r0 = 0; c < chunks; ++c) {                                           \
                const int64_t r1 = rows * (c + 1) / chunks; /* balanced: sizes differ by <= 1 */     \
                /* this chunk's share of the next KB lines (past the panel's end: the next panel, read \
                   next in the rows-outer order; panel by panel its next row block finds it in L2) */ \
                const int64_t f0 = KB * c / chunks, f1 = KB * (c + 1) / chunks;                      \
                MKS[r1 - r0](x + (mb + r0) * ldx + k0, ldx, p + k0 * 16, kn, k0 > 0,                 \
                            p + (k0 + KB + f0) * 16, f1 - f0, bb, y + (mb + r0) * ldy + nb * 16, ldy); \
                r0 = r1;                                                                             \
            }                                                                                        \
        }                                                                                            \
    });                                                                                              \
    return 0;                                                                                        \
}
DEFINE_LINEAR(f32_linear, float, MK)
DEFINE_LINEAR(f16_linear, uint16_t, MK16)

/* The kernels of this file that share their work in a step program's team (threads.h) */
const void *const team_kernels[] = {(const void *)f32_linear, (const void *)f16_linear, 0};
