// model/cuda_ops.cu — the CUDA backend's elementwise and row ops: embed, RMSNorm, RoPE, SwiGLU,
// residual add, row gather. Each kernel beside its launcher; the CPU twins are the same ops in
// model/backend_cpu.c.
#include "cuda_backend.cuh"

// ---- elementwise and row ops -------------------------------------------------------------------

// out (n, d) = table[tokens[i]]
__global__ void embed_kernel(bf16 *out, const bf16 *table, const int *tokens, int n, int d) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)n * d) return;
    size_t i = e / d, c = e % d;
    out[e] = table[(size_t)tokens[i] * d + c];
}

void cuda_embed(backend *b, void *out, const bk_weight *table, const int *tokens, int n,
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

void cuda_rmsnorm(backend *b, void *out, const void *x, const bk_weight *w, int n, int d,
                         float eps) {
    cuda_impl *c = impl(b);
    CHECK_INTERNAL(w->f && (int)w->cols == d, "RMSNorm weight must be a vector of %d", d);
    if (n == 0 || d == 0) return;
    CUDA_LAUNCH(rmsnorm_kernel, n, THREADS, 0, c->stream, (bf16 *)out, (const bf16 *)x, w->f, d,
                eps);
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

void cuda_rope(backend *b, void *x, const int *pos, int n, int heads, int hd,
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

void cuda_swiglu(backend *b, void *out, const void *gate, const void *up, size_t n) {
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

void cuda_add(backend *b, void *x, const void *y, size_t n) {
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

void cuda_gather_rows(backend *b, void *out, const void *x, const int *idx, int k, int d) {
    cuda_impl *c = impl(b);
    size_t total = (size_t)k * d;
    if (total == 0) return;
    const int *ix = (const int *)stage(c, STAGE_IDX, idx, (size_t)k * sizeof(int));
    CUDA_LAUNCH(gather_kernel, cuda_blocks(total, THREADS), THREADS, 0, c->stream, (bf16 *)out,
                (const bf16 *)x, ix, k, d);
}
