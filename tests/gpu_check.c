// tests/gpu_check.c — `make test-gpu`: the CUDA backend against the CPU backend (the fp32
// reference), on a machine with a GPU. Every op runs on both backends with the same fresh random
// inputs (rounded to bf16 first, so both see identical values), CUDA outputs poisoned with NaN
// before each run; pass = ||cuda - cpu|| / ||cpu|| <= 2e-2 and no NaN. Then every strategy's
// last-prompt-row logits (<= 5e-2: the rounding of every layer's activations compounds) and
// greedy tokens on models made in memory (a tiny Llama and a tiny Qwen2, seeded random weights:
// nothing to carry) and on a GGUF file when one is given (argv[1], $SIFT_MODEL, or the default
// model if present). One table row per check.
// Exit: 0 all passed, 1 a check failed, 2 no usable GPU.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../attn/pages.h"
#include "../attn/phi.h"
#include "../attn/score.h"
#include "../backend/backend.h"
#include "../policies/policy.h"
#include "../util/check.h"
#include "../util/tunables.h"
#include "../weights/dequant.h"
#include "../weights/kvrow.h"
#include "../weights/synthetic.h"

#define TOL 2e-2         // one op in bf16
#define TOL_MODEL 5e-2   // a model's logits: bf16 rounding of every activation compounds over layers
enum { CPU, GPU };

static int n_fail, n_pass;
// --small: shapes scaled for the SIMT emulator in `make test` (see main); --case: attention cases
// whose label contains this text only
static int small;
static const char *case_filter;

// ---- inputs and comparison ---------------------------------------------------------------------

static float bf16_round(float x) {   // round to nearest even at bf16 precision
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static uint64_t rng_state = 1;
static float urand(void) { return synth_uniform(0x5eed, 0, rng_state++); }

// n fresh values in [-scale, scale), bf16-exact
static float *rand_host(size_t n, float scale) {
    float *x = xmalloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = bf16_round(urand() * scale);
    return x;
}

static bk_weight *weight_copy(backend *b, const float *host, size_t rows, size_t cols) {
    size_t n = rows * cols;
    float *copy = xmalloc((n ? n : 1) * sizeof(float));
    memcpy(copy, host, n * sizeof(float));
    return b->weight(b, bk_f32(copy, rows, cols));
}

// out (rows, cols) in backend memory <- host, through the embed op (rows of a weight table)
static void fill(backend *b, void *out, const float *host, int rows, int cols) {
    bk_weight *w = weight_copy(b, host, rows, cols);
    int *ids = xmalloc((size_t)(rows ? rows : 1) * sizeof(int));
    for (int i = 0; i < rows; i++) ids[i] = i;
    b->embed(b, out, w, ids, rows, cols);
    b->weight_free(b, w);
    free(ids);
}

static void *upload(backend *b, const float *host, int rows, int cols) {
    void *p = b->alloc(b, (size_t)rows * cols);
    CHECK_INTERNAL(p, "test buffer of %d x %d", rows, cols);
    fill(b, p, host, rows, cols);
    return p;
}

// every element of a (rows, cols) buffer = NaN
static void poison(backend *b, void *p, int rows, int cols) {
    float *nan_row = xmalloc((size_t)cols * sizeof(float));
    for (int j = 0; j < cols; j++) nan_row[j] = NAN;
    bk_weight *w = weight_copy(b, nan_row, 1, cols);
    int *zeros = xcalloc((size_t)(rows ? rows : 1), sizeof(int));
    b->embed(b, p, w, zeros, rows, cols);
    b->weight_free(b, w);
    free(zeros);
    free(nan_row);
}

static float *download(backend *b, const void *p, size_t n) {
    float *h = xmalloc((n ? n : 1) * sizeof(float));
    b->to_host(b, h, p, n);
    return h;
}

// Errors of got vs ref, an output of `rows` rows of n / rows values each.
typedef struct cmp_stats {
    double rel;          // relative L2 error of the whole output
    double row_rel;      // the worst row's relative L2 error (absolute where the row is all zero)
    size_t worst_row;
    double max_abs;      // largest |got - ref|
    double ulps;         // largest |got - ref| in bf16 ulps of its row's largest |ref|
    size_t at, nan;      // index of the largest difference (or the first NaN); NaN count
} cmp_stats;

static double bf16_ulp(double x) {   // spacing of bf16 values at |x| (8 significant bits)
    if (!(x > 0)) return ldexp(1.0, -133);
    int e;
    frexp(x, &e);
    return ldexp(1.0, e - 8);
}

static cmp_stats compare(const float *got, const float *ref, size_t n, size_t rows) {
    cmp_stats st = {0};
    double num = 0, den = 0;
    size_t cols = rows && n % rows == 0 ? n / rows : n;
    for (size_t r = 0; r * cols < n; r++) {
        double rn = 0, rd = 0, rmax = 0;
        for (size_t i = r * cols; i < (r + 1) * cols; i++) rmax = fmax(rmax, fabs(ref[i]));
        for (size_t i = r * cols; i < (r + 1) * cols; i++) {
            double d = (double)got[i] - ref[i];
            if (isnan(d)) {
                if (st.nan++ == 0) st.at = i;
                continue;
            }
            rn += d * d, rd += (double)ref[i] * ref[i];
            if (fabs(d) > st.max_abs && !st.nan) st.max_abs = fabs(d), st.at = i;
            st.ulps = fmax(st.ulps, fabs(d) / bf16_ulp(rmax));
        }
        double rr = rd > 0 ? sqrt(rn / rd) : sqrt(rn);
        if (rr > st.row_rel) st.row_rel = rr, st.worst_row = r;
        num += rn, den += rd;
    }
    st.rel = den > 0 ? sqrt(num / den) : st.max_abs;
    return st;
}

// One table row: got vs ref as `rows` rows (1: one vector); passes when nothing is NaN and the
// whole output's and every row's relative L2 error are <= tol (one wrong row of many fails).
// Columns: relative error, worst row's, max abs, max abs in bf16 ulps of the row's scale.
static int report_rows(const char *check, const char *shape, const float *got, const float *ref,
                       size_t n, size_t rows, double tol) {
    cmp_stats st = compare(got, ref, n, rows);
    int ok = !st.nan && st.rel <= tol && st.row_rel <= tol;
    printf("| %-22s | %-44s | %9.2e | %9.2e | %9.2e | %7.1f | %s |\n", check, shape,
           st.nan ? NAN : st.rel, st.row_rel, st.max_abs, st.ulps, ok ? "ok" : "FAIL");
    if (!ok && n)   // where to look: the flat index (row-major in the op's output shape)
        printf("|   worst row %zu of %zu; worst at [%zu] of %zu: %.6g, reference %.6g; %zu NaN |||||||\n",
               st.worst_row, rows ? rows : 1, st.at, n, got[st.at], ref[st.at], st.nan);
    fflush(stdout);
    ok ? n_pass++ : n_fail++;
    return ok;
}

static int report(const char *check, const char *shape, const float *got, const float *ref,
                  size_t n, double tol) {
    return report_rows(check, shape, got, ref, n, 1, tol);
}

// Runs a row-op on both backends: inputs uploaded, output poisoned, op run, output compared.
typedef void (*op_fn)(backend *b, void *out, void *const *in, const void *ctx);

static void check_op(backend *bk[2], const char *name, const char *shape, op_fn op,
                     const void *ctx, float *const *in_host, const int (*in_shape)[2], int n_in,
                     int out_rows, int out_cols) {
    float *res[2];
    for (int k = 0; k < 2; k++) {
        backend *b = bk[k];
        void *in[4] = {0};
        for (int i = 0; i < n_in; i++) in[i] = upload(b, in_host[i], in_shape[i][0], in_shape[i][1]);
        void *out = b->alloc(b, (size_t)out_rows * out_cols);
        poison(b, out, out_rows, out_cols);
        op(b, out, in, ctx);
        res[k] = download(b, out, (size_t)out_rows * out_cols);
        b->free(b, out);
        for (int i = 0; i < n_in; i++) b->free(b, in[i]);
    }
    report_rows(name, shape, res[GPU], res[CPU], (size_t)out_rows * out_cols, (size_t)out_rows, TOL);
    free(res[0]);
    free(res[1]);
}

// ---- row ops -----------------------------------------------------------------------------------

typedef struct {
    int n, d, i, o;
    bk_weight *w[2], *bias[2];   // per backend
    const int *idx, *pos;
    const float *inv_freq;
    enum rope_style style;
} op_ctx;

static int which(backend *b, const op_ctx *c) {
    (void)c;
    return strcmp(b->name, "cuda") == 0 ? GPU : CPU;
}

static void op_embed(backend *b, void *out, void *const *in, const void *v) {
    const op_ctx *c = v;
    (void)in;
    b->embed(b, out, c->w[which(b, c)], c->idx, c->n, c->d);
}
static void op_rmsnorm(backend *b, void *out, void *const *in, const void *v) {
    const op_ctx *c = v;
    b->rmsnorm(b, out, in[0], c->w[which(b, c)], c->n, c->d, 1e-5f);
}
static void op_matmul(backend *b, void *out, void *const *in, const void *v) {
    const op_ctx *c = v;
    int k = which(b, c);
    b->matmul(b, out, in[0], c->w[k], c->bias[k], c->n, c->i, c->o);
}
static void op_rope(backend *b, void *out, void *const *in, const void *v) {
    const op_ctx *c = v;   // rotate in place, then copy out through gather
    b->rope(b, in[0], c->pos, c->n, c->i, c->d, c->inv_freq, c->style);
    b->gather_rows(b, out, in[0], c->idx, c->n, c->i * c->d);
}
static void op_swiglu(backend *b, void *out, void *const *in, const void *v) {
    const op_ctx *c = v;
    b->swiglu(b, out, in[0], in[1], (size_t)c->n * c->d);
}
static void op_add(backend *b, void *out, void *const *in, const void *v) {
    const op_ctx *c = v;
    b->add(b, in[0], in[1], (size_t)c->n * c->d);
    b->gather_rows(b, out, in[0], c->idx, c->n, c->d);
}
static void op_gather(backend *b, void *out, void *const *in, const void *v) {
    const op_ctx *c = v;
    b->gather_rows(b, out, in[0], c->idx, c->n, c->d);
}

static int *iota(int n) {
    int *p = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    for (int i = 0; i < n; i++) p[i] = i;
    return p;
}

static void make_weights(backend *bk[2], op_ctx *c, int rows, int cols, float scale, int bias) {
    float *w = rand_host((size_t)rows * cols, scale), *bv = rand_host((size_t)rows, 0.5f);
    for (int k = 0; k < 2; k++) {
        c->w[k] = weight_copy(bk[k], w, rows, cols);
        c->bias[k] = bias ? weight_copy(bk[k], bv, 1, rows) : NULL;
    }
    free(w);
    free(bv);
}

static void free_weights(backend *bk[2], op_ctx *c) {
    for (int k = 0; k < 2; k++) {
        bk[k]->weight_free(bk[k], c->w[k]);
        if (c->bias[k]) bk[k]->weight_free(bk[k], c->bias[k]);
    }
}

static void test_embed(backend *bk[2], int vocab, int n, int d) {
    op_ctx c = {.n = n, .d = d};
    make_weights(bk, &c, vocab, d, 1, 0);
    int *ids = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) ids[i] = (i * 7 + 3) % vocab;
    c.idx = ids;
    char shape[64];
    snprintf(shape, sizeof shape, "vocab %d, n %d, d %d", vocab, n, d);
    check_op(bk, "embed", shape, op_embed, &c, NULL, NULL, 0, n, d);
    free_weights(bk, &c);
    free(ids);
}

static void test_rmsnorm(backend *bk[2], int n, int d) {
    op_ctx c = {.n = n, .d = d};
    float *x = rand_host((size_t)n * d, 3), *w = rand_host((size_t)d, 1);
    for (int j = 0; j < d; j++) w[j] = bf16_round(1 + w[j] * 0.5f);
    for (int k = 0; k < 2; k++) c.w[k] = weight_copy(bk[k], w, 1, d);
    char shape[64];
    snprintf(shape, sizeof shape, "n %d, d %d", n, d);
    check_op(bk, "rmsnorm", shape, op_rmsnorm, &c, &x, (const int[][2]){{n, d}}, 1, n, d);
    free_weights(bk, &c);
    free(x);
    free(w);
}

static void test_matmul(backend *bk[2], int n, int in, int o, int bias) {
    op_ctx c = {.n = n, .i = in, .o = o};
    make_weights(bk, &c, o, in, 1.0f / sqrtf((float)in), bias);
    float *x = rand_host((size_t)n * in, 1);
    char shape[64];
    snprintf(shape, sizeof shape, "(%d x %d) @ (%d x %d)^T%s", n, in, o, in, bias ? " + bias" : "");
    check_op(bk, "matmul", shape, op_matmul, &c, &x, (const int[][2]){{n, in}}, 1, n, o);
    free_weights(bk, &c);
    free(x);
}

// The fused ops against the CPU's separate ones: q|k|v as one product of fused weights split
// with biases (matmul_multi), gate|up with SwiGLU (swiglu_matmul), residual add with RMSNorm.
static void test_fused(backend *bk[2], int n, int in, int qd, int kvd, int f, int bias) {
    backend *g = bk[GPU];
    if (!g->weight_fuse || !g->matmul_multi || !g->swiglu_matmul || !g->add_rmsnorm) {
        printf("| %-22s | %-44s | %9s | %9s | %9s | %7s | skip: the backend fuses nothing |\n",
               "fused ops", "-", "-", "-", "-", "-");
        return;
    }
    int o[3] = {qd, kvd, kvd};
    float sc = 1.0f / sqrtf((float)in), *w[3], *bv[3];
    for (int j = 0; j < 3; j++) w[j] = rand_host((size_t)o[j] * in, sc), bv[j] = rand_host((size_t)o[j], 0.5f);
    float *wg = rand_host((size_t)f * in, sc), *wu = rand_host((size_t)f * in, sc);
    float *x = rand_host((size_t)n * in, 1), *y = rand_host((size_t)n * in, 1), *nw = rand_host((size_t)in, 1);
    for (int j = 0; j < in; j++) nw[j] = bf16_round(1 + nw[j] * 0.5f);
    float *res[2][7];
    for (int k = 0; k < 2; k++) {
        backend *b = bk[k];
        bk_weight *W[3], *B[3], *G = weight_copy(b, wg, f, in), *U = weight_copy(b, wu, f, in);
        bk_weight *NW = weight_copy(b, nw, 1, in), *F1 = NULL, *F2 = NULL;
        for (int j = 0; j < 3; j++)
            W[j] = weight_copy(b, w[j], o[j], in), B[j] = bias ? weight_copy(b, bv[j], 1, o[j]) : NULL;
        if (k == GPU) {
            F1 = b->weight_fuse(b, W, 3), F2 = b->weight_fuse(b, (bk_weight *const[]){G, U}, 2);
            CHECK_INTERNAL(F1 && F2, "weight_fuse refused");
        }
        void *dx = upload(b, x, n, in), *out[3];
        for (int j = 0; j < 3; j++) out[j] = b->alloc(b, (size_t)n * o[j]), poison(b, out[j], n, o[j]);
        if (k == GPU) b->matmul_multi(b, 3, out, dx, (const bk_weight *const *)W, (const bk_weight *const *)B, n, in, o);
        else
            for (int j = 0; j < 3; j++) b->matmul(b, out[j], dx, W[j], B[j], n, in, o[j]);
        for (int j = 0; j < 3; j++) res[k][j] = download(b, out[j], (size_t)n * o[j]), b->free(b, out[j]);
        void *h = b->alloc(b, (size_t)n * f);
        poison(b, h, n, f);
        if (k == GPU) CHECK_INTERNAL(b->swiglu_matmul(b, h, dx, G, U, n, in, f) == 0, "swiglu_matmul refused");
        else {
            void *hg = b->alloc(b, (size_t)n * f), *hu = b->alloc(b, (size_t)n * f);
            b->matmul(b, hg, dx, G, NULL, n, in, f);
            b->matmul(b, hu, dx, U, NULL, n, in, f);
            b->swiglu(b, h, hg, hu, (size_t)n * f);
            b->free(b, hg), b->free(b, hu);
        }
        res[k][3] = download(b, h, (size_t)n * f);
        void *dy = upload(b, y, n, in), *on = b->alloc(b, (size_t)n * in);
        poison(b, on, n, in);
        if (k == GPU) b->add_rmsnorm(b, on, dx, dy, NW, n, in, 1e-5f);
        else b->add(b, dx, dy, (size_t)n * in), b->rmsnorm(b, on, dx, NW, n, in, 1e-5f);
        res[k][4] = download(b, dx, (size_t)n * in), res[k][5] = download(b, on, (size_t)n * in);
        if (k == GPU) {   // out aliasing y (as the forward pass calls it): the same values
            void *dx2 = upload(b, x, n, in), *dy2 = upload(b, y, n, in);
            b->add_rmsnorm(b, dy2, dx2, dy2, NW, n, in, 1e-5f);
            res[k][6] = download(b, dy2, (size_t)n * in);
            b->free(b, dx2), b->free(b, dy2);
        } else res[k][6] = download(b, on, (size_t)n * in);
        b->free(b, h), b->free(b, dx), b->free(b, dy), b->free(b, on);
        for (int j = 0; j < 3; j++) {   // views before the fused weight
            b->weight_free(b, W[j]);
            if (B[j]) b->weight_free(b, B[j]);
        }
        b->weight_free(b, G), b->weight_free(b, U), b->weight_free(b, NW);
        if (F1) b->weight_free(b, F1), b->weight_free(b, F2);
    }
    char shape[96];
    const char *names[] = {"fused qkv: q", "fused qkv: k", "fused qkv: v"};
    for (int j = 0; j < 3; j++) {
        snprintf(shape, sizeof shape, "(%d x %d) @ (%d|%d|%d x %d)^T%s", n, in, qd, kvd, kvd, in,
                 bias ? " + bias" : "");
        report(names[j], shape, res[GPU][j], res[CPU][j], (size_t)n * o[j], TOL);
    }
    snprintf(shape, sizeof shape, "(%d x %d) @ (%d|%d x %d)^T", n, in, f, f, in);
    report("swiglu_matmul", shape, res[GPU][3], res[CPU][3], (size_t)n * f, TOL);
    snprintf(shape, sizeof shape, "n %d, d %d", n, in);
    report("add_rmsnorm: x", shape, res[GPU][4], res[CPU][4], (size_t)n * in, TOL);
    report("add_rmsnorm: out", shape, res[GPU][5], res[CPU][5], (size_t)n * in, TOL);
    report("add_rmsnorm: out = y", shape, res[GPU][6], res[CPU][6], (size_t)n * in, TOL);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 7; j++) free(res[k][j]);
    for (int j = 0; j < 3; j++) free(w[j]), free(bv[j]);
    free(wg), free(wu), free(x), free(y), free(nw);
}

static void test_rope(backend *bk[2], int n, int heads, int hd, enum rope_style style, int pos0) {
    int *pos = xmalloc((size_t)n * sizeof(int)), *idx = iota(n);
    float *inv = xmalloc((size_t)hd / 2 * sizeof(float));
    for (int i = 0; i < n; i++) pos[i] = pos0 + i * 37;
    for (int j = 0; j < hd / 2; j++) inv[j] = powf(500000.0f, -2.0f * j / hd);
    op_ctx c = {.n = n, .i = heads, .d = hd, .pos = pos, .idx = idx, .inv_freq = inv, .style = style};
    float *x = rand_host((size_t)n * heads * hd, 2);
    char shape[64];
    snprintf(shape, sizeof shape, "%s n %d, %d heads, hd %d, pos %d+", style ? "NEOX" : "NORM", n,
             heads, hd, pos0);
    check_op(bk, "rope", shape, op_rope, &c, &x, (const int[][2]){{n, heads * hd}}, 1, n, heads * hd);
    free(x), free(pos), free(idx), free(inv);
}

static void test_elementwise(backend *bk[2], int n, int d) {
    int *idx = iota(n);
    op_ctx c = {.n = n, .d = d, .idx = idx};
    float *in[2] = {rand_host((size_t)n * d, 6), rand_host((size_t)n * d, 2)};
    char shape[64];
    snprintf(shape, sizeof shape, "%d x %d", n, d);
    check_op(bk, "swiglu", shape, op_swiglu, &c, in, (const int[][2]){{n, d}, {n, d}}, 2, n, d);
    check_op(bk, "add", shape, op_add, &c, in, (const int[][2]){{n, d}, {n, d}}, 2, n, d);
    free(in[0]), free(in[1]), free(idx);
}

static void test_gather(backend *bk[2], int rows, int d, int k) {
    int *idx = xmalloc((size_t)k * sizeof(int));
    for (int j = 0; j < k; j++) idx[j] = (j * 5 + rows - 1) % rows;   // repeats, any order
    op_ctx c = {.n = k, .d = d, .idx = idx};
    float *x = rand_host((size_t)rows * d, 1);
    char shape[64];
    snprintf(shape, sizeof shape, "%d of %d rows, d %d", k, rows, d);
    check_op(bk, "gather_rows", shape, op_gather, &c, &x, (const int[][2]){{rows, d}}, 1, k, d);
    free(x), free(idx);
}

// ---- KV cache and attention --------------------------------------------------------------------

typedef struct attn_case {
    const char *label;
    int heads, nkv, hd;
    int len, gap;        // entries appended (two calls), at positions 0, gap, 2 gap, ...
    int keep;            // > 0: then keep this many per KV head (different per head), append 2 more
    int n, qpos0, qstep; // query rows at positions qpos0 + qstep * i
    int trap;            // 1: keys some query must not see get values 64x as large: even at an
                         // average softmax weight (1/len) one such key let through moves that
                         // query's output (an average of ~len random values, norm ~1/sqrt(len))
                         // far past the tolerance
} attn_case;

static void *kv_mem_alloc(void *ctx, size_t n) {
    backend *b = ctx;
    return b->alloc(b, n);
}

static void kv_mem_free(void *ctx, void *p) {
    backend *b = ctx;
    b->free(b, p);
}

// The layer after appends (and keeps), and the host inputs that made it (same on both).
static kv_cache *build_cache(backend *b, const attn_case *t, const float *k, const float *v,
                             const int *keep_idx) {
    char err[200];
    int cap = t->len + 8, kvd = t->nkv * t->hd, first = t->len / 3;
    kv_cache *kv = kv_create(1, t->nkv, t->hd, &cap, b->elem_bytes, kv_mem_alloc, kv_mem_free, b,
                             err, sizeof err);
    CHECK_INTERNAL(kv, "%s", err);
    kv_layer *L = &kv->layers[0];
    int *pos = xmalloc((size_t)(t->len + 2) * sizeof(int));
    for (int j = 0; j < t->len + 2; j++) pos[j] = j * t->gap;
    for (int part = 0; part < 2; part++) {   // two appends: the second lands at len > 0
        int at = part ? first : 0, n = part ? t->len - first : first;
        void *dk = upload(b, k + (size_t)at * kvd, n, kvd), *dv = upload(b, v + (size_t)at * kvd, n, kvd);
        b->kv_append(b, L, dk, dv, pos + at, n);
        b->free(b, dk), b->free(b, dv);
    }
    if (t->keep) {
        b->kv_keep(b, L, keep_idx, t->keep, t->keep + 4);
        pos[t->len] = t->len * t->gap + 1, pos[t->len + 1] = t->len * t->gap + 2;
        void *dk = upload(b, k + (size_t)t->len * kvd, 2, kvd), *dv = upload(b, v + (size_t)t->len * kvd, 2, kvd);
        b->kv_append(b, L, dk, dv, pos + t->len, 2);
        b->free(b, dk), b->free(b, dv);
    }
    free(pos);
    return kv;
}

// The first len entries of every KV head of buffer p (n_kv_head, cap, hd), host.
static float *kv_rows(backend *b, const kv_layer *L, const void *p) {
    size_t per = (size_t)L->len * L->head_dim, all = (size_t)L->n_kv_head * L->cap * L->head_dim;
    float *full = download(b, p, all), *out = xmalloc((per ? per : 1) * L->n_kv_head * sizeof(float));
    for (int g = 0; g < L->n_kv_head; g++)
        memcpy(out + g * per, full + (size_t)g * L->cap * L->head_dim, per * sizeof(float));
    free(full);
    return out;
}

// A kernel the CUDA backend runs for a case (attn_cuda.h), and the tunables that make it run.
typedef struct attn_kernel {
    const char *name;
    int prefill, smem_optin;   // tunables' attn_prefill and cuda_smem_optin
} attn_kernel;
#define SPLIT_MAX_ROWS 16   // attn_cuda.cu: up to this many query rows run a decode kernel
#define SM86_OPTIN 101376   // 99 KiB: a block's shared memory at most on compute capability 8.6, 8.9

// The kernels for case t, each with its tunables (at most 3): prefill at head dims 64 and 128
// fa2w, fa2 (at 128: a block's shared memory as on compute capability 8.6) and wg; flash at any
// other; decode group at 64, 128 and 256, split at any other.
static int attn_kernels(const attn_case *t, attn_kernel *k) {
    const int hd = t->hd, tc = hd == 64 || hd == 128;
    if (t->n <= SPLIT_MAX_ROWS)
        return k[0] = (attn_kernel){tc || hd == 256 ? "group" : "split", 0, 0}, 1;
    if (!tc) return k[0] = (attn_kernel){"flash", 0, 0}, 1;
    int n = 0;
    k[n++] = (attn_kernel){"fa2w", TUN_ATTN_FA2W, 0};
    if (hd == 128) k[n++] = (attn_kernel){"fa2", TUN_ATTN_FA2W, SM86_OPTIN};
    k[n++] = (attn_kernel){"wg", TUN_ATTN_WG, 0};
    return n;
}

// Sets the tunables that run kernel k (tunables_edit); returns what they were.
static attn_kernel attn_kernel_set(attn_kernel k) {
    sift_tunables *tn = tunables_edit();
    attn_kernel was = {NULL, tn->attn_prefill, tn->cuda_smem_optin};
    tn->attn_prefill = k.prefill, tn->cuda_smem_optin = k.smem_optin;
    return was;
}

static void test_attention(backend *bk[2], const attn_case *t) {
    // each case's data from its own seed: a check added elsewhere must not change what the
    // trap cases draw (a leaked key's effect depends on the draw)
    rng_state = 1;
    for (const char *c = t->label; *c; c++) rng_state = rng_state * 131 + (unsigned char)*c;
    int kvd = t->nkv * t->hd, qd = t->heads * t->hd, total = t->len + 2;
    float *k = rand_host((size_t)total * kvd, 2), *v = rand_host((size_t)total * kvd, 1);
    float *q = rand_host((size_t)t->n * qd, 2);
    int *idx = xmalloc((size_t)(t->keep ? t->keep : 1) * t->nkv * sizeof(int));
    for (int g = 0; g < t->nkv && t->keep; g++)
        for (int j = 0; j < t->keep; j++) idx[g * t->keep + j] = g + j * ((t->len - g) / t->keep);
    int *qpos = xmalloc((size_t)t->n * sizeof(int)), qmin = t->qpos0;
    for (int i = 0; i < t->n; i++) qpos[i] = t->qpos0 + t->qstep * i, qmin = qpos[i] < qmin ? qpos[i] : qmin;
    for (int j = 0; t->trap && j < total; j++) {   // positions as build_cache gives them
        int p = j < t->len ? j * t->gap : t->len * t->gap + 1 + (j - t->len);
        for (int c = 0; p > qmin && c < kvd; c++)
            v[(size_t)j * kvd + c] *= 64;
    }
    attn_kernel vars[3], was = {0};
    const int n_var = attn_kernels(t, vars);
    float *kc[2], *vc[2], *out[2][3], *pr[2][2];
    int len = 0, m[2], *posr[2];
    for (int b = 0; b < 2; b++) {
        backend *B = bk[b];
        kv_cache *kv = build_cache(B, t, k, v, idx);
        kv_layer *L = &kv->layers[0];
        len = L->len;
        kc[b] = kv_rows(B, L, L->k), vc[b] = kv_rows(B, L, L->v);
        posr[b] = xmalloc((size_t)(len ? len : 1) * t->nkv * sizeof(int));
        for (int g = 0; g < t->nkv; g++)
            memcpy(posr[b] + (size_t)g * len, L->pos + (size_t)g * L->cap, (size_t)len * sizeof(int));
        void *dq = upload(B, q, t->n, qd), *o = B->alloc(B, (size_t)t->n * qd);
        for (int w = 0; w < (b == GPU ? n_var : 1); w++) {   // the CPU twin once, each GPU kernel
            was = attn_kernel_set(vars[w]);
            poison(B, o, t->n, qd);
            B->attention(B, o, dq, qpos, t->n, t->heads, L);
            out[b][w] = download(B, o, (size_t)t->n * qd);
            attn_kernel_set(was);
        }
        m[0] = len, m[1] = len / 2;
        for (int w = 0; w < 2; w++) {
            size_t np = (size_t)t->n * t->heads * m[w];
            pr[b][w] = xmalloc((np ? np : 1) * sizeof(float));
            for (size_t i = 0; i < np; i++) pr[b][w][i] = NAN;
            B->attn_probs(B, pr[b][w], dq, qpos, t->n, t->heads, L, m[w]);
        }
        B->free(B, dq), B->free(B, o);
        kv_free(kv);
    }
    const char *shape = t->label;
    size_t kvn = (size_t)len * kvd, rows = (size_t)t->n * t->heads;
    float same = memcmp(posr[GPU], posr[CPU], (size_t)len * t->nkv * sizeof(int)) == 0, one = 1;
    report("kv positions (host)", shape, &same, &one, 1, 0);
    report_rows(t->keep ? "kv_append+kv_keep K" : "kv_append K", shape, kc[GPU], kc[CPU], kvn, len * t->nkv, TOL);
    report_rows(t->keep ? "kv_append+kv_keep V" : "kv_append V", shape, vc[GPU], vc[CPU], kvn, len * t->nkv, TOL);
    for (int w = 0; w < n_var; w++) {
        char name[40];
        snprintf(name, sizeof name, "attention [%s]", vars[w].name);
        report_rows(name, shape, out[GPU][w], out[CPU][0], rows * t->hd, rows, TOL);
    }
    for (int w = 0; w < 2; w++) {
        char s2[120];
        snprintf(s2, sizeof s2, "%s, m %d", t->label, m[w]);
        report_rows("attn_probs", s2, pr[GPU][w], pr[CPU][w], rows * m[w], rows, TOL);
    }
    for (int b = 0; b < 2; b++) {
        for (int w = 0; w < (b == GPU ? n_var : 1); w++) free(out[b][w]);
        free(kc[b]), free(vc[b]), free(pr[b][0]), free(pr[b][1]), free(posr[b]);
    }
    free(k), free(v), free(q), free(idx), free(qpos);
}

// fp32 / int32 buffers of backend memory, as raw 4-byte words (ints_to_host / ints_from_host)
static void *words_up(backend *b, const void *host, size_t n) {
    size_t e = b->elem_bytes;
    void *d = b->alloc(b, (n * 4 + e - 1) / e + 1);
    CHECK_INTERNAL(d, "out of memory for %zu words", n);
    b->ints_from_host(b, d, host, n);
    return d;
}
static void words_down(backend *b, void *host, const void *d, size_t n) { b->ints_to_host(b, host, d, n); }

// ---- topk+phi: phi_summarize and attn_select -------------------------------------------------

// Maps of one layer: random MLP blocks (weights ~ 1/sqrt(fan-in), ReZero alpha 0.5) or random
// features.
static phi_maps *test_maps(int kind, int heads, int nkv, int hd, int f) {
    if (kind == PHI_PRF) return phi_maps_prf(1, heads, nkv, hd, f, 0xF00D);
    phi_maps *p = phi_maps_mlp(1, heads, nkv, hd, hd, 2 * hd, f);
    size_t np = (size_t)phi_n_par(p);
    float *blocks[2] = {p->q, p->k};
    int counts[2] = {heads, nkv};
    for (int w = 0; w < 2; w++)
        for (int b = 0; b < counts[w]; b++) {
            float *par = blocks[w] + b * np;
            for (size_t i = 0; i < np; i++) par[i] = urand() * 0.5f / sqrtf((float)hd);
            par[5 * hd * hd + 4 * hd] = 0.5f;   // alpha: after ws, bs, w1, b1, w2, b2 (phi.h)
        }
    return p;
}

static void test_phi_select(backend *bk[2], int kind, int heads, int nkv, int hd, int f, int len,
                            int n_sub, int n_extra) {
    attn_case t = {"phi", heads, nkv, hd, len, 1, 0, 1, len, 1, 0};
    int kvd = nkv * hd, lo = 4, hi = len - 8, n_sel = n_sub + n_extra;
    float *k = rand_host((size_t)(len + 2) * kvd, 2), *v = rand_host((size_t)(len + 2) * kvd, 1);
    float *q = rand_host((size_t)heads * hd, 2);
    phi_maps *p = test_maps(kind, heads, nkv, hd, f);
    int *sel = xmalloc((size_t)heads * n_sel * sizeof(int)), step = (hi - lo) / (n_sub ? n_sub : 1);
    for (int h = 0; h < heads; h++)   // n_sub distinct mid entries, then anchors outside [lo, hi)
        for (int j = 0; j < n_sel; j++) {
            int e = j - n_sub;
            sel[h * n_sel + j] = e < 0 ? lo + (h * 31 + j * step) % (hi - lo) : e < lo ? e : hi + (e - lo);
        }
    float *sum[2], *y[2][2];
    size_t np = (size_t)phi_n_par(p), flat = phi_summary_flat(nkv, f, hd);
    for (int b = 0; b < 2; b++) {
        backend *B = bk[b];
        kv_cache *kv = build_cache(B, &t, k, v, NULL);
        kv_layer *L = &kv->layers[0];
        phi_summary *s = xmalloc((size_t)nkv * sizeof *s);
        for (int g = 0; g < nkv; g++) s[g] = phi_summary_alloc(f, hd);
        float *dpq = words_up(B, p->q, (size_t)heads * np), *dpk = words_up(B, p->k, (size_t)nkv * np);
        float *ds = words_up(B, p->k, flat);   // (any words: the summaries overwrite them)
        B->phi_summarize(B, s, ds, p, dpk, 0, L, lo, hi);
        sum[b] = xmalloc(flat * sizeof(float));   // the flat layout, as the backend holds it
        words_down(B, sum[b], ds, flat);
        for (int g = 0; g < nkv; g++)
            if (s[g].n != hi - lo) n_fail++, printf("| phi_summarize n | %d entries, not %d |||||\n", s[g].n, hi - lo);
        phi_completion comp = {p, 0, s, dpq, dpk, ds};
        void *dq = upload(B, q, 1, heads * hd);
        for (int c = 0; c < 2; c++) {
            void *o = B->alloc(B, (size_t)heads * hd);
            poison(B, o, 1, heads * hd);
            B->attn_select(B, o, dq, heads, L, sel, n_sel, n_sub, c ? &comp : NULL);
            y[b][c] = download(B, o, (size_t)heads * hd);
            B->free(B, o);
        }
        B->free(B, dq), B->free(B, dpq), B->free(B, dpk), B->free(B, ds);
        for (int g = 0; g < nkv; g++) phi_summary_free(&s[g]);
        free(s);
        kv_free(kv);
    }
    char shape[120];
    snprintf(shape, sizeof shape, "%s %d/%d hd%d phi%d len%d K%d", kind == PHI_MLP ? "mlp" : "prf",
             heads, nkv, hd, f, len, n_sub);
    report("phi_summarize m,u,T", shape, sum[GPU], sum[CPU], flat, TOL);
    report("attn_select", shape, y[GPU][0], y[CPU][0], (size_t)heads * hd, TOL);
    report("attn_select + phi", shape, y[GPU][1], y[CPU][1], (size_t)heads * hd, TOL);
    for (int b = 0; b < 2; b++) free(sum[b]), free(y[b][0]), free(y[b][1]);
    phi_maps_free(p);
    free(k), free(v), free(q), free(sel);
}


// attn_topk_step (topk's decode step) on the GPU against the CPU twin: the mid region
// [sink, sink + n) of a len-entry cache, the tail after it. The selections: levels > 0, the keys
// take only that many distinct rows, so whole groups of entries tie exactly and the tie rule
// (lower index first) decides, and the sets must be equal; levels 0, random keys, near-ties can
// fall either way in fp32, so >= 99 % of the indices must agree. The attention: the GPU's output
// against the CPU's attn_select over the GPU's own selection and the anchors (the same set:
// TOL). The read counts: the GPU's against the union of the GPU's selections counted here.
// kind (PHI_PRF, PHI_MLP; 0 none): topk+phi, completed from each backend's summaries of the mid
// region under test_maps with d_phi f (the CPU's reference: attn_select with its completion).
// P > 0: the page selector (pages of P, `read` of them scored; keys and queries rounded to bf16
// first, so that both backends bound the same values), its bytes (in K rows) against the CPU's;
// hot > 0: the keys of `hot` pages (the last, partial one among them) point along their group's
// queries, so they hold every head's exhaustive top k and have the largest bounds: the paged
// selection must be the exact selector's on each backend, index for index.
static void test_attn_topk_step(backend *bk[2], int heads, int nkv, int hd, int len, int sink, int n,
                                int k, int levels, int kind, int f, int P, int read, int hot) {
    attn_case t = {"topk", heads, nkv, hd, len, 1, 0, 1, len, 1, 0};
    int kvd = nkv * hd, group = heads / nkv, tail = len - sink - n, n_sel = k + sink + tail;
    int np = P ? (n + P - 1) / P : 0;
    float *k_ = rand_host((size_t)(len + 2) * kvd, 2), *v = rand_host((size_t)(len + 2) * kvd, 1);
    float *q = rand_host((size_t)heads * hd, 2);
    for (int i = 0; levels && i < len + 2; i++)   // row i repeats row i % levels
        memcpy(k_ + (size_t)i * kvd, k_ + (size_t)(i % levels) * kvd, (size_t)kvd * sizeof(float));
    for (int h = 0; h < hot; h++) {   // pages np - 1, then 1, 3, 5, ...: group-aligned keys
        int pg = h == 0 ? np - 1 : 2 * h - 1;
        for (int j = sink + pg * P; j < sink + (pg + 1) * P && j < sink + n; j++)
            for (int g = 0; g < nkv; g++)
                for (int c = 0; c < hd; c++) {
                    float m = 0;
                    for (int i = g * group; i < (g + 1) * group; i++) m += q[(size_t)i * hd + c];
                    k_[(size_t)j * kvd + g * hd + c] = 20 * m / group + 0.1f * k_[(size_t)j * kvd + g * hd + c];
                }
    }
    for (size_t i = 0; P && i < (size_t)(len + 2) * kvd; i++) k_[i] = bf16_round(k_[i]);
    for (size_t i = 0; P && i < (size_t)heads * hd; i++) q[i] = bf16_round(q[i]);
    int *idx[2], *exact[2], *sel = xmalloc(((size_t)heads * n_sel + 1) * sizeof(int));
    float *y[2], *ref = NULL;
    double stats[2][4];
    size_t krow[2];
    float *bounds[2] = {NULL, NULL};   // (nkv, np, 2, hd) as fp32
    phi_maps *p = kind ? test_maps(kind, heads, nkv, hd, f) : NULL;
    size_t npar = p ? (size_t)phi_n_par(p) : 0, flat = p ? phi_summary_flat(nkv, f, hd) : 0;
    for (int i = 0; i < 2; i++) {   // the GPU first: the CPU's reference reads its selection
        int b = i ? CPU : GPU;
        backend *B = bk[b];
        kv_cache *kv = build_cache(B, &t, k_, v, NULL);
        const kv_layer *L = &kv->layers[0];
        krow[b] = L->k_row;
        void *dq = upload(B, q, 1, heads * hd), *o = B->alloc(B, (size_t)heads * hd);
        poison(B, o, 1, heads * hd);
        idx[b] = xmalloc(((size_t)heads * k + 1) * sizeof(int));
        exact[b] = xmalloc(((size_t)heads * k + 1) * sizeof(int));
        for (int i = 0; i < heads * k; i++) idx[b][i] = -1;
        const double zero[8] = {0};
        void *di = words_up(B, idx[b], (size_t)heads * k), *ds = words_up(B, zero, 8);
        void *de = words_up(B, idx[b], (size_t)heads * k), *dbound = NULL;
        topk_pages pg = {0};
        if (P) {   // the bounds, as topk builds them at attach
            size_t bytes = (size_t)nkv * pages_bytes(L->k_type, n, P, hd);
            int *zeros = xcalloc(bytes / 4 + 1, sizeof(int));
            dbound = words_up(B, zeros, bytes / 4 + 1);
            free(zeros);
            B->kv_pages_build(B, dbound, L, sink, n, P);
            pg = (topk_pages){dbound, pages_bound_type(L->k_type), P, np, read, NULL, NULL, NULL};
            char *hb = xmalloc(bytes + 4);
            words_down(B, hb, dbound, bytes / 4 + 1);
            bounds[b] = xmalloc((size_t)nkv * np * 2 * hd * sizeof(float));
            kv_rows_decode(pg.type, bounds[b], hb, nkv * np * 2, hd);
            free(hb);
        }
        phi_summary *sum = NULL;
        phi_completion comp = {p, 0, NULL, NULL, NULL, NULL};
        if (p) {   // the mid region's summaries, as topk+phi builds them
            sum = xmalloc((size_t)nkv * sizeof *sum);
            for (int g = 0; g < nkv; g++) sum[g] = phi_summary_alloc(f, hd);
            comp.sum = sum, comp.par_q = words_up(B, p->q, (size_t)heads * npar);
            comp.par_k = words_up(B, p->k, (size_t)nkv * npar), comp.dsum = words_up(B, p->k, flat);
            B->phi_summarize(B, sum, (float *)comp.dsum, p, comp.par_k, 0, L, sink, sink + n);
        }
        if (P)   // the exact selector alone, to compare with
            B->attn_topk_step(B, NULL, de, NULL, dq, len, heads, L, sink, n, k, NULL, NULL);
        B->attn_topk_step(B, o, di, ds, dq, len, heads, L, sink, n, k, P ? &pg : NULL, p ? &comp : NULL);
        words_down(B, idx[b], di, (size_t)heads * k);
        words_down(B, exact[b], P ? de : di, (size_t)heads * k);
        words_down(B, stats[b], ds, 8);
        y[b] = download(B, o, (size_t)heads * hd);
        if (b == CPU) {   // the CPU's attention over the GPU's selection and the anchors
            for (int h = 0; h < heads; h++) {
                int *e = sel + (size_t)h * n_sel, j = k;
                memcpy(e, idx[GPU] + (size_t)h * k, (size_t)k * sizeof(int));
                for (int i = 0; i < sink; i++) e[j++] = i;
                for (int i = sink + n; i < len; i++) e[j++] = i;
            }
            poison(B, o, 1, heads * hd);
            B->attn_select(B, o, dq, heads, L, sel, n_sel, k, p ? &comp : NULL);
            ref = download(B, o, (size_t)heads * hd);
        }
        if (p) {
            B->free(B, (void *)comp.par_q), B->free(B, (void *)comp.par_k), B->free(B, (void *)comp.dsum);
            for (int g = 0; g < nkv; g++) phi_summary_free(&sum[g]);
            free(sum);
        }
        if (dbound) B->free(B, dbound);
        B->free(B, di), B->free(B, de), B->free(B, ds), B->free(B, o), B->free(B, dq);
        kv_free(kv);
    }
    int same = 0, ascending = 1, inside = 1;   // sets compared by merging (both ascending)
    for (int h = 0; h < heads; h++) {
        const int *g = idx[GPU] + (size_t)h * k, *w = idx[CPU] + (size_t)h * k;
        for (int i = 0; i < k; i++) inside &= g[i] >= sink && g[i] < sink + n && (i == 0 || g[i] > g[i - 1]);
        for (int i = 1; i < k; i++) ascending &= w[i] > w[i - 1];
        for (int i = 0, j = 0; i < k && j < k;)
            if (g[i] == w[j]) same++, i++, j++;
            else if (g[i] < w[j]) i++;
            else j++;
    }
    double reads = 0;   // the GPU's selection's exact reads, counted here
    for (int g = 0; g < nkv && inside; g++) reads += score_union_count(idx[GPU] + (size_t)g * group * k, group, k) + len - n;
    char shape[140];
    snprintf(shape, sizeof shape, "%d/%d hd%d len%d [%d,+%d) k%d %s%s", heads, nkv, hd, len, sink, n, k,
             levels ? "ties" : hot ? "hot pages" : "random", !p ? "" : kind == PHI_MLP ? " +phi mlp" : " +phi prf");
    if (P) snprintf(shape + strlen(shape), sizeof shape - strlen(shape), " pages %d of %d x%d", read, np, P);
    float agree = k ? (float)same / (heads * k) : 1, need = levels ? 1.0f : 0.99f, one = 1;
    float pass = ascending && inside && agree >= need;
    report("attn_topk (share agreeing)", shape, &pass, &one, 1, 0);
    if (!pass) printf("|   %.4f of the indices agree (need %.2f), ascending %d, inside %d |||||\n", agree, need,
                      ascending, inside);
    if (hot) {   // where the pages hold the exhaustive top k: the exact selector's own choice
        float held = 1;
        for (int b = 0; b < 2; b++)
            held = held && memcmp(idx[b], exact[b], (size_t)heads * k * sizeof(int)) == 0;
        report("attn_topk pages = exact (hot pages)", shape, &held, &one, 1, 0);
    }
    if (P)   // the same bf16 keys: the GPU's bf16 bounds are the CPU's fp32 ones exactly
        report("kv_pages_build bounds", shape, bounds[GPU], bounds[CPU], (size_t)nkv * np * 2 * hd, 0);
    report("attn_topk_step out", shape, y[GPU], ref, (size_t)heads * hd, TOL);
    float counts[2][4] = {{(float)stats[GPU][0], (float)stats[GPU][1], (float)stats[GPU][2],
                           (float)(stats[GPU][3] / krow[GPU])},
                          {(float)reads, (float)len * nkv, 1, (float)(stats[CPU][3] / krow[CPU])}};
    report("attn_topk_step reads", shape, counts[0], counts[1], 4, 0);
    for (int b = 0; b < 2; b++) free(idx[b]), free(exact[b]), free(y[b]), free(bounds[b]);
    free(ref), free(sel), free(k_), free(v), free(q);
    phi_maps_free(p);
}

// The window scoring of fastkv and snapkv (backend.h: window_scores, score_group_sum,
// score_select, kv_keep_at): w query rows at the end of a len-entry cache. The scores and group
// sums against the CPU's (the probabilities come from bf16 keys: TOL); the selection run on the
// GPU over the CPU's scores must be the CPU's exactly (levels > 0: the keys take only that many
// distinct rows, so whole plateaus tie and the lower-index rule decides); the kept cache's
// positions must be the CPU's, and attention over it the CPU's within TOL.
static void test_window_select(backend *bk[2], int heads, int nkv, int hd, int len, int w, int b,
                               int kernel, int avg, int levels) {
    attn_case t = {"window", heads, nkv, hd, len, 1, 0, w, len - w, 1, 0};
    int kvd = nkv * hd, c = len - w;
    float *k_ = rand_host((size_t)(len + 2) * kvd, 2), *v = rand_host((size_t)(len + 2) * kvd, 1);
    float *q = rand_host((size_t)w * heads * hd, 2);
    for (int i = 0; levels && i < len + 2; i++)
        memcpy(k_ + (size_t)i * kvd, k_ + (size_t)(i % levels) * kvd, (size_t)kvd * sizeof(float));
    int *qpos = xmalloc((size_t)w * sizeof(int));
    for (int i = 0; i < w; i++) qpos[i] = c + i;
    float *sc[2], *gs[2], *att[2];
    int *idx[2], *pos[2];
    for (int be = 0; be < 2; be++) {
        backend *x = bk[be];
        kv_cache *kv = build_cache(x, &t, k_, v, NULL);
        kv_layer *L = &kv->layers[0];
        void *dq = upload(x, q, w, heads * hd);
        sc[be] = xmalloc((size_t)heads * c * sizeof(float)), gs[be] = xmalloc((size_t)nkv * c * sizeof(float));
        idx[be] = xmalloc((size_t)nkv * b * sizeof(int));
        void *ds = words_up(x, sc[be], (size_t)heads * c), *dg = words_up(x, gs[be], (size_t)nkv * c);
        void *di = words_up(x, idx[be], (size_t)nkv * b);
        x->window_scores(x, ds, dq, qpos, w, heads, L, len, c, kernel, avg);
        words_down(x, sc[be], ds, (size_t)heads * c);
        x->score_group_sum(x, dg, ds, heads, nkv, c);
        words_down(x, gs[be], dg, (size_t)nkv * c);
        // the selection over the CPU's group sums (exact), then the keep by those indices
        if (be == GPU) x->ints_from_host(x, dg, (const int *)gs[CPU], (size_t)nkv * c);
        x->score_select(x, di, b, dg, nkv, c, b - w, w);
        words_down(x, idx[be], di, (size_t)nkv * b);
        size_t rows = (size_t)nkv * (b + 4), e = x->elem_bytes;
        void *nk = x->alloc(x, (rows * L->k_row + e - 1) / e), *nv = x->alloc(x, (rows * L->v_row + e - 1) / e);
        void *ok = L->k, *ov = L->v;
        x->kv_keep_at(x, L, di, b, b + 4, nk, nv);
        x->free(x, ok), x->free(x, ov);
        if (L->pos_stale) x->kv_pos_sync(x, L);
        pos[be] = xmalloc((size_t)nkv * b * sizeof(int));
        for (int g = 0; g < nkv; g++) memcpy(pos[be] + g * b, L->pos + (size_t)g * L->cap, b * sizeof(int));
        void *dout = x->alloc(x, (size_t)w * heads * hd);
        x->attention(x, dout, dq, qpos, w, heads, L);   // over the kept entries
        att[be] = download(x, dout, (size_t)w * heads * hd);
        x->free(x, dout), x->free(x, dq), x->free(x, ds), x->free(x, dg), x->free(x, di);
        kv_free(kv);
    }
    char shape[120];
    snprintf(shape, sizeof shape, "%d/%d hd%d len%d w%d keep%d %s%d %s", heads, nkv, hd, len, w, b,
             avg ? "avg" : "max", kernel, levels ? "ties" : "random");
    report("window_scores", shape, sc[GPU], sc[CPU], (size_t)heads * c, TOL);
    report("score_group_sum", shape, gs[GPU], gs[CPU], (size_t)nkv * c, TOL);
    float same = memcmp(idx[GPU], idx[CPU], (size_t)nkv * b * sizeof(int)) == 0, one = 1;
    report("score_select (exact)", shape, &same, &one, 1, 0);
    float kept = memcmp(pos[GPU], pos[CPU], (size_t)nkv * b * sizeof(int)) == 0;
    report("kv_keep_at positions (exact)", shape, &kept, &one, 1, 0);
    report("attention over kv_keep_at", shape, att[GPU], att[CPU], (size_t)w * heads * hd, TOL);
    for (int be = 0; be < 2; be++) free(sc[be]), free(gs[be]), free(idx[be]), free(pos[be]), free(att[be]);
    free(k_), free(v), free(q), free(qpos);
}

// SpecPrefill's scoring (backend.h: window_scores over every key of one query row, then
// score_fold_max): `layers` layers of one query row (each a different query against a
// len-entry cache; the row at position len + 2, a lookahead row, sees every key), folded into the
// max over layers and heads and at the last layer into the sum, whose start is random (earlier
// rows'). score_fold_max alone, over the CPU's pooled scores, must give the CPU's maxima and sums
// exactly (a max and one addition per entry); the whole row within TOL (bf16 keys).
static void test_spec_fold(backend *bk[2], int heads, int nkv, int hd, int len, int kernel,
                           int layers) {
    attn_case t = {"fold", heads, nkv, hd, len, 1, 0, 1, len + 2, 1, 0};
    int kvd = nkv * hd;
    float *k_ = rand_host((size_t)(len + 2) * kvd, 2), *v = rand_host((size_t)(len + 2) * kvd, 1);
    float *q = rand_host((size_t)layers * heads * hd, 2), *start = rand_host((size_t)len, 1);
    int qpos = len + 2;
    float *pooled[2][8], *sum[2], *rmax[2], *exact_sum[2], *exact_max[2];
    CHECK_INTERNAL(layers >= 1 && layers <= 8, "%d layers", layers);
    for (int be = 0; be < 2; be++) {
        backend *x = bk[be];
        kv_cache *kv = build_cache(x, &t, k_, v, NULL);
        float *zero = xcalloc((size_t)len, sizeof(float));
        float *hp = xcalloc((size_t)heads * len, sizeof(float));
        void *dpool = words_up(x, hp, (size_t)heads * len), *dmax = words_up(x, zero, (size_t)len),
             *dsum = words_up(x, start, (size_t)len);
        for (int l = 0; l < layers; l++) {
            void *dq = upload(x, q + (size_t)l * heads * hd, 1, heads * hd);
            x->window_scores(x, dpool, dq, &qpos, 1, heads, &kv->layers[0], len, len, kernel, 1);
            pooled[be][l] = xmalloc((size_t)heads * len * sizeof(float));
            words_down(x, pooled[be][l], dpool, (size_t)heads * len);
            x->score_fold_max(x, dmax, dsum, dpool, heads, len, l == layers - 1);
            x->free(x, dq);
        }
        sum[be] = xmalloc((size_t)len * sizeof(float)), rmax[be] = xmalloc((size_t)len * sizeof(float));
        words_down(x, sum[be], dsum, (size_t)len), words_down(x, rmax[be], dmax, (size_t)len);
        // the fold alone over the CPU's pooled scores: exact
        x->ints_from_host(x, dmax, (const int *)zero, (size_t)len);
        x->ints_from_host(x, dsum, (const int *)start, (size_t)len);
        for (int l = 0; l < layers; l++) {
            x->ints_from_host(x, dpool, (const int *)pooled[CPU][l], (size_t)heads * len);
            x->score_fold_max(x, dmax, dsum, dpool, heads, len, l == layers - 1);
        }
        exact_sum[be] = xmalloc((size_t)len * sizeof(float)), exact_max[be] = xmalloc((size_t)len * sizeof(float));
        words_down(x, exact_sum[be], dsum, (size_t)len), words_down(x, exact_max[be], dmax, (size_t)len);
        x->free(x, dpool), x->free(x, dmax), x->free(x, dsum);
        free(zero), free(hp);
        kv_free(kv);
    }
    char shape[120];
    snprintf(shape, sizeof shape, "%d/%d hd%d len%d avg%d, %d layers", heads, nkv, hd, len, kernel, layers);
    report("spec fold: pooled row", shape, pooled[GPU][layers - 1], pooled[CPU][layers - 1],
           (size_t)heads * len, TOL);
    report("spec fold: sum over rows", shape, sum[GPU], sum[CPU], (size_t)len, TOL);
    float one = 1, same = memcmp(exact_sum[GPU], exact_sum[CPU], (size_t)len * sizeof(float)) == 0 &&
                          memcmp(exact_max[GPU], exact_max[CPU], (size_t)len * sizeof(float)) == 0;
    float cleared = 1;
    for (int j = 0; j < len; j++) cleared = cleared && rmax[GPU][j] == 0 && exact_max[GPU][j] == 0;
    report("score_fold_max (exact)", shape, &same, &one, 1, 0);
    report("score_fold_max clears the row", shape, &cleared, &one, 1, 0);
    for (int be = 0; be < 2; be++) {
        for (int l = 0; l < layers; l++) free(pooled[be][l]);
        free(sum[be]), free(rmax[be]), free(exact_sum[be]), free(exact_max[be]);
    }
    free(k_), free(v), free(q), free(start);
}

// --self-fault: the second CPU backend's attention lets each query see one position too far
// (an off-by-one mask), so the harness shows that it catches the bug class it exists for.
static void (*cpu_attention)(backend *, void *, const void *, const int *, int, int, const kv_layer *);
static void off_by_one_attention(backend *b, void *out, const void *q, const int *qpos, int n,
                                 int heads, const kv_layer *L) {
    int *p = xmalloc((size_t)(n ? n : 1) * sizeof(int));
    for (int i = 0; i < n; i++) p[i] = qpos[i] + 1;
    cpu_attention(b, out, q, p, n, heads, L);
    free(p);
}

// ---- optional ops ------------------------------------------------------------------------------

// weight_synth on the GPU against synth_uniform on the host (and the CPU op when it exists).
static void test_weight_synth(backend *bk[2], int rows, int cols) {
    backend *g = bk[GPU];
    size_t n = (size_t)rows * cols;
    float *ref = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) ref[i] = 0.25f + 0.5f * synth_uniform(7, 11, i);
    bk_weight *w = g->weight_synth(g, 7, 11, rows, cols, 0.5f, 0.25f);
    int *ids = iota(rows);
    void *o = g->alloc(g, n);
    poison(g, o, rows, cols);
    g->embed(g, o, w, ids, rows, cols);
    float *got = download(g, o, n);
    char shape[64];
    snprintf(shape, sizeof shape, "%d x %d vs host synth_uniform", rows, cols);
    report("weight_synth", shape, got, ref, n, 4e-3);   // bf16 rounding: <= 2^-9 relative
    g->free(g, o);
    g->weight_free(g, w);
    free(ids), free(got), free(ref);
}

static double ceil_tflops, ceil_gbps;   // measured by test_ceilings

static void test_ceilings(backend *bk[2]) {
    double tf = 0, gb = 0;
    int rc = bk[GPU]->ceilings(bk[GPU], &tf, &gb);
    ceil_tflops = tf, ceil_gbps = gb;
    int ok = rc == 0 && tf > 1 && gb > 10;
    printf("| %-22s | %-44s | %9.1f | %9.1f | %9s | %7s | %s |\n", "ceilings TFLOP/s GB/s",
           "bf16 8192^3 GEMM, 1 GiB copy", tf, gb, "-", "-", ok ? "ok" : "FAIL");
    ok ? n_pass++ : n_fail++;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

// Seconds per call of attention (n rows at positions qpos over layer L) with kernel k; the
// stream is drained by a one-element download.
static double time_attention(backend *g, attn_kernel k, void *o, const void *q, const int *qpos,
                             int n, int heads, const kv_layer *L, int reps) {
    attn_kernel was = attn_kernel_set(k);
    float one;
    g->attention(g, o, q, qpos, n, heads, L);   // warm-up (plans, shared-memory opt-in)
    g->to_host(g, &one, o, 1);
    double t0 = now_s();
    for (int r = 0; r < reps; r++) g->attention(g, o, q, qpos, n, heads, L);
    g->to_host(g, &one, o, 1);
    attn_kernel_set(was);
    return (now_s() - t0) / reps;
}

// Attention alone on one layer of the Llama-3.1-8B shape (32 query heads, 8 KV heads, hd 128)
// over a cache of N keys: the prefill kernels on N causal rows (TFLOP/s: 4 heads hd N^2 / 2,
// and the share of the GEMM ceiling) and the decode kernels on one row (GB/s of K and V read,
// and the share of the copy ceiling). Informational rows (bench/RESULTS.md records them).
static void test_attn_speed(backend *bk[2], int N) {
    backend *g = bk[GPU];
    int heads = 32, nkv = 8, hd = 128, kvd = nkv * hd, qd = heads * hd, cap = N;
    char err[200], shape[64];
    kv_cache *kv = kv_create(1, nkv, hd, &cap, g->elem_bytes, kv_mem_alloc, kv_mem_free, g, err,
                             sizeof err);
    snprintf(shape, sizeof shape, "8B layer, %d keys", N);
    if (!kv) {
        printf("| %-22s | %-44s | %9s | %9s | %9s | %7s | skip: %s |\n", "attention speed", shape, "-", "-", "-", "-", err);
        return;
    }
    kv_layer *L = &kv->layers[0];
    float *kh = rand_host((size_t)N * kvd, 2), *vh = rand_host((size_t)N * kvd, 1);
    float *qh = rand_host((size_t)N * qd, 2);
    int *pos = iota(N), last = N;
    void *dk = upload(g, kh, N, kvd), *dv = upload(g, vh, N, kvd), *dq = upload(g, qh, N, qd);
    void *o = g->alloc(g, (size_t)N * qd);
    g->kv_append(g, L, dk, dv, pos, N);
    // fa2w and wg (its A/B on Hopper) on N causal rows, group on one row
    const attn_kernel runs[] = {{"fa2w", TUN_ATTN_FA2W, 0}, {"wg", TUN_ATTN_WG, 0}, {"group", 0, 0}};
    for (size_t w = 0; w < sizeof runs / sizeof *runs; w++) {
        int pf = w < 2;
        double sec = time_attention(g, runs[w], o, dq, pf ? pos : &last, pf ? N : 1, heads, L,
                                    pf ? 3 : 20);
        double rate = pf ? 4.0 * heads * hd * (double)N * N / 2 / sec / 1e12
                         : 2.0 * N * kvd * g->elem_bytes / sec / 1e9;
        double ceil = pf ? ceil_tflops : ceil_gbps;
        char name[40], v1[16], v2[16];
        snprintf(name, sizeof name, "attn %s [%s]", pf ? "prefill" : "decode", runs[w].name);
        snprintf(v1, sizeof v1, pf ? "%.1f TF/s" : "%.0f GB/s", rate);
        snprintf(v2, sizeof v2, "%.0f %%", ceil > 0 ? 100 * rate / ceil : 0.0);
        printf("| %-22s | %-44s | %9s | %9s | %7.3f ms | %7s | info: %s |\n", name, shape, v1, v2,
               sec * 1e3, "-", pf ? "TFLOP/s, % of the GEMM ceiling" : "GB/s of K+V, % of the copy ceiling");
    }
    fflush(stdout);
    g->free(g, dk), g->free(g, dv), g->free(g, dq), g->free(g, o);
    kv_free(kv);
    free(kh), free(vh), free(qh), free(pos);
}

// The decode products on GGUF blocks alone (backend/qmatmul_cuda.cu) at the Llama-3.1-8B layer's
// shapes (in -> out: q|k|v 4096 -> 6144, o 4096 -> 4096, gate|up 4096 -> 28672, down 14336 ->
// 4096): GB/s of weight bytes read and the share of the copy ceiling, each Q4_K shape by the chunk
// and the group kernel (SIFT_CUDA_QGEMV), gate|up also at 8 rows of x, in Q6_K and Q8_0 (both);
// gate|up and down at 64 rows of x (gate|up also 256) by the tile kernel and by dequantisation +
// cuBLASLt (SIFT_CUDA_QGEMM_ROWS=0).
// Informational rows (bench/RESULTS.md records them); the values are checked by test_weight_type.
static void test_qmatmul_speed(backend *bk[2]) {
    backend *g = bk[GPU];
    struct { uint32_t type; int in, out, n; const char *kernel; } runs[] = {
        {GGML_Q4_K, 4096, 6144, 1, "chunk"},  {GGML_Q4_K, 4096, 6144, 1, "group"},
        {GGML_Q4_K, 4096, 4096, 1, "chunk"},  {GGML_Q4_K, 4096, 4096, 1, "group"},
        {GGML_Q4_K, 4096, 28672, 1, "chunk"}, {GGML_Q4_K, 4096, 28672, 1, "group"},
        {GGML_Q4_K, 14336, 4096, 1, "chunk"}, {GGML_Q4_K, 14336, 4096, 1, "group"},
        {GGML_Q4_K, 4096, 28672, 8, "chunk"}, {GGML_Q4_K, 4096, 28672, 8, "group"},
        {GGML_Q6_K, 4096, 28672, 1, "chunk"}, {GGML_Q6_K, 4096, 28672, 1, "group"},
        {GGML_Q8_0, 4096, 28672, 1, "chunk"}, {GGML_Q8_0, 4096, 28672, 1, "group"},
        // 64 rows of x (batched decode): the tile kernel against dequantisation + cuBLASLt
        {GGML_Q4_K, 4096, 28672, 64, "tile"}, {GGML_Q4_K, 4096, 28672, 64, "dq"},
        {GGML_Q4_K, 14336, 4096, 64, "tile"}, {GGML_Q4_K, 14336, 4096, 64, "dq"},
        // 256 rows (QT_ROWS, the tile kernel's limit): where the two paths should cross
        {GGML_Q4_K, 4096, 28672, 256, "tile"}, {GGML_Q4_K, 4096, 28672, 256, "dq"},
    };
    for (size_t k = 0; k < sizeof runs / sizeof *runs; k++) {
        const uint32_t type = runs[k].type;
        const int in = runs[k].in, out = runs[k].out, n = runs[k].n;
        size_t bytes = out * dq_bytes(type, in);
        uint8_t *blocks = xmalloc(bytes);
        CHECK_INTERNAL(synth_blocks(type, blocks, out, in, 7, type, 1.0f / sqrtf((float)in)) == 0, "synth_blocks");
        bk_weight *w = g->weight(g, (bk_tensor){type, blocks, (size_t)out, (size_t)in, 0});
        float *xh = rand_host((size_t)n * in, 1);
        void *x = upload(g, xh, n, in), *o = g->alloc(g, (size_t)n * out);
        sift_tunables *tn = tunables_edit(), was = *tn;
        if (strcmp(runs[k].kernel, "dq") == 0) tn->cuda_qgemm_rows = 0;
        else tn->cuda_qgemv_group = strcmp(runs[k].kernel, "group") == 0;
        float one;
        g->matmul(g, o, x, w, NULL, n, in, out);   // warm-up
        g->to_host(g, &one, o, 1);
        const int reps = 20;
        double t0 = now_s();
        for (int r = 0; r < reps; r++) g->matmul(g, o, x, w, NULL, n, in, out);
        g->to_host(g, &one, o, 1);
        double sec = (now_s() - t0) / reps, gbps = bytes / sec / 1e9;
        *tn = was;
        char name[40], shape[64], v1[16], v2[16];
        snprintf(name, sizeof name, "%s [%s] %s", n <= 16 ? "qgemv" : "qgemm", runs[k].kernel, gguf_type_name(type));
        snprintf(shape, sizeof shape, "(%d x %d) @ (%d x %d)^T, %.1f MB", n, in, out, in, bytes / 1e6);
        snprintf(v1, sizeof v1, "%.0f GB/s", gbps);
        snprintf(v2, sizeof v2, "%.0f %%", ceil_gbps > 0 ? 100 * gbps / ceil_gbps : 0.0);
        printf("| %-22s | %-44s | %9s | %9s | %7.3f ms | %7s | info: %s |\n", name, shape, v1, v2, sec * 1e3,
               "-", "GB/s of weight blocks, % of the copy ceiling");
        fflush(stdout);
        g->free(g, x), g->free(g, o);
        g->weight_free(g, w);
        free(xh), free(blocks);
    }
}

// ---- models and strategies ---------------------------------------------------------------------

typedef struct tiny_shape {
    const char *arch;
    int n_layer, d, heads, nkv, ff, vocab;
} tiny_shape;

static bk_weight *rand_weight(backend *b, size_t rows, size_t cols, float scale, float offset) {
    float *h = xmalloc(rows * cols * sizeof(float));
    for (size_t i = 0; i < rows * cols; i++) h[i] = bf16_round(offset + scale * urand());
    return b->weight(b, bk_f32(h, rows, cols));
}

// A model in memory with seeded random weights: the same values on every backend for one seed.
static model *tiny_model(backend *b, const tiny_shape *t, uint64_t seed) {
    rng_state = seed;
    model *m = xcalloc(1, sizeof *m);
    model_config *c = &m->cfg;
    snprintf(c->arch, sizeof c->arch, "%s", t->arch);
    int qwen = strcmp(t->arch, "qwen2") == 0, hd = t->d / t->heads;
    *c = (model_config){.n_layer = t->n_layer, .d_model = t->d, .n_head = t->heads,
                        .n_kv_head = t->nkv, .head_dim = hd, .d_ff = t->ff, .vocab = t->vocab,
                        .ctx_len = 8192, .rms_eps = 1e-5f, .rope = qwen ? ROPE_NEOX : ROPE_NORM,
                        .qkv_bias = qwen, .tied = 1};
    snprintf(c->arch, sizeof c->arch, "%s", t->arch);
    c->inv_freq = xmalloc((size_t)hd / 2 * sizeof(float));
    for (int j = 0; j < hd / 2; j++) c->inv_freq[j] = powf(10000.0f, -2.0f * j / hd);
    m->bk = b;
    m->name = strdup(qwen ? "tiny-qwen2" : "tiny-llama");
    m->tok_embd = rand_weight(b, t->vocab, t->d, 1, 0);
    m->lm_head = m->tok_embd;
    m->out_norm = rand_weight(b, 1, t->d, 0.1f, 1);
    m->layers = xcalloc((size_t)t->n_layer, sizeof *m->layers);
    size_t d = t->d, q = (size_t)t->heads * hd, kv = (size_t)t->nkv * hd, f = t->ff;
    float sd = 1.7f / sqrtf((float)d);   // uniform(-1, 1) * 1.7 has about unit variance
    for (int l = 0; l < t->n_layer; l++) {
        layer_weights *w = &m->layers[l];
        w->attn_norm = rand_weight(b, 1, d, 0.1f, 1);
        w->wq = rand_weight(b, q, d, sd, 0), w->wk = rand_weight(b, kv, d, sd, 0);
        w->wv = rand_weight(b, kv, d, sd, 0), w->wo = rand_weight(b, d, q, 1.7f / sqrtf((float)q), 0);
        w->ffn_norm = rand_weight(b, 1, d, 0.1f, 1);
        w->w_gate = rand_weight(b, f, d, sd, 0), w->w_up = rand_weight(b, f, d, sd, 0);
        w->w_down = rand_weight(b, d, f, 1.7f / sqrtf((float)f), 0);
        if (qwen)
            w->bq = rand_weight(b, 1, q, 0.5f, 0), w->bk = rand_weight(b, 1, kv, 0.5f, 0),
            w->bv = rand_weight(b, 1, kv, 0.5f, 0);
    }
    model_fuse(m);   // as the loaders do
    return m;
}

static int never_eog(const void *ctx, int id) {
    (void)ctx, (void)id;
    return 0;
}

typedef struct {
    int ids[64], n;
} token_log;

static int log_token(void *ctx, int id) {
    token_log *t = ctx;
    if (t->n < 64) t->ids[t->n++] = id;
    return 0;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

// Share of the CPU cache's kept positions (per layer and KV head, the first len entries) that
// the GPU cache keeps too: the selection strategies' choices, apart from their logits.
static double kept_agreement(const kv_cache *cpu, const kv_cache *gpu) {
    long same = 0, all = 0;
    for (int l = 0; l < cpu->n_layer && l < gpu->n_layer; l++) {
        const kv_layer *a = &cpu->layers[l], *b = &gpu->layers[l];
        for (int g = 0; g < a->n_kv_head; g++) {
            const int *pa = a->pos + (size_t)g * a->cap, *pb = b->pos + (size_t)g * b->cap;
            all += a->len;
            for (int i = 0; i < a->len; i++)   // small caches: a scan is enough
                for (int j = 0; j < b->len; j++)
                    if (pb[j] == pa[i]) {
                        same++;
                        break;
                    }
        }
    }
    return all ? (double)same / all : 1.0;
}

// Strategy s on both models: the last prompt row's logits after prefill; the cache each
// prefill kept; then n_gen - 1 decode steps fed the CPU's greedy tokens on both backends, every
// step's logits compared (the worst step reported); then each backend's own greedy generation.
static void test_strategy(model *m[2], const strategy *s, const int *ids, int n, int n_gen,
                          const char *model_name) {
    strategy_opts so = strategy_opts_default();
    strategy_run run = {.is_eog = never_eog};
    context *cx[2] = {ctx_new(m[CPU], NULL), ctx_new(m[GPU], NULL)};
    // topk, topk+phi: K = 0 (sink + tail, and topk+phi's completion over the rest), so that both
    // backends read the same keys at decode: on these tiny models bf16 scores tie often at the
    // top-K boundary, and a tie taken the other way makes the logits incomparable. The top-K
    // itself is checked in the topk section (attn_topk_step against the CPU twin).
    so.topk = 0;
    char err[512], label[96];
    snprintf(label, sizeof label, "%s, %d tokens", model_name, n);
    if (strategy_check(s, m[CPU], &so, err, sizeof err)) {
        printf("| %-22s | %-44s | %9s | %9s | %9s | %7s | skip: %s |\n", s->name, label, "-", "-", "-", "-", err);
        ctx_free(cx[0]), ctx_free(cx[1]);
        return;
    }
    if (strategy_check(s, m[GPU], &so, err, sizeof err)) {   // runs on the CPU, not here
        printf("| %-22s | %-44s | %9s | %9s | %9s | %7s | FAIL: %s |\n", s->name, label, "-", "-", "-", "-", err);
        n_fail++;
        ctx_free(cx[0]), ctx_free(cx[1]);
        return;
    }
    int vocab = m[CPU]->cfg.vocab;
    float *lg[2], *step[2][64];
    kv_cache *kv[2];
    prefill_info info[2] = {{0}, {0}};
    for (int b = 0; b < 2; b++) {
        lg[b] = xmalloc((size_t)vocab * sizeof(float));
        for (int i = 0; i < vocab; i++) lg[b][i] = NAN;
        kv[b] = strategy_prefill(s, cx[b], ids, n, n_gen, &so, &run, lg[b], &info[b], err, sizeof err);
        CHECK_INTERNAL(kv[b], "%s prefill: %s", s->name, err);
        fwd_kv_pos_sync(m[b], kv[b]);   // the host's positions, where a device keep left them stale
    }
    // Logits are compared only where both backends kept the same entries: a selection on bf16
    // scores may take the other side of a near-tie (the emulator showed fastkv and snapkv doing
    // so on the tiny models), and then the two runs no longer compute the same function.
    double agree = kept_agreement(kv[CPU], kv[GPU]);
    int agree_ok = agree >= 0.9, same_sets = agree == 1.0;   // near-ties may fall either way
    char check[64], differ[96];
    snprintf(differ, sizeof differ, "skip: kept sets differ (%.1f %%), logits not comparable", 100 * agree);
    snprintf(check, sizeof check, "%s logits", s->name);
    if (same_sets) report(check, label, lg[GPU], lg[CPU], (size_t)vocab, TOL_MODEL);
    else printf("| %-22s | %-44s | %9s | %9s | %9s | %7s | %s |\n", check, label, "-", "-", "-", "-", differ);
    printf("| %-22s | %-44s | %9.4f | %9s | %9s | %7s | %s |\n", "  kept positions agree", label,
           agree, "-", "-", "-", agree_ok ? "ok" : "FAIL");
    agree_ok ? n_pass++ : n_fail++;
    int steps = n_gen - 1 < 64 ? n_gen - 1 : 64, tok = argmax(lg[CPU], vocab);
    for (int t = 0; t < steps; t++) {   // the same token into both: the CPU's greedy choice
        int pos = n + t;
        for (int b = 0; b < 2; b++) {
            step[b][t] = xmalloc((size_t)vocab * sizeof(float));
            for (int i = 0; i < vocab; i++) step[b][t][i] = NAN;
            fwd_run(cx[b], kv[b], &tok, &pos, 1, &info[b].decode, step[b][t], 0);
        }
        tok = argmax(step[CPU][t], vocab);
    }
    if (steps > 0) {
        int worst = 0;
        double wr = -1;
        for (int t = 0; t < steps; t++) {
            cmp_stats st = compare(step[GPU][t], step[CPU][t], (size_t)vocab, 1);
            double r = st.nan ? INFINITY : st.rel;
            if (r > wr) wr = r, worst = t;
        }
        char l2[160];
        snprintf(l2, sizeof l2, "%s, worst of %d steps: %d", label, steps, worst + 1);
        snprintf(check, sizeof check, "  decode step logits");
        if (same_sets) report(check, l2, step[GPU][worst], step[CPU][worst], (size_t)vocab, TOL_MODEL);
        else printf("| %-22s | %-44s | %9s | %9s | %9s | %7s | %s |\n", check, l2, "-", "-", "-", "-", differ);
    }
    for (int b = 0; b < 2; b++) {
        for (int t = 0; t < steps; t++) free(step[b][t]);
        if (info[b].decode_free) info[b].decode_free(info[b].decode.ctx);
        kv_free(kv[b]);
    }
    token_log tl[2] = {{{0}, 0}, {{0}, 0}};
    for (int b = 0; b < 2; b++) {
        sampler smp;
        sampler_init(&smp, &(sample_params){.temp = 0}, vocab);
        run_stats st;
        int rc = run_generate(s, cx[b], &so, &run, ids, n, n_gen, &smp, log_token, &tl[b], &st, NULL,
                              err, sizeof err);
        CHECK_INTERNAL(rc == 0, "%s generate: %s", s->name, err);
        sampler_free(&smp);
    }
    // greedy: the first token must match unless the CPU's top two are closer than the bf16 noise
    int a = argmax(lg[CPU], vocab), g = argmax(lg[GPU], vocab), same = 0;
    double gap = lg[CPU][a] - lg[CPU][g];
    while (same < tl[CPU].n && same < tl[GPU].n && tl[CPU].ids[same] == tl[GPU].ids[same]) same++;
    int ok = tl[CPU].ids[0] == tl[GPU].ids[0] || gap < 0.05;
    printf("| %-22s | %-44s | %6d/%-2d | %9.2e | %9s | %7s | %s |\n", "  greedy same prefix", label,
           same, tl[CPU].n, gap, "-", "-", ok ? "ok" : same_sets ? "FAIL" : differ);
    if (ok || same_sets) ok ? n_pass++ : n_fail++;
    free(lg[0]), free(lg[1]);
    ctx_free(cx[0]), ctx_free(cx[1]);
}

static void test_model_pair(model *m[2], const char *name, int n, int n_gen) {
    int vocab = m[CPU]->cfg.vocab, *ids = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) ids[i] = (int)((i * 7919u + 13) % (unsigned)vocab);
    for (int i = 0; i < strategy_count(); i++) test_strategy(m, strategy_at(i), ids, n, n_gen, name);
    // compositions: topk over per-KV-head caches, and topk+phi's summary over kept chunks
    const char *composed[] = {"fastkv+topk", "specprefill+topk+phi", "speed+topk"};
    for (int i = 0; i < 3; i++) test_strategy(m, strategy_find(composed[i]), ids, n, n_gen, name);
    free(ids);
}

static void test_tiny_models(backend *bk[2]) {
    // head dims 64 (the tensor-core prefill kernel) and 32 (the CUDA-core one)
    tiny_shape shapes[] = {{"llama", 8, 512, 8, 2, 1024, 1000}, {"qwen2", 6, 192, 6, 2, 384, 700}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        model *m[2];
        for (int b = 0; b < 2; b++) m[b] = tiny_model(bk[b], &shapes[i], 1000 + i);
        test_model_pair(m, m[CPU]->name, small ? 64 : 320, small ? 4 : 8);
        for (int b = 0; b < 2; b++) model_free(m[b]);
    }
}

// ---- the decode step: fixed buffers, recorded and replayed, batched ----------------------------

#define DEC_SEQS 3

// DEC_SEQS sequences (prompts of len[s] tokens, prefilled alone), then `steps` decode steps
// through fwd_decode fed fixed tokens: batched (one call for all per step) or each sequence's
// steps alone; out[s * steps + t] = its logits at step t. *rec, *rep: steps recorded, replayed;
// *host_ok = 0 when a cache's host length or positions are not what the steps appended.
static void decode_steps(model *m, const int *len, int steps, int batched, float **out, long *rec,
                         long *rep, int *host_ok) {
    int vocab = m->cfg.vocab, L = m->cfg.n_layer;
    context *cx = ctx_new(m, NULL);   // its own run: counts, buffers and recorded step
    kv_cache *kv[DEC_SEQS];
    char err[256];
    int *caps = xmalloc((size_t)L * sizeof(int));
    float *lg = xmalloc((size_t)vocab * sizeof(float));
    for (int s = 0; s < DEC_SEQS; s++) {
        int *ids = xmalloc((size_t)len[s] * sizeof(int)), *pos = xmalloc((size_t)len[s] * sizeof(int));
        for (int i = 0; i < len[s]; i++) ids[i] = (int)((i * 7919u + 13 + 101u * s) % (unsigned)vocab), pos[i] = i;
        for (int l = 0; l < L; l++) caps[l] = len[s] + steps;
        kv[s] = fwd_kv_create(cx, caps, err, sizeof err);
        CHECK_INTERNAL(kv[s], "%s", err);
        fwd_run(cx, kv[s], ids, pos, len[s], NULL, lg, 0);
        free(ids), free(pos);
    }
    long f0, r0, p0, f1;
    fwd_decode_counts(cx, &f0, &r0, &p0);
    int tok[DEC_SEQS], pos[DEC_SEQS];
    fwd_seq q[DEC_SEQS];
    for (int a = 0; a < (batched ? steps : DEC_SEQS); a++)
        for (int b = 0; b < (batched ? 1 : steps); b++) {
            int t = batched ? a : b, s0 = batched ? 0 : a, k = batched ? DEC_SEQS : 1;
            for (int s = s0; s < s0 + k; s++) {
                tok[s] = (t * 31 + s * 7 + 5) % vocab, pos[s] = len[s] + t;
                q[s] = (fwd_seq){kv[s], &tok[s], &pos[s], 1, NULL, out[s * steps + t], 0, NULL, 0};
            }
            CHECK_INTERNAL(fwd_decode(cx, q + s0, k) == 0, "a decode step failed");
        }
    fwd_decode_counts(cx, &f1, rec, rep);
    *rec -= r0, *rep -= p0;
    for (int s = 0; s < DEC_SEQS; s++) {   // the host's notes of the appends a replay made
        for (int l = 0; l < L; l++) {
            const kv_layer *y = &kv[s]->layers[l];
            int ok = y->len == len[s] + steps;
            for (int g = 0; g < y->n_kv_head && ok; g++)
                for (int i = 0; i < y->len && ok; i++) ok = y->pos[(size_t)g * y->cap + i] == i;
            if (!ok) *host_ok = 0;
        }
        kv_free(kv[s]);
    }
    free(caps), free(lg);
    ctx_free(cx);
}

static float **logit_rows(int n, int vocab) {
    float **r = xmalloc((size_t)n * sizeof *r);
    for (int i = 0; i < n; i++) {
        r[i] = xmalloc((size_t)vocab * sizeof(float));
        for (int j = 0; j < vocab; j++) r[i][j] = NAN;
    }
    return r;
}

// The worst row of got against ref (n rows of vocab) by relative error, reported.
static void report_worst(const char *check, const char *label, float **got, float **ref, int n,
                         int vocab, double tol) {
    int worst = 0;
    double wr = -1;
    for (int i = 0; i < n; i++) {
        cmp_stats st = compare(got[i], ref[i], (size_t)vocab, 1);
        double r = st.nan ? INFINITY : st.rel;
        if (r > wr) wr = r, worst = i;
    }
    report(check, label, got[worst], ref[worst], (size_t)vocab, tol);
}

// The decode step on the GPU backend: replayed recordings give exactly the logits of the same
// launches run eagerly (SIFT_CUDA_GRAPHS=0); batched steps agree with each sequence alone; and
// both with the CPU backend.
static void test_decode(backend *bk[2]) {
    tiny_shape shapes[] = {{"llama", 4, 512, 8, 2, 1024, 1000}, {"qwen2", 3, 192, 6, 2, 384, 700}};
    int len[DEC_SEQS] = {small ? 40 : 300, small ? 333 : 517, small ? 23 : 130}, steps = 6;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        model *m[2];
        for (int b = 0; b < 2; b++) m[b] = tiny_model(bk[b], &shapes[i], 2000 + i);
        int vocab = m[CPU]->cfg.vocab, n = DEC_SEQS * steps;
        char label[120];
        if (!bk[GPU]->graph_begin) {
            printf("| %-22s | %-44s | %9s | %9s | %9s | %7s | skip: the backend records no steps |\n",
                   "decode graph replay", m[GPU]->name, "-", "-", "-", "-");
            for (int b = 0; b < 2; b++) model_free(m[b]);
            continue;
        }
        float **graph = logit_rows(n, vocab), **eager = logit_rows(n, vocab),
              **alone = logit_rows(n, vocab), **cpu = logit_rows(n, vocab);
        long rec[4], rep[4];
        int host_ok = 1;
        decode_steps(m[GPU], len, steps, 1, graph, &rec[0], &rep[0], &host_ok);
        tunables_edit()->cuda_graphs = 0;
        decode_steps(m[GPU], len, steps, 1, eager, &rec[1], &rep[1], &host_ok);
        tunables_edit()->cuda_graphs = 1;
        decode_steps(m[GPU], len, steps, 0, alone, &rec[2], &rep[2], &host_ok);
        decode_steps(m[CPU], len, steps, 1, cpu, &rec[3], &rep[3], &host_ok);
        // bit for bit: every step of every sequence
        int same = 1;
        for (int r = 0; r < n; r++) same &= memcmp(graph[r], eager[r], (size_t)vocab * sizeof(float)) == 0;
        // batched: step 1 eager, step 2 recorded, the rest replayed; alone: the same per sequence
        int counts = rec[0] == 1 && rep[0] == steps - 2 && rec[1] == 0 && rep[1] == 0 &&
                     rec[2] == DEC_SEQS && rep[2] == (long)DEC_SEQS * (steps - 2);
        snprintf(label, sizeof label, "%s, %d seqs x %d steps, %ld rec, %ld replays", m[GPU]->name,
                 DEC_SEQS, steps, rec[0], rep[0]);
        printf("| %-22s | %-44s | %9s | %9s | %9s | %7s | %s |\n", "decode graph == eager", label,
               same ? "0" : "differ", "-", "-", "-",
               !same ? "FAIL: logits differ" : !counts ? "FAIL: not recorded/replayed as expected"
               : !host_ok ? "FAIL: host KV lengths" : "ok");
        same && counts && host_ok ? n_pass++ : n_fail++;
        snprintf(label, sizeof label, "%s, %d seqs x %d steps, worst step", m[GPU]->name, DEC_SEQS, steps);
        report_worst("decode batched ~ alone", label, graph, alone, n, vocab, TOL);
        report_worst("decode graph ~ CPU", label, graph, cpu, n, vocab, TOL_MODEL);
        for (int r = 0; r < n; r++) free(graph[r]), free(eager[r]), free(alone[r]), free(cpu[r]);
        free(graph), free(eager), free(alone), free(cpu);
        for (int b = 0; b < 2; b++) model_free(m[b]);
    }
}

// Device sampling against sample_next: rows of bf16 logits (many ties at bf16 resolution),
// each drawn on the backend from the same generator state as a host sampler; every setting of
// the chain, several seeds. The tokens must be equal.
static void test_sample(backend *bk[2]) {
    if (!bk[GPU]->sample) {
        printf("| %-22s | %-44s | %9s | %9s | %9s | %7s | skip: the backend does not sample |\n",
               "sample", "-", "-", "-", "-", "-");
        return;
    }
    const int R = 8, seeds = 6;
    int vocabs[] = {1000, 49152, 700};
    sample_params set[] = {
        {.temp = 0}, {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f},
        {.temp = 1.5f, .top_k = 1000, .top_p = 0.9f}, {.temp = 0.5f, .top_k = 5},
        {.temp = 1.0f, .top_k = 1, .min_p = 0.5f}, {.temp = 2.0f, .top_k = 1024, .min_p = 0.01f},
        {.temp = 0.7f, .top_k = 0, .top_p = 0.8f},   // top-k off: all 700 candidates (vocab 700)
    };
    for (size_t v = 0; v < sizeof vocabs / sizeof *vocabs; v++) {
        int vocab = vocabs[v];
        float *h = xmalloc((size_t)R * vocab * sizeof(float));
        for (long i = 0; i < (long)R * vocab; i++)   // a few large logits over a tied floor
            h[i] = bf16_round(i % 97 == 5 ? 8 + 4 * urand() : 2 * urand());
        void *d = upload(bk[GPU], h, R, vocab);
        for (size_t k = 0; k < sizeof set / sizeof *set; k++) {
            sample_params p[8];
            uint64_t st[8];
            int got[8], same = 0, all = 0, offered = 1;
            for (int seed = 1; seed <= seeds && offered; seed++) {
                sampler smp[8];
                for (int r = 0; r < R; r++) {
                    p[r] = set[k], p[r].seed = (uint64_t)seed * 100 + r;
                    sampler_init(&smp[r], &p[r], vocab);
                    st[r] = smp[r].state;
                }
                offered = bk[GPU]->sample(bk[GPU], got, d, R, vocab, p, st) == 0;
                for (int r = 0; r < R; r++) {
                    int want = sample_next(&smp[r], h + (size_t)r * vocab);
                    same += offered && got[r] == want, all++;
                    sampler_free(&smp[r]);
                }
            }
            char label[120];
            snprintf(label, sizeof label, "vocab %d, T %.1f k %d p %.2f min %.2f, %d draws", vocab,
                     set[k].temp, set[k].top_k, set[k].top_p, set[k].min_p, all);
            int k_all = set[k].top_k > 0 && set[k].top_k < vocab ? set[k].top_k : vocab;
            if (!offered) {   // only a temperature over more than 1024 candidates may be refused
                int ok = set[k].temp > 0 && k_all > 1024;
                printf("| %-22s | %-44s | %9s | %9s | %9s | %7s | %s |\n", "sample == sample_next",
                       label, "-", "-", "-", "-", ok ? "skip: not offered (host samples)" : "FAIL: refused");
                if (!ok) n_fail++;
                continue;
            }
            printf("| %-22s | %-44s | %6d/%-2d | %9s | %9s | %7s | %s |\n", "sample == sample_next",
                   label, same, all, "-", "-", "-", same == all ? "ok" : "FAIL");
            same == all ? n_pass++ : n_fail++;
        }
        bk[GPU]->free(bk[GPU], d);
        free(h);
    }
    // frequency/presence penalties depend on the host sampler's counts: declined (the host draws)
    {
        int vocab = 700, got[1];
        float *h = xmalloc((size_t)vocab * sizeof(float));
        for (int i = 0; i < vocab; i++) h[i] = bf16_round(2 * urand());
        void *d = upload(bk[GPU], h, 1, vocab);
        sample_params pp[2] = {{.temp = 0, .freq_pen = 0.5f}, {.temp = 0.8f, .top_k = 40, .pres_pen = -1}};
        for (int k = 0; k < 2; k++) {
            sampler smp;
            sampler_init(&smp, &pp[k], vocab);
            uint64_t st = smp.state;
            int declined = bk[GPU]->sample(bk[GPU], got, d, 1, vocab, &pp[k], &st) != 0;
            printf("| %-22s | %-44s | %9s | %9s | %9s | %7s | %s |\n", "sample declines",
                   k ? "T 0.8 k 40, presence -1" : "greedy, frequency 0.5", "-", "-", "-", "-",
                   declined ? "ok" : "FAIL: drew without the penalties");
            declined ? n_pass++ : n_fail++;
            sampler_free(&smp);
        }
        bk[GPU]->free(bk[GPU], d);
        free(h);
    }
}

// The GGUF model at path on both backends (skipped when there is none).
static void test_gguf_model(backend *bk[2], const char *path) {
    struct stat sb;
    if (!path || stat(path, &sb) != 0) {
        printf("| %-22s | %-44s | %9s | %9s | %9s | %7s | skip: no model file |\n", "GGUF model",
               path ? path : "-", "-", "-", "-", "-");
        return;
    }
    char err[512];
    gguf_file *f = gguf_open(path, err, sizeof err);
    CHECK_INTERNAL(f, "%s: %s", path, err);
    model *m[2];
    for (int b = 0; b < 2; b++) {
        m[b] = model_load_gguf(f, bk[b], err, sizeof err);
        CHECK_INTERNAL(m[b], "%s: %s", path, err);
    }
    const char *base = strrchr(path, '/');
    test_model_pair(m, base ? base + 1 : path, small ? 96 : 400, 8);
    for (int b = 0; b < 2; b++) model_free(m[b]);
    gguf_close(f);
}

// ---- main --------------------------------------------------------------------------------------

// The quantised decode product (backend/qmatmul_cuda.cu) rounds x to int8 per block of 32
// (dx = max |x| / 127, |x - dx xq| <= dx / 2): against the exact product of the dequantised
// weights (double, on the host), each output may be off by at most
//   sum over blocks b of dx_b / 2 * sum_{i in b} |w_i|     (x's rounding)
//   + 2^-8 |y| + 2^-20 sum |w_i x_i|                      (bf16 output, fp32 sums)
// Reports the worst error as a fraction of its bound (<= 1 passes).
static void check_int8_bound(backend *g, const bk_weight *w, const float *deq, const float *x, int n,
                             int rows, int cols, uint32_t type, const char *tag) {
    void *dx = upload(g, x, n, cols), *o = g->alloc(g, (size_t)n * rows);
    poison(g, o, n, rows);
    g->matmul(g, o, dx, w, NULL, n, cols, rows);
    float *got = download(g, o, (size_t)n * rows);
    double worst = 0;
    for (int v = 0; v < n; v++)
        for (int r = 0; r < rows; r++) {
            double y = 0, bound = 0, mag = 0;
            for (int b = 0; b < cols / 32; b++) {
                double amax = 0, wsum = 0;
                for (int i = b * 32; i < b * 32 + 32; i++) {
                    double wi = deq[(size_t)r * cols + i], xi = x[(size_t)v * cols + i];
                    y += wi * xi, mag += fabs(wi * xi), wsum += fabs(wi), amax = fmax(amax, fabs(xi));
                }
                bound += amax / 127 / 2 * wsum;
            }
            bound = bound * (1 + 1e-6) + ldexp(fabs(y), -8) + ldexp(mag, -20);
            double e = fabs((double)got[(size_t)v * rows + r] - y) / bound;
            worst = isnan(e) ? INFINITY : fmax(worst, e);
        }
    char name[40], shape[64];
    snprintf(name, sizeof name, "weight %s: int8-x bound%s", gguf_type_name(type), tag);
    snprintf(shape, sizeof shape, "(%d x %d) @ (%d x %d)^T, worst err / bound", n, cols, rows, cols);
    int ok = worst <= 1;
    printf("| %-22s | %-44s | %9.3f | %9s | %9s | %7s | %s |\n", name, shape, worst, "-", "-", "-",
           ok ? "ok" : "FAIL");
    ok ? n_pass++ : n_fail++;
    g->free(g, dx), g->free(g, o);
    free(got);
}

// synth_blocks gives every block of a tensor the same scale; here block k's f16 scale (and its
// min or dmin) is multiplied by 1, 2, 0.5, 3 or 1.5 by k % 5, so that a kernel taking another
// block's scale gives wrong rows
static void vary_block_scales(uint32_t type, uint8_t *blocks, size_t nblocks) {
    int off[2] = {0, -1};
    switch (type) {
    case GGML_Q4_0: case GGML_Q5_0: case GGML_Q8_0: break;
    case GGML_Q4_1: case GGML_Q5_1: case GGML_Q4_K: case GGML_Q5_K: off[1] = 2; break;
    case GGML_Q6_K: off[0] = 208; break;
    default: return;   // F16, BF16: no block scale
    }
    static const float f[5] = {1.0f, 2.0f, 0.5f, 3.0f, 1.5f};
    const size_t bb = dq_block_bytes(type);
    for (size_t k = 0; k < nblocks; k++)
        for (int j = 0; j < 2 && off[j] >= 0; j++) {
            uint8_t *p = blocks + k * bb + off[j];
            uint16_t h = kv_f32_to_f16(dq_f16_to_f32((uint16_t)(p[0] | p[1] << 8)) * f[k % 5]);
            p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
        }
}

// A weight handed over in a GGUF block encoding (random blocks, weights/synthetic.c): each backend
// keeps it its own way (the CPU reference dequantises to fp32 on the host with weights/dequant.c;
// CUDA keeps the blocks of the types qmatmul_cuda.cu takes and decodes them in its kernels, and
// converts F16/BF16 to bf16). Rows per type: embed (the table's rows) and matmuls against it.
static void test_weight_type(backend *bk[2], uint32_t type, int rows, int cols, const char *tag) {
    size_t bytes = rows * dq_bytes(type, cols);
    uint8_t *blocks = xmalloc(bytes);
    CHECK_INTERNAL(synth_blocks(type, blocks, rows, cols, 7, type, 1.0f / sqrtf((float)cols)) == 0,
                   "synth_blocks %s", gguf_type_name(type));
    vary_block_scales(type, blocks, bytes / dq_block_bytes(type));
    // the blocks must hold values: a scale flushed to zero would make every row below vacuous
    float *deq = xmalloc((size_t)rows * cols * sizeof(float));
    size_t nonzero = 0;
    CHECK_INTERNAL(dq_to_f32(type, blocks, deq, (uint64_t)rows * cols) == 0, "dq_to_f32");
    for (size_t i = 0; i < (size_t)rows * cols; i++) nonzero += deq[i] != 0;
    int filled = nonzero >= (size_t)rows * cols / 2;
    printf("| %-22s | %-44s | %9zu | %9s | %9s | %7s | %s |\n", "weight values nonzero",
           gguf_type_name(type), nonzero, "-", "-", "-", filled ? "ok" : "FAIL: mostly zeros");
    filled ? n_pass++ : n_fail++;
    op_ctx c = {.n = 5, .d = cols, .i = cols, .o = rows};
    for (int k = 0; k < 2; k++) c.w[k] = bk[k]->weight(bk[k], (bk_tensor){type, blocks, rows, cols, 0});
    int ids[5] = {0, 3, rows - 1, 7 % rows, rows / 2};
    c.idx = ids;
    char name[40], shape[64];
    snprintf(name, sizeof name, "weight %s: embed%s", gguf_type_name(type), tag);
    snprintf(shape, sizeof shape, "%d x %d, rows 0 3 %d 7 %d", rows, cols, rows - 1, rows / 2);
    check_op(bk, name, shape, op_embed, &c, NULL, NULL, 0, 5, cols);
    // 1 and 15 rows of x: the quantised decode kernel (15 = launches of 8, 4, 2 and 1 rows); 20
    // and 70: the tile kernel (qgemm_kernel: one and two tiles of 64 rows of x, W's 37 rows a
    // partial tile); 20 with SIFT_CUDA_QGEMM_ROWS=0: the weight dequantised in chunks of 16 rows
    // (SIFT_CUDA_DQ_ROWS; 37 rows: 16 + 16 + 5) for cuBLASLt
    static const int ns[] = {1, 15, 20, 70, 20};
    for (int k = 0; k < 5; k++) {
        int n = ns[k], dq = k == 4;
        c.n = n;
        float *x = rand_host((size_t)n * cols, 1);
        snprintf(name, sizeof name, "weight %s: matmul%s%s", gguf_type_name(type), tag, dq ? " [dq]" : "");
        snprintf(shape, sizeof shape, "(%d x %d) @ (%d x %d)^T", n, cols, rows, cols);
        sift_tunables *tn = tunables_edit(), was = *tn;
        if (dq) tn->cuda_dq_rows = 16, tn->cuda_qgemm_rows = 0;
        check_op(bk, name, shape, op_matmul, &c, &x, (const int[][2]){{n, cols}}, 1, n, rows);
        *tn = was;
        if (n <= 16 && type != GGML_F16 && type != GGML_BF16) check_int8_bound(bk[GPU], c.w[GPU], deq, x, n, rows, cols, type, tag);
        free(x);
    }
    free(deq);
    free_weights(bk, &c);
    free(blocks);
}

static void test_weight_types(backend *bk[2]) {
    static const uint32_t types[] = {GGML_F16,  GGML_BF16, GGML_Q4_0, GGML_Q4_1, GGML_Q5_0,
                                     GGML_Q5_1, GGML_Q8_0, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) test_weight_type(bk, types[i], 37, 512, "");
    // rows of 576 (the default model's width: 18 groups of 32, 2.25 steps of the tile kernel)
    test_weight_type(bk, GGML_Q4_1, 37, 576, "");
    test_weight_type(bk, GGML_Q8_0, 37, 576, "");
    // 101 rows of W: the tile kernel's second block of 64 rows (r0 > 0)
    test_weight_type(bk, GGML_Q4_K, 101, 512, "");
    test_weight_type(bk, GGML_Q6_K, 101, 512, "");
    // Q4_K, Q5_K, Q6_K and Q8_0 have two decode kernels (SIFT_CUDA_QGEMV): each on rows of 19
    // blocks of 256 (the K chunk kernel's warp takes 4 blocks a step and issues KU = 4 steps'
    // loads at once: one full round of 16 blocks, then 3 with a quarter of the lanes idle) or 145
    // blocks of 32 (the Q8_0 kernel's warp takes 16 a step, KU = 8 steps at one row of x, 4 at
    // two: full rounds, then 17 blocks; odd and even blocks, whose quants start 4-aligned or not)
    static const char *kernels[] = {"chunk", "group"};
    const int was = tunables()->cuda_qgemv_group;
    for (int k = 0; k < 2; k++) {
        char tag[16];
        snprintf(tag, sizeof tag, " [%s]", kernels[k]);
        tunables_edit()->cuda_qgemv_group = k;
        test_weight_type(bk, GGML_Q4_K, 37, 19 * 256, tag);
        test_weight_type(bk, GGML_Q5_K, 37, 19 * 256, tag);
        test_weight_type(bk, GGML_Q6_K, 37, 19 * 256, tag);
        test_weight_type(bk, GGML_Q8_0, 37, 145 * 32, tag);
    }
    tunables_edit()->cuda_qgemv_group = was;
}

static void test_ops(backend *bk[2]) {
    test_embed(bk, 50, 13, 72);
    test_rmsnorm(bk, 5, 576);
    test_rmsnorm(bk, 1, 4096);
    test_rmsnorm(bk, 3, 77);
    test_matmul(bk, 1, 576, 1536, 0);
    test_matmul(bk, 37, 96, 200, 1);
    test_matmul(bk, 130, 1024, 512, 0);
    test_rope(bk, 7, 4, 64, ROPE_NORM, 5);
    test_rope(bk, 7, 4, 64, ROPE_NEOX, 5);
    test_rope(bk, 3, 2, 128, ROPE_NORM, 100000);
    test_rope(bk, 3, 2, 128, ROPE_NEOX, 100000);
    test_elementwise(bk, 9, 111);
    test_elementwise(bk, 4, 96);   // 16-byte kernels (widths a multiple of 8)
    test_gather(bk, 20, 64, 9);
    test_gather(bk, 7, 33, 0);
    test_weight_types(bk);
    test_fused(bk, 5, 256, 128, 64, 384, 1);   // every width a multiple of 8: 16-byte kernels
    test_fused(bk, 3, 96, 36, 12, 60, 0);      // one element per thread
}

// Each case runs every kernel the backend may pick for its rows and head dimension (attn_kernels);
// every kernel has a trap case.
static void test_attention_cases(backend *bk[2]) {
    static const attn_case cases[] = {
        {"prefill GQA 6/2 hd64 causal", 6, 2, 64, 200, 1, 0, 200, 0, 1, 0},
        {"prefill GQA 32/8 hd128 causal", 32, 8, 128, 300, 1, 0, 300, 0, 1, 0},
        {"prefill hd128 kept, row w/o keys", 4, 2, 128, 300, 2, 120, 70, -5, 9, 0},
        {"prefill MHA hd64 len77 gap5", 4, 4, 64, 77, 5, 0, 130, 3, 3, 0},
        {"prefill GQA 8/2 hd128 1100 trap", 8, 2, 128, 1100, 1, 0, 1100, 0, 1, 1},
        {"prefill GQA 4/2 hd64 17 rows trap", 4, 2, 64, 700, 1, 0, 17, 683, 1, 1},
        {"prefill hd64 kept trap, 2 chunks", 4, 1, 64, 900, 2, 300, 130, 500, 3, 1},
        {"prefill hd256 row w/o keys", 4, 1, 256, 70, 1, 0, 40, -3, 5, 0},
        {"prefill MHA hd96 gap3 kept", 3, 3, 96, 150, 3, 60, 20, 10, 17, 0},
        {"prefill hd10 (not 16-byte rows)", 2, 1, 10, 90, 1, 0, 40, 0, 2, 0},
        {"prefill GQA 4/2 hd96 trap", 4, 2, 96, 600, 1, 0, 130, 470, 1, 1},
        {"decode hd128 len5000 gap2", 8, 2, 128, 5000, 1, 0, 1, 20000, 1, 0},
        {"decode hd128 masked rows", 8, 2, 128, 3000, 1, 0, 3, 1000, 700, 0},
        {"decode GQA 8/2 hd64 kept trap", 8, 2, 64, 2000, 3, 700, 4, 3000, 1100, 1},
        {"decode hd32 tiny", 2, 1, 32, 5, 1, 0, 2, 1, 2, 0},
        {"decode 16 rows hd128", 4, 2, 128, 600, 1, 0, 16, 580, 2, 0},
        {"decode 16 rows GQA 32/8 trap", 32, 8, 128, 2000, 1, 0, 16, 1990, 1, 1},
        {"decode hd256 len3000 trap", 8, 2, 256, 3000, 1, 0, 2, 2990, 5, 1},
        {"decode GQA 8/2 hd128 len70000", 8, 2, 128, 70000, 1, 0, 1, 70000, 1, 0},
        {"decode hd36 (not 16-byte rows)", 4, 2, 36, 500, 1, 0, 2, 400, 50, 0},
        {"decode GQA 8/2 hd96 kept trap", 8, 2, 96, 2000, 3, 700, 4, 3000, 1100, 1},
        {"decode 16 rows hd160 trap", 4, 1, 160, 2000, 1, 0, 16, 1990, 1, 1},
    };
    // --small: the same kinds of case on fewer keys and rows (prefill 400, decode 1,500), except
    // one decode row past 65,536 keys
    static const attn_case small_cases[] = {
        {"prefill GQA 6/2 hd64 causal", 6, 2, 64, 200, 1, 0, 200, 0, 1, 0},
        {"prefill GQA 32/8 hd128 causal", 32, 8, 128, 150, 1, 0, 150, 0, 1, 0},
        {"prefill hd128 kept, row w/o keys", 4, 2, 128, 300, 2, 120, 70, -5, 9, 0},
        {"prefill MHA hd64 len77 gap5", 4, 4, 64, 77, 5, 0, 130, 3, 3, 0},
        {"prefill GQA 8/2 hd128 400 trap", 8, 2, 128, 400, 1, 0, 400, 0, 1, 1},
        {"prefill GQA 4/2 hd64 17 rows trap", 4, 2, 64, 300, 1, 0, 17, 283, 1, 1},
        {"prefill hd64 kept trap, 2 chunks", 4, 1, 64, 400, 2, 150, 130, 200, 3, 1},
        {"prefill hd256 row w/o keys", 4, 1, 256, 70, 1, 0, 40, -3, 5, 0},
        {"prefill MHA hd96 gap3 kept", 3, 3, 96, 150, 3, 60, 20, 10, 17, 0},
        {"prefill hd10 (not 16-byte rows)", 2, 1, 10, 90, 1, 0, 40, 0, 2, 0},
        {"prefill GQA 4/2 hd96 trap", 4, 2, 96, 300, 1, 0, 130, 170, 1, 1},
        {"decode hd128 len1500 gap2", 8, 2, 128, 1500, 1, 0, 1, 6000, 1, 0},
        {"decode hd128 masked rows", 8, 2, 128, 1500, 1, 0, 3, 500, 350, 0},
        {"decode GQA 8/2 hd64 kept trap", 8, 2, 64, 1200, 3, 500, 4, 1800, 700, 1},
        {"decode hd32 tiny", 2, 1, 32, 5, 1, 0, 2, 1, 2, 0},
        {"decode 16 rows hd128", 4, 2, 128, 600, 1, 0, 16, 580, 2, 0},
        {"decode 16 rows GQA 32/8 trap", 32, 8, 128, 800, 1, 0, 16, 790, 1, 1},
        {"decode hd256 len1500 trap", 8, 2, 256, 1500, 1, 0, 2, 1490, 5, 1},
        {"decode GQA 8/2 hd128 len70000", 8, 2, 128, 70000, 1, 0, 1, 70000, 1, 0},
        {"decode hd36 (not 16-byte rows)", 4, 2, 36, 500, 1, 0, 2, 400, 50, 0},
        {"decode GQA 8/2 hd96 kept trap", 8, 2, 96, 1200, 3, 500, 4, 1800, 700, 1},
        {"decode 16 rows hd160 trap", 4, 1, 160, 800, 1, 0, 16, 790, 1, 1},
    };
    const attn_case *list = small ? small_cases : cases;
    size_t n = small ? sizeof small_cases / sizeof *small_cases : sizeof cases / sizeof *cases;
    for (size_t i = 0; i < n; i++)
        if (!case_filter || strstr(list[i].label, case_filter)) test_attention(bk, &list[i]);
}

// gpu_check [--self | --self-fault] [--ops-only] [--only SECTION] [MODEL.gguf]; --self compares
// the CPU backend with itself (checks this harness on a machine without a GPU; no ceilings);
// --self-fault does so with an off-by-one attention mask on the second backend (the trap cases
// must fail); --ops-only skips the model checks and the ceilings (what the sanitizers run);
// --only runs one section: ops, attention, topk, phi, decode or models (the emulated build's planted
// bugs run just the section that must catch them), or speed: the attention timing rows alone,
// also where the backend measures no ceilings (bench/simt_profile.sh runs them in the emulator
// for its counters, not its times). --small scales the shapes for the emulator in `make test`:
// prefill attention on at most 400 keys, decode on 1,500 (and one row past 65,536), 64-token
// prompts and 4 tokens on the tiny models and no GGUF model (tests/test_gpu_simt.py runs the default model
// end to end through sift-simt), a 600-key phi case; --case TEXT runs the attention cases whose
// label has TEXT.
static int section(const char *only, const char *name) { return !only || strcmp(only, name) == 0; }

int main(int argc, char **argv) {
    char msg[512] = "--self: CPU against CPU";
    int self = 0, ops_only = 0, fault = 0;
    const char *only = NULL;
    for (; argc > 1 && strncmp(argv[1], "--", 2) == 0; argc--, argv++) {
        if (strcmp(argv[1], "--self") == 0) self = 1;
        else if (strcmp(argv[1], "--self-fault") == 0) self = fault = 1;
        else if (strcmp(argv[1], "--ops-only") == 0) ops_only = 1;
        else if (strcmp(argv[1], "--only") == 0 && argc > 2) only = argv[2], argc--, argv++;
        else if (strcmp(argv[1], "--case") == 0 && argc > 2) case_filter = argv[2], argc--, argv++;
        else if (strcmp(argv[1], "--small") == 0) small = 1;
        else {
            fprintf(stderr, "usage: gpu_check [--self | --self-fault] [--ops-only] [--small] [--only ops|"
                    "attention|topk|phi|decode|models|gguf|speed] [--case TEXT] [MODEL.gguf]\n");
            return 2;
        }
    }
    const char *sections[] = {"ops", "attention", "topk", "phi", "decode", "models", "gguf", "speed"};
    int known = !only;
    for (int i = 0; i < 8 && !known; i++) known = strcmp(only, sections[i]) == 0;
    if (!known) {
        fprintf(stderr, "gpu_check: --only %s: expected ops, attention, topk, phi, decode, models, gguf or speed\n", only);
        return 2;
    }
    tunables_edit()->cuda_soft_fail = 1;   // a GEMM cuBLASLt refuses: a failed row, not the end
    backend *bk[2] = {backend_cpu_create(0, BK_WEIGHTS_F32), self ? backend_cpu_create(0, BK_WEIGHTS_F32)
                                                   : backend_cuda_create(msg, sizeof msg)};
    if (!bk[GPU]) {
        fprintf(stderr, "gpu_check: %s\n", msg);
        bk[CPU]->destroy(bk[CPU]);
        return 2;
    }
    printf("gpu_check: %s\n\n| %-22s | %-44s | %9s | %9s | %9s | %7s | result |\n"
           "|---|---|---:|---:|---:|---:|---|\n", msg, "check", "shape", "rel err", "worst row",
           "max abs", "ulps");
    if (fault) cpu_attention = bk[GPU]->attention, bk[GPU]->attention = off_by_one_attention;
    if (section(only, "ops")) test_ops(bk);
    if (section(only, "attention")) test_attention_cases(bk);
    if (section(only, "ops") && bk[GPU]->weight_synth) test_weight_synth(bk, 33, 70);
    if (section(only, "topk") && bk[GPU]->attn_topk_step) {
        test_attn_topk_step(bk, 8, 2, 64, 3000, 4, 2980, 60, 0, 0, 0, 0, 0, 0);
        test_attn_topk_step(bk, 8, 2, 64, 3000, 4, 2976, 60, 7, 0, 0, 0, 0, 0);   // 20 entries after the mid region
        if (small) test_attn_topk_step(bk, 4, 4, 128, 70000, 4, 69980, 70, 0, 0, 0, 0, 0, 0);
        else test_attn_topk_step(bk, 4, 4, 128, 70000, 4, 69980, 700, 0, 0, 0, 0, 0, 0);
        test_attn_topk_step(bk, 2, 1, 32, 50, 0, 50, 50, 3, 0, 0, 0, 0, 0);
        test_attn_topk_step(bk, 6, 2, 64, 40, 4, 20, 0, 0, 0, 0, 0, 0, 0);        // --topk 0: the anchors only
        test_attn_topk_step(bk, 8, 2, 64, 600, 4, 580, 12, 0, PHI_PRF, 64, 0, 0, 0);   // topk+phi
        test_attn_topk_step(bk, 4, 2, 32, 300, 4, 280, 8, 0, PHI_MLP, 48, 0, 0, 0);
        test_attn_topk_step(bk, 4, 2, 32, 60, 4, 40, 0, 0, PHI_PRF, 32, 0, 0, 0);     // K 0: all of the mid estimated
        // the page selector: random keys; hot pages (the partial last among them) equal to exact;
        // every page read (the exact path); with topk+phi's completion; a page of one key
        test_attn_topk_step(bk, 8, 2, 64, 3000, 4, 2980, 60, 0, 0, 0, 16, 40, 0);
        test_attn_topk_step(bk, 8, 2, 64, 3000, 4, 2970, 40, 0, 0, 0, 16, 5, 3);
        test_attn_topk_step(bk, 4, 2, 64, 600, 4, 580, 20, 0, 0, 0, 32, 19, 0);
        test_attn_topk_step(bk, 8, 2, 64, 600, 4, 580, 12, 0, PHI_PRF, 64, 16, 6, 2);
        test_attn_topk_step(bk, 4, 1, 32, 300, 4, 280, 8, 0, 0, 0, 1, 40, 0);
    }
    if (section(only, "topk") && bk[GPU]->window_scores) {
        test_window_select(bk, 8, 2, 64, 300, 8, 40, 7, 0, 0);
        test_window_select(bk, 8, 2, 64, 300, 8, 40, 7, 1, 5);    // plateaus: the tie rule
        test_window_select(bk, 9, 3, 64, small ? 700 : 5000, 8, small ? 70 : 500, 13, 0, 0);
        test_window_select(bk, 4, 4, 32, 40, 4, 4, 3, 1, 0);      // the window alone
    }
    if (section(only, "topk") && bk[GPU]->window_scores && bk[GPU]->score_fold_max) {
        test_spec_fold(bk, 8, 2, 64, 300, 13, 3);   // specprefill's default kernel 13
        test_spec_fold(bk, 9, 3, 64, small ? 700 : 5000, 13, 2);
        test_spec_fold(bk, 4, 4, 32, 40, 1, 1);     // kernel 1, one layer: no pooling, no max over layers
    }
    if (section(only, "phi") && bk[GPU]->attn_select && bk[GPU]->phi_summarize) {
        test_phi_select(bk, PHI_MLP, 9, 3, 64, 64, 300, 12, 12);
        test_phi_select(bk, PHI_PRF, 9, 3, 64, 64, 300, 12, 12);
        test_phi_select(bk, PHI_MLP, 8, 2, 128, 96, small ? 600 : 1500, 40, 6);
        test_phi_select(bk, PHI_PRF, 4, 4, 32, 48, 120, 0, 5);
    }
    if (only && strcmp(only, "speed") == 0 && !self) {   // the timing rows alone
        for (int n = 8192; n <= 32768; n *= 4) test_attn_speed(bk, n);
        test_qmatmul_speed(bk);
    }
    if (!only && bk[GPU]->ceilings && !ops_only && !self) {   // GPU-scale measurements
        test_ceilings(bk);
        test_attn_speed(bk, 8192);
        test_attn_speed(bk, 32768);
        test_qmatmul_speed(bk);
    }
    const char *env = getenv("SIFT_MODEL");
    const char *path = argc > 1 ? argv[1] : env && *env ? env : "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (!ops_only && section(only, "decode")) test_decode(bk), test_sample(bk);
    if (!ops_only && section(only, "models")) {
        test_tiny_models(bk);
        if (small)   // the emulator's CI run: the default model runs end to end through sift-simt
            printf("| %-22s | %-44s | %9s | %9s | %9s | %7s | skip: --small |\n", "GGUF model", path,
                   "-", "-", "-", "-");
        else test_gguf_model(bk, path);
    }
    // only when asked for by name: the GGUF file alone, also under --small (a tiny file whose
    // weights are of several block types: tests/test_gpu_simt.py, bench/gpu.sh)
    if (!ops_only && only && strcmp(only, "gguf") == 0) test_gguf_model(bk, path);
    if (section(only, "ops")) test_matmul(bk, 3, 90, 34, 1);   // rows not 16-byte aligned: refused, fails its row
    bk[GPU]->destroy(bk[GPU]);
    bk[CPU]->destroy(bk[CPU]);
    printf("\ngpu_check: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
