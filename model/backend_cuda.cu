// model/backend_cuda.cu — the CUDA backend: bf16 weights, activations and KV cache on one GPU,
// fp32 accumulation in every kernel and GEMM. Linear layers run through cuBLASLt (tensor cores),
// loaded at run time with dlopen: the toolkit has no static cuBLASLt, and a binary linked to the
// .so would not start on machines without it. Attention lives in attn/attn_cuda.cu.
// Host index arrays (tokens, positions, row and KV selections) are copied to the device per call.
// Each KV buffer's entry positions are mirrored on the device, keyed by its K buffer: kv_append
// and kv_keep, the only writers of kv_layer.pos, update host and device copies together.
#include <cublasLt.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "../attn/attn_cuda.h"
#include "../attn/phi_cuda.h"
#include "../attn/score_cuda.h"
#include "cuda_util.cuh"
extern "C" {
extern "C" {
#include "../attn/phi.h"
}
#include "../kv/kv.h"
#include "../util/check.h"
#include "../weights/dequant.h"
#include "../weights/synthetic.h"
#include "backend.h"
}

#define THREADS 256
#define MM_PLANS 64                   // cached GEMM shapes
#define LT_WORKSPACE (32u << 20)      // cuBLASLt workspace bytes
#define WEIGHT_CHUNK ((size_t)16 << 20)   // fp32 elements converted per upload

// ---- cuBLASLt, looked up at run time ----------------------------------------------------------

typedef struct lt_api {
    void *so;
    decltype(&cublasLtCreate) create;
    decltype(&cublasLtDestroy) destroy;
    decltype(&cublasLtGetStatusString) status_string;
    decltype(&cublasLtMatmulDescCreate) desc_create;
    decltype(&cublasLtMatmulDescDestroy) desc_destroy;
    decltype(&cublasLtMatmulDescSetAttribute) desc_set;
    decltype(&cublasLtMatrixLayoutCreate) layout_create;
    decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
    decltype(&cublasLtMatmulPreferenceCreate) pref_create;
    decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
    decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
    decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
    decltype(&cublasLtMatmul) matmul;
} lt_api;

// Opens libcublasLt of the major version built against ($SIFT_CUBLASLT first); 0 or -1 + err.
static int lt_load(lt_api *lt, char *err, size_t errlen) {
    const char *env = getenv("SIFT_CUBLASLT");
    const char *names[] = {env, "libcublasLt.so.13", "/usr/local/cuda/lib64/libcublasLt.so.13",
                           "/usr/local/cuda-13.0/lib64/libcublasLt.so.13"};
    memset(lt, 0, sizeof *lt);
    if (CUDA_EMULATED) lt->so = dlopen(NULL, RTLD_NOW);   // the emulator's own (model/simt/)
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

static void lt_check(const lt_api *lt, cublasStatus_t s, const char *what, const char *file,
                     int line) {
    if (s == CUBLAS_STATUS_SUCCESS) return;
    fprintf(stderr, "sift: cuBLASLt error at %s:%d: %s: %s\n"
            "hint: check the GPU's memory and the cuBLAS version (CUDA 13), or use --device cpu\n",
            file, line, what, lt->status_string(s));
    exit(3);
}
#define LT_CHECK(c, call) lt_check(&(c)->lt, (call), #call, __FILE__, __LINE__)

// ---- backend state ----------------------------------------------------------------------------

typedef struct dev_buf {   // a device buffer that grows on demand
    void *p;
    size_t bytes;
} dev_buf;

typedef struct mm_plan {   // out (n, o) = x (n, in) @ W (o, in)^T, bf16 in and out
    int n, in, o;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t w, x, out;
    cublasLtMatmulAlgo_t algo;
} mm_plan;

typedef struct pos_mirror {   // device copy of a KV layer's entry positions
    const void *kbuf;         // the layer's K buffer (the key)
    int *dpos;                // (n_kv_head, cap)
} pos_mirror;

enum { STAGE_IDX, STAGE_AUX, STAGE_PAR, STAGE_ROWS, STAGE_OF, STAGE_SUM, STAGES };   // per op

#define STAGE_REUSE_MAX (1u << 20)   // uploads up to this size are skipped when unchanged
#define SPARE_MAX 32   // freed buffers kept for reuse (a decode step frees and allocates the same
                       // sizes every step); when full, the least recently freed is released, so
                       // buffers of a size no longer asked for (a freed KV cache) age out

typedef struct dev_block {   // a buffer handed out by alloc, or kept after free
    void *p;
    size_t bytes;
} dev_block;

typedef struct cuda_impl {
    int n_sm;
    cudaStream_t stream;
    lt_api lt;
    cublasLtHandle_t lt_handle;
    void *lt_work;
    mm_plan plans[MM_PLANS];
    int n_plans, next_evict;
    dev_buf stage[STAGES], attn_work, probs, f32, phi_f, phi_q, phi_sum, topk;
    void *stage_last[STAGES];        // host copy of each stage buffer's last small upload
    size_t stage_last_bytes[STAGES];
    pos_mirror *mirrors;
    int n_mirrors, cap_mirrors;
    dev_block *live;                 // buffers alloc handed out (their sizes, for reuse)
    int n_live, cap_live;
    dev_block spare[SPARE_MAX];      // freed buffers, reused by an alloc of the same size
    int n_spare;
} cuda_impl;

struct bk_weight {
    bf16 *h;          // (rows, cols)
    float *f;         // (cols,) fp32 copy when rows == 1 (norm weights, biases)
    size_t rows, cols;
};

static cuda_impl *impl(backend *b) { return (cuda_impl *)b->impl; }

static void report_oom(size_t bytes, const char *what) {
    size_t free_b = 0, total = 0;
    cudaGetLastError();   // a failed cudaMalloc must not surface at the next launch check
    cudaMemGetInfo(&free_b, &total);
    fprintf(stderr, "sift: GPU out of memory: %s needs %.1f MiB, %.1f MiB free of %.1f MiB "
            "(try a shorter prompt, a smaller -c, or --device cpu)\n", what, bytes / 1048576.0,
            free_b / 1048576.0, total / 1048576.0);
}

// Device memory free now, plus the spare buffers an allocation would give back first.
static size_t cuda_mem_available(backend *b) {
    cuda_impl *c = impl(b);
    size_t free_b = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
    for (int i = 0; i < c->n_spare; i++) free_b += c->spare[i].bytes;
    return free_b;
}

// Frees device memory once the work queued on the stream (which may read it) is done.
static void dev_free_after(cudaStream_t st, void *p) {
    CUDA_CHECK(cudaStreamSynchronize(st));
    CUDA_CHECK(cudaFree(p));
}

// Gives the spare buffers back to CUDA (when an allocation did not fit).
static void spare_release(cuda_impl *c) {
    for (int i = 0; i < c->n_spare; i++) dev_free_after(c->stream, c->spare[i].p);
    c->n_spare = 0;
}

// cudaMalloc, retried once without the spares; NULL with the OOM report when it does not fit.
static void *dev_try_alloc(cuda_impl *c, size_t bytes, const char *what) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess) return p;
    cudaGetLastError();
    spare_release(c);
    if (cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess) return p;
    report_oom(bytes, what);
    return NULL;
}

// dev_try_alloc for memory the caller cannot do without: exits when it does not fit.
static void *dev_alloc(cuda_impl *c, size_t bytes, const char *what) {
    void *p = dev_try_alloc(c, bytes, what);
    if (!p) exit(1);
    return p;
}

static void *dev_buf_reserve(cuda_impl *c, dev_buf *b, size_t bytes, const char *what) {
    if (bytes <= b->bytes) return b->p;
    size_t want = bytes > 2 * b->bytes ? bytes : 2 * b->bytes;
    if (b->p) dev_free_after(c->stream, b->p);
    b->p = dev_alloc(c, want, what);
    b->bytes = want;
    return b->p;
}

// Copies host[0..bytes) to the stage buffer `slot` (stream-ordered); the device pointer. A small
// upload equal to the slot's last one is skipped: the positions of a pass are the same for every
// layer's RoPE and attention, and so are the RoPE frequencies.
static void *stage(cuda_impl *c, int slot, const void *host, size_t bytes) {
    size_t had = c->stage[slot].bytes;
    void *d = dev_buf_reserve(c, &c->stage[slot], bytes < 4096 ? 4096 : bytes, "index upload");
    if (bytes == 0) return d;
    if (c->stage[slot].bytes == had && bytes == c->stage_last_bytes[slot] &&
        memcmp(c->stage_last[slot], host, bytes) == 0)
        return d;
    CUDA_CHECK(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, c->stream));
    c->stage_last_bytes[slot] = bytes <= STAGE_REUSE_MAX ? bytes : 0;   // 0: nothing to reuse
    if (bytes <= STAGE_REUSE_MAX) {
        c->stage_last[slot] = xrealloc(c->stage_last[slot], bytes);
        memcpy(c->stage_last[slot], host, bytes);
    }
    return d;
}

// ---- memory and weights -----------------------------------------------------------------------

static void live_add(cuda_impl *c, void *p, size_t bytes) {
    if (c->n_live == c->cap_live) {
        c->cap_live = c->cap_live ? 2 * c->cap_live : 256;
        c->live = (dev_block *)xrealloc(c->live, (size_t)c->cap_live * sizeof *c->live);
    }
    c->live[c->n_live++] = (dev_block){p, bytes};
}

// A spare buffer of exactly `bytes` (reuse is stream-ordered: no wait), else a new one; NULL
// with the OOM report when the GPU has no room even without the spares.
static void *cuda_alloc(backend *b, size_t n) {
    cuda_impl *c = impl(b);
    size_t bytes = (n ? n : 1) * sizeof(bf16);
    void *p = NULL;
    for (int i = c->n_spare - 1; i >= 0 && !p; i--)   // the most recently freed first
        if (c->spare[i].bytes == bytes) {
            p = c->spare[i].p;
            memmove(c->spare + i, c->spare + i + 1, (size_t)(--c->n_spare - i) * sizeof *c->spare);
        }
    if (!p && !(p = dev_try_alloc(c, bytes, "an activation or KV buffer"))) return NULL;
    live_add(c, p, bytes);
    return p;
}

static void mirror_drop(cuda_impl *c, const void *kbuf) {
    for (int i = 0; i < c->n_mirrors; i++)
        if (c->mirrors[i].kbuf == kbuf) {
            dev_free_after(c->stream, c->mirrors[i].dpos);
            c->mirrors[i] = c->mirrors[--c->n_mirrors];
            return;
        }
}

// Frees a buffer of alloc (or of kv_keep): kept as a spare while there is room.
static void cuda_free(backend *b, void *p) {
    cuda_impl *c = impl(b);
    if (!p) return;
    mirror_drop(c, p);
    int i = 0;
    while (i < c->n_live && c->live[i].p != p) i++;
    CHECK_INTERNAL(i < c->n_live, "freeing a buffer the CUDA backend did not hand out");
    dev_block blk = c->live[i];
    c->live[i] = c->live[--c->n_live];
    if (c->n_spare == SPARE_MAX) {   // full: the least recently freed goes back to CUDA
        dev_free_after(c->stream, c->spare[0].p);
        memmove(c->spare, c->spare + 1, (size_t)--c->n_spare * sizeof *c->spare);
    }
    c->spare[c->n_spare++] = blk;   // spare[] runs from least to most recently freed
}

// bf16 (n,) -> fp32 (n,)
__global__ void bf16_to_f32_kernel(float *dst, const bf16 *src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __bfloat162float(src[i]);
}

// fp32 (n,) -> bf16 (n,), round to nearest even
__global__ void f32_to_bf16_kernel(bf16 *dst, const float *src, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = __float2bfloat16_rn(src[i]);
}

static void cuda_to_host(backend *b, float *dst, const void *src, size_t n) {
    cuda_impl *c = impl(b);
    if (n == 0) return;
    float *f = (float *)dev_buf_reserve(c, &c->f32, n * sizeof(float), "a copy to the host");
    CUDA_LAUNCH(bf16_to_f32_kernel, cuda_blocks(n, THREADS), THREADS, 0, c->stream, f,
                (const bf16 *)src, n);
    CUDA_CHECK(cudaMemcpyAsync(dst, f, n * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

static bk_weight *weight_new(cuda_impl *c, size_t rows, size_t cols) {
    bk_weight *w = (bk_weight *)xcalloc(1, sizeof *w);
    w->rows = rows ? rows : 1;
    w->cols = cols;
    w->h = (bf16 *)dev_alloc(c, w->rows * cols * sizeof(bf16), "the model's weights");
    if (w->rows == 1) w->f = (float *)dev_alloc(c, cols * sizeof(float), "the model's weights");
    return w;
}

// t in its file encoding: whole rows are dequantised on the host into one fp32 chunk of at most
// WEIGHT_CHUNK elements (an F32 tensor is read in place), uploaded, rounded to bf16 on the
// device; peak host memory is one chunk, not the tensor.
static bk_weight *cuda_weight(backend *b, bk_tensor t) {
    cuda_impl *c = impl(b);
    bk_weight *w = weight_new(c, t.rows, t.cols);
    size_t cols = t.cols, row_bytes = dq_bytes(t.type, cols);
    size_t chunk_rows = cols >= WEIGHT_CHUNK ? 1 : WEIGHT_CHUNK / cols;
    float *buf = t.type == GGML_F32 ? NULL
                                    : (float *)xmalloc((chunk_rows < w->rows ? chunk_rows : w->rows) *
                                                       cols * sizeof(float));
    for (size_t r0 = 0; r0 < w->rows; r0 += chunk_rows) {
        size_t nr = w->rows - r0 < chunk_rows ? w->rows - r0 : chunk_rows, k = nr * cols;
        const float *src = (const float *)((const uint8_t *)t.data + r0 * row_bytes);
        if (buf) {
            for (size_t r = 0; r < nr; r++)
                dq_to_f32(t.type, (const uint8_t *)t.data + (r0 + r) * row_bytes, buf + r * cols,
                          cols);
            src = buf;
        }
        float *d = (float *)stage(c, STAGE_AUX, src, k * sizeof(float));
        CUDA_LAUNCH(f32_to_bf16_kernel, cuda_blocks(k, THREADS), THREADS, 0, c->stream,
                    w->h + r0 * cols, d, k);
        if (w->f && r0 == 0)   // a vector: its fp32 copy too
            CUDA_CHECK(cudaMemcpyAsync(w->f, d, cols * sizeof(float), cudaMemcpyDeviceToDevice,
                                       c->stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    free(buf);
    if (t.owned) free((void *)t.data);
    return w;
}

// bytes of device memory t takes as bf16 (+ the fp32 copy of a vector)
static size_t cuda_weight_bytes(backend *b, bk_tensor t) {
    (void)b;
    size_t rows = t.rows ? t.rows : 1;
    return rows * t.cols * sizeof(bf16) + (rows == 1 ? t.cols * sizeof(float) : 0);
}

static void cuda_weight_free(backend *b, bk_weight *w) {
    if (!w) return;
    dev_free_after(impl(b)->stream, w->h);
    if (w->f) CUDA_CHECK(cudaFree(w->f));
    free(w);
}

// h (n,) = bf16(v), f (n,) = v (when f), v = offset + scale * synth_uniform(seed, tensor, i)
__global__ void synth_kernel(bf16 *h, float *f, uint64_t seed, uint64_t tensor, size_t n,
                             float scale, float offset) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = __fadd_rn(offset, __fmul_rn(scale, synth_uniform(seed, tensor, i)));   // as the host
    h[i] = __float2bfloat16_rn(v);
    if (f) f[i] = v;
}

static bk_weight *cuda_weight_synth(backend *b, uint64_t seed, uint64_t tensor, size_t rows,
                                    size_t cols, float scale, float offset) {
    cuda_impl *c = impl(b);
    bk_weight *w = weight_new(c, rows, cols);
    size_t n = w->rows * cols;
    if (n) {
        CUDA_LAUNCH(synth_kernel, cuda_blocks(n, THREADS), THREADS, 0, c->stream, w->h, w->f, seed,
                    tensor, n, scale, offset);
    }
    return w;
}

// ---- elementwise and row ops -------------------------------------------------------------------

// out (n, d) = table[tokens[i]]
__global__ void embed_kernel(bf16 *out, const bf16 *table, const int *tokens, int n, int d) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)n * d) return;
    size_t i = e / d, c = e % d;
    out[e] = table[(size_t)tokens[i] * d + c];
}

static void cuda_embed(backend *b, void *out, const bk_weight *table, const int *tokens, int n,
                       int d) {
    cuda_impl *c = impl(b);
    if (n == 0 || d == 0) return;
    const int *tk = (const int *)stage(c, STAGE_IDX, tokens, (size_t)n * sizeof(int));
    size_t total = (size_t)n * d;
    CUDA_LAUNCH(embed_kernel, cuda_blocks(total, THREADS), THREADS, 0, c->stream, (bf16 *)out,
                table->h, tk, n, d);
}

// out (n, d) = x / sqrt(mean(x^2) + eps) * w; a block per row
__global__ void rmsnorm_kernel(bf16 *out, const bf16 *x, const float *w, int d, float eps) {
    __shared__ float red[32];
    const bf16 *xi = x + (size_t)blockIdx.x * d;
    bf16 *oi = out + (size_t)blockIdx.x * d;
    float ss = 0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float v = __bfloat162float(xi[j]);
        ss += v * v;
    }
    ss = block_reduce(ss, red, 0);
    float r = 1.0f / sqrtf(ss / d + eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        oi[j] = __float2bfloat16(__bfloat162float(xi[j]) * r * w[j]);
}

static void cuda_rmsnorm(backend *b, void *out, const void *x, const bk_weight *w, int n, int d,
                         float eps) {
    cuda_impl *c = impl(b);
    CHECK_INTERNAL(w->f && (int)w->cols == d, "RMSNorm weight must be a vector of %d", d);
    if (n == 0 || d == 0) return;
    CUDA_LAUNCH(rmsnorm_kernel, n, THREADS, 0, c->stream, (bf16 *)out, (const bf16 *)x, w->f, d,
                eps);
}

// out (n, o) += bias (o,)
__global__ void bias_kernel(bf16 *out, const float *bias, int n, int o) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)n * o) return;
    out[e] = __float2bfloat16(__bfloat162float(out[e]) + bias[e % o]);
}

static void plan_destroy(cuda_impl *c, mm_plan *p) {
    LT_CHECK(c, c->lt.layout_destroy(p->w));
    LT_CHECK(c, c->lt.layout_destroy(p->x));
    LT_CHECK(c, c->lt.layout_destroy(p->out));
    LT_CHECK(c, c->lt.desc_destroy(p->desc));
}

// In cuBLASLt's column-major terms: out (o x n, ld o) = W^T (W: in x o, ld in) @ x (in x n, ld in).
// 0, or -1 when cuBLASLt offers no algorithm (p then holds nothing to destroy).
static int plan_init(cuda_impl *c, mm_plan *p, int n, int in, int o) {
    p->n = n, p->in = in, p->o = o;
    LT_CHECK(c, c->lt.desc_create(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_T;
    LT_CHECK(c, c->lt.desc_set(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    LT_CHECK(c, c->lt.layout_create(&p->w, CUDA_R_16BF, in, o, in));
    LT_CHECK(c, c->lt.layout_create(&p->x, CUDA_R_16BF, in, n, in));
    LT_CHECK(c, c->lt.layout_create(&p->out, CUDA_R_16BF, o, n, o));
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
    const char *soft = getenv("SIFT_CUDA_SOFT_FAIL");
    fprintf(stderr, "sift: %s at %s:%d: cuBLASLt: %s for bf16 (%d x %d) @ (%d x %d)^T\n",
            soft && *soft == '1' ? "error (soft)" : "internal error", __FILE__, __LINE__, why, n,
            in, o, in);
    if (!(soft && *soft == '1')) exit(3);
}

// The cached plan for this shape, made (evicting round-robin when full) if new; NULL when
// cuBLASLt has no algorithm for it.
static const mm_plan *plan_get(cuda_impl *c, int n, int in, int o) {
    for (int i = 0; i < c->n_plans; i++)
        if (c->plans[i].n == n && c->plans[i].in == in && c->plans[i].o == o) return &c->plans[i];
    mm_plan *p;
    if (c->n_plans < MM_PLANS) p = &c->plans[c->n_plans++];
    else {
        p = &c->plans[c->next_evict];
        c->next_evict = (c->next_evict + 1) % MM_PLANS;
        plan_destroy(c, p);
    }
    if (plan_init(c, p, n, in, o) == 0) return p;
    *p = c->plans[--c->n_plans];   // keep the table dense: the last plan fills the slot
    if (c->next_evict >= c->n_plans) c->next_evict = 0;
    return NULL;
}

// out (n, o) = x (n, in) @ W (o, in)^T, all bf16, fp32 accumulation
static void gemm_bf16(cuda_impl *c, void *out, const void *x, const void *w, int n, int in, int o) {
    if (((uintptr_t)out | (uintptr_t)x | (uintptr_t)w) % 16) {
        gemm_refused(n, in, o, "operands not 16-byte aligned");
        return;
    }
    const mm_plan *p = plan_get(c, n, in, o);
    if (!p) {
        gemm_refused(n, in, o, "no algorithm");
        return;
    }
    float one = 1.0f, zero = 0.0f;
    LT_CHECK(c, c->lt.matmul(c->lt_handle, p->desc, &one, w, p->w, x, p->x, &zero, out, p->out,
                             out, p->out, &p->algo, c->lt_work, LT_WORKSPACE, c->stream));
}

static void cuda_matmul(backend *b, void *out, const void *x, const bk_weight *w,
                        const bk_weight *bias, int n, int in, int o) {
    cuda_impl *c = impl(b);
    CHECK_INTERNAL(w->rows == (size_t)o && w->cols == (size_t)in, "matmul weight is %zu x %zu, "
                   "expected %d x %d", w->rows, w->cols, o, in);
    if (n == 0 || o == 0) return;
    gemm_bf16(c, out, x, w->h, n, in, o);
    if (!bias) return;
    CHECK_INTERNAL(bias->f && bias->cols == (size_t)o, "bias must be a vector of %d", o);
    size_t total = (size_t)n * o;
    CUDA_LAUNCH(bias_kernel, cuda_blocks(total, THREADS), THREADS, 0, c->stream, (bf16 *)out,
                bias->f, n, o);
}

// rotate x (n, heads, hd) in place; pair (2j, 2j+1) for NORM, (j, j + hd/2) for NEOX;
// a thread per (row, head, pair); angles in double as on the CPU
__global__ void rope_kernel(bf16 *x, const int *pos, const float *inv_freq, int n, int heads,
                            int hd, int neox) {
    int half = hd / 2;
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)n * heads * half) return;
    size_t i = e / ((size_t)heads * half);
    int h = (int)(e / half % heads), j = (int)(e % half);
    double s, co;
    sincos((double)pos[i] * inv_freq[j], &s, &co);
    float fs = (float)s, fc = (float)co;
    bf16 *xh = x + (i * heads + h) * hd;
    int ia = neox ? j : 2 * j, ib = neox ? j + half : 2 * j + 1;
    float a = __bfloat162float(xh[ia]), bb = __bfloat162float(xh[ib]);
    xh[ia] = __float2bfloat16(a * fc - bb * fs);
    xh[ib] = __float2bfloat16(a * fs + bb * fc);
}

static void cuda_rope(backend *b, void *x, const int *pos, int n, int heads, int hd,
                      const float *inv_freq, enum rope_style style) {
    cuda_impl *c = impl(b);
    size_t total = (size_t)n * heads * (hd / 2);
    if (total == 0) return;
    const int *p = (const int *)stage(c, STAGE_IDX, pos, (size_t)n * sizeof(int));
    const float *f = (const float *)stage(c, STAGE_AUX, inv_freq, (size_t)(hd / 2) * sizeof(float));
    CUDA_LAUNCH(rope_kernel, cuda_blocks(total, THREADS), THREADS, 0, c->stream, (bf16 *)x, p, f, n,
                heads, hd, style == ROPE_NEOX);
}

// out (n,) = silu(gate) * up
__global__ void swiglu_kernel(bf16 *out, const bf16 *gate, const bf16 *up, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = __bfloat162float(gate[i]);
    out[i] = __float2bfloat16(g / (1.0f + expf(-g)) * __bfloat162float(up[i]));
}

static void cuda_swiglu(backend *b, void *out, const void *gate, const void *up, size_t n) {
    cuda_impl *c = impl(b);
    if (n == 0) return;
    CUDA_LAUNCH(swiglu_kernel, cuda_blocks(n, THREADS), THREADS, 0, c->stream, (bf16 *)out,
                (const bf16 *)gate, (const bf16 *)up, n);
}

// x (n,) += y (n,)
__global__ void add_kernel(bf16 *x, const bf16 *y, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __float2bfloat16(__bfloat162float(x[i]) + __bfloat162float(y[i]));
}

static void cuda_add(backend *b, void *x, const void *y, size_t n) {
    cuda_impl *c = impl(b);
    if (n == 0) return;
    CUDA_LAUNCH(add_kernel, cuda_blocks(n, THREADS), THREADS, 0, c->stream, (bf16 *)x,
                (const bf16 *)y, n);
}

// out (k, d) = x[idx[j]]
__global__ void gather_kernel(bf16 *out, const bf16 *x, const int *idx, int k, int d) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)k * d) return;
    out[e] = x[(size_t)idx[e / d] * d + e % d];
}

static void cuda_gather_rows(backend *b, void *out, const void *x, const int *idx, int k, int d) {
    cuda_impl *c = impl(b);
    size_t total = (size_t)k * d;
    if (total == 0) return;
    const int *ix = (const int *)stage(c, STAGE_IDX, idx, (size_t)k * sizeof(int));
    CUDA_LAUNCH(gather_kernel, cuda_blocks(total, THREADS), THREADS, 0, c->stream, (bf16 *)out,
                (const bf16 *)x, ix, k, d);
}

// ---- KV cache ---------------------------------------------------------------------------------

static pos_mirror *mirror_find(cuda_impl *c, const void *kbuf) {
    for (int i = 0; i < c->n_mirrors; i++)
        if (c->mirrors[i].kbuf == kbuf) return &c->mirrors[i];
    return NULL;
}

// Copies entries [from, from + n) of every KV head's host positions to the device mirror.
static void mirror_upload(cuda_impl *c, int *dpos, const kv_layer *L, int from, int n) {
    if (n <= 0) return;
    size_t pitch = (size_t)L->cap * sizeof(int);
    CUDA_CHECK(cudaMemcpy2DAsync(dpos + from, pitch, L->pos + from, pitch, (size_t)n * sizeof(int),
                                 (size_t)L->n_kv_head, cudaMemcpyHostToDevice, c->stream));
}

// L's device positions, made from the host copy the first time L's K buffer is seen.
static int *mirror_get(cuda_impl *c, const kv_layer *L) {
    pos_mirror *m = mirror_find(c, L->k);
    if (m) return m->dpos;
    if (c->n_mirrors == c->cap_mirrors) {
        c->cap_mirrors = c->cap_mirrors ? 2 * c->cap_mirrors : 64;
        c->mirrors = (pos_mirror *)xrealloc(c->mirrors, (size_t)c->cap_mirrors * sizeof *c->mirrors);
    }
    size_t n = (size_t)L->n_kv_head * (L->cap > 0 ? L->cap : 1);
    int *dpos = (int *)dev_alloc(c, n * sizeof(int), "KV cache positions");
    c->mirrors[c->n_mirrors++] = (pos_mirror){L->k, dpos};
    mirror_upload(c, dpos, L, 0, L->len);
    return dpos;
}

// dpos (n_kv_head, cap) entries len .. len + n of every KV head = pos (n,), device to device
__global__ void kv_pos_kernel(int *dpos, const int *pos, int n, int n_kv_head, int cap, int len) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n * n_kv_head) return;
    dpos[(size_t)(e / n) * cap + len + e % n] = pos[e % n];
}

// k, v (n, n_kv_head, hd) -> dk, dv (n_kv_head, cap, hd) at entries len .. len + n
__global__ void kv_append_kernel(bf16 *dk, bf16 *dv, const bf16 *k, const bf16 *v, int n,
                                 int n_kv_head, int hd, int cap, int len) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)n * n_kv_head * hd) return;
    size_t i = e / ((size_t)n_kv_head * hd);
    int g = (int)(e / hd % n_kv_head), c = (int)(e % hd);
    size_t dst = ((size_t)g * cap + len + i) * hd + c;
    dk[dst] = k[e];
    dv[dst] = v[e];
}

static void cuda_kv_append(backend *b, kv_layer *L, const void *k, const void *v, const int *pos,
                           int n) {
    cuda_impl *c = impl(b);
    CHECK_INTERNAL(L->len + n <= L->cap, "KV layer overflow: %d + %d > %d", L->len, n, L->cap);
    if (n == 0) return;
    int *dpos = mirror_get(c, L);
    size_t total = (size_t)n * L->n_kv_head * L->head_dim;
    CUDA_LAUNCH(kv_append_kernel, cuda_blocks(total, THREADS), THREADS, 0, c->stream, (bf16 *)L->k,
                (bf16 *)L->v, (const bf16 *)k, (const bf16 *)v, n, L->n_kv_head, L->head_dim,
                L->cap, L->len);
    for (int g = 0; g < L->n_kv_head; g++)
        for (int i = 0; i < n; i++) L->pos[(size_t)g * L->cap + L->len + i] = pos[i];
    // the device copy from the pass's positions already staged for RoPE (no upload per layer)
    const int *dp = (const int *)stage(c, STAGE_IDX, pos, (size_t)n * sizeof(int));
    CUDA_LAUNCH(kv_pos_kernel, cuda_blocks((size_t)n * L->n_kv_head, THREADS), THREADS, 0,
                c->stream, dpos, dp, n, L->n_kv_head, L->cap, L->len);
    L->len += n;
}

// K/V (n_kv_head, cap, hd) -> nk/nv (n_kv_head, new_cap, hd): entry j of head g = idx[g*k + j]
__global__ void kv_keep_kernel(bf16 *nk, bf16 *nv, const bf16 *k, const bf16 *v, const int *idx,
                               int n_kv_head, int keep, int hd, int cap, int new_cap) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)n_kv_head * keep * hd) return;
    int g = (int)(e / ((size_t)keep * hd)), j = (int)(e / hd % keep), c = (int)(e % hd);
    size_t src = ((size_t)g * cap + idx[(size_t)g * keep + j]) * hd + c;
    size_t dst = ((size_t)g * new_cap + j) * hd + c;
    nk[dst] = k[src];
    nv[dst] = v[src];
}

static void cuda_kv_keep(backend *b, kv_layer *L, const int *idx, int k, int new_cap) {
    cuda_impl *c = impl(b);
    int hd = L->head_dim, nh = L->n_kv_head;
    size_t n = (size_t)nh * (new_cap > 0 ? new_cap : 1);
    bf16 *nk = (bf16 *)cuda_alloc(b, n * hd), *nv = (bf16 *)cuda_alloc(b, n * hd);
    CHECK_INTERNAL(nk && nv, "out of GPU memory keeping %d KV entries per head", k);
    size_t total = (size_t)nh * k * hd;
    if (total) {
        const int *ix = (const int *)stage(c, STAGE_IDX, idx, (size_t)nh * k * sizeof(int));
        CUDA_LAUNCH(kv_keep_kernel, cuda_blocks(total, THREADS), THREADS, 0, c->stream, nk, nv,
                    (const bf16 *)L->k, (const bf16 *)L->v, ix, nh, k, hd, L->cap, new_cap);
    }
    int *np = (int *)xmalloc(n * sizeof(int));
    for (int g = 0; g < nh; g++)
        for (int j = 0; j < k; j++)
            np[(size_t)g * new_cap + j] = L->pos[(size_t)g * L->cap + idx[g * k + j]];
    cuda_free(b, L->k);   // after the gather above has read it
    cuda_free(b, L->v);
    free(L->pos);
    L->k = nk, L->v = nv, L->pos = np, L->cap = new_cap, L->len = k;
    mirror_get(c, L);     // uploads the kept positions
}

// ---- attention --------------------------------------------------------------------------------

static attn_cuda_args attn_args(cuda_impl *c, const void *q, const int *qpos, int n, int heads,
                                const kv_layer *L) {
    attn_cuda_args a = {q, NULL, n, heads, L->k, L->v, NULL, L->len, L->cap, L->n_kv_head,
                        L->head_dim};
    a.kpos = mirror_get(c, L);
    a.qpos = (const int *)stage(c, STAGE_IDX, qpos, (size_t)n * sizeof(int));
    return a;
}

static void cuda_attention(backend *b, void *out, const void *q, const int *qpos, int n, int heads,
                           const kv_layer *L) {
    cuda_impl *c = impl(b);
    if (n == 0) return;
    attn_cuda_args a = attn_args(c, q, qpos, n, heads, L);
    size_t wf = attn_cuda_work_floats(&a, c->n_sm);
    float *work = (float *)dev_buf_reserve(c, &c->attn_work, wf * sizeof(float), "attention partials");
    attn_causal_cuda(out, &a, work, c->n_sm, c->stream);
}

static void cuda_attn_probs(backend *b, float *probs, const void *q, const int *qpos, int n,
                            int heads, const kv_layer *L, int m) {
    cuda_impl *c = impl(b);
    size_t total = (size_t)n * heads * m;
    if (total == 0) return;
    attn_cuda_args a = attn_args(c, q, qpos, n, heads, L);
    float *d = (float *)dev_buf_reserve(c, &c->probs, total * sizeof(float), "attention probabilities");
    attn_probs_cuda(d, &a, m, c->stream);
    CUDA_CHECK(cudaMemcpyAsync(probs, d, total * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

// ---- selected decode attention and the phi completion summary (attn/phi_cuda.cu) ----------

static phi_cuda_shape phi_shape(const phi_maps *p) {
    phi_cuda_shape s = {p->kind, p->d_in, p->d_emb, p->d_hid, p->d_phi, phi_n_par(p)};
    return s;
}

static void phi_dims_check(const phi_maps *p, int hd) {
    int dims[] = {p->d_in, p->d_emb, p->d_hid, p->d_phi};
    for (int i = 0; i < 4; i++)
        CHECK_INTERNAL(dims[i] <= PHI_CUDA_MAX_DIM, "phi map dimension %d over the CUDA limit %d",
                       dims[i], PHI_CUDA_MAX_DIM);
    CHECK_INTERNAL(hd <= 256 && p->d_in == hd, "phi maps on head dim %d (CUDA: <= 256, = d_in %d)",
                   hd, p->d_in);
}

// Device log features of n rows of x (row index rows[r], parameter block of[r] of par, host
// arrays; par has n_blocks blocks): the phi_f buffer, (n, d_phi).
static float *phi_features(cuda_impl *c, const phi_maps *p, const float *par, int n_blocks,
                           const void *x, const int *rows, const int *of, int n) {
    size_t np = (size_t)phi_n_par(p);
    const float *dpar = (const float *)stage(c, STAGE_PAR, par, (size_t)n_blocks * np * sizeof(float));
    const int *drows = (const int *)stage(c, STAGE_ROWS, rows, (size_t)n * sizeof(int));
    const int *dof = (const int *)stage(c, STAGE_OF, of, (size_t)n * sizeof(int));
    float *F = (float *)dev_buf_reserve(c, &c->phi_f, ((size_t)n * p->d_phi + 1) * sizeof(float),
                                        "phi features");
    phi_features_cuda(F, x, drows, dof, n, dpar, phi_shape(p), c->stream);
    return F;
}

static void cuda_phi_summarize(backend *b, phi_summary *out, const phi_maps *p, int layer,
                               const kv_layer *L, int lo, int hi) {
    cuda_impl *c = impl(b);
    int n = hi - lo, nkv = L->n_kv_head, hd = L->head_dim, f = p->d_phi;
    phi_dims_check(p, hd);
    if (n <= 0) return;
    int *rows = (int *)xmalloc((size_t)nkv * n * sizeof(int)), *of = (int *)xmalloc((size_t)nkv * n * sizeof(int));
    for (int g = 0; g < nkv; g++)
        for (int i = 0; i < n; i++) rows[(size_t)g * n + i] = g * L->cap + lo + i, of[(size_t)g * n + i] = g;
    float *F = phi_features(c, p, phi_par_k(p, layer, 0), nkv, L->k, rows, of, nkv * n);
    size_t per = (size_t)f * (hd + 2);   // m, u, t of one KV head
    float *d = (float *)dev_buf_reserve(c, &c->phi_sum, (size_t)nkv * per * sizeof(float), "phi summary");
    float *dm = d, *du = d + (size_t)nkv * f, *dt = d + (size_t)2 * nkv * f;
    phi_summary_cuda(dm, du, dt, F, L->v, nkv, n, L->cap, lo, hd, f, c->stream);
    float *h = (float *)xmalloc((size_t)nkv * per * sizeof(float));
    CUDA_CHECK(cudaMemcpyAsync(h, d, (size_t)nkv * per * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    for (int g = 0; g < nkv; g++) {   // out[g] is fresh (fwd_phi_summarize checks): copy in
        phi_summary *s = &out[g];
        memcpy(s->m, h + (size_t)g * f, (size_t)f * sizeof(float));
        memcpy(s->u, h + (size_t)(nkv + g) * f, (size_t)f * sizeof(float));
        memcpy(s->t, h + (size_t)2 * nkv * f + (size_t)g * f * hd, (size_t)f * hd * sizeof(float));
        s->n = n;
    }
    free(rows), free(of), free(h);
}

static void cuda_attn_select(backend *b, void *out, const void *q, int heads, const kv_layer *L,
                             const int *sel, int n_sel, int n_sub, const phi_completion *comp) {
    cuda_impl *c = impl(b);
    int nkv = L->n_kv_head, hd = L->head_dim, group = heads / nkv;
    CHECK_INTERNAL(hd <= 256, "selected attention on head dim %d (CUDA: <= 256)", hd);
    const int *dsel = (const int *)stage(c, STAGE_IDX, sel, ((size_t)heads * n_sel + 1) * sizeof(int));
    float *work = (float *)dev_buf_reserve(c, &c->attn_work, ((size_t)heads * n_sel + 1) * sizeof(float),
                                           "selected attention scores");
    const phi_maps *p = comp ? comp->maps : NULL;
    if (!p || comp->sum[0].n <= n_sub) {   // nothing left to estimate: selection only
        phi_select_cuda(out, q, L->k, L->v, L->cap, heads, nkv, hd, dsel, n_sel, 0, NULL, NULL,
                        NULL, NULL, NULL, 0, 0, work, c->stream);
        return;
    }
    phi_dims_check(p, hd);
    int f = p->d_phi, *rows = (int *)xmalloc(((size_t)heads * n_sub + heads) * sizeof(int));
    int *of = (int *)xmalloc(((size_t)heads * n_sub + heads) * sizeof(int));
    for (int h = 0; h < heads; h++) rows[h] = h, of[h] = h;   // log phi_q of each head's query
    float *F = phi_features(c, p, phi_par_q(p, comp->layer, 0), heads, q, rows, of, heads);
    float *lq = (float *)dev_buf_reserve(c, &c->phi_q, (size_t)heads * f * sizeof(float), "phi queries");
    CUDA_CHECK(cudaMemcpyAsync(lq, F, (size_t)heads * f * sizeof(float), cudaMemcpyDeviceToDevice, c->stream));
    for (int h = 0; h < heads; h++)   // log phi_k of each head's n_sub retrieved keys
        for (int i = 0; i < n_sub; i++)
            rows[(size_t)h * n_sub + i] = (h / group) * L->cap + sel[(size_t)h * n_sel + i],
            of[(size_t)h * n_sub + i] = h / group;
    float *fsel = phi_features(c, p, phi_par_k(p, comp->layer, 0), nkv, L->k, rows, of, heads * n_sub);
    size_t per = (size_t)f * (hd + 2);
    float *h = (float *)xmalloc((size_t)nkv * per * sizeof(float));
    for (int g = 0; g < nkv; g++) {   // the summaries, laid out as phi_summary_cuda writes them
        const phi_summary *s = &comp->sum[g];
        memcpy(h + (size_t)g * f, s->m, (size_t)f * sizeof(float));
        memcpy(h + (size_t)(nkv + g) * f, s->u, (size_t)f * sizeof(float));
        memcpy(h + (size_t)2 * nkv * f + (size_t)g * f * hd, s->t, (size_t)f * hd * sizeof(float));
    }
    const float *d = (const float *)stage(c, STAGE_SUM, h, (size_t)nkv * per * sizeof(float));
    phi_select_cuda(out, q, L->k, L->v, L->cap, heads, nkv, hd, dsel, n_sel, n_sub, lq, fsel, d,
                    d + (size_t)nkv * f, d + (size_t)2 * nkv * f, f, comp->sum[0].n, work, c->stream);
    free(rows), free(of), free(h);
}

// Top K of one decode row's attention probabilities per head, selected on the device: only the
// (heads, k) indices come back, not the (heads, m) probabilities.
static void cuda_attn_topk(backend *b, int *idx, const void *q, int qpos, int heads,
                           const kv_layer *L, int m, int lo, int n, int k) {
    cuda_impl *c = impl(b);
    if (k == 0) return;
    attn_cuda_args a = attn_args(c, q, &qpos, 1, heads, L);
    float *d = (float *)dev_buf_reserve(c, &c->probs, (size_t)heads * m * sizeof(float),
                                        "attention probabilities");
    attn_probs_cuda(d, &a, m, c->stream);
    int *di = (int *)dev_buf_reserve(c, &c->topk, (size_t)heads * k * sizeof(int), "top-K indices");
    score_topk_rows_cuda(di, d + lo, (size_t)m, heads, n, k, lo, c->stream);
    CUDA_CHECK(cudaMemcpyAsync(idx, di, (size_t)heads * k * sizeof(int), cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
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
    CUDA_CHECK(cudaMemcpyAsync(t->d, t->a, t->bytes, cudaMemcpyDeviceToDevice, c->stream));
}

// A bf16 8192^3 GEMM (random operands) and a 1 GiB device-to-device copy; 0, or -1 when the
// buffers do not fit.
static int cuda_ceilings(backend *b, double *tflops, double *gbps) {
    cuda_impl *c = impl(b);
    ceil_bufs t = {NULL, NULL, NULL, 8192, (size_t)1 << 30};
    size_t mat = (size_t)t.n * t.n * sizeof(bf16);
    *tflops = *gbps = -1;
    if (cudaMalloc(&t.a, t.bytes) || cudaMalloc(&t.b, mat) || cudaMalloc(&t.d, t.bytes)) {
        cudaGetLastError();
        cudaFree(t.a), cudaFree(t.b), cudaFree(t.d);
        return -1;
    }
    size_t elems = t.bytes / sizeof(bf16);
    CUDA_LAUNCH(synth_kernel, cuda_blocks(elems, THREADS), THREADS, 0, c->stream, (bf16 *)t.a, nullptr,
                1, 1, elems, 1.0f, 0.0f);
    CUDA_LAUNCH(synth_kernel, cuda_blocks(mat / 2, THREADS), THREADS, 0, c->stream, (bf16 *)t.b,
                nullptr, 1, 2, mat / 2, 1.0f, 0.0f);
    double ms = time_ms(c, run_gemm, &t, 10);
    *tflops = 2.0 * t.n * t.n * (double)t.n / (ms * 1e-3) / 1e12;
    ms = time_ms(c, run_copy, &t, 10);
    *gbps = 2.0 * (double)t.bytes / (ms * 1e-3) / 1e9;
    CUDA_CHECK(cudaFree(t.a));
    CUDA_CHECK(cudaFree(t.b));
    CUDA_CHECK(cudaFree(t.d));
    return 0;
}

// ---- create / destroy -------------------------------------------------------------------------

static void cuda_destroy(backend *b) {
    cuda_impl *c = impl(b);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    for (int i = 0; i < c->n_plans; i++) plan_destroy(c, &c->plans[i]);
    LT_CHECK(c, c->lt.destroy(c->lt_handle));
    dev_buf *bufs[] = {&c->attn_work, &c->probs, &c->f32, &c->phi_f, &c->phi_q, &c->phi_sum, &c->topk};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]->p) CUDA_CHECK(cudaFree(bufs[i]->p));
    for (int i = 0; i < STAGES; i++)
        if (c->stage[i].p) CUDA_CHECK(cudaFree(c->stage[i].p));
    for (int i = 0; i < c->n_mirrors; i++) CUDA_CHECK(cudaFree(c->mirrors[i].dpos));
    free(c->mirrors);
    spare_release(c);
    for (int i = 0; i < c->n_live; i++) CUDA_CHECK(cudaFree(c->live[i].p));   // not freed by the user
    free(c->live);
    for (int i = 0; i < STAGES; i++) free(c->stage_last[i]);
    CUDA_CHECK(cudaFree(c->lt_work));
    CUDA_CHECK(cudaStreamDestroy(c->stream));
    dlclose(c->lt.so);
    free(c);
    free(b);
}

// Device 0 if it is usable (a driver, compute capability 8.0+); its description in msg.
static int pick_device(cudaDeviceProp *prop, char *msg, size_t len) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return err_printf(msg, len, "no usable GPU: %s (no NVIDIA driver, or one older than "
                          "this build's CUDA %d.%d)", cudaGetErrorString(e), CUDART_VERSION / 1000,
                          CUDART_VERSION % 1000 / 10);
    }
    if (count == 0) return err_printf(msg, len, "no CUDA GPU found");
    CUDA_CHECK(cudaGetDeviceProperties(prop, 0));
    if (prop->major < 8)
        return err_printf(msg, len, "%s has compute capability %d.%d; sift's CUDA path needs 8.0+",
                          prop->name, prop->major, prop->minor);
    CUDA_CHECK(cudaSetDevice(0));
    return 0;
}

backend *backend_cuda_create(char *msg, size_t len) {
    cudaDeviceProp prop;
    lt_api lt;
    if (pick_device(&prop, msg, len) || lt_load(&lt, msg, len)) return NULL;
    cuda_impl *c = (cuda_impl *)xcalloc(1, sizeof *c);
    c->lt = lt;
    c->n_sm = prop.multiProcessorCount;
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    LT_CHECK(c, c->lt.create(&c->lt_handle));
    c->lt_work = dev_alloc(c, LT_WORKSPACE, "the cuBLASLt workspace");
    size_t free_b = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
    snprintf(msg, len, "%s, %d SMs, %.1f GiB (%.1f GiB free), compute %d.%d", prop.name,
             prop.multiProcessorCount, total / 1073741824.0, free_b / 1073741824.0, prop.major,
             prop.minor);
    backend *b = (backend *)xcalloc(1, sizeof *b);
    b->name = "cuda";
    b->impl = c;
    b->elem_bytes = sizeof(bf16);
    b->destroy = cuda_destroy;
    b->alloc = cuda_alloc;
    b->free = cuda_free;
    b->to_host = cuda_to_host;
    b->weight = cuda_weight;
    b->weight_bytes = cuda_weight_bytes;
    b->weight_free = cuda_weight_free;
    b->embed = cuda_embed;
    b->rmsnorm = cuda_rmsnorm;
    b->matmul = cuda_matmul;
    b->rope = cuda_rope;
    b->swiglu = cuda_swiglu;
    b->add = cuda_add;
    b->gather_rows = cuda_gather_rows;
    b->kv_append = cuda_kv_append;
    b->attention = cuda_attention;
    b->attn_probs = cuda_attn_probs;
    b->kv_keep = cuda_kv_keep;
    b->weight_synth = cuda_weight_synth;
    b->ceilings = CUDA_EMULATED ? NULL : cuda_ceilings;   // no speed to measure in the emulator
    b->mem_available = cuda_mem_available;
    b->attn_select = cuda_attn_select;
    b->attn_topk = cuda_attn_topk;
    b->phi_summarize = cuda_phi_summarize;
    return b;
}
