/* Part of quant_linear.c (the loader inlines it there, in the AVX2 build): the 16-row kernels on
   quant_repack16.h's layout without AVX-512. A record's 64-byte vector is two 256-bit halves,
   rows 0-7 and rows 8-15; each half is one vpmaddubsw against 4 broadcast bytes of x (8 rows x
   4 elements), so the scaling, conversion and accumulation are vector operations over 8 rows
   where the row kernel spends them per row. The pair sums stay int16 while they cannot
   overflow (|x| <= 127: 4-bit q 8 products a lane, 5-bit 4, 6-bit 2), then one vpmaddwd widens
   them. Q8_0 (stored as w + 128, too wide for vpmaddubsw's signed pairs) takes |w| against
   sign(x, w) as the row kernel does, and no offset. In registers at every row count (2 rows of
   x per unpacking): each output is one lane's sum over k in block order, whatever m or thread.
   With one pass of x's rows over the weights (1 or 2 rows: decode) they are one sequential
   stream, fetched PF_AHEAD bytes ahead of the record in use: on a Zen 1 the hardware prefetcher
   alone left the kernel waiting on memory half the time (Q4_1 at 5 GB/s of the 13.6 GB/s one
   core streams; with the prefetches 10 GB/s, as fast as from L3). With more passes
   prefetch_share fetches the next group instead. */
#define HAVE_REPACK16 1
#define PF_AHEAD 2048
/* Lines [p + PF_AHEAD, p + PF_AHEAD + bytes) into L1 (past the weights' end too: a prefetch
   never faults). An asm statement: gcc 12's dead-code elimination dropped _mm_prefetch from
   these loops (the AVX2 build had no prefetch instruction). */
static inline void prefetch_ahead(const uint8_t *p, int bytes) {
    for (int f = 0; f < bytes; f += 64) __asm__ volatile("prefetcht0 %0" : : "m"(p[PF_AHEAD + f]));
}
#define RM16 2 /* rows of x per tile: 2 halves x 2 accumulators, 2 x 2 integer chains, the vectors */

static inline __m256i ones16(void) { return _mm256_set1_epi16(1); }

/* 4 bytes of x row i at element e, broadcast to the 8 rows' lanes. */
static inline __m256i xb4(const int8_t *x, int64_t e) {
    int32_t v;
    memcpy(&v, x + e, 4);
    return _mm256_set1_epi32(v);
}

/* Half h of vector p (0-3) of a Q4_0 / Q4_1 / Q5_0 / Q5_1 record as bytes: *vl the elements
   8p + b, *vh 8p + 4 + b (b = 0-3) of rows 8h .. 8h + 7, 4 bytes a row. */
static inline __attribute__((always_inline)) void h8_vectors(const int T, const uint8_t *rec, int p, int h,
        __m256i *vl, __m256i *vh) {
    const __m256i low = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(rec + 64 + 64 * p + 32 * h));
    *vl = _mm256_and_si256(v, low);
    *vh = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    if (T == GGML_Q5_0 || T == GGML_Q5_1) {
        const __m256i q5 = _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(rec + 64 + 256 + 32 * h)), 2 * p);
        *vl = _mm256_or_si256(*vl, _mm256_slli_epi16(_mm256_and_si256(q5, one), 4));
        *vh = _mm256_or_si256(*vh, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(q5, 1), one), 4));
    }
}

/* The same for half h of the record `sub` of one K-quant sub-block. */
static inline __attribute__((always_inline)) void h8k_vectors(const int T, const uint8_t *sub, int p, int h,
        __m256i *vl, __m256i *vh) {
    const __m256i low = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1), three = _mm256_set1_epi8(3);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(sub + 32 + 64 * p + 32 * h));
    *vl = _mm256_and_si256(v, low);
    *vh = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    if (T == GGML_Q5_K) {
        const __m256i q5 = _mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(sub + 32 + 256 + 32 * h)), 2 * p);
        *vl = _mm256_or_si256(*vl, _mm256_slli_epi16(_mm256_and_si256(q5, one), 4));
        *vh = _mm256_or_si256(*vh, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(q5, 1), one), 4));
    } else if (T == GGML_Q6_K) {
        __m256i q6 = _mm256_loadu_si256((const __m256i *)(sub + 32 + 256 + 64 * (p >> 1) + 32 * h));
        if (p & 1) q6 = _mm256_srli_epi16(q6, 4);
        *vl = _mm256_or_si256(*vl, _mm256_slli_epi16(_mm256_and_si256(q6, three), 4));
        *vh = _mm256_or_si256(*vh, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(q6, 2), three), 4));
    }
}

/* 8 f16 at p as float32. */
static inline __m256 h8_f16(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* 8 scale bytes at p (signed where sgn) as float32. */
static inline __m256 h8_u8(const uint8_t *p, int sgn) {
    const __m128i b = _mm_loadl_epi64((const __m128i *)p);
    return _mm256_cvtepi32_ps(sgn ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
}

/* One group of 16 weight rows x rm rows of x (pf: fetch the weights ahead): acc[2 * i + h] lane r = y[i][row 8h + r]. */
static inline __attribute__((always_inline)) void h8_tile(const int T, const int rm, const uint8_t *wp, int64_t nb,
        const int8_t *xq, int64_t k, const float *xd, const float *xs, __m256 *acc, int pf) {
    const int rb = rec16_bytes(T);
    for (int i = 0; i < 2 * rm; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *rec = wp + b * rb;
        if (pf) prefetch_ahead(rec, rb);
        for (int h = 0; h < 2; ++h) {
            const __m256 d = h8_f16(rec + 16 * h);
            __m256i dot[RM16];
            if (T == GGML_Q8_0) {
                for (int i = 0; i < rm; ++i) dot[i] = _mm256_setzero_si256();
                for (int t = 0; t < 8; ++t) {
                    const __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(rec + Q8_0_HEAD + 64 * t + 32 * h)),
                                                       _mm256_set1_epi8((char)0x80)); /* w + 128 -> w */
                    const __m256i aw = _mm256_abs_epi8(w);
                    for (int i = 0; i < rm; ++i)
                        dot[i] = _mm256_add_epi32(dot[i], _mm256_madd_epi16(
                            _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xb4(xq + i * k, b * 32 + 4 * t), w)), ones16()));
                }
            } else {
                __m256i lo[RM16], hi[RM16]; /* int16 pair sums: 4 products a lane each */
                for (int i = 0; i < rm; ++i) lo[i] = hi[i] = _mm256_setzero_si256();
                for (int p = 0; p < 4; ++p) {
                    __m256i vl, vh;
                    h8_vectors(T, rec, p, h, &vl, &vh);
                    for (int i = 0; i < rm; ++i) {
                        lo[i] = _mm256_add_epi16(lo[i], _mm256_maddubs_epi16(vl, xb4(xq + i * k, b * 32 + 8 * p)));
                        hi[i] = _mm256_add_epi16(hi[i], _mm256_maddubs_epi16(vh, xb4(xq + i * k, b * 32 + 8 * p + 4)));
                    }
                }
                for (int i = 0; i < rm; ++i) /* 4-bit: 8 products a lane fit int16 (8 x 15 x 127 x 2 < 2^15) */
                    dot[i] = T == GGML_Q4_0 || T == GGML_Q4_1
                        ? _mm256_madd_epi16(_mm256_add_epi16(lo[i], hi[i]), ones16())
                        : _mm256_add_epi32(_mm256_madd_epi16(lo[i], ones16()), _mm256_madd_epi16(hi[i], ones16()));
            }
            for (int i = 0; i < rm; ++i) {
                __m256 *a = acc + 2 * i + h;
                *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[i]), _mm256_mul_ps(d, _mm256_set1_ps(xd[i * nb + b])), *a);
                if (T != GGML_Q8_0)
                    *a = _mm256_fmadd_ps(h8_f16(rec + 32 + 16 * h), _mm256_set1_ps(xs[(i * nb + b) * 4 + 2]), *a);
            }
        }
    }
}

/* The same for a K-quant group (nb: k / 32; records per super-block of 256). Q4_K / Q5_K: one
   scale and one min per sub-block; Q6_K: a scale per half sub-block and its -32 per half. */
static inline __attribute__((always_inline)) void h8k_tile(const int T, const int rm, const uint8_t *wp, int64_t nb,
        const int8_t *xq, int64_t k, const float *xd, const float *xs, __m256 *acc, int pf) {
    const int rb = rec16_bytes(T), sbytes = k16_sub_bytes(T);
    for (int i = 0; i < 2 * rm; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t s = 0; s < nb / 8; ++s) {
        const uint8_t *rec = wp + s * rb;
        for (int j = 0; j < 8; ++j) {
            const uint8_t *sub = rec + 64 + j * sbytes;
            if (pf) prefetch_ahead(sub, sbytes);
            const int64_t xb = s * 8 + j;
            for (int h = 0; h < 2; ++h) {
                /* float32 scales as the row kernel has them: d * sc and -(dmin * m); Q6_K d * sc per half */
                const __m256 d = h8_f16(rec + 16 * h);
                const __m256 sa = _mm256_mul_ps(d, h8_u8(sub + 8 * h, T == GGML_Q6_K));
                const __m256 sb = T == GGML_Q6_K ? _mm256_mul_ps(d, h8_u8(sub + 16 + 8 * h, 1))
                    : _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(h8_f16(rec + 32 + 16 * h), h8_u8(sub + 16 + 8 * h, 0)));
                __m256i c0[RM16], c1[RM16]; /* Q6_K: elements 0-15 / 16-31; else all of the sub-block in c0 */
                for (int i = 0; i < rm; ++i) c0[i] = c1[i] = _mm256_setzero_si256();
                for (int p = 0; p < 4; ++p) {
                    __m256i vl, vh;
                    h8k_vectors(T, sub, p, h, &vl, &vh);
                    for (int i = 0; i < rm; ++i) {
                        const __m256i pl = _mm256_maddubs_epi16(vl, xb4(xq + i * k, xb * 32 + 8 * p));
                        const __m256i ph = _mm256_maddubs_epi16(vh, xb4(xq + i * k, xb * 32 + 8 * p + 4));
                        if (T == GGML_Q4_K) { /* int16 all the way: 8 products a lane */
                            c0[i] = _mm256_add_epi16(c0[i], _mm256_add_epi16(pl, ph));
                        } else if (T == GGML_Q5_K) { /* int16 chains of 4 products a lane */
                            c0[i] = _mm256_add_epi16(c0[i], pl);
                            c1[i] = _mm256_add_epi16(c1[i], ph);
                        } else { /* 6-bit: 2 products a lane in int16, then widened */
                            const __m256i w32 = _mm256_madd_epi16(_mm256_add_epi16(pl, ph), ones16());
                            if (p < 2) c0[i] = _mm256_add_epi32(c0[i], w32);
                            else c1[i] = _mm256_add_epi32(c1[i], w32);
                        }
                    }
                }
                for (int i = 0; i < rm; ++i) {
                    __m256 *a = acc + 2 * i + h;
                    const __m256 dx = _mm256_set1_ps(xd[i * nb + xb]);
                    const float *xsp = xs + (i * nb + xb) * 4;
                    if (T == GGML_Q6_K) {
                        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c0[i]), _mm256_mul_ps(sa, dx), *a);
                        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c1[i]), _mm256_mul_ps(sb, dx), *a);
                        *a = _mm256_fmadd_ps(sa, _mm256_set1_ps(-32.0f * xsp[0]), *a);
                        *a = _mm256_fmadd_ps(sb, _mm256_set1_ps(-32.0f * xsp[1]), *a);
                    } else {
                        const __m256i dot = T == GGML_Q4_K ? _mm256_madd_epi16(c0[i], ones16())
                            : _mm256_add_epi32(_mm256_madd_epi16(c0[i], ones16()), _mm256_madd_epi16(c1[i], ones16()));
                        *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(sa, dx), *a);
                        *a = _mm256_fmadd_ps(sb, _mm256_set1_ps(xsp[2]), *a);
                    }
                }
            }
        }
    }
}

typedef void (*h8_fn)(const uint8_t *, int64_t, const int8_t *, int64_t, const float *, const float *, __m256 *, int);
#define H8FN(T, M) static void h8_##T##_##M(const uint8_t *wp, int64_t nb, const int8_t *xq, int64_t k, \
    const float *xd, const float *xs, __m256 *acc, int pf) { \
    if (k16_sub_bytes(T)) h8k_tile(T, M, wp, nb, xq, k, xd, xs, acc, pf); else h8_tile(T, M, wp, nb, xq, k, xd, xs, acc, pf); }
#define H8TYPE(T) H8FN(T, 1) H8FN(T, 2) static const h8_fn H8_##T[RM16 + 1] = {0, h8_##T##_1, h8_##T##_2};
H8TYPE(GGML_Q4_0) H8TYPE(GGML_Q4_1) H8TYPE(GGML_Q5_0) H8TYPE(GGML_Q5_1) H8TYPE(GGML_Q8_0)
H8TYPE(GGML_Q4_K) H8TYPE(GGML_Q5_K) H8TYPE(GGML_Q6_K)

static const h8_fn *h8_of(int type) {
    switch (type) {
    case GGML_Q4_0: return H8_GGML_Q4_0;
    case GGML_Q4_1: return H8_GGML_Q4_1;
    case GGML_Q5_0: return H8_GGML_Q5_0;
    case GGML_Q5_1: return H8_GGML_Q5_1;
    case GGML_Q8_0: return H8_GGML_Q8_0;
    case GGML_Q4_K: return H8_GGML_Q4_K;
    case GGML_Q5_K: return H8_GGML_Q5_K;
    case GGML_Q6_K: return H8_GGML_Q6_K;
    }
    return 0;
}

/* y[m, n] = x @ W^T on a repacked W (quant_repack16), x as quant_x left it. Threads split the
   16-row groups; rows of x in blocks of X_BLOCK_ROWS per pass over the weights. */
int quant_linear16(int type, const int8_t *xq, const float *xd, const float *xs, int64_t m, int64_t k,
                   const uint8_t *wp, int64_t n, void *y, int64_t ldy, int y_bf16) {
    const h8_fn *tile = h8_of(type);
    if (!tile || k <= 0 || k % qblock_elems(type) || m < 0 || n < 0) return -1;
    const int64_t nb = k / 32, groups = (n + G16 - 1) / G16, rec_group = k / qblock_elems(type) * rec16_bytes(type);
    SHARED(groups, groups >= 2, for (int64_t m0 = 0; m0 < m; m0 += X_BLOCK_ROWS) {
        const int64_t m1 = m - m0 < X_BLOCK_ROWS ? m : m0 + X_BLOCK_ROWS;
        for (int64_t g = lo; g < hi; ++g) {
            const int64_t n0 = g * G16, rn = n - n0 < G16 ? n - n0 : G16;
            const int64_t passes = (m1 - m0 + RM16 - 1) / RM16;
            for (int64_t i0 = m0, pass = 0; i0 < m1; i0 += RM16, ++pass) {
                const int rm = (int)(m1 - i0 < RM16 ? m1 - i0 : RM16);
                if (passes > 1) prefetch_share(wp + (g + 1) * rec_group, rec_group, pass, passes); /* the next group */
                __m256 acc[2 * RM16];
                tile[rm](wp + g * rec_group, nb, xq + i0 * k, k, xd + i0 * nb, xs + i0 * nb * 4, acc, passes == 1);
                for (int i = 0; i < rm; ++i) {
                    float out[G16];
                    _mm256_storeu_ps(out, acc[2 * i]);
                    _mm256_storeu_ps(out + 8, acc[2 * i + 1]);
                    store_row16(out, rn, y, (i0 + i) * ldy + n0, y_bf16);
                }
            }
        }
    });
    return 0;
}

int quant_amx(int mode) { (void)mode; return 0; }
