// backend/backend_cuda.cuh — what the CUDA backend's files share (included by them only): the
// backend's state (cuda_impl), its weights, and the functions one file offers the others.
//   backend_cuda.cu  create/destroy and the op table     mem_cuda.cu     memory, staging, weights
//   gemm_cuda.cu     cuBLASLt plans, matmul, ceilings    ops_cuda.cu     elementwise and row ops
//   kv_cuda.cu       KV cache, attention, top-K, phi     sample_cuda.cu  token sampling
// Each kernel sits beside its launcher; its CPU twin is the same op in the X_cpu.c beside X_cuda.cu.
// Host index arrays (tokens, positions, row and KV selections) are copied to the device per call,
// except a bound decode step's (step_bind: copied once per step). Each KV buffer's entry
// positions and length are mirrored on the device, keyed by its K buffer: kv_append and
// kv_keep, the only writers of kv_layer.pos and len, update host and device copies together.
#pragma once
#include <cublasLt.h>
#include <stdint.h>
#include <string.h>

#include "../attn/attn_cuda.h"
#include "../attn/phi_cuda.h"
#include "../attn/score_cuda.h"
#include "../util/cuda_util.cuh"
extern "C" {
#include "../attn/pages.h"
#include "../attn/phi.h"
#include "../kv/kv.h"
#include "../util/check.h"
#include "../util/tunables.h"
#include "../weights/dequant.h"
#include "../weights/synthetic.h"
#include "backend.h"
}

#define THREADS 256
#define MM_PLANS 64                   // cached GEMM shapes
#define LT_WORKSPACE (32u << 20)      // cuBLASLt workspace bytes
#define WEIGHT_CHUNK ((size_t)16 << 20)   // fp32 elements converted per upload

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

void lt_check(const lt_api *lt, cublasStatus_t s, const char *what, const char *file, int line);
#define LT_CHECK(c, call) lt_check(&(c)->lt, (call), #call, __FILE__, __LINE__)

typedef struct dev_buf {   // a device buffer that grows on demand
    void *p;
    size_t bytes;
} dev_buf;

typedef struct mm_plan {   // out (n, o; rows ldo apart) = x (n, in) @ W (o, in)^T, bf16 in and out
    int n, in, o, ldo;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t w, x, out;
    cublasLtMatmulAlgo_t algo;
} mm_plan;

typedef struct pos_mirror {   // device copy of a KV layer's entry positions and length
    const void *kbuf;         // the layer's K buffer (the key)
    int *dpos;                // (n_kv_head, cap), then the length (one int)
    int *dlen;                // = dpos + n_kv_head * cap: written by the append kernels
} pos_mirror;

#define ROPE_TABLES 4         // RoPE tables kept (one per inverse-frequency set: model, draft)
#define ROPE_MAX_HALF 512

typedef struct rope_table {   // cs (rows, half) = (cos, sin) of p * inv_freq[j], p < rows
    int half, rows;
    float inv_freq[ROPE_MAX_HALF];   // the host frequencies (the key)
    float *dfreq;                    // (half,) on the device
    float2 *cs;
} rope_table;

enum { STAGE_IDX, STAGE_AUX, STAGE_PAR, STAGE_ROWS, STAGE_OF, STAGE_STATE, STAGES };   // per op

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
    dev_buf stage[STAGES], attn_work, probs, f32, phi_f, phi_q, tokens;
    dev_buf page_score, page_idx;    // topk's page selector: bounds (n_kv, pages), picked pages
    dev_buf fused_out;               // a fused product's output before it is split
    dev_buf qx, dq;                  // quantised products: x widened to fp32; dequantised rows
    void *stage_last[STAGES];        // host copy of each stage buffer's last small upload
    size_t stage_last_bytes[STAGES];
    pos_mirror *mirrors;
    int n_mirrors, cap_mirrors;
    dev_block *live;                 // buffers alloc handed out (their sizes, for reuse)
    int n_live, cap_live;
    dev_block spare[SPARE_MAX];      // freed buffers, reused by an alloc of the same size
    int n_spare;
    rope_table rope[ROPE_TABLES];
    int n_rope;
    // step_bind's host arrays and their device copies (tokens at step_dev, positions after)
    const int *step_tok, *step_pos;
    int step_n;
    dev_buf step_dev;
    int recording;                   // between graph_begin and graph_end
    // batched decode attention's per-row cache tables for bound steps, kept on the device so a
    // recording finds them (host copy: the lookup); cleared, with gen bumped, when full
    attn_cuda_cache *arena_h, *arena_d;
    int arena_used, n_tables, *table_off, *table_len;
    unsigned gen;                    // bumped when a buffer a recording may read moves
} cuda_impl;

struct bk_weight {
    bf16 *h;          // (rows, cols), bf16 weights (NULL when quantised)
    uint8_t *q;       // (rows, row_bytes): the file's blocks of GGUF type qtype (cuda_qtype), or NULL
    uint32_t qtype;
    size_t row_bytes;
    float *f;         // (cols,) fp32 copy when rows == 1 (norm weights, biases)
    size_t rows, cols;
    const bk_weight *fused;   // a view: rows row0 .. of this fused weight's storage (weight_fuse)
    size_t row0;
};

static inline cuda_impl *impl(backend *b) { return (cuda_impl *)b->impl; }

// mem_cuda.cu
void report_oom(size_t bytes, const char *what);
size_t cuda_mem_available(backend *b);
void dev_free_after(cudaStream_t st, void *p);   // once the queued work that may read p is done
void spare_release(cuda_impl *c);
void *dev_try_alloc(cuda_impl *c, size_t bytes, const char *what);   // NULL + report when full
void *dev_alloc(cuda_impl *c, size_t bytes, const char *what);       // exits when full
void *dev_buf_reserve(cuda_impl *c, dev_buf *b, size_t bytes, const char *what);
void *stage(cuda_impl *c, int slot, const void *host, size_t bytes);   // host -> device, ordered
// host (n,) on the device: step_bind's copy when host lies inside a bound array, else staged
const int *indices(cuda_impl *c, int slot, const int *host, int n);
// whether host (n,) lies inside the bound positions (the step's attention reads device lengths)
int in_step(const cuda_impl *c, const int *host, int n);
void *cuda_alloc(backend *b, size_t n);
void cuda_free(backend *b, void *p);
void cuda_to_host(backend *b, float *dst, const void *src, size_t n);
bk_weight *cuda_weight(backend *b, bk_tensor t);
size_t cuda_weight_bytes(backend *b, bk_tensor t);
void cuda_weight_free(backend *b, bk_weight *w);
void cuda_vector_to_host(backend *b, float *out, const bk_weight *w);
bk_weight *cuda_weight_fuse(backend *b, bk_weight *const *w, int k);
bk_weight *cuda_weight_synth(backend *b, uint64_t seed, uint64_t tensor, size_t rows, size_t cols,
                             float scale, float offset);
// h (n,) = bf16(v), f (n,) = v (f may be NULL), v = offset + scale * synth_uniform(seed, tensor, i)
void synth_fill(cuda_impl *c, bf16 *h, float *f, uint64_t seed, uint64_t tensor, size_t n,
                float scale, float offset);
// gemm_cuda.cu
int lt_load(lt_api *lt, char *err, size_t errlen);
void plan_destroy(cuda_impl *c, mm_plan *p);
void gemm_bf16(cuda_impl *c, void *out, const void *x, const void *w, int n, int in, int o);
// the same with the output's rows ldo elements apart (a column range of a wider output)
void gemm_bf16_ld(cuda_impl *c, void *out, int ldo, const void *x, const void *w, int n, int in, int o);
// qmatmul_cuda.cu: weights kept in their GGUF blocks
int cuda_qtype(uint32_t type);   // 1: a type the device keeps quantised
void cuda_qmatmul(cuda_impl *c, void *out, const void *x, const bk_weight *w, int n, int in, int o);
void cuda_qembed(cuda_impl *c, void *out, const bk_weight *table, const int *dtokens, int n, int d);
void cuda_matmul(backend *b, void *out, const void *x, const bk_weight *w, const bk_weight *bias,
                 int n, int in, int o);
int cuda_ceilings(backend *b, double *tflops, double *gbps);
void cuda_matmul_multi(backend *b, int k, void *const *out, const void *x, const bk_weight *const *w,
                       const bk_weight *const *bias, int n, int in, const int *o);
int cuda_swiglu_matmul(backend *b, void *out, const void *x, const bk_weight *gate,
                       const bk_weight *up, int n, int in, int f);
// ops_cuda.cu
void cuda_embed(backend *b, void *out, const bk_weight *table, const int *tokens, int n, int d);
void cuda_rmsnorm(backend *b, void *out, const void *x, const bk_weight *w, int n, int d, float eps);
void cuda_rope(backend *b, void *x, const int *pos, int n, int heads, int hd, const float *inv_freq,
               enum rope_style style);
void cuda_swiglu(backend *b, void *out, const void *gate, const void *up, size_t n);
void cuda_add(backend *b, void *x, const void *y, size_t n);
void cuda_add_rmsnorm(backend *b, void *out, void *x, const void *y, const bk_weight *w, int n,
                      int d, float eps);
// out (n, f) = silu(gu[:, :f]) * gu[:, f:], gu (n, 2f): the fused gate-up product's output
void swiglu_halves(cuda_impl *c, bf16 *out, const bf16 *gu, int n, int f);
void cuda_gather_rows(backend *b, void *out, const void *x, const int *idx, int k, int d);
void rope_tables_cover(cuda_impl *c, int max_pos);   // every table holds positions <= max_pos
void rope_tables_free(cuda_impl *c);
// sample_cuda.cu
int cuda_sample(backend *b, int *out, const void *logits, int n, int vocab, const sample_params *p,
                const uint64_t *state);
// kv_cuda.cu
void mirror_drop(cuda_impl *c, const void *kbuf);
void mirror_free_all(cuda_impl *c);
void cuda_kv_append(backend *b, kv_layer *L, const void *k, const void *v, const int *pos, int n);
void cuda_kv_keep(backend *b, kv_layer *L, const int *idx, int k, int new_cap);
void cuda_kv_keep_at(backend *b, kv_layer *L, const int *idx, int k, int new_cap, void *nk, void *nv);
void cuda_kv_pos_sync(backend *b, kv_layer *L);
void cuda_kv_prepare(backend *b, const kv_layer *L);
void cuda_kv_pos_upload(backend *b, const kv_layer *L);
void cuda_window_scores(backend *b, float *scores, const void *q, const int *qpos, int nq, int heads,
                        const kv_layer *L, int m, int c, int kernel, int avg);
void cuda_score_group_sum(backend *b, float *out, const float *in, int heads, int groups, int c);
void cuda_score_fold_max(backend *b, float *row_max, float *sum, const float *in, int heads, int c,
                         int last);
void cuda_score_select(backend *b, int *idx, int ld, const float *s, int rows, int c, int k, int tail);
void cuda_ints_to_host(backend *b, int *dst, const int *src, size_t n);
void cuda_ints_from_host(backend *b, int *dst, const int *src, size_t n);
void cuda_attention(backend *b, void *out, const void *q, const int *qpos, int n, int heads,
                    const kv_layer *L);
void cuda_attention_multi(backend *b, int k, void *const *out, const void *const *q,
                          const int *const *qpos, const int *n, int heads, const kv_layer *const *L);
void arena_free(cuda_impl *c);
void cuda_attn_probs(backend *b, float *probs, const void *q, const int *qpos, int n, int heads,
                     const kv_layer *L, int m);
void cuda_phi_summarize(backend *b, phi_summary *out, float *dsum, const phi_maps *p,
                        const float *par_k, int layer, const kv_layer *L, int lo, int hi);
void cuda_attn_select(backend *b, void *out, const void *q, int heads, const kv_layer *L,
                      const int *sel, int n_sel, int n_sub, const phi_completion *comp);
void cuda_kv_pages_build(backend *b, void *out, const kv_layer *L, int lo, int n, int size);
void cuda_attn_topk_step(backend *b, void *out, int *idx, double *stats, const void *q, int qpos,
                         int heads, const kv_layer *L, int sink, int n, int k, const topk_pages *pg,
                         const phi_completion *comp);
