// model/backend_cuda.cu — the CUDA backend: bf16 weights, activations and KV cache on one GPU,
// fp32 accumulation in every kernel and GEMM. This file makes the backend (device, stream,
// cuBLASLt handle) and fills the op table; the ops live in cuda_mem.cu, cuda_gemm.cu,
// cuda_ops.cu and cuda_kv.cu (model/cuda_backend.cuh), attention in attn/attn_cuda.cu.
#include <dlfcn.h>

#include "cuda_backend.cuh"

// ---- create / destroy -------------------------------------------------------------------------

static void cuda_destroy(backend *b) {
    cuda_impl *c = impl(b);
    CUDA_CHECK(cudaStreamSynchronize(c->stream));
    for (int i = 0; i < c->n_plans; i++) plan_destroy(c, &c->plans[i]);
    LT_CHECK(c, c->lt.destroy(c->lt_handle));
    dev_buf *bufs[] = {&c->attn_work, &c->probs, &c->f32, &c->phi_f, &c->phi_q, &c->phi_sum, &c->topk};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]->p) CUDA_CHECK(cudaFree(bufs[i]->p));
    for (int i = 0; i < STAGES; i++)
        if (c->stage[i].p) CUDA_CHECK(cudaFree(c->stage[i].p));
    for (int i = 0; i < c->n_mirrors; i++) CUDA_CHECK(cudaFree(c->mirrors[i].dpos));
    free(c->mirrors);
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
    b->embed = cuda_embed;
    b->rmsnorm = cuda_rmsnorm;
    b->matmul = cuda_matmul;
    b->rope = cuda_rope;
    b->swiglu = cuda_swiglu;
    b->add = cuda_add;
    b->gather_rows = cuda_gather_rows;
    b->kv_append = cuda_kv_append;
    b->attention = cuda_attention;
    b->attn_probs = cuda_attn_probs;
    b->kv_keep = cuda_kv_keep;
    b->weight_synth = cuda_weight_synth;
    b->ceilings = CUDA_EMULATED ? NULL : cuda_ceilings;   // no speed to measure in the emulator
    b->mem_available = cuda_mem_available;
    b->attn_select = cuda_attn_select;
    b->attn_topk = cuda_attn_topk;
    b->phi_summarize = cuda_phi_summarize;
    return b;
}
