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
    // NULL, or the length on the device (decode kernels only): the kernels read it, and len is
    // then a bound that sizes the launch (a recorded decode step replays for any length <= len)
    const int *dlen;
} attn_cuda_args;

// One decode row's cache in a batched decode call (attn_decode_multi_cuda); device pointers.
typedef struct attn_cuda_cache {
    const void *k, *v;    // (n_kv_head, cap, hd) bf16
    const int *kpos;      // (n_kv_head, cap)
    const int *dlen;      // NULL: len entries; else the length on the device
    int len, cap;
} attn_cuda_cache;

// Largest head dimension the kernels take.
#define ATTN_CUDA_MAX_HD 256

// fp32 scratch (elements) attn_causal_cuda needs for a; n_sm = the device's multiprocessors.
size_t attn_cuda_work_floats(const attn_cuda_args *a, int n_sm);

// out (n, heads, hd) bf16 = causal attention (see above). Few query rows (decode, <= 16) run
// flash-decoding through `work`; many (prefill) run a tiled flash kernel (no n x len matrix).
// One kernel per case, by head dimension and device:
//   prefill: head dims 64, 128: fa2w (32 query rows per warp), or fa2 (16) where fa2w's shared
//   memory does not fit a block (compute capability 8.6, 8.9: head dim 128); SIFT_ATTN_PREFILL=wg
//   runs wg instead on compute capability 9.0 (wgmma, 64 rows per warpgroup: the candidate for
//   Hopper, until a device run measures it against fa2w); other head dims: flash (CUDA cores)
//   decode: head dims 64, 128, 256: group; others: split
void attn_causal_cuda(void *out, const attn_cuda_args *a, float *work, int n_sm,
                      cudaStream_t stream);

// Decode rows of different sequences in one launch: row i of a.q (n, heads, hd) attends to
// rows[i]'s cache (device table, n entries; a's k, v, kpos, cap unused, a.len the largest
// length or bound), out (n, heads, hd). Only where the group kernel takes a's head dimension
// (attn_decode_multi_takes); work: attn_decode_multi_work_floats(a) floats.
int attn_decode_multi_takes(const attn_cuda_args *a);
size_t attn_decode_multi_work_floats(const attn_cuda_args *a, int n_sm);
void attn_decode_multi_cuda(void *out, const attn_cuda_args *a, const attn_cuda_cache *rows,
                            float *work, int n_sm, cudaStream_t stream);

// -- the kernels' own files (called through attn_causal_cuda) --
// attn_prefill_cuda.cu: FlashAttention-2 form, mma.sync tiles, 16 or 32 query rows per warp, or
// (rows_per_warp 64) wgmma tiles of 64 rows per warpgroup; work: attn_fa2_work_floats.
int attn_fa2_takes(const attn_cuda_args *a);
int attn_fa2w_fits(const attn_cuda_args *a);
int attn_wg_takes(const attn_cuda_args *a);
size_t attn_fa2_work_floats(const attn_cuda_args *a);
void attn_fa2_cuda(void *out, const attn_cuda_args *a, int rows_per_warp, float *work,
                   cudaStream_t stream);
// attn_decode_cuda.cu: a block per (key chunk, KV head) over every query head of the group;
// writes `splits` partials per (row, head) in the layout attn_combine_kernel merges.
int attn_group_takes(const attn_cuda_args *a);
int attn_group_splits(const attn_cuda_args *a, int n_sm);
// rows: NULL (a's cache), or one cache per row (device table of a->n entries)
void attn_group_cuda(float *work, const attn_cuda_args *a, const attn_cuda_cache *rows, int splits,
                     cudaStream_t stream);

// probs (n, heads, m) fp32 = softmax of q.k / sqrt(hd) over the first m keys, restricted to the
// visible ones (invisible keys get 0; a row with none visible is all 0).
void attn_probs_cuda(float *probs, const attn_cuda_args *a, int m, cudaStream_t stream);
