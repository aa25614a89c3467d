/* forward.c's vectors on AVX2 with FMA and F16C: the 16 float32 lanes of a vector are two ymm
 * registers (lanes 0 .. 7, then 8 .. 15), and each operation the kernels name is written with
 * AVX2 instructions that give the same numbers:
 * - a dpbf16 operand (16 pairs of bf16) is held widened in registers, each pair's elements as two
 *   float32 vectors; a dot product adds element 1's product, then element 0's, with one FMA each,
 *   the order vdpbf16ps sums them in (a product of two bf16 values is exact in float32);
 * - bf16 <-> float32 are shifts, with the instruction's rounding to nearest even;
 * - a 4-bit code is masked where it lies and converted: its value times a power of 2 (CODE_UNIT);
 *   an 8-bit code is sign-extended and converted;
 * - the int8 KV cache's integer sums use 16-bit multiply-adds (vpmaddwd): exact, as vpdpbusd and
 *   vpdpwssd are.
 * Masks stay bit masks (__mmask16); an operation that takes one builds the lane masks it needs. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define ISA_NAME "avx2"
/* one activation row per register tile: its 8 accumulators (64 columns), the row's two widened
 * inputs and the weights being widened fill the 16 ymm registers */
#define TILE_ROWS 1
#define QUANT_TILE_ROWS 1 /* more rows than one share the unpacked codes (quant_rows) */
#define WIDENED_BF16 1 /* a bf16 operand is widened: more rows than one share it (dense_rows) */

typedef struct {
    __m256 lo, hi;
} v16f;
typedef struct {
    __m256i lo, hi;
} v16i;
typedef struct { /* 16 pairs of bf16, widened: element 0 and element 1 of each lane's pair */
    __m256 even_lo, odd_lo, even_hi, odd_hi;
} v16bf;

#define AVX2_INLINE static inline __attribute__((always_inline))

/* ── the lane masks of a bit mask ────────────────────────────────────────────────────────── */

AVX2_INLINE __m256i lanes8(unsigned int bits) { /* lane i all ones where bit i is set */
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)bits), bit), bit);
}

/* ── float32 ─────────────────────────────────────────────────────────────────────────────── */

AVX2_INLINE v16f v16_setzero_ps(void) { return (v16f){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
AVX2_INLINE v16f v16_set1_ps(float x) { return (v16f){_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
AVX2_INLINE v16f v16_loadu_ps(const float *p) { return (v16f){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
AVX2_INLINE void v16_storeu_ps(float *p, v16f v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}

#define AVX2_BINARY_PS(name, op)                                                         \
    AVX2_INLINE v16f name(v16f a, v16f b) { return (v16f){op(a.lo, b.lo), op(a.hi, b.hi)}; }
AVX2_BINARY_PS(v16_add_ps, _mm256_add_ps)
AVX2_BINARY_PS(v16_sub_ps, _mm256_sub_ps)
AVX2_BINARY_PS(v16_mul_ps, _mm256_mul_ps)
AVX2_BINARY_PS(v16_div_ps, _mm256_div_ps)
AVX2_BINARY_PS(v16_min_ps, _mm256_min_ps)
AVX2_BINARY_PS(v16_max_ps, _mm256_max_ps)

AVX2_INLINE v16f v16_fmadd_ps(v16f a, v16f b, v16f c) {
    return (v16f){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}

AVX2_INLINE v16f v16_abs_ps(v16f v) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    return (v16f){_mm256_and_ps(v.lo, magnitude), _mm256_and_ps(v.hi, magnitude)};
}

AVX2_INLINE v16f v16_round_nearest_ps(v16f v) {
    return (v16f){_mm256_round_ps(v.lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                  _mm256_round_ps(v.hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}

/* v * 2^n for whole n in -126 .. 127 (exp_ps's range): 2^n is exact, so is the product's rounding */
AVX2_INLINE v16f v16_scalef_ps(v16f v, v16f n) {
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.lo), bias), 23));
    const __m256 hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n.hi), bias), 23));
    return (v16f){_mm256_mul_ps(v.lo, lo), _mm256_mul_ps(v.hi, hi)};
}

/* the sums (largest) of the 16 lanes in the order GCC's _mm512_reduce_add_ps (max) takes them */
#define AVX2_REDUCE_PS(name, op256, op128)                                          \
    AVX2_INLINE float name(v16f v) {                                                \
        const __m256 eight = op256(v.hi, v.lo);                                     \
        const __m128 four = op128(_mm256_extractf128_ps(eight, 1), _mm256_castps256_ps128(eight)); \
        const __m128 two = op128(four, _mm_shuffle_ps(four, four, _MM_SHUFFLE(1, 0, 3, 2))); \
        return _mm_cvtss_f32(op128(two, _mm_shuffle_ps(two, two, _MM_SHUFFLE(1, 1, 1, 1)))); \
    }
AVX2_REDUCE_PS(v16_reduce_add_ps, _mm256_add_ps, _mm_add_ps)
AVX2_REDUCE_PS(v16_reduce_max_ps, _mm256_max_ps, _mm_max_ps)

AVX2_INLINE v16f v16_mask_blend_ps(__mmask16 k, v16f a, v16f b) { /* b where k is set, else a */
    return (v16f){_mm256_blendv_ps(a.lo, b.lo, _mm256_castsi256_ps(lanes8(k & 0xffu))),
                  _mm256_blendv_ps(a.hi, b.hi, _mm256_castsi256_ps(lanes8(k >> 8)))};
}

AVX2_INLINE v16f v16_maskz_mov_ps(__mmask16 k, v16f v) {
    return (v16f){_mm256_and_ps(v.lo, _mm256_castsi256_ps(lanes8(k & 0xffu))),
                  _mm256_and_ps(v.hi, _mm256_castsi256_ps(lanes8(k >> 8)))};
}

AVX2_INLINE v16f v16_maskz_loadu_ps(__mmask16 k, const float *p) { /* masked lanes are not read */
    return (v16f){_mm256_maskload_ps(p, lanes8(k & 0xffu)), _mm256_maskload_ps(p + 8, lanes8(k >> 8))};
}

AVX2_INLINE void v16_mask_storeu_ps(float *p, __mmask16 k, v16f v) {
    _mm256_maskstore_ps(p, lanes8(k & 0xffu), v.lo);
    _mm256_maskstore_ps(p + 8, lanes8(k >> 8), v.hi);
}

#define v16_mask_i32gather_ps(src, k, index, base, scale)                                              \
    ((v16f){_mm256_mask_i32gather_ps((src).lo, (base), (index).lo, _mm256_castsi256_ps(lanes8((k) & 0xffu)), (scale)), \
            _mm256_mask_i32gather_ps((src).hi, (base), (index).hi, _mm256_castsi256_ps(lanes8((k) >> 8)), (scale))})

/* ── conversions ─────────────────────────────────────────────────────────────────────────── */

AVX2_INLINE v16f v16_cvtepi32_ps(v16i v) { return (v16f){_mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi)}; }
AVX2_INLINE v16i v16_cvtps_epi32(v16f v) { return (v16i){_mm256_cvtps_epi32(v.lo), _mm256_cvtps_epi32(v.hi)}; }

/* 16 fp16 values */
AVX2_INLINE v16f v16_cvtph_ps(__m256i v) {
    return (v16f){_mm256_cvtph_ps(_mm256_castsi256_si128(v)), _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1))};
}

/* 16 bf16 values */
AVX2_INLINE v16f v16_cvtpbh_ps(__m256i v) {
    return (v16f){_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(v)), 16)),
                  _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(v, 1)), 16))};
}

/* 8 float32 to bf16 (in the low half of each lane) as vcvtneps2bf16 rounds them: to nearest even, a
 * NaN quiet, a subnormal to a zero of its sign */
AVX2_INLINE __m256i bf16_bits8(__m256 v) {
    const __m256i u = _mm256_castps_si256(v), magnitude = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
    const __m256i subnormal = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x00800000), magnitude);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i zero = _mm256_srli_epi32(_mm256_and_si256(u, _mm256_set1_epi32((int)0x80000000u)), 16);
    return _mm256_blendv_epi8(_mm256_blendv_epi8(rounded, quiet, nan), zero, subnormal);
}

AVX2_INLINE __m256i v16_cvtneps_pbh(v16f v) { /* 16 bf16, in lane order */
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_bits8(v.lo), bf16_bits8(v.hi)), _MM_SHUFFLE(3, 1, 2, 0));
}

/* 16 int32 to int16, saturated */
AVX2_INLINE __m256i v16_cvtsepi32_epi16(v16i v) {
    return _mm256_permute4x64_epi64(_mm256_packs_epi32(v.lo, v.hi), _MM_SHUFFLE(3, 1, 2, 0));
}

/* 16 int32 to int8, truncated (each lane's low byte) */
AVX2_INLINE __m128i v16_cvtepi32_epi8(v16i v) {
    const __m256i byte = _mm256_set1_epi32(0xff);
    const __m256i words = _mm256_permute4x64_epi64(
        _mm256_packus_epi32(_mm256_and_si256(v.lo, byte), _mm256_and_si256(v.hi, byte)), _MM_SHUFFLE(3, 1, 2, 0));
    const __m256i bytes = _mm256_packus_epi16(words, words); /* each 128-bit half: its 8 words as bytes, twice */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(bytes, _MM_SHUFFLE(3, 1, 2, 0)));
}

/* 32 int8 to int16 */
AVX2_INLINE v16i v16_cvtepi8_epi16(__m256i v) {
    return (v16i){_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1))};
}

/* ── integers ────────────────────────────────────────────────────────────────────────────── */

AVX2_INLINE v16i v16_setzero_si512(void) { return (v16i){_mm256_setzero_si256(), _mm256_setzero_si256()}; }
AVX2_INLINE v16i v16_set1_epi32(int x) { return (v16i){_mm256_set1_epi32(x), _mm256_set1_epi32(x)}; }
AVX2_INLINE v16i v16_set1_epi64(long long x) { return (v16i){_mm256_set1_epi64x(x), _mm256_set1_epi64x(x)}; }
AVX2_INLINE v16i v16_set1_epi8(char x) { return (v16i){_mm256_set1_epi8(x), _mm256_set1_epi8(x)}; }
AVX2_INLINE v16i v16_set_epi32(int e15, int e14, int e13, int e12, int e11, int e10, int e9, int e8, int e7, int e6,
                               int e5, int e4, int e3, int e2, int e1, int e0) {
    return (v16i){_mm256_set_epi32(e7, e6, e5, e4, e3, e2, e1, e0), _mm256_set_epi32(e15, e14, e13, e12, e11, e10, e9, e8)};
}
AVX2_INLINE v16i v16_loadu_si512(const void *p) {
    return (v16i){_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)p + 1)};
}
AVX2_INLINE v16i v16_load_si512(const void *p) { return v16_loadu_si512(p); }
AVX2_INLINE void v16_storeu_si512(void *p, v16i v) {
    _mm256_storeu_si256((__m256i *)p, v.lo);
    _mm256_storeu_si256((__m256i *)p + 1, v.hi);
}
AVX2_INLINE void v16_store_si512(void *p, v16i v) { v16_storeu_si512(p, v); }

#define AVX2_BINARY_SI(name, op)                                                         \
    AVX2_INLINE v16i name(v16i a, v16i b) { return (v16i){op(a.lo, b.lo), op(a.hi, b.hi)}; }
AVX2_BINARY_SI(v16_add_epi32, _mm256_add_epi32)
AVX2_BINARY_SI(v16_add_epi64, _mm256_add_epi64)
AVX2_BINARY_SI(v16_sub_epi32, _mm256_sub_epi32)
AVX2_BINARY_SI(v16_and_si512, _mm256_and_si256)
AVX2_BINARY_SI(v16_unpacklo_epi32, _mm256_unpacklo_epi32) /* within each 128-bit quarter, as on AVX-512 */
AVX2_BINARY_SI(v16_unpackhi_epi32, _mm256_unpackhi_epi32)
AVX2_BINARY_SI(v16_unpacklo_epi64, _mm256_unpacklo_epi64)
AVX2_BINARY_SI(v16_unpackhi_epi64, _mm256_unpackhi_epi64)

AVX2_INLINE v16i v16_slli_epi32(v16i v, int n) { return (v16i){_mm256_slli_epi32(v.lo, n), _mm256_slli_epi32(v.hi, n)}; }
AVX2_INLINE v16i v16_srli_epi32(v16i v, int n) { return (v16i){_mm256_srli_epi32(v.lo, n), _mm256_srli_epi32(v.hi, n)}; }

AVX2_INLINE __mmask16 v16_cmpeq_epi32_mask(v16i a, v16i b) {
    const int lo = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(a.lo, b.lo)));
    const int hi = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(a.hi, b.hi)));
    return (__mmask16)(lo | hi << 8);
}

AVX2_INLINE v16i v16_maskz_loadu_epi32(__mmask16 k, const void *p) { /* masked lanes are not read */
    return (v16i){_mm256_maskload_epi32((const int *)p, lanes8(k & 0xffu)),
                  _mm256_maskload_epi32((const int *)p + 8, lanes8(k >> 8))};
}

/* 32 int16; masked elements are not read (AVX2 has no 16-bit masked load: those are copied) */
AVX2_INLINE v16i v16_maskz_loadu_epi16(__mmask32 k, const void *p) {
    if (k == 0xffffffffu) return v16_loadu_si512(p);
    int16_t words[32] __attribute__((aligned(32))) = {0};
    for (int i = 0; i < 32; i++)
        if (k >> i & 1u) memcpy(&words[i], (const int16_t *)p + i, sizeof words[i]);
    return v16_loadu_si512(words);
}

/* 8 int32 gathered at 8 int64 indices (a v16i), as one __m256i */
#define v16_mask_i64gather_epi32(src, k, index, base, scale)                                          \
    _mm256_set_m128i(                                                                                 \
        _mm256_mask_i64gather_epi32(_mm256_extracti128_si256((src), 1), (base), (index).hi,          \
                                    _mm256_extracti128_si256(lanes8((k) & 0xffu), 1), (scale)),       \
        _mm256_mask_i64gather_epi32(_mm256_castsi256_si128(src), (base), (index).lo,                  \
                                    _mm256_castsi256_si128(lanes8((k) & 0xffu)), (scale)))

/* 128-bit quarters 0, 2 of a then of b; and 1, 3 of each */
AVX2_INLINE v16i v16_even_quarters(v16i a, v16i b) {
    return (v16i){_mm256_permute2x128_si256(a.lo, a.hi, 0x20), _mm256_permute2x128_si256(b.lo, b.hi, 0x20)};
}
AVX2_INLINE v16i v16_odd_quarters(v16i a, v16i b) {
    return (v16i){_mm256_permute2x128_si256(a.lo, a.hi, 0x31), _mm256_permute2x128_si256(b.lo, b.hi, 0x31)};
}

/* the 16-bit elements 0 .. 15 (low) or 16 .. 31 (high) of a and b interleaved: a0 b0 a1 b1 .. */
AVX2_INLINE v16i interleave16(__m256i a, __m256i b) {
    const __m256i low = _mm256_unpacklo_epi16(a, b), high = _mm256_unpackhi_epi16(a, b);
    return (v16i){_mm256_permute2x128_si256(low, high, 0x20), _mm256_permute2x128_si256(low, high, 0x31)};
}
AVX2_INLINE v16i v16_interleave_low(v16i a, v16i b) { return interleave16(a.lo, b.lo); }
AVX2_INLINE v16i v16_interleave_high(v16i a, v16i b) { return interleave16(a.hi, b.hi); }

/* acc + the dot products of a's and b's int16 pairs, lane by lane (as vpdpwssd) */
AVX2_INLINE v16i v16_dot_pairs(v16i acc, v16i a, v16i b) {
    return (v16i){_mm256_add_epi32(acc.lo, _mm256_madd_epi16(a.lo, b.lo)),
                  _mm256_add_epi32(acc.hi, _mm256_madd_epi16(a.hi, b.hi))};
}

/* acc + the dot products of a's unsigned and b's signed bytes, 4 to a lane (as vpdpbusd): the bytes
 * widened to 16 bits, even and odd apart, so no product or pair sum saturates */
AVX2_INLINE __m256i dot_quads8(__m256i acc, __m256i a, __m256i b) {
    const __m256i a_even = _mm256_and_si256(a, _mm256_set1_epi16(0xff)), a_odd = _mm256_srli_epi16(a, 8);
    const __m256i b_even = _mm256_srai_epi16(_mm256_slli_epi16(b, 8), 8), b_odd = _mm256_srai_epi16(b, 8);
    return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(a_even, b_even), _mm256_madd_epi16(a_odd, b_odd)));
}
AVX2_INLINE v16i v16_dot_quads(v16i acc, v16i a, v16i b) {
    return (v16i){dot_quads8(acc.lo, a.lo, b.lo), dot_quads8(acc.hi, a.hi, b.hi)};
}

/* ── bf16 pairs ──────────────────────────────────────────────────────────────────────────── */

AVX2_INLINE void widen8(__m256i v, __m256 *even, __m256 *odd) {
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

/* 32 bf16 (pairs of neighbours in each 32-bit lane) as a dpbf16 operand */
AVX2_INLINE v16bf v16_bf16(v16i v) {
    v16bf w;
    widen8(v.lo, &w.even_lo, &w.odd_lo);
    widen8(v.hi, &w.even_hi, &w.odd_hi);
    return w;
}

/* acc + a's pairs times b's, lane by lane: element 1's product, then element 0's (vdpbf16ps) */
AVX2_INLINE v16f v16_dpbf16_ps(v16f acc, v16bf a, v16bf b) {
    return (v16f){_mm256_fmadd_ps(a.even_lo, b.even_lo, _mm256_fmadd_ps(a.odd_lo, b.odd_lo, acc.lo)),
                  _mm256_fmadd_ps(a.even_hi, b.even_hi, _mm256_fmadd_ps(a.odd_hi, b.odd_hi, acc.hi))};
}

/* each 16-bit word's nibble at `shift` as its code (0 .. 15) times 2^shift (CODE_UNIT undoes it):
 * masked where it lies (element 1's moved down a word first) and converted, with no shift per
 * nibble */
AVX2_INLINE void low_codes8(__m256i words, int shift, __m256 *even, __m256 *odd) {
    const __m256i mask = _mm256_set1_epi32(15 << shift);
    *even = _mm256_cvtepi32_ps(_mm256_and_si256(words, mask));
    *odd = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(words, 16), mask));
}
AVX2_INLINE v16bf v16_low_codes(v16i words, int shift) {
    v16bf w;
    low_codes8(words.lo, shift, &w.even_lo, &w.odd_lo);
    low_codes8(words.hi, shift, &w.even_hi, &w.odd_hi);
    return w;
}

/* 16 int8 codes (8 lanes' pairs) as their values: each pair sign-extended as an int16, its element
 * 1 the high byte, its element 0 the low one */
AVX2_INLINE void q8_codes8(const uint8_t *codes, __m256 *even, __m256 *odd) {
    const __m256i pairs = _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)codes));
    *even = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(pairs, 24), 24));
    *odd = _mm256_cvtepi32_ps(_mm256_srai_epi32(pairs, 8));
}
/* 32 int8 codes, in dpbf16 operand order, as their values */
AVX2_INLINE v16bf v16_q8_codes(const uint8_t *codes) {
    v16bf w;
    q8_codes8(codes, &w.even_lo, &w.odd_lo);
    q8_codes8(codes + 16, &w.even_hi, &w.odd_hi);
    return w;
}
#define CODE_UNIT(shift) (1.0f / (float)(1 << (shift)))
