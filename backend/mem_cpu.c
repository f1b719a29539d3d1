// backend/mem_cpu.c — the CPU backend's memory: activation buffers (malloc), weights in their
// file encoding (borrowed from the mapping, read ahead) or dequantised to fp32, synthetic weights.
#include <sys/mman.h>

#include "../weights/dequant.h"
#include "../weights/synthetic.h"
#include "backend_cpu.h"

void *cpu_alloc(backend *b, size_t n) {
    (void)b;
    return malloc(n ? n * sizeof(float) : 1);
}

void cpu_free(backend *b, void *p) {
    (void)b;
    free(p);
}

void cpu_to_host(backend *b, float *dst, const void *src, size_t n) {
    (void)b;
    memcpy(dst, src, n * sizeof(float));
}

// Vectors, F32 tensors, types without a product here and everything under --weights f32 become
// fp32; the rest stays as stored.
static int keeps_blocks(backend *b, bk_tensor t) {
    return impl(b)->mode != BK_WEIGHTS_F32 && t.rows > 1 && t.type != GGML_F32 &&
           q_type_supported(t.type) && (t.type == GGML_F16 || t.type == GGML_BF16 || t.cols % 32 == 0);
}

// resident bytes: the blocks as stored (borrowed pages of the file count: they will be in RAM),
// or fp32
size_t cpu_weight_bytes(backend *b, bk_tensor t) {
    size_t rows = t.rows ? t.rows : 1;
    if (keeps_blocks(b, t)) return rows * dq_bytes(t.type, t.cols);
    return rows * t.cols * sizeof(float);
}

bk_weight *cpu_weight(backend *b, bk_tensor t) {
    bk_weight *w = xcalloc(1, sizeof *w);
    size_t rows = t.rows ? t.rows : 1;
    *w = (bk_weight){.type = t.type, .data = t.data, .rows = rows, .cols = t.cols,
                     .row_bytes = dq_bytes(t.type, t.cols), .owned = t.owned ? (void *)t.data : NULL};
    if (t.type != GGML_F32 && !keeps_blocks(b, t)) {   // dequantise to fp32 once
        float *f = malloc(rows * t.cols * sizeof(float));
        if (!f) {
            free(w->owned);
            free(w);
            return NULL;
        }
#pragma omp parallel for if (rows > 64)
        for (size_t r = 0; r < rows; r++)
            dq_to_f32(t.type, (const uint8_t *)t.data + r * w->row_bytes, f + r * t.cols, t.cols);
        free(w->owned);
        *w = (bk_weight){.type = GGML_F32, .data = f, .rows = rows, .cols = t.cols,
                         .row_bytes = t.cols * sizeof(float), .owned = f};
    }
    if (w->type == GGML_F32) w->f = (float *)w->data;
    // The first Q4_K matrix that streams from DRAM (1 MiB and more: not a test's tiny one) on
    // AVX-512: time the forms of its 16-row blocks (qgemm.h; timed once per process) and keep the
    // faster where no variable set them; a variable set alone applies even when nothing was timed.
    cpu_impl *c = impl(b);
    if (w->type == GGML_Q4_K && c->isa == Q_ISA_AVX512 && (!c->strip.level || c->strip.rows8 < 0) &&
        rows * w->row_bytes >= ((size_t)1 << 20)) {
        const q_strip_form t = q_strip_tune(c->strip_ms);   // ({0, -1}: not timed; the defaults then)
        if (!c->strip.level) c->strip.level = t.level ? t.level : 2;
        if (c->strip.rows8 < 0) c->strip.rows8 = t.level ? t.rows8 : 0;
        q_strip_set(c->strip);
    }
    if (!w->owned) {   // borrowed pages of the mapping: start reading them in now, not at first use
        uintptr_t at = (uintptr_t)w->data & ~(uintptr_t)4095;
        madvise((void *)at, (uintptr_t)w->data + rows * w->row_bytes - at, MADV_WILLNEED);
    }
    return w;
}

void cpu_weight_free(backend *b, bk_weight *w) {
    (void)b;
    if (w) free(w->owned);
    free(w);
}

// vectors are kept in fp32 (keeps_blocks)
void cpu_vector_to_host(backend *b, float *out, const bk_weight *w) {
    (void)b;
    memcpy(out, w->f, w->cols * sizeof(float));
}

// MemAvailable from /proc/meminfo (what the kernel could give without swapping); 0 = unknown.
size_t cpu_mem_available(backend *b) {
    (void)b;
    return host_mem_available();
}

// The reference for every backend's weight_synth: element i = offset + scale * synth_uniform.
bk_weight *cpu_weight_synth(backend *b, uint64_t seed, uint64_t tensor, size_t rows,
                            size_t cols, float scale, float offset) {
    float *host = malloc(rows * cols * sizeof(float));
    if (!host) return NULL;
    synth_fill(host, rows * cols, seed, tensor, scale, offset);
    return cpu_weight(b, bk_f32(host, rows, cols));
}
