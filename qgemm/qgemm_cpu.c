// qgemm/qgemm_cpu.c — the CPU products' drivers (qgemm.h: the method and its error bound): the ISA
// (cpuid, lowered by SIFT_ISA), x quantised once a call into the forms the kernels read, weight
// rows in blocks of 16 handed to the kernels of the ISA and type (the fused ones of qgemm_avx512.c,
// qgemm_strip.c, qgemm_avx2.c; else rows unpacked by qgemm_forms.c and dotted by the ISA's
// generic product), F16 / BF16 rows, the sgemm tiles, and q_strip_tune's timing of the strip forms.
#include <cblas.h>
#include <cpuid.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "../util/check.h"
#include "../util/tunables.h"
#include "../weights/dequant.h"
#include "internal.h"

// ---- ISA choice ---------------------------------------------------------------------------------

// cpuid feature bits and the OS's saved register state (xgetbv): the AVX (YMM) and AVX-512
// (opmask, ZMM) states must be enabled, not only the instructions present.
static enum q_isa cpu_best_isa(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return Q_ISA_SCALAR;
    int fma = c >> 12 & 1, osxsave = c >> 27 & 1, f16c = c >> 29 & 1;
    if (!osxsave) return Q_ISA_SCALAR;
    unsigned xlo, xhi;
    __asm__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0x6) != 0x6 || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return Q_ISA_SCALAR;
    int avx2 = b >> 5 & 1;
    if (!(avx2 && fma && f16c)) return Q_ISA_SCALAR;
    int f = b >> 16 & 1, dq = b >> 17 & 1, bw = b >> 30 & 1, vl = b >> 31 & 1, vnni = c >> 11 & 1;
    if ((xlo & 0xe6) == 0xe6 && f && dq && bw && vl && vnni) return Q_ISA_AVX512;
    return Q_ISA_AVX2;
}

enum q_isa q_isa_pick(void) {
    const enum q_isa best = cpu_best_isa();
    const int want = tunables()->isa;   // SIFT_ISA (-1: unset)
    return want >= 0 && (enum q_isa)want < best ? (enum q_isa)want : best;
}

const char *q_isa_name(enum q_isa isa) {
    return isa == Q_ISA_AVX512 ? "avx512-vnni" : isa == Q_ISA_AVX2 ? "avx2" : "scalar";
}

int q_type_supported(uint32_t type) {
    switch (type) {
    case GGML_F16: case GGML_BF16: case GGML_Q4_0: case GGML_Q4_1: case GGML_Q5_0:
    case GGML_Q5_1: case GGML_Q8_0: case GGML_Q4_K: case GGML_Q5_K: case GGML_Q6_K: return 1;
    default: return 0;
    }
}

// ---- drivers ------------------------------------------------------------------------------------

void q_scratch_free(q_scratch *s) {
    free(s->p);
    *s = (q_scratch){0};
}

void *q_scratch_get(q_scratch *s, size_t n) {
    if (n > s->n) {
        free(s->p);
        s->p = xmalloc(n);
        s->n = n;
    }
    return s->p;
}

#define ROW_BLOCK 16   // weight rows per unit of work (unpacked once, dotted with every x row; a Q4_K strip's 16)

// int8 path: quantise x once, then each thread unpacks blocks of ROW_BLOCK weight rows and
// dots them with all n activation rows.
// x (n, in) quantised into the front of the scratch arena (plus `extra` bytes after it): per
// row 2 in digits (xq), in/32 steps (xd) and the sums (xa, stride xs = 3 in/32): in/16 group
// sums, then in/32 block sums (a32: what the 32-block kernels' offsets multiply, added once here
// instead of in every weight row's kernel).
// With `joined`, also x16 (n, in): the digits joined, 256 q + l, each 32-block's even elements
// then its odd ones (the AVX2 kernels' form). With
// `kform` (AVX-512, in % 256 == 0), also the K-quant kernels' form (quantize_row_k): per row kq6,
// kq4 (2 in each), kd (in/256), ks32 (in/32), ks16 (in/16).
typedef struct {
    int8_t *xq;
    float *xd, *xa;
    int16_t *x16;
    int8_t *kq6, *kq4;
    float *kd, *ks32, *ks16;
    uint8_t *extra;
    size_t ng, xs;
} q_act;

// The activation form type's kernels read (row i): per-32 digits, or the K form in Q4_K's / Q6_K's
// element order.
static inline act_row act_of(const q_act *a, uint32_t type, int i, int in) {
    if (a->kd && type == GGML_Q4_K) {
        const int8_t *q = a->kq4 + (size_t)i * 2 * in;
        return (act_row){q, q + in, a->kd + (size_t)i * (in / 256), a->ks32 + (size_t)i * (in / 32)};
    }
    if (a->kd && type == GGML_Q6_K) {
        const int8_t *q = a->kq6 + (size_t)i * 2 * in;
        return (act_row){q, q + in, a->kd + (size_t)i * (in / 256), a->ks16 + (size_t)i * (in / 16)};
    }
    const int8_t *q = a->xq + (size_t)i * 2 * in;
    return (act_row){q, q + in, a->xd + i * a->ng / 2, a->xa + i * a->xs};
}

// 1 when the K-quant kernels (and their activation form) serve `type` here
static int k_form(enum q_isa isa, uint32_t type, int in) {
    return isa == Q_ISA_AVX512 && in % 256 == 0 && (type == GGML_Q4_K || type == GGML_Q6_K);
}

int q_act_block(enum q_isa isa, uint32_t type, int in) { return k_form(isa, type, in) ? 256 : 32; }

// digits 1: the low digits zeroed and every sum taken over the high digits alone (256 q), so each
// kernel computes the product of the one-digit activations x^ = q d (|x - x^| <= d / 2: llama.cpp's
// Q8_0 rounding per 32-block, its Q8_K per 256-block), offsets included.
static q_act quantize_act(enum q_isa isa, const float *x, int n, int in, int digits, int joined,
                          int kform, size_t extra, q_scratch *sc) {
    size_t ng = (size_t)in / G, xs = ng + ng / 2;
    size_t act = (size_t)n * (2 * in + (ng / 2 + xs) * sizeof(float));
    size_t act16 = joined ? (size_t)n * in * sizeof(int16_t) : 0;
    size_t actk = kform ? (size_t)n * (4 * in + (in / 256 + in / 32 + in / 16) * sizeof(float)) : 0;
    uint8_t *buf = q_scratch_get(sc, act + act16 + actk + extra + 64);
    q_act a = {NULL, (float *)buf, (float *)buf + (size_t)n * ng / 2, NULL, NULL, NULL, NULL, NULL, NULL,
               buf + act + act16 + actk, ng, xs};
    a.xq = (int8_t *)(a.xa + (size_t)n * xs);
    if (joined) a.x16 = (int16_t *)(buf + act);   // act is a multiple of 4 (in % 32 == 0)
    if (kform) {
        a.kd = (float *)(buf + act + act16);
        a.ks32 = a.kd + (size_t)n * (in / 256);
        a.ks16 = a.ks32 + (size_t)n * (in / 32);
        a.kq6 = (int8_t *)(a.ks16 + (size_t)n * (in / 16));
        a.kq4 = a.kq6 + (size_t)n * 2 * in;
#pragma omp parallel for if (n > 1)
        for (int i = 0; i < n; i++)
            quantize_row_k(x + (size_t)i * in, in, digits, a.kq6 + (size_t)i * 2 * in, a.kq4 + (size_t)i * 2 * in,
                           a.kd + (size_t)i * (in / 256), a.ks32 + (size_t)i * (in / 32),
                           a.ks16 + (size_t)i * (in / 16));
    }
#pragma omp parallel for if (n > 1)
    for (int i = 0; i < n; i++) {
        float *sums = a.xa + i * xs;
        q_quantize_row(isa, x + (size_t)i * in, in, a.xq + (size_t)i * 2 * in, a.xd + i * ng / 2,
                       sums);
        if (digits == 1) {
            int8_t *q = a.xq + (size_t)i * 2 * in;
            memset(q + in, 0, (size_t)in);
            for (size_t g = 0; g < ng; g++) {
                int sum = 0;
                for (int k = 0; k < G; k++) sum += q[g * G + k];
                sums[g] = a.xd[i * ng / 2 + g / 2] * (float)(256 * sum);
            }
        }
        for (size_t j = 0; j < ng / 2; j++) sums[ng + j] = sums[2 * j] + sums[2 * j + 1];
        if (joined) {
            const int8_t *q = a.xq + (size_t)i * 2 * in;
            int16_t *x16 = a.x16 + (size_t)i * in;
            for (int k = 0; k < in; k++)   // each 32-block's evens, then its odds (the AVX2 kernels)
                x16[(k & ~31) + (k & 1) * 16 + (k & 31) / 2] = (int16_t)(256 * q[k] + q[in + k]);
        }
    }
    return a;
}

// one output of a fused kernel: W row `row` (of `type`) . activation row i in its form
static inline float fused_one(dot_blk_fn *fused, uint32_t type, const uint8_t *row, const q_act *a,
                              int i, int in) {
    act_row x = act_of(a, type, i, in);
    return fused(row, x.q, x.ql, x.d, x.a, in);
}

// W rows row[0 .. nr) (row_bytes apart) . every activation row: out[i * stride + r] for i < n;
// four activation rows at a time where the type has a four-row kernel (the same bits as one at a
// time), each four against all nr weight rows before the next four: the four stay in L1 (at 8
// rows and more, all of them would not) and the nr rows come from L1/L2 after the first four.
// With a strip kernel (Q4_K on AVX-512), a whole block of ROW_BLOCK = 16 rows goes through it, up
// to four activation rows per pass; a product's last, partial block as above. Which rows take a
// strip depends on the callers' blocks (ROW_BLOCK from each product's row 0) alone, never on n.
static inline void fused_rows(dot_blk_fn *fused, dot4_fn *fused4, strip_fn *strip, uint32_t type,
                              const uint8_t *row, size_t row_bytes, int nr, const q_act *a, int n,
                              int in, float *out, size_t stride) {
    if (strip && nr == ROW_BLOCK) {   // a whole block: one strip
        for (int i = 0; i < n; i += 4) {
            act_row x[4];
            const int R = n - i < 4 ? n - i : 4;
            for (int q = 0; q < R; q++) x[q] = act_of(a, type, i + q, in);
            strip(R, row, row_bytes, x, in, out + (size_t)i * stride, stride);
        }
        return;
    }
    int i = 0;
    for (; fused4 && i + 4 <= n; i += 4) {
        act_row x[4];
        for (int q = 0; q < 4; q++) x[q] = act_of(a, type, i + q, in);
        for (int r = 0; r < nr; r++) {
            float r4[4];
            fused4(row + (size_t)r * row_bytes, x, in, r4);
            for (int q = 0; q < 4; q++) out[(size_t)(i + q) * stride + r] = r4[q];
        }
    }
    for (; i < n; i++)
        for (int r = 0; r < nr; r++)
            out[(size_t)i * stride + r] = fused_one(fused, type, row + (size_t)r * row_bytes, a, i, in);
}

// W rows row[0 .. nr) (row_bytes apart) . every activation row through an AVX2 kernel (on x16):
// out[i * stride + r]; four activation rows at a time through f4 (the same bits as f), then one
// at a time, each four (or one) against all nr weight rows before the next (as fused_rows: they
// stay in L1)
static inline void fused16_rows(dot16_fn *f, dot16x4_fn *f4, const uint8_t *row, size_t row_bytes, int nr,
                                const q_act *a, int n, int in, float *out, size_t stride) {
    int i = 0;
    for (; f4 && i + 4 <= n; i += 4) {
        act16_row x[4];
        for (int q = 0; q < 4; q++) x[q] = (act16_row){a->x16 + (size_t)(i + q) * in, a->xd + (i + q) * a->ng / 2, a->xa + (i + q) * a->xs};
        for (int r = 0; r < nr; r++) {
            float r4[4];
            f4(row + (size_t)r * row_bytes, x, in, r4);
            for (int q = 0; q < 4; q++) out[(size_t)(i + q) * stride + r] = r4[q];
        }
    }
    for (; i < n; i++)
        for (int r = 0; r < nr; r++)
            out[(size_t)i * stride + r] = f(row + (size_t)r * row_bytes, a->x16 + (size_t)i * in,
                                            a->xd + i * a->ng / 2, a->xa + i * a->xs, in);
}

void q_matmul_multi(enum q_isa isa, int digits, int k, float *const *out, const float *x, int n,
                    int in, const uint32_t *type, const void *const *w, const size_t *row_bytes,
                    const int *o, q_scratch *sc) {
    dot_blk_fn *fused[Q_MULTI_MAX];
    dot4_fn *fused4[Q_MULTI_MAX];
    dot16_fn *f16k[Q_MULTI_MAX];
    dot16x4_fn *f16k4[Q_MULTI_MAX];
    int all = k <= Q_MULTI_MAX, total = 0, start[Q_MULTI_MAX + 1], joined = isa == Q_ISA_AVX2;
    for (int j = 0; all && j < k; j++) {
        fused[j] = fused_dot(isa, type[j], digits);
        f16k[j] = fused16_dot(isa, type[j]), f16k4[j] = fused16_dot4(isa, type[j]);
        all = joined ? f16k[j] != NULL : fused[j] != NULL;
    }
    for (int j = 0; all && j < k; j++) fused4[j] = fused_dot4(isa, type[j], digits);
    if (!all) {
        for (int j = 0; j < k; j++)
            q_matmul_cpu(isa, digits == 1 ? Q_PATH_INT8_1 : Q_PATH_INT8, out[j], x, n, in, type[j], w[j],
                         row_bytes[j], o[j], sc);
        return;
    }
    strip_fn *strip[Q_MULTI_MAX];
    for (int j = 0; j < k; j++) start[j] = total, total += (o[j] + ROW_BLOCK - 1) / ROW_BLOCK;
    start[k] = total;
    int kform = 0;
    for (int j = 0; j < k; j++) kform |= k_form(isa, type[j], in), strip[j] = fused_strip(isa, type[j], digits);
    q_act a = quantize_act(isa, x, n, in, digits, joined, kform, 0, sc);
    // one static split of all the products' blocks of rows (each product's own blocks from its
    // row 0, as q_matmul's: the same rows take the same kernels): one barrier, contiguous streams
#pragma omp parallel for schedule(static)
    for (int rb = 0; rb < total; rb++) {
        int j = 0;
        while (rb >= start[j + 1]) j++;
        const int r = (rb - start[j]) * ROW_BLOCK, run = o[j] - r < ROW_BLOCK ? o[j] - r : ROW_BLOCK;
        const uint8_t *row = (const uint8_t *)w[j] + (size_t)r * row_bytes[j];
        if (joined) fused16_rows(f16k[j], f16k4[j], row, row_bytes[j], run, &a, n, in, out[j] + r, (size_t)o[j]);
        else fused_rows(fused[j], fused4[j], strip[j], type[j], row, row_bytes[j], run, &a, n, in, out[j] + r, (size_t)o[j]);
    }
}

static void matmul_int8(enum q_isa isa, int digits, float *out, const float *x, int n, int in,
                        uint32_t type, const uint8_t *w, size_t row_bytes, int o, q_scratch *sc) {
    dot_q8_fn *dot = isa == Q_ISA_AVX512 ? dot_q8_avx512 : isa == Q_ISA_AVX2 ? dot_q8_avx2
                                                                              : dot_q8_scalar;
    dot_blk_fn *fused = fused_dot(isa, type, digits);
    dot4_fn *fused4 = fused_dot4(isa, type, digits);
    strip_fn *strip = fused_strip(isa, type, digits);
    dot16_fn *f16k = fused16_dot(isa, type);
    dot16x4_fn *f16k4 = fused16_dot4(isa, type);
    size_t ng = (size_t)in / G, unpacked = (size_t)in + 2 * ng * sizeof(float);
    int nt = omp_get_max_threads();
    q_act a = quantize_act(isa, x, n, in, digits, f16k != NULL, k_form(isa, type, in),
                           (size_t)nt * ROW_BLOCK * unpacked, sc);
    int8_t *xq = a.xq;
    float *xd = a.xd, *xa = a.xa;
    uint8_t *rows = a.extra;
    int n_blocks = (o + ROW_BLOCK - 1) / ROW_BLOCK;
    if (f16k) {   // AVX2 kernels, as the AVX-512 ones below
#pragma omp parallel for schedule(static)
        for (int rb = 0; rb < n_blocks; rb++) {
            int r0 = rb * ROW_BLOCK, nr = o - r0 < ROW_BLOCK ? o - r0 : ROW_BLOCK;
            fused16_rows(f16k, f16k4, w + (size_t)r0 * row_bytes, row_bytes, nr, &a, n, in, out + r0, (size_t)o);
        }
        return;
    }
    if (fused) {   // static: each thread streams one contiguous range of rows (prefetch-friendly)
#pragma omp parallel for schedule(static)
        for (int rb = 0; rb < n_blocks; rb++) {
            int r0 = rb * ROW_BLOCK, nr = o - r0 < ROW_BLOCK ? o - r0 : ROW_BLOCK;
            fused_rows(fused, fused4, strip, type, w + (size_t)r0 * row_bytes, row_bytes, nr, &a, n, in, out + r0, (size_t)o);
        }
        return;
    }
#pragma omp parallel
    {
        uint8_t *mine = rows + (size_t)omp_get_thread_num() * ROW_BLOCK * unpacked;
#pragma omp for schedule(dynamic, 4)
        for (int rb = 0; rb < n_blocks; rb++) {
            int r0 = rb * ROW_BLOCK, nr = o - r0 < ROW_BLOCK ? o - r0 : ROW_BLOCK;
            for (int r = 0; r < nr; r++) {
                uint8_t *u = mine + (size_t)r * unpacked;
                float *s = (float *)(u + in), *m = s + ng;
                q_unpack_row(type, w + (size_t)(r0 + r) * row_bytes, in, u, s, m);
            }
            for (int i = 0; i < n; i++)
                for (int r = 0; r < nr; r++) {
                    uint8_t *u = mine + (size_t)r * unpacked;
                    float *s = (float *)(u + in), *m = s + ng;
                    out[(size_t)i * o + r0 + r] = dot(u, s, m, xq + (size_t)i * 2 * in,
                                                      xq + (size_t)i * 2 * in + in,
                                                      xd + i * ng / 2, xa + i * a.xs, in);
                }
        }
    }
}

// F16 / BF16 rows dotted with fp32 x
static void matmul_f16(enum q_isa isa, float *out, const float *x, int n, int in, uint32_t type,
                       const uint8_t *w, size_t row_bytes, int o) {
    dot_f16_fn *dot = isa == Q_ISA_AVX512 ? dot_f16_avx512 : isa == Q_ISA_AVX2 ? dot_f16_avx2
                                                                                : dot_f16_scalar;
    int bf16 = type == GGML_BF16;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < o; r++)
        for (int i = 0; i < n; i++)
            out[(size_t)i * o + r] = dot((const uint16_t *)(w + (size_t)r * row_bytes), bf16,
                                         x + (size_t)i * in, in);
}

// sgemm path: tiles of weight rows dequantised to fp32 (all threads), then one sgemm per tile
static void matmul_sgemm(float *out, const float *x, int n, int in, uint32_t type,
                         const uint8_t *w, size_t row_bytes, int o, q_scratch *sc) {
    int tile = (int)(((size_t)8 << 20) / ((size_t)in * sizeof(float)));
    tile = tile < 64 ? 64 : tile > o ? o : tile;
    float *wf = q_scratch_get(sc, (size_t)tile * in * sizeof(float));
    for (int r0 = 0; r0 < o; r0 += tile) {
        int nr = o - r0 < tile ? o - r0 : tile;
#pragma omp parallel for schedule(static)
        for (int r = 0; r < nr; r++)
            dq_to_f32(type, w + (size_t)(r0 + r) * row_bytes, wf + (size_t)r * in, (uint64_t)in);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, nr, in, 1.0f, x, in, wf, in, 0.0f,
                    out + r0, o);
    }
}

void q_matmul_cpu(enum q_isa isa, enum q_path path, float *out, const float *x, int n, int in,
                  uint32_t type, const void *w, size_t row_bytes, int o, q_scratch *scratch) {
    CHECK_INTERNAL(path == Q_PATH_INT8 || path == Q_PATH_INT8_1 || path == Q_PATH_SGEMM,
                   "q_matmul_cpu: path %d", (int)path);
    if (path == Q_PATH_SGEMM) matmul_sgemm(out, x, n, in, type, w, row_bytes, o, scratch);
    else if (type == GGML_F16 || type == GGML_BF16) matmul_f16(isa, out, x, n, in, type, w, row_bytes, o);
    else matmul_int8(isa, path == Q_PATH_INT8_1 ? 1 : 2, out, x, n, in, type, w, row_bytes, o, scratch);
}

// Times the three forms of a strip at one activation row (see qgemm.h): q4k_strip prefetching to
// L1, to L2, and q4k_rows8, against a Q4_K matrix of 4096 columns filling max(64 MiB, 8x the
// last-level cache) up to 256 MiB, so that it streams from DRAM as decode does; one untimed pass
// of each, then five rounds of the three, each form's best kept.
q_strip_form q_strip_tune(double ms[3]) {
    static q_strip_form tuned;   // the first call's choice, once it timed
    static double tuned_ms[3];
    if (tuned.level) {
        for (int k = 0; k < 3; k++) ms[k] = tuned_ms[k];
        return q_strip_set(tuned);
    }
    ms[0] = ms[1] = ms[2] = NAN;
    if (cpu_best_isa() != Q_ISA_AVX512) return (q_strip_form){0, -1};
    // the last-level cache this core shares (sysfs; glibc's sysconf counts the whole socket's)
    size_t bytes = (size_t)64 << 20, l3 = 0;
    char unit = 0;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    if (f && fscanf(f, "%zu%c", &l3, &unit) == 2)
        l3 <<= unit == 'K' ? 10 : unit == 'M' ? 20 : 0;
    if (f) fclose(f);
    if (8 * l3 > bytes) bytes = 8 * l3 < (size_t)256 << 20 ? 8 * l3 : (size_t)256 << 20;
    // at most an eighth of the memory available now (the model's own pages come next); below 64
    // MiB it would not stream from DRAM, so nothing is timed
    const size_t avail = host_mem_available();
    if (avail && bytes > avail / 8) bytes = avail / 8;
    if (bytes < (size_t)64 << 20) return (q_strip_form){0, -1};
    const int in = 4096;
    const size_t rb = in / 256 * 144;
    const int o = (int)(bytes / rb) / 16 * 16;
    const size_t wbytes = ((size_t)o * rb + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
    uint8_t *w = mmap(NULL, wbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    float *x = malloc(in * sizeof *x), *y = malloc((size_t)o * sizeof *y);
    if (w == MAP_FAILED || !x || !y) {
        if (w != MAP_FAILED) munmap(w, wbytes);
        free(x), free(y);
        return (q_strip_form){0, -1};
    }
    madvise(w, wbytes, MADV_HUGEPAGE);   // (where the kernel allows: fewer page faults to fill it)
    memset(w, 0x11, (size_t)o * rb);   // (d and dmin 0x1111 as fp16, scales and quants small)
    for (int i = 0; i < in; i++) x[i] = (float)((i * 37) % 29 - 14) / 14.0f;
    q_scratch sc = {0};
    double best[3] = {INFINITY, INFINITY, INFINITY};
    const q_strip_form form[3] = {{1, 0}, {2, 0}, {1, 1}};
    for (int rep = 0; rep < 18; rep++) {
        q_strip_set(form[rep % 3]);
        const double t0 = omp_get_wtime();
        q_matmul_cpu(Q_ISA_AVX512, Q_PATH_INT8, y, x, 1, in, GGML_Q4_K, w, rb, o, &sc);
        const double t = (omp_get_wtime() - t0) * 1e3;
        if (rep >= 3 && t < best[rep % 3]) best[rep % 3] = t;
    }
    q_scratch_free(&sc);
    munmap(w, wbytes);
    free(x), free(y);
    for (int k = 0; k < 3; k++) ms[k] = tuned_ms[k] = best[k];
    // L1 only when 2 % faster than L2 (L2 is what the strips were first measured with), 8-row
    // groups only when 2 % faster than the better strip
    tuned.level = best[0] < 0.98 * best[1] ? 1 : 2;
    tuned.rows8 = best[2] < 0.98 * fmin(best[0], best[1]);
    return q_strip_set(tuned);
}
