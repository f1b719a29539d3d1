// backend/mem_cuda.cu — the CUDA backend's memory: device buffers handed out by alloc (freed ones
// kept as spares of their size for reuse), grow-on-demand scratch, staged host uploads, copies
// to the host, and weights (uploaded from their file encoding as bf16, or made in place).
#include "backend_cuda.cuh"

// ---- device memory ----------------------------------------------------------------------------

void report_oom(size_t bytes, const char *what) {
    size_t free_b = 0, total = 0;
    cudaGetLastError();   // a failed cudaMalloc must not surface at the next launch check
    cudaMemGetInfo(&free_b, &total);
    fprintf(stderr, "sift: GPU out of memory: %s needs %.1f MiB, %.1f MiB free of %.1f MiB "
            "(try a shorter prompt, a smaller -c, or --device cpu)\n", what, bytes / 1048576.0,
            free_b / 1048576.0, total / 1048576.0);
}

// Device memory free now, plus the spare buffers an allocation would give back first.
size_t cuda_mem_available(backend *b) {
    cuda_impl *c = impl(b);
    size_t free_b = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
    for (int i = 0; i < c->n_spare; i++) free_b += c->spare[i].bytes;
    return free_b;
}

// Frees device memory once the work queued on the stream (which may read it) is done.
void dev_free_after(cudaStream_t st, void *p) {
    CUDA_CHECK(cuda_stream_sync(st));
    CUDA_CHECK(cudaFree(p));
}

// Gives the spare buffers back to CUDA (when an allocation did not fit).
void spare_release(cuda_impl *c) {
    for (int i = 0; i < c->n_spare; i++) dev_free_after(c->stream, c->spare[i].p);
    c->n_spare = 0;
}

// cudaMalloc, retried once without the spares; NULL with the OOM report when it does not fit.
void *dev_try_alloc(cuda_impl *c, size_t bytes, const char *what) {
    CHECK_INTERNAL(!c->recording, "allocating %s while recording a decode step", what);
    void *p = NULL;
    if (cuda_malloc((void **)&p, bytes ? bytes : 1) == cudaSuccess) return p;
    cudaGetLastError();
    spare_release(c);
    if (cuda_malloc((void **)&p, bytes ? bytes : 1) == cudaSuccess) return p;
    report_oom(bytes, what);
    return NULL;
}

// dev_try_alloc for memory the caller cannot do without: exits when it does not fit.
void *dev_alloc(cuda_impl *c, size_t bytes, const char *what) {
    void *p = dev_try_alloc(c, bytes, what);
    if (!p) exit(1);
    return p;
}

void *dev_buf_reserve(cuda_impl *c, dev_buf *b, size_t bytes, const char *what) {
    if (bytes <= b->bytes) return b->p;
    CHECK_INTERNAL(!c->recording, "%s grows while recording a decode step", what);
    c->gen++;   // the buffer moves: a recording that reads it is stale
    size_t want = bytes > 2 * b->bytes ? bytes : 2 * b->bytes;
    if (b->p) dev_free_after(c->stream, b->p);
    b->p = dev_alloc(c, want, what);
    b->bytes = want;
    return b->p;
}

// Copies host[0..bytes) to the stage buffer `slot` (stream-ordered); the device pointer. A small
// upload equal to the slot's last one is skipped: the positions of a pass are the same for every
// layer's RoPE and attention, and so are the RoPE frequencies.
void *stage(cuda_impl *c, int slot, const void *host, size_t bytes) {
    CHECK_INTERNAL(!c->recording, "a host upload (stage %d, %zu bytes) while recording a decode "
                   "step", slot, bytes);
    size_t had = c->stage[slot].bytes;
    void *d = dev_buf_reserve(c, &c->stage[slot], bytes < 4096 ? 4096 : bytes, "index upload");
    if (bytes == 0) return d;
    if (c->stage[slot].bytes == had && bytes == c->stage_last_bytes[slot] &&
        memcmp(c->stage_last[slot], host, bytes) == 0)
        return d;
    CUDA_CHECK(cuda_memcpy_async(d, host, bytes, cudaMemcpyHostToDevice, c->stream));
    c->stage_last_bytes[slot] = bytes <= STAGE_REUSE_MAX ? bytes : 0;   // 0: nothing to reuse
    if (bytes <= STAGE_REUSE_MAX) {
        c->stage_last[slot] = xrealloc(c->stage_last[slot], bytes);
        memcpy(c->stage_last[slot], host, bytes);
    }
    return d;
}

int in_step(const cuda_impl *c, const int *host, int n) {
    return c->step_n && host >= c->step_pos && host + n <= c->step_pos + c->step_n;
}

const int *indices(cuda_impl *c, int slot, const int *host, int n) {
    const int *d = (const int *)c->step_dev.p;
    if (c->step_n && host >= c->step_tok && host + n <= c->step_tok + c->step_n)
        return d + (host - c->step_tok);
    if (in_step(c, host, n)) return d + c->step_n + (host - c->step_pos);
    return (const int *)stage(c, slot, host, (size_t)n * sizeof(int));
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
void *cuda_alloc(backend *b, size_t n) {
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


// Frees a buffer of alloc (or of kv_keep): kept as a spare while there is room.
void cuda_free(backend *b, void *p) {
    cuda_impl *c = impl(b);
    if (!p) return;
    CHECK_INTERNAL(!c->recording, "freeing a buffer while recording a decode step");
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

void cuda_to_host(backend *b, float *dst, const void *src, size_t n) {
    cuda_impl *c = impl(b);
    if (n == 0) return;
    float *f = (float *)dev_buf_reserve(c, &c->f32, n * sizeof(float), "a copy to the host");
    CUDA_LAUNCH(bf16_to_f32_kernel, cuda_blocks(n, THREADS), THREADS, 0, c->stream, f,
                (const bf16 *)src, n);
    CUDA_CHECK(cuda_memcpy_async(dst, f, n * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cuda_stream_sync(c->stream));
}

// a vector's fp32 copy (weight_new)
void cuda_vector_to_host(backend *b, float *out, const bk_weight *w) {
    cuda_impl *c = impl(b);
    CUDA_CHECK(cuda_memcpy_async(out, w->f, w->cols * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cuda_stream_sync(c->stream));
}

static bk_weight *weight_new(cuda_impl *c, size_t rows, size_t cols) {
    bk_weight *w = (bk_weight *)xcalloc(1, sizeof *w);
    w->rows = rows ? rows : 1;
    w->cols = cols;
    w->h = (bf16 *)dev_alloc(c, w->rows * cols * sizeof(bf16), "the model's weights");
    if (w->rows == 1) w->f = (float *)dev_alloc(c, cols * sizeof(float), "the model's weights");
    return w;
}

// Whether t stays in its GGUF blocks on the device: a matrix of a type the kernels take
// (qmatmul_cuda.cu), unless SIFT_CUDA_WEIGHTS=bf16 asks for the bf16 conversion (A/B runs).
static int keeps_blocks(bk_tensor t) {
    return !tunables()->cuda_weights_bf16 && t.rows >= 2 && cuda_qtype(t.type) && t.cols % 32 == 0;
}

// The device storage of a weight: its blocks or its bf16 values.
static void *storage(const bk_weight *w) { return w->q ? (void *)w->q : (void *)w->h; }


// t in its file encoding. Kept in blocks: the file's bytes copied as they are. Otherwise whole
// rows are dequantised on the host into one fp32 chunk of at most WEIGHT_CHUNK elements (an F32
// tensor is read in place), rounded to bf16 on the host and uploaded (half the bytes of fp32, no
// kernel: the emulation build's load is a copy too); peak host memory is one chunk, not the tensor.
bk_weight *cuda_weight(backend *b, bk_tensor t) {
    cuda_impl *c = impl(b);
    if (keeps_blocks(t)) {
        bk_weight *w = (bk_weight *)xcalloc(1, sizeof *w);
        w->rows = t.rows, w->cols = t.cols, w->qtype = t.type, w->row_bytes = dq_bytes(t.type, t.cols);
        w->q = (uint8_t *)dev_alloc(c, w->rows * w->row_bytes, "the model's weights");
        CUDA_CHECK(cuda_memcpy_async(w->q, t.data, w->rows * w->row_bytes, cudaMemcpyHostToDevice,
                                   c->stream));
        CUDA_CHECK(cuda_stream_sync(c->stream));   // t.data may be freed next
        if (t.owned) free((void *)t.data);
        return w;
    }
    bk_weight *w = weight_new(c, t.rows, t.cols);
    size_t cols = t.cols, row_bytes = dq_bytes(t.type, cols);
    size_t chunk_rows = cols >= WEIGHT_CHUNK ? 1 : WEIGHT_CHUNK / cols;
    size_t buf_rows = chunk_rows < w->rows ? chunk_rows : w->rows;
    float *buf = t.type == GGML_F32 ? NULL : (float *)xmalloc(buf_rows * cols * sizeof(float));
    uint16_t *h = (uint16_t *)xmalloc(buf_rows * cols * sizeof(uint16_t));
    for (size_t r0 = 0; r0 < w->rows; r0 += chunk_rows) {
        size_t nr = w->rows - r0 < chunk_rows ? w->rows - r0 : chunk_rows, k = nr * cols;
        const float *src = (const float *)((const uint8_t *)t.data + r0 * row_bytes);
        if (buf) {
            for (size_t r = 0; r < nr; r++)
                dq_to_f32(t.type, (const uint8_t *)t.data + (r0 + r) * row_bytes, buf + r * cols,
                          cols);
            src = buf;
        }
        for (size_t i = 0; i < k; i++) h[i] = kv_f32_to_bf16(src[i]);   // the cache rows' rounding
        CUDA_CHECK(cuda_memcpy_async(w->h + r0 * cols, h, k * sizeof(bf16), cudaMemcpyHostToDevice,
                                   c->stream));
        if (w->f && r0 == 0)   // a vector: its fp32 copy too
            CUDA_CHECK(cuda_memcpy_async(w->f, src, cols * sizeof(float), cudaMemcpyHostToDevice,
                                       c->stream));
        CUDA_CHECK(cuda_stream_sync(c->stream));   // h and buf are refilled next
    }
    free(buf);
    free(h);
    if (t.owned) free((void *)t.data);
    return w;
}

// bytes of device memory t takes: its blocks, or bf16 (+ the fp32 copy of a vector)
size_t cuda_weight_bytes(backend *b, bk_tensor t) {
    (void)b;
    if (keeps_blocks(t)) return t.rows * dq_bytes(t.type, t.cols);
    size_t rows = t.rows ? t.rows : 1;
    return rows * t.cols * sizeof(bf16) + (rows == 1 ? t.cols * sizeof(float) : 0);
}

// One (sum of rows, cols) weight holding w[0]'s rows, then w[1]'s, ...; each w[j] becomes a view
// of its rows (its own storage freed). NULL (nothing changed) unless they are plain matrices of
// equal cols, each starting 16-byte aligned, or when the GPU has no room for the copy.
bk_weight *cuda_weight_fuse(backend *b, bk_weight *const *w, int k) {
    cuda_impl *c = impl(b);
    size_t rows = 0, cols = w[0]->cols;
    for (int j = 0; j < k; j++) {   // every part 16-byte aligned in the fused rows (gemm_bf16)
        if (w[j]->fused || w[j]->f || w[j]->cols != cols || w[j]->qtype != w[0]->qtype ||
            (!w[j]->q && rows * cols % 8))
            return NULL;
        rows += w[j]->rows;
    }
    size_t rb = w[0]->q ? w[0]->row_bytes : cols * sizeof(bf16);   // bytes per row, either form
    uint8_t *p = (uint8_t *)dev_try_alloc(c, rows * rb, "a fused weight");
    if (!p) return NULL;
    bk_weight *fw = (bk_weight *)xcalloc(1, sizeof *fw);
    fw->rows = rows, fw->cols = cols, fw->qtype = w[0]->qtype, fw->row_bytes = w[0]->row_bytes;
    if (w[0]->q) fw->q = p;
    else fw->h = (bf16 *)p;
    for (int j = 0, r = 0; j < k; r += (int)w[j]->rows, j++) {
        void *old = storage(w[j]);
        CUDA_CHECK(cuda_memcpy_async(p + (size_t)r * rb, old, w[j]->rows * rb, cudaMemcpyDeviceToDevice,
                                   c->stream));
        dev_free_after(c->stream, old);
        if (w[j]->q) w[j]->q = p + (size_t)r * rb;
        else w[j]->h = (bf16 *)(p + (size_t)r * rb);
        w[j]->fused = fw, w[j]->row0 = (size_t)r;
    }
    return fw;
}

void cuda_weight_free(backend *b, bk_weight *w) {
    if (!w) return;
    if (w->fused) {   // a view: the fused weight owns the rows
        free(w);
        return;
    }
    dev_free_after(impl(b)->stream, storage(w));
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

void synth_fill(cuda_impl *c, bf16 *h, float *f, uint64_t seed, uint64_t tensor, size_t n,
                float scale, float offset) {
    CUDA_LAUNCH(synth_kernel, cuda_blocks(n, THREADS), THREADS, 0, c->stream, h, f, seed, tensor, n,
                scale, offset);
}

bk_weight *cuda_weight_synth(backend *b, uint64_t seed, uint64_t tensor, size_t rows,
                                    size_t cols, float scale, float offset) {
    cuda_impl *c = impl(b);
    bk_weight *w = weight_new(c, rows, cols);
    size_t n = w->rows * cols;
    if (n) {
        synth_fill(c, w->h, w->f, seed, tensor, n, scale, offset);
    }
    return w;
}
