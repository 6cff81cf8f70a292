/* One decoder layer's small steps at batch-1 decode on CPU, each a single call.
 *
 * Between the packed 4-bit products (torch's kernel, bf16 in and out) a layer runs a residual add
 * and RMSNorm, q/k norms and RoPE, the KV write, attention over the cached tokens and SiLU-and-mul.
 * As torch ops these are ~40 dispatches of tiny tensors per layer, which cost more than the
 * products themselves at batch 1; here they are three calls. Arithmetic is float32, as in the
 * torch path; bf16 is rounded to nearest even. Built by cpu_native.py with the system C compiler.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return (uint16_t)(u >> 16); /* inf / nan as they are */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* residual_out = x + residual (or x when residual is NULL); out = rmsnorm(residual_out) * w.
 * x is bf16 when x_bf16 else float32; out is bf16 when out_bf16 else float32. */
void add_rmsnorm(const void *x, int x_bf16, const float *residual, const float *w, float eps, int dim,
                 float *residual_out, void *out, int out_bf16) {
    float sum = 0.f;
    for (int i = 0; i < dim; i++) {
        float v = x_bf16 ? bf16_to_f32(((const uint16_t *)x)[i]) : ((const float *)x)[i];
        if (residual) v += residual[i];
        residual_out[i] = v;
        sum += v * v;
    }
    float inv = 1.f / sqrtf(sum / (float)dim + eps);
    for (int i = 0; i < dim; i++) {
        float v = w[i] * (residual_out[i] * inv);
        if (out_bf16)
            ((uint16_t *)out)[i] = f32_to_bf16(v);
        else
            ((float *)out)[i] = v;
    }
}

/* Per-head RMSNorm (Qwen3's q/k norm) in place; w may be NULL (no norm). */
static void head_norm(float *x, const float *w, float eps, int head_dim) {
    if (!w) return;
    float sum = 0.f;
    for (int i = 0; i < head_dim; i++) sum += x[i] * x[i];
    float inv = 1.f / sqrtf(sum / (float)head_dim + eps);
    for (int i = 0; i < head_dim; i++) x[i] = w[i] * (x[i] * inv);
}

/* Rotate-half RoPE of one head in place; cos/sin hold head_dim values for this position. */
static void rope(float *x, const float *cos_row, const float *sin_row, int head_dim) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos_row[i] - b * sin_row[i];
        x[i + half] = b * cos_row[i + half] + a * sin_row[i + half];
    }
}

/* qkv: one token's merged projection (bf16): q heads, then k heads, then v heads.
 * The token's sequence holds the cache slots slots[0 .. len-1], its own the last: its k/v are
 * written there (the layer's caches are [slots, kv_heads, head_dim] float32) and it attends to
 * all of them. out: [heads * head_dim] bf16. scratch: heads * head_dim + len floats. */
void rope_store_attend(const uint16_t *qkv, int heads, int kv_heads, int head_dim,
                       const float *q_norm, const float *k_norm, float norm_eps,
                       const float *cos_row, const float *sin_row,
                       float *k_cache, float *v_cache, const int64_t *slots, int len, float scale,
                       uint16_t *out, float *scratch) {
    int q_size = heads * head_dim, kv_size = kv_heads * head_dim;
    int64_t slot = slots[len - 1];
    float *q = scratch, *k_new = k_cache + slot * kv_size, *v_new = v_cache + slot * kv_size;
    float *scores = scratch + q_size;
    for (int i = 0; i < q_size; i++) q[i] = bf16_to_f32(qkv[i]);
    for (int i = 0; i < kv_size; i++) {
        k_new[i] = bf16_to_f32(qkv[q_size + i]);
        v_new[i] = bf16_to_f32(qkv[q_size + kv_size + i]);
    }
    for (int h = 0; h < heads; h++) {
        head_norm(q + h * head_dim, q_norm, norm_eps, head_dim);
        rope(q + h * head_dim, cos_row, sin_row, head_dim);
    }
    for (int h = 0; h < kv_heads; h++) {
        head_norm(k_new + h * head_dim, k_norm, norm_eps, head_dim);
        rope(k_new + h * head_dim, cos_row, sin_row, head_dim);
    }
    int group = heads / kv_heads;
    for (int h = 0; h < heads; h++) {
        const float *qh = q + h * head_dim;
        int g = h / group;
        float best = -INFINITY;
        for (int t = 0; t < len; t++) {
            const float *kt = k_cache + (slots[t] * kv_heads + g) * head_dim;
            float dot = 0.f;
            for (int i = 0; i < head_dim; i++) dot += qh[i] * kt[i];
            dot *= scale;
            scores[t] = dot;
            if (dot > best) best = dot;
        }
        float total = 0.f;
        for (int t = 0; t < len; t++) {
            scores[t] = expf(scores[t] - best);
            total += scores[t];
        }
        float acc[512];
        for (int i = 0; i < head_dim; i++) acc[i] = 0.f;
        for (int t = 0; t < len; t++) {
            const float *vt = v_cache + (slots[t] * kv_heads + g) * head_dim;
            float p = scores[t];
            for (int i = 0; i < head_dim; i++) acc[i] += p * vt[i];
        }
        float inv = 1.f / total;
        for (int i = 0; i < head_dim; i++) out[h * head_dim + i] = f32_to_bf16(acc[i] * inv);
    }
}

/* out = silu(gate) * up for one row of [gate | up] (bf16 in, bf16 out). */
void silu_mul(const uint16_t *gate_up, int inter, uint16_t *out) {
    for (int i = 0; i < inter; i++) {
        float g = bf16_to_f32(gate_up[i]), u = bf16_to_f32(gate_up[inter + i]);
        out[i] = f32_to_bf16(g / (1.f + expf(-g)) * u);
    }
}
