// backend/backend.h — the backend interface the shared forward pass calls. A backend owns device
// memory (activations, weights, KV) and implements a small list of ops on it. The CPU backend
// (backend_cpu.c) has fp32 activations and keeps weights in their file encoding (or fp32 with
// --weights f32, the reference); a CUDA backend implements the same list.
// Activation buffers are opaque device pointers sized in elements; index arrays (positions,
// row selections) are passed as host int arrays (a backend that records decode steps keeps
// device copies of one step's: step_bind below).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../weights/gguf.h"
#include "sample.h"

enum rope_style { ROPE_NORM = 0, ROPE_NEOX = 1 };   // adjacent pairs (2j,2j+1) | halves (j, j+hd/2)

typedef struct bk_weight bk_weight;   // a weight matrix or vector on the device

// What a backend has asked of its device so far (backend op `counters`): bytes copied host to
// device and device to host, stream synchronisations, device allocations (the allocator's
// calls, not reuses of a freed buffer), launches (kernels, copies on the device, library
// products) and replays of a recorded step. A backend that moves nothing (the CPU) has none.
typedef struct bk_counters {
    unsigned long long h2d_bytes, d2h_bytes, syncs, allocs, launches, graph_replays;
} bk_counters;
// a + sign * b, field by field (sign 1 or -1: a sum, or the counts between two readings)
static inline bk_counters bk_counters_add(bk_counters a, bk_counters b, int sign) {
    unsigned long long *x = &a.h2d_bytes;
    const unsigned long long *y = &b.h2d_bytes;
    for (int i = 0; i < 6; i++) x[i] += sign > 0 ? y[i] : (unsigned long long)0 - y[i];
    return a;
}
typedef struct backend backend;
typedef struct kv_layer kv_layer;
typedef struct phi_maps phi_maps;             // attn/phi.h
typedef struct phi_summary phi_summary;
typedef struct phi_completion phi_completion;
typedef struct topk_pages topk_pages;         // attn/pages.h

// A weight as a file stores it: rows x cols elements of ggml `type` (enum ggml_type; GGML_F32 for
// plain floats), row-major, each row dq_bytes(type, cols) bytes (weights/dequant.h). Borrowed
// unless `owned`: borrowed data (a file's mapping) must outlive the weight; owned data was
// malloc'd and the backend takes it.
typedef struct {
    uint32_t type;
    const void *data;
    size_t rows, cols;      // rows 0: a vector of cols elements
    int owned;
} bk_tensor;

// An fp32 host array the backend takes.
static inline bk_tensor bk_f32(float *host, size_t rows, size_t cols) {
    return (bk_tensor){GGML_F32, host, rows, cols, 1};
}

// How the CPU backend keeps weights: as stored (quantised products, qgemm/) or dequantised to
// fp32 at load (the reference the tests compare against).
// CPU weights: native (file encoding; wide products on this CPU's default path), fast (file
// encoding; with AVX-512 VNNI, wide products on one-digit activations: llama.cpp's precision),
// exact (file encoding, every product on the two-digit int8 kernels: qgemm/qgemm.h), f32
// (dequantised at load)
enum bk_weights { BK_WEIGHTS_NATIVE = 0, BK_WEIGHTS_F32 = 1, BK_WEIGHTS_EXACT = 2, BK_WEIGHTS_FAST = 3 };

struct backend {
    const char *name;                  // "cpu" | "cuda"
    void *impl;
    size_t elem_bytes;                 // bytes per activation / KV element on this backend
    char info[256];                    // how it computes, for the load line and bench output
    void (*destroy)(backend *b);
    // memory
    void *(*alloc)(backend *b, size_t n_elems);   // NULL on failure
    void (*free)(backend *b, void *p);
    void (*to_host)(backend *b, float *dst, const void *src, size_t n);
    // a weight from t (see bk_tensor; the backend converts it to its own form: the CPU keeps
    // quantised blocks, CUDA uploads bf16); NULL when out of memory
    bk_weight *(*weight)(backend *b, bk_tensor t);
    // bytes of memory the weight t will keep resident on this backend, borrowed file pages
    // included (the memory plan: cmd/cli.c)
    size_t (*weight_bytes)(backend *b, bk_tensor t);
    void (*weight_free)(backend *b, bk_weight *w);
    // out (n,), host = the fp32 values of a vector weight w (n,) (norms, biases)
    void (*vector_to_host)(backend *b, float *out, const bk_weight *w);
    // ops (shapes in elements; rows are contiguous)
    // out (n, d) = table[tokens[i]]
    void (*embed)(backend *b, void *out, const bk_weight *table, const int *tokens, int n, int d);
    // out (n, d) = x / rms(x) * w
    void (*rmsnorm)(backend *b, void *out, const void *x, const bk_weight *w, int n, int d, float eps);
    // out (n, o) = x (n, i) @ W (o, i)^T + bias (o,)   (bias may be NULL)
    void (*matmul)(backend *b, void *out, const void *x, const bk_weight *w, const bk_weight *bias,
                   int n, int i, int o);
    // k <= 4 products sharing one input, out[j] (n, o[j]) = x (n, i) @ W[j]^T + bias[j] (bias[j]
    // may be NULL). (CUDA: one GEMM when the W[j] are consecutive parts of one weight_fuse, the
    // biases added as it splits.)
    void (*matmul_multi)(backend *b, int k, void *const *out, const void *x,
                         const bk_weight *const *w, const bk_weight *const *bias, int n, int i,
                         const int *o);
    // Optional: the rounding class of a product on w over n rows: two row counts of one class
    // >= 0 give every row the same products bit for bit (the row's own, whatever rows share the
    // call); -1: a row's rounding may depend on the row count (never pack rows of separate
    // requests into one product, model/forward.h: fwd_row_class). NULL: -1.
    int (*row_class)(backend *b, const bk_weight *w, int n);
    // Set by the forward pass around a pass's layers (context.rows_as), 0 otherwise: products over
    // fewer rows choose their path (the CPU's int8 row kernels or its wide GEMM) as a product over
    // rows_as rows would, so that a prompt's rows computed in a shorter pass (a suffix prefilled
    // after a reused prefix) round as they do in the pass of the whole chunk. The CUDA backend
    // reads it not (cuBLAS chooses by shape).
    int rows_as;
    // rotate x (n, heads, hd) in place at positions pos (n,)
    void (*rope)(backend *b, void *x, const int *pos, int n, int heads, int hd, const float *inv_freq,
                 enum rope_style style);
    // out (n, f) = silu(gate) * up
    void (*swiglu)(backend *b, void *out, const void *gate, const void *up, size_t n);
    // Optional: out (n, f) = silu(x (n, i) @ Wg^T) * (x @ Wu^T) in one product and one pass, when
    // the backend can (0); -1: not for these weights (the caller runs matmul_multi + swiglu).
    int (*swiglu_matmul)(backend *b, void *out, const void *x, const bk_weight *gate,
                         const bk_weight *up, int n, int i, int f);
    // Optional: x (n, d) += y, then out (n, d) = rmsnorm(x) * w: the same values as add then
    // rmsnorm, in one pass over x.
    void (*add_rmsnorm)(backend *b, void *out, void *x, const void *y, const bk_weight *w, int n,
                        int d, float eps);
    // Optional: one weight holding the rows of w[0], then w[1], ... (k >= 2, equal cols), made in
    // place of them: each w[j] stays valid as a view of its rows (free the views, then the fused
    // weight). NULL: not fused (the w[j] are unchanged).
    bk_weight *(*weight_fuse)(backend *b, bk_weight *const *w, int k);
    // x (n,) += y (n,)
    void (*add)(backend *b, void *x, const void *y, size_t n);
    // out (k, d) = x[idx[j]]  (out may not alias x)
    void (*gather_rows)(backend *b, void *out, const void *x, const int *idx, int k, int d);
    // append k, v (n, n_kv_head, hd) at positions pos (n,) to a KV layer (len += n)
    void (*kv_append)(backend *b, kv_layer *L, const void *k, const void *v, const int *pos, int n);
    // out (n, heads, hd) = causal attention of q (n, heads, hd) at positions qpos over L:
    // key j of KV head g is visible to query i iff L->pos[g][j] <= qpos[i]; GQA groups heads.
    void (*attention)(backend *b, void *out, const void *q, const int *qpos, int n, int heads,
                      const kv_layer *L);
    // `attention` of k independent sequences in one call (a batched decode step): out[i], q[i]
    // (n[i], heads, hd) at qpos[i] over cache L[i].
    void (*attention_multi)(backend *b, int k, void *const *out, const void *const *q,
                            const int *const *qpos, const int *n, int heads,
                            const kv_layer *const *L);
    // probs (n, heads, m), host = softmax of q (n, heads, hd) against the first m entries of L,
    // over the entries visible to each row (position <= qpos[i]); invisible entries get 0
    void (*attn_probs)(backend *b, float *probs, const void *q, const int *qpos, int n, int heads,
                       const kv_layer *L, int m);
    // L keeps, per KV head g, entries idx[g*k + j] (ascending), in buffers of capacity new_cap
    void (*kv_keep)(backend *b, kv_layer *L, const int *idx, int k, int new_cap);
    // Token scoring whose data never leaves backend memory (the ops FastKV's and SnapKV's
    // selection compose; fp32 scores and int32 indices in buffers from alloc; attn/score.h holds
    // the arithmetic, which is what the CPU's ops run):
    // scores (heads, c) = score_window_pool of attn_probs' softmax rows of q (nq rows at qpos)
    // over L's first m entries (avg 0: max-pool, 1: avg-pool, over `kernel`)
    void (*window_scores)(backend *b, float *scores, const void *q, const int *qpos, int nq,
                          int heads, const kv_layer *L, int m, int c, int kernel, int avg);
    // out (groups, c) = score_group_sum of in (heads, c)
    void (*score_group_sum)(backend *b, float *out, const float *in, int heads, int groups, int c);
    // row_max, sum (c,) folded with in (heads, c) as score_fold_max (SpecPrefill's max over
    // layers and heads, summed over query rows at each row's last layer)
    void (*score_fold_max)(backend *b, float *row_max, float *sum, const float *in, int heads,
                           int c, int last);
    // idx (rows, ld) = score_select of s (rows, c): each row's top k, then the tail c .. c+tail-1
    void (*score_select)(backend *b, int *idx, int ld, const float *s, int rows, int c, int k,
                         int tail);
    // kv_keep with idx in backend memory, into nk, nv (buffers from alloc holding new_cap
    // entries of L's row types) that replace L's K and V; L's old K and V are left for the
    // caller to free (after the pass: nothing is freed or allocated here). L's host positions
    // may be left stale (L->pos_stale: kv_pos_sync makes them current).
    void (*kv_keep_at)(backend *b, kv_layer *L, const int *idx, int k, int new_cap, void *nk,
                       void *nv);
    // dst (n,), host = src (n,) int32 in backend memory (waits for it)
    void (*ints_to_host)(backend *b, int *dst, const int *src, size_t n);
    // dst (n,) int32 in backend memory = src (n,), host (src may be freed on return)
    void (*ints_from_host)(backend *b, int *dst, const int *src, size_t n);
    // Optional: L's host positions made current when stale (L->pos_stale, after kv_keep_at).
    void (*kv_pos_sync)(backend *b, kv_layer *L);
    // Optional: the backend's copy of L's positions made the host's, after the host wrote them
    // (a copied or loaded cache: model/forward.c fwd_kv_copy_caps, fwd_kv_write). NULL: the
    // host's are the backend's (CPU).
    void (*kv_pos_upload)(backend *b, const kv_layer *L);
    // Optional: the backend's own state of a new cache layer L (CUDA: its device positions and
    // length), made when the cache is, so that no pass allocates it.
    void (*kv_prepare)(backend *b, const kv_layer *L);
    // A (rows, cols) weight whose element i is offset + scale * synth_uniform(seed, tensor, i)
    // (weights/synthetic.h), made where it lives.
    bk_weight *(*weight_synth)(backend *b, uint64_t seed, uint64_t tensor, size_t rows, size_t cols,
                               float scale, float offset);
    // Optional: one line per choice the backend made by measuring (the CPU: which product path
    // each quantised shape took, with both timings), to out; nothing when none was made.
    void (*report)(backend *b, FILE *out);
    // Bytes the backend could still allocate now (CPU: MemAvailable; a GPU: free device
    // memory), so large requests fail up front with the numbers; 0 = unknown.
    size_t (*mem_available)(backend *b);
    // Optional: the ceilings measured now — a large GEMM in the backend's precision (TFLOP/s)
    // and a large read (GB/s: CPU a read-only pass; CUDA a copy, read + write). 0, or -1.
    int (*ceilings)(backend *b, double *tflops, double *gbps);
    // Optional: topk's decode attention of the one row q (position qpos), in backend memory and
    // recordable. Selection: idx (heads, k) = per query head h the k entries of the mid region
    // [sink, sink + n) of L with the largest raw score q_h . k (score_topk: ties to the lower
    // index, ascending; each K row read once for its KV head's query heads) — among every mid
    // entry (pg NULL: the exact selector), or (pg, attn/pages.h) among the entries of the
    // pg->read pages per KV head whose bound, the largest over the group's heads, is largest
    // (score_topk over the bounds; then exactly what the exact selector would pick whenever
    // those pages hold its choice; pg->read * pg->size >= k + pg->size or every page). Then,
    // unless out is NULL, out (heads, hd) = softmax attention over those k entries, the anchors
    // [0, sink) and every entry from sink + n to L's length (the device's while a step is
    // bound), and stats (4,) += {entries read exactly: per KV head the union of its query
    // heads' selections plus the anchors, summed over KV heads; entries cached: length x KV
    // heads; 1; the selector's bytes: the K rows it scored and the bounds it read}; with out
    // NULL only stats[3], when stats is not NULL.
    // With comp (topk+phi), out is completed from comp's summaries of the mid region
    // (attn_select's completion, the first k selected entries the retrieved ones).
    void (*attn_topk_step)(backend *b, void *out, int *idx, double *stats, const void *q, int qpos,
                           int heads, const kv_layer *L, int sink, int n, int k,
                           const topk_pages *pg, const phi_completion *comp);
    // Optional (with attn_topk_step): the page bounds of entries [lo, lo + n) of L, per KV head
    // pages of `size` entries (attn/pages.h pages_build_cpu), into out (n_kv_head, n_pages, 2)
    // rows of pages_bound_type(L->k_type), backend memory.
    void (*kv_pages_build)(backend *b, void *out, const kv_layer *L, int lo, int n, int size);
    // Optional: decode attention of one row over selected entries. out (heads, hd): query head h
    // attends exactly to entries sel[h*n_sel .. +n_sel) of its KV head in L; with comp, the first
    // n_sub of them lie in the region comp->sum summarises and the rest of that region is
    // estimated from the summary (attn/phi.h). comp NULL: softmax over the selection only.
    void (*attn_select)(backend *b, void *out, const void *q, int heads, const kv_layer *L,
                        const int *sel, int n_sel, int n_sub, const phi_completion *comp);
    // Optional: the summaries of entries [lo, hi) of L under p's key maps of `layer` (attn/phi.h)
    // into dsum (backend memory, phi_summary_flat floats), par_k = p->k in backend memory; and
    // into out (n_kv_head,) (fresh from phi_summary_alloc, by the caller) where decode reads them
    // from the host (the CPU); out[g].n is set on every backend.
    void (*phi_summarize)(backend *b, phi_summary *out, float *dsum, const phi_maps *p,
                          const float *par_k, int layer, const kv_layer *L, int lo, int hi);
    // Optional, together (NULL = not offered): a decode step recorded once and replayed (CUDA
    // graphs). step_bind(b, tokens, pos, n) copies the host arrays tokens and pos (n,) to the
    // device, once; until the next step_bind (NULL, NULL, 0 unbinds), an op given an index
    // array that lies inside one of them reads its device copy instead of uploading, and its
    // attention reads each KV layer's length from the device (launched for the layer's
    // capacity), so that one recording serves every step. graph_begin: the ops that follow are
    // recorded, not run (their host effects, kv_append's, happen; nothing may be uploaded or
    // allocated); 0, or -1 when recording is not possible. graph_end: the recording, or NULL
    // when it failed (nothing of it ran). graph_launch runs a recording on the current binding:
    // 0, or -1 when it is stale (the backend moved a buffer it reads: record again).
    void (*step_bind)(backend *b, const int *tokens, const int *pos, int n);
    // Optional: out (n,), host = the token sample_next (sample.h) draws from each row i of
    // logits (n, vocab), backend memory, with settings p[i] and generator state state[i]; only
    // the tokens cross to the host. The states are not advanced: the caller advances its own as
    // sample_next would (sample_skip). 0, or -1 when a row's settings are not offered
    // (the CUDA backend: a temperature with more than 1024 candidates): sample on the host.
    int (*sample)(backend *b, int *out, const void *logits, int n, int vocab, const sample_params *p,
                  const uint64_t *state);
    // Optional: *out = the counts since the backend was made (bk_counters). NULL: none (the
    // CPU: host and device are one memory).
    void (*counters)(backend *b, bk_counters *out);
    int (*graph_begin)(backend *b);
    void *(*graph_end)(backend *b);
    int (*graph_launch)(backend *b, void *graph);
    void (*graph_free)(backend *b, void *graph);
};

// n_threads 0: OpenMP's default. The ISA of the quantised products: the best the CPU has, or
// SIFT_ISA=scalar|avx2|avx512 (qgemm/qgemm.h; util/tunables.h refuses a malformed value).
backend *backend_cpu_create(int n_threads, enum bk_weights weights);
// The CPU's default thread count (what -t means when not given): OMP_NUM_THREADS, else the
// physical cores less those other processes keep busy, sampled once per process (50 ms);
// *busy (may be NULL): that many cores were left to them.
int backend_cpu_default_threads(int *busy);
// OpenBLAS (a DYNAMIC_ARCH build) picks its kernels from cpuid when it loads; a CPU newer than
// the library gets its oldest set (SSE3 "Prescott"), several times slower at every sgemm. Called
// first in main: when that happened on a CPU with AVX2 + FMA (or AVX-512), sift executes itself
// again (same pid, arguments and streams) with OPENBLAS_CORETYPE set to the best set the CPU
// runs (Haswell; SkylakeX). Nothing when the user set OPENBLAS_CORETYPE or the library chose an
// AVX2 set itself. backend_cpu_blas_core: the set in use, with what the library had chosen.
void backend_cpu_blas_init(char **argv);
const char *backend_cpu_blas_core(void);
// The CUDA backend on GPU 0 (backend_cuda.cu; built when nvcc was found, SIFT_CUDA defined).
// On success msg holds the device's description; NULL with the reason in msg when there is no
// usable GPU, driver or cuBLASLt.
backend *backend_cuda_create(char *msg, size_t len);
// A CUDA backend for planning only, no GPU needed: name, elem_bytes and weight_bytes (the bytes
// each tensor would take on a device: GGUF blocks or bf16) are set, nothing else; destroy frees it.
backend *backend_cuda_plan(void);
