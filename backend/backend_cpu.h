// backend/backend_cpu.h — what the CPU backend's files share (included by them only): the
// backend's state (cpu_impl), its weights, and the ops each file offers backend_cpu.c's table.
//   backend_cpu.c  create/destroy, the op table, threads, BLAS   mem_cpu.c  memory, weights
//   gemm_cpu.c     products, their paths, ceilings, report       ops_cpu.c  elementwise and row ops
//   kv_cpu.c       KV cache, attention glue
// Each op's CUDA twin is the same op in the X_cuda.cu beside X_cpu.c (backend_cuda.cuh).
#pragma once
#include <stdlib.h>
#include <string.h>

#include "../qgemm/qgemm.h"
#include "../util/check.h"
#include "../util/tunables.h"
#include "backend.h"

#define TUNE_MAX 256   // shapes SIFT_PREFILL=tune times and remembers (gemm_cpu.c)

typedef struct {
    uint32_t type;
    int in, out, bucket;         // bucket: floor(log2(rows))
    enum q_path path;
    double ms[2];                // the timed first run of int8 and of the wide path
} tune_entry;

typedef struct {
    enum bk_weights mode;
    enum q_isa isa;
    int amx;                     // q_amx_available(): prefill products on AMX tiles
    int prefill;                 // -1: the fixed rule (gemm_cpu.c); TUN_PREFILL_INT8: the row kernels on
                                 // every product (SIFT_PREFILL=int8, --weights exact); _TUNE: timed per shape
    enum q_path rows;            // the row kernels: Q_PATH_INT8 (two digits), _INT8_1 (--weights fast)
    tune_entry tune[TUNE_MAX];
    int n_tune;
    q_strip_form strip;          // how Q4_K's 16-row blocks run (qgemm.h): each field as its tunable set it
                                 // (SIFT_STRIP_PREFETCH, SIFT_STRIP_ROWS8) or as timed; level 0 / rows8 -1 until then
    double strip_ms[3];          // q_strip_tune's times (strips L1, L2, 8-row groups); NaN unless timed
    q_scratch scratch;
    struct {                     // cpu_rope's angles of the last call: the layers of a pass
        int n, half, cap;        // rotate the same positions, so they are computed once a pass
        int *pos;
        float *inv_freq, *cs;    // (n, half) cosines then (n, half) sines
    } rope;
    float *sel_rows;             // cpu_attn_select's fp32 rows, (2 x KV heads, entries, hd), kept
    size_t sel_cap;              // across steps (grown, never shrunk): floats
} cpu_impl;

struct bk_weight {
    uint32_t type;        // GGML_F32: data is float; else blocks of that type
    const void *data;     // rows * row_bytes
    float *f;             // == data when F32
    size_t rows, cols, row_bytes;
    void *owned;          // freed with the weight; NULL: borrowed from the file's mapping
};

static inline cpu_impl *impl(backend *b) { return b->impl; }

// mem_cpu.c
void *cpu_alloc(backend *b, size_t n);
void cpu_free(backend *b, void *p);
void cpu_to_host(backend *b, float *dst, const void *src, size_t n);
size_t cpu_weight_bytes(backend *b, bk_tensor t);
bk_weight *cpu_weight(backend *b, bk_tensor t);
void cpu_weight_free(backend *b, bk_weight *w);
void cpu_vector_to_host(backend *b, float *out, const bk_weight *w);
size_t cpu_mem_available(backend *b);
bk_weight *cpu_weight_synth(backend *b, uint64_t seed, uint64_t tensor, size_t rows, size_t cols,
                            float scale, float offset);
// gemm_cpu.c
int cpu_row_class(backend *b, const bk_weight *w, int n);
void cpu_matmul(backend *b, void *out, const void *x, const bk_weight *w, const bk_weight *bias,
                int n, int in, int o);
void cpu_matmul_multi(backend *b, int k, void *const *out, const void *x, const bk_weight *const *w,
                      const bk_weight *const *bias, int n, int in, const int *o);
int cpu_ceilings(backend *b, double *tflops, double *gbps);
void cpu_report(backend *b, FILE *out);
// ops_cpu.c
void cpu_embed(backend *b, void *out, const bk_weight *table, const int *tokens, int n, int d);
void cpu_rmsnorm(backend *b, void *out, const void *x, const bk_weight *w, int n, int d, float eps);
void cpu_rope(backend *b, void *x, const int *pos, int n, int heads, int hd, const float *inv_freq,
              enum rope_style style);
void cpu_swiglu(backend *b, void *out, const void *gate, const void *up, size_t n);
void cpu_add(backend *b, void *x, const void *y, size_t n);
void cpu_gather_rows(backend *b, void *out, const void *x, const int *idx, int k, int d);
// kv_cpu.c
void cpu_kv_append(backend *b, kv_layer *L, const void *k, const void *v, const int *pos, int n);
void cpu_attention(backend *b, void *out, const void *q, const int *qpos, int n, int heads,
                   const kv_layer *L);
void cpu_attention_multi(backend *b, int k, void *const *out, const void *const *q,
                         const int *const *qpos, const int *n, int heads, const kv_layer *const *L);
void cpu_attn_probs(backend *b, float *probs, const void *q, const int *qpos, int n, int heads,
                    const kv_layer *L, int m);
void cpu_kv_keep(backend *b, kv_layer *L, const int *idx, int k, int new_cap);
void cpu_window_scores(backend *b, float *scores, const void *q, const int *qpos, int nq, int heads,
                       const kv_layer *L, int m, int c, int kernel, int avg);
void cpu_score_group_sum(backend *b, float *out, const float *in, int heads, int groups, int c);
void cpu_score_fold_max(backend *b, float *row_max, float *sum, const float *in, int heads, int c,
                        int last);
void cpu_score_select(backend *b, int *idx, int ld, const float *s, int rows, int c, int k, int tail);
void cpu_kv_keep_at(backend *b, kv_layer *L, const int *idx, int k, int new_cap, void *nk, void *nv);
void cpu_ints_to_host(backend *b, int *dst, const int *src, size_t n);
void cpu_ints_from_host(backend *b, int *dst, const int *src, size_t n);
void cpu_attn_select(backend *b, void *out, const void *q, int heads, const kv_layer *L,
                     const int *sel, int n_sel, int n_sub, const phi_completion *comp);
void cpu_attn_topk_step(backend *b, void *out, int *idx, double *stats, const void *q, int qpos,
                        int heads, const kv_layer *L, int sink, int n, int k, const topk_pages *pg,
                        const phi_completion *comp);
void cpu_kv_pages_build(backend *b, void *out, const kv_layer *L, int lo, int n, int size);
void cpu_phi_summarize(backend *b, phi_summary *out, float *dsum, const phi_maps *p,
                       const float *par_k, int layer, const kv_layer *L, int lo, int hi);

