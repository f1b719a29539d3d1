// backend/gemm_cuda.cu — linear layers through cuBLASLt (bf16 in and out, fp32 accumulation, the
// tensor cores), loaded at run time with dlopen: the toolkit has no static cuBLASLt, and a
// binary linked to the .so would not start on machines without it. One cached plan per shape;
// the ceilings (a large GEMM and a device copy) measured with the same plans.
#include <dlfcn.h>

#include "backend_cuda.cuh"

// ---- cuBLASLt, looked up at run time ----------------------------------------------------------

// Opens libcublasLt of the major version built against ($SIFT_CUBLASLT first); 0 or -1 + err.
int lt_load(lt_api *lt, char *err, size_t errlen) {
    const char *names[] = {tunables()->cublaslt, "libcublasLt.so.13",
                           "/usr/local/cuda/lib64/libcublasLt.so.13",
                           "/usr/local/cuda-13.0/lib64/libcublasLt.so.13"};
    memset(lt, 0, sizeof *lt);
    if (CUDA_EMULATED) lt->so = dlopen(NULL, RTLD_NOW);   // the emulator's own (simt/)
    for (size_t i = 0; i < sizeof names / sizeof *names && !lt->so; i++)
        if (names[i] && *names[i]) lt->so = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lt->so)
        return err_printf(err, errlen, "cannot load libcublasLt.so.13 (%s); install the CUDA 13 "
                          "cuBLAS libraries or set SIFT_CUBLASLT=/path/to/libcublasLt.so.13",
                          dlerror());
    struct { void **fn; const char *name; } syms[] = {
        {(void **)&lt->create, "cublasLtCreate"},
        {(void **)&lt->destroy, "cublasLtDestroy"},
        {(void **)&lt->status_string, "cublasLtGetStatusString"},
        {(void **)&lt->desc_create, "cublasLtMatmulDescCreate"},
        {(void **)&lt->desc_destroy, "cublasLtMatmulDescDestroy"},
        {(void **)&lt->desc_set, "cublasLtMatmulDescSetAttribute"},
        {(void **)&lt->layout_create, "cublasLtMatrixLayoutCreate"},
        {(void **)&lt->layout_destroy, "cublasLtMatrixLayoutDestroy"},
        {(void **)&lt->pref_create, "cublasLtMatmulPreferenceCreate"},
        {(void **)&lt->pref_destroy, "cublasLtMatmulPreferenceDestroy"},
        {(void **)&lt->pref_set, "cublasLtMatmulPreferenceSetAttribute"},
        {(void **)&lt->heuristic, "cublasLtMatmulAlgoGetHeuristic"},
        {(void **)&lt->matmul, "cublasLtMatmul"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof *syms; i++)
        if (!(*syms[i].fn = dlsym(lt->so, syms[i].name))) {
            dlclose(lt->so);
            lt->so = NULL;
            return err_printf(err, errlen, "libcublasLt lacks %s", syms[i].name);
        }
    return 0;
}

void lt_check(const lt_api *lt, cublasStatus_t s, const char *what, const char *file,
                     int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "sift: cuBLASLt error at %s:%d: %s: %s\n"
            "hint: check the GPU's memory and the cuBLAS version (CUDA 13), or use --device cpu\n",
            file, line, what, lt->status_string(s));
    exit(3);
}

// out (n, o) += bias (o,)
__global__ void bias_kernel(bf16 *out, const float *bias, int n, int o) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)n * o) return;
    out[e] = __float2bfloat16(__bfloat162float(out[e]) + bias[e % o]);
}

void plan_destroy(cuda_impl *c, mm_plan *p) {
    LT_CHECK(c, c->lt.layout_destroy(p->w));
    LT_CHECK(c, c->lt.layout_destroy(p->x));
    LT_CHECK(c, c->lt.layout_destroy(p->out));
    LT_CHECK(c, c->lt.desc_destroy(p->desc));
}

// In cuBLASLt's column-major terms: out (o x n, ld ldo) = W^T (W: in x o, ld in) @ x (in x n, ld in).
// 0, or -1 when cuBLASLt offers no algorithm (p then holds nothing to destroy).
static int plan_init(cuda_impl *c, mm_plan *p, int n, int in, int o, int ldo) {
    p->n = n, p->in = in, p->o = o, p->ldo = ldo;
    LT_CHECK(c, c->lt.desc_create(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_T;
    LT_CHECK(c, c->lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    LT_CHECK(c, c->lt.layout_create(&p->w, CUDA_R_16BF, in, o, in));
    LT_CHECK(c, c->lt.layout_create(&p->x, CUDA_R_16BF, in, n, in));
    LT_CHECK(c, c->lt.layout_create(&p->out, CUDA_R_16BF, o, n, ldo));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(c, c->lt.pref_create(&pref));
    uint64_t ws = LT_WORKSPACE;
    uint32_t align = 16;   // buffers are only promised 16-byte alignment (checked per call)
    LT_CHECK(c, c->lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulPreferenceAttributes_t al[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (size_t i = 0; i < sizeof al / sizeof *al; i++)
        LT_CHECK(c, c->lt.pref_set(pref, al[i], &align, sizeof align));
    cublasLtMatmulHeuristicResult_t r;
    int got = 0;
    cublasStatus_t hs = c->lt.heuristic(c->lt_handle, p->desc, p->w, p->x, p->out, p->out, pref,
                                        1, &r, &got);
    LT_CHECK(c, c->lt.pref_destroy(pref));
    if (hs != CUBLAS_STATUS_SUCCESS && hs != CUBLAS_STATUS_NOT_SUPPORTED) LT_CHECK(c, hs);
    if (hs == CUBLAS_STATUS_SUCCESS && got > 0) {
        p->algo = r.algo;
        return 0;
    }
    plan_destroy(c, p);
    return -1;
}

// A refused GEMM: an internal error (exit 3), or, with SIFT_CUDA_SOFT_FAIL=1 (gpu_check, so that
// one refused shape is a failed row rather than the end of the run), one line on stderr and no
// output written.
static void gemm_refused(int n, int in, int o, const char *why) {
    const int soft = tunables()->cuda_soft_fail;
    fprintf(stderr, "sift: %s at %s:%d: cuBLASLt: %s for bf16 (%d x %d) @ (%d x %d)^T\n",
            soft ? "error (soft)" : "internal error", __FILE__, __LINE__, why, n, in, o, in);
    if (!soft) exit(3);
}

// The cached plan for this shape, made (evicting round-robin when full) if new; NULL when
// cuBLASLt has no algorithm for it.
static const mm_plan *plan_get(cuda_impl *c, int n, int in, int o, int ldo) {
    for (int i = 0; i < c->n_plans; i++)
        if (c->plans[i].n == n && c->plans[i].in == in && c->plans[i].o == o && c->plans[i].ldo == ldo)
            return &c->plans[i];
    mm_plan *p;
    if (c->n_plans < MM_PLANS) p = &c->plans[c->n_plans++];
    else {
        p = &c->plans[c->next_evict];
        c->next_evict = (c->next_evict + 1) % MM_PLANS;
        plan_destroy(c, p);
    }
    if (plan_init(c, p, n, in, o, ldo) == 0) return p;
    *p = c->plans[--c->n_plans];   // keep the table dense: the last plan fills the slot
    if (c->next_evict >= c->n_plans) c->next_evict = 0;
    return NULL;
}

// out (n, o; rows ldo apart) = x (n, in) @ W (o, in)^T, all bf16, fp32 accumulation
void gemm_bf16_ld(cuda_impl *c, void *out, int ldo, const void *x, const void *w, int n, int in, int o) {
    if (((uintptr_t)out | (uintptr_t)x | (uintptr_t)w) % 16) {
        gemm_refused(n, in, o, "operands not 16-byte aligned");
        return;
    }
    const mm_plan *p = plan_get(c, n, in, o, ldo);
    if (!p) {
        gemm_refused(n, in, o, "no algorithm");
        return;
    }
    float one = 1.0f, zero = 0.0f;
    cuda_counts.launches += !cuda_counts.capturing;
    LT_CHECK(c, c->lt.matmul(c->lt_handle, p->desc, &one, w, p->w, x, p->x, &zero, out, p->out,
                             out, p->out, &p->algo, c->lt_work, LT_WORKSPACE, c->stream));
}

void gemm_bf16(cuda_impl *c, void *out, const void *x, const void *w, int n, int in, int o) {
    gemm_bf16_ld(c, out, o, x, w, n, in, o);
}

// out (n, o) = x @ W^T for W in bf16 or in its GGUF blocks
static void product(cuda_impl *c, void *out, const void *x, const bk_weight *w, int n, int in, int o) {
    if (w->q) cuda_qmatmul(c, out, x, w, n, in, o);
    else gemm_bf16(c, out, x, w->h, n, in, o);
}

void cuda_matmul(backend *b, void *out, const void *x, const bk_weight *w,
                        const bk_weight *bias, int n, int in, int o) {
    cuda_impl *c = impl(b);
    CHECK_INTERNAL(w->rows == (size_t)o && w->cols == (size_t)in, "matmul weight is %zu x %zu, "
                   "expected %d x %d", w->rows, w->cols, o, in);
    if (n == 0 || o == 0) return;
    product(c, out, x, w, n, in, o);
    if (!bias) return;
    CHECK_INTERNAL(bias->f && bias->cols == (size_t)o, "bias must be a vector of %d", o);
    size_t total = (size_t)n * o;
    CUDA_LAUNCH(bias_kernel, cuda_blocks(total, THREADS), THREADS, 0, c->stream, (bf16 *)out,
                bias->f, n, o);
}

// Parts j < k of a fused product's output (n, O) = work: out[j] (n, o[j]) = its columns
// off[j] .. off[j + 1], plus bias[j] (fp32, may be NULL); V8: 8 columns per thread (every
// o[j] % 8 == 0), else one
typedef struct split_args {
    bf16 *out[4];
    const float *bias[4];
    int off[5], k;
} split_args;

template <int V>
__global__ void split_kernel(const bf16 *work, split_args a, int n) {
    const int O = a.off[a.k];
    size_t e = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (e >= (size_t)n * O) return;
    size_t i = e / O;
    int col = (int)(e % O), j = 0;
    while (col >= a.off[j + 1]) j++;
    int o = a.off[j + 1] - a.off[j], cj = col - a.off[j];
    bf16 *dst = a.out[j] + i * o + cj;
    if (V == 8 && !a.bias[j]) {
        *(uint4 *)dst = *(const uint4 *)(work + e);
        return;
    }
#pragma unroll
    for (int t = 0; t < V; t++)   // as bias_kernel: bf16(bf16 product + fp32 bias)
        dst[t] = a.bias[j] ? __float2bfloat16(__bfloat162float(work[e + t]) + a.bias[j][cj + t])
                           : work[e + t];
}

// Whether w[0..k) are consecutive row ranges of one fused weight (weight_fuse).
static int consecutive(const bk_weight *const *w, int k) {
    for (int j = 0; j < k; j++)
        if (!w[j]->fused || w[j]->fused != w[0]->fused ||
            (j && w[j]->row0 != w[j - 1]->row0 + w[j - 1]->rows))
            return 0;
    return 1;
}

// out[j] = x @ W[j]^T + bias[j]: one GEMM over the fused rows when the W[j] are consecutive
// parts of one fused weight (q|k|v), split into the outputs with the biases added; else one
// GEMM each.
void cuda_matmul_multi(backend *b, int k, void *const *out, const void *x, const bk_weight *const *w,
                       const bk_weight *const *bias, int n, int in, const int *o) {
    cuda_impl *c = impl(b);
    if (k < 2 || k > 4 || !consecutive(w, k) || n == 0) {
        for (int j = 0; j < k; j++) cuda_matmul(b, out[j], x, w[j], bias[j], n, in, o[j]);
        return;
    }
    split_args a = {};
    a.k = k;
    int v8 = 1;
    for (int j = 0; j < k; j++) {
        CHECK_INTERNAL(w[j]->rows == (size_t)o[j] && w[j]->cols == (size_t)in, "matmul weight is "
                       "%zu x %zu, expected %d x %d", w[j]->rows, w[j]->cols, o[j], in);
        CHECK_INTERNAL(!bias[j] || (bias[j]->f && bias[j]->cols == (size_t)o[j]),
                       "bias must be a vector of %d", o[j]);
        a.out[j] = (bf16 *)out[j], a.bias[j] = bias[j] ? bias[j]->f : NULL;
        a.off[j + 1] = a.off[j] + o[j];
        v8 &= o[j] % 8 == 0 && (uintptr_t)out[j] % 16 == 0;
    }
    int O = a.off[k];
    bf16 *work = (bf16 *)dev_buf_reserve(c, &c->fused_out, (size_t)n * O * sizeof(bf16),
                                         "a fused product");
    product(c, work, x, w[0], n, in, O);   // w[0] views the first of the O consecutive rows
    size_t total = (size_t)n * O;
    if (v8)
        CUDA_LAUNCH(split_kernel<8>, cuda_blocks(total / 8, THREADS), THREADS, 0, c->stream, work, a, n);
    else
        CUDA_LAUNCH(split_kernel<1>, cuda_blocks(total, THREADS), THREADS, 0, c->stream, work, a, n);
}

// out (n, f) = silu(x @ Wg^T) * (x @ Wu^T): one GEMM over the fused gate|up rows, then one pass
// over its output; -1 when gate and up are not fused (the caller runs them apart).
int cuda_swiglu_matmul(backend *b, void *out, const void *x, const bk_weight *gate,
                       const bk_weight *up, int n, int in, int f) {
    cuda_impl *c = impl(b);
    const bk_weight *w[] = {gate, up};
    if (!consecutive(w, 2)) return -1;
    CHECK_INTERNAL(gate->rows == (size_t)f && up->rows == (size_t)f && gate->cols == (size_t)in,
                   "gate/up weights are %zu x %zu, expected %d x %d", gate->rows, gate->cols, f, in);
    if (n == 0) return 0;
    bf16 *work = (bf16 *)dev_buf_reserve(c, &c->fused_out, (size_t)n * 2 * f * sizeof(bf16),
                                         "a fused product");
    product(c, work, x, gate, n, in, 2 * f);
    swiglu_halves(c, (bf16 *)out, work, n, f);
    return 0;
}

// ---- ceilings ---------------------------------------------------------------------------------

// Milliseconds per run of fn(c, ctx) on the stream: 2 warm-up runs, then the mean of `reps`.
static float time_ms(cuda_impl *c, void (*fn)(cuda_impl *, void *), void *ctx, int reps) {
    cudaEvent_t t0, t1;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    fn(c, ctx);
    fn(c, ctx);
    CUDA_CHECK(cudaEventRecord(t0, c->stream));
    for (int i = 0; i < reps; i++) fn(c, ctx);
    CUDA_CHECK(cudaEventRecord(t1, c->stream));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    CUDA_CHECK(cudaEventDestroy(t0));
    CUDA_CHECK(cudaEventDestroy(t1));
    return ms / reps;
}

typedef struct {
    void *a, *b, *d;
    int n;
    size_t bytes;
} ceil_bufs;

static void run_gemm(cuda_impl *c, void *ctx) {
    ceil_bufs *t = (ceil_bufs *)ctx;
    gemm_bf16(c, t->d, t->b, t->a, t->n, t->n, t->n);
}

static void run_copy(cuda_impl *c, void *ctx) {
    ceil_bufs *t = (ceil_bufs *)ctx;
    CUDA_CHECK(cuda_memcpy_async(t->d, t->a, t->bytes, cudaMemcpyDeviceToDevice, c->stream));
}

// A bf16 8192^3 GEMM (random operands) and a 1 GiB device-to-device copy; 0, or -1 when the
// buffers do not fit.
int cuda_ceilings(backend *b, double *tflops, double *gbps) {
    cuda_impl *c = impl(b);
    ceil_bufs t = {NULL, NULL, NULL, 8192, (size_t)1 << 30};
    size_t mat = (size_t)t.n * t.n * sizeof(bf16);
    *tflops = *gbps = -1;
    if (cuda_malloc((void **)&t.a, t.bytes) || cuda_malloc((void **)&t.b, mat) || cuda_malloc((void **)&t.d, t.bytes)) {
        cudaGetLastError();
        cudaFree(t.a), cudaFree(t.b), cudaFree(t.d);
        return -1;
    }
    size_t elems = t.bytes / sizeof(bf16);
    synth_fill(c, (bf16 *)t.a, NULL, 1, 1, elems, 1.0f, 0.0f);
    synth_fill(c, (bf16 *)t.b, NULL, 1, 2, mat / 2, 1.0f, 0.0f);
    double ms = time_ms(c, run_gemm, &t, 10);
    *tflops = 2.0 * t.n * t.n * (double)t.n / (ms * 1e-3) / 1e12;
    ms = time_ms(c, run_copy, &t, 10);
    *gbps = 2.0 * (double)t.bytes / (ms * 1e-3) / 1e9;
    CUDA_CHECK(cudaFree(t.a));
    CUDA_CHECK(cudaFree(t.b));
    CUDA_CHECK(cudaFree(t.d));
    return 0;
}
