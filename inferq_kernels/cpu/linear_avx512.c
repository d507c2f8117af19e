#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "threads.h"
#include "vec_math.h"
#include "amx.h"

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

/* Rows of two C tiles side by side (columns col0..col0+15 in lo, the next 16 in hi) + bias,
   rounded once to bf16, one 64-byte store a row: a whole cache line of y (two 32-byte halves
   written apart cost 1.1x on a Xeon at prompt sizes, y being past L2 there). */
static inline void store_rows(const float *lo, const float *hi, int rows, int64_t col0, const uint16_t *bias,
                              uint16_t *y, int64_t ldy) {
    __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
    if (bias) {
        b0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(bias + col0))), 16));
        b1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(bias + col0 + 16))), 16));
    }
    for (int r = 0; r < rows; ++r) {
        __m512 v0 = _mm512_add_ps(_mm512_loadu_ps(lo + r * 16), b0), v1 = _mm512_add_ps(_mm512_loadu_ps(hi + r * 16), b1);
        _mm512_storeu_si512((__m512i *)(y + r * ldy + col0), (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
    }
}

/* Tiles (amx.h): tmm0-3 C (rows 0-15 / 16-31 x columns 0-15 / 16-31 of a panel), tmm4-5 A, tmm6-7 B. */
/* AMX's weights are fetched this far ahead (bytes of the panel) on the first row chunk, into L2
   (prefetcht0, 32 lines a k block, held the L1's miss buffers: decode-sized steps past the L3
   1.05-1.08x faster with T1 on a Xeon (Emerald Rapids)). */
#define AMX_PF_BYTES 8192

/* A finished chunk whose fp32 results (c, from amx_save) still wait to become bf16 output:
   the vector work of storing them (and, for the fused gate/up kernel, SiLU-and-mul: c the gate
   tiles, c2 the up tiles) runs a few rows at a time inside the next chunk's k loop, between its
   tile products. Done after them, it left the tile unit idle: a chunk's epilogue is hundreds of
   vector instructions, more than the reorder window holds behind the tile products it waits on
   (the fused kernel ran at 0.72x the plain one at prompt sizes on a Xeon, Emerald Rapids). */
typedef struct {
    int rows, next;            /* the chunk's rows; the next row to finish */
    float (*c)[256], (*c2)[256];
    const uint16_t *bias;
    int64_t col0;
    uint16_t *y;               /* the chunk's first output row (at col0) */
    int64_t ldy;
} amx_held;

static inline void held_row(amx_held *h, int r) {
    const int t = r < 16 ? 0 : 2, i = (r & 15) * 16;
    if (!h->c2) {
        store_rows(h->c[t] + i, h->c[t + 1] + i, 1, h->col0, h->bias, h->y + r * h->ldy, h->ldy);
        return;
    }
#if HAVE_SILU_ROWS
    uint16_t gu[64] __attribute__((aligned(64)));  /* the row's gate | up, rounded as the plain kernel stores them */
    store_rows(h->c[t] + i, h->c[t + 1] + i, 1, 0, 0, gu, 64);
    store_rows(h->c2[t] + i, h->c2[t + 1] + i, 1, 32, 0, gu, 64);
    silu_mul_row_bf16(gu, gu + 32, h->y + r * h->ldy + h->col0, 32);
#endif
}

static inline void held_advance(amx_held *h, int n) {
    for (; n > 0 && h->next < h->rows; --n) held_row(h, h->next++);
}

/* A tile load, or with stream set one that hints the data will not be used again soon
   (tileloaddt1), so that it does not push the operand that is reused out of L1: in a prompt
   step of the plain kernel the panel (36 KB at k = 576) serves every chunk of a row block while
   x's tiles pass once (3,072 x 576 at 448-2,048 rows 1.41 -> 1.75 TFLOP/s on a Xeon, Emerald
   Rapids); in the fused gate/up kernel it is x's chunk that serves the gate and up panels
   (1.39 -> 1.49). Decode steps were level either way. */
#define AMX_LOAD(stream, t, p, ld) do { if (stream) _tile_stream_loadd(t, p, ld); else _tile_loadd(t, p, ld); } while (0)

/* One 32-row chunk of x (rows 16-31 only where rows > 16: a decode step of 1-16 rows runs two
   tile products a k block, not four) times one panel, left in the C tiles (tmm0-1 rows 0-15,
   tmm2-3 rows 16-31) for amx_save; each k block also finishes `per` rows of `held`. */
static inline __attribute__((always_inline)) void amx_chunk(const uint16_t *xa, int64_t lda, int rows,
        const uint16_t *b, int64_t kb_n, int first, amx_held *held, int per, int stream_a, int stream_b) {
    const uint16_t *xb = xa + 16 * lda;
    _tile_zero(0); _tile_zero(1);
    if (rows > 16) { _tile_zero(2); _tile_zero(3); }
    for (int64_t kb = 0; kb < kb_n; ++kb) {
        if (first) {  /* first pass over the panel: fetch ahead (the panel is contiguous) */
            const char *p = (const char *)(b + kb * 1024) + AMX_PF_BYTES;
            for (int i = 0; i < 2048; i += 64) _mm_prefetch(p + i, _MM_HINT_T1);
        }
        AMX_LOAD(stream_b, 6, b + kb * 1024, 64);
        AMX_LOAD(stream_b, 7, b + kb * 1024 + 512, 64);
        AMX_LOAD(stream_a, 4, xa + kb * 32, lda * 2);
        _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
        if (rows > 16) {
            AMX_LOAD(stream_a, 5, xb + kb * 32, lda * 2);
            _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
        }
        if (held) held_advance(held, per);
    }
}

/* The C tiles into c (fp32): c[0..1] rows 0-15, c[2..3] rows 16-31. */
static inline void amx_save(int rows, float c[4][256]) {
    _tile_stored(0, c[0], 64); _tile_stored(1, c[1], 64);
    if (rows > 16) { _tile_stored(2, c[2], 64); _tile_stored(3, c[3], 64); }
}

/* x's rows past the last whole 32-row chunk, zero-padded to 32 rows (a tile reads 16 rows):
   NULL where there is no tail, (uint16_t *)-1 where it could not be allocated. */
static uint16_t *amx_tail(const uint16_t *x, int64_t ldx, int64_t m, int64_t k) {
    int64_t full = m / 32 * 32, tail = m - full;
    if (!tail) return 0;
    uint16_t *pad = (uint16_t *)aligned_alloc(64, (size_t)(32 * k * 2 + 63) / 64 * 64);
    if (!pad) return (uint16_t *)-1;
    memset(pad, 0, 32 * k * 2);
    for (int64_t r = 0; r < tail; ++r) memcpy(pad + r * k, x + (full + r) * ldx, k * 2);
    return pad;
}

/* The rows of chunk m0 as amx_chunk reads them: x itself, or the padded tail. */
#define AMX_CHUNK_X(m0) ((m0) + 32 <= m ? x + (m0) * ldx : pad), ((m0) + 32 <= m ? ldx : k)

/* Rows per block: every panel is run over one block of x's rows before the next block, so the
   block's A tiles come from L2 (a 2,048-row prompt step of SmolLM2, 2.4 MB of x, was read again
   from L3 for every panel: half oneDNN's speed; the weights are read once per block instead). */
#define AMX_X_BLOCK_BYTES (512 << 10)
static inline int64_t amx_row_block(int64_t k) {
    int64_t rows = AMX_X_BLOCK_BYTES / (k * 2) / 32 * 32;
    return rows < 32 ? 32 : rows;
}

/* ---- bfloat16, AMX: y[m,n] = x[m,k] @ W^T (+ bias), bf16 in and out, fp32 accumulation. */
int amx_linear_bf16(const uint16_t *x, int64_t ldx, int64_t m, const uint16_t *wp, int64_t n, int64_t k,
                    const uint16_t *bias, uint16_t *y, int64_t ldy) {
    if (n % 32 || k % 32 || m <= 0) return -1;
    const int64_t kb_n = k / 32;
    uint16_t *pad = amx_tail(x, ldx, m, k);
    if (pad == (uint16_t *)-1) return -2;
    OMP(omp parallel num_threads(kernel_nthreads))
    {  /* tile state is per thread: each configures its own and takes whole panels */
    amx_configure();
    float c[2][4][256] __attribute__((aligned(64)));  /* this chunk's results and the held one's */
    amx_held held = {0};
    const int per = (int)((32 + kb_n - 1) / kb_n);
    const int64_t mb_n = amx_row_block(k);
    for (int64_t mb = 0; mb < m; mb += mb_n) {
        OMP(omp for schedule(static))
        for (int64_t nb = 0; nb < n / 32; ++nb) {
            const uint16_t *b = wp + nb * kb_n * 1024;
            for (int64_t m0 = mb; m0 < m && m0 < mb + mb_n; m0 += 32) {
                int rows = m - m0 < 32 ? (int)(m - m0) : 32;
                if (m > 32)  /* the panel stays in L1 for the block's chunks; x's tiles pass by */
                    amx_chunk(AMX_CHUNK_X(m0), rows, b, kb_n, m0 == mb, &held, per, 1, 0);
                else
                    amx_chunk(AMX_CHUNK_X(m0), rows, b, kb_n, m0 == mb, &held, per, 0, 0);
                held_advance(&held, 32);
                float (*cc)[256] = c[held.c == c[0]];
                amx_save(rows, cc);
                held = (amx_held){rows, 0, cc, 0, bias, nb * 32, y + m0 * ldy, ldy};
            }
        }
    }
    held_advance(&held, 32);
    _tile_release();
    }
    free(pad);
    return 0;
}

/* ---- bfloat16 on AVX512-BF16 without AMX (e.g. AMD Zen 4 and 5): vdpbf16ps on 32-column panels.
   W[n,k] row-major -> [n/32 panels][k/2 pairs][32 columns][2]: a panel is contiguous, 128 bytes per pair. */
int dp_pack_bf16(const uint16_t *w, int64_t n, int64_t k, uint16_t *out) {
    if (n % 32 || k % 2) return -1;
    const int64_t kp_n = k / 2;
    for (int64_t nb = 0; nb < n / 32; ++nb)
        for (int64_t kp = 0; kp < kp_n; ++kp)
            for (int c = 0; c < 32; ++c)
                for (int j = 0; j < 2; ++j)
                    out[((nb * kp_n + kp) * 32 + c) * 2 + j] = w[(nb * 32 + c) * k + 2 * kp + j];
    return 0;
}

/* k steps (k pairs in bf16; 128 bytes either way) ahead the 14 x 32 kernels' first row chunk
   fetches its panel: 24 KB, about a DRAM latency's worth of 14-row steps (3 KB left decode
   steps of 14-32 rows 1.1-1.4x slower on a Zen 5) */
#define PF_K 192
/* Weights are fetched ahead into L2, not L1: prefetcht0 streams held the L1's few miss buffers
   and the loads queued behind them (on a Zen 4, fp32 matmuls of 4-24 rows 1.15-1.3x faster and
   bf16 of 8-12 rows 1.05-1.15x with L2; prompt sizes unchanged; not re-measured on a Zen 5). */
#define PF_HINT _MM_HINT_T1

/* Loops over a micro-kernel's rows and accumulator columns are unrolled by hand: left to
   itself gcc 12 keeps the accumulator arrays of the bigger kernels (14 x 32, 6 x 64) on the
   stack around the k loop, zeroing and reading them back through memory on every k block
   (fp32 matmuls of 14-1,024 rows 1.07-1.12x faster on a Zen 4 with it; same results). */
#define UNROLLED _Pragma("GCC unroll 16")

/* acc[0..3] += broadcast(*xp) * w0..w3 with the broadcast folded into each FMA as a memory
   operand ({1to16}): gcc hoists a broadcast used four times into a register of its own, one
   uop more per row and k (1.02x on a Zen 4 at 32-1,024 rows; the same FMAs, the same results). */
#define FMA4_BCAST(acc, xp, w0, w1, w2, w3)                                                      \
    __asm__("vfmadd231ps %4%{1to16%}, %5, %0\n\tvfmadd231ps %4%{1to16%}, %6, %1\n\t"             \
            "vfmadd231ps %4%{1to16%}, %7, %2\n\tvfmadd231ps %4%{1to16%}, %8, %3"                 \
            : "+v"((acc)[0]), "+v"((acc)[1]), "+v"((acc)[2]), "+v"((acc)[3])                     \
            : "m"(*(xp)), "v"(w0), "v"(w1), "v"(w2), "v"(w3))

static inline __m512 bf16x16_to_f32(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* MR rows x 32 columns of fp32 accumulators (2*MR zmm); each k pair of a row is broadcast as
   one 32-bit lane pattern and multiplied into both halves of the panel's pair. X_PAIR(r, kp) is
   row r's k pair kp: read from x's rows (dk_MR) or from x packed by pack_x_pairs (dkp_MR). */
#define DK_BODY(MR, X_PAIR)                                                                      \
    __m512 a0[MR], a1[MR];                                                                       \
    UNROLLED for (int r = 0; r < MR; ++r) { a0[r] = _mm512_setzero_ps(); a1[r] = _mm512_setzero_ps(); } \
    for (int64_t kp = 0; kp < k / 2; ++kp) {                                                     \
        if (first) _mm_prefetch((const char *)(b + (kp + PF_K) * 64), PF_HINT),                  \
                   _mm_prefetch((const char *)(b + (kp + PF_K) * 64 + 32), PF_HINT);             \
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(b + kp * 64);                           \
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(b + kp * 64 + 32);                      \
        UNROLLED for (int r = 0; r < MR; ++r) {                                                  \
            const __m512bh xb = (__m512bh)_mm512_set1_epi32(X_PAIR(r, kp));                      \
            a0[r] = _mm512_dpbf16_ps(a0[r], xb, w0);                                             \
            a1[r] = _mm512_dpbf16_ps(a1[r], xb, w1);                                             \
        }                                                                                        \
    }                                                                                            \
    const __m512 b0 = bias ? bf16x16_to_f32(bias) : _mm512_setzero_ps();                         \
    const __m512 b1 = bias ? bf16x16_to_f32(bias + 16) : _mm512_setzero_ps();                    \
    UNROLLED for (int r = 0; r < MR; ++r) {                                                      \
        _mm256_storeu_si256((__m256i *)(y + r * ldy), (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(a0[r], b0))); \
        _mm256_storeu_si256((__m256i *)(y + r * ldy + 16), (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(a1[r], b1))); \
    }
static inline int32_t row_pair(const uint16_t *p) { int32_t v; memcpy(&v, p, 4); return v; }
#define ROWS_PAIR(r, kp) row_pair(x + (r) * ldx + 2 * (kp))
#define DEFINE_DK(MR)                                                                            \
static void dk_##MR(const uint16_t *x, int64_t ldx, const uint16_t *b, int64_t k, int first,     \
                    const uint16_t *bias, uint16_t *y, int64_t ldy) {                            \
    DK_BODY(MR, ROWS_PAIR)                                                                       \
}                                                                                                \
static void dkp_##MR(const int32_t *xp, const uint16_t *b, int64_t k, int first,                 \
                     const uint16_t *bias, uint16_t *y, int64_t ldy) {                           \
    DK_BODY(MR, PACKED_PAIR_##MR)                                                                \
}
#define PACKED_PAIR(MR, r, kp) xp[(kp) * (MR) + (r)]
#define PACKED_PAIR_1(r, kp) PACKED_PAIR(1, r, kp)
#define PACKED_PAIR_2(r, kp) PACKED_PAIR(2, r, kp)
#define PACKED_PAIR_3(r, kp) PACKED_PAIR(3, r, kp)
#define PACKED_PAIR_4(r, kp) PACKED_PAIR(4, r, kp)
#define PACKED_PAIR_5(r, kp) PACKED_PAIR(5, r, kp)
#define PACKED_PAIR_6(r, kp) PACKED_PAIR(6, r, kp)
#define PACKED_PAIR_7(r, kp) PACKED_PAIR(7, r, kp)
#define PACKED_PAIR_8(r, kp) PACKED_PAIR(8, r, kp)
#define PACKED_PAIR_9(r, kp) PACKED_PAIR(9, r, kp)
#define PACKED_PAIR_10(r, kp) PACKED_PAIR(10, r, kp)
#define PACKED_PAIR_11(r, kp) PACKED_PAIR(11, r, kp)
#define PACKED_PAIR_12(r, kp) PACKED_PAIR(12, r, kp)
#define PACKED_PAIR_13(r, kp) PACKED_PAIR(13, r, kp)
#define PACKED_PAIR_14(r, kp) PACKED_PAIR(14, r, kp)
DEFINE_DK(1) DEFINE_DK(2) DEFINE_DK(3) DEFINE_DK(4) DEFINE_DK(5) DEFINE_DK(6) DEFINE_DK(7)
DEFINE_DK(8) DEFINE_DK(9) DEFINE_DK(10) DEFINE_DK(11) DEFINE_DK(12) DEFINE_DK(13) DEFINE_DK(14)
typedef void (*dk_fn)(const uint16_t *, int64_t, const uint16_t *, int64_t, int, const uint16_t *, uint16_t *, int64_t);
static const dk_fn DK[15] = {0, dk_1, dk_2, dk_3, dk_4, dk_5, dk_6, dk_7, dk_8, dk_9, dk_10, dk_11, dk_12, dk_13, dk_14};
typedef void (*dkp_fn)(const int32_t *, const uint16_t *, int64_t, int, const uint16_t *, uint16_t *, int64_t);
static const dkp_fn DKP[15] = {0, dkp_1, dkp_2, dkp_3, dkp_4, dkp_5, dkp_6, dkp_7, dkp_8, dkp_9, dkp_10, dkp_11, dkp_12, dkp_13, dkp_14};

/* y[m,n] = x[m,k] @ W^T (+ bias) on 32-column panels of k*32 values (both AVX-512 kernels): one
   panel at a time, streamed once (prefetched on the first row chunk), rows in chunks of 14
   (28 accumulators in registers), each chunk reusing the panel from L1/L2. */
#define DEFINE_PANEL_LINEAR(NAME, T, KERNELS, K_REJECTED)                                        \
int NAME(const T *x, int64_t ldx, int64_t m, const T *wp, int64_t n, int64_t k,                  \
         const T *bias, T *y, int64_t ldy) {                                                     \
    if (n % 32 || (K_REJECTED) || m <= 0) return -1;                                             \
    SHARED(n / 32, 1, for (int64_t nb = lo; nb < hi; ++nb) { /* threads split panels */         \
        const T *b = wp + nb * k * 32;                                                           \
        for (int64_t m0 = 0; m0 < m; m0 += 14) {                                                 \
            const int mr = m - m0 < 14 ? (int)(m - m0) : 14;                                     \
            KERNELS[mr](x + m0 * ldx, ldx, b, k, m0 == 0, bias ? bias + nb * 32 : 0,             \
                        y + m0 * ldy + nb * 32, ldy);                                            \
        }                                                                                        \
    });                                                                                          \
    return 0;                                                                                    \
}
DEFINE_PANEL_LINEAR(dp_linear_bf16_rows, uint16_t, DK, k % 2)

/* Where a 14-row chunk of x is larger than L1 (k > 1,170), x is packed first: chunk by chunk,
   xp[kp][r] = row r's k pair kp, so the kernel reads one stream of 56 bytes a k step instead of
   4 bytes from each of 14 rows, 14 streams of L2 lines the L1 prefetcher did not keep up with
   (Llama-3.2-1B's projections, k = 2,048 / 8,192, on a Zen 4: 1.25-1.3x faster at 32-256 rows,
   1.1-1.3x at 2,048; at SmolLM2's k = 576 / 1,536 level). Same products, same order: the
   same results. The packed copy is one step's temporary, x's size. */
#define X_CHUNK_L1_BYTES (32 << 10)
static void pack_x_pairs(const uint16_t *x, int64_t ldx, int64_t m, int64_t k, int32_t *xp) {
    const int64_t kp_n = k / 2;
    for (int64_t m0 = 0; m0 < m; m0 += 14) {
        const int mr = m - m0 < 14 ? (int)(m - m0) : 14;
        int32_t *c = xp + m0 * kp_n;
        for (int r = 0; r < mr; ++r)
            for (int64_t kp = 0; kp < kp_n; ++kp) c[kp * mr + r] = row_pair(x + (m0 + r) * ldx + 2 * kp);
    }
}

/* bf16 in and out, fp32 accumulation, bias in fp32, one rounding to bf16 */
int dp_linear_bf16(const uint16_t *x, int64_t ldx, int64_t m, const uint16_t *wp, int64_t n, int64_t k,
                   const uint16_t *bias, uint16_t *y, int64_t ldy) {
    if (n % 32 || k % 2 || m <= 0) return -1;
    if (14 * k * (int64_t)sizeof(uint16_t) <= X_CHUNK_L1_BYTES)
        return dp_linear_bf16_rows(x, ldx, m, wp, n, k, bias, y, ldy);
    int32_t *xp = malloc((size_t)(m * k / 2) * sizeof(int32_t));
    if (!xp) return dp_linear_bf16_rows(x, ldx, m, wp, n, k, bias, y, ldy);
    pack_x_pairs(x, ldx, m, k, xp);
    SHARED(n / 32, 1, for (int64_t nb = lo; nb < hi; ++nb) { /* threads split panels */
        const uint16_t *b = wp + nb * k * 32;
        for (int64_t m0 = 0; m0 < m; m0 += 14) {
            const int mr = m - m0 < 14 ? (int)(m - m0) : 14;
            DKP[mr](xp + m0 * (k / 2), b, k, m0 == 0, bias ? bias + nb * 32 : 0, y + m0 * ldy + nb * 32, ldy);
        }
    });
    free(xp);
    return 0;
}

/* ---- float32, AVX-512 FMA. W[n,k] row-major -> [n/32 panels][k][32]: a panel is contiguous. */
int f32_pack(const float *w, int64_t n, int64_t k, float *out) {
    if (n % 32) return -1;
    for (int64_t nb = 0; nb < n / 32; ++nb)
        for (int64_t kk = 0; kk < k; ++kk)
            for (int c = 0; c < 32; ++c) out[(nb * k + kk) * 32 + c] = w[(nb * 32 + c) * k + kk];
    return 0;
}

#define X_BLOCK_BYTES (384 << 10) /* activations per row block of the 6 x 64 kernel (L2 is 1-2 MB) */
#define NARROW_ROWS 14 /* past this the 6 x 64 kernel: 1.1x the 14 x 32 one at 16-32 rows on a Zen 5 */
#define KB 64 /* k is summed in blocks of KB, the blocks added in order: a smaller rounding error than one long chain */
#define DEFINE_MK(MR)                                                                            \
static void mk_##MR(const float *x, int64_t ldx, const float *b, int64_t k, int first,           \
                    const float *bias, float *y, int64_t ldy) {                                  \
    for (int64_t k0 = 0; k0 < k; k0 += KB) {                                                     \
        const int64_t k1 = k - k0 < KB ? k : k0 + KB;                                            \
        __m512 a0[MR], a1[MR];                                                                   \
        UNROLLED for (int r = 0; r < MR; ++r) { a0[r] = _mm512_setzero_ps(); a1[r] = _mm512_setzero_ps(); } \
        for (int64_t kk = k0; kk < k1; ++kk) {                                                   \
            if (first) _mm_prefetch((const char *)(b + (kk + PF_K) * 32), PF_HINT),              \
                       _mm_prefetch((const char *)(b + (kk + PF_K) * 32 + 16), PF_HINT);         \
            const __m512 w0 = _mm512_loadu_ps(b + kk * 32), w1 = _mm512_loadu_ps(b + kk * 32 + 16); \
            UNROLLED for (int r = 0; r < MR; ++r) {                                              \
                const __m512 xb = _mm512_set1_ps(x[r * ldx + kk]);                               \
                a0[r] = _mm512_fmadd_ps(xb, w0, a0[r]);                                          \
                a1[r] = _mm512_fmadd_ps(xb, w1, a1[r]);                                          \
            }                                                                                    \
        }                                                                                        \
        UNROLLED for (int r = 0; r < MR; ++r) {                                                  \
            float *yr = y + r * ldy;                                                             \
            if (k0) { a0[r] = _mm512_add_ps(_mm512_loadu_ps(yr), a0[r]);                         \
                      a1[r] = _mm512_add_ps(_mm512_loadu_ps(yr + 16), a1[r]); }                  \
            if (k1 == k && bias) { a0[r] = _mm512_add_ps(a0[r], _mm512_loadu_ps(bias));          \
                                   a1[r] = _mm512_add_ps(a1[r], _mm512_loadu_ps(bias + 16)); }   \
            _mm512_storeu_ps(yr, a0[r]);                                                         \
            _mm512_storeu_ps(yr + 16, a1[r]);                                                    \
        }                                                                                        \
    }                                                                                            \
}
DEFINE_MK(1) DEFINE_MK(2) DEFINE_MK(3) DEFINE_MK(4) DEFINE_MK(5) DEFINE_MK(6) DEFINE_MK(7)
DEFINE_MK(8) DEFINE_MK(9) DEFINE_MK(10) DEFINE_MK(11) DEFINE_MK(12) DEFINE_MK(13) DEFINE_MK(14)
typedef void (*mk_fn)(const float *, int64_t, const float *, int64_t, int, const float *, float *, int64_t);
static const mk_fn MK[15] = {0, mk_1, mk_2, mk_3, mk_4, mk_5, mk_6, mk_7, mk_8, mk_9, mk_10, mk_11, mk_12, mk_13, mk_14};

DEFINE_PANEL_LINEAR(f32_linear_narrow, float, MK, 0)

/* Past 14 rows: two panels at a time, 6 rows x 64 columns of accumulators (24 registers), so
   each k step loads 4 weight vectors and 6 broadcasts for 24 FMAs where the 14 x 32 kernel
   loads 2 and 14 for 28. One call does one k block of at most KB rows (y += its sum, or y = on
   the first block; bias added after the last), so the summation order per output is the 14 x 32
   kernel's: the same results. */
#define DEFINE_MK2(MR)                                                                           \
static void mk2_##MR(const float *x, int64_t ldx, const float *p0, const float *p1, int64_t kn,  \
                     int accumulate, int64_t pf0, int64_t npf, const float *bias, float *y,      \
                     int64_t ldy) {                                                              \
    __m512 a[MR][4];                                                                             \
    UNROLLED for (int r = 0; r < MR; ++r)                                                        \
        UNROLLED for (int j = 0; j < 4; ++j) a[r][j] = _mm512_setzero_ps();                      \
    for (int64_t kk = 0; kk < kn; ++kk) {                                                        \
        if (kk < npf) { /* this chunk's share of the next k block (past a panel's end: the next panel) */ \
            const int64_t f = (KB + pf0 + kk) * 32;                                              \
            _mm_prefetch((const char *)(p0 + f), PF_HINT);                                       \
            _mm_prefetch((const char *)(p0 + f + 16), PF_HINT);                                  \
            _mm_prefetch((const char *)(p1 + f), PF_HINT);                                       \
            _mm_prefetch((const char *)(p1 + f + 16), PF_HINT);                                  \
        }                                                                                        \
        const __m512 w0 = _mm512_loadu_ps(p0 + kk * 32), w1 = _mm512_loadu_ps(p0 + kk * 32 + 16); \
        const __m512 w2 = _mm512_loadu_ps(p1 + kk * 32), w3 = _mm512_loadu_ps(p1 + kk * 32 + 16); \
        UNROLLED for (int r = 0; r < MR; ++r) {                                                  \
            FMA4_BCAST(a[r], x + r * ldx + kk, w0, w1, w2, w3);                                  \
        }                                                                                        \
    }                                                                                            \
    UNROLLED for (int r = 0; r < MR; ++r) {                                                      \
        float *yr = y + r * ldy;                                                                 \
        UNROLLED for (int j = 0; j < 4; ++j) {                                                   \
            if (accumulate) a[r][j] = _mm512_add_ps(_mm512_loadu_ps(yr + 16 * j), a[r][j]);      \
            if (bias) a[r][j] = _mm512_add_ps(a[r][j], _mm512_loadu_ps(bias + 16 * j));          \
            _mm512_storeu_ps(yr + 16 * j, a[r][j]);                                              \
        }                                                                                        \
    }                                                                                            \
}
DEFINE_MK2(1) DEFINE_MK2(2) DEFINE_MK2(3) DEFINE_MK2(4) DEFINE_MK2(5) DEFINE_MK2(6)
typedef void (*mk2_fn)(const float *, int64_t, const float *, const float *, int64_t, int, int64_t, int64_t,
                       const float *, float *, int64_t);
static const mk2_fn MK2[7] = {0, mk2_1, mk2_2, mk2_3, mk2_4, mk2_5, mk2_6};

/* One (row block, panel pair) tile over k in [ks, ke) (whole KB blocks; y += where ks > 0) */
static inline void f32_tile(const float *x, int64_t ldx, int64_t mb, int64_t me, const float *wp, int64_t np,
                            int64_t k, int64_t ks, int64_t ke, const float *bias, float *y, int64_t ldy) {
    const float *p0 = wp + 2 * np * k * 32, *p1 = p0 + k * 32;
    for (int64_t k0 = ks; k0 < ke; k0 += KB) {
        const int64_t k1 = k - k0 < KB ? k : k0 + KB;
        const float *bb = bias && k1 == k ? bias + np * 64 : 0;
        const int64_t chunks = (me - mb + 5) / 6;
        for (int64_t c = 0; c < chunks; ++c) {
            const int64_t m0 = mb + 6 * c;
            const int mr = me - m0 < 6 ? (int)(me - m0) : 6;
            /* the chunks share the fetching of the next k block: rows [c, c+1) * KB / chunks */
            const int64_t f0 = (c * KB + chunks - 1) / chunks, f1 = ((c + 1) * KB + chunks - 1) / chunks;
            MK2[mr](x + m0 * ldx + k0, ldx, p0 + k0 * 32, p1 + k0 * 32, k1 - k0, k0 > 0, f0, f1 - f0, bb,
                    y + m0 * ldy + np * 64, ldy);
        }
    }
}

/* Blocked as a GEMM: rows in blocks whose activations stay in L2 (a prompt step's x, 2,048 x
   576 floats = 4.7 MB, read again from L3 for every panel pair made the time swing 1.5x with
   what the L3's other tenants did), and for each panel pair one k block (64 x 64 floats,
   16 KB) at a time, which every 6-row chunk of the row block then reads from L1. Threads split
   the (row block, panel pair) units: panel pairs, and row blocks where the pairs alone are too
   few for the threads (a 576-wide projection has 9 pairs).
   Past k = 2,048 a row block of whole rows would be under 48 rows (12 at Llama-3.2-1B's k =
   8,192, which then streamed its 64 MB down projection from DRAM once per 12 rows): there k
   runs in slices of KC inside each row block of 192 rows, the slice's activations in L2 for
   every panel pair and the weights streamed once per row block (that down projection 1.15-1.3x
   faster at 32-2,048 rows on a Zen 4; at k = 2,048 the whole-k order was 1.05x faster still).
   Threads split the pairs of each slice, so this order needs as many pairs as threads. Each
   output still sums its KB blocks in k order: the same results. */
#define KC 512
int f32_linear(const float *x, int64_t ldx, int64_t m, const float *wp, int64_t n, int64_t k,
               const float *bias, float *y, int64_t ldy) {
    if (m <= NARROW_ROWS || n % 32) return f32_linear_narrow(x, ldx, m, wp, n, k, bias, y, ldy);
    const int64_t pairs = n / 64;
    if (X_BLOCK_BYTES / (k * (int64_t)sizeof(float)) < 48 && pairs >= kernel_nthreads) {
        const int64_t mc = X_BLOCK_BYTES / (KC * (int64_t)sizeof(float)) / 6 * 6;
        /* a thread's pairs, every slice of them in k order: no race on y */
        SHARED(pairs, 1, for (int64_t mb = 0; mb < m; mb += mc)
            for (int64_t ks = 0; ks < k; ks += KC)
                for (int64_t np = lo; np < hi; ++np)
                    f32_tile(x, ldx, mb, m - mb < mc ? m : mb + mc, wp, np, k, ks, k - ks < KC ? k : ks + KC,
                             bias, y, ldy););
    } else {
        const int64_t mc = row_block(m, X_BLOCK_BYTES / (k * (int64_t)sizeof(float)), pairs, 6);
        const int64_t blocks = (m + mc - 1) / mc;
        SHARED(blocks * pairs, 1, for (int64_t u = lo; u < hi; ++u) {
            const int64_t rb = u / pairs, np = u % pairs;
            f32_tile(x, ldx, rb * mc, m - rb * mc < mc ? m : rb * mc + mc, wp, np, k, 0, k, bias, y, ldy);
        });
    }
    if (n % 64)  /* an odd last panel */
        return f32_linear_narrow(x, ldx, m, wp + (n - 32) * k, 32, k, bias ? bias + n - 32 : 0, y + n - 32, ldy);
    return 0;
}

#if HAVE_SILU_ROWS /* vec_math.h's silu_mul_row (AVX-512 BW and VL) */
/* ---- The MLP's gate/up projection with SiLU-and-mul fused into it (both AVX-512 kernels).
   The weight's gate and up halves are packed with their 32-column panels interleaved (panel 2j:
   gate columns [32j, 32j + 32); panel 2j + 1: the same columns of up), so an output block's two
   panels are neighbours: a row chunk's gate and up outputs go to a scratch in L1/L2, stored and
   rounded as the plain kernel stores them, and vec_math.h's silu_mul_row (the function
   silu_mul_* of paged_decode.c runs) turns them into the activation. The [m, 2I] gate/up output
   is never written to memory nor read back, and the same bits come out as from the matmul
   followed by silu_mul. Returns 1, doing nothing, where the plain kernel would take its k-sliced
   order (k > 2,048 in fp32): the caller then runs the matmul and silu_pairs. */
int f32_linear_silu(const float *x, int64_t ldx, int64_t m, const float *wp, int64_t n, int64_t k,
                    float *out, int64_t ldo) {
    if (n % 64 || m <= 0) return -1;
    const int64_t pairs = n / 64;
    if (m <= NARROW_ROWS) {
        SHARED(pairs, 1, for (int64_t j = lo; j < hi; ++j) {
            float sc[NARROW_ROWS * 64] __attribute__((aligned(64)));
            const float *p0 = wp + 2 * j * k * 32;
            MK[m](x, ldx, p0, k, 1, 0, sc, 64);
            MK[m](x, ldx, p0 + k * 32, k, 1, 0, sc + 32, 64);
            for (int64_t r = 0; r < m; ++r) silu_mul_row_f32(sc + r * 64, sc + r * 64 + 32, out + r * ldo + 32 * j, 32);
        });
        return 0;
    }
    if (X_BLOCK_BYTES / (k * (int64_t)sizeof(float)) < 48 && pairs >= kernel_nthreads) return 1;
    const int64_t mc = row_block(m, X_BLOCK_BYTES / (k * (int64_t)sizeof(float)), pairs, 6);
    const int64_t blocks = (m + mc - 1) / mc;
    /* one thread's scratch per allocation: in a team each thread calls this and makes its own */
    const int64_t owners = in_team() ? 1 : kernel_nthreads;
    float *scratch = aligned_alloc(64, (size_t)(owners * mc * 64) * sizeof(float));
    if (!scratch) return 1;
    SHARED(blocks * pairs, 1, for (int64_t u = lo; u < hi; ++u) {
        const int64_t rb = u / pairs, np = u % pairs;
        float *sc = scratch + (owners > 1 ? tid : 0) * mc * 64;
        const int64_t mb = rb * mc, rows = m - mb < mc ? m - mb : mc;
        f32_tile(x + mb * ldx, ldx, 0, rows, wp + 2 * np * k * 32, 0, k, 0, k, 0, sc, 64);
        for (int64_t r = 0; r < rows; ++r)
            silu_mul_row_f32(sc + r * 64, sc + r * 64 + 32, out + (mb + r) * ldo + 32 * np, 32);
    });
    free(scratch);
    return 0;
}

int dp_linear_bf16_silu(const uint16_t *x, int64_t ldx, int64_t m, const uint16_t *wp, int64_t n, int64_t k,
                        uint16_t *out, int64_t ldo) {
    if (n % 64 || k % 2 || m <= 0) return -1;
    int32_t *xp = 0;
    if (14 * k * (int64_t)sizeof(uint16_t) > X_CHUNK_L1_BYTES) {  /* as dp_linear_bf16 does */
        xp = malloc((size_t)(m * k / 2) * sizeof(int32_t));
        if (!xp) return 1;
        pack_x_pairs(x, ldx, m, k, xp);
    }
    SHARED(n / 64, 1, for (int64_t j = lo; j < hi; ++j) {
        uint16_t sc[14 * 64] __attribute__((aligned(64)));
        const uint16_t *p0 = wp + 2 * j * k * 32, *p1 = p0 + k * 32;
        for (int64_t m0 = 0; m0 < m; m0 += 14) {
            const int mr = m - m0 < 14 ? (int)(m - m0) : 14;
            if (xp) {
                DKP[mr](xp + m0 * (k / 2), p0, k, m0 == 0, 0, sc, 64);
                DKP[mr](xp + m0 * (k / 2), p1, k, m0 == 0, 0, sc + 32, 64);
            } else {
                DK[mr](x + m0 * ldx, ldx, p0, k, m0 == 0, 0, sc, 64);
                DK[mr](x + m0 * ldx, ldx, p1, k, m0 == 0, 0, sc + 32, 64);
            }
            for (int r = 0; r < mr; ++r)
                silu_mul_row_bf16(sc + r * 64, sc + r * 64 + 32, out + (m0 + r) * ldo + 32 * j, 32);
        }
    });
    free(xp);
    return 0;
}

/* SiLU-and-mul of a gate/up output already computed in the interleaved column order above
   (y[m, n], 32 gate columns then the same 32 up columns): where the fused call does not run */
/* The AMX kernel with SiLU-and-mul fused (panels interleaved as for dp_linear_bf16_silu): each
   32-row chunk's gate and up products are rounded to bf16 as amx_linear_bf16 stores them, then
   silu_mul_row makes the activation: the same bits as the matmul followed by silu_mul. */
int amx_linear_bf16_silu(const uint16_t *x, int64_t ldx, int64_t m, const uint16_t *wp, int64_t n, int64_t k,
                         uint16_t *out, int64_t ldo) {
    if (n % 64 || k % 32 || m <= 0) return -1;
    const int64_t kb_n = k / 32;
    uint16_t *pad = amx_tail(x, ldx, m, k);
    if (pad == (uint16_t *)-1) return 1;
    OMP(omp parallel num_threads(kernel_nthreads))
    {
    amx_configure();
    float gate[2][4][256] __attribute__((aligned(64))), up[2][4][256] __attribute__((aligned(64)));
    amx_held held = {0};
    const int per = (int)((32 + 2 * kb_n - 1) / (2 * kb_n));  /* the held chunk spans two products */
    const int64_t mb_n = amx_row_block(k);
    for (int64_t mb = 0; mb < m; mb += mb_n) {
        OMP(omp for schedule(static))
        for (int64_t j = 0; j < n / 64; ++j) {
            const uint16_t *p0 = wp + 2 * j * kb_n * 1024, *p1 = p0 + kb_n * 1024;
            for (int64_t m0 = mb; m0 < m && m0 < mb + mb_n; m0 += 32) {
                int rows = m - m0 < 32 ? (int)(m - m0) : 32;
                const int s = held.c == gate[0];  /* the buffers the held chunk does not use */
                amx_chunk(AMX_CHUNK_X(m0), rows, p0, kb_n, m0 == mb, &held, per, 0, 1);
                amx_save(rows, gate[s]);
                amx_chunk(AMX_CHUNK_X(m0), rows, p1, kb_n, m0 == mb, &held, per, 0, 1);
                held_advance(&held, 32);
                amx_save(rows, up[s]);
                held = (amx_held){rows, 0, gate[s], up[s], 0, 32 * j, out + m0 * ldo, ldo};
            }
        }
    }
    held_advance(&held, 32);
    _tile_release();
    }
    free(pad);
    return 0;
}

#define DEFINE_SILU_PAIRS(NAME, T, ROW)                                                          \
int NAME(const T *y, int64_t ldy, int64_t m, int64_t n, T *out, int64_t ldo) {                   \
    if (n % 64) return -1;                                                                       \
    OMP(omp parallel for schedule(static) num_threads(kernel_nthreads))                          \
    for (int64_t r = 0; r < m; ++r)                                                              \
        for (int64_t j = 0; j < n / 64; ++j)                                                     \
            ROW(y + r * ldy + 64 * j, y + r * ldy + 64 * j + 32, out + r * ldo + 32 * j, 32);    \
    return 0;                                                                                    \
}
DEFINE_SILU_PAIRS(f32_silu_pairs, float, silu_mul_row_f32)
DEFINE_SILU_PAIRS(bf16_silu_pairs, uint16_t, silu_mul_row_bf16)
#endif

/* The kernels of this file that share their work in a step program's team (threads.h); not
   the AMX ones, whose threads each set up their own tiles inside their own region */
const void *const team_kernels[] = {(const void *)dp_linear_bf16_rows, (const void *)dp_linear_bf16,
                                    (const void *)f32_linear_narrow, (const void *)f32_linear,
#if HAVE_SILU_ROWS
                                    (const void *)f32_linear_silu, (const void *)dp_linear_bf16_silu,
#endif
                                    0};
