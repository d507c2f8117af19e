/* Part of quant_linear.c (the loader inlines it there): the 16-row interleaved layout, built
   once at load for the 16-row kernels of quant_g16_avx512.h and quant_g16_avx2.h, and its row
   lookup (the embedding). Plain C: the same bytes on every ISA. */

/* Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 repacked once at load for a 512-bit dot: rows in groups of
   16, and per group and 32-element block one record: the 16 rows' scales d (f16 [16]), their
   offsets o (f16 [16]: Q4_1's and Q5_1's m, Q4_0's -8 d, Q5_0's -16 d, Q8_0's -128 d but on
   AVX2), then the weights as unsigned q (the weight is d * q + o), 4 bytes (4 elements) of each
   of the 16 rows per 64-byte vector (rows 0-7 in its first 32 bytes: AVX2's half): Q8_0 8
   vectors (element 4t + b of row r at byte 4r + b of vector t, as w + 128); Q4_x and Q5_x 4 vectors of nibbles (vector p: element 8p + b in the low nibble of
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
/* Bytes before a record's weights: the scales and offsets of the 16 rows. The AVX2 kernel
   reads no offset for Q8_0 (|w| against sign(x, w)), so its build stores none: 8.5 bits a
   weight, the file's, where the AVX512 build (unsigned w + 128 for vpdpbusd, offset -128 d)
   holds 9. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define Q8_0_HEAD 64
#else
#define Q8_0_HEAD 32
#endif
static inline int rec16_head(int type) { return type == GGML_Q8_0 ? Q8_0_HEAD : 64; }
static inline int rec16_bytes(int type) { /* per group and 32 elements (K-quants: per 256) */
    if (k16_sub_bytes(type)) return 64 + 8 * k16_sub_bytes(type);
    switch (type) {
    case GGML_Q8_0: return Q8_0_HEAD + 512;
    case GGML_Q4_0: case GGML_Q4_1: return 64 + 256;
    case GGML_Q5_0: case GGML_Q5_1: return 64 + 256 + 64; /* the nibbles, then the fifth-bit plane */
    default: return 0;
    }
}

/* Part `part` of `parts` of bytes [p, p + bytes) fetched into L2: a stream of weights fetched a
   share at a time while the kernel works from L1 on what it already has. The 16-row kernels fetch
   the next group during the passes of rows of x over this one after the first (without it each
   group started with the memory bus idle: 16 rows of x on a Zen 5, the 30 layers of SmolLM2 in
   Q4_1, 1.3-1.5x slower; one pass fetches nothing: a burst at the group's start slowed one row
   down), the scratch tiles the next slice during the tiles of rows. */
static inline void prefetch_share(const uint8_t *p, int64_t bytes, int64_t part, int64_t parts) {
    const int64_t share = (bytes / parts + 63) & ~(int64_t)63;
    for (int64_t f = part * share; f < (part + 1) * share && f < bytes; f += 64)
        _mm_prefetch((const char *)(p + f), _MM_HINT_T1);
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
            uint8_t *q = rec + rec16_head(type);
            for (int r = 0; r < G16 && g * G16 + r < n; ++r) {
                const uint8_t *p = w + (g * G16 + r) * row_bytes + b * qblock_bytes(type);
                uint8_t e[32]; /* unsigned q of the 32 elements */
                if (type == GGML_Q8_0) {
                    const blk_q8_0 *blk = (const blk_q8_0 *)p;
                    d[r] = blk->d;
                    if (Q8_0_HEAD == 64) o[r] = _cvtss_sh(-128.0f * f16_to_f32(blk->d), 0);
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
        const float d = f16_to_f32(((const uint16_t *)rec)[r]);
        const float o = type == GGML_Q8_0 ? 0.0f : f16_to_f32(((const uint16_t *)(rec + 32))[r]);
        const uint8_t *q = rec + rec16_head(type);
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

int quant_rows16(int type, const uint8_t *wp, int64_t n, int64_t k, const int64_t *ids, int64_t n_ids, void *out,
                 int out_bf16) {
    if (!rec16_bytes(type) || k % qblock_elems(type)) return -1;
    for (int64_t i = 0; i < n_ids; ++i)
        if (ids[i] < 0 || ids[i] >= n) return -2;
    SHARED(n_ids, n_ids > 1, for (int64_t i = lo; i < hi; ++i) {
        float v[k];
        repacked_row(type, wp, k, ids[i], v);
        for (int64_t e = 0; e < k; ++e) {
            if (out_bf16) ((uint16_t *)out)[i * k + e] = f32_to_bf16(v[e]);
            else ((float *)out)[i * k + e] = v[e];
        }
    });
    return 0;
}
