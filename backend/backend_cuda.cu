// backend/backend_cuda.cu — the CUDA backend: bf16 weights, activations and KV cache on one GPU,
// fp32 accumulation in every kernel and GEMM. This file makes the backend (device, stream,
// cuBLASLt handle) and fills the op table; the ops live in mem_cuda.cu, gemm_cuda.cu, ops_cuda.cu,
// kv_cuda.cu and sample_cuda.cu (backend_cuda.cuh), attention in attn/attn_cuda.cu. Here too:
// the decode step's bound index arrays and its recording as a CUDA graph (backend.h).
#include <dlfcn.h>

#include "backend_cuda.cuh"

// ---- a decode step: bound indices, recorded and replayed ----------------------------------------

typedef struct cuda_graph {
    cudaGraphExec_t exec;
    unsigned gen;   // c->gen when recorded: stale once a buffer it reads has moved
} cuda_graph;

// Copies tokens, pos (n,) to the device (one upload) and binds them (n 0: unbinds).
static void cuda_step_bind(backend *b, const int *tokens, const int *pos, int n) {
    cuda_impl *c = impl(b);
    CHECK_INTERNAL(!c->recording, "binding a step while recording one");
    c->step_n = 0, c->step_tok = c->step_pos = NULL;
    if (n <= 0) return;
    int max_pos = 0;
    for (int i = 0; i < n; i++) {
        CHECK_INTERNAL(pos[i] >= 0, "a decode step at position %d", pos[i]);
        max_pos = pos[i] > max_pos ? pos[i] : max_pos;
    }
    rope_tables_cover(c, max_pos);   // a replay rotates by these positions without asking
    int *d = (int *)dev_buf_reserve(c, &c->step_dev, 2 * (size_t)n * sizeof(int), "a decode step");
    CUDA_CHECK(cuda_memcpy_async(d, tokens, (size_t)n * sizeof(int), cudaMemcpyHostToDevice, c->stream));
    CUDA_CHECK(cuda_memcpy_async(d + n, pos, (size_t)n * sizeof(int), cudaMemcpyHostToDevice, c->stream));
    c->step_tok = tokens, c->step_pos = pos, c->step_n = n;
}

static int cuda_graph_begin(backend *b) {
    cuda_impl *c = impl(b);
    CHECK_INTERNAL(!c->recording && c->step_n > 0, "recording a decode step needs a bound one");
    if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    c->recording = 1;
    cuda_counts.capturing = 1;
    return 0;
}

static void *cuda_graph_end(backend *b) {
    cuda_impl *c = impl(b);
    CHECK_INTERNAL(c->recording, "graph_end without graph_begin");
    c->recording = 0;
    cuda_counts.capturing = 0;
    cudaGraph_t g = NULL;
    cudaGraphExec_t exec = NULL;
    if (cudaStreamEndCapture(c->stream, &g) != cudaSuccess || !g) {
        cudaGetLastError();
        return NULL;
    }
    cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
    CUDA_CHECK(cudaGraphDestroy(g));
    if (e != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    cuda_graph *r = (cuda_graph *)xmalloc(sizeof *r);
    *r = (cuda_graph){exec, c->gen};
    return r;
}

static int cuda_graph_launch(backend *b, void *graph) {
    cuda_impl *c = impl(b);
    cuda_graph *r = (cuda_graph *)graph;
    CHECK_INTERNAL(!c->recording && c->step_n > 0, "replaying a decode step needs a bound one");
    if (r->gen != c->gen) return -1;
    CUDA_CHECK(cudaGraphLaunch(r->exec, c->stream));
    cuda_counts.graph_replays++, cuda_counts.launches++;
    return 0;
}

static void cuda_counters_get(backend *b, bk_counters *out) {
    (void)b;
    const cuda_counts_t *k = &cuda_counts;
    *out = (bk_counters){k->h2d_bytes, k->d2h_bytes, k->syncs, k->allocs, k->launches, k->graph_replays};
}

static void cuda_graph_free(backend *b, void *graph) {
    (void)b;
    cuda_graph *r = (cuda_graph *)graph;
    if (!r) return;
    CUDA_CHECK(cudaGraphExecDestroy(r->exec));
    free(r);
}

// ---- create / destroy -------------------------------------------------------------------------

static void cuda_destroy(backend *b) {
    cuda_impl *c = impl(b);
    CUDA_CHECK(cuda_stream_sync(c->stream));
    for (int i = 0; i < c->n_plans; i++) plan_destroy(c, &c->plans[i]);
    LT_CHECK(c, c->lt.destroy(c->lt_handle));
    dev_buf *bufs[] = {&c->attn_work, &c->probs, &c->f32, &c->phi_f, &c->phi_q, &c->page_score, &c->page_idx,
                       &c->step_dev, &c->tokens, &c->fused_out};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]->p) CUDA_CHECK(cudaFree(bufs[i]->p));
    for (int i = 0; i < STAGES; i++)
        if (c->stage[i].p) CUDA_CHECK(cudaFree(c->stage[i].p));
    mirror_free_all(c);
    rope_tables_free(c);
    arena_free(c);
    spare_release(c);
    for (int i = 0; i < c->n_live; i++) CUDA_CHECK(cudaFree(c->live[i].p));   // not freed by the user
    free(c->live);
    for (int i = 0; i < STAGES; i++) free(c->stage_last[i]);
    CUDA_CHECK(cudaFree(c->lt_work));
    CUDA_CHECK(cudaStreamDestroy(c->stream));
    dlclose(c->lt.so);
    free(c);
    free(b);
}

// Device 0 if it is usable (a driver, compute capability 8.0+); its description in msg.
static int pick_device(cudaDeviceProp *prop, char *msg, size_t len) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return err_printf(msg, len, "no usable GPU: %s (no NVIDIA driver, or one older than "
                          "this build's CUDA %d.%d)", cudaGetErrorString(e), CUDART_VERSION / 1000,
                          CUDART_VERSION % 1000 / 10);
    }
    if (count == 0) return err_printf(msg, len, "no CUDA GPU found");
    CUDA_CHECK(cudaGetDeviceProperties(prop, 0));
    if (prop->major < 8)
        return err_printf(msg, len, "%s has compute capability %d.%d; sift's CUDA path needs 8.0+",
                          prop->name, prop->major, prop->minor);
    CUDA_CHECK(cudaSetDevice(0));
    return 0;
}

static void plan_destroy_backend(backend *b) { free(b); }

backend *backend_cuda_plan(void) {
    backend *b = (backend *)xcalloc(1, sizeof *b);
    b->name = "cuda";
    b->elem_bytes = 2;
    b->weight_bytes = cuda_weight_bytes;
    b->destroy = plan_destroy_backend;
    return b;
}

backend *backend_cuda_create(char *msg, size_t len) {
    cudaDeviceProp prop;
    lt_api lt;
    if (pick_device(&prop, msg, len) || lt_load(&lt, msg, len)) return NULL;
    cuda_impl *c = (cuda_impl *)xcalloc(1, sizeof *c);
    c->lt = lt;
    c->n_sm = prop.multiProcessorCount;
    CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    LT_CHECK(c, c->lt.create(&c->lt_handle));
    c->lt_work = dev_alloc(c, LT_WORKSPACE, "the cuBLASLt workspace");
    size_t free_b = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
    snprintf(msg, len, "%s, %d SMs, %.1f GiB (%.1f GiB free), compute %d.%d", prop.name,
             prop.multiProcessorCount, total / 1073741824.0, free_b / 1073741824.0, prop.major,
             prop.minor);
    backend *b = (backend *)xcalloc(1, sizeof *b);
    b->name = "cuda";
    b->impl = c;
    b->elem_bytes = sizeof(bf16);
    b->destroy = cuda_destroy;
    b->alloc = cuda_alloc;
    b->free = cuda_free;
    b->to_host = cuda_to_host;
    b->weight = cuda_weight;
    b->weight_bytes = cuda_weight_bytes;
    b->weight_free = cuda_weight_free;
    b->vector_to_host = cuda_vector_to_host;
    b->embed = cuda_embed;
    b->rmsnorm = cuda_rmsnorm;
    b->matmul = cuda_matmul;
    b->rope = cuda_rope;
    b->swiglu = cuda_swiglu;
    b->add = cuda_add;
    b->gather_rows = cuda_gather_rows;
    b->kv_append = cuda_kv_append;
    b->attention = cuda_attention;
    b->attention_multi = cuda_attention_multi;
    b->attn_probs = cuda_attn_probs;
    b->kv_keep = cuda_kv_keep;
    b->window_scores = cuda_window_scores;
    b->score_group_sum = cuda_score_group_sum;
    b->score_fold_max = cuda_score_fold_max;
    b->score_select = cuda_score_select;
    b->kv_keep_at = cuda_kv_keep_at;
    b->ints_to_host = cuda_ints_to_host;
    b->ints_from_host = cuda_ints_from_host;
    b->kv_pos_sync = cuda_kv_pos_sync;
    b->kv_prepare = cuda_kv_prepare;
    b->kv_pos_upload = cuda_kv_pos_upload;
    b->weight_synth = cuda_weight_synth;
    b->ceilings = CUDA_EMULATED ? NULL : cuda_ceilings;   // no speed to measure in the emulator
    b->mem_available = cuda_mem_available;
    b->attn_select = cuda_attn_select;
    b->attn_topk_step = cuda_attn_topk_step;
    b->kv_pages_build = cuda_kv_pages_build;
    b->phi_summarize = cuda_phi_summarize;
    b->sample = cuda_sample;
    b->matmul_multi = cuda_matmul_multi;
    b->swiglu_matmul = cuda_swiglu_matmul;
    b->add_rmsnorm = cuda_add_rmsnorm;
    b->weight_fuse = cuda_weight_fuse;
    b->step_bind = cuda_step_bind;
    b->graph_begin = cuda_graph_begin;
    b->graph_end = cuda_graph_end;
    b->graph_launch = cuda_graph_launch;
    b->graph_free = cuda_graph_free;
    b->counters = cuda_counters_get;
    return b;
}
