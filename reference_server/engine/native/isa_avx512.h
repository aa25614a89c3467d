/* forward.c's vectors on AVX-512 (F, BW, VL, DQ, BF16, VNNI): 16 float32 lanes are one zmm
 * register, and each operation the kernels name is the instruction of the same name. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define ISA_NAME "avx512"
#define TILE_ROWS 6  /* activation rows per bf16 register tile: 6 x 4 accumulators of 32 zmm */
#define WIDENED_BF16 0 /* vdpbf16ps reads bf16 itself: register tiles of rows share a load */
#define QUANT_TILE_ROWS 3 /* up to 3 rows, a register tile unpacks the codes it uses; more share them (quant_rows) */

typedef __m512 v16f;
typedef __m512i v16i;
typedef __m512bh v16bf; /* 16 pairs of bf16: one dpbf16 operand */

#define v16_abs_ps _mm512_abs_ps
#define v16_add_epi32 _mm512_add_epi32
#define v16_add_epi64 _mm512_add_epi64
#define v16_add_ps _mm512_add_ps
#define v16_and_si512 _mm512_and_si512
#define v16_cmpeq_epi32_mask _mm512_cmpeq_epi32_mask
#define v16_cvtepi32_epi8 _mm512_cvtepi32_epi8
#define v16_cvtepi32_ps _mm512_cvtepi32_ps
#define v16_cvtepi8_epi16 _mm512_cvtepi8_epi16
#define v16_cvtph_ps _mm512_cvtph_ps
#define v16_cvtps_epi32 _mm512_cvtps_epi32
#define v16_cvtsepi32_epi16 _mm512_cvtsepi32_epi16
#define v16_div_ps _mm512_div_ps
#define v16_dpbf16_ps _mm512_dpbf16_ps
#define v16_fmadd_ps _mm512_fmadd_ps
#define v16_load_si512 _mm512_load_si512
#define v16_loadu_ps _mm512_loadu_ps
#define v16_loadu_si512 _mm512_loadu_si512
#define v16_mask_blend_ps _mm512_mask_blend_ps
#define v16_mask_i32gather_ps _mm512_mask_i32gather_ps
#define v16_mask_i64gather_epi32 _mm512_mask_i64gather_epi32
#define v16_mask_storeu_ps _mm512_mask_storeu_ps
#define v16_maskz_loadu_epi16 _mm512_maskz_loadu_epi16
#define v16_maskz_loadu_epi32 _mm512_maskz_loadu_epi32
#define v16_maskz_loadu_ps _mm512_maskz_loadu_ps
#define v16_maskz_mov_ps _mm512_maskz_mov_ps
#define v16_max_ps _mm512_max_ps
#define v16_min_ps _mm512_min_ps
#define v16_mul_ps _mm512_mul_ps
#define v16_reduce_add_ps _mm512_reduce_add_ps
#define v16_reduce_max_ps _mm512_reduce_max_ps
#define v16_scalef_ps _mm512_scalef_ps
#define v16_set1_epi32 _mm512_set1_epi32
#define v16_set1_epi64 _mm512_set1_epi64
#define v16_set1_epi8 _mm512_set1_epi8
#define v16_set1_ps _mm512_set1_ps
#define v16_set_epi32 _mm512_set_epi32
#define v16_setzero_ps _mm512_setzero_ps
#define v16_setzero_si512 _mm512_setzero_si512
#define v16_slli_epi32 _mm512_slli_epi32
#define v16_srli_epi32 _mm512_srli_epi32
#define v16_store_si512 _mm512_store_si512
#define v16_storeu_ps _mm512_storeu_ps
#define v16_storeu_si512 _mm512_storeu_si512
#define v16_sub_epi32 _mm512_sub_epi32
#define v16_sub_ps _mm512_sub_ps
#define v16_unpackhi_epi32 _mm512_unpackhi_epi32
#define v16_unpackhi_epi64 _mm512_unpackhi_epi64
#define v16_unpacklo_epi32 _mm512_unpacklo_epi32
#define v16_unpacklo_epi64 _mm512_unpacklo_epi64

/* 32 bf16 (pairs of neighbours in each 32-bit lane) as a dpbf16 operand */
static inline v16bf v16_bf16(v16i v) { return (v16bf)v; }

static inline v16f v16_cvtpbh_ps(__m256i v) { return _mm512_cvtpbh_ps((__m256bh)v); }

/* round to nearest even bf16 */
static inline __m256i v16_cvtneps_pbh(v16f v) { return (__m256i)_mm512_cvtneps_pbh(v); }

static inline v16f v16_round_nearest_ps(v16f v) {
    return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* 128-bit quarters 0, 2 of a then of b; and 1, 3 of each */
static inline v16i v16_even_quarters(v16i a, v16i b) { return _mm512_shuffle_i32x4(a, b, 0x88); }
static inline v16i v16_odd_quarters(v16i a, v16i b) { return _mm512_shuffle_i32x4(a, b, 0xdd); }

/* the 16-bit elements 0 .. 15 (low) or 16 .. 31 (high) of a and b interleaved: a0 b0 a1 b1 .. */
static inline v16i v16_interleave_low(v16i a, v16i b) {
    const v16i index = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                        39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    return _mm512_permutex2var_epi16(a, index, b);
}
static inline v16i v16_interleave_high(v16i a, v16i b) {
    const v16i index = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24,
                                        55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
    return _mm512_permutex2var_epi16(a, index, b);
}

/* the bf16 bits of each nibble's value, its code 0 .. 15; twice, as vpermw reads 5 index bits */
static const uint16_t LOW_CODES[32] = {
    0x0000, 0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0, 0x40e0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170,
    0x0000, 0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0, 0x40e0, 0x4100, 0x4110, 0x4120, 0x4130, 0x4140, 0x4150, 0x4160, 0x4170,
};

/* each 16-bit word's nibble at `shift` as its code (0 .. 15) in a dpbf16 operand: the values
 * themselves (CODE_UNIT 1) */
static inline v16bf v16_low_codes(v16i words, int shift) {
    return (v16bf)_mm512_permutexvar_epi16(_mm512_srli_epi16(words, shift), _mm512_loadu_si512(LOW_CODES));
}

/* 32 int8 codes, in dpbf16 operand order, as their values: an int8 is exact in bf16 */
static inline v16bf v16_q8_codes(const uint8_t *codes) {
    const __m512 first = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)codes)));
    const __m512 second = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(codes + 16))));
    return _mm512_cvtne2ps_pbh(second, first); /* elements 0 .. 15 from first, 16 .. 31 from second */
}
#define CODE_UNIT(shift) 1.0f

/* acc + the dot products of a's and b's int16 pairs, lane by lane (vpdpwssd). Written out because
 * GCC copies the accumulator of _mm512_dpwssd_epi32 into a fresh register at every call in a loop. */
static inline v16i v16_dot_pairs(v16i acc, v16i a, v16i b) {
    __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

/* acc + the dot products of a's unsigned and b's signed bytes, 4 to a lane (vpdpbusd; written out as
 * v16_dot_pairs is) */
static inline v16i v16_dot_quads(v16i acc, v16i a, v16i b) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}
