/* GGUF (llama.cpp) quantized block formats, as they lie in the file, and their unpacking into
   32 bytes of one 256-bit register: the weights of one 32-element sub-block as small unsigned
   integers q, the weight being scale * q + offset (Q8_0: signed, scale * q). Sub-blocks are the
   units the activations are quantized in (32 elements), so a K-quant super-block of 256 is 8 of
   them. Shared by quant_linear.c's matmul (which never writes a dequantized weight) and its row
   dequantizer (the embedding). Scalars are IEEE binary16 (F16C's vcvtph2ps). */
#include <immintrin.h>
#include <stdint.h>

enum { /* ggml_type ids, as in the GGUF tensor info */
    GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
    GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14,
};

typedef struct { uint16_t d; uint8_t qs[16]; } blk_q4_0;                          /* 18 bytes / 32 */
typedef struct { uint16_t d, m; uint8_t qs[16]; } blk_q4_1;                       /* 20 bytes / 32 */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_0;           /* 22 bytes / 32 */
typedef struct { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; } blk_q5_1;        /* 24 bytes / 32 */
typedef struct { uint16_t d; int8_t qs[32]; } blk_q8_0;                           /* 34 bytes / 32 */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } blk_q4_k; /* 144 / 256 */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } blk_q5_k; /* 176 / 256 */
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } blk_q6_k; /* 210 / 256 */

/* Elements per block and bytes per block of a type; 0 for a type this file does not know. */
static inline int qblock_elems(int type) {
    return type == GGML_Q4_K || type == GGML_Q5_K || type == GGML_Q6_K ? 256 : 32;
}
static inline int qblock_bytes(int type) {
    switch (type) {
    case GGML_Q4_0: return sizeof(blk_q4_0);
    case GGML_Q4_1: return sizeof(blk_q4_1);
    case GGML_Q5_0: return sizeof(blk_q5_0);
    case GGML_Q5_1: return sizeof(blk_q5_1);
    case GGML_Q8_0: return sizeof(blk_q8_0);
    case GGML_Q4_K: return sizeof(blk_q4_k);
    case GGML_Q5_K: return sizeof(blk_q5_k);
    case GGML_Q6_K: return sizeof(blk_q6_k);
    default: return 0;
    }
}

static inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

/* 16 bytes of nibbles -> 32 bytes: the low nibbles (elements 0-15), then the high (16-31). */
static inline __m256i nibbles_32(const uint8_t *qs) {
    const __m128i v = _mm_loadu_si128((const __m128i *)qs), low = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
}

/* 32 bits (bit j: element j's fifth bit) -> 32 bytes of 0x10 or 0. */
static inline __m256i fifth_bits_32(const uint8_t *qh) {
    uint32_t bits;
    __builtin_memcpy(&bits, qh, 4);
    /* byte j takes qh's byte j / 8, then tests its bit j % 8 */
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
        _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0));
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0-7) from the 12 packed bytes. */
static inline void k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K / Q5_K sub-block j: 32 bytes of qs serve sub-blocks 2i (low nibbles) and 2i+1 (high). */
static inline __m256i k_nibbles(const uint8_t *qs, int j) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j >> 1)));
    return _mm256_and_si256(j & 1 ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0F));
}

/* Q5_K sub-block j: bit j of each of the 32 qh bytes is the fifth bit of its element. */
static inline __m256i q5k_fifth(const uint8_t *qh, int j) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)qh);
    return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(v, j), _mm256_set1_epi8(1)), 4);
}

/* Q6_K 32-element group g (0-7): half h = g / 4 holds 128 elements; group i = g % 4 of it
   takes the low (i < 2) or high nibbles of ql[64h + 32 (i % 2) ...] and bits 2i, 2i+1 of
   qh[32h ...]; q = nibble | bits << 4 (0-63, the weight d * scale * (q - 32)). */
static inline __m256i q6k_group(const blk_q6_k *b, int g) {
    const int h = g >> 2, i = g & 3;
    const __m256i l = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32 * (i & 1)));
    const __m256i hb = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
    const __m256i nib = _mm256_and_si256(i >> 1 ? _mm256_srli_epi16(l, 4) : l, _mm256_set1_epi8(0x0F));
    const __m256i top = _mm256_and_si256(_mm256_srli_epi16(hb, 2 * i), _mm256_set1_epi8(3));
    return _mm256_or_si256(nib, _mm256_slli_epi16(top, 4));
}
