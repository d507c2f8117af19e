/* Causal prefill attention over the paged KV cache on Intel AMX tiles (bfloat16).

   The same signature and work items as paged_prefill.c's paged_prefill_bf16 (chunk, kv head,
   tile of 16 rows, a row being one (query token, query head) of the G heads that share the kv
   head), but both products on the tile unit:
     S = Q K^T   16 rows x 16 keys a C tile, Q as A tiles (32 head elements each), K as B tiles
     P = softmax(S * scale, causal) over the tile's keys, two passes over S in fp32 (max, then
         exp and the sum), P rounded to bf16 for the second product, the sum kept in fp32
     O = P V     16 rows x 16 head elements a C tile, P as A tiles (32 keys each), V as B tiles
   and out = O / sum, rounded once to bf16. A B tile holds pairs along its k dimension, so K
   (pairs of head elements) and V (pairs of keys) are first copied out of the cache into tile
   order, once per (chunk, kv head) for all of its row tiles. Unlike paged_prefill_bf16, P is
   rounded to bf16 before P V (as a bf16 SDPA does); each output is computed by one thread in a
   fixed order: bit-identical at any thread count. Needs d a multiple of 32 (up to 256). */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "threads.h"
#include "vec_math.h"
#include "amx.h"

#define MAX_D 256

/* Key j's row of kv head h in the paged cache, or NULL past the n keys of the sequence. */
static inline const uint16_t *cache_row(const uint16_t *cache, const int32_t *table, int64_t j, int64_t n,
                                        int64_t h, int64_t d, int64_t bs, int64_t tok_stride) {
    return j < n ? cache + ((int64_t)table[j / bs] * bs + j % bs) * tok_stride + h * d : 0;
}

/* K of keys [0, n) of one kv head in B-tile order: for each 16-key block and each 32-element
   slice of the head, 16 rows (element pairs) x 16 keys x 2. Keys past n are zeros. */
static void pack_k(const uint16_t *kc, const int32_t *table, int64_t n, int64_t h, int64_t d, int64_t bs,
                   int64_t tok_stride, uint16_t *kt) {
    const int64_t blocks = (n + 15) / 16, slices = d / 32;
    for (int64_t j = 0; j < blocks * 16; ++j) {
        const uint32_t *row = (const uint32_t *)cache_row(kc, table, j, n, h, d, bs, tok_stride);
        for (int64_t s = 0; s < slices; ++s) {
            uint32_t *tile = (uint32_t *)(kt + (j / 16 * slices + s) * 512);
            for (int p = 0; p < 16; ++p) tile[p * 16 + j % 16] = row ? row[s * 16 + p] : 0;
        }
    }
}

/* V of keys [0, n) in B-tile order: for each 32-key block and each 16-element slice of the head,
   16 rows (key pairs) x 16 elements x 2. Keys past n are zeros. */
static void pack_v(const uint16_t *vc, const int32_t *table, int64_t n, int64_t h, int64_t d, int64_t bs,
                   int64_t tok_stride, uint16_t *vt) {
    const int64_t blocks = (n + 31) / 32, slices = d / 16;
    for (int64_t j = 0; j < blocks * 32; ++j) {
        const uint16_t *row = cache_row(vc, table, j, n, h, d, bs, tok_stride);
        const int t = (int)(j % 32);
        for (int64_t s = 0; s < slices; ++s) {
            uint16_t *tile = vt + (j / 32 * slices + s) * 512;
            for (int e = 0; e < 16; ++e) tile[(t / 2) * 32 + e * 2 + t % 2] = row ? row[s * 16 + e] : 0;
        }
    }
}

/* One work item: rows r0 .. r0 + 15 of chunk (ctx, q_len) for kv head h. kt/vt: the chunk's
   packed K and V for h; sp: 16 x kpad fp32 scratch; pp: 16 x kpad bf16 scratch. */
static inline __attribute__((always_inline)) void tile_item(
        const uint16_t *q, int64_t q_stride, uint16_t *out, int64_t out_stride, const uint16_t *kt,
        const uint16_t *vt, int64_t ctx, int64_t q_len, int64_t r0, int64_t h, int64_t g_n, const int64_t d,
        float scale, float *sp, uint16_t *pp, int64_t kpad) {
    uint16_t qa[16 * MAX_D] __attribute__((aligned(64)));  /* Q rows, [d/32 slices][16 rows][32] */
    float o[16 * 16] __attribute__((aligned(64)));
    float inv[16];
    int64_t pos[16];
    const int64_t rows = q_len * g_n - r0 < 16 ? q_len * g_n - r0 : 16;
    const int64_t slices = d / 32;
    for (int l = 0; l < 16; ++l) {
        const int64_t r = r0 + (l < rows ? l : rows - 1);
        pos[l] = ctx + r / g_n;
        const uint16_t *qr = q + (r / g_n) * q_stride + (h * g_n + r % g_n) * d;
        for (int64_t s = 0; s < slices; ++s) {
            if (l < rows) memcpy(qa + s * 512 + l * 32, qr + s * 32, 64);
            else memset(qa + s * 512 + l * 32, 0, 64);
        }
    }
    const int64_t kend = pos[15] + 1, kblocks = (kend + 15) / 16;  /* keys the tile sees */
    /* S = Q K^T, four 16-key blocks at a time in tmm0-3 */
    for (int64_t b0 = 0; b0 < kblocks; b0 += 4) {
        const int nb = kblocks - b0 < 4 ? (int)(kblocks - b0) : 4;
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (int64_t s = 0; s < slices; ++s) {
            _tile_loadd(4, qa + s * 512, 64);
            const uint16_t *kb = kt + (b0 * slices + s) * 512;
            _tile_loadd(6, kb, 64); _tile_dpbf16ps(0, 4, 6);
            if (nb > 1) { _tile_loadd(7, kb + slices * 512, 64); _tile_dpbf16ps(1, 4, 7); }
            if (nb > 2) { _tile_loadd(6, kb + 2 * slices * 512, 64); _tile_dpbf16ps(2, 4, 6); }
            if (nb > 3) { _tile_loadd(7, kb + 3 * slices * 512, 64); _tile_dpbf16ps(3, 4, 7); }
        }
        float *sb = sp + b0 * 16;
        _tile_stored(0, sb, kpad * 4);
        if (nb > 1) _tile_stored(1, sb + 16, kpad * 4);
        if (nb > 2) _tile_stored(2, sb + 32, kpad * 4);
        if (nb > 3) _tile_stored(3, sb + 48, kpad * 4);
    }
    /* softmax of each row over keys [0, pos]: max, then exp and the sum in key order */
    const int64_t kcols = (kend + 31) / 32 * 32;  /* P's columns: whole 32-key A tiles */
    for (int l = 0; l < 16; ++l) {
        float *srow = sp + l * kpad;
        uint16_t *prow = pp + l * kpad;
        const int64_t n = pos[l] + 1;
        __m512 mx = _mm512_set1_ps(-__builtin_inff());
        int64_t j = 0;
        for (; j + 16 <= n; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(srow + j));
        if (j < n) mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-__builtin_inff()),
                                                               (__mmask16)((1u << (n - j)) - 1), srow + j));
        const float m = _mm512_reduce_max_ps(mx) * scale;
        const __m512 vs = _mm512_set1_ps(scale), vm = _mm512_set1_ps(m);
        __m512 sum = _mm512_setzero_ps();
        for (j = 0; j < kcols; j += 16) {
            const __mmask16 keep = j + 16 <= n ? 0xffff : (j < n ? (__mmask16)((1u << (n - j)) - 1) : 0);
            __m512 p = exp_neg16(_mm512_fmsub_ps(_mm512_loadu_ps(srow + j), vs, vm));
            p = _mm512_maskz_mov_ps(keep, p);
            sum = _mm512_add_ps(sum, p);
            _mm256_storeu_si256((__m256i *)(prow + j), (__m256i)_mm512_cvtneps_pbh(p));
        }
        inv[l] = 1.0f / _mm512_reduce_add_ps(sum);
    }
    /* O = P V, up to 64 head elements (four C tiles) a pass */
    const int64_t vslices = d / 16, vblocks = kcols / 32;
    for (int64_t e0 = 0; e0 < vslices; e0 += 4) {
        const int ec = vslices - e0 < 4 ? (int)(vslices - e0) : 4;  /* 2 or 4: d is a multiple of 32 */
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (int64_t b = 0; b < vblocks; ++b) {
            _tile_loadd(4, pp + b * 32, kpad * 2);
            const uint16_t *vb = vt + (b * vslices + e0) * 512;
            _tile_loadd(5, vb, 64); _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(6, vb + 512, 64); _tile_dpbf16ps(1, 4, 6);
            if (ec > 2) {
                _tile_loadd(7, vb + 1024, 64); _tile_dpbf16ps(2, 4, 7);
                _tile_loadd(5, vb + 1536, 64); _tile_dpbf16ps(3, 4, 5);
            }
        }
        for (int c = 0; c < ec; ++c) {
            switch (c) {  /* tile numbers are immediates */
            case 0: _tile_stored(0, o, 64); break;
            case 1: _tile_stored(1, o, 64); break;
            case 2: _tile_stored(2, o, 64); break;
            default: _tile_stored(3, o, 64); break;
            }
            for (int l = 0; l < rows; ++l) {
                const int64_t r = r0 + l;
                uint16_t *orow = out + (r / g_n) * out_stride + (h * g_n + r % g_n) * d + (e0 + c) * 16;
                const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(o + l * 16), _mm512_set1_ps(inv[l]));
                _mm256_storeu_si256((__m256i *)orow, (__m256i)_mm512_cvtneps_pbh(v));
            }
        }
    }
}

int paged_prefill_bf16_amx(const uint16_t *q, int64_t q_stride, uint16_t *out, int64_t out_stride, const uint16_t *kc,
                           const uint16_t *vc, const int32_t *tables, int64_t table_stride, const int64_t *q_start,
                           const int64_t *seq_idx, const int64_t *q_lens, const int64_t *ctx_lens, int64_t nchunks,
                           int64_t hq, int64_t hkv, int64_t d, int64_t bs, float scale) {
    if (d > MAX_D || d < 32 || d % 32 || hkv < 1 || hq % hkv || bs < 1) return -1;
    const int64_t g_n = hq / hkv, tok_stride = hkv * d;
    /* packed K/V per (chunk, kv head): offsets in keys (rounded to 32) */
    int64_t *first = malloc((size_t)(nchunks + 1) * sizeof(int64_t)), *koff = malloc((size_t)(nchunks + 1) * sizeof(int64_t));
    if (!first || !koff) { free(first); free(koff); return -2; }
    first[0] = 0, koff[0] = 0;
    int64_t kmax = 0;
    for (int64_t s = 0; s < nchunks; ++s) {
        const int64_t keys = (ctx_lens[s] + q_lens[s] + 31) / 32 * 32;
        first[s + 1] = first[s] + hkv * ((q_lens[s] * g_n + 15) / 16);
        koff[s + 1] = koff[s] + hkv * keys;
        if (keys > kmax) kmax = keys;
    }
    const int64_t kpad = (kmax + 63) / 64 * 64, nthreads = kernel_nthreads;
    /* K and V in tile order; per thread: S (16 x kpad fp32) and P (16 x kpad bf16) */
    uint16_t *kt = aligned_alloc(64, (size_t)(koff[nchunks] * d * 2 + 64));
    uint16_t *vt = aligned_alloc(64, (size_t)(koff[nchunks] * d * 2 + 64));
    char *scratch = aligned_alloc(64, (size_t)(nthreads * 16 * kpad * 6));
    if (!kt || !vt || !scratch) { free(first); free(koff); free(kt); free(vt); free(scratch); return -2; }
    OMP(omp parallel num_threads(nthreads))
    {
        OMP(omp for schedule(dynamic, 1))
        for (int64_t u = 0; u < nchunks * hkv; ++u) {
            const int64_t s = u / hkv, h = u % hkv, keys = (ctx_lens[s] + q_lens[s] + 31) / 32 * 32;
            const int32_t *table = tables + seq_idx[s] * table_stride;
            const int64_t at = (koff[s] + h * keys) * d;
            pack_k(kc, table, ctx_lens[s] + q_lens[s], h, d, bs, tok_stride, kt + at);
            pack_v(vc, table, ctx_lens[s] + q_lens[s], h, d, bs, tok_stride, vt + at);
        }
        float *sp = (float *)(scratch + (size_t)thread_id() * 16 * kpad * 6);
        uint16_t *pp = (uint16_t *)(sp + 16 * kpad);
        amx_configure();  /* tile state is per thread */
        OMP(omp for schedule(dynamic, 1))
        for (int64_t w = 0; w < first[nchunks]; ++w) {
            int64_t lo = 0, hi = nchunks - 1;  /* the chunk: last s with first[s] <= w */
            while (lo < hi) { const int64_t mid = (lo + hi + 1) / 2; if (first[mid] <= w) lo = mid; else hi = mid - 1; }
            const int64_t s = lo, tiles = (q_lens[s] * g_n + 15) / 16, keys = (ctx_lens[s] + q_lens[s] + 31) / 32 * 32;
            const int64_t h = (w - first[s]) / tiles, r0 = ((w - first[s]) % tiles) * 16;
            const int64_t at = (koff[s] + h * keys) * d;
            const uint16_t *qs = q + q_start[s] * q_stride;
            uint16_t *os = out + q_start[s] * out_stride;
            if (d == 64)
                tile_item(qs, q_stride, os, out_stride, kt + at, vt + at, ctx_lens[s], q_lens[s], r0, h, g_n, 64,
                          scale, sp, pp, kpad);
            else
                tile_item(qs, q_stride, os, out_stride, kt + at, vt + at, ctx_lens[s], q_lens[s], r0, h, g_n, d,
                          scale, sp, pp, kpad);
        }
        _tile_release();
    }
    free(first); free(koff); free(kt); free(vt); free(scratch);
    return 0;
}
