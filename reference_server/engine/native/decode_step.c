/* One decode step of a Llama model for B sequences, one new token each, on x86-64 with
 * AVX512-BF16: bf16 weights and KV cache, float32 residual stream and accumulators.
 *
 * Row invariance: every output element is computed by one fixed sequence of instructions that
 * depends only on its own row (the reduction order over k does not depend on how many rows share
 * the call or which thread takes them), so a sequence's tokens do not change with the batch.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

typedef uint16_t bf16;

typedef struct {
    int32_t num_layers, hidden, intermediate, num_heads, num_kv_heads, head_dim, vocab;
    int32_t table_width, max_positions;
    float eps;
    const bf16 *embed;        /* [vocab, hidden] */
    const bf16 *head;         /* [vocab, hidden] */
    const float *final_norm;  /* [hidden] */
    const float *rope_cos;    /* [max_positions, head_dim / 2] */
    const float *rope_sin;
    const int32_t *slot_table; /* [rows, table_width] */
    const float *const *input_norm;  /* per layer [hidden] */
    const float *const *post_norm;
    const bf16 *const *qkv;      /* per layer [(heads + 2 kv heads) * head_dim, hidden] */
    const bf16 *const *o;        /* [hidden, heads * head_dim] */
    const bf16 *const *gate_up;  /* [2 * intermediate, hidden] */
    const bf16 *const *down;     /* [hidden, intermediate] */
    bf16 *const *k_pool;         /* per layer [slots, kv heads, head_dim] */
    bf16 *const *v_pool;
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

/* ── y[m, n] = sum_k w[n, k] * x[m, k], x [M, K] bf16, y [M, N] float32 ─────────────────────
 * w comes packed (lm_pack_weight): panels of 64 output columns, each [K / 2][64][2], so one
 * dpbf16 adds a pair of k to 16 columns and the panel is read front to back once per row tile.
 * Each output lane sums its k pairs in order, whatever the row tile or thread. */

#define PANEL 64  /* output columns per panel: 4 vectors of 16 */
#define ROWS_M 6  /* activation rows per register tile */

static inline __attribute__((always_inline)) void tile(
    const bf16 *panel, const bf16 *x, float *y, int K, int N, int ncols, const int M) {
    __m512 acc[ROWS_M][4];
    for (int m = 0; m < M; m++)
        for (int j = 0; j < 4; j++) acc[m][j] = _mm512_setzero_ps();
    for (int kp = 0; kp < K / 2; kp++) {
        const bf16 *wp = panel + (size_t)kp * 2 * PANEL;
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp), w1 = (__m512bh)_mm512_loadu_si512(wp + 32);
        __m512bh w2 = (__m512bh)_mm512_loadu_si512(wp + 64), w3 = (__m512bh)_mm512_loadu_si512(wp + 96);
        for (int m = 0; m < M; m++) {
            int32_t pair;
            memcpy(&pair, x + (size_t)m * K + 2 * kp, sizeof pair);
            __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
            acc[m][0] = _mm512_dpbf16_ps(acc[m][0], w0, xv);
            acc[m][1] = _mm512_dpbf16_ps(acc[m][1], w1, xv);
            acc[m][2] = _mm512_dpbf16_ps(acc[m][2], w2, xv);
            acc[m][3] = _mm512_dpbf16_ps(acc[m][3], w3, xv);
        }
    }
    for (int m = 0; m < M; m++)
        for (int j = 0; j < 4; j++) {
            int left = ncols - 16 * j;
            if (left <= 0) break;
            __mmask16 mask = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
            _mm512_mask_storeu_ps(y + (size_t)m * N + 16 * j, mask, acc[m][j]);
        }
}

static void matmul(const bf16 *w, const bf16 *x, float *y, int M, int N, int K, int threads) {
    int panels = (N + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int b = 0; b < panels; b++) {
        int n = b * PANEL, ncols = N - n < PANEL ? N - n : PANEL;
        const bf16 *panel = w + (size_t)n * K;
        for (int m = 0; m < M; m += ROWS_M) {
            const bf16 *xm = x + (size_t)m * K;
            float *ym = y + (size_t)m * N + n;
            switch (M - m < ROWS_M ? M - m : ROWS_M) {
                case 1: tile(panel, xm, ym, K, N, ncols, 1); break;
                case 2: tile(panel, xm, ym, K, N, ncols, 2); break;
                case 3: tile(panel, xm, ym, K, N, ncols, 3); break;
                case 4: tile(panel, xm, ym, K, N, ncols, 4); break;
                case 5: tile(panel, xm, ym, K, N, ncols, 5); break;
                default: tile(panel, xm, ym, K, N, ncols, 6); break;
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

/* ── elementwise parts ───────────────────────────────────────────────────────────────────── */

static void rms_norm(const float *x, const float *weight, bf16 *out, int M, int H, float eps) {
    for (int m = 0; m < M; m++) {
        const float *xr = x + (size_t)m * H;
        __m512 acc = _mm512_setzero_ps();
        for (int i = 0; i < H; i += 16) {
            __m512 v = _mm512_loadu_ps(xr + i);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        float inverse_rms = 1.0f / sqrtf(_mm512_reduce_add_ps(acc) / (float)H + eps);
        for (int i = 0; i < H; i++) out[(size_t)m * H + i] = f32_to_bf16(xr[i] * inverse_rms * weight[i]);
    }
}

/* e^x for x <= 0 (softmax): 2^n * 2^f, f in [-0.5, 0.5], Taylor series to degree 7 */
static inline __m512 exp_ps(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.6931471805599453f));
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

static inline __m512 load_bf16x16(const bf16 *p) {
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* one sequence, one KV head: the group's query heads attend to keys 0..kv_len-1 */
static void attend(const lm_model *md, int layer, const float *q, int group, const int32_t *slots,
                   int kv_len, int kv_head, float *scores, bf16 *out) {
    const int D = md->head_dim, KVH = md->num_kv_heads;
    const bf16 *keys = md->k_pool[layer], *values = md->v_pool[layer];
    int padded = (kv_len + 15) & ~15;
    for (int g = 0; g < group; g++) {
        const float *qh = q + (size_t)g * D;
        float *s = scores + (size_t)g * padded;
        for (int p = 0; p < kv_len; p++) {
            const bf16 *kp = keys + ((size_t)slots[p] * KVH + kv_head) * D;
            __m512 acc = _mm512_setzero_ps();
            for (int d = 0; d < D; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qh + d), load_bf16x16(kp + d), acc);
            s[p] = _mm512_reduce_add_ps(acc);
        }
        float max = -INFINITY;
        for (int p = 0; p < kv_len; p++) max = s[p] > max ? s[p] : max;
        for (int p = kv_len; p < padded; p++) s[p] = -INFINITY;
        __m512 vmax = _mm512_set1_ps(max), sum = _mm512_setzero_ps();
        for (int p = 0; p < padded; p += 16) {
            __m512 e = exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + p), vmax));
            if (p + 16 > kv_len) e = _mm512_maskz_mov_ps((__mmask16)((1u << (kv_len - p)) - 1u), e);
            _mm512_storeu_ps(s + p, e);
            sum = _mm512_add_ps(sum, e);
        }
        float inverse_sum = 1.0f / _mm512_reduce_add_ps(sum);
        for (int d0 = 0; d0 < D; d0 += 64) {
            int width = D - d0 < 64 ? (D - d0) / 16 : 4;
            __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
            for (int p = 0; p < kv_len; p++) {
                const bf16 *vp = values + ((size_t)slots[p] * KVH + kv_head) * D + d0;
                __m512 weight = _mm512_set1_ps(s[p]);
                for (int j = 0; j < width; j++) acc[j] = _mm512_fmadd_ps(weight, load_bf16x16(vp + 16 * j), acc[j]);
            }
            for (int j = 0; j < width; j++) {
                float tmp[16];
                _mm512_storeu_ps(tmp, _mm512_mul_ps(acc[j], _mm512_set1_ps(inverse_sum)));
                for (int i = 0; i < 16; i++) out[(size_t)g * D + d0 + 16 * j + i] = f32_to_bf16(tmp[i]);
            }
        }
    }
}

static void rotate(float *x, const float *cos, const float *sin, int half) {
    for (int i = 0; i < half; i++) {
        float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * cos[i] - x2 * sin[i];
        x[i + half] = x2 * cos[i] + x1 * sin[i];
    }
}

/* ── the step ────────────────────────────────────────────────────────────────────────────── */

int lm_decode_step(const lm_model *md, int B, const int64_t *token_ids, const int64_t *positions,
                   const int64_t *rows, const int64_t *new_slots, float *logits, int threads) {
    const int H = md->hidden, I = md->intermediate, D = md->head_dim, half = D / 2;
    const int QH = md->num_heads, KVH = md->num_kv_heads, group = QH / KVH;
    const int QKV = (QH + 2 * KVH) * D, QS = QH * D, KVS = KVH * D;
    const float scale = 1.0f / sqrtf((float)D);
    int max_len = 0;
    for (int b = 0; b < B; b++) max_len = positions[b] + 1 > max_len ? (int)positions[b] + 1 : max_len;
    int widest = QKV > 2 * I ? QKV : 2 * I;
    float *x = malloc(sizeof(float) * B * H);
    float *y = malloc(sizeof(float) * B * (widest > H ? widest : H));
    bf16 *act = malloc(sizeof(bf16) * B * (I > QS ? I : QS) + 64);
    bf16 *normed = malloc(sizeof(bf16) * B * H);
    float *q = malloc(sizeof(float) * B * QS);
    size_t score_floats = (size_t)group * ((max_len + 15) & ~15);
    float *scores = malloc(sizeof(float) * score_floats * (threads > 1 ? threads : 1));
    if (!x || !y || !act || !normed || !q || !scores) {
        free(x); free(y); free(act); free(normed); free(q); free(scores);
        return -1;
    }
    for (int b = 0; b < B; b++)
        for (int i = 0; i < H; i++) x[(size_t)b * H + i] = bf16_to_f32(md->embed[(size_t)token_ids[b] * H + i]);

    for (int layer = 0; layer < md->num_layers; layer++) {
        rms_norm(x, md->input_norm[layer], normed, B, H, md->eps);
        matmul(md->qkv[layer], normed, y, B, QKV, H, threads);
        for (int b = 0; b < B; b++) {
            float *r = y + (size_t)b * QKV;
            const float *cos = md->rope_cos + (size_t)positions[b] * half, *sin = md->rope_sin + (size_t)positions[b] * half;
            for (int i = 0; i < QKV; i++) r[i] = round_bf16(r[i]);
            for (int h = 0; h < QH + KVH; h++) rotate(r + (size_t)h * D, cos, sin, half);
            for (int i = 0; i < QS; i++) q[(size_t)b * QS + i] = round_bf16(r[i]) * scale;
            bf16 *kd = md->k_pool[layer] + (size_t)new_slots[b] * KVS, *vd = md->v_pool[layer] + (size_t)new_slots[b] * KVS;
            for (int i = 0; i < KVS; i++) {
                kd[i] = f32_to_bf16(r[QS + i]);
                vd[i] = f32_to_bf16(r[QS + KVS + i]);
            }
        }
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
        for (int t = 0; t < B * KVH; t++) {
            int b = t / KVH, kv_head = t % KVH;
#ifdef _OPENMP
            float *s = scores + score_floats * (threads > 1 ? omp_get_thread_num() : 0);
#else
            float *s = scores;
#endif
            const int32_t *slots = md->slot_table + (size_t)rows[b] * md->table_width;
            attend(md, layer, q + (size_t)b * QS + (size_t)kv_head * group * D, group, slots,
                   (int)positions[b] + 1, kv_head, s, act + (size_t)b * QS + (size_t)kv_head * group * D);
        }
        matmul(md->o[layer], act, y, B, H, QS, threads);
        for (size_t i = 0; i < (size_t)B * H; i++) x[i] += round_bf16(y[i]);
        rms_norm(x, md->post_norm[layer], normed, B, H, md->eps);
        matmul(md->gate_up[layer], normed, y, B, 2 * I, H, threads);
        for (int b = 0; b < B; b++) {
            const float *g = y + (size_t)b * 2 * I, *u = g + I;
            for (int i = 0; i < I; i++) {
                float gate = round_bf16(g[i]);
                float silu = round_bf16(gate / (1.0f + expf(-gate)));
                act[(size_t)b * I + i] = f32_to_bf16(silu * round_bf16(u[i]));
            }
        }
        matmul(md->down[layer], act, y, B, H, I, threads);
        for (size_t i = 0; i < (size_t)B * H; i++) x[i] += round_bf16(y[i]);
    }
    rms_norm(x, md->final_norm, normed, B, H, md->eps);
    matmul(md->head, normed, logits, B, md->vocab, H, threads);
    free(x); free(y); free(act); free(normed); free(q); free(scores);
    return 0;
}

/* for tests: the bare matmul */
void lm_matmul(const bf16 *w, const bf16 *x, float *y, int M, int N, int K, int threads) {
    matmul(w, x, y, M, N, K, threads);
}
