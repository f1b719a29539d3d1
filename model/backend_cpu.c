// model/backend_cpu.c — the CPU backend: fp32 activations; weights in their file encoding with
// 8-bit-activation products (qgemm.h), or fp32 (--weights f32: sgemm / sgemv, the reference every
// other path is checked against). OpenMP threads.
#include <cblas.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../attn/attn.h"
#include "../attn/phi.h"
#include "../kv/kv.h"
#include "../util/check.h"
#include "../weights/dequant.h"
#include "../weights/synthetic.h"
#include "backend.h"
#include "qgemm.h"

// Which path a quantised product of n rows takes. Decode (n = 1) and short products: int8. Wider
// ones, from 16 rows: on a CPU with AMX, bf16 tiles (they won from 16 rows on the 1B shape,
// bench/RESULTS.md); else with AVX-512 VNNI, the integer GEMM on the int8 path's two digits
// (vpdpwssd; it won from 12-16 rows) — or with --weights fast on one digit (vpdpbusd: twice as
// fast, llama.cpp's precision, which turned the default model's greedy chat answer into nonsense
// as llama.cpp's own run does); elsewhere sgemm on dequantised tiles from SGEMM_MIN_ROWS (below
// 64 rows either may win, from 64 sgemm tiles won on every shape measured). A fixed rule, so the
// same command computes the same numbers every run.
// SIFT_PREFILL=int8|sgemm|amx|vnni|vnni8 forces one path (int8: two-digit activations on every
// product, as --weights exact); SIFT_PREFILL=tune times int8 and the wide path on the first product of each
// (type, in, out, rows rounded down to a power of two) — on a slice of the weight rows (an eighth,
// at least 128: each path's cost is linear in them), then the winner on all rows — keeps the
// faster for that shape, and `sift bench` lists the choices.
#define SGEMM_MIN_ROWS 64
#define AMX_MIN_ROWS 16
#define VNNI_MIN_ROWS 16
#define TUNE_MIN_ROWS 8
#define TUNE_MAX 256

typedef struct {
    uint32_t type;
    int in, out, bucket;         // bucket: floor(log2(rows))
    enum q_path path;
    double ms[2];                // the timed first run of int8 and of the wide path
} tune_entry;

typedef struct {
    enum bk_weights mode;
    enum q_isa isa;
    int amx;                     // q_amx_available(): prefill products on AMX tiles
    int forced;                  // enum q_path SIFT_PREFILL names; -1: the row rule; -2: tune
    tune_entry tune[TUNE_MAX];
    int n_tune;
    q_scratch scratch;
} cpu_impl;

struct bk_weight {
    uint32_t type;        // GGML_F32: data is float; else blocks of that type
    const void *data;     // rows * row_bytes
    float *f;             // == data when F32
    size_t rows, cols, row_bytes;
    void *owned;          // freed with the weight; NULL: borrowed from the file's mapping
};

static cpu_impl *impl(backend *b) { return b->impl; }

static void *cpu_alloc(backend *b, size_t n) {
    (void)b;
    return malloc(n ? n * sizeof(float) : 1);
}

static void cpu_free(backend *b, void *p) {
    (void)b;
    free(p);
}

static void cpu_to_host(backend *b, float *dst, const void *src, size_t n) {
    (void)b;
    memcpy(dst, src, n * sizeof(float));
}

// Vectors, F32 tensors, types without a product here and everything under --weights f32 become
// fp32; the rest stays as stored.
static int keeps_blocks(backend *b, bk_tensor t) {
    return impl(b)->mode != BK_WEIGHTS_F32 && t.rows > 1 && t.type != GGML_F32 &&
           q_type_supported(t.type) && (t.type == GGML_F16 || t.type == GGML_BF16 || t.cols % 32 == 0);
}

// resident bytes: the blocks as stored (borrowed pages of the file count: they will be in RAM),
// or fp32
static size_t cpu_weight_bytes(backend *b, bk_tensor t) {
    size_t rows = t.rows ? t.rows : 1;
    if (keeps_blocks(b, t)) return rows * dq_bytes(t.type, t.cols);
    return rows * t.cols * sizeof(float);
}

static bk_weight *cpu_weight(backend *b, bk_tensor t) {
    bk_weight *w = xcalloc(1, sizeof *w);
    size_t rows = t.rows ? t.rows : 1;
    *w = (bk_weight){.type = t.type, .data = t.data, .rows = rows, .cols = t.cols,
                     .row_bytes = dq_bytes(t.type, t.cols), .owned = t.owned ? (void *)t.data : NULL};
    if (t.type != GGML_F32 && !keeps_blocks(b, t)) {   // dequantise to fp32 once
        float *f = malloc(rows * t.cols * sizeof(float));
        if (!f) {
            free(w->owned);
            free(w);
            return NULL;
        }
#pragma omp parallel for if (rows > 64)
        for (size_t r = 0; r < rows; r++)
            dq_to_f32(t.type, (const uint8_t *)t.data + r * w->row_bytes, f + r * t.cols, t.cols);
        free(w->owned);
        *w = (bk_weight){.type = GGML_F32, .data = f, .rows = rows, .cols = t.cols,
                         .row_bytes = t.cols * sizeof(float), .owned = f};
    }
    if (w->type == GGML_F32) w->f = (float *)w->data;
    if (!w->owned) {   // borrowed pages of the mapping: start reading them in now, not at first use
        uintptr_t at = (uintptr_t)w->data & ~(uintptr_t)4095;
        madvise((void *)at, (uintptr_t)w->data + rows * w->row_bytes - at, MADV_WILLNEED);
    }
    return w;
}

static void cpu_weight_free(backend *b, bk_weight *w) {
    (void)b;
    if (w) free(w->owned);
    free(w);
}

// vectors are kept in fp32 (keeps_blocks)
static void cpu_vector_to_host(backend *b, float *out, const bk_weight *w) {
    (void)b;
    memcpy(out, w->f, w->cols * sizeof(float));
}

// out (n, d) = table[tokens[i]] (rows of a quantised table dequantised)
static void cpu_embed(backend *b, void *out, const bk_weight *table, const int *tokens, int n, int d) {
    (void)b;
    for (int i = 0; i < n; i++)
        dq_to_f32(table->type, (const uint8_t *)table->data + (size_t)tokens[i] * table->row_bytes,
                  (float *)out + (size_t)i * d, (uint64_t)d);
}

// out (n, d) = x / sqrt(mean(x^2) + eps) * w
static void cpu_rmsnorm(backend *b, void *out, const void *x, const bk_weight *w, int n, int d,
                        float eps) {
    (void)b;
#pragma omp parallel for if (n > 16)
    for (int i = 0; i < n; i++) {
        const float *xi = (const float *)x + (size_t)i * d;
        float *oi = (float *)out + (size_t)i * d;
        double ss = 0;
        for (int j = 0; j < d; j++) ss += (double)xi[j] * xi[j];
        float r = (float)(1.0 / sqrt(ss / d + eps));
        for (int j = 0; j < d; j++) oi[j] = xi[j] * r * w->f[j];
    }
}

// out (n, o) = x (n, i) @ W (o, i)^T + bias
// y (n, o) += bias (o,)
static void add_bias(float *y, const bk_weight *bias, int n, int o) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < o; j++) y[(size_t)i * o + j] += bias->f[j];
}

static int floor_log2(int n) {
    int k = 0;
    while (n >>= 1) k++;
    return k;
}

// The path of wide products: the one SIFT_PREFILL forces, else AMX tiles where the CPU has them,
// else the VNNI GEMM (one digit with --weights fast), else sgemm tiles.
static enum q_path wide_path(const cpu_impl *c) {
    if (c->forced > Q_PATH_INT8) return (enum q_path)c->forced;
    if (c->amx) return Q_PATH_AMX;
    if (c->isa == Q_ISA_AVX512) return c->mode == BK_WEIGHTS_FAST ? Q_PATH_VNNI8 : Q_PATH_VNNI;
    return Q_PATH_SGEMM;
}
static int wide_min_rows(const cpu_impl *c) {
    enum q_path p = wide_path(c);
    return p == Q_PATH_AMX ? AMX_MIN_ROWS : p == Q_PATH_SGEMM ? SGEMM_MIN_ROWS : VNNI_MIN_ROWS;
}
static const char *path_name(enum q_path p) {
    return p == Q_PATH_AMX     ? "amx tiles"
           : p == Q_PATH_VNNI  ? "vnni gemm"
           : p == Q_PATH_VNNI8 ? "vnni one-digit gemm"
           : p == Q_PATH_SGEMM ? "sgemm tiles"
                               : "int8";
}

// The path for a quantised product of n rows (see TUNE_MIN_ROWS); NULL *e: decided, else the
// entry to fill by timing both.
static enum q_path pick_path(cpu_impl *c, const bk_weight *w, int n, int in, int o, tune_entry **e) {
    *e = NULL;
    if (c->forced >= 0) return c->forced != Q_PATH_INT8 && n >= 2 ? (enum q_path)c->forced : Q_PATH_INT8;
    if (c->forced == -1) return n < wide_min_rows(c) ? Q_PATH_INT8 : wide_path(c);
    if (n < TUNE_MIN_ROWS) return Q_PATH_INT8;
    int bucket = floor_log2(n);
    for (int i = 0; i < c->n_tune; i++) {
        tune_entry *t = &c->tune[i];
        if (t->type == w->type && t->in == in && t->out == o && t->bucket == bucket) return t->path;
    }
    if (c->n_tune == TUNE_MAX || omp_in_parallel()) return n < wide_min_rows(c) ? Q_PATH_INT8 : wide_path(c);
    *e = &c->tune[c->n_tune++];
    **e = (tune_entry){w->type, in, o, bucket, Q_PATH_INT8, {0, 0}};
    return Q_PATH_INT8;
}

static void cpu_matmul(backend *b, void *out, const void *x, const bk_weight *w,
                       const bk_weight *bias, int n, int in, int o) {
    cpu_impl *c = impl(b);
    float *y = out;
    if (w->type != GGML_F32) {
        tune_entry *t;
        enum q_path path = pick_path(c, w, n, in, o, &t);
        q_scratch local = {0};   // the shared arena is for the forward pass's own thread
        q_scratch *sc = omp_in_parallel() ? &local : &c->scratch;
        if (t) {   // a new shape: both paths timed on a slice of W's rows, into a scratch output
            int rows = o / 8 > 128 ? o / 8 : o < 128 ? o : 128;
            float *tmp = xmalloc((size_t)n * rows * sizeof(float));
            enum q_path paths[2] = {Q_PATH_INT8, wide_path(c)};
            for (int p = 0; p < 2; p++) {
                double t0 = omp_get_wtime();
                q_matmul(c->isa, paths[p], tmp, x, n, in, w->type, w->data, w->row_bytes, rows, sc);
                t->ms[p] = (omp_get_wtime() - t0) * 1e3 * o / rows;   // scaled to all rows
            }
            free(tmp);
            path = t->path = t->ms[1] <= t->ms[0] ? paths[1] : Q_PATH_INT8;
        }
        q_matmul(c->isa, path, y, x, n, in, w->type, w->data, w->row_bytes, o, sc);
        q_scratch_free(&local);
    } else if (n == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, o, in, 1.0f, w->f, in, x, 1, 0.0f, y, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, o, in, 1.0f, x, in, w->f, in,
                    0.0f, y, o);
    if (bias) add_bias(y, bias, n, o);
}

// k products of one x: one quantisation and one parallel region on the int8 path (decode);
// otherwise one cpu_matmul each
static void cpu_matmul_multi(backend *b, int k, void *const *out, const void *x,
                             const bk_weight *const *w, const bk_weight *const *bias, int n, int in,
                             const int *o) {
    cpu_impl *c = impl(b);
    // int8 for sure, without a lookup or a timing (pick_path's rules for few rows)
    int few = c->forced == Q_PATH_INT8 ? 1 : c->forced >= 0 ? n < 2
            : c->forced == -1 ? n < wide_min_rows(c) : n < TUNE_MIN_ROWS;
    int int8 = k <= Q_MULTI_MAX && few && !omp_in_parallel();
    for (int j = 0; j < k && int8; j++) int8 = w[j]->type != GGML_F32;
    if (!int8) {
        for (int j = 0; j < k; j++) cpu_matmul(b, out[j], x, w[j], bias[j], n, in, o[j]);
        return;
    }
    uint32_t type[Q_MULTI_MAX];
    const void *data[Q_MULTI_MAX];
    size_t rb[Q_MULTI_MAX];
    for (int j = 0; j < k; j++) type[j] = w[j]->type, data[j] = w[j]->data, rb[j] = w[j]->row_bytes;
    q_matmul_multi(c->isa, k, (float *const *)out, x, n, in, type, data, rb, o, &c->scratch);
    for (int j = 0; j < k; j++)
        if (bias[j]) add_bias(out[j], bias[j], n, o[j]);
}

// rotate x (n, heads, hd) in place; pair (a, b) = (2j, 2j+1) for NORM, (j, j + hd/2) for NEOX
static void cpu_rope(backend *b, void *x, const int *pos, int n, int heads, int hd,
                     const float *inv_freq, enum rope_style style) {
    (void)b;
    int half = hd / 2;
#pragma omp parallel for if (n > 16)
    for (int i = 0; i < n; i++) {
        float c[half], s[half];
        for (int j = 0; j < half; j++) {
            double theta = (double)pos[i] * inv_freq[j];
            c[j] = (float)cos(theta);
            s[j] = (float)sin(theta);
        }
        for (int h = 0; h < heads; h++) {
            float *xh = (float *)x + ((size_t)i * heads + h) * hd;
            for (int j = 0; j < half; j++) {
                int ia = style == ROPE_NORM ? 2 * j : j, ib = style == ROPE_NORM ? 2 * j + 1 : j + half;
                float a = xh[ia], bb = xh[ib];
                xh[ia] = a * c[j] - bb * s[j];
                xh[ib] = a * s[j] + bb * c[j];
            }
        }
    }
}

// e^x for 16 lanes: x = k ln2 + r (|r| <= ln2 / 2, ln2 in two parts), e^r by its degree-6
// Taylor polynomial (relative error < 2e-7, as libm's expf within a few ulp), times 2^k (scalef).
// x is clamped to [-87, 80]: e^-87 = 1.6e-38 is still normal (subnormal results cost a microcode
// assist each: 74 % of SwiGLU's time before the clamp), and e^80 = 5.5e34 keeps its reciprocal
// normal and finite (an infinite one made SwiGLU's Newton step NaN).
__attribute__((target("avx512f,fma"))) static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(80.0f));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), 0);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
}

// out = silu(gate) * up, 16 lanes at a time; 1 / (1 + e^-g) by rcp14 and one Newton step. Gates
// beyond the clamp: silu(g) = g for g > 87 as the scalar form, 0 for g < -80 (true |silu| <
// 1e-33 there; a NaN gate stays NaN).
__attribute__((target("avx512f,fma"))) static void swiglu_avx512(float *o, const float *g,
                                                                  const float *u, size_t n) {
#pragma omp parallel for if (n > 65536)
    for (size_t i = 0; i < n / 16 * 16; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        __m512 den = _mm512_add_ps(_mm512_set1_ps(1.0f), e), r = _mm512_rcp14_ps(den);
        r = _mm512_mul_ps(r, _mm512_fnmadd_ps(den, r, _mm512_set1_ps(2.0f)));   // Newton: 2^-27
        __mmask16 tiny = _mm512_cmp_ps_mask(gv, _mm512_set1_ps(-80.0f), _CMP_LT_OQ);
        __m512 s = _mm512_maskz_mul_ps((__mmask16)~tiny, gv, r);   // silu(g < -80) = 0 (< 1e-33)
        _mm512_storeu_ps(o + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
    }
    for (size_t i = n / 16 * 16; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

// out = silu(gate) * up
static void cpu_swiglu(backend *b, void *out, const void *gate, const void *up, size_t n) {
    float *o = out;
    const float *g = gate, *u = up;
    if (impl(b)->isa == Q_ISA_AVX512) {
        swiglu_avx512(o, g, u, n);
        return;
    }
#pragma omp parallel for if (n > 65536)
    for (size_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void cpu_add(backend *b, void *x, const void *y, size_t n) {
    (void)b;
    float *a = x;
    const float *c = y;
    for (size_t i = 0; i < n; i++) a[i] += c[i];
}

// out (k, d) = x[idx[j]]
static void cpu_gather_rows(backend *b, void *out, const void *x, const int *idx, int k, int d) {
    (void)b;
    for (int j = 0; j < k; j++)
        memcpy((float *)out + (size_t)j * d, (const float *)x + (size_t)idx[j] * d, d * sizeof(float));
}

// append k, v (n, n_kv_head, hd) to L at L->len
static void cpu_kv_append(backend *b, kv_layer *L, const void *k, const void *v, const int *pos, int n) {
    (void)b;
    CHECK_INTERNAL(L->len + n <= L->cap, "KV layer overflow: %d + %d > %d", L->len, n, L->cap);
    int hd = L->head_dim;
    for (int g = 0; g < L->n_kv_head; g++)
        for (int i = 0; i < n; i++) {
            size_t dst = ((size_t)g * L->cap + L->len + i) * hd;
            size_t src = ((size_t)i * L->n_kv_head + g) * hd;
            memcpy((float *)L->k + dst, (const float *)k + src, hd * sizeof(float));
            memcpy((float *)L->v + dst, (const float *)v + src, hd * sizeof(float));
        }
    kv_note_append(L, pos, n);
}

static void cpu_attention(backend *b, void *out, const void *q, const int *qpos, int n, int heads,
                          const kv_layer *L) {
    (void)b;
    attn_causal_cpu(out, q, qpos, n, heads, L->k, L->v, L->pos, L->len, L->cap, L->n_kv_head,
                    L->head_dim);
}

// The sequences spread over the threads (each one's attention then runs on one thread: the
// nested parallel region inside is serial), instead of a parallel region per sequence.
static void cpu_attention_multi(backend *b, int k, void *const *out, const void *const *q,
                                const int *const *qpos, const int *n, int heads,
                                const kv_layer *const *L) {
#pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < k; i++) cpu_attention(b, out[i], q[i], qpos[i], n[i], heads, L[i]);
}

static void cpu_attn_probs(backend *b, float *probs, const void *q, const int *qpos, int n,
                           int heads, const kv_layer *L, int m) {
    (void)b;
    attn_probs_cpu(probs, q, qpos, n, heads, L->k, L->pos, m, L->cap, L->n_kv_head, L->head_dim);
}

// L keeps per KV head g the entries idx[g*k + j], moved into buffers of capacity new_cap
static void cpu_kv_keep(backend *b, kv_layer *L, const int *idx, int k, int new_cap) {
    (void)b;
    int hd = L->head_dim, nh = L->n_kv_head;
    size_t n = (size_t)nh * (new_cap > 0 ? new_cap : 1);
    float *nk = xmalloc(n * hd * sizeof(float)), *nv = xmalloc(n * hd * sizeof(float));
    int *np = xmalloc(n * sizeof(int));
    for (int g = 0; g < nh; g++)
        for (int j = 0; j < k; j++) {
            size_t src = (size_t)g * L->cap + idx[g * k + j], dst = (size_t)g * new_cap + j;
            memcpy(nk + dst * hd, (float *)L->k + src * hd, hd * sizeof(float));
            memcpy(nv + dst * hd, (float *)L->v + src * hd, hd * sizeof(float));
            np[dst] = L->pos[src];
        }
    free(L->k);
    free(L->v);
    free(L->pos);
    L->k = nk;
    L->v = nv;
    L->pos = np;
    L->cap = new_cap;
    L->len = k;
}

// MemAvailable from /proc/meminfo (what the kernel could give without swapping); 0 = unknown.
static size_t cpu_mem_available(backend *b) {
    (void)b;
    return host_mem_available();
}

// The reference for every backend's weight_synth: element i = offset + scale * synth_uniform.
static bk_weight *cpu_weight_synth(backend *b, uint64_t seed, uint64_t tensor, size_t rows,
                                   size_t cols, float scale, float offset) {
    float *host = malloc(rows * cols * sizeof(float));
    if (!host) return NULL;
    synth_fill(host, rows * cols, seed, tensor, scale, offset);
    return cpu_weight(b, bk_f32(host, rows, cols));
}

// Ceilings measured now, best of 3: the GEMM peak of the prefill path — an sgemm (n = 2048,
// 2 n^3 FLOPs), with AMX the tiles' bf16 peak (q_amx_peak_tflops), with AVX-512 VNNI the peak of
// the GEMM's instruction (q_vnni_peak_tops: vpdpwssd, with --weights fast vpdpbusd; a
// multiply-add counted as 2) — and a threaded read-only
// pass over 256 MiB (decode reads the weights once per token and writes next to nothing).
__attribute__((noinline)) static float read_pass(const float *x, size_t n) {
    float acc[16] = {0};
    for (size_t i = 0; i < n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += x[i + j];
    float s = 0;
    for (int j = 0; j < 16; j++) s += acc[j];
    return s;
}

static int cpu_ceilings(backend *b, double *tflops, double *gbps) {
    const int n = 2048;
    const size_t read_n = (size_t)64 << 20;   // floats
    float *x = malloc(read_n * sizeof(float)), *y = malloc((size_t)n * n * sizeof(float));
    if (!x || !y) {
        free(x);
        free(y);
        return -1;
    }
    // not zeros: this VM read zero-filled pages ~10x faster than any data (221 vs 22 GB/s)
    memset(x, 0x3c, read_n * sizeof(float));
    const cpu_impl *c = impl(b);
    const enum q_path wide = c->mode != BK_WEIGHTS_F32 && c->forced != Q_PATH_INT8 ? wide_path(c) : Q_PATH_SGEMM;
    double best_mm = 1e30, best_rd = 1e30, peak = 0;
    volatile float sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = omp_get_wtime();
        if (wide == Q_PATH_SGEMM)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, x, n,
                        x + (size_t)n * n, n, 0.0f, y, n);
        else {
            double t = wide == Q_PATH_AMX ? q_amx_peak_tflops(1 << 16)
                                          : q_vnni_peak_tops(wide == Q_PATH_VNNI8 ? 1 : 2, 1 << 20);
            peak = t > peak ? t : peak;
        }
        double t1 = omp_get_wtime();
        float part = 0;
#pragma omp parallel for schedule(static) reduction(+ : part)
        for (size_t c = 0; c < read_n; c += 1 << 16) part += read_pass(x + c, 1 << 16);
        sink += part;
        double t2 = omp_get_wtime();
        if (t1 - t0 < best_mm) best_mm = t1 - t0;
        if (t2 - t1 < best_rd) best_rd = t2 - t1;
    }
    free(x);
    free(y);
    *tflops = wide != Q_PATH_SGEMM ? peak : 2.0 * n * n * n / best_mm / 1e12;
    *gbps = read_n * sizeof(float) / best_rd / 1e9;
    return 0;
}

static void cpu_attn_select(backend *b, void *out, const void *q, int heads, const kv_layer *L,
                            const int *sel, int n_sel, int n_sub, const phi_completion *comp) {
    (void)b;
    int hd = L->head_dim, group = heads / L->n_kv_head;
    if (comp && comp->maps) {   // log phi_k of the retrieved keys, once per key per request
#pragma omp parallel for if (L->n_kv_head > 1)
        for (int g = 0; g < L->n_kv_head; g++)
            if (comp->sum[g].n > n_sub)
                for (int h = g * group; h < (g + 1) * group; h++)
                    phi_summary_memo(&comp->sum[g], comp->maps, phi_par_k(comp->maps, comp->layer, g),
                                     (const float *)L->k + (size_t)g * L->cap * hd,
                                     sel + (size_t)h * n_sel, n_sub, hd);
    }
#pragma omp parallel for if (heads > 1)
    for (int h = 0; h < heads; h++) {
        int g = h / group;
        size_t off = (size_t)g * L->cap * hd;
        const phi_maps *p = comp ? comp->maps : NULL;
        phi_attend_head((float *)out + (size_t)h * hd, (const float *)q + (size_t)h * hd,
                        (const float *)L->k + off, (const float *)L->v + off,
                        sel + (size_t)h * n_sel, n_sel, hd, n_sub, p,
                        p ? phi_par_q(p, comp->layer, h) : NULL,
                        p ? phi_par_k(p, comp->layer, g) : NULL, comp ? &comp->sum[g] : NULL);
    }
}

static void cpu_phi_summarize(backend *b, phi_summary *out, const phi_maps *p, int layer,
                              const kv_layer *L, int lo, int hi) {
    (void)b;
    int hd = L->head_dim;
#pragma omp parallel for
    for (int g = 0; g < L->n_kv_head; g++) {
        size_t off = ((size_t)g * L->cap + lo) * hd;
        phi_summary_build(&out[g], p, phi_par_k(p, layer, g), (const float *)L->k + off,
                          (const float *)L->v + off, hi - lo, hd, hd);
    }
}

static void cpu_report(backend *b, FILE *out) {
    cpu_impl *c = impl(b);
    if (c->n_tune) fprintf(out, "sift: cpu product paths timed per shape (SIFT_PREFILL=tune):\n");
    for (int i = 0; i < c->n_tune; i++) {
        const tune_entry *t = &c->tune[i];
        const char *wide = path_name(wide_path(c));
        fprintf(out, "  %s %d -> %d, %d..%d rows: %s (timed on a slice, as ms for all: int8 %.2f, "
                "%s %.2f)\n",
                gguf_type_name(t->type), t->in, t->out, 1 << t->bucket, (2 << t->bucket) - 1,
                t->path == Q_PATH_INT8 ? "int8" : wide, t->ms[0], wide, t->ms[1]);
    }
}

static void cpu_destroy(backend *b) {
    q_scratch_free(&impl(b)->scratch);
    free(b->impl);
    free(b);
}

// Physical cores this process may run on: distinct (package, core) pairs of the CPUs in its
// affinity mask (sysfs topology); 0 when unknown. Two hyperthreads of one core share its vector
// units and caches, so a second thread per core only adds barrier waits to these kernels.
static int physical_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    long seen[CPU_SETSIZE];
    int n = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &set)) continue;
        long id[2] = {-1, -1};
        const char *field[2] = {"physical_package_id", "core_id"};
        for (int f = 0; f < 2; f++) {
            char path[128];
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/%s", cpu, field[f]);
            FILE *fp = fopen(path, "r");
            if (!fp || fscanf(fp, "%ld", &id[f]) != 1) id[f] = -1;
            if (fp) fclose(fp);
        }
        if (id[0] < 0 || id[1] < 0) return 0;
        long key = id[0] << 20 | id[1];
        int dup = 0;
        for (int i = 0; i < n && !dup; i++) dup = seen[i] == key;
        if (!dup) seen[n++] = key;
    }
    return n;
}

// CPUs' worth of time other processes (and the hypervisor: steal) took over the next `ms`
// milliseconds: the machine's busy time from /proc/stat less this process's own; -1 unknown.
static double others_busy(int ms) {
    double busy[2], steal[2], self[2];
    if (host_cpu_seconds(&busy[0], &steal[0], &self[0]) != 0) return -1;
    usleep((useconds_t)ms * 1000);
    if (host_cpu_seconds(&busy[1], &steal[1], &self[1]) != 0) return -1;
    double other = (busy[1] - busy[0] + steal[1] - steal[0] - (self[1] - self[0])) / (ms / 1e3);
    return other < 0 ? 0 : other;
}

// The default thread count: OMP_NUM_THREADS, else the physical cores less those other processes
// keep busy (sampled once per process over 50 ms; *busy: that count). OpenMP threads that share a
// core with a busy process make every barrier wait for a time slice: with one busy process on
// the 2-core dev machine, 2 threads gave a 3-strategy A/B run TPOTs of 4.3x the idle ones with
// 544-831 % spread, 1 thread 1.6x with <= 9 % (bench/RESULTS.md).
int backend_cpu_default_threads(int *busy) {
    static int threads = -1, others = 0;
    if (threads < 0) {
        const char *env = getenv("OMP_NUM_THREADS");
        threads = env && *env ? atoi(env) : 0;
        if (threads <= 0) {
            int cores = physical_cores();
            if (cores <= 0) cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
            double other = cores > 1 ? others_busy(50) : 0;
            others = other > 0 ? (int)(other + 0.5) : 0;
            others = others > cores - 1 ? cores - 1 : others;
            threads = cores - others;
        }
        if (threads <= 0) threads = 1;
    }
    if (busy) *busy = others;
    return threads;
}

static int core_has_avx2(const char *name) {
    static const char *const good[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        if (strcmp(name, good[i]) == 0) return 1;
    return 0;
}

void backend_cpu_blas_init(char **argv) {
    const char *core = openblas_get_corename();
    if (getenv("OPENBLAS_CORETYPE") || !core || core_has_avx2(core)) return;
    __builtin_cpu_init();
    const char *want = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                               __builtin_cpu_supports("avx512cd")
                           ? "SkylakeX"
                       : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "Haswell"
                                                                                          : NULL;
    if (!want) return;
    setenv("OPENBLAS_CORETYPE", want, 1);
    setenv("SIFT_BLAS_DETECTED", core, 1);
    fflush(NULL);
    execv("/proc/self/exe", argv);   // returns only on failure: go on with the slow kernels
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("SIFT_BLAS_DETECTED");
}

const char *backend_cpu_blas_core(void) {
    static char s[96];
    const char *was = getenv("SIFT_BLAS_DETECTED"), *core = openblas_get_corename();
    if (was) snprintf(s, sizeof s, "%s (OpenBLAS detected %s)", core, was);
    else snprintf(s, sizeof s, "%s", core);
    return s;
}

backend *backend_cpu_create(int n_threads, enum bk_weights weights) {
    int busy = 0, auto_threads = backend_cpu_default_threads(&busy);
    if (n_threads <= 0) n_threads = auto_threads;
    if (n_threads != auto_threads) busy = 0;   // the user chose
    if (n_threads > 0) omp_set_num_threads(n_threads);
    backend *b = xcalloc(1, sizeof *b);
    cpu_impl *c = xcalloc(1, sizeof *c);
    c->mode = weights;
    c->isa = q_isa_pick(NULL);
    c->amx = c->isa == Q_ISA_AVX512 && q_amx_available();
    const char *path = getenv("SIFT_PREFILL");
    c->forced = weights == BK_WEIGHTS_EXACT ? Q_PATH_INT8
                : path && strcmp(path, "int8") == 0    ? Q_PATH_INT8
                : path && strcmp(path, "sgemm") == 0 ? Q_PATH_SGEMM
                : path && strcmp(path, "amx") == 0 && q_amx_available() ? Q_PATH_AMX
                : path && strcmp(path, "vnni") == 0 && c->isa == Q_ISA_AVX512 ? Q_PATH_VNNI
                : path && strcmp(path, "vnni8") == 0 && c->isa == Q_ISA_AVX512 ? Q_PATH_VNNI8
                : path && strcmp(path, "tune") == 0  ? -2
                                                     : -1;
    *b = (backend){
        .name = "cpu", .impl = c, .elem_bytes = sizeof(float), .destroy = cpu_destroy,
        .alloc = cpu_alloc, .free = cpu_free, .to_host = cpu_to_host,
        .weight = cpu_weight, .weight_bytes = cpu_weight_bytes, .weight_free = cpu_weight_free,
        .vector_to_host = cpu_vector_to_host,
        .report = cpu_report, .matmul_multi = cpu_matmul_multi,
        .embed = cpu_embed, .rmsnorm = cpu_rmsnorm, .matmul = cpu_matmul, .rope = cpu_rope,
        .swiglu = cpu_swiglu, .add = cpu_add, .gather_rows = cpu_gather_rows,
        .kv_append = cpu_kv_append, .attention = cpu_attention,
        .attention_multi = cpu_attention_multi, .attn_probs = cpu_attn_probs,
        .kv_keep = cpu_kv_keep, .mem_available = cpu_mem_available,
        .weight_synth = cpu_weight_synth, .ceilings = cpu_ceilings, .attn_select = cpu_attn_select,
        .phi_summarize = cpu_phi_summarize,
    };
    int used = 0;
    if (busy)
        used = snprintf(b->info, sizeof b->info, "%d thread%s: %d core%s busy with other processes, ",
                        n_threads, n_threads > 1 ? "s" : "", busy, busy > 1 ? "s" : "");
    used += snprintf(b->info + used, sizeof b->info - used, "BLAS %s, ", backend_cpu_blas_core());
    if (weights == BK_WEIGHTS_F32)
        snprintf(b->info + used, sizeof b->info - used, "fp32 weights, sgemm");
    else
        snprintf(b->info + used, sizeof b->info - used, "native weights, %s products, prefill path %s",
                 q_isa_name(c->isa), weights == BK_WEIGHTS_EXACT ? "int8 two-digit (--weights exact)"
                                     : c->forced == Q_PATH_INT8    ? "int8 (SIFT_PREFILL)"
                                     : c->forced == Q_PATH_SGEMM ? "sgemm (SIFT_PREFILL)"
                                     : c->forced == Q_PATH_AMX   ? "amx (SIFT_PREFILL)"
                                     : c->forced == Q_PATH_VNNI  ? "vnni (SIFT_PREFILL)"
                                     : c->forced == Q_PATH_VNNI8 ? "vnni8 (SIFT_PREFILL)"
                                     : c->forced == -2           ? "timed per shape (SIFT_PREFILL)"
                                     : c->amx                    ? "amx bf16 tiles from 16 rows"
                                     : c->isa == Q_ISA_AVX512 && weights == BK_WEIGHTS_FAST
                                         ? "vnni one-digit gemm from 16 rows (--weights fast)"
                                     : c->isa == Q_ISA_AVX512    ? "vnni two-digit gemm from 16 rows"
                                                                 : "sgemm tiles from 64 rows");
    return b;
}
