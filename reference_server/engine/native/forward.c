/* The forward pass of a Llama model over one engine step (prompt chunks and decode tokens of
 * many sequences) on x86-64: bf16 weights and KV cache, float32 residual stream and
 * accumulators, the same bf16 roundings between operations as the torch model. Built for
 * AVX512-BF16 (isa_avx512.h) or, with ISA_AVX2, for AVX2 + FMA + F16C (isa_avx2.h): the
 * vector operations are named v16_* (16 float32 lanes) and each header writes them with the
 * same numbers.
 *
 * Token invariance: every output element is computed by one fixed sequence of instructions
 * that depends only on its own token (its reduction orders do not depend on how many tokens,
 * chunks or threads share the step), so a sequence's tokens do not change with the batch, and
 * a token's K/V is the same in a prompt chunk of any size, as a decode token, or from the cache.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef ISA_AVX2
#include "isa_avx2.h"
#else
#include "isa_avx512.h"
#endif

typedef uint16_t bf16;

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

typedef struct {
    int32_t num_layers, hidden, intermediate, num_heads, num_kv_heads, head_dim, vocab;
    int32_t table_width, max_positions;
    int32_t layer_format, head_format; /* FORMAT_* of the layers' projections and of the head */
    float eps;
    const bf16 *embed;        /* [vocab, hidden], or NULL: the (tied) head's columns */
    const void *head;         /* [vocab, hidden] packed */
    const float *final_norm;  /* [hidden] */
    const float *rope_cos;    /* [max_positions, head_dim / 2] */
    const float *rope_sin;
    const int32_t *slot_table; /* [rows, table_width] */
    const float *const *input_norm;  /* per layer [hidden] */
    const float *const *post_norm;
    const void *const *qkv;      /* per layer, packed: [(heads + 2 kv heads) * head_dim, hidden] */
    const void *const *o;        /* [hidden, heads * head_dim] */
    const void *const *gate_up;  /* [2 * intermediate, hidden] */
    const void *const *down;     /* [hidden, intermediate] */
    int32_t kv_format;           /* KV_BF16 or KV_INT8 */
    int32_t kv_slots;            /* the pools' slots */
    void *const *k_pool;         /* per layer, bf16 [slots, kv heads, head_dim] or int8 codes [kv heads, slots, head_dim] */
    void *const *v_pool;
    float *const *k_scales;      /* KV_INT8: per layer [kv heads, slots], each row's scale */
    float *const *v_scales;
} lm_model;

static inline float bf16_to_f32(bf16 v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline bf16 f32_to_bf16(float f) { /* round to nearest even, as torch does */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

static inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

static inline v16f round_bf16_ps(v16f v) { return v16_cvtpbh_ps(v16_cvtneps_pbh(v)); }

/* x[i] += y[i] rounded to bf16 (a bf16 projection output widened into the float32 stream) */
static void add_rounded(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i += 16)
        v16_storeu_ps(x + i, v16_add_ps(v16_loadu_ps(x + i), round_bf16_ps(v16_loadu_ps(y + i))));
}

/* ── y[m, n] = sum_k w[n, k] * x[m, k], x [M, K] bf16, y [M, N] float32 ─────────────────────
 * w comes packed (lm_pack_weight): panels of 64 output columns, each [K / 2][64][2], so one
 * dpbf16 adds a pair of k to 16 columns and the panel is read front to back once per row tile.
 * Each output lane sums its k pairs in order, whatever the row tile or thread. */

#define PANEL 64  /* output columns per panel: 4 vectors of 16 */
#define ROW_BLOCK 32 /* rows that share operands unpacked once (dense_rows, quant_rows) */
/* a register tile of n rows, for n up to the ISA's TILE_ROWS (constant: one copy of the code each) */
#define TILE(n) ((n) < TILE_ROWS ? (n) : TILE_ROWS)
#define QUANT_TILE(n) ((n) < QUANT_TILE_ROWS ? (n) : QUANT_TILE_ROWS)
/* bytes of weights requested this far ahead of their use, per format; 0: none. On its own the
 * hardware's prefetch kept a one-row matmul at about half the memory's bandwidth on one host (66 MB
 * of 4-bit panels read at 20 GB/s with it, 11 GB/s without) and cost another a third of its bf16
 * step, so the build chooses per microarchitecture (tuning.py) */
#ifndef PREFETCH_BF16
#define PREFETCH_BF16 8192
#endif
#ifndef PREFETCH_QUANT
#define PREFETCH_QUANT 8192
#endif

/* inputs k and k + 1 of a row, in every 32-bit lane (one dpbf16 operand) */
static inline v16bf input_pair(const bf16 *row, int k) {
    int32_t pair;
    memcpy(&pair, row + k, sizeof pair);
    return v16_bf16(v16_set1_epi32(pair));
}

/* the M rows of a register tile, 4 vectors each, into y [M, N] (ncols <= 64 columns of them) */
static inline __attribute__((always_inline)) void store_rows(v16f acc[][4], float *y, int N, int ncols, const int M) {
    for (int m = 0; m < M; m++)
        for (int j = 0; j < 4; j++) {
            int left = ncols - 16 * j;
            if (left <= 0) break;
            __mmask16 mask = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
            v16_mask_storeu_ps(y + (size_t)m * N + 16 * j, mask, acc[m][j]);
        }
}

static inline __attribute__((always_inline)) void tile(
    const bf16 *panel, const bf16 *x, float *y, int K, int N, int ncols, const int M) {
    v16f acc[TILE_ROWS][4];
    for (int m = 0; m < M; m++)
        for (int j = 0; j < 4; j++) acc[m][j] = v16_setzero_ps();
    for (int kp = 0; kp < K / 2; kp++) {
        const bf16 *wp = panel + (size_t)kp * 2 * PANEL;
        if (PREFETCH_BF16 > 0) {
            _mm_prefetch((const char *)wp + PREFETCH_BF16, _MM_HINT_T0);
            _mm_prefetch((const char *)wp + PREFETCH_BF16 + 64, _MM_HINT_T0);
        }
        v16bf xv[TILE_ROWS];
        for (int m = 0; m < M; m++) xv[m] = input_pair(x + (size_t)m * K, 2 * kp);
        for (int j = 0; j < 4; j++) {
            const v16bf w = v16_bf16(v16_loadu_si512(wp + 32 * j));
            for (int m = 0; m < M; m++) acc[m][j] = v16_dpbf16_ps(acc[m][j], w, xv[m]);
        }
    }
    store_rows(acc, y, N, ncols, M);
}

/* The same sums for more rows than a register tile holds where a dpbf16 operand is widened in
 * registers (AVX2: an operation per weight vector, on the ports the FMAs use): each span of a
 * panel's k pairs is widened once into L1 (16 KB) for a block of rows, which then read it one row
 * at a time, each row's sums kept in memory between spans. Every output's operations are tile's,
 * in its order: the same numbers. */
#define DENSE_SPAN 32 /* k pairs widened at a time */
static inline __attribute__((always_inline)) void dense_rows(
    const bf16 *panel, const bf16 *x, float *y, int K, int N, int ncols, int M) {
    v16bf w[DENSE_SPAN][4];
    v16f total[ROW_BLOCK][4];
    for (int m = 0; m < M; m++)
        for (int j = 0; j < 4; j++) total[m][j] = v16_setzero_ps();
    for (int start = 0; start < K / 2; start += DENSE_SPAN) {
        const int pairs = MIN(K / 2 - start, DENSE_SPAN);
        for (int kp = 0; kp < pairs; kp++) {
            const bf16 *wp = panel + (size_t)(start + kp) * 2 * PANEL;
            if (PREFETCH_BF16 > 0) {
                _mm_prefetch((const char *)wp + PREFETCH_BF16, _MM_HINT_T0);
                _mm_prefetch((const char *)wp + PREFETCH_BF16 + 64, _MM_HINT_T0);
            }
            for (int j = 0; j < 4; j++) w[kp][j] = v16_bf16(v16_loadu_si512(wp + 32 * j));
        }
        for (int m = 0; m < M; m++) {
            v16f acc[4];
            for (int j = 0; j < 4; j++) acc[j] = total[m][j];
            for (int kp = 0; kp < pairs; kp++) {
                const v16bf xv = input_pair(x + (size_t)m * K, 2 * (start + kp));
                for (int j = 0; j < 4; j++) acc[j] = v16_dpbf16_ps(acc[j], w[kp][j], xv);
            }
            for (int j = 0; j < 4; j++) total[m][j] = acc[j];
        }
    }
    store_rows(total, y, N, ncols, M);
}

/* Panels are handed out one at a time (schedule(dynamic)): a thread whose core another process
 * took does not hold the step back by a fixed share of the panels. A panel's numbers do not depend
 * on the thread that computes it. */
static void matmul(const bf16 *w, const bf16 *x, float *y, int M, int N, int K, int threads) {
    int panels = (N + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(dynamic) num_threads(threads) if (threads > 1)
    for (int b = 0; b < panels; b++) {
        int n = b * PANEL, ncols = N - n < PANEL ? N - n : PANEL;
        const bf16 *panel = w + (size_t)n * K;
        if (WIDENED_BF16 && M > TILE_ROWS) {
            for (int m = 0; m < M; m += ROW_BLOCK)
                dense_rows(panel, x + (size_t)m * K, y + (size_t)m * N + n, K, N, ncols, MIN(M - m, ROW_BLOCK));
            continue;
        }
        for (int m = 0; m < M; m += TILE_ROWS) {
            const bf16 *xm = x + (size_t)m * K;
            float *ym = y + (size_t)m * N + n;
            switch (M - m < TILE_ROWS ? M - m : TILE_ROWS) {
                case 1: tile(panel, xm, ym, K, N, ncols, TILE(1)); break;
                case 2: tile(panel, xm, ym, K, N, ncols, TILE(2)); break;
                case 3: tile(panel, xm, ym, K, N, ncols, TILE(3)); break;
                case 4: tile(panel, xm, ym, K, N, ncols, TILE(4)); break;
                case 5: tile(panel, xm, ym, K, N, ncols, TILE(5)); break;
                default: tile(panel, xm, ym, K, N, ncols, TILE(6)); break;
            }
        }
    }
}

/* w [N, K] row-major → panels (N rounded up to PANEL with zero columns); K even */
void lm_pack_weight(const bf16 *w, bf16 *packed, int N, int K) {
    int panels = (N + PANEL - 1) / PANEL;
    for (int b = 0; b < panels; b++)
        for (int kp = 0; kp < K / 2; kp++)
            for (int c = 0; c < PANEL; c++)
                for (int e = 0; e < 2; e++) {
                    int n = b * PANEL + c;
                    packed[(((size_t)b * (K / 2) + kp) * PANEL + c) * 2 + e] = n < N ? w[(size_t)n * K + 2 * kp + e] : 0;
                }
}

/* ── quantized weights: groups of 32 inputs of one output column share an fp16 scale d ──────
 * q4_1 (GGUF Q4_1): w = d * c + m, codes c in 0 .. 15 and an fp16 minimum m per group.
 * q8_0 (GGUF Q8_0): w = d * c, codes c in -128 .. 127.
 * Packed (lm_pack_quant) in panels of 64 columns, group after group: the group's 16 k pairs of
 * codes, then d[64] (and for q4_1 m[64]) as fp16. A k pair's codes are in the order of four
 * pair-interleaved vectors (as the bf16 panels): 16 lanes of two elements each. q4_1 packs them in
 * 64 bytes, 32 16-bit words: word i is lane i / 2, element i % 2, and nibble j of it feeds vector j
 * (v16_low_codes: a vpermw lookup, or on AVX2 masked in place, CODE_UNIT). q8_0 keeps one byte per
 * code, vector after vector, 32 bytes each in the same order (v16_q8_codes: sign-extended and
 * converted). Every code becomes its exact value in a dpbf16 operand, so one dpbf16 adds a k pair
 * to 16 columns as with bf16 weights, and the dequantized weight is never rounded: a group's sum
 * of codes times inputs is scaled once, y = sum_g d * sum_k c x (+ m * sum_k x). The order of every
 * sum depends on nothing but the row's own inputs. A code held as c * 2^s makes every product, sum
 * and rounding 2^s times as large (no float rounds differently when scaled by a power of 2 short
 * of overflow), and d * 2^-s takes it back exactly. */

#define FORMAT_BF16 0
#define FORMAT_Q4_1 1
#define FORMAT_Q8_0 2
#define GROUP 32             /* inputs per scale */
#define GGUF_Q4_1_BYTES 20   /* per block of 32: fp16 d, fp16 m, 16 bytes of nibbles */
#define GGUF_Q8_0_BYTES 34   /* per block of 32: fp16 d, 32 int8 */

static inline size_t code_bytes(int format) { return format == FORMAT_Q8_0 ? 128 : 64; } /* per k pair */
static inline size_t group_bytes(int format) {
    return 16 * code_bytes(format) + (format == FORMAT_Q8_0 ? 1 : 2) * PANEL * sizeof(uint16_t);
}

/* bytes of a packed [N, K] weight (0 for a shape the format cannot hold) */
size_t lm_packed_bytes(int format, int N, int K) {
    const size_t panels = (size_t)(N + PANEL - 1) / PANEL;
    if (format == FORMAT_BF16) return K % 2 ? 0 : panels * PANEL * K * sizeof(bf16);
    if ((format != FORMAT_Q4_1 && format != FORMAT_Q8_0) || K % GROUP) return 0;
    return panels * (K / GROUP) * group_bytes(format);
}

static inline int block_code(int format, const uint8_t *block, int e) { /* GGUF block, element e */
    if (format == FORMAT_Q8_0) return (int8_t)block[2 + e];
    return e < 16 ? block[4 + e] & 15 : block[4 + e - 16] >> 4;
}

/* blocks: a GGUF tensor [N][K / 32 blocks] of the format → panels; columns past N get zeros */
void lm_pack_quant(int format, const uint8_t *blocks, uint8_t *packed, int N, int K) {
    const int groups = K / GROUP, panels = (N + PANEL - 1) / PANEL;
    const size_t block_bytes = format == FORMAT_Q8_0 ? GGUF_Q8_0_BYTES : GGUF_Q4_1_BYTES;
    memset(packed, 0, lm_packed_bytes(format, N, K));
    for (int b = 0; b < panels; b++)
        for (int g = 0; g < groups; g++) {
            uint8_t *out = packed + ((size_t)b * groups + g) * group_bytes(format);
            uint16_t *scales = (uint16_t *)(out + 16 * code_bytes(format));
            for (int c = 0; c < PANEL && b * PANEL + c < N; c++) {
                const uint8_t *block = blocks + ((size_t)(b * PANEL + c) * groups + g) * block_bytes;
                memcpy(&scales[c], block, 2);
                if (format == FORMAT_Q4_1) memcpy(&scales[PANEL + c], block + 2, 2);
                const int vector = c / 16, lane = c % 16;
                for (int e = 0; e < GROUP; e++) {
                    uint16_t *words = (uint16_t *)(out + (size_t)(e / 2) * code_bytes(format));
                    const int code = block_code(format, block, e), word = 2 * lane + e % 2;
                    if (format == FORMAT_Q4_1) words[word] |= (uint16_t)(code << (4 * vector));
                    else ((int8_t *)words)[32 * vector + word] = (int8_t)code;
                }
            }
        }
}

/* sums[m * groups + g]: the sum of row m's inputs in group g (q4_1's minimum multiplies it) */
static void group_sums(const bf16 *x, float *sums, int M, int K) {
    for (int m = 0; m < M; m++)
        for (int g = 0; g < K / GROUP; g++) {
            const bf16 *xg = x + (size_t)m * K + g * GROUP;
            v16f lo = v16_cvtpbh_ps(_mm256_loadu_si256((const __m256i *)xg));
            v16f hi = v16_cvtpbh_ps(_mm256_loadu_si256((const __m256i *)(xg + 16)));
            sums[(size_t)m * (K / GROUP) + g] = v16_reduce_add_ps(v16_add_ps(lo, hi));
        }
}

static inline __attribute__((always_inline)) void quant_tile(
    const uint8_t *panel, const int format, const bf16 *x, const float *sums, float *y, int K, int N, int ncols,
    const int M) {
    const int groups = K / GROUP;
    v16f total[QUANT_TILE_ROWS][4];
    for (int m = 0; m < M; m++)
        for (int j = 0; j < 4; j++) total[m][j] = v16_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *codes = panel + (size_t)g * group_bytes(format);
        v16f acc[QUANT_TILE_ROWS][4];
        for (int m = 0; m < M; m++)
            for (int j = 0; j < 4; j++) acc[m][j] = v16_setzero_ps();
        for (int kp = 0; kp < GROUP / 2; kp++) {
            const int k = g * GROUP + 2 * kp;
            if (PREFETCH_QUANT > 0) {
                const char *ahead = (const char *)codes + (size_t)kp * code_bytes(format) + PREFETCH_QUANT;
                _mm_prefetch(ahead, _MM_HINT_T0);
                if (format == FORMAT_Q8_0) _mm_prefetch(ahead + 64, _MM_HINT_T0);
            }
            v16bf xv[QUANT_TILE_ROWS];
            for (int m = 0; m < M; m++) xv[m] = input_pair(x + (size_t)m * K, k);
            if (format == FORMAT_Q4_1) {
                const v16i words = v16_loadu_si512(codes + (size_t)kp * 64);
                for (int j = 0; j < 4; j++) {
                    const v16bf w = v16_low_codes(words, 4 * j);
                    for (int m = 0; m < M; m++) acc[m][j] = v16_dpbf16_ps(acc[m][j], w, xv[m]);
                }
            } else {
                for (int j = 0; j < 4; j++) {
                    const v16bf w = v16_q8_codes(codes + (size_t)kp * 128 + 32 * j);
                    for (int m = 0; m < M; m++) acc[m][j] = v16_dpbf16_ps(acc[m][j], w, xv[m]);
                }
            }
        }
        const uint16_t *scales = (const uint16_t *)(codes + 16 * code_bytes(format));
        for (int j = 0; j < 4; j++) {
            v16f d = v16_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scales + 16 * j)));
            if (format == FORMAT_Q4_1) d = v16_mul_ps(d, v16_set1_ps(CODE_UNIT(4 * j))); /* exact: a power of 2 */
            for (int m = 0; m < M; m++) total[m][j] = v16_fmadd_ps(acc[m][j], d, total[m][j]);
            if (format == FORMAT_Q4_1) {
                const v16f minimum = v16_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scales + PANEL + 16 * j)));
                for (int m = 0; m < M; m++)
                    total[m][j] = v16_fmadd_ps(minimum, v16_set1_ps(sums[(size_t)m * groups + g]), total[m][j]);
            }
        }
    }
    store_rows(total, y, N, ncols, M);
}

/* The same sums for more rows than a register tile holds: each group of a panel is unpacked once
 * into dpbf16 operands in L1 (4 KB; 8 on AVX2, whose operands are widened) for a block of rows,
 * which then read it one row at a time, so unpacking costs nothing per row (at 32 rows, 13 % less
 * time for q4_1 than tiles of 3 rows on AVX-512, 27 % less for q8_0). Every output's operations
 * are quant_tile's, in its order: the same numbers. */
static inline __attribute__((always_inline)) void quant_rows(
    const uint8_t *panel, const int format, const bf16 *x, const float *sums, float *y, int K, int N, int ncols, int M) {
    const int groups = K / GROUP;
    v16bf codes_of[GROUP / 2][4]; /* per k pair, vector j's */
    v16f total[ROW_BLOCK][4];
    for (int m = 0; m < M; m++)
        for (int j = 0; j < 4; j++) total[m][j] = v16_setzero_ps();
    for (int g = 0; g < groups; g++) {
        const uint8_t *codes = panel + (size_t)g * group_bytes(format);
        for (int kp = 0; kp < GROUP / 2; kp++) {
            if (format == FORMAT_Q4_1) {
                const v16i words = v16_loadu_si512(codes + (size_t)kp * 64);
                for (int j = 0; j < 4; j++) codes_of[kp][j] = v16_low_codes(words, 4 * j);
            } else {
                for (int j = 0; j < 4; j++) codes_of[kp][j] = v16_q8_codes(codes + (size_t)kp * 128 + 32 * j);
            }
        }
        const uint16_t *scales = (const uint16_t *)(codes + 16 * code_bytes(format));
        v16f d[4], minimum[4];
        for (int j = 0; j < 4; j++) {
            d[j] = v16_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scales + 16 * j)));
            if (format == FORMAT_Q4_1) {
                d[j] = v16_mul_ps(d[j], v16_set1_ps(CODE_UNIT(4 * j)));
                minimum[j] = v16_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scales + PANEL + 16 * j)));
            }
        }
        for (int m = 0; m < M; m++) {
            v16f acc[4];
            for (int j = 0; j < 4; j++) acc[j] = v16_setzero_ps();
            for (int kp = 0; kp < GROUP / 2; kp++) {
                const v16bf xv = input_pair(x + (size_t)m * K, g * GROUP + 2 * kp);
                for (int j = 0; j < 4; j++) acc[j] = v16_dpbf16_ps(acc[j], codes_of[kp][j], xv);
            }
            for (int j = 0; j < 4; j++) {
                total[m][j] = v16_fmadd_ps(acc[j], d[j], total[m][j]);
                if (format == FORMAT_Q4_1)
                    total[m][j] = v16_fmadd_ps(minimum[j], v16_set1_ps(sums[(size_t)m * groups + g]), total[m][j]);
            }
        }
    }
    store_rows(total, y, N, ncols, M);
}

/* sums: scratch of M * K / 32 floats */
static void matmul_quant(const uint8_t *w, int format, const bf16 *x, float *sums, float *y, int M, int N, int K,
                         int threads) {
    const int panels = (N + PANEL - 1) / PANEL;
    if (M == 0) return; /* a step that needs no logits: no rows, and y may be NULL */
    if (format == FORMAT_Q4_1) group_sums(x, sums, M, K);
    const size_t panel_bytes = (size_t)(K / GROUP) * group_bytes(format);
#pragma omp parallel for schedule(dynamic) num_threads(threads) if (threads > 1) /* as matmul */
    for (int b = 0; b < panels; b++) {
        const int n = b * PANEL, ncols = N - n < PANEL ? N - n : PANEL;
        const uint8_t *panel = w + (size_t)b * panel_bytes;
        if (M > QUANT_TILE_ROWS) {
            for (int m = 0; m < M; m += ROW_BLOCK) {
                const int rows = MIN(M - m, ROW_BLOCK);
                const bf16 *xm = x + (size_t)m * K;
                const float *sm = sums + (size_t)m * (K / GROUP);
                float *ym = y + (size_t)m * N + n;
                if (format == FORMAT_Q4_1) quant_rows(panel, FORMAT_Q4_1, xm, sm, ym, K, N, ncols, rows);
                else quant_rows(panel, FORMAT_Q8_0, xm, sm, ym, K, N, ncols, rows);
            }
            continue;
        }
        /* one register tile: each code unpacked where it is used */
        if (format == FORMAT_Q4_1) {
            if (M == 1) quant_tile(panel, FORMAT_Q4_1, x, sums, y + n, K, N, ncols, QUANT_TILE(1));
            else if (M == 2) quant_tile(panel, FORMAT_Q4_1, x, sums, y + n, K, N, ncols, QUANT_TILE(2));
            else quant_tile(panel, FORMAT_Q4_1, x, sums, y + n, K, N, ncols, QUANT_TILE(3));
        } else {
            if (M == 1) quant_tile(panel, FORMAT_Q8_0, x, sums, y + n, K, N, ncols, QUANT_TILE(1));
            else if (M == 2) quant_tile(panel, FORMAT_Q8_0, x, sums, y + n, K, N, ncols, QUANT_TILE(2));
            else quant_tile(panel, FORMAT_Q8_0, x, sums, y + n, K, N, ncols, QUANT_TILE(3));
        }
    }
}

/* y = x w^T for a weight of any format; sums: scratch of M * K / 32 floats (quantized formats) */
static void project(int format, const void *w, const bf16 *x, float *sums, float *y, int M, int N, int K, int threads) {
    if (format == FORMAT_BF16) matmul(w, x, y, M, N, K, threads);
    else matmul_quant(w, format, x, sums, y, M, N, K, threads);
}

/* the weight of column n as float32 (the embedding row of a token, for a tied quantized head) */
static void unpack_column(int format, const void *w, int n, int K, float *out) {
    if (format == FORMAT_BF16) {
        const bf16 *panel = (const bf16 *)w + (size_t)(n / PANEL) * PANEL * K;
        for (int k = 0; k < K; k++) out[k] = bf16_to_f32(panel[((size_t)(k / 2) * PANEL + n % PANEL) * 2 + k % 2]);
        return;
    }
    const int groups = K / GROUP, c = n % PANEL, vector = c / 16, lane = c % 16;
    const uint8_t *panel = (const uint8_t *)w + (size_t)(n / PANEL) * groups * group_bytes(format);
    for (int g = 0; g < groups; g++) {
        const uint8_t *codes = panel + (size_t)g * group_bytes(format);
        const uint16_t *scales = (const uint16_t *)(codes + 16 * code_bytes(format));
        const float d = _cvtsh_ss(scales[c]), minimum = format == FORMAT_Q4_1 ? _cvtsh_ss(scales[PANEL + c]) : 0.0f;
        for (int e = 0; e < GROUP; e++) {
            const uint16_t *words = (const uint16_t *)(codes + (size_t)(e / 2) * code_bytes(format));
            const int word = 2 * lane + e % 2;
            const int code = format == FORMAT_Q4_1 ? (words[word] >> (4 * vector)) & 15
                                                   : ((const int8_t *)words)[32 * vector + word];
            out[g * GROUP + e] = d * (float)code + minimum; /* d * code is exact: one rounding, as GGUF's */
        }
    }
}

/* ── elementwise parts ───────────────────────────────────────────────────────────────────── */

static void rms_norm(const float *x, const float *weight, bf16 *out, int M, int H, float eps) {
    for (int m = 0; m < M; m++) {
        const float *xr = x + (size_t)m * H;
        v16f acc = v16_setzero_ps();
        for (int i = 0; i < H; i += 16) {
            v16f v = v16_loadu_ps(xr + i);
            acc = v16_fmadd_ps(v, v, acc);
        }
        v16f inverse_rms = v16_set1_ps(1.0f / sqrtf(v16_reduce_add_ps(acc) / (float)H + eps));
        for (int i = 0; i < H; i += 16) {
            v16f v = v16_mul_ps(v16_mul_ps(v16_loadu_ps(xr + i), inverse_rms), v16_loadu_ps(weight + i));
            _mm256_storeu_si256((__m256i *)(out + (size_t)m * H + i), v16_cvtneps_pbh(v));
        }
    }
}

/* e^x as 2^n * 2^f, f in [-0.5, 0.5], Taylor series to degree 7; x clamped to [-87, 88] (the
 * softmax's x <= 0; SiLU's e^-gate for gates under -88 stays finite, and silu is ~-0 there) */
static inline v16f exp_ps(v16f x) {
    x = v16_min_ps(v16_max_ps(x, v16_set1_ps(-87.0f)), v16_set1_ps(88.0f));
    v16f t = v16_mul_ps(x, v16_set1_ps(1.4426950408889634f));
    v16f n = v16_round_nearest_ps(t);
    v16f f = v16_mul_ps(v16_sub_ps(t, n), v16_set1_ps(0.6931471805599453f));
    v16f p = v16_set1_ps(1.0f / 5040);
    p = v16_fmadd_ps(p, f, v16_set1_ps(1.0f / 720));
    p = v16_fmadd_ps(p, f, v16_set1_ps(1.0f / 120));
    p = v16_fmadd_ps(p, f, v16_set1_ps(1.0f / 24));
    p = v16_fmadd_ps(p, f, v16_set1_ps(1.0f / 6));
    p = v16_fmadd_ps(p, f, v16_set1_ps(0.5f));
    p = v16_fmadd_ps(p, f, v16_set1_ps(1.0f));
    p = v16_fmadd_ps(p, f, v16_set1_ps(1.0f));
    return v16_scalef_ps(p, n);
}

/* ── attention ───────────────────────────────────────────────────────────────────────────
 * One chunk (consecutive new tokens of one sequence) and one KV head at a time. The scores and
 * the weighted values run on pair-interleaved vectors: one dpbf16 scores 16 keys (a vector of
 * pair dp of keys 16b .. 16b+15: [head_dim / 2][16 keys][2] per block) or adds 2 keys' values to
 * 16 dims ([head_dim][2] per pair of keys). A prompt chunk, whose every row reads the same keys,
 * has them gathered once into those layouts (keys_t, values_t). A lone row (a decode token) would
 * read each key once, so it builds the vectors from the pool as it goes, one block of 16 keys in
 * registers and L1 at a time, and never copies its past: a step's cost stays the reading of the
 * keys. Both ways give the same vectors, so a token's numbers do not depend on the way; each
 * query row runs alone over its own keys, its sums in one order set by its own length. */

typedef struct {
    bf16 *keys_t, *values_t; /* gathered for keys 0 .. padded-1 (zeros past the last), or NULL: direct */
    int padded;              /* a multiple of 16 */
    const int32_t *key_pairs; /* the layer's pools, read directly: [slots, kv heads, head_dim / 2] pairs */
    const bf16 *values;       /* [slots, kv heads, head_dim] */
    const int32_t *slots;     /* the sequence's slot of each position */
    int kv_heads, kv_head;
} kv_view;

static inline const bf16 *value_row(const kv_view *view, int key, int D) {
    return view->values + ((size_t)view->slots[key] * view->kv_heads + view->kv_head) * D;
}

/* the K (or V) of keys first .. end-1 for KV heads views[0] .. views[kv_count-1] on their way to L2:
 * a lone row reads each key once, and the hardware's prefetch falls behind */
static void prefetch_slots(const kv_view *views, int kv_count, const void *pool, int first, int end, int D) {
    const size_t slot_bytes = (size_t)views->kv_heads * D * sizeof(bf16), bytes = (size_t)kv_count * D * sizeof(bf16);
    for (int i = first; i < end; i++) {
        const char *row = (const char *)pool + (size_t)views->slots[i] * slot_bytes + (size_t)views->kv_head * D * sizeof(bf16);
        for (size_t offset = 0; offset < bytes; offset += 64) _mm_prefetch(row + offset, _MM_HINT_T1);
    }
}

/* 16 rows of 16 int32 transposed in registers: r[i] lane j becomes r[j] lane i */
static inline void transpose16(v16i r[16]) {
    v16i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = v16_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = v16_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int k = 0; k < 16; k += 4) { /* u[k + m], 128-bit lane L: column 4L + m of rows k .. k+3 */
        u[k] = v16_unpacklo_epi64(t[k], t[k + 2]);
        u[k + 1] = v16_unpackhi_epi64(t[k], t[k + 2]);
        u[k + 2] = v16_unpacklo_epi64(t[k + 1], t[k + 3]);
        u[k + 3] = v16_unpackhi_epi64(t[k + 1], t[k + 3]);
    }
    for (int m = 0; m < 4; m++) {
        v16i v0 = v16_even_quarters(u[m], u[4 + m]), v1 = v16_odd_quarters(u[m], u[4 + m]);
        v16i w0 = v16_even_quarters(u[8 + m], u[12 + m]), w1 = v16_odd_quarters(u[8 + m], u[12 + m]);
        r[m] = v16_even_quarters(v0, w0);
        r[8 + m] = v16_odd_quarters(v0, w0);
        r[4 + m] = v16_even_quarters(v1, w1);
        r[12 + m] = v16_odd_quarters(v1, w1);
    }
}

/* block b's key vectors straight from the pool into block [head_dim / 2][16] (zeros past length) */
static void transpose_key_block(const kv_view *view, int b, int D, int length, int32_t *block) {
    const int first = 16 * b, count = length - first < 16 ? length - first : 16;
    for (int c = 0; c < D / 2; c += 16) {
        const int width = D / 2 - c < 16 ? D / 2 - c : 16;
        const __mmask16 lanes = width == 16 ? (__mmask16)0xffff : (__mmask16)((1u << width) - 1u);
        v16i r[16];
        for (int i = 0; i < 16; i++)
            r[i] = i < count ? v16_maskz_loadu_epi32(lanes, view->key_pairs + ((size_t)view->slots[first + i] * view->kv_heads + view->kv_head) * (D / 2) + c)
                             : v16_setzero_si512();
        transpose16(r);
        for (int j = 0; j < width; j++) v16_storeu_si512(block + (size_t)(c + j) * 16, r[j]);
    }
}

static void gather_keys(const lm_model *md, int layer, const int32_t *slots, int length, int kv_head, kv_view *view) {
    const int D = md->head_dim, KVH = md->num_kv_heads, padded = view->padded;
    /* keys: 8 keys at a time, one gather per pair of dims (past the end: zeros) */
    const int32_t *keys = (const int32_t *)md->k_pool[layer];
    int32_t *kt = (int32_t *)view->keys_t;
    for (int p0 = 0; p0 < padded; p0 += 8) {
        int64_t rows[8];
        for (int e = 0; e < 8; e++)
            rows[e] = p0 + e < length ? ((int64_t)slots[p0 + e] * KVH + kv_head) * (D / 2) : 0;
        const v16i base = v16_loadu_si512(rows);
        const __mmask8 valid = length - p0 >= 8 ? (__mmask8)0xff : (__mmask8)((1u << (length - p0 > 0 ? length - p0 : 0)) - 1u);
        for (int dp = 0; dp < D / 2; dp++) {
            __m256i pairs = v16_mask_i64gather_epi32(_mm256_setzero_si256(), valid,
                                                        v16_add_epi64(base, v16_set1_epi64(dp)), keys, 4);
            _mm256_storeu_si256((__m256i *)(kt + (size_t)dp * padded + p0), pairs);
        }
    }
    /* values: two keys' rows interleaved, 16 dims at a time */
    const bf16 *values = (const bf16 *)md->v_pool[layer];
    for (int p = 0; p < padded; p += 2) {
        const bf16 *a = p < length ? values + ((size_t)slots[p] * KVH + kv_head) * D : NULL;
        const bf16 *b = p + 1 < length ? values + ((size_t)slots[p + 1] * KVH + kv_head) * D : NULL;
        bf16 *dst = view->values_t + (size_t)p * D;
        for (int d = 0; d < D; d += 32) {
            const __mmask32 width = D - d >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (D - d)) - 1u);
            v16i va = a ? v16_maskz_loadu_epi16(width, a + d) : v16_setzero_si512();
            v16i vb = b ? v16_maskz_loadu_epi16(width, b + d) : v16_setzero_si512();
            v16_storeu_si512(dst + 2 * d, v16_interleave_low(va, vb));
            if (D - d > 16) v16_storeu_si512(dst + 2 * d + 32, v16_interleave_high(va, vb));
        }
    }
}

/* The pieces of one query row's attention, for up to HEADS_PER_TILE heads that share a KV head
 * (q [n][D] bf16, pre-scaled; scores and probs [n][stride]). The heads share every load of keys
 * and values; each head's sums are its own, in key order. */
#define HEADS_PER_TILE 4
#define MAX_HEAD_DIM 512  /* as lm_forward checks */
#define SPAN_PAIRS 32     /* pairs of keys whose values a direct row reads for all its KV heads at once */

/* scores of keys 16b .. 16b+15 (-inf past length) from their pair vectors kt, key_stride bf16 apart */
static inline __attribute__((always_inline)) void score_block(
    const bf16 *kt, size_t key_stride, const bf16 *q, int D, int b, int length, float *scores, int stride,
    float *max, const int n) {
    const uint32_t *q_pairs = (const uint32_t *)q;
    v16f acc[HEADS_PER_TILE];
    for (int h = 0; h < n; h++) acc[h] = v16_setzero_ps();
    for (int dp = 0; dp < D / 2; dp++) {
        v16bf keys = v16_bf16(v16_loadu_si512(kt + (size_t)dp * key_stride));
        for (int h = 0; h < n; h++)
            acc[h] = v16_dpbf16_ps(acc[h], keys, v16_bf16(v16_set1_epi32((int32_t)q_pairs[h * (D / 2) + dp])));
    }
    int left = length - 16 * b;
    for (int h = 0; h < n; h++) {
        if (left < 16) acc[h] = v16_mask_blend_ps((__mmask16)((1u << left) - 1u), v16_set1_ps(-INFINITY), acc[h]);
        v16_storeu_ps(scores + (size_t)h * stride + 16 * b, acc[h]);
        float block_max = v16_reduce_max_ps(acc[h]);
        max[h] = block_max > max[h] ? block_max : max[h];
    }
}

/* one head's probabilities, rounded to bf16 (zeros past length); returns 1 / their sum */
static float softmax(const float *s, bf16 *pr, int length, float max) {
    const int blocks = (length + 15) / 16;
    v16f vmax = v16_set1_ps(max), sum = v16_setzero_ps();
    for (int b = 0; b < blocks; b++) {
        v16f e = exp_ps(v16_sub_ps(v16_loadu_ps(s + 16 * b), vmax));
        int left = length - 16 * b;
        if (left < 16) e = v16_maskz_mov_ps((__mmask16)((1u << left) - 1u), e);
        __m256i rounded = v16_cvtneps_pbh(e);
        _mm256_storeu_si256((__m256i *)(pr + 16 * b), rounded);
        sum = v16_add_ps(sum, v16_cvtpbh_ps(rounded));
    }
    return 1.0f / v16_reduce_add_ps(sum);
}

/* acc [n][D] float32 += the values of key pairs p0 .. p1-1 weighted by probs, pair by pair in order
 * (the sums go on from wherever the previous span left them, so spans do not change them) */
static inline __attribute__((always_inline)) void add_values(
    const kv_view *view, const bf16 *probs, int stride, int D, int length, int p0, int p1, float *acc_out, const int n) {
    for (int d0 = 0; d0 < D; d0 += 64) {
        const int width = D - d0 < 64 ? (D - d0) / 16 : 4;
        v16f acc[HEADS_PER_TILE][4];
        for (int h = 0; h < n; h++)
            for (int j = 0; j < width; j++) acc[h][j] = v16_loadu_ps(acc_out + (size_t)h * D + d0 + 16 * j);
        for (int pp = p0; pp < p1; pp++) {
            v16bf values[4];
            if (view->values_t == NULL) { /* as gather_keys interleaves them (a key past the end: zeros) */
                const bf16 *a = value_row(view, 2 * pp, D), *b = 2 * pp + 1 < length ? value_row(view, 2 * pp + 1, D) : NULL;
                for (int j = 0; j < width; j += 2) {
                    const int d = d0 + 16 * j;
                    const __mmask32 lanes = D - d >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (D - d)) - 1u);
                    v16i va = v16_maskz_loadu_epi16(lanes, a + d);
                    v16i vb = b ? v16_maskz_loadu_epi16(lanes, b + d) : v16_setzero_si512();
                    values[j] = v16_bf16(v16_interleave_low(va, vb));
                    if (j + 1 < width) values[j + 1] = v16_bf16(v16_interleave_high(va, vb));
                }
            } else {
                const bf16 *vt = view->values_t + ((size_t)pp * D + d0) * 2;
                for (int j = 0; j < width; j++) values[j] = v16_bf16(v16_loadu_si512(vt + 32 * j));
            }
            for (int h = 0; h < n; h++) {
                uint32_t pair;
                memcpy(&pair, probs + (size_t)h * stride + 2 * pp, sizeof pair);
                v16bf weight = v16_bf16(v16_set1_epi32((int32_t)pair));
                for (int j = 0; j < width; j++) acc[h][j] = v16_dpbf16_ps(acc[h][j], values[j], weight);
            }
        }
        for (int h = 0; h < n; h++)
            for (int j = 0; j < width; j++) v16_storeu_ps(acc_out + (size_t)h * D + d0 + 16 * j, acc[h][j]);
    }
}

/* the n-head tile cases of the two tiled pieces */
static void score_tile(const bf16 *kt, size_t key_stride, const bf16 *q, int D, int b, int length, float *scores,
                       int stride, float *max, int n) {
    switch (n) {
        case 1: score_block(kt, key_stride, q, D, b, length, scores, stride, max, 1); break;
        case 2: score_block(kt, key_stride, q, D, b, length, scores, stride, max, 2); break;
        case 3: score_block(kt, key_stride, q, D, b, length, scores, stride, max, 3); break;
        default: score_block(kt, key_stride, q, D, b, length, scores, stride, max, 4); break;
    }
}

static void values_tile(const kv_view *view, const bf16 *probs, int stride, int D, int length, int p0, int p1,
                        float *acc, int n) {
    switch (n) {
        case 1: add_values(view, probs, stride, D, length, p0, p1, acc, 1); break;
        case 2: add_values(view, probs, stride, D, length, p0, p1, acc, 2); break;
        case 3: add_values(view, probs, stride, D, length, p0, p1, acc, 3); break;
        default: add_values(view, probs, stride, D, length, p0, p1, acc, 4); break;
    }
}

/* out [heads][D] bf16 = acc * 1 / sum, per head */
static void finish_heads(const float *acc, const float *inverse_sum, int heads, int D, bf16 *out) {
    for (int h = 0; h < heads; h++)
        for (int d = 0; d < D; d += 16)
            _mm256_storeu_si256((__m256i *)(out + (size_t)h * D + d),
                                v16_cvtneps_pbh(v16_mul_ps(v16_loadu_ps(acc + (size_t)h * D + d),
                                                                          v16_set1_ps(inverse_sum[h]))));
}

typedef struct {
    float *scores;  /* [heads][stride] */
    bf16 *probs;    /* [heads][stride] */
    float *acc;     /* [heads][D] */
    float *max, *inverse_sum; /* [heads] */
} row_scratch;

/* one row of a gathered chunk: the `group` query heads of one KV head (q, out [group][D]) */
static void attend_gathered(const kv_view *view, const bf16 *q, int group, int D, int length, const row_scratch *w,
                            bf16 *out) {
    const int stride = view->padded + 16, blocks = (length + 15) / 16, pairs = (length + 1) / 2;
    for (int h = 0; h < group; h++) w->max[h] = -INFINITY;
    for (int h = 0; h < group; h += HEADS_PER_TILE) {
        const int n = MIN(group - h, HEADS_PER_TILE);
        for (int b = 0; b < blocks; b++)
            score_tile(view->keys_t + (size_t)b * 32, (size_t)view->padded * 2, q + (size_t)h * D, D, b, length,
                       w->scores + (size_t)h * stride, stride, w->max + h, n);
    }
    for (int h = 0; h < group; h++)
        w->inverse_sum[h] = softmax(w->scores + (size_t)h * stride, w->probs + (size_t)h * stride, length, w->max[h]);
    memset(w->acc, 0, sizeof(float) * group * D);
    for (int h = 0; h < group; h += HEADS_PER_TILE)
        values_tile(view, w->probs + (size_t)h * stride, stride, D, length, 0, pairs, w->acc + (size_t)h * D,
                    MIN(group - h, HEADS_PER_TILE));
    finish_heads(w->acc, w->inverse_sum, group, D, out);
}

/* a lone row (a decode token), every KV head in lockstep straight from the pool (views [kv heads]):
 * a block of keys, or a span of values, is read for all KV heads before the next, so every cache
 * line of a slot is used while it is there (one KV head at a time, the hardware's prefetch of the
 * next lines would fetch the whole pool once per KV head). q, out [heads][D], heads in KV-head order. */
static void attend_direct(const kv_view *views, int kv_heads, const bf16 *q, int group, int D, int length,
                          const row_scratch *w, bf16 *out) {
    const int stride = views[0].padded + 16, blocks = (length + 15) / 16, pairs = (length + 1) / 2;
    const int heads = kv_heads * group;
    int32_t block[MAX_HEAD_DIM / 2 * 16] __attribute__((aligned(64)));
    for (int h = 0; h < heads; h++) w->max[h] = -INFINITY;
    const int ahead = 4; /* blocks of keys, or spans of values, prefetched ahead of their use */
    for (int b = 0; b < blocks; b++)
        for (int kv = 0; kv < kv_heads; kv++) {
            if (kv == 0 && b + ahead < blocks)
                prefetch_slots(views, kv_heads, views[0].key_pairs, 16 * (b + ahead), MIN(16 * (b + ahead + 1), length), D);
            transpose_key_block(&views[kv], b, D, length, block);
            for (int g = 0; g < group; g += HEADS_PER_TILE) {
                const int h = kv * group + g;
                score_tile((const bf16 *)block, 32, q + (size_t)h * D, D, b, length, w->scores + (size_t)h * stride,
                           stride, w->max + h, MIN(group - g, HEADS_PER_TILE));
            }
        }
    for (int h = 0; h < heads; h++)
        w->inverse_sum[h] = softmax(w->scores + (size_t)h * stride, w->probs + (size_t)h * stride, length, w->max[h]);
    memset(w->acc, 0, sizeof(float) * heads * D);
    prefetch_slots(views, kv_heads, views[0].values, 0, MIN(2 * SPAN_PAIRS, length), D);
    for (int p0 = 0; p0 < pairs; p0 += SPAN_PAIRS) {
        const int p1 = pairs - p0 < SPAN_PAIRS ? pairs : p0 + SPAN_PAIRS;
        if (p1 < pairs) prefetch_slots(views, kv_heads, views[0].values, 2 * p1, MIN(2 * (p1 + SPAN_PAIRS), length), D);
        for (int kv = 0; kv < kv_heads; kv++)
            for (int g = 0; g < group; g += HEADS_PER_TILE) {
                const int h = kv * group + g;
                values_tile(&views[kv], w->probs + (size_t)h * stride, stride, D, length, p0, p1, w->acc + (size_t)h * D,
                            MIN(group - g, HEADS_PER_TILE));
            }
    }
    finish_heads(w->acc, w->inverse_sum, heads, D, out);
}

/* ── attention over an 8-bit KV cache ────────────────────────────────────────────────────
 * Each token's K (and V) row of each KV head is stored as int8 codes c = round(x * 127 / max|x|)
 * of its bf16 values, with the row's scale max|x| / 127 beside it (store_kv8): half the bytes a
 * step reads at long context. A query row is quantized per head to int16 (qi, scale qs), so a score
 * is qs * ks * sum(qi * c), the sum in int32 (vpdpbusd, 4 codes at a time) and exact whatever its
 * order: |qi| <= 32767, |c| <= 127, head_dim <= 512, under 2^31. The values are weighted the same way:
 * each key's weight (its probability times its value scale) as int16 codes of the KV head's largest
 * value scale, summed in int32 over a span of SPAN_KEYS keys (vpdpwssd, exact: under 2^31 again),
 * each span's sums then added in float32 in key order. Each KV head's codes lie in a plane of their
 * own, so a sequence's keys are consecutive 64-byte rows. A lone row reads its keys' codes straight
 * from the pool into the vectors a prompt chunk lays out once (gather_keys8), so both ways compute
 * the same numbers. The head dim is a multiple of 64 (one row of codes per vector). */

#define KV_BF16 0
#define KV_INT8 1
#define CODE_MAX 127.0f
#define QUERY_MAX 32767.0f
#define QUERY_BIAS 32768 /* query codes + this are unsigned 16 bits: a high and a low byte for vpdpbusd */
#define PREFETCH_KEYS 64  /* how far ahead a lone row asks for the keys' and values' codes */
#define SPAN_KEYS 64  /* keys whose weighted values are summed in int32 before float32, and prefetched together */
#define FLUSH_SUBNORMALS 0x8040u /* MXCSR flush-to-zero and denormals-are-zero */

typedef struct {
    const int8_t *keys, *values;             /* the KV head's planes of the layer's pools [slots, head_dim] */
    const float *key_scales, *value_scales;  /* [slots] */
    /* each key's slot, then the last key's up to length + PREFETCH_KEYS + 16: rows ahead of the keys are
     * requested without a test */
    const int32_t *rows;
    /* a gathered chunk's (else NULL): key blocks as score8_tile reads them, values as add_values8 does */
    const v16i *key_blocks;  /* [blocks][head_dim / 4] */
    const int16_t *value_pairs; /* [padded / 2][head_dim][2]: two keys' codes per dim */
    float *key_scales_t, *value_scales_t; /* [padded] in key order, zeros past the length */
} kv8_view;

typedef struct {
    uint8_t *q;             /* [2][heads][D]: the query row's codes + 32768, high bytes then low bytes */
    float *q_scales;        /* [heads] */
    float *scores;          /* [heads][stride] */
    int16_t *weights;       /* [heads][stride]: each key's weight p * vs, as codes (softmax8) */
    float *acc;             /* [heads][D] */
    float *max;             /* [heads][16]: each head's largest score of each lane */
    float *inverse_sum;     /* [heads] */
    v16i *block;         /* [MAX_HEAD_DIM / 64][16]: a lone row's key block */
} row8_scratch;

/* one row (n values) of K or V, rounded to bf16 as the bf16 pool would hold it, as codes and scale */
static void store_kv8(const float *x, int n, int8_t *codes, float *scale) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(round_bf16(x[i])));
    const float inverse = amax > 0.0f ? CODE_MAX / amax : 0.0f;
    for (int i = 0; i < n; i++) codes[i] = (int8_t)lrintf(round_bf16(x[i]) * inverse);
    *scale = amax / CODE_MAX;
}

/* the query row's heads (bf16, pre-scaled) as int16 codes and scales */
static void quantize_query(const bf16 *q, int heads, int D, uint8_t *bytes, float *scales) {
    for (int h = 0; h < heads; h++) {
        const bf16 *row = q + (size_t)h * D;
        v16f largest = v16_setzero_ps();
        for (int d = 0; d < D; d += 16)
            largest = v16_max_ps(largest, v16_abs_ps(v16_cvtpbh_ps(_mm256_loadu_si256((const __m256i *)(row + d)))));
        const float amax = v16_reduce_max_ps(largest);
        const v16f inverse = v16_set1_ps(amax > 0.0f ? QUERY_MAX / amax : 0.0f);
        for (int d = 0; d < D; d += 16) {
            const v16f x = v16_cvtpbh_ps(_mm256_loadu_si256((const __m256i *)(row + d)));
            const v16i biased = v16_add_epi32(v16_cvtps_epi32(v16_mul_ps(x, inverse)), v16_set1_epi32(QUERY_BIAS));
            _mm_storeu_si128((__m128i *)(bytes + (size_t)h * D + d), v16_cvtepi32_epi8(v16_srli_epi32(biased, 8)));
            _mm_storeu_si128((__m128i *)(bytes + (size_t)(heads + h) * D + d),
                             v16_cvtepi32_epi8(v16_and_si512(biased, v16_set1_epi32(0xff))));
        }
        scales[h] = amax / QUERY_MAX;
    }
}

static inline const int8_t *key_codes(const kv8_view *view, int key, int D) {
    return view->keys + (size_t)view->rows[key] * D;
}

static inline const int8_t *value_codes(const kv8_view *view, int key, int D) {
    return view->values + (size_t)view->rows[key] * D;
}

/* chunk c of block b's keys (16 of them, zeros past length) as vectors of 4 codes per key: r[j] lane i
 * is key 16b + i's codes 64c + 4j .. 64c + 4j + 3. Each row read asks for the same row PREFETCH_KEYS
 * keys on: a lone row reads every key once, and requests spread among the work keep the memory busy
 * while the scores are summed (in bursts they wait for each other). */
static inline __attribute__((always_inline)) void load_key_chunk8(
    const kv8_view *view, int b, int c, int D, int length, v16i r[16]) {
    const int first = 16 * b, count = MIN(length - first, 16);
    for (int i = 0; i < 16; i++) {
        _mm_prefetch((const char *)(key_codes(view, first + i + PREFETCH_KEYS, D) + 64 * c), _MM_HINT_T0);
        r[i] = i < count ? v16_loadu_si512(key_codes(view, first + i, D) + 64 * c) : v16_setzero_si512();
    }
    transpose16(r);
}

/* block b's keys, every chunk, into out [D / 4] */
static void transpose_key_block8(const kv8_view *view, int b, int D, int length, v16i *out) {
    for (int c = 0; c < D / 64; c++) {
        v16i r[16];
        load_key_chunk8(view, b, c, D, length, r);
        for (int j = 0; j < 16; j++) v16_store_si512(out + 16 * c + j, r[j]);
    }
}

/* scores of keys 16b .. 16b+15 for n heads, -inf past length, from their block (transpose_key_block8),
 * or with block NULL straight from the pool (load_key_chunk8: the same vectors) */
static inline __attribute__((always_inline)) void score8_tile(
    const kv8_view *view, const v16i *block, const uint8_t *q_high, const uint8_t *q_low, const float *q_scales, const float *key_scales,
    int D, int b, int length, float *scores, int stride, float *max, const int n) {
    /* per key: sum(high * c), sum(low * c) and sum(c), 4 codes per vpdpbusd; then
     * sum(qi * c) = 256 * high + low - 32768 * sum(c), exactly */
    v16i high[HEADS_PER_TILE], low[HEADS_PER_TILE], code_sums = v16_setzero_si512();
    const v16i ones = v16_set1_epi8(1);
    for (int h = 0; h < n; h++) high[h] = low[h] = v16_setzero_si512();
    for (int c = 0; c < D / 64; c++) {
        v16i r[16];
        if (block == NULL) load_key_chunk8(view, b, c, D, length, r);
        for (int j = 0; j < 16; j++) {
            const int x = 16 * c + j;
            const v16i codes = block == NULL ? r[j] : v16_load_si512(block + x);
            code_sums = v16_dot_quads(code_sums, ones, codes);
            for (int h = 0; h < n; h++) {
                int32_t quad_high, quad_low;
                memcpy(&quad_high, q_high + (size_t)h * D + 4 * x, sizeof quad_high);
                memcpy(&quad_low, q_low + (size_t)h * D + 4 * x, sizeof quad_low);
                high[h] = v16_dot_quads(high[h], v16_set1_epi32(quad_high), codes);
                low[h] = v16_dot_quads(low[h], v16_set1_epi32(quad_low), codes);
            }
        }
    }
    const v16i bias = v16_slli_epi32(code_sums, 15);
    const v16f ks = v16_loadu_ps(key_scales + 16 * b);
    const int left = length - 16 * b;
    for (int h = 0; h < n; h++) {
        const v16i sums = v16_sub_epi32(v16_add_epi32(v16_slli_epi32(high[h], 8), low[h]), bias);
        v16f s = v16_mul_ps(v16_cvtepi32_ps(sums), v16_mul_ps(ks, v16_set1_ps(q_scales[h])));
        if (left < 16) s = v16_mask_blend_ps((__mmask16)((1u << left) - 1u), v16_set1_ps(-INFINITY), s);
        v16_storeu_ps(scores + (size_t)h * stride + 16 * b, s);
        v16_storeu_ps(max + 16 * h, v16_max_ps(v16_loadu_ps(max + 16 * h), s));
    }
}

/* one head's weights: its probabilities (e^(s - max) / their sum) times the value scales, as int16
 * codes of the KV head's largest value scale, which no weight exceeds (zeros up to length + 16);
 * returns the float value of one code over the sum of e^(s - max) */
static float softmax8(const float *s, const float *value_scales, int length, float max, float largest_scale,
                      int16_t *weights) {
    const v16f vmax = v16_set1_ps(max), inverse = v16_set1_ps(largest_scale > 0.0f ? QUERY_MAX / largest_scale : 0.0f);
    v16f sum = v16_setzero_ps();
    for (int k = 0; k < length + 16; k += 16) {
        const __mmask16 lanes = length - k >= 16 ? (__mmask16)0xffff : length > k ? (__mmask16)((1u << (length - k)) - 1u) : 0;
        const v16f e = v16_maskz_mov_ps(lanes, exp_ps(v16_sub_ps(v16_maskz_loadu_ps(lanes, s + k), vmax)));
        sum = v16_add_ps(sum, e);
        const v16f scaled = v16_mul_ps(v16_mul_ps(e, v16_maskz_loadu_ps(lanes, value_scales + k)), inverse);
        _mm256_storeu_si256((__m256i *)(weights + k), v16_cvtsepi32_epi16(v16_cvtps_epi32(scaled)));
    }
    return largest_scale / QUERY_MAX / v16_reduce_add_ps(sum);
}

/* acc [n][D] += the values of keys k0 .. k1-1 (one span, k0 even) times their weights' codes, by pairs
 * of keys (a key past length: codes and weight 0) */
static inline __attribute__((always_inline)) void add_values8(
    const kv8_view *view, const int16_t *weights, int stride, int D, int length, int k0, int k1, float *acc_out,
    const int n) {
    for (int d0 = 0; d0 < D; d0 += 64) {
        v16i acc[HEADS_PER_TILE][4];
        for (int h = 0; h < n; h++)
            for (int j = 0; j < 4; j++) acc[h][j] = v16_setzero_si512();
        for (int k = k0; k < k1; k += 2) {
            v16i v[4];
            if (view->value_pairs == NULL) {
                _mm_prefetch((const char *)(value_codes(view, k + PREFETCH_KEYS, D) + d0), _MM_HINT_T0);
                _mm_prefetch((const char *)(value_codes(view, k + PREFETCH_KEYS + 1, D) + d0), _MM_HINT_T0);
                const int8_t *a = value_codes(view, k, D) + d0, *b = k + 1 < length ? value_codes(view, k + 1, D) + d0 : NULL;
                const v16i a0 = v16_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)a));
                const v16i a1 = v16_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(a + 32)));
                const v16i b0 = b ? v16_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)b)) : v16_setzero_si512();
                const v16i b1 = b ? v16_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(b + 32))) : v16_setzero_si512();
                v[0] = v16_interleave_low(a0, b0);
                v[1] = v16_interleave_high(a0, b0);
                v[2] = v16_interleave_low(a1, b1);
                v[3] = v16_interleave_high(a1, b1);
            } else {
                for (int j = 0; j < 4; j++) v[j] = v16_loadu_si512(view->value_pairs + ((size_t)(k / 2) * D + d0) * 2 + 32 * j);
            }
            for (int h = 0; h < n; h++) {
                int32_t pair;
                memcpy(&pair, weights + (size_t)h * stride + k, sizeof pair);
                const v16i w = v16_set1_epi32(pair);
                for (int j = 0; j < 4; j++) acc[h][j] = v16_dot_pairs(acc[h][j], v[j], w);
            }
        }
        for (int h = 0; h < n; h++)
            for (int j = 0; j < 4; j++) {
                float *out = acc_out + (size_t)h * D + d0 + 16 * j;
                v16_storeu_ps(out, v16_add_ps(v16_loadu_ps(out), v16_cvtepi32_ps(acc[h][j])));
            }
    }
}

static void score8(const kv8_view *view, const v16i *block, const uint8_t *q_high, const uint8_t *q_low,
                   const float *q_scales, const float *key_scales, int D, int b, int length, float *scores, int stride,
                   float *max, int n) {
    switch (n) {
        case 1: score8_tile(view, block, q_high, q_low, q_scales, key_scales, D, b, length, scores, stride, max, 1); break;
        case 2: score8_tile(view, block, q_high, q_low, q_scales, key_scales, D, b, length, scores, stride, max, 2); break;
        case 3: score8_tile(view, block, q_high, q_low, q_scales, key_scales, D, b, length, scores, stride, max, 3); break;
        default: score8_tile(view, block, q_high, q_low, q_scales, key_scales, D, b, length, scores, stride, max, 4); break;
    }
}static void values8(const kv8_view *view, const int16_t *weights, int stride, int D, int length, int k0, int k1,
                    float *acc, int n) {
    switch (n) {
        case 1: add_values8(view, weights, stride, D, length, k0, k1, acc, 1); break;
        case 2: add_values8(view, weights, stride, D, length, k0, k1, acc, 2); break;
        case 3: add_values8(view, weights, stride, D, length, k0, k1, acc, 3); break;
        default: add_values8(view, weights, stride, D, length, k0, k1, acc, 4); break;
    }
}

/* the scales of keys 0 .. length-1 in key order (zeros up to the next 16): 16 keys on consecutive slots
 * (a sequence's usual run) are one load from the KV head's plane, others a gather; either way the
 * scales PREFETCH_KEYS keys on are asked for (a gather waits for each of its lines in turn) */
static void gather_scales8(const kv8_view *view, int length) {
    const v16i iota = v16_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int k = 0; k < length; k += 16) {
        const int32_t ahead = view->rows[k + PREFETCH_KEYS];
        _mm_prefetch((const char *)(view->key_scales + ahead), _MM_HINT_T0);
        _mm_prefetch((const char *)(view->value_scales + ahead), _MM_HINT_T0);
        const __mmask16 lanes = length - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (length - k)) - 1u);
        const v16i index = v16_maskz_loadu_epi32(lanes, view->rows + k);
        v16f keys, values;
        if (lanes == 0xffff && v16_cmpeq_epi32_mask(index, v16_add_epi32(v16_set1_epi32(view->rows[k]), iota)) == 0xffff) {
            keys = v16_loadu_ps(view->key_scales + view->rows[k]);
            values = v16_loadu_ps(view->value_scales + view->rows[k]);
        } else {
            keys = v16_mask_i32gather_ps(v16_setzero_ps(), lanes, index, view->key_scales, 4);
            values = v16_mask_i32gather_ps(v16_setzero_ps(), lanes, index, view->value_scales, 4);
        }
        v16_storeu_ps(view->key_scales_t + k, keys);
        v16_storeu_ps(view->value_scales_t + k, values);
    }
}

/* a prompt chunk's keys of one KV head, once, in the layouts its rows read: key blocks [blocks][D / 4]
 * vectors, value pairs [padded / 2][D][2] (add_values8's vectors) */
static void gather_keys8(kv8_view *view, int D, int length, v16i *key_blocks, int16_t *value_pairs) {
    const int blocks = (length + 15) / 16;
    for (int b = 0; b < blocks; b++) transpose_key_block8(view, b, D, length, key_blocks + (size_t)b * (D / 4));
    for (int k = 0; k < length; k += 2) {
        const int8_t *a = value_codes(view, k, D), *b = k + 1 < length ? value_codes(view, k + 1, D) : NULL;
        int16_t *dst = value_pairs + (size_t)(k / 2) * D * 2;
        for (int d = 0; d < D; d += 32) {
            const v16i va = v16_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(a + d)));
            const v16i vb = b ? v16_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(b + d))) : v16_setzero_si512();
            v16_storeu_si512(dst + 2 * d, v16_interleave_low(va, vb));
            v16_storeu_si512(dst + 2 * d + 32, v16_interleave_high(va, vb));
        }
    }
    gather_scales8(view, length);
    view->key_blocks = key_blocks;
    view->value_pairs = value_pairs;
}

/* One query row (q [kv_count * group][D] bf16, heads in KV-head order) over KV heads views[0 ..
 * kv_count-1]: a lone row straight from the pool, every KV head in lockstep (as attend_direct), or a
 * row of a gathered chunk (kv_count 1). */
static void attend8(const kv8_view *views, int kv_count, const bf16 *q, int group, int D, int length, int stride,
                    const row8_scratch *w, bf16 *out) {
    const int blocks = (length + 15) / 16, heads = kv_count * group, direct = views[0].key_blocks == NULL;
    /* subnormal floats as zero, in and out: a tiny weight times a tiny scale would cost every FMA
     * that meets it a microcode assist (dpbf16, in the bf16 path, flushes them itself) */
    const unsigned int control = _mm_getcsr();
    _mm_setcsr(control | FLUSH_SUBNORMALS);
    quantize_query(q, heads, D, w->q, w->q_scales);
    for (int h = 0; h < heads; h++) v16_storeu_ps(w->max + 16 * h, v16_set1_ps(-INFINITY));
    if (direct)
        for (int kv = 0; kv < kv_count; kv++) gather_scales8(&views[kv], length);
    for (int b = 0; b < blocks; b++)
        for (int kv = 0; kv < kv_count; kv++) {
            /* a lone row's tile reads its block straight from the pool; with more heads than one tile
             * takes, the block is laid out once for them all */
            const v16i *block = direct ? NULL : views[kv].key_blocks + (size_t)b * (D / 4);
            if (direct && group > HEADS_PER_TILE) {
                transpose_key_block8(&views[kv], b, D, length, w->block);
                block = w->block;
            }
            for (int g = 0; g < group; g += HEADS_PER_TILE) {
                const int h = kv * group + g;
                score8(&views[kv], block, w->q + (size_t)h * D, w->q + (size_t)(heads + h) * D, w->q_scales + h, views[kv].key_scales_t, D, b, length,
                       w->scores + (size_t)h * stride, stride, w->max + 16 * h, MIN(group - g, HEADS_PER_TILE));
            }
        }
    float largest_scale[kv_count];
    for (int kv = 0; kv < kv_count; kv++) {
        v16f largest = v16_setzero_ps();
        for (int k = 0; k < length; k += 16) {  /* the row's own keys only: a chunk's later rows' are laid out too */
            const __mmask16 lanes = length - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (length - k)) - 1u);
            largest = v16_max_ps(largest, v16_maskz_loadu_ps(lanes, views[kv].value_scales_t + k));
        }
        largest_scale[kv] = v16_reduce_max_ps(largest);
    }
    for (int h = 0; h < heads; h++)
        w->inverse_sum[h] = softmax8(w->scores + (size_t)h * stride, views[h / group].value_scales_t, length,
                                     v16_reduce_max_ps(v16_loadu_ps(w->max + 16 * h)), largest_scale[h / group],
                                     w->weights + (size_t)h * stride);
    memset(w->acc, 0, sizeof(float) * heads * D);
    for (int k0 = 0; k0 < length; k0 += SPAN_KEYS) {
        const int k1 = MIN(k0 + SPAN_KEYS, length);
        for (int kv = 0; kv < kv_count; kv++)
            for (int g = 0; g < group; g += HEADS_PER_TILE) {
                const int h = kv * group + g;
                values8(&views[kv], w->weights + (size_t)h * stride, stride, D, length, k0, k1, w->acc + (size_t)h * D,
                        MIN(group - g, HEADS_PER_TILE));
            }
    }
    finish_heads(w->acc, w->inverse_sum, heads, D, out);
    _mm_setcsr(control);
}

/* rows [length + PREFETCH_KEYS + 16]: each key's slot, then the last one's */
static void key_rows8(const int32_t *slots, int length, int32_t *rows) {
    memcpy(rows, slots, sizeof(int32_t) * length);
    const v16i last = v16_set1_epi32(rows[length - 1]);
    for (int k = length; k < length + PREFETCH_KEYS + 16; k += 16) v16_storeu_si512(rows + k, last);
}

/* the per-worker scratch of an 8-bit KV attention unit */
typedef struct {
    int16_t *query_codes; /* [heads][D] codes, then [heads] float scales */
    float *scores;        /* [heads][padded + 16] */
    int16_t *weights;     /* [heads][padded + 16] */
    float *acc;           /* [heads][D], then [heads][16] max and [heads] 1 / sum */
    float *scales;        /* [2][kv heads][padded + 16] */
    int32_t *rows;        /* [padded + PREFETCH_KEYS + 16] */
    v16i *key_blocks;  /* a chunk's [padded / 16][D / 4] */
    int16_t *value_pairs; /* a chunk's [padded / 2][D][2] */
} kv8_buffers;

/* one attention unit over an 8-bit KV cache: a lone row for kv_count KV heads from kv_first on, or
 * the `count` rows (q, out [count][heads * D]) of a prompt chunk for KV head kv_first */
static void attend8_unit(const lm_model *md, int layer, int kv_first, int kv_count, const int32_t *slots,
                         const int64_t *positions, int count, const bf16 *q, bf16 *out, kv8_buffers buffers) {
    const int D = md->head_dim, KVH = md->num_kv_heads, QH = md->num_heads, group = QH / KVH;
    const int length = (int)positions[count - 1] + 1, padded = (length + 15) & ~15;
    v16i block[MAX_HEAD_DIM / 4];
    const row8_scratch w = {(uint8_t *)buffers.query_codes, (float *)(buffers.query_codes + (size_t)QH * D), buffers.scores,
                            buffers.weights, buffers.acc, buffers.acc + (size_t)QH * D, buffers.acc + (size_t)QH * (D + 16), block};
    key_rows8(slots, length, buffers.rows);
    kv8_view views[KVH];
    for (int kv = 0; kv < kv_count; kv++) {
        const size_t plane = (size_t)(kv_first + kv) * md->kv_slots;  /* the KV head's rows */
        float *own = buffers.scales + (size_t)2 * kv * (padded + 16);
        views[kv] = (kv8_view){(const int8_t *)md->k_pool[layer] + plane * D, (const int8_t *)md->v_pool[layer] + plane * D,
                               md->k_scales[layer] + plane, md->v_scales[layer] + plane, buffers.rows,
                               NULL, NULL, own, own + padded + 16};
    }
    const size_t heads = (size_t)kv_first * group * D, row = (size_t)QH * D;
    if (count == 1) {
        attend8(views, kv_count, q + heads, group, D, length, padded + 16, &w, out + heads);
        return;
    }
    gather_keys8(&views[0], D, length, buffers.key_blocks, buffers.value_pairs);
    for (int t = 0; t < count; t++) {
        const int own_length = (int)positions[t] + 1;
        attend8(views, 1, q + t * row + heads, group, D, own_length, ((own_length + 15) & ~15) + 16, &w, out + t * row + heads);
    }
}

static void rotate(float *x, const float *cos, const float *sin, int half) {
    for (int i = 0; i < half; i++) {
        float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * cos[i] - x2 * sin[i];
        x[i + half] = x2 * cos[i] + x1 * sin[i];
    }
}

/* ── the forward pass ────────────────────────────────────────────────────────────────────── */

/* an attention unit: a prompt chunk for one KV head (its rows share the gathered keys), or a lone
 * row for kv_count KV heads from kv_first on */
typedef struct {
    int chunk, kv_first, kv_count;
} attention_unit;

/* the scratch memory of a step (scratch_alloc): the token rows' buffers, then each worker's
 * attention buffers, each *_each elements apart */
typedef struct {
    float *x;             /* [T, H]: the residual stream */
    float *y;             /* [T, max(QKV, 2 * I, H)]: a projection's output */
    bf16 *act;            /* [T, max(I, QS)]: the attention's output, then the MLP's */
    bf16 *normed;         /* [T, H] */
    bf16 *q;              /* [T, QS]: the rotated, pre-scaled queries */
    float *sums;          /* [T, max(I, QS, H) / GROUP + 1]: project's */
    attention_unit *units; /* [num_chunks * KVH + 1] */
    /* a gathered chunk's keys and values (8-bit KV: key blocks of codes and pairs of int16 codes) */
    bf16 *keys_t, *values_t; /* [padded_max, D] each */
    /* 8-bit KV: each worker's query codes and scales, and the key and value scales of every KV head */
    int16_t *query_codes; /* [QH * D + QH * 2] */
    float *scales;        /* [2 * KVH, padded_max + 16] */
    int32_t *key_rows;    /* [padded_max + PREFETCH_KEYS + 32] */
    float *scores;        /* [QH, padded_max + 16] */
    bf16 *probs;          /* [QH, padded_max + 16] (8-bit KV: int16 weights) */
    float *accs;          /* [QH, D + 17]: acc, then max and 1 / sum */
    int padded_max;       /* the longest sequence's length, rounded up to 16 */
    size_t kv_each, query_each, scale_each, rows_each, head_each, acc_each;
} lm_scratch;

static void scratch_free(lm_scratch *s) {
    free(s->x); free(s->y); free(s->act); free(s->normed); free(s->q); free(s->sums); free(s->units);
    free(s->keys_t); free(s->values_t); free(s->query_codes); free(s->scales); free(s->key_rows);
    free(s->scores); free(s->probs); free(s->accs);
}

/* s sized for a step of T tokens at these positions in num_chunks chunks, on `threads` workers; 0, or
 * -1 with nothing left allocated. One allocation per buffer, as before, so none moves: keys_t is
 * 64-byte aligned for the aligned loads and stores of an 8-bit chunk's key blocks */
static int scratch_alloc(lm_scratch *s, const lm_model *md, int T, const int64_t *positions, int num_chunks,
                         int threads) {
    const int H = md->hidden, I = md->intermediate, D = md->head_dim, QH = md->num_heads, KVH = md->num_kv_heads;
    const int QKV = (QH + 2 * KVH) * D, QS = QH * D, workers = threads > 1 ? threads : 1;
    const int widest = MAX(MAX(QKV, 2 * I), H), deepest = MAX(MAX(I, QS), H);
    int max_len = 0;
    for (int t = 0; t < T; t++) max_len = positions[t] + 1 > max_len ? (int)positions[t] + 1 : max_len;
    s->padded_max = (max_len + 15) & ~15;
    s->kv_each = (size_t)s->padded_max * D;
    s->query_each = (size_t)(QH * D + QH * 2);
    s->scale_each = (size_t)2 * KVH * (s->padded_max + 16);
    s->rows_each = (size_t)s->padded_max + PREFETCH_KEYS + 32;
    s->head_each = (size_t)QH * (s->padded_max + 16);
    s->acc_each = (size_t)QH * (D + 17);
    s->x = malloc(sizeof(float) * T * H);
    s->y = malloc(sizeof(float) * T * widest);
    s->act = malloc(sizeof(bf16) * T * MAX(I, QS));
    s->normed = malloc(sizeof(bf16) * T * H);
    s->q = malloc(sizeof(bf16) * T * QS);
    s->sums = malloc(sizeof(float) * T * (deepest / GROUP + 1));
    s->units = malloc(sizeof(attention_unit) * ((size_t)num_chunks * KVH + 1));
    s->keys_t = aligned_alloc(64, sizeof(bf16) * s->kv_each * workers);
    s->values_t = malloc(sizeof(bf16) * s->kv_each * workers);
    s->query_codes = malloc(sizeof(int16_t) * s->query_each * workers);
    s->scales = malloc(sizeof(float) * s->scale_each * workers);
    s->key_rows = malloc(sizeof(int32_t) * s->rows_each * workers);
    s->scores = malloc(sizeof(float) * s->head_each * workers);
    s->probs = malloc(sizeof(bf16) * s->head_each * workers);
    s->accs = malloc(sizeof(float) * s->acc_each * workers);
    if (s->x && s->y && s->act && s->normed && s->q && s->sums && s->units && s->keys_t && s->values_t &&
        s->query_codes && s->scales && s->key_rows && s->scores && s->probs && s->accs)
        return 0;
    scratch_free(s);
    return -1;
}

/* a step's attention units into units; returns how many. A lone row takes all its KV heads at once,
 * or one unit per KV head when there are too few lone rows to keep the threads busy */
static int plan_units(int num_chunks, const int64_t *chunk_starts, int KVH, int threads, attention_unit *units) {
    int lone = 0, num_units = 0;
    for (int c = 0; c < num_chunks; c++) lone += chunk_starts[c + 1] - chunk_starts[c] == 1;
    const int lone_split = lone < threads ? KVH : 1;
    for (int c = 0; c < num_chunks; c++) {
        const int parts = chunk_starts[c + 1] - chunk_starts[c] == 1 ? lone_split : KVH;
        for (int part = 0; part < parts; part++)
            units[num_units++] = (attention_unit){c, part * (KVH / parts), KVH / parts};
    }
    return num_units;
}

/* one attention unit of a layer, on worker `worker`'s buffers of s: the queries of s->q into s->act,
 * over an 8-bit KV cache (attend8_unit), for a lone row straight from the pool (attend_direct), or for a
 * prompt chunk's rows over its keys gathered once (attend_gathered) */
static void attend_unit(const lm_model *md, int layer, const lm_scratch *s, int worker, attention_unit unit,
                        const int64_t *positions, const int64_t *chunk_starts, const int64_t *chunk_rows) {
    const int D = md->head_dim, QH = md->num_heads, KVH = md->num_kv_heads, group = QH / KVH, QS = QH * D;
    const int c = unit.chunk, first = (int)chunk_starts[c], count = (int)(chunk_starts[c + 1] - chunk_starts[c]);
    const int length = (int)positions[first + count - 1] + 1;
    const int32_t *slots = md->slot_table + (size_t)chunk_rows[c] * md->table_width;
    float *acc = s->accs + (size_t)worker * s->acc_each;
    if (md->kv_format == KV_INT8) {
        attend8_unit(md, layer, unit.kv_first, unit.kv_count, slots, positions + first, count,
                     s->q + (size_t)first * QS, s->act + (size_t)first * QS,
                     (kv8_buffers){s->query_codes + (size_t)worker * s->query_each,
                                   s->scores + (size_t)worker * s->head_each,
                                   (int16_t *)s->probs + (size_t)worker * s->head_each, acc,
                                   s->scales + (size_t)worker * s->scale_each,
                                   s->key_rows + (size_t)worker * s->rows_each,
                                   (v16i *)(s->keys_t + (size_t)worker * s->kv_each),
                                   (int16_t *)s->values_t + (size_t)worker * s->kv_each});
        return;
    }
    const row_scratch w = {s->scores + (size_t)worker * s->head_each, s->probs + (size_t)worker * s->head_each, acc,
                           acc + (size_t)QH * D, acc + (size_t)QH * D + QH};
    kv_view views[KVH];
    for (int kv = 0; kv < KVH; kv++)
        views[kv] = (kv_view){NULL, NULL, (length + 15) & ~15, (const int32_t *)md->k_pool[layer],
                              (const bf16 *)md->v_pool[layer], slots, KVH, kv};
    if (count == 1) {
        const size_t heads = (size_t)first * QS + (size_t)unit.kv_first * group * D;
        attend_direct(views + unit.kv_first, unit.kv_count, s->q + heads, group, D, length, &w, s->act + heads);
        return;
    }
    kv_view *view = &views[unit.kv_first];
    view->keys_t = s->keys_t + (size_t)worker * s->kv_each;
    view->values_t = s->values_t + (size_t)worker * s->kv_each;
    gather_keys(md, layer, slots, length, unit.kv_first, view);
    for (int t = first; t < first + count; t++) {
        const size_t heads = (size_t)t * QS + (size_t)unit.kv_first * group * D;
        attend_gathered(view, s->q + heads, group, D, (int)positions[t] + 1, &w, s->act + heads);
    }
}

/* T new tokens in chunks: chunk c is tokens chunk_starts[c] .. chunk_starts[c+1]-1, consecutive
 * positions of the sequence on slot-table row chunk_rows[c] (already mapping every position,
 * the new ones to new_slots). Writes the tokens' K/V; logits [num_logits, vocab] for the tokens
 * logit_tokens. Returns 0; -1 when scratch memory could not be allocated; -2 for a token id or
 * position out of range (nothing is written then). */
int lm_forward(const lm_model *md, int T, const int64_t *token_ids, const int64_t *positions,
               int num_chunks, const int64_t *chunk_starts, const int64_t *chunk_rows, const int64_t *new_slots,
               int num_logits, const int64_t *logit_tokens, float *logits, int threads) {
    const int H = md->hidden, I = md->intermediate, D = md->head_dim, half = D / 2;
    const int QH = md->num_heads, KVH = md->num_kv_heads;
    const int QKV = (QH + 2 * KVH) * D, QS = QH * D, KVS = KVH * D;
    const float scale = 1.0f / sqrtf((float)D);
    if (D > MAX_HEAD_DIM || T < 1) return -2;
    for (int t = 0; t < T; t++)
        if (token_ids[t] < 0 || token_ids[t] >= md->vocab || positions[t] < 0 || positions[t] >= md->max_positions ||
            positions[t] >= md->table_width)
            return -2;
    lm_scratch s;
    if (scratch_alloc(&s, md, T, positions, num_chunks, threads) != 0) return -1;
    const int num_units = plan_units(num_chunks, chunk_starts, KVH, threads, s.units), kv8 = md->kv_format == KV_INT8;
    for (int t = 0; t < T; t++) {
        if (md->embed == NULL) {
            unpack_column(md->head_format, md->head, (int)token_ids[t], H, s.x + (size_t)t * H);
            continue;
        }
        for (int i = 0; i < H; i++) s.x[(size_t)t * H + i] = bf16_to_f32(md->embed[(size_t)token_ids[t] * H + i]);
    }

    for (int layer = 0; layer < md->num_layers; layer++) {
        rms_norm(s.x, md->input_norm[layer], s.normed, T, H, md->eps);
        project(md->layer_format, md->qkv[layer], s.normed, s.sums, s.y, T, QKV, H, threads);
        for (int t = 0; t < T; t++) {
            float *r = s.y + (size_t)t * QKV;
            const float *cos = md->rope_cos + (size_t)positions[t] * half, *sin = md->rope_sin + (size_t)positions[t] * half;
            for (int i = 0; i + 16 <= QKV; i += 16) v16_storeu_ps(r + i, round_bf16_ps(v16_loadu_ps(r + i)));
            for (int i = QKV & ~15; i < QKV; i++) r[i] = round_bf16(r[i]);
            for (int h = 0; h < QH + KVH; h++) rotate(r + (size_t)h * D, cos, sin, half);
            for (int i = 0; i < QS; i++) s.q[(size_t)t * QS + i] = f32_to_bf16(round_bf16(r[i]) * scale);
            const size_t slot = (size_t)new_slots[t];
            if (kv8) {
                for (int kv = 0; kv < KVH; kv++) {
                    const size_t row = (size_t)kv * md->kv_slots + slot;
                    store_kv8(r + QS + kv * D, D, (int8_t *)md->k_pool[layer] + row * D, md->k_scales[layer] + row);
                    store_kv8(r + QS + KVS + kv * D, D, (int8_t *)md->v_pool[layer] + row * D, md->v_scales[layer] + row);
                }
                continue;
            }
            bf16 *kd = (bf16 *)md->k_pool[layer] + slot * KVS, *vd = (bf16 *)md->v_pool[layer] + slot * KVS;
            for (int i = 0; i < KVS; i++) {
                kd[i] = f32_to_bf16(r[QS + i]);
                vd[i] = f32_to_bf16(r[QS + KVS + i]);
            }
        }
#pragma omp parallel for schedule(dynamic) num_threads(threads) if (threads > 1 && num_units > 1)
        for (int unit = 0; unit < num_units; unit++) {
#ifdef _OPENMP
            const int worker = threads > 1 ? omp_get_thread_num() : 0;
#else
            const int worker = 0;
#endif
            attend_unit(md, layer, &s, worker, s.units[unit], positions, chunk_starts, chunk_rows);
        }
        project(md->layer_format, md->o[layer], s.act, s.sums, s.y, T, H, QS, threads);
        add_rounded(s.x, s.y, (size_t)T * H);
        rms_norm(s.x, md->post_norm[layer], s.normed, T, H, md->eps);
        project(md->layer_format, md->gate_up[layer], s.normed, s.sums, s.y, T, 2 * I, H, threads);
        for (int t = 0; t < T; t++) {
            const float *g = s.y + (size_t)t * 2 * I, *u = g + I;
            for (int i = 0; i < I; i += 16) {  /* silu(gate) * up, each rounded to bf16 as in torch */
                v16f gate = round_bf16_ps(v16_loadu_ps(g + i));
                v16f e = exp_ps(v16_sub_ps(v16_setzero_ps(), gate));
                v16f silu = round_bf16_ps(v16_div_ps(gate, v16_add_ps(v16_set1_ps(1.0f), e)));
                v16f product = v16_mul_ps(silu, round_bf16_ps(v16_loadu_ps(u + i)));
                _mm256_storeu_si256((__m256i *)(s.act + (size_t)t * I + i), v16_cvtneps_pbh(product));
            }
        }
        project(md->layer_format, md->down[layer], s.act, s.sums, s.y, T, H, I, threads);
        add_rounded(s.x, s.y, (size_t)T * H);
    }
    for (int j = 0; j < num_logits; j++) memmove(s.x + (size_t)j * H, s.x + (size_t)logit_tokens[j] * H, sizeof(float) * H);
    rms_norm(s.x, md->final_norm, s.normed, num_logits, H, md->eps);
    project(md->head_format, md->head, s.normed, s.sums, logits, num_logits, md->vocab, H, threads);
    scratch_free(&s);
    return 0;
}

/* for tests: the bare matmul */
void lm_matmul(const bf16 *w, const bf16 *x, float *y, int M, int N, int K, int threads) {
    matmul(w, x, y, M, N, K, threads);
}

/* for tests: the matmul of a packed weight of any format; -1 when scratch memory could not be allocated */
int lm_project(int format, const void *w, const bf16 *x, float *y, int M, int N, int K, int threads) {
    float *sums = malloc(sizeof(float) * M * (K / GROUP + 1));
    if (!sums) return -1;
    project(format, w, x, sums, y, M, N, K, threads);
    free(sums);
    return 0;
}

/* for tests: column n of a packed weight as float32 */
void lm_unpack_column(int format, const void *w, int n, int K, float *out) { unpack_column(format, w, n, K, out); }

/* the instruction set this library was built for: "avx512" or "avx2" */
const char *lm_isa(void) { return ISA_NAME; }
