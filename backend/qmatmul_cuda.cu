// backend/qmatmul_cuda.cu — products with GGUF-quantised weights kept in their blocks on the device
// (CPU twin: dq_to_f32 in weights/dequant.c, then the fp32 product). The device holds the file's
// bytes, not bf16: a Q4_K matrix takes 4.5 bits per weight instead of 16.
//  - few rows of x (decode, n <= QV_ROWS): qgemv_kernel, a warp per output row, lane l taking
//    elements 4l .. 4l + 3 of each 128, dequantised in registers and dotted with x (widened to
//    fp32 once, xprep_kernel): one pass over the blocks, so the bytes read are the file's, with
//    the warp's loads of x and of the blocks contiguous (a lane per 32-element group instead
//    read 32 different lines of x per load: 7.6 ms of L1 wavefronts per 8B token, measured 11.5
//    ms on an H200). Quants become floats by the exponent trick (2^23 + q, exact), not I2F;
//  - many rows (prefill, n > QV_ROWS): the weight is dequantised to bf16 a chunk of rows at a time
//    into one scratch buffer (dequant_kernel: the same values as the CPU's dequantisation,
//    rounded to bf16 as the bf16 path rounds them at upload) and multiplied by cuBLASLt;
//  - embed: the table's rows for the tokens, dequantised (embed_q_kernel).
// Each type's decode4 gives 4 consecutive quants q (as floats) and y = a * q + b for them
// (weights/dequant.c's formulas, the same fp32 values: a * q is exact, so one fma is one rounding
// of the exact value, as on the CPU).
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

// ---- four elements ---------------------------------------------------------------------------

__device__ static inline uint32_t u16at(const uint8_t *p) { return *(const uint16_t *)p; }   // 2-aligned
__device__ static inline uint32_t u32at2(const uint8_t *p) { return u16at(p) | u16at(p + 2) << 16; }
__device__ static inline uint32_t u32at(const uint8_t *p) { return *(const uint32_t *)p; }   // 4-aligned

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

// the four bytes of w as quants, (w >> shift) & mask each
__device__ static inline void quads(uint32_t w, int shift, uint32_t mask, float *q) {
    uint32_t v = (w >> shift) & (mask * 0x01010101u);
    q[0] = qf(v & 0xFF), q[1] = qf(v >> 8 & 0xFF), q[2] = qf(v >> 16 & 0xFF), q[3] = qf(v >> 24);
}

// 6-bit scale and min of sub-block j of Q4_K / Q5_K from the 12 packed bytes (dq_k4_scale_min),
// held as three words: no array indexed at run time
__device__ static inline void k4_scale_min(const uint8_t *s12, int j, int *sc, int *m) {
    const uint32_t w0 = u32at(s12), w1 = u32at(s12 + 4), w2 = u32at(s12 + 8);
    auto byte = [&](int i) { return (int)(((i < 4 ? w0 : i < 8 ? w1 : w2) >> (8 * (i & 3))) & 0xFF); };
    if (j < 4) {
        *sc = byte(j) & 63, *m = byte(j + 4) & 63;
    } else {
        *sc = (byte(j + 4) & 0xF) | ((byte(j - 4) >> 6) << 4);
        *m = (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4);
    }
}

// Elements e .. e + 3 of row (e % 4 == 0; all four in one 16-element half of a 32-element
// group): quants q[4] and y = a * q + b (weights/dequant.c's formulas). Rows start 16-byte
// aligned for the K types (144 and 176-byte blocks), 2-byte aligned for the others.
template <uint32_t T>
__device__ static inline void decode4(const uint8_t *row, int e, float *q, float *a, float *b) {
    if (T == GGML_Q4_0 || T == GGML_Q4_1 || T == GGML_Q5_0 || T == GGML_Q5_1 || T == GGML_Q8_0) {
        const int bs = T == GGML_Q4_0 ? 18 : T == GGML_Q4_1 ? 20 : T == GGML_Q5_0 ? 22 : T == GGML_Q5_1 ? 24 : 34;
        const uint8_t *B = row + (size_t)(e >> 5) * bs;
        const int l = e & 31;
        const float d = f16f(u16at(B));
        if (T == GGML_Q8_0) {   // int8 v as v + 128: d (v + 128) - 128 d = d v, exact
            quads(u32at2(B + 2 + l) ^ 0x80808080u, 0, 0xFF, q);
            *a = d, *b = -128.0f * d;
            return;
        }
        const int has_m = T == GGML_Q4_1 || T == GGML_Q5_1, five = T == GGML_Q5_0 || T == GGML_Q5_1;
        const uint8_t *qs = B + 2 + 2 * has_m + 4 * five;   // Q4_0 2, Q4_1 4, Q5_0 6, Q5_1 8
        // element l: low nibble of qs[l] (l < 16) or high nibble of qs[l - 16]
        const uint32_t w = has_m && !five ? u32at(qs + (l & 15)) : u32at2(qs + (l & 15));
        quads(w, l < 16 ? 0 : 4, 0xF, q);
        if (five) {   // bit 4 of element l is bit l of qh
            const uint32_t qh = (has_m ? u32at(B + 4) : u32at2(B + 2)) >> l;
#pragma unroll
            for (int i = 0; i < 4; i++) q[i] += (float)(16 * ((qh >> i) & 1));
        }
        // Q4_0 (q - 8) d, Q5_0 (q - 16) d: d q exact, so fma(d, q, -8 d) rounds once as the CPU
        *a = d, *b = has_m ? f16f(u16at(B + 2)) : -(five ? 16.0f : 8.0f) * d;
    } else if (T == GGML_Q4_K || T == GGML_Q5_K) {
        const uint8_t *B = row + (size_t)(e >> 8) * (T == GGML_Q4_K ? 144 : 176);
        const int j = (e >> 5) & 7, l = e & 31;   // sub-block, element in it
        int sc, mn;
        k4_scale_min(B + 4, j, &sc, &mn);
        const uint32_t dd = u32at(B);
        quads(u32at(B + (T == GGML_Q4_K ? 16 : 48) + 32 * (j >> 1) + l), 4 * (j & 1), 0xF, q);
        if (T == GGML_Q5_K) {   // bit 4 of element l of sub-block j: bit j of qh[l]
            const uint32_t h = (u32at(B + 16 + l) >> j) & 0x01010101u;
            q[0] += (float)(16 * (h & 1)), q[1] += (float)(16 * (h >> 8 & 1));
            q[2] += (float)(16 * (h >> 16 & 1)), q[3] += (float)(16 * (h >> 24));
        }
        *a = f16f(dd & 0xFFFF) * (float)sc, *b = -(f16f(dd >> 16) * (float)mn);
    } else {   // Q6_K: 210-byte blocks, 2-byte aligned
        const uint8_t *B = row + (size_t)(e >> 8) * 210;
        const int r = e & 255, half = r >> 7, k = (r >> 5) & 3, l = r & 31;
        quads(u32at2(B + 64 * half + 32 * (k & 1) + l), 4 * (k >> 1), 0xF, q);
        const uint32_t h = u32at2(B + 128 + 32 * half + l) >> (2 * k);
        q[0] += (float)(16 * (h & 3)), q[1] += (float)(16 * (h >> 8 & 3));
        q[2] += (float)(16 * (h >> 16 & 3)), q[3] += (float)(16 * (h >> 24 & 3));
        const float sc = (float)((const int8_t *)B)[192 + 8 * half + 2 * k + l / 16];
        *a = f16f(u16at(B + 208)) * sc, *b = -32.0f * *a;   // d sc (q - 32)
    }
}

// ---- kernels ----------------------------------------------------------------------------------

// xf (n) = fp32(x); a thread per 4 elements
__global__ void xprep_kernel(float *xf, const bf16 *x, size_t quads4) {
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= quads4) return;
    float4 v = make_float4(__bfloat162float(x[4 * t]), __bfloat162float(x[4 * t + 1]),
                           __bfloat162float(x[4 * t + 2]), __bfloat162float(x[4 * t + 3]));
    ((float4 *)xf)[t] = v;
}

// out (NV, o) = x (NV, in) @ W (o, in)^T, W quantised (row_bytes per row); grid ceil(o / QW),
// QW * 32 threads: a warp per output row, 128 elements per step, lane l taking elements
// 4l .. 4l + 3, so the warp's loads of x (fp32, xprep_kernel's) and of the blocks are contiguous.
template <uint32_t T, int NV>
__global__ void __launch_bounds__(QW * 32)
qgemv_kernel(bf16 *out, const float *xf, const uint8_t *w, size_t row_bytes, int in, int o) {
    const int lane = threadIdx.x % 32, r = blockIdx.x * QW + threadIdx.x / 32;
    if (r >= o) return;
    const uint8_t *row = w + (size_t)r * row_bytes;
    float acc[NV];
#pragma unroll
    for (int v = 0; v < NV; v++) acc[v] = 0;
#pragma unroll 4
    for (int e = 4 * lane; e < in; e += 128) {
        float q[4], a, b;
        decode4<T>(row, e, q, &a, &b);
#pragma unroll
        for (int v = 0; v < NV; v++) {
            const float4 x = *(const float4 *)(xf + (size_t)v * in + e);
            const float sqx = q[0] * x.x + q[1] * x.y + q[2] * x.z + q[3] * x.w;
            acc[v] += a * sqx + b * (x.x + x.y + x.z + x.w);
        }
    }
#pragma unroll
    for (int v = 0; v < NV; v++) {
        float t = acc[v];
        for (int x = 16; x > 0; x >>= 1) t += __shfl_xor_sync(0xffffffffu, t, x);
        if (lane == 0) out[(size_t)v * o + r] = __float2bfloat16(t);
    }
}

// 4 bf16 of y = a * q + b (one rounding each, as the CPU's dequantisation, then bf16's)
__device__ static inline void store4(bf16 *y, const float *q, float a, float b) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(fmaf(a, q[0], b), fmaf(a, q[1], b));
    __nv_bfloat162 hi = __floats2bfloat162_rn(fmaf(a, q[2], b), fmaf(a, q[3], b));
    *(__nv_bfloat162 *)y = lo, *(__nv_bfloat162 *)(y + 2) = hi;
}

// dst (nr, in) bf16 = rows r0 .. r0 + nr of W dequantised; a thread per 4 elements
template <uint32_t T>
__global__ void dequant_kernel(bf16 *dst, const uint8_t *w, size_t row_bytes, int in, int r0, int nr) {
    const int per = in / 4;
    size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (size_t)nr * per) return;
    const int r = (int)(t / per), e = (int)(t % per) * 4;
    float q[4], a, b;
    decode4<T>(w + (size_t)(r0 + r) * row_bytes, e, q, &a, &b);
    store4(dst + (size_t)r * in + e, q, a, b);
}

// out (n, d) = the table's rows tokens[i] dequantised; grid n, a thread per 4 elements
template <uint32_t T>
__global__ void embed_q_kernel(bf16 *out, const uint8_t *table, size_t row_bytes, const int *tokens,
                               int d) {
    const int i = blockIdx.x;
    const uint8_t *row = table + (size_t)tokens[i] * row_bytes;
    for (int e = 4 * threadIdx.x; e < d; e += 4 * blockDim.x) {
        float q[4], a, b;
        decode4<T>(row, e, q, &a, &b);
        store4(out + (size_t)i * d + e, q, a, b);
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
static void gemv(cuda_impl *c, bf16 *out, const float *xf, const bk_weight *w, int nv, int in, int o) {
    unsigned grid = cuda_blocks((size_t)o, QW);
    if (nv == 4) CUDA_LAUNCH((qgemv_kernel<T, 4>), grid, QW * 32, 0, c->stream, out, xf, w->q, w->row_bytes, in, o);
    else if (nv == 2) CUDA_LAUNCH((qgemv_kernel<T, 2>), grid, QW * 32, 0, c->stream, out, xf, w->q, w->row_bytes, in, o);
    else CUDA_LAUNCH((qgemv_kernel<T, 1>), grid, QW * 32, 0, c->stream, out, xf, w->q, w->row_bytes, in, o);
}

template <uint32_t T>
static void dequant_rows(cuda_impl *c, bf16 *dst, const bk_weight *w, int in, int r0, int nr) {
    size_t quads4 = (size_t)nr * (in / 4);
    CUDA_LAUNCH(dequant_kernel<T>, cuda_blocks(quads4, THREADS), THREADS, 0, c->stream, dst, w->q,
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
        float *xf = (float *)dev_buf_reserve(c, &c->qx, nx * sizeof(float), "a quantised product");
        CUDA_LAUNCH(xprep_kernel, cuda_blocks(nx / 4, THREADS), THREADS, 0, c->stream, xf, xb, nx / 4);
        for (int v0 = 0; v0 < n;) {
            int nv = n - v0 >= QV_MAX ? QV_MAX : n - v0 >= 2 ? 2 : 1;
#define GEMV(T) gemv<T>(c, y + (size_t)v0 * o, xf + (size_t)v0 * in, w, nv, in, o)
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
#define EMB(T) CUDA_LAUNCH(embed_q_kernel<T>, dim3((unsigned)n), 256, 0, c->stream, (bf16 *)out, \
                           table->q, table->row_bytes, dtokens, d)
    FOR_TYPE(table->qtype, EMB)
#undef EMB
}
