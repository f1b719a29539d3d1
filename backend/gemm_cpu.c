// backend/gemm_cpu.c — the CPU backend's products: on quantised weights through qgemm/ (the path
// chosen by the rule below, or timed per shape), on fp32 weights sgemm / sgemv; the ceilings
// `sift bench` measures, and the report of the timed paths.
#include <cblas.h>
#include <math.h>
#include <omp.h>

#include "backend_cpu.h"

// Which path a quantised product of n rows takes. Decode (n = 1) and short products: int8. Wider
// ones, from 16 rows: on a CPU with AMX, bf16 tiles (they won from 16 rows on the 1B shape,
// bench/RESULTS.md); else with AVX-512 VNNI, the integer GEMM on the int8 path's two digits
// (vpdpwssd; it won from 12-16 rows; Q4_K's 16-row strips win up to 31, so Q4_K from 32) — or
// with --weights fast on one digit (vpdpbusd: twice as
// fast, llama.cpp's precision, which turned the default model's greedy chat answer into nonsense
// as llama.cpp's own run does); elsewhere sgemm on dequantised tiles from SGEMM_MIN_ROWS (below
// 64 rows either may win, from 64 sgemm tiles won on every shape measured). A fixed rule, so the
// same command computes the same numbers every run.
// SIFT_PREFILL=int8 puts every product on the row kernels (two-digit activations, as --weights
// exact); SIFT_PREFILL=tune times int8 and the wide path on the first product of each
// (type, in, out, rows rounded down to a power of two) — on a slice of the weight rows (an eighth,
// at least 128: each path's cost is linear in them), then the winner on all rows — keeps the
// faster for that shape, and `sift bench` lists the choices.
#define SGEMM_MIN_ROWS 64
#define AMX_MIN_ROWS 16
#define VNNI_MIN_ROWS 16
#define VNNI_STRIP_MIN_ROWS 32   // types whose row kernels take 16 weight rows at a time
                                 // (q_rows_strip) beat the two-digit VNNI GEMM below 32 rows
                                 // (bench/RESULTS.md)
#define TUNE_MIN_ROWS 8

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

// The path of wide products: AMX tiles where the CPU has them, else the VNNI GEMM (one digit with
// --weights fast), else sgemm tiles.
static enum q_path wide_path(const cpu_impl *c) {
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

// The path the fixed rules give a quantised product of n rows of `type`, or -1 where
// SIFT_PREFILL=tune times it per shape (pick_path). A type the row kernels take in 16-row strips
// (Q4_K on AVX-512) keeps them up to 31 rows when the wide path is the two-digit VNNI GEMM.
static int fixed_path(const cpu_impl *c, int n, uint32_t type) {
    if (c->prefill == TUN_PREFILL_INT8) return Q_PATH_INT8;
    if (c->prefill < 0) {
        enum q_path wide = wide_path(c);
        int min = wide == Q_PATH_VNNI && q_rows_strip(c->isa, type) ? VNNI_STRIP_MIN_ROWS : wide_min_rows(c);
        return n < min ? Q_PATH_INT8 : (int)wide;
    }
    return n < TUNE_MIN_ROWS ? Q_PATH_INT8 : -1;
}

// The path for a quantised product of n rows (see TUNE_MIN_ROWS); NULL *e: decided, else the
// entry to fill by timing both.
static enum q_path pick_path(cpu_impl *c, const bk_weight *w, int n, int in, int o, tune_entry **e) {
    *e = NULL;
    int fixed = fixed_path(c, n, w->type);
    if (fixed >= 0) return (enum q_path)fixed;
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

// The rounding class of a product on w over n rows: the fixed rule's path (the int8 row kernels
// and the VNNI and AMX GEMMs round each row by itself: docs/models.md, "How the CPU keeps weights"); -1
// where OpenBLAS multiplies (fp32 weights, sgemm tiles: its kernels are chosen by shape) or the
// path is timed per row bucket (SIFT_PREFILL=tune).
// The rows a product of n rows chooses its path for: backend.rows_as when more.
static int path_rows(const backend *b, int n) { return b->rows_as > n ? b->rows_as : n; }

int cpu_row_class(backend *b, const bk_weight *w, int n) {
    cpu_impl *c = impl(b);
    if (w->type == GGML_F32 || c->prefill == TUN_PREFILL_TUNE) return -1;
    tune_entry *t;
    enum q_path p = pick_path(c, w, n, (int)w->cols, (int)w->rows, &t);
    CHECK_INTERNAL(!t, "a product timed under a fixed rule");
    return p == Q_PATH_SGEMM ? -1 : (int)p;
}

void cpu_matmul(backend *b, void *out, const void *x, const bk_weight *w,
                const bk_weight *bias, int n, int in, int o) {
    cpu_impl *c = impl(b);
    float *y = out;
    if (w->type != GGML_F32) {
        tune_entry *t;
        enum q_path path = pick_path(c, w, path_rows(b, n), in, o, &t);
        q_scratch local = {0};   // the shared arena is for the forward pass's own thread
        q_scratch *sc = omp_in_parallel() ? &local : &c->scratch;
        if (t) {   // a new shape: both paths timed on a slice of W's rows, into a scratch output
            int rows = o / 8 > 128 ? o / 8 : o < 128 ? o : 128;
            float *tmp = xmalloc((size_t)n * rows * sizeof(float));
            enum q_path paths[2] = {c->rows, wide_path(c)};
            for (int p = 0; p < 2; p++) {
                double t0 = omp_get_wtime();
                q_matmul(c->isa, paths[p], tmp, x, n, in, w->type, w->data, w->row_bytes, rows, sc);
                t->ms[p] = (omp_get_wtime() - t0) * 1e3 * o / rows;   // scaled to all rows
            }
            free(tmp);
            path = t->path = t->ms[1] <= t->ms[0] ? paths[1] : Q_PATH_INT8;
        }
        if (path == Q_PATH_INT8) path = c->rows;   // the row kernels at the backend's digits
        q_matmul(c->isa, path, y, x, n, in, w->type, w->data, w->row_bytes, o, sc);
        q_scratch_free(&local);
    } else if (n == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, o, in, 1.0f, w->f, in, x, 1, 0.0f, y, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, o, in, 1.0f, x, in, w->f, in,
                    0.0f, y, o);
    if (bias) add_bias(y, bias, n, o);
}

// k products of one x: one quantisation and one parallel region on the int8 path (decode) and
// on the VNNI GEMM under the fixed rule (batched decode, prefill); otherwise one cpu_matmul each
void cpu_matmul_multi(backend *b, int k, void *const *out, const void *x,
                      const bk_weight *const *w, const bk_weight *const *bias, int n, int in,
                      const int *o) {
    cpu_impl *c = impl(b);
    // the int8 row kernels or the VNNI GEMM by the fixed rules (not timed per shape), the same
    // path for every matrix (Q4_K's may differ from the others' at 16-31 rows)
    int rows = path_rows(b, n), path = fixed_path(c, rows, w[0]->type), few = path == Q_PATH_INT8;
    int vnni = (path == Q_PATH_VNNI || path == Q_PATH_VNNI8) && c->isa == Q_ISA_AVX512;
    int shared = k <= Q_MULTI_MAX && (few || vnni) && !omp_in_parallel();
    for (int j = 0; j < k && shared; j++)
        shared = w[j]->type != GGML_F32 && fixed_path(c, rows, w[j]->type) == path &&
                 (few || q_vnni_supported(w[j]->type));
    if (!shared) {
        for (int j = 0; j < k; j++) cpu_matmul(b, out[j], x, w[j], bias[j], n, in, o[j]);
        return;
    }
    uint32_t type[Q_MULTI_MAX];
    const void *data[Q_MULTI_MAX];
    size_t rb[Q_MULTI_MAX];
    for (int j = 0; j < k; j++) type[j] = w[j]->type, data[j] = w[j]->data, rb[j] = w[j]->row_bytes;
    if (few)
        q_matmul_multi(c->isa, c->rows == Q_PATH_INT8_1 ? 1 : 2, k, (float *const *)out, x, n, in, type,
                       data, rb, o, &c->scratch);
    else
        q_matmul_vnni_multi(k, (float *const *)out, x, n, in, type, data, rb, o,
                            path == Q_PATH_VNNI8 ? 1 : 2, &c->scratch);
    for (int j = 0; j < k; j++)
        if (bias[j]) add_bias(out[j], bias[j], n, o[j]);
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

int cpu_ceilings(backend *b, double *tflops, double *gbps) {
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
    const enum q_path wide = c->mode != BK_WEIGHTS_F32 && c->prefill != TUN_PREFILL_INT8 ? wide_path(c) : Q_PATH_SGEMM;
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

void cpu_report(backend *b, FILE *out) {
    cpu_impl *c = impl(b);
    if (c->strip.level && c->strip.rows8 >= 0) {
        fprintf(out, "sift: cpu Q4_K strips prefetch to %s, one activation row %s", c->strip.level == 1 ? "L1" : "L2",
                c->strip.rows8 ? "in 8-row groups" : "through the strips");
        if (!isnan(c->strip_ms[0]))
            fprintf(out, " (timed on a Q4_K matrix of 64-256 MiB: strips L1 %.2f ms, L2 %.2f ms, 8-row groups %.2f ms)",
                    c->strip_ms[0], c->strip_ms[1], c->strip_ms[2]);
        const sift_tunables *set = tunables();   // (the fields its variables fixed)
        if (set->strip_prefetch || set->strip_rows8 >= 0)
            fprintf(out, " (set: %s%s%s)", set->strip_prefetch ? "SIFT_STRIP_PREFETCH" : "",
                    set->strip_prefetch && set->strip_rows8 >= 0 ? ", " : "", set->strip_rows8 >= 0 ? "SIFT_STRIP_ROWS8" : "");
        fputc('\n', out);
    }
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
