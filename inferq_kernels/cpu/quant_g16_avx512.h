/* Part of quant_linear.c (the loader inlines it there, in the AVX512-VNNI build): the 16-row
   kernels on quant_repack16.h's layout, in registers for a few rows of x and through an L1
   scratch (vpdpbusd, or AMX-INT8 where the CPU has it) for many. */
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
/* Fewer rows of x run the in-register tiles (measured: docs/kernels.md): from 16 where AMX tiles
   read the scratch, from 64 on the vector tiles (16-48 rows 7-19 % faster in registers on a Zen 4) */
#define SCR_MIN_ROWS_AMX 16
#define SCR_MIN_ROWS 64
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

/* Rows m0 .. m1 - 1 of y's columns n0 .. n0 + rn - 1 from one group (wg): the in-register
   tiles, RM_MAX rows of x at a time. */
static void g16_group_regs(const g16_kernels *kern, const uint8_t *wg, int64_t nb, const int8_t *xq, int64_t k,
        const float *xd, const float *xs, int64_t m0, int64_t m1, int64_t n0, int64_t rn, void *y, int64_t ldy,
        int y_bf16, int64_t group_bytes) {
    const int64_t passes = (m1 - m0 + RM_MAX - 1) / RM_MAX;
    for (int64_t i0 = m0, pass = 0; i0 < m1; i0 += RM_MAX, ++pass) {
        const int rm = (int)(m1 - i0 < RM_MAX ? m1 - i0 : RM_MAX);
        if (passes > 1) prefetch_share(wg + group_bytes, group_bytes, pass, passes); /* the next group */
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
        int64_t ldy, int y_bf16, int64_t group_bytes) {
    uint8_t scr[SCR_BLOCKS * SCR_BLOCK] __attribute__((aligned(64)));
    float acc[SCR_X_ROWS * G16] __attribute__((aligned(64)));
    memset(acc, 0, sizeof acc);
    const int64_t block_bytes = group_bytes / nb, tiles = (m1 - m0 + XR - 1) / XR;
    for (int64_t b0 = 0; b0 < nb; b0 += SCR_BLOCKS) {
        const int64_t kn = nb - b0 < SCR_BLOCKS ? nb - b0 : SCR_BLOCKS;
        kern->unpack(wg, b0, kn, scr);
        /* the next slice's records (past the last, the next group's), a share per tile of rows */
        const uint8_t *next = wg + (b0 + kn) * block_bytes;
        for (int64_t i0 = m0, tile = 0; i0 < m1; ++tile) {
            prefetch_share(next, SCR_BLOCKS * block_bytes, tile, tiles);
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

/* A thread's AMX tiles for its share of quant_linear16 (where amx: AMX runs it) */
static inline void g16_tiles_begin(int amx, int six) {
#if HAVE_AMX_INT8
    if (amx) amx_setup(six);
#else
    (void)amx, (void)six;
#endif
}
static inline void g16_tiles_end(int amx) {
#if HAVE_AMX_INT8
    if (amx) _tile_release();
#else
    (void)amx;
#endif
}

/* y[m, n] = x @ W^T on a repacked W (quant_repack16), x as quant_x left it. Threads split the
   16-row groups; each output is one lane's sum over k in block order, whatever m or thread. */
int quant_linear16(int type, const int8_t *xq, const float *xd, const float *xs, int64_t m, int64_t k,
                   const uint8_t *wp, int64_t n, void *y, int64_t ldy, int y_bf16) {
    const g16_kernels *kern = g16_of(type);
    if (!kern || k <= 0 || k % qblock_elems(type) || m < 0 || n < 0) return -1;
    const int64_t nb = k / 32, groups = (n + G16 - 1) / G16, rec_group = k / qblock_elems(type) * rec16_bytes(type);
    const int amx = m >= G16 && amx_ready();
    const int64_t scr_min = amx ? SCR_MIN_ROWS_AMX : SCR_MIN_ROWS;
    const int64_t xrows = m >= scr_min ? SCR_X_ROWS : X_BLOCK_ROWS;
    SHARED(groups, groups >= 2,
        g16_tiles_begin(amx, kern->six); /* tile state is per thread */
        for (int64_t m0 = 0; m0 < m; m0 += xrows) {
            const int64_t m1 = m - m0 < xrows ? m : m0 + xrows;
            for (int64_t g = lo; g < hi; ++g) {
                const int64_t n0 = g * G16, rn = n - n0 < G16 ? n - n0 : G16;
                if (m1 - m0 >= scr_min)
                    g16_group_scratch(kern, amx, wp + g * rec_group, nb, xq, k, xd, xs, m0, m1, n0, rn, y, ldy, y_bf16,
                                      rec_group);
                else
                    g16_group_regs(kern, wp + g * rec_group, nb, xq, k, xd, xs, m0, m1, n0, rn, y, ldy, y_bf16, rec_group);
            }
        }
        g16_tiles_end(amx););
    return 0;
}
