// backend/ops_cuda.cu — the CUDA backend's elementwise and row ops: embed, RMSNorm, RoPE (from a
// cos/sin table), SwiGLU, residual add, row gather. Each kernel beside its launcher; the CPU
// twins are the same ops in ops_cpu.c. Elementwise kernels move 16 bytes (8 bf16) per
// thread when the sizes allow (V8 kernels), one element otherwise; both round each element the
// same way, so which one ran never changes a result.
#include "backend_cuda.cuh"

// ---- 16-byte access -----------------------------------------------------------------------------

// f[0..8) = p[0..8), one 16-byte load (p 16-byte aligned)
__device__ static inline void ld8(float *f, const bf16 *p) {
    uint4 u = *(const uint4 *)p;
    const bf16 *h = (const bf16 *)&u;
#pragma unroll
    for (int i = 0; i < 8; i++) f[i] = __bfloat162float(h[i]);
}

// p[0..8) = bf16(f[0..8)), one 16-byte store
__device__ static inline void st8(bf16 *p, const float *f) {
    uint4 u;
    bf16 *h = (bf16 *)&u;
#pragma unroll
    for (int i = 0; i < 8; i++) h[i] = __float2bfloat16(f[i]);
    *(uint4 *)p = u;
}

// Whether n elements at each pointer can go 8 at a time (n % 8 == 0, 16-byte aligned).
static int v8(size_t n, const void *a, const void *b, const void *c) {
    return n % 8 == 0 && ((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) % 16 == 0;
}

// ---- rows --------------------------------------------------------------------------------------

// out (n, d) = table[tokens[i]]; V8: a thread per 8 elements (d % 8 == 0)
template <int V>
__global__ void embed_kernel(bf16 *out, const bf16 *table, const int *tokens, int n, int d) {
    size_t e = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (e >= (size_t)n * d) return;
    size_t i = e / d, c = e % d;
    const bf16 *src = table + (size_t)tokens[i] * d + c;
    if (V == 8) *(uint4 *)(out + e) = *(const uint4 *)src;
    else out[e] = *src;
}

void cuda_embed(backend *b, void *out, const bk_weight *table, const int *tokens, int n, int d) {
    cuda_impl *c = impl(b);
    if (n == 0 || d == 0) return;
    const int *tk = indices(c, STAGE_IDX, tokens, n);
    if (table->q) {
        cuda_qembed(c, out, table, tk, n, d);
        return;
    }
    size_t total = (size_t)n * d;
    if (v8((size_t)d, out, table->h, NULL))
        CUDA_LAUNCH(embed_kernel<8>, cuda_blocks(total / 8, THREADS), THREADS, 0, c->stream,
                    (bf16 *)out, table->h, tk, n, d);
    else
        CUDA_LAUNCH(embed_kernel<1>, cuda_blocks(total, THREADS), THREADS, 0, c->stream,
                    (bf16 *)out, table->h, tk, n, d);
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

// out (k, d) = x[idx[j]]; V8: a thread per 8 elements (d % 8 == 0)
template <int V>
__global__ void gather_kernel(bf16 *out, const bf16 *x, const int *idx, int k, int d) {
    size_t e = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (e >= (size_t)k * d) return;
    const bf16 *src = x + (size_t)idx[e / d] * d + e % d;
    if (V == 8) *(uint4 *)(out + e) = *(const uint4 *)src;
    else out[e] = *src;
}

void cuda_gather_rows(backend *b, void *out, const void *x, const int *idx, int k, int d) {
    cuda_impl *c = impl(b);
    size_t total = (size_t)k * d;
    if (total == 0) return;
    const int *ix = indices(c, STAGE_IDX, idx, k);
    if (v8((size_t)d, out, x, NULL))
        CUDA_LAUNCH(gather_kernel<8>, cuda_blocks(total / 8, THREADS), THREADS, 0, c->stream,
                    (bf16 *)out, (const bf16 *)x, ix, k, d);
    else
        CUDA_LAUNCH(gather_kernel<1>, cuda_blocks(total, THREADS), THREADS, 0, c->stream,
                    (bf16 *)out, (const bf16 *)x, ix, k, d);
}

// ---- RoPE --------------------------------------------------------------------------------------

// cs (rows, half) = (cos, sin) of p * inv_freq[j], the angle in double and each rounded to float
// (as rope_kernel computed them per element before the table, and as the CPU does)
__global__ void rope_table_kernel(float2 *cs, const float *inv_freq, int half, int rows) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)rows * half) return;
    double s, co;
    sincos((double)(e / half) * inv_freq[e % half], &s, &co);
    cs[e] = make_float2((float)co, (float)s);
}

// Grows table t to hold positions < rows (recomputed whole: growth doubles, so it is rare).
static void rope_table_grow(cuda_impl *c, rope_table *t, int rows) {
    CHECK_INTERNAL(!c->recording, "the RoPE table grows while recording a decode step");
    if (t->cs) dev_free_after(c->stream, t->cs);
    t->cs = (float2 *)dev_alloc(c, (size_t)rows * t->half * sizeof(float2), "the RoPE table");
    t->rows = rows;
    c->gen++;   // a recording that reads the old table is stale
    CUDA_LAUNCH(rope_table_kernel, cuda_blocks((size_t)rows * t->half, THREADS), THREADS, 0,
                c->stream, t->cs, t->dfreq, t->half, rows);
}

// rows for positions <= max_pos: at least 4096, doubling
static int rope_rows(const rope_table *t, int max_pos) {
    long r = t->rows > 0 ? t->rows : 4096;
    while (r <= max_pos) r *= 2;
    return r > INT32_MAX ? INT32_MAX : (int)r;
}

// The table of these frequencies, holding positions <= max_pos.
static const rope_table *rope_table_get(cuda_impl *c, const float *inv_freq, int half, int max_pos) {
    CHECK_INTERNAL(half >= 1 && half <= ROPE_MAX_HALF, "RoPE on head dim %d (CUDA: <= %d)",
                   2 * half, 2 * ROPE_MAX_HALF);
    rope_table *t = NULL;
    for (int i = 0; i < c->n_rope && !t; i++)
        if (c->rope[i].half == half && memcmp(c->rope[i].inv_freq, inv_freq, half * sizeof(float)) == 0)
            t = &c->rope[i];
    if (!t) {
        CHECK_INTERNAL(!c->recording, "a new RoPE table while recording a decode step");
        if (c->n_rope == ROPE_TABLES) {   // full: the oldest goes
            dev_free_after(c->stream, c->rope[0].cs);
            CUDA_CHECK(cudaFree(c->rope[0].dfreq));
            memmove(c->rope, c->rope + 1, (ROPE_TABLES - 1) * sizeof *c->rope);
            c->n_rope--;
            c->gen++;
        }
        t = &c->rope[c->n_rope++];
        memset(t, 0, sizeof *t);
        t->half = half;
        memcpy(t->inv_freq, inv_freq, half * sizeof(float));
        t->dfreq = (float *)dev_alloc(c, half * sizeof(float), "the RoPE table");
        CUDA_CHECK(cuda_memcpy_async(t->dfreq, inv_freq, half * sizeof(float), cudaMemcpyHostToDevice,
                                   c->stream));
        CUDA_CHECK(cuda_stream_sync(c->stream));   // the host array may not outlive the call
    }
    if (max_pos >= t->rows) rope_table_grow(c, t, rope_rows(t, max_pos));
    return t;
}

void rope_tables_cover(cuda_impl *c, int max_pos) {
    for (int i = 0; i < c->n_rope; i++)
        if (max_pos >= c->rope[i].rows) rope_table_grow(c, &c->rope[i], rope_rows(&c->rope[i], max_pos));
}

void rope_tables_free(cuda_impl *c) {
    for (int i = 0; i < c->n_rope; i++) {
        CUDA_CHECK(cudaFree(c->rope[i].cs));
        CUDA_CHECK(cudaFree(c->rope[i].dfreq));
    }
    c->n_rope = 0;
}

// rotate x (n, heads, hd) in place; pair (2j, 2j+1) for NORM, (j, j + hd/2) for NEOX;
// a thread per (row, head, pair); cos and sin from the table cs (rows > every pos, hd/2)
__global__ void rope_kernel(bf16 *x, const int *pos, const float2 *cs, int n, int heads, int hd,
                            int neox) {
    int half = hd / 2;
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)n * heads * half) return;
    size_t i = e / ((size_t)heads * half);
    int h = (int)(e / half % heads), j = (int)(e % half);
    float2 t = cs[(size_t)pos[i] * half + j];
    bf16 *xh = x + (i * heads + h) * hd;
    int ia = neox ? j : 2 * j, ib = neox ? j + half : 2 * j + 1;
    float a = __bfloat162float(xh[ia]), bb = __bfloat162float(xh[ib]);
    xh[ia] = __float2bfloat16(a * t.x - bb * t.y);
    xh[ib] = __float2bfloat16(a * t.y + bb * t.x);
}

void cuda_rope(backend *b, void *x, const int *pos, int n, int heads, int hd,
               const float *inv_freq, enum rope_style style) {
    cuda_impl *c = impl(b);
    size_t total = (size_t)n * heads * (hd / 2);
    if (total == 0) return;
    int max_pos = 0;
    for (int i = 0; i < n; i++) {
        CHECK_INTERNAL(pos[i] >= 0, "RoPE at position %d", pos[i]);
        max_pos = pos[i] > max_pos ? pos[i] : max_pos;
    }
    const rope_table *t = rope_table_get(c, inv_freq, hd / 2, max_pos);
    const int *p = indices(c, STAGE_IDX, pos, n);
    CUDA_LAUNCH(rope_kernel, cuda_blocks(total, THREADS), THREADS, 0, c->stream, (bf16 *)x, p,
                t->cs, n, heads, hd, style == ROPE_NEOX);
}

// x (n, d) += y; out (n, d) = x / sqrt(mean(x^2) + eps) * w (out may be y); a block per row,
// each thread on the same columns in both passes (rmsnorm_kernel's order: the same values as
// add then rmsnorm)
__global__ void add_rmsnorm_kernel(bf16 *out, bf16 *x, const bf16 *y, const float *w, int d,
                                   float eps) {
    __shared__ float red[32];
    bf16 *xi = x + (size_t)blockIdx.x * d, *oi = out + (size_t)blockIdx.x * d;
    const bf16 *yi = y + (size_t)blockIdx.x * d;
    float ss = 0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        bf16 s = __float2bfloat16(__bfloat162float(xi[j]) + __bfloat162float(yi[j]));
        xi[j] = s;
        float v = __bfloat162float(s);
        ss += v * v;
    }
    ss = block_reduce(ss, red, 0);
    float r = 1.0f / sqrtf(ss / d + eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        oi[j] = __float2bfloat16(__bfloat162float(xi[j]) * r * w[j]);
}

void cuda_add_rmsnorm(backend *b, void *out, void *x, const void *y, const bk_weight *w, int n,
                      int d, float eps) {
    cuda_impl *c = impl(b);
    CHECK_INTERNAL(w->f && (int)w->cols == d, "RMSNorm weight must be a vector of %d", d);
    if (n == 0 || d == 0) return;
    CUDA_LAUNCH(add_rmsnorm_kernel, n, THREADS, 0, c->stream, (bf16 *)out, (bf16 *)x,
                (const bf16 *)y, w->f, d, eps);
}

// ---- elementwise -------------------------------------------------------------------------------

// out (rows, f) = silu(gate) * up, row i of gate and up at i * ld (ld = f: plain arrays; 2f with
// up = gate + f: the fused gate|up product's output); V8: 8 columns per thread (f, ld % 8 == 0)
template <int V>
__global__ void swiglu_kernel(bf16 *out, const bf16 *gate, const bf16 *up, int rows, size_t f,
                              size_t ld) {
    size_t e = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (e >= (size_t)rows * f) return;
    size_t at = e / f * ld + e % f;
    float g[V], u[V];
    if (V == 8) ld8(g, gate + at), ld8(u, up + at);
    else g[0] = __bfloat162float(gate[at]), u[0] = __bfloat162float(up[at]);
#pragma unroll
    for (int k = 0; k < V; k++) g[k] = g[k] / (1.0f + expf(-g[k])) * u[k];
    if (V == 8) st8(out + e, g);
    else out[e] = __float2bfloat16(g[0]);
}

static void swiglu_launch(cuda_impl *c, bf16 *out, const bf16 *gate, const bf16 *up, int rows,
                          size_t f, size_t ld) {
    size_t total = (size_t)rows * f;
    if (total == 0) return;
    if (v8(f, out, gate, up) && ld % 8 == 0)
        CUDA_LAUNCH(swiglu_kernel<8>, cuda_blocks(total / 8, THREADS), THREADS, 0, c->stream, out,
                    gate, up, rows, f, ld);
    else
        CUDA_LAUNCH(swiglu_kernel<1>, cuda_blocks(total, THREADS), THREADS, 0, c->stream, out, gate,
                    up, rows, f, ld);
}

void swiglu_halves(cuda_impl *c, bf16 *out, const bf16 *gu, int n, int f) {
    swiglu_launch(c, out, gu, gu + f, n, (size_t)f, 2 * (size_t)f);
}

void cuda_swiglu(backend *b, void *out, const void *gate, const void *up, size_t n) {
    swiglu_launch(impl(b), (bf16 *)out, (const bf16 *)gate, (const bf16 *)up, 1, n, n);
}

// x (n,) += y (n,)
template <int V>
__global__ void add_kernel(bf16 *x, const bf16 *y, size_t n) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (i >= n) return;
    float a[V], d[V];
    if (V == 8) ld8(a, x + i), ld8(d, y + i);
    else a[0] = __bfloat162float(x[i]), d[0] = __bfloat162float(y[i]);
#pragma unroll
    for (int k = 0; k < V; k++) a[k] += d[k];
    if (V == 8) st8(x + i, a);
    else x[i] = __float2bfloat16(a[0]);
}

void cuda_add(backend *b, void *x, const void *y, size_t n) {
    cuda_impl *c = impl(b);
    if (n == 0) return;
    if (v8(n, x, y, NULL))
        CUDA_LAUNCH(add_kernel<8>, cuda_blocks(n / 8, THREADS), THREADS, 0, c->stream, (bf16 *)x,
                    (const bf16 *)y, n);
    else
        CUDA_LAUNCH(add_kernel<1>, cuda_blocks(n, THREADS), THREADS, 0, c->stream, (bf16 *)x,
                    (const bf16 *)y, n);
}
