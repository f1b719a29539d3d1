// attn/phi_cuda.h — CUDA twins of attn/phi_cpu.c (phi_cuda.cu): feature maps, the completion
// summary, and decode attention over a selection completed from a summary. Same math as the
// CPU versions (attn/phi.h) in fp32; q, K, V and the output bf16. All pointers are device memory;
// everything runs on `stream` and nothing synchronises.
#pragma once
#include <cuda_runtime.h>

typedef struct phi_cuda_shape {
    int kind, d_in, d_emb, d_hid, d_phi, n_par;   // as phi_maps (kind PHI_MLP or PHI_PRF)
} phi_cuda_shape;

// Largest d_in, d_emb, d_hid, d_phi the kernels take (they stage a row's activations in shared
// memory).
#define PHI_CUDA_MAX_DIM 1024

// out (n, d_phi) fp32 = log phi(x_r) for r < n: x_r = x + rows[r] * d_in (bf16), parameter
// block par + par_of[r] * n_par (fp32).
void phi_features_cuda(float *out, const void *x, const int *rows, const int *par_of, int n,
                       const float *par, phi_cuda_shape s, cudaStream_t stream);

// The same with the rows implied, so that nothing is uploaded per call: idx NULL, the heads rows
// of x (each query head's query, block h of par); else x holds the cache's keys (n_kv, cap,
// d_in) and the rows are each head's retrieved keys idx (heads, kk) (row h * kk + i: entry
// idx[h * kk + i] of KV head h / group, block h / group). out (rows, d_phi).
void phi_features_sel_cuda(float *out, const void *x, const int *idx, int heads, int kk, int group,
                           int cap, const float *par, phi_cuda_shape s, cudaStream_t stream);

// The summaries of n_kv KV heads over n entries: F (n_kv, n, d_phi) their log features,
// v (n_kv, cap, hd) bf16 read from row lo. m, u (n_kv, d_phi), t (n_kv, d_phi, hd) fp32:
// m = max of F, u = sum exp(F - m), t = sum exp(F - m) v (two passes: max, then the sums).
void phi_summary_cuda(float *m, float *u, float *t, const float *F, const void *v, int n_kv,
                      int n, int cap, int lo, int hd, int d_phi, cudaStream_t stream);

// out (heads, hd) bf16: query head h (q (heads, hd) bf16) attends exactly to entries
// sel[h * n_sel .. + n_sel) of its KV head in k, v (n_kv, cap, hd) bf16. Completion when lq is
// not NULL: lq (heads, d_phi) = log phi_q(q); fsel (heads, n_sub, d_phi) = log phi_k of each
// head's first n_sub selected keys (overwritten); m, u, t the KV heads' summaries of a region
// of n_region entries holding those n_sub entries, its top n_sub by score (phi_attend_head's
// top-K bound clamps the estimate). work: heads * n_sel floats.
void phi_select_cuda(void *out, const void *q, const void *k, const void *v, int cap, int heads,
                     int n_kv, int hd, const int *sel, int n_sel, int n_sub, const float *lq,
                     float *fsel, const float *m, const float *u, const float *t, int d_phi,
                     int n_region, float *work, cudaStream_t stream);

// topk's step: out (heads, hd) bf16 = phi_select_cuda over query head h's selection idx[h * kk
// .. + kk) (device), the anchors [0, sink) and [sink + n, len) of its KV head (len = *dlen when
// dlen is not NULL: a recorded step reads the length at replay); with lq, completed from the
// summaries m, u, t of the mid region [sink, sink + n) (fsel (heads, kk, d_phi): log phi_k of
// the retrieved keys, overwritten). work (heads, ld), ld >= kk + len - n.
void topk_attend_cuda(void *out, const void *q, const void *k, const void *v, int cap, int heads,
                      int n_kv, int hd, const int *idx, int kk, int sink, int n, int len,
                      const int *dlen, const float *lq, float *fsel, const float *m, const float *u,
                      const float *t, int d_phi, float *work, size_t ld, cudaStream_t stream);
