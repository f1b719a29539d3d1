// backend/sample_cuda.cu — token sampling on the device (CPU twin: sample_next, sample_cpu.c):
// only the drawn tokens cross to the host, not the logits. One block per row:
//  - greedy (temp <= 0): the first index of the largest logit;
//  - otherwise the top-k candidates (k = top_k, or the vocabulary when top_k is off or larger;
//    at most SAMPLE_MAX_K) found by a radix select on a key that orders by logit, then by lower
//    id (sample_next's sort order), ranked in shared memory, then top-p -> min-p -> temperature
//    -> draw by one thread in sample_next's arithmetic (double sums in rank order), from the
//    generator state the caller passes (it advances its own copy as sample_next would).
// Rows with frequency/presence penalties are declined (-1, as for more than SAMPLE_MAX_K
// candidates): the penalties depend on the host sampler's counts, so the host draws those rows
// from the logits with sample_next (model/decode.c falls back for the whole step).
#include "backend_cuda.cuh"

#define SAMPLE_THREADS 1024
#define SAMPLE_MAX_K 1024

// The row's sampling settings as the kernel reads them (staged, one per row).
typedef struct sample_row {   // a row's settings: uploaded only when they change
    float temp, top_p, min_p;
    int k;            // candidates: top_k, or vocab when top-k is off or not smaller
} sample_row;

// A key larger for a larger logit, and for the lower id among equal logits: unique per row.
__device__ static inline uint64_t cand_key(float logit, int id) {
    uint32_t u = __float_as_uint(logit);
    if ((u << 1) == 0) u = 0;                     // -0 == +0, as sample_next compares
    u = u & 0x80000000u ? ~u : u | 0x80000000u;   // order-preserving
    return (uint64_t)u << 32 | (uint32_t)(0xffffffffu - (uint32_t)id);
}

struct sample_smem {
    unsigned hist[256];
    uint64_t prefix;
    int need, n_cand;
    float red_v[SAMPLE_THREADS];
    int red_i[SAMPLE_THREADS];
    uint64_t key[SAMPLE_MAX_K];
    float logit[SAMPLE_MAX_K];
    int id[SAMPLE_MAX_K];
    int order[SAMPLE_MAX_K];            // order[rank] = candidate
    double e1[SAMPLE_MAX_K], e2[SAMPLE_MAX_K];
};

// out[row] = the token drawn from logits (rows, vocab) bf16; grid (rows), SAMPLE_THREADS threads
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_kernel(int *out, const bf16 *logits, int vocab, const sample_row *rows, const uint64_t *states) {
    SHARED_DYNAMIC(unsigned char, smem_raw);
    sample_smem &sm = *(sample_smem *)smem_raw;
    const sample_row p = rows[blockIdx.x];
    const bf16 *x = logits + (size_t)blockIdx.x * vocab;
    const int tid = threadIdx.x;
    if (p.temp <= 0) {   // greedy: (value desc, index asc) over the row
        float bv = -INFINITY;
        int bi = vocab;
        for (int i = tid; i < vocab; i += SAMPLE_THREADS) {
            float v = __bfloat162float(x[i]);
            if (bi == vocab || v > bv) bv = v, bi = i;   // ascending i: ties keep the first
        }
        sm.red_v[tid] = bv, sm.red_i[tid] = bi;
        __syncthreads();
        for (int h = SAMPLE_THREADS / 2; h > 0; h /= 2) {   // tree: the better of tid and tid + h
            if (tid < h) {
                float ov = sm.red_v[tid + h];
                int oi = sm.red_i[tid + h];
                if (oi < vocab && (bi == vocab || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
                sm.red_v[tid] = bv, sm.red_i[tid] = bi;
            }
            __syncthreads();
        }
        if (tid == 0) out[blockIdx.x] = bi;
        return;
    }
    // the k-th largest key, 8 bits at a time from the top
    if (tid == 0) sm.prefix = 0, sm.need = p.k, sm.n_cand = 0;
    uint64_t mask = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int j = tid; j < 256; j += SAMPLE_THREADS) sm.hist[j] = 0;
        __syncthreads();
        const uint64_t prefix = sm.prefix;
        for (int i = tid; i < vocab; i += SAMPLE_THREADS) {
            uint64_t key = cand_key(__bfloat162float(x[i]), i);
            if ((key & mask) == prefix) atomicAdd(&sm.hist[(key >> shift) & 255], 1u);
        }
        __syncthreads();
        if (tid == 0) {   // the digit where the count from the top reaches need
            int need = sm.need, d = 255;
            while (d > 0 && (int)sm.hist[d] < need) need -= (int)sm.hist[d], d--;
            sm.prefix = prefix | (uint64_t)d << shift;
            sm.need = need;
        }
        mask |= (uint64_t)255 << shift;
        __syncthreads();
    }
    const uint64_t kth = sm.prefix;   // keys are unique: exactly k of them are >= kth
    for (int i = tid; i < vocab; i += SAMPLE_THREADS) {
        float v = __bfloat162float(x[i]);
        uint64_t key = cand_key(v, i);
        if (key >= kth) {
            int at = atomicAdd(&sm.n_cand, 1);
            sm.key[at] = key, sm.logit[at] = v, sm.id[at] = i;
        }
    }
    __syncthreads();
    const int n = p.k;
    for (int i = tid; i < n; i += SAMPLE_THREADS) {   // rank: keys above this one
        int r = 0;
        for (int j = 0; j < n; j++) r += sm.key[j] > sm.key[i];
        sm.order[r] = i;
    }
    __syncthreads();
    const double mx = sm.logit[sm.order[0]];
    for (int r = tid; r < n; r += SAMPLE_THREADS) {   // sample_next's terms, rank by rank
        double l = sm.logit[sm.order[r]];
        sm.e1[r] = exp(l - mx);
        sm.e2[r] = exp((l - mx) / p.temp);
    }
    __syncthreads();
    if (tid != 0) return;
    int m = n;
    double sum = 0;
    for (int r = 0; r < m; r++) sum += sm.e1[r];
    if (p.top_p < 1.0f) {
        double cum = 0;
        int keep = m;
        for (int r = 0; r < m; r++) {
            cum += sm.e1[r] / sum;
            if (cum >= p.top_p) {
                keep = r + 1;
                break;
            }
        }
        m = keep;
    }
    if (p.min_p > 0) {
        double floor_logit = mx + log((double)p.min_p);
        int keep = 1;
        while (keep < m && sm.logit[sm.order[keep]] >= floor_logit) keep++;
        m = keep;
    }
    double z = 0;
    for (int r = 0; r < m; r++) z += sm.e2[r];
    uint64_t st = states[blockIdx.x];   // the PCG32 state before the draw
    float u = (sample_pcg32(&st) >> 8) * (1.0f / 16777216.0f);   // sample_uniform's draw
    double draw = u * z, acc = 0;
    int tok = sm.id[sm.order[m - 1]];
    for (int r = 0; r < m; r++) {
        acc += sm.e2[r];
        if (draw < acc) {
            tok = sm.id[sm.order[r]];
            break;
        }
    }
    out[blockIdx.x] = tok;
}

int cuda_sample(backend *b, int *out, const void *logits, int n, int vocab, const sample_params *p,
                const uint64_t *state) {
    cuda_impl *c = impl(b);
    if (n <= 0) return 0;
    sample_row *rows = (sample_row *)xmalloc((size_t)n * sizeof *rows);
    for (int i = 0; i < n; i++) {
        int k = p[i].top_k > 0 && p[i].top_k < vocab ? p[i].top_k : vocab;
        // not offered (the caller samples): more candidates than fit, or penalties, which
        // depend on the sampler's counts on the host
        if ((p[i].temp > 0 && k > SAMPLE_MAX_K) || sample_penalised(&p[i])) {
            free(rows);
            return -1;
        }
        rows[i] = (sample_row){p[i].temp, p[i].top_p, p[i].min_p, k};
    }
    // the settings are the same step after step (stage skips an unchanged upload); the states
    // are not (8 bytes a row)
    const sample_row *d = (const sample_row *)stage(c, STAGE_PAR, rows, (size_t)n * sizeof *rows);
    const uint64_t *ds = (const uint64_t *)stage(c, STAGE_STATE, state, (size_t)n * sizeof *state);
    int *dt = (int *)dev_buf_reserve(c, &c->tokens, (size_t)n * sizeof(int), "sampled tokens");
    size_t smem = sizeof(sample_smem);
    static bool configured;   // over 48 KiB of dynamic shared memory: opt in once
    if (!configured) {
        CUDA_CHECK(cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem));
        configured = true;
    }
    CUDA_LAUNCH(sample_kernel, n, SAMPLE_THREADS, smem, c->stream, dt, (const bf16 *)logits, vocab, d, ds);
    CUDA_CHECK(cuda_memcpy_async(out, dt, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cuda_stream_sync(c->stream));
    free(rows);
    return 0;
}
