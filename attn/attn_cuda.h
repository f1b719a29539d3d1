// attn/attn_cuda.h — CUDA twins of attn.h's kernels (attn_cuda.cu), same semantics as the CPU
// versions: key j of KV head g is visible to query i iff kpos[g][j] <= qpos[i]; head h reads KV
// head h / (heads / n_kv_head); a query with no visible key gets a zero output row.
// All pointers are device memory: q, k, v, out bf16; positions int; work and probs fp32.
// Everything is launched on `stream`; nothing synchronises.
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>

typedef struct attn_cuda_args {
    const void *q;        // (n, heads, hd) bf16
    const int *qpos;      // (n,)
    int n, heads;
    const void *k, *v;    // (n_kv_head, cap, hd) bf16, first len entries used
    const int *kpos;      // (n_kv_head, cap)
    int len, cap, n_kv_head, hd;
} attn_cuda_args;

// Largest head dimension the kernels take.
#define ATTN_CUDA_MAX_HD 256

// fp32 scratch (elements) attn_causal_cuda needs for a; n_sm = the device's multiprocessors.
size_t attn_cuda_work_floats(const attn_cuda_args *a, int n_sm);

// out (n, heads, hd) bf16 = causal attention (see above). Few query rows run split-K
// (flash-decoding) through `work`; many run the tiled flash kernel (no n x len matrix).
void attn_causal_cuda(void *out, const attn_cuda_args *a, float *work, int n_sm,
                      cudaStream_t stream);

// probs (n, heads, m) fp32 = softmax of q.k / sqrt(hd) over the first m keys, restricted to the
// visible ones (invisible keys get 0; a row with none visible is all 0).
void attn_probs_cuda(float *probs, const attn_cuda_args *a, int m, cudaStream_t stream);
