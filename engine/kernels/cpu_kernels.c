/* The CPU engine's own kernels for quantized weights: products with 4- and 8-bit weights
 * against 16-bit activations, and batch-1 decode of every layer in one call.
 *
 * Why C: at batch 1 a small model's decode step is a few hundred tiny operations; as torch ops
 * each costs a dispatch of several microseconds, more than its arithmetic. One call runs all
 * layers here (llama.cpp's shape of work).
 *
 * Weights (``QWeight``): rows of ``cols`` inputs in groups of 32; each group has an f16 scale d
 * and an f16 offset m and a code c per weight: w = c * d + m (times the matrix's power-of-two
 * ``mult``, which keeps the f16 values in range).
 *   - kind 4: 4-bit codes, two groups in 32 bytes: byte j holds group 2p's code j (low nibble)
 *     and group 2p+1's code j (high nibble);
 *   - kind 8: 8-bit unsigned codes, 32 bytes a group.
 * Activations are quantized per group of 32 to 16 bits (q, da = max|x| / 32767):
 *   sum_j w_j x_j = d * da * sum_j c_j q_j + m * da * sum_j q_j,
 * with the integer sums exact (AVX-512 VNNI, else AVX2, else plain C). 16 bits, not llama.cpp's
 * 8: rounding activations to 8 bits changes the demo model's greedy answers (98.4% top-1
 * agreement with float32, teacher-forced; "What is the capital of France?" answered wrongly);
 * 16 bits agree with float32 and cost ~10% of the decode rate.
 * Built by cpu_native.py with the system C compiler (-march=native).
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(_OPENMP)
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#define GROUP 32

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && !defined(MINISGL_NO_VNNI)
#define PATH_VNNI 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(MINISGL_NO_AVX2)
#define PATH_AVX2 1
#endif

/* Which product path this build uses: 2 VNNI, 1 AVX2, 0 plain C. */
int kernel_path(void) {
#if defined(PATH_VNNI)
    return 2;
#elif defined(PATH_AVX2)
    return 1;
#else
    return 0;
#endif
}

/* F16C converts float16 in hardware, except in the plain-C build, whose portable conversions the
 * tests check against torch's (both round to nearest, ties to even). */
#if defined(__F16C__) && !defined(MINISGL_NO_AVX2)
#define HAVE_F16C 1
#endif

static inline float half_to_float(uint16_t h) {
#if defined(HAVE_F16C)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        float f = ldexpf((float)man, -24);
        return sign ? -f : f;
    }
    u = exp == 31 ? sign | 0x7f800000u | (man << 13) : sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* ---------------------------------------------------------------- the KV cache's 16-bit values */

/* How the KV cache stores its values: attention widens them to float32 as it reads them. */
enum { KV_F32 = 0, KV_F16 = 1, KV_BF16 = 2 };

static inline uint16_t float_to_half(float f) {
#if defined(HAVE_F16C)
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, mag = u & 0x7fffffff;
    if (mag > 0x7f800000) return (uint16_t)(sign | 0x7e00); /* NaN */
    if (mag >= 0x477ff000) return (uint16_t)(sign | 0x7c00); /* rounds past 65504: infinity */
    if (mag < 0x38800000) { /* below 2^-14: a subnormal half, in units of 2^-24 (exact scaling) */
        float a;
        memcpy(&a, &mag, 4);
        return (uint16_t)(sign | (uint32_t)nearbyintf(a * 16777216.f));
    }
    /* round the 23-bit mantissa to 10 bits, ties to even, then rebias the exponent (127 -> 15) */
    return (uint16_t)(sign | ((mag + 0xfff + ((mag >> 13) & 1) - 0x38000000u) >> 13));
#endif
}

static inline float bf16_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* n float32 values into the cache at ``dst`` in its type */
static void kv_store(void *dst, const float *x, int n, int kv_type) {
    if (kv_type == KV_F16)
        for (int i = 0; i < n; i++) ((uint16_t *)dst)[i] = float_to_half(x[i]);
    else if (kv_type == KV_BF16)
        for (int i = 0; i < n; i++) ((uint16_t *)dst)[i] = float_to_bf16(x[i]);
    else
        memcpy(dst, x, sizeof(float) * n);
}

/* Tests: the conversions of this build, n values each way (kv_type 1 float16, 2 bfloat16). */
void kv_round_trip(const float *x, int n, int kv_type, uint16_t *stored, float *widened) {
    for (int i = 0; i < n; i++) {
        kv_store(stored + i, x + i, 1, kv_type);
        widened[i] = kv_type == KV_F16 ? half_to_float(stored[i]) : bf16_to_float(stored[i]);
    }
}

/* ---------------------------------------------------------------- threads
 * Parallel work runs on torch's own OpenMP team: this file is built with -fopenmp and, loaded
 * after torch, binds to the libgomp torch already loaded (the same soname), so its regions
 * reuse torch's threads and follow torch.set_num_threads. A second pool of our own would
 * compete with torch's threads for the same cores (measured: half the decode rate on 2 cores). */

typedef void (*task_fn)(void *arg, int ith, int nth);
#define MAX_THREADS 64

static int max_threads(void) {
#if defined(_OPENMP)
    int n = omp_get_max_threads();
    return n < MAX_THREADS ? n : MAX_THREADS;
#else
    return 1;
#endif
}

static void run_parallel(task_fn fn, void *arg) {
#if defined(_OPENMP)
    int nth = max_threads();
    if (nth > 1) {
#pragma omp parallel num_threads(nth)
        fn(arg, omp_get_thread_num(), omp_get_num_threads());
        return;
    }
#endif
    fn(arg, 0, 1);
}

/* [start, end) of ``n`` items for share ith of nth, in multiples of ``align`` */
static void share(int n, int ith, int nth, int align, int *start, int *end) {
    int units = (n + align - 1) / align;
    *start = (int)((long)units * ith / nth) * align;
    *end = (int)((long)units * (ith + 1) / nth) * align;
    if (*start > n) *start = n;
    if (*end > n) *end = n;
}

/* ---------------------------------------------------------------- activations */

/* x [cols] -> q [cols] int16 and scales [groups][2] = (da, da * sum q) */
static void quantize_row(const float *x, int cols, int16_t *q, float *scales) {
    for (int g = 0; g < cols / GROUP; g++) {
        const float *xg = x + g * GROUP;
        float amax = 0.f;
        for (int j = 0; j < GROUP; j++) amax = fmaxf(amax, fabsf(xg[j]));
        float da = amax / 32767.f, inv = amax > 0.f ? 32767.f / amax : 0.f;
        int sum = 0;
        for (int j = 0; j < GROUP; j++) {
            int v = (int)nearbyintf(xg[j] * inv);
            q[g * GROUP + j] = (int16_t)v;
            sum += v;
        }
        scales[2 * g] = da;
        scales[2 * g + 1] = da * (float)sum;
    }
}

/* ---------------------------------------------------------------- weights */

typedef struct {
    int kind; /* 4 or 8 */
    int rows, cols;
    const uint8_t *codes;
    const uint16_t *scales; /* [rows][groups][2] f16: d, m */
    float mult;
    const float *bias; /* [rows] or NULL */
} QWeight;

/* The codes of groups g and g + 1 of a row, 32 bytes each (4-bit pairs split, 8-bit as stored). */
#if defined(PATH_VNNI) || defined(PATH_AVX2)
static inline void load_pair(const QWeight *w, int row, int g, __m256i *c0, __m256i *c1) {
    if (w->kind == 4) {
        __m256i b = _mm256_loadu_si256((const __m256i *)(w->codes + (size_t)row * w->cols / 2 + g * 16));
        *c0 = _mm256_and_si256(b, _mm256_set1_epi8(15));
        *c1 = _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi8(15));
    } else {
        const uint8_t *codes = w->codes + (size_t)row * w->cols + g * GROUP;
        *c0 = _mm256_loadu_si256((const __m256i *)codes);
        *c1 = _mm256_loadu_si256((const __m256i *)(codes + GROUP));
    }
}
#endif

#if defined(PATH_AVX2)
static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 unsigned codes times 32 int16 activations, as 8 int32 partial sums */
static inline __m256i dot_group(__m256i codes, const int16_t *q) {
    __m256i lo = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(codes));
    __m256i hi = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(codes, 1));
    return _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i *)q)),
                            _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i *)(q + 16))));
}
#endif

/* One weight row against one quantized activation row. */
static float dot_row(const QWeight *w, int row, const int16_t *q, const float *as) {
    int groups = w->cols / GROUP;
    const uint16_t *sc = w->scales + (size_t)row * groups * 2;
#if defined(PATH_VNNI) || defined(PATH_AVX2)
    __m128 acc_offset = _mm_setzero_ps();
#if defined(PATH_VNNI)
    __m512 acc = _mm512_setzero_ps();
#else
    __m256 acc = _mm256_setzero_ps();
#endif
    for (int g = 0; g < groups; g += 2) {
        __m256i c0, c1;
        load_pair(w, row, g, &c0, &c1);
        /* (d0 * da0, m0 * sa0, d1 * da1, m1 * sa1) */
        __m128 p = _mm_mul_ps(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(sc + 2 * g))), _mm_loadu_ps(as + 2 * g));
        acc_offset = _mm_add_ps(acc_offset, p);
#if defined(PATH_VNNI)
        __m512i i0 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_cvtepu8_epi16(c0),
                                         _mm512_loadu_si512((const void *)(q + g * GROUP)));
        __m512i i1 = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_cvtepu8_epi16(c1),
                                         _mm512_loadu_si512((const void *)(q + g * GROUP + GROUP)));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), _mm512_broadcastss_ps(p), acc);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), _mm512_broadcastss_ps(_mm_movehl_ps(p, p)), acc);
#else
        __m256i i01 = _mm256_hadd_epi32(dot_group(c0, q + g * GROUP), dot_group(c1, q + g * GROUP + GROUP));
        __m128 d = _mm_permute_ps(p, _MM_SHUFFLE(2, 2, 0, 0)); /* lanes 0,1,4,5: group g; 2,3,6,7: g + 1 */
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i01), _mm256_set_m128(d, d), acc);
#endif
    }
    float offsets[4];
    _mm_storeu_ps(offsets, acc_offset);
#if defined(PATH_VNNI)
    return _mm512_reduce_add_ps(acc) + offsets[1] + offsets[3];
#else
    return hsum256(acc) + offsets[1] + offsets[3];
#endif
#else
    float total = 0.f;
    for (int g = 0; g < groups; g++) {
        int isum = 0;
        const int16_t *qg = q + g * GROUP;
        if (w->kind == 4) {
            const uint8_t *pair = w->codes + (size_t)row * w->cols / 2 + (g / 2) * GROUP;
            int shift = (g & 1) * 4;
            for (int j = 0; j < GROUP; j++) isum += ((pair[j] >> shift) & 15) * qg[j];
        } else {
            const uint8_t *codes = w->codes + (size_t)row * w->cols + g * GROUP;
            for (int j = 0; j < GROUP; j++) isum += codes[j] * qg[j];
        }
        total += half_to_float(sc[2 * g]) * as[2 * g] * (float)isum + half_to_float(sc[2 * g + 1]) * as[2 * g + 1];
    }
    return total;
#endif
}

/* out[i][r] = x[i] . w[r] for ``m`` quantized activation rows (q: [m][cols], as: [m][groups][2]) */
typedef struct {
    const QWeight *w;
    const int16_t *q;
    const float *as;
    int m;
    float *out;
} MatmulTask;

static void matmul_share(void *arg, int ith, int nth) {
    const MatmulTask *t = arg;
    const QWeight *w = t->w;
    int start, end, groups = w->cols / GROUP;
    share(w->rows, ith, nth, 16, &start, &end);
    for (int r = start; r < end; r++) {
        float b = w->bias ? w->bias[r] : 0.f;
        for (int i = 0; i < t->m; i++)
            t->out[(size_t)i * w->rows + r] = w->mult * dot_row(w, r, t->q + (size_t)i * w->cols, t->as + (size_t)i * groups * 2) + b;
    }
}

typedef struct {
    const float *x;
    int cols;
    int16_t *q;
    float *as;
    int m;
} QuantizeTask;

static void quantize_share(void *arg, int ith, int nth) {
    const QuantizeTask *t = arg;
    int start, end;
    share(t->m, ith, nth, 1, &start, &end);
    for (int i = start; i < end; i++)
        quantize_row(t->x + (size_t)i * t->cols, t->cols, t->q + (size_t)i * t->cols, t->as + (size_t)i * (t->cols / GROUP) * 2);
}

/* out [m][rows] = x [m][cols] @ w.T (+ bias). work: qmatmul_work_bytes(m, cols). */
void qmatmul(const QWeight *w, const float *x, int m, float *out, void *work) {
    int16_t *q = work;
    float *as = (float *)((char *)work + (((size_t)m * w->cols * 2 + 63) & ~(size_t)63));
    QuantizeTask qt = {x, w->cols, q, as, m};
    if (m > 1)
        run_parallel(quantize_share, &qt);
    else
        quantize_share(&qt, 0, 1);
    MatmulTask t = {w, q, as, m, out};
    run_parallel(matmul_share, &t);
}

/* rows [row0, row0 + rows) of w as float32 [rows][cols] (bias not included): a prefill's many
 * rows multiply the widened weight with the BLAS, which beats integer dots per row there. */
typedef struct {
    const QWeight *w;
    int row0, rows;
    const int64_t *ids; /* the rows to widen, or NULL for row0 .. row0 + rows - 1 */
    float *out;
} DequantizeTask;

static void dequantize_share(void *arg, int ith, int nth) {
    const DequantizeTask *t = arg;
    const QWeight *w = t->w;
    int start, end, groups = w->cols / GROUP;
    share(t->rows, ith, nth, 1, &start, &end);
    for (int r = start; r < end; r++) {
        int row = t->ids ? (int)t->ids[r] : t->row0 + r;
        const uint16_t *sc = w->scales + (size_t)row * groups * 2;
        float *out = t->out + (size_t)r * w->cols;
        for (int g = 0; g < groups; g++) {
            float d = half_to_float(sc[2 * g]) * w->mult, m = half_to_float(sc[2 * g + 1]) * w->mult;
            for (int j = 0; j < GROUP; j++) {
                int code;
                if (w->kind == 4)
                    code = (w->codes[(size_t)row * w->cols / 2 + (g / 2) * GROUP + j] >> ((g & 1) * 4)) & 15;
                else
                    code = w->codes[(size_t)row * w->cols + g * GROUP + j];
                out[g * GROUP + j] = (float)code * d + m;
            }
        }
    }
}

void qdequantize(const QWeight *w, int row0, int rows, float *out) {
    DequantizeTask t = {w, row0, rows, NULL, out};
    run_parallel(dequantize_share, &t);
}

/* rows ids[0 .. n-1] of w as float32 [n][cols]: a tied embedding's lookups from the LM head's codes */
void qdequantize_rows(const QWeight *w, const int64_t *ids, int n, float *out) {
    DequantizeTask t = {w, 0, n, ids, out};
    if (n > 16)
        run_parallel(dequantize_share, &t);
    else
        dequantize_share(&t, 0, 1);
}

/* x [m][cols] rounded through the 16-bit activations that qmatmul multiplies (q * da), in place:
 * a prompt's products (the weights widened, the BLAS) then see the same inputs as one row's
 * integer dots, so a reply does not depend on how its prompt was batched (a seeded retry after
 * the prompt came from the prefix cache drew other tokens when one path rounded and one did not). */
static void round_share(void *arg, int ith, int nth) {
    const QuantizeTask *t = arg;
    int start, end, groups = t->cols / GROUP;
    int16_t q[GROUP];
    float scales[2];
    share(t->m, ith, nth, 1, &start, &end);
    for (int i = start; i < end; i++)
        for (int g = 0; g < groups; g++) {
            float *x = (float *)t->x + (size_t)i * t->cols + g * GROUP;
            quantize_row(x, GROUP, q, scales);
            for (int j = 0; j < GROUP; j++) x[j] = (float)q[j] * scales[0];
        }
}

void round_activations(float *x, int m, int cols) {
    QuantizeTask t = {x, cols, NULL, NULL, m};
    run_parallel(round_share, &t);
}

size_t qmatmul_work_bytes(int m, int cols) {
    return (((size_t)m * cols * 2 + 63) & ~(size_t)63) + (size_t)m * (cols / GROUP) * 2 * sizeof(float);
}

/* ---------------------------------------------------------------- batch-1 decode */

typedef struct {
    const float *input_norm, *post_norm, *q_norm, *k_norm; /* q/k norms NULL unless Qwen3 */
    QWeight qkv, o, gate_up, down;
    void *k_cache, *v_cache; /* [slots][kv_heads][head_dim] of the model's kv_type */
} Layer;

typedef struct {
    int layers, dim, heads, kv_heads, head_dim, inter, max_len;
    float eps, scale;
    Layer *layer;
    const float *final_norm;
    float *work; /* decode_work_floats() floats */
    int kv_type;
} Model;

static int max_int(int a, int b) { return a > b ? a : b; }

/* Workspace layout (floats): residual, normed, qkv, attended, out, gate_up, act, quantized
 * activations, scores [heads][max_len], partial results [threads][heads][head_dim + 2]. */
size_t decode_work_floats(const Model *m) {
    int q = m->heads * m->head_dim, kv = m->kv_heads * m->head_dim, widest = max_int(m->dim, m->inter);
    return (size_t)m->dim * 3 + (q + 2 * kv) + q + 3 * (size_t)m->inter + widest / 2 + widest / GROUP * 2 + 64 +
           (size_t)m->heads * m->max_len + (size_t)MAX_THREADS * m->heads * (m->head_dim + 2);
}

static void add_rmsnorm(float *residual, const float *x, const float *w, float eps, int dim, float *out) {
    float sum = 0.f;
    for (int i = 0; i < dim; i++) {
        if (x) residual[i] += x[i];
        sum += residual[i] * residual[i];
    }
    float inv = 1.f / sqrtf(sum / (float)dim + eps);
    for (int i = 0; i < dim; i++) out[i] = w[i] * (residual[i] * inv);
}

static void head_norm(float *x, const float *w, float eps, int head_dim) {
    if (!w) return;
    float sum = 0.f;
    for (int i = 0; i < head_dim; i++) sum += x[i] * x[i];
    float inv = 1.f / sqrtf(sum / (float)head_dim + eps);
    for (int i = 0; i < head_dim; i++) x[i] = w[i] * (x[i] * inv);
}

/* rotate-half RoPE of one head in place; cos/sin hold head_dim values for this position */
static void rope(float *x, const float *cos_row, const float *sin_row, int head_dim) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos_row[i] - b * sin_row[i];
        x[i + half] = b * cos_row[i + half] + a * sin_row[i + half];
    }
}

/* Attention of one token over its cached slots, split by token ranges across threads (each
 * share keeps its own maximum, sum and weighted values per head; the caller merges them). */
typedef struct {
    const Model *m;
    const float *q;
    const void *k_cache, *v_cache;
    const int64_t *slots;
    int len;
    float *scores, *partial;
} AttendTask;

/* e^x for x <= 0 (a softmax's shifted scores) in plain float arithmetic the compiler vectorises
 * (libm's expf is a call per value): 2^(x log2 e) = 2^n * 2^f, 2^f by a degree-6 polynomial on
 * [-0.5, 0.5] (relative error ~2e-7); below -87 the result is 0. */
static inline float exp_nonpositive(float x) {
    float t = x < -87.f ? -87.f : x;
    t *= 1.44269504f;
    float n = nearbyintf(t), f = t - n;
    float p = 1.5403530e-4f;
    p = p * f + 1.3333558e-3f;
    p = p * f + 9.6181291e-3f;
    p = p * f + 5.5504109e-2f;
    p = p * f + 2.4022650e-1f;
    p = p * f + 6.9314718e-1f;
    p = p * f + 1.f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    return x < -87.f ? 0.f : p * scale;
}

/* 16 floats as one vector (GCC/Clang vector extensions: one AVX-512 register, two AVX2 ones) */
typedef float vf16 __attribute__((vector_size(64)));
static inline vf16 load16(const float *p) {
    vf16 v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline float hsum16(vf16 v) {
    float total = 0.f;
    for (int i = 0; i < 16; i++) total += v[i];
    return total;
}

/* 16 float16 values widened */
static inline vf16 load16_half(const uint16_t *p) {
    vf16 v;
#if defined(HAVE_F16C)
    __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8)));
    memcpy(&v, &lo, sizeof lo);
    memcpy((char *)&v + sizeof lo, &hi, sizeof hi);
#else
    for (int i = 0; i < 16; i++) v[i] = half_to_float(p[i]);
#endif
    return v;
}

/* 16 bfloat16 values widened: each the high half of a float32 */
static inline vf16 load16_bf16(const uint16_t *p) {
    typedef uint32_t vu16 __attribute__((vector_size(64)));
    vu16 u;
    for (int i = 0; i < 16; i++) u[i] = (uint32_t)p[i] << 16;
    vf16 v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* 16 cached values from element ``index`` of a cache of ``kv_type``, as float32 */
static inline __attribute__((always_inline)) vf16 load16_kv(const void *cache, size_t index, int kv_type) {
    if (kv_type == KV_F16) return load16_half((const uint16_t *)cache + index);
    if (kv_type == KV_BF16) return load16_bf16((const uint16_t *)cache + index);
    return load16((const float *)cache + index);
}

/* attend_share for one cache type (a constant where it is inlined, so each type gets its own loops) */
static inline __attribute__((always_inline)) void attend_typed(const AttendTask *t, int ith, int nth, int kv_type) {
    const Model *m = t->m;
    int hd = m->head_dim, group = m->heads / m->kv_heads, chunks = hd / 16, start, end;
    size_t row = (size_t)m->kv_heads * hd;
    share(t->len, ith, nth, 1, &start, &end);
    /* Token by token, each cached row read whole and in order (the cache outgrows the CPU's
     * caches at long contexts: the reads must stream), each key once for its query heads. */
    for (int s = start; s < end; s++) {
        size_t k = (size_t)t->slots[s] * row;
        for (int h = 0; h < m->heads; h++) {
            size_t kh = k + (size_t)(h / group) * hd;
            const float *qh = t->q + (size_t)h * hd;
            vf16 acc = load16(qh) * load16_kv(t->k_cache, kh, kv_type);
            for (int c = 1; c < chunks; c++) acc += load16(qh + 16 * c) * load16_kv(t->k_cache, kh + 16 * c, kv_type);
            t->scores[(size_t)h * m->max_len + s] = hsum16(acc) * m->scale;
        }
    }
    for (int h = 0; h < m->heads; h++) {
        float *scores = t->scores + (size_t)h * m->max_len, *part = t->partial + ((size_t)ith * m->heads + h) * (hd + 2);
        float best = -INFINITY, total = 0.f;
        for (int s = start; s < end; s++) best = best > scores[s] ? best : scores[s];
        for (int s = start; s < end; s++) {
            scores[s] = exp_nonpositive(scores[s] - best);
            total += scores[s];
        }
        part[0] = best, part[1] = total;
        memset(part + 2, 0, sizeof(float) * hd);
    }
    for (int s = start; s < end; s++) {
        size_t v = (size_t)t->slots[s] * row;
        for (int h = 0; h < m->heads; h++) {
            size_t vh = v + (size_t)(h / group) * hd;
            float p = t->scores[(size_t)h * m->max_len + s], *acc = t->partial + ((size_t)ith * m->heads + h) * (hd + 2) + 2;
            for (int c = 0; c < chunks; c++) {
                vf16 sum = load16(acc + 16 * c) + p * load16_kv(t->v_cache, vh + 16 * c, kv_type);
                memcpy(acc + 16 * c, &sum, sizeof sum);
            }
        }
    }
}

static void attend_share(void *arg, int ith, int nth) {
    const AttendTask *t = arg;
    if (t->m->kv_type == KV_F16)
        attend_typed(t, ith, nth, KV_F16);
    else if (t->m->kv_type == KV_BF16)
        attend_typed(t, ith, nth, KV_BF16);
    else
        attend_typed(t, ith, nth, KV_F32);
}

static void attend(const Model *m, const Layer *layer, const float *q, const int64_t *slots, int len, float *scores,
                   float *partial, float *out) {
    AttendTask t = {m, q, layer->k_cache, layer->v_cache, slots, len, scores, partial};
    int nth = len >= 64 ? max_threads() : 1; /* a short context is not worth a dispatch */
    if (nth > 1)
        run_parallel(attend_share, &t);
    else
        attend_share(&t, 0, 1);
    int hd = m->head_dim;
    for (int h = 0; h < m->heads; h++) {
        float best = -INFINITY, total = 0.f;
        for (int i = 0; i < nth; i++) {
            const float *part = partial + ((size_t)i * m->heads + h) * (hd + 2);
            if (part[1] > 0.f) best = fmaxf(best, part[0]);
        }
        float *o = out + h * hd;
        for (int j = 0; j < hd; j++) o[j] = 0.f;
        for (int i = 0; i < nth; i++) {
            const float *part = partial + ((size_t)i * m->heads + h) * (hd + 2);
            if (part[1] <= 0.f) continue; /* an empty share */
            float w = expf(part[0] - best);
            total += w * part[1];
            for (int j = 0; j < hd; j++) o[j] += w * part[2 + j];
        }
        for (int j = 0; j < hd; j++) o[j] /= total;
    }
}

static void product(const QWeight *w, const float *x, float *out, int16_t *q, float *as) {
    quantize_row(x, w->cols, q, as);
    MatmulTask t = {w, q, as, 1, out};
    run_parallel(matmul_share, &t);
}

/* One token through every layer: ``hidden`` [dim] comes in as the token's embedding and leaves
 * as the final norm's output. The token's sequence holds the cache slots slots[0 .. len-1], its
 * own the last; cos/sin: head_dim values for its position. */
void decode_step(const Model *m, float *hidden, const int64_t *slots, int len, const float *cos_row,
                 const float *sin_row) {
    int dim = m->dim, hd = m->head_dim, q_size = m->heads * hd, kv_size = m->kv_heads * hd;
    int widest = max_int(dim, m->inter);
    float *residual = m->work, *normed = residual + dim, *out = normed + dim, *qkv = out + dim;
    float *attended = qkv + q_size + 2 * kv_size, *gate_up = attended + q_size, *act = gate_up + 2 * m->inter;
    int16_t *q16 = (int16_t *)(act + m->inter);
    float *as = act + m->inter + widest / 2 + 16;
    float *scores = as + widest / GROUP * 2 + 48, *partial = scores + (size_t)m->heads * m->max_len;
    int64_t slot = slots[len - 1];
    memcpy(residual, hidden, sizeof(float) * dim);
    for (int l = 0; l < m->layers; l++) {
        const Layer *layer = &m->layer[l];
        add_rmsnorm(residual, l == 0 ? NULL : hidden, layer->input_norm, m->eps, dim, normed);
        product(&layer->qkv, normed, qkv, q16, as);
        float *qh = qkv, *k_new = qkv + q_size, *v_new = k_new + kv_size;
        for (int h = 0; h < m->heads; h++) {
            head_norm(qh + h * hd, layer->q_norm, m->eps, hd);
            rope(qh + h * hd, cos_row, sin_row, hd);
        }
        for (int h = 0; h < m->kv_heads; h++) {
            head_norm(k_new + h * hd, layer->k_norm, m->eps, hd);
            rope(k_new + h * hd, cos_row, sin_row, hd);
        }
        size_t at = (size_t)slot * kv_size * (m->kv_type == KV_F32 ? 4 : 2); /* the slot's byte offset */
        kv_store((char *)layer->k_cache + at, k_new, kv_size, m->kv_type);
        kv_store((char *)layer->v_cache + at, v_new, kv_size, m->kv_type);
        attend(m, layer, qh, slots, len, scores, partial, attended);
        product(&layer->o, attended, out, q16, as);
        add_rmsnorm(residual, out, layer->post_norm, m->eps, dim, normed);
        product(&layer->gate_up, normed, gate_up, q16, as);
        for (int i = 0; i < m->inter; i++) {
            float g = gate_up[i];
            act[i] = g / (1.f + expf(-g)) * gate_up[m->inter + i];
        }
        product(&layer->down, act, hidden, q16, as);
    }
    add_rmsnorm(residual, hidden, m->final_norm, m->eps, dim, hidden);
}
