// backend/qmatmul_cuda.cu — products with GGUF-quantised weights kept in their blocks on the device
// (CPU twin: dq_to_f32 in weights/dequant.c, then the fp32 product). The device holds the file's
// bytes, not bf16: a Q4_K matrix takes 4.5 bits per weight instead of 16.
//  - few rows of x (decode, n <= QV_ROWS): qgemv_kernel, a warp per output row, each lane a
//    32-element group at a time, dequantised in registers and dotted with x: one pass over the
//    blocks, so the bytes read are the file's. x is first widened to fp32 with its per-16 sums
//    (xprep_kernel), so a group's product is a * sum(q x) + b * sum(x) per 16 elements and the
//    quants turn into floats by the exponent trick (2^23 + q, exact) instead of a conversion
//    instruction;
//  - many rows (prefill, n > QV_ROWS): the weight is dequantised to bf16 a chunk of rows at a time
//    into one scratch buffer (dequant_kernel: the same values as the CPU's dequantisation,
//    rounded to bf16 as the bf16 path rounds them at upload) and multiplied by cuBLASLt;
//  - embed: the table's rows for the tokens, dequantised (embed_q_kernel).
// Group g of a row is elements 32g .. 32g + 31; each type's decode gives the 32 quants q (as
// floats) and, per 16 elements, y = a * q + b (weights/dequant.c's formulas, same fp32 values:
// a * q is exact, so one fma is one rounding of the exact value, as on the CPU).
#include "backend_cuda.cuh"

#define QW 4            // warps (output rows) per qgemv block
#define QV_MAX 4        // x rows per qgemv launch (more run in several launches)
#define QV_ROWS 16      // up to this many x rows take qgemv; more take dequant + cuBLASLt
#define DQ_SCRATCH (32u << 20)   // bf16 elements of the dequantisation scratch (64 MiB)

int cuda_qtype(uint32_t type) {
    switch (type) {
    case GGML_Q4_0: case GGML_Q4_1: case GGML_Q5_0: case GGML_Q5_1: case GGML_Q8_0:
    case GGML_Q4_K: case GGML_Q5_K: case GGML_Q6_K: return 1;
    default: return 0;
    }
}

// ---- one group of 32 elements -----------------------------------------------------------------

__device__ static inline uint32_t u16at(const uint8_t *p) { return *(const uint16_t *)p; }   // 2-aligned
__device__ static inline uint32_t u32at2(const uint8_t *p) { return u16at(p) | u16at(p + 2) << 16; }

// f16 bits -> fp32 (normals, subnormals, inf/nan), as dq_f16_to_f32
__device__ static inline float f16f(uint32_t h) {
    uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (e == 0x1f) return __int_as_float((int)(sign | 0x7f800000u | man << 13));
    if (e) return __int_as_float((int)(sign | (e + 112) << 23 | man << 13));
    float f = (float)man * 0x1p-24f;
    return sign ? -f : f;
}

// q (0 <= q < 2^23) as a float: 2^23 + q has q in its mantissa; subtracting 2^23 is exact
__device__ static inline float qf(uint32_t q) { return __int_as_float((int)(0x4B000000u | q)) - 8388608.0f; }

// 16 bytes at a 2-byte aligned p into b[16]
__device__ static inline void bytes16(const uint8_t *p, uint8_t *b) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
        uint32_t v = u16at(p + 2 * i);
        b[2 * i] = (uint8_t)v, b[2 * i + 1] = (uint8_t)(v >> 8);
    }
}

// 32 bytes at a 16-byte aligned p into b[32]
__device__ static inline void bytes32a(const uint8_t *p, uint8_t *b) {
    uint4 v[2] = {((const uint4 *)p)[0], ((const uint4 *)p)[1]};
    const uint8_t *s = (const uint8_t *)v;
#pragma unroll
    for (int i = 0; i < 32; i++) b[i] = s[i];
}

// 6-bit scale and min of sub-block j of Q4_K / Q5_K (dq_k4_scale_min)
__device__ static inline void k4_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63, *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Group g of row (row_bytes apart rows start 2-byte aligned; K types 16-byte aligned blocks are
// read 16 bytes at a time where the layout allows): q[32] quants, y = a[h] * q + b[h] for
// elements 16h .. 16h + 15.
template <uint32_t T>
__device__ static inline void decode_group(const uint8_t *row, int g, float *q, float *a, float *b) {
    if (T == GGML_Q4_0 || T == GGML_Q4_1 || T == GGML_Q5_0 || T == GGML_Q5_1) {
        const int bs = T == GGML_Q4_0 ? 18 : T == GGML_Q4_1 ? 20 : T == GGML_Q5_0 ? 22 : 24;
        const uint8_t *B = row + (size_t)g * bs;
        const float d = f16f(u16at(B));
        const int has_m = T == GGML_Q4_1 || T == GGML_Q5_1, five = T == GGML_Q5_0 || T == GGML_Q5_1;
        const float m = has_m ? f16f(u16at(B + 2)) : 0.0f;
        const uint8_t *p = B + 2 + 2 * has_m;
        uint32_t qh = 0;
        if (five) qh = u32at2(p), p += 4;
        uint8_t s[16];
        bytes16(p, s);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            uint32_t lo = s[j] & 0xF, hi = s[j] >> 4;
            if (five) lo |= ((qh >> j) & 1) << 4, hi |= ((qh >> (j + 16)) & 1) << 4;
            q[j] = qf(lo), q[j + 16] = qf(hi);
        }
        // Q4_0 (q - 8) d, Q5_0 (q - 16) d: d * q exact, so fma(d, q, -8d) rounds once as the CPU
        a[0] = a[1] = d;
        b[0] = b[1] = has_m ? m : -(five ? 16.0f : 8.0f) * d;
    } else if (T == GGML_Q8_0) {
        const uint8_t *B = row + (size_t)g * 34;
        const float d = f16f(u16at(B));
        uint8_t s[32];
        bytes16(B + 2, s), bytes16(B + 18, s + 16);
#pragma unroll
        for (int j = 0; j < 32; j++) q[j] = qf(s[j] ^ 0x80u);   // int8 v as v + 128
        a[0] = a[1] = d, b[0] = b[1] = -128.0f * d;               // d (v + 128) - 128 d = d v, exact
    } else if (T == GGML_Q4_K || T == GGML_Q5_K) {
        const int bs = T == GGML_Q4_K ? 144 : 176, j = g & 7;
        const uint8_t *B = row + (size_t)(g >> 3) * bs;
        const float d = f16f(u16at(B)), dmin = f16f(u16at(B + 2));
        uint8_t sc12[12];
#pragma unroll
        for (int i = 0; i < 6; i++) {
            uint32_t v = u16at(B + 4 + 2 * i);
            sc12[2 * i] = (uint8_t)v, sc12[2 * i + 1] = (uint8_t)(v >> 8);
        }
        int sc, mn;
        k4_scale_min(sc12, j, &sc, &mn);
        const uint8_t *qs = B + (T == GGML_Q4_K ? 16 : 48) + 32 * (j >> 1);
        const int shift = 4 * (j & 1);
        uint8_t s[32], h[32];
        bytes32a(qs, s);
        if (T == GGML_Q5_K) bytes32a(B + 16, h);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            uint32_t v = (s[l] >> shift) & 0xF;
            if (T == GGML_Q5_K) v |= ((h[l] >> j) & 1) << 4;
            q[l] = qf(v);
        }
        a[0] = a[1] = d * (float)sc, b[0] = b[1] = -(dmin * (float)mn);
    } else {   // Q6_K: 210-byte blocks, 2-byte aligned
        const int j = g & 7, half = j >> 2, k = j & 3;
        const uint8_t *B = row + (size_t)(g >> 3) * 210;
        const float d = f16f(u16at(B + 208));
        uint8_t lo[32], hb[32];
        bytes16(B + 64 * half + 32 * (k & 1), lo), bytes16(B + 64 * half + 32 * (k & 1) + 16, lo + 16);
        bytes16(B + 128 + 32 * half, hb), bytes16(B + 128 + 32 * half + 16, hb + 16);
        const int shift = 4 * (k >> 1);
#pragma unroll
        for (int l = 0; l < 32; l++) q[l] = qf(((lo[l] >> shift) & 0xF) | ((hb[l] >> (2 * k)) & 3) << 4);
        const int8_t *sc = (const int8_t *)(B + 192 + 8 * half + 2 * k);
#pragma unroll
        for (int h2 = 0; h2 < 2; h2++) a[h2] = d * (float)sc[h2], b[h2] = -32.0f * a[h2];   // d sc (q - 32)
    }
}

// ---- kernels ----------------------------------------------------------------------------------

// xf (n, in) = fp32(x); xs (n, in / 16) = sums of 16 consecutive elements; a thread per 16
__global__ void xprep_kernel(float *xf, float *xs, const bf16 *x, size_t groups16) {
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= groups16) return;
    float s = 0;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        float v = __bfloat162float(x[t * 16 + i]);
        xf[t * 16 + i] = v, s += v;
    }
    xs[t] = s;
}

// out (NV, o) = x (NV, in) @ W (o, in)^T, W quantised (row_bytes per row); grid ceil(o / QW),
// QW * 32 threads. xf, xs: xprep_kernel's output for these NV rows.
template <uint32_t T, int NV>
__global__ void __launch_bounds__(QW * 32)
qgemv_kernel(bf16 *out, const float *xf, const float *xs, const uint8_t *w, size_t row_bytes,
             int in, int o) {
    const int lane = threadIdx.x % 32, r = blockIdx.x * QW + threadIdx.x / 32;
    if (r >= o) return;
    const uint8_t *row = w + (size_t)r * row_bytes;
    const int ng = in / 32;
    float acc[NV];
#pragma unroll
    for (int v = 0; v < NV; v++) acc[v] = 0;
#pragma unroll 2
    for (int g = lane; g < ng; g += 32) {
        float q[32], a[2], b[2];
        decode_group<T>(row, g, q, a, b);
#pragma unroll
        for (int v = 0; v < NV; v++) {
            const float4 *xv = (const float4 *)(xf + (size_t)v * in + (size_t)g * 32);
            float s[2] = {0, 0};
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 t = xv[i];
                s[i / 4] += q[4 * i] * t.x + q[4 * i + 1] * t.y + q[4 * i + 2] * t.z + q[4 * i + 3] * t.w;
            }
            const float *sv = xs + (size_t)v * (in / 16) + 2 * g;
            acc[v] += a[0] * s[0] + b[0] * sv[0] + a[1] * s[1] + b[1] * sv[1];
        }
    }
#pragma unroll
    for (int v = 0; v < NV; v++) {
        float t = acc[v];
        for (int x = 16; x > 0; x >>= 1) t += __shfl_xor_sync(0xffffffffu, t, x);
        if (lane == 0) out[(size_t)v * o + r] = __float2bfloat16(t);
    }
}

// dst (nr, in) bf16 = rows r0 .. r0 + nr of W dequantised; a thread per group
template <uint32_t T>
__global__ void dequant_kernel(bf16 *dst, const uint8_t *w, size_t row_bytes, int in, int r0, int nr) {
    const int ng = in / 32;
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)nr * ng) return;
    const int r = (int)(t / ng), g = (int)(t % ng);
    float q[32], a[2], b[2];
    decode_group<T>(w + (size_t)(r0 + r) * row_bytes, g, q, a, b);
    bf16 *y = dst + (size_t)r * in + (size_t)g * 32;
#pragma unroll
    for (int l = 0; l < 32; l++) y[l] = __float2bfloat16(fmaf(a[l / 16], q[l], b[l / 16]));
}

// out (n, d) = the table's rows tokens[i] dequantised; grid n, threads over the groups
template <uint32_t T>
__global__ void embed_q_kernel(bf16 *out, const uint8_t *table, size_t row_bytes, const int *tokens,
                               int d) {
    const int i = blockIdx.x;
    const uint8_t *row = table + (size_t)tokens[i] * row_bytes;
    for (int g = threadIdx.x; g < d / 32; g += blockDim.x) {
        float q[32], a[2], b[2];
        decode_group<T>(row, g, q, a, b);
        bf16 *y = out + (size_t)i * d + (size_t)g * 32;
#pragma unroll
        for (int l = 0; l < 32; l++) y[l] = __float2bfloat16(fmaf(a[l / 16], q[l], b[l / 16]));
    }
}

// ---- host side --------------------------------------------------------------------------------

#define FOR_TYPE(T, CALL)                                                                          \
    switch (T) {                                                                                   \
    case GGML_Q4_0: CALL(GGML_Q4_0); break;                                                        \
    case GGML_Q4_1: CALL(GGML_Q4_1); break;                                                        \
    case GGML_Q5_0: CALL(GGML_Q5_0); break;                                                        \
    case GGML_Q5_1: CALL(GGML_Q5_1); break;                                                        \
    case GGML_Q8_0: CALL(GGML_Q8_0); break;                                                        \
    case GGML_Q4_K: CALL(GGML_Q4_K); break;                                                        \
    case GGML_Q5_K: CALL(GGML_Q5_K); break;                                                        \
    case GGML_Q6_K: CALL(GGML_Q6_K); break;                                                        \
    default: CHECK_INTERNAL(0, "no device kernel for GGUF type %u", (unsigned)(T));                 \
    }

template <uint32_t T>
static void gemv(cuda_impl *c, bf16 *out, const float *xf, const float *xs, const bk_weight *w,
                 int nv, int in, int o) {
    unsigned grid = cuda_blocks((size_t)o, QW);
    if (nv == 4) CUDA_LAUNCH((qgemv_kernel<T, 4>), grid, QW * 32, 0, c->stream, out, xf, xs, w->q, w->row_bytes, in, o);
    else if (nv == 2) CUDA_LAUNCH((qgemv_kernel<T, 2>), grid, QW * 32, 0, c->stream, out, xf, xs, w->q, w->row_bytes, in, o);
    else CUDA_LAUNCH((qgemv_kernel<T, 1>), grid, QW * 32, 0, c->stream, out, xf, xs, w->q, w->row_bytes, in, o);
}

template <uint32_t T>
static void dequant_rows(cuda_impl *c, bf16 *dst, const bk_weight *w, int in, int r0, int nr) {
    size_t groups = (size_t)nr * (in / 32);
    CUDA_LAUNCH(dequant_kernel<T>, cuda_blocks(groups, THREADS), THREADS, 0, c->stream, dst, w->q,
                w->row_bytes, in, r0, nr);
}

// Rows per dequantised chunk: what the scratch holds, a multiple of 8 (16-byte aligned output
// columns); SIFT_CUDA_DQ_ROWS overrides it (gpu_check: several chunks on small weights).
static int chunk_rows(int in) {
    const char *e = getenv("SIFT_CUDA_DQ_ROWS");
    int r = e && atoi(e) > 0 ? atoi(e) : (int)(DQ_SCRATCH / (unsigned)in);
    r -= r % 8;
    return r < 8 ? 8 : r;
}

void cuda_qmatmul(cuda_impl *c, void *out, const void *x, const bk_weight *w, int n, int in, int o) {
    CHECK_INTERNAL(in % 32 == 0 && w->q, "quantised product needs blocks and in %% 32 == 0 (in %d)", in);
    bf16 *y = (bf16 *)out;
    const bf16 *xb = (const bf16 *)x;
    if (n <= QV_ROWS) {
        size_t nx = (size_t)n * in;
        float *xf = (float *)dev_buf_reserve(c, &c->qx, (nx + nx / 16) * sizeof(float), "a quantised product");
        float *xs = xf + nx;
        CUDA_LAUNCH(xprep_kernel, cuda_blocks(nx / 16, THREADS), THREADS, 0, c->stream, xf, xs, xb, nx / 16);
        for (int v0 = 0; v0 < n;) {
            int nv = n - v0 >= QV_MAX ? QV_MAX : n - v0 >= 2 ? 2 : 1;
#define GEMV(T) gemv<T>(c, y + (size_t)v0 * o, xf + (size_t)v0 * in, xs + (size_t)v0 * (in / 16), w, nv, in, o)
            FOR_TYPE(w->qtype, GEMV)
#undef GEMV
            v0 += nv;
        }
        return;
    }
    const int cr = chunk_rows(in);
    const int rows = cr < o ? cr : o;
    bf16 *scratch = (bf16 *)dev_buf_reserve(c, &c->dq, (size_t)rows * in * sizeof(bf16),
                                            "the dequantisation scratch");
    for (int r0 = 0; r0 < o; r0 += cr) {
        int nr = o - r0 < cr ? o - r0 : cr;
#define DQ(T) dequant_rows<T>(c, scratch, w, in, r0, nr)
        FOR_TYPE(w->qtype, DQ)
#undef DQ
        gemm_bf16_ld(c, y + r0, o, xb, scratch, n, in, nr);
    }
}

void cuda_qembed(cuda_impl *c, void *out, const bk_weight *table, const int *dtokens, int n, int d) {
    CHECK_INTERNAL(d % 32 == 0 && table->q, "quantised embedding needs d %% 32 == 0 (d %d)", d);
#define EMB(T) CUDA_LAUNCH(embed_q_kernel<T>, dim3((unsigned)n), 128, 0, c->stream, (bf16 *)out, \
                           table->q, table->row_bytes, dtokens, d)
    FOR_TYPE(table->qtype, EMB)
#undef EMB
}
