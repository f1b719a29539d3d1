// backend/qmatmul_cuda.cu — products with GGUF-quantised weights kept in their blocks on the device
// (CPU twin: dq_to_f32 in weights/dequant.c, then the fp32 product). The device holds the file's
// bytes, not bf16: a Q4_K matrix takes 4.5 bits per weight instead of 16.
//  - few rows of x (decode, n <= QV_ROWS): qgemv_kernel, a warp per output row, a lane per
//    32-element group: the group's quants unpacked to bytes in registers and multiplied by x's
//    int8 blocks (xq8_kernel: x rounded to 8 bits per block of 32, as llama.cpp's CUDA and the
//    CPU's --weights fast do) with dp4a, the block scales applied once per group. One pass over
//    the blocks: the bytes read are the file's. (fp32 dequantisation per element measured 11.5
//    ms per 8B Q4_K token on an H200, instruction-bound, against 5.8 ms for bf16 weights.)
//    Q4_K, Q5_K and Q6_K take qgemv_k_kernel instead, Q8_0 qgemv_q8_kernel (a lane per 16 bytes
//    of quants, a row's loads issued before its products; SIFT_CUDA_QGEMV=group: qgemv_kernel,
//    the A/B);
//  - a batch of rows (QV_ROWS < n <= QT_ROWS: batched decode, short prefills): qgemm_kernel, 64 x
//    64 tiles of out, W dequantised into shared memory a 256-wide step at a time, mma.sync;
//  - many rows (prefill, n > QT_ROWS): the weight is dequantised to bf16 a chunk of rows at a time
//    into one scratch buffer (dequant_kernel: the same values as the CPU's dequantisation,
//    rounded to bf16 as the bf16 path rounds them at upload) and multiplied by cuBLASLt;
//  - embed: the table's rows for the tokens, dequantised (embed_q_kernel).
// decode4 (dequantisation, embed) gives 4 consecutive quants q as floats and y = a * q + b for
// them (weights/dequant.c's formulas, the same fp32 values: a * q is exact, so one fma is one
// rounding of the exact value, as on the CPU); decode32 (the product) a group's quants as bytes.
#include "backend_cuda.cuh"

#define QW 4            // warps (output rows) per qgemv block
#define QV_MAX 8        // x rows per qgemv launch, 8, 4, 2 or 1 (more run in several launches:
                        // each launch reads the weights once)
#define QV_ROWS 16      // up to this many x rows take qgemv; more take qgemm_kernel or dequant + cuBLASLt
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

// Where a 32-element format keeps its parts (weights/dequant.c's layouts), byte offsets in a
// block: d at 0, m (Q4_1, Q5_1) at 2, the 32 fifth bits (Q5_0, Q5_1) at qh, the 16 nibble bytes
// (or Q8_0's 32 int8) at qs. Rows start at multiples of the block size, so a 4-byte read at qs + 4i
// is aligned exactly when qs and the block size are multiples of 4 (Q4_1, Q5_1).
template <uint32_t T> struct blk32 {
    static constexpr bool m = T == GGML_Q4_1 || T == GGML_Q5_1, five = T == GGML_Q5_0 || T == GGML_Q5_1;
    static constexpr int qh = m ? 4 : 2, qs = 2 + 2 * m + 4 * five;
    static constexpr int bytes = T == GGML_Q8_0 ? 34 : qs + 16;
    static constexpr bool aligned4 = qs % 4 == 0 && bytes % 4 == 0;
};
template <uint32_t T> __device__ static inline uint32_t word(const uint8_t *p) {   // 4 bytes at p
    return blk32<T>::aligned4 ? u32at(p) : u32at2(p);
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
        typedef blk32<T> L;
        const uint8_t *B = row + (size_t)(e >> 5) * L::bytes;
        const int l = e & 31;
        const float d = f16_to_f32(u16at(B));
        if (T == GGML_Q8_0) {   // int8 v as v + 128: d (v + 128) - 128 d = d v, exact
            quads(word<T>(B + L::qs + l) ^ 0x80808080u, 0, 0xFF, q);
            *a = d, *b = -128.0f * d;
            return;
        }
        // element l: low nibble of qs[l] (l < 16) or high nibble of qs[l - 16]
        quads(word<T>(B + L::qs + (l & 15)), l < 16 ? 0 : 4, 0xF, q);
        if (L::five) {   // bit 4 of element l is bit l of qh
            const uint32_t qh = word<T>(B + L::qh) >> l;
#pragma unroll
            for (int i = 0; i < 4; i++) q[i] += (float)(16 * ((qh >> i) & 1));
        }
        // Q4_0 (q - 8) d, Q5_0 (q - 16) d: d q exact, so fma(d, q, -8 d) rounds once as the CPU
        *a = d, *b = L::m ? f16_to_f32(u16at(B + 2)) : -(L::five ? 16.0f : 8.0f) * d;
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
        *a = f16_to_f32(dd & 0xFFFF) * (float)sc, *b = -(f16_to_f32(dd >> 16) * (float)mn);
    } else {   // Q6_K: 210-byte blocks, 2-byte aligned
        const uint8_t *B = row + (size_t)(e >> 8) * 210;
        const int r = e & 255, half = r >> 7, k = (r >> 5) & 3, l = r & 31;
        quads(u32at2(B + 64 * half + 32 * (k & 1) + l), 4 * (k >> 1), 0xF, q);
        const uint32_t h = u32at2(B + 128 + 32 * half + l) >> (2 * k);
        q[0] += (float)(16 * (h & 3)), q[1] += (float)(16 * (h >> 8 & 3));
        q[2] += (float)(16 * (h >> 16 & 3)), q[3] += (float)(16 * (h >> 24 & 3));
        const float sc = (float)((const int8_t *)B)[192 + 8 * half + 2 * k + l / 16];
        *a = f16_to_f32(u16at(B + 208)) * sc, *b = -32.0f * *a;   // d sc (q - 32)
    }
}

// Group g (elements 32g .. 32g + 31) of row for the integer product: qw[w] holds the quants of
// elements 4w .. 4w + 3, one per byte (unsigned, or signed for Q8_0: dp4a's signed bytes either
// way, every quant < 128), and y = a[h] * q + b[h] for elements 16h .. 16h + 15.
__device__ static inline uint32_t spread4(uint32_t x) {   // bits 0..3 of x to bit 0 of bytes 0..3
    return (x & 1) | (x & 2) << 7 | (x & 4) << 14 | (x & 8) << 21;
}

template <uint32_t T>
__device__ static inline void decode32(const uint8_t *row, int g, uint32_t *qw, float *a, float *b) {
    if (T == GGML_Q4_0 || T == GGML_Q4_1 || T == GGML_Q5_0 || T == GGML_Q5_1) {
        typedef blk32<T> L;
        const uint8_t *B = row + (size_t)g * L::bytes, *qs = B + L::qs;
        const uint32_t qh = L::five ? word<T>(B + L::qh) : 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {   // element j: low nibble of qs[j], j + 16: its high nibble
            const uint32_t w = word<T>(qs + 4 * i);
            qw[i] = w & 0x0F0F0F0Fu, qw[4 + i] = (w >> 4) & 0x0F0F0F0Fu;
            if (L::five) qw[i] |= spread4(qh >> (4 * i)) << 4, qw[4 + i] |= spread4(qh >> (16 + 4 * i)) << 4;
        }
        const float d = f16_to_f32(u16at(B));
        a[0] = a[1] = d;
        b[0] = b[1] = L::m ? f16_to_f32(u16at(B + 2)) : -(L::five ? 16.0f : 8.0f) * d;
    } else if (T == GGML_Q8_0) {
        const uint8_t *B = row + (size_t)g * blk32<T>::bytes;
#pragma unroll
        for (int i = 0; i < 8; i++) qw[i] = word<T>(B + blk32<T>::qs + 4 * i);
        a[0] = a[1] = f16_to_f32(u16at(B)), b[0] = b[1] = 0;
    } else if (T == GGML_Q4_K || T == GGML_Q5_K) {
        const int j = g & 7, shift = 4 * (j & 1);
        const uint8_t *B = row + (size_t)(g >> 3) * (T == GGML_Q4_K ? 144 : 176);
        const uint4 *qs = (const uint4 *)(B + (T == GGML_Q4_K ? 16 : 48) + 32 * (j >> 1));
        uint4 v0 = qs[0], v1 = qs[1];
        uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
        for (int i = 0; i < 8; i++) qw[i] = (w[i] >> shift) & 0x0F0F0F0Fu;
        if (T == GGML_Q5_K) {   // bit 4 of element l: bit j of qh[l]
            uint4 h0 = ((const uint4 *)(B + 16))[0], h1 = ((const uint4 *)(B + 16))[1];
            uint32_t h[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
            for (int i = 0; i < 8; i++) qw[i] |= ((h[i] >> j) & 0x01010101u) << 4;
        }
        int sc, mn;
        k4_scale_min(B + 4, j, &sc, &mn);
        const uint32_t dd = u32at(B);
        a[0] = a[1] = f16_to_f32(dd & 0xFFFF) * (float)sc, b[0] = b[1] = -(f16_to_f32(dd >> 16) * (float)mn);
    } else {   // Q6_K: 210-byte blocks, 2-byte aligned
        const int j = g & 7, half = j >> 2, k = j & 3;
        const uint8_t *B = row + (size_t)(g >> 3) * 210;
        const uint8_t *ql = B + 64 * half + 32 * (k & 1), *qh = B + 128 + 32 * half;
#pragma unroll
        for (int i = 0; i < 8; i++)
            qw[i] = ((u32at2(ql + 4 * i) >> (4 * (k >> 1))) & 0x0F0F0F0Fu) |
                    ((u32at2(qh + 4 * i) >> (2 * k)) & 0x03030303u) << 4;
        const float d = f16_to_f32(u16at(B + 208));
        const int8_t *sc = (const int8_t *)(B + 192 + 8 * half + 2 * k);
        a[0] = d * (float)sc[0], a[1] = d * (float)sc[1];
        b[0] = -32.0f * a[0], b[1] = -32.0f * a[1];   // d sc (q - 32)
    }
}

// ---- kernels ----------------------------------------------------------------------------------

// the integer dot product of 16 quants (4 per word of q, bytes dp4a takes as signed) with 16 of
// x's int8, in one dp4a chain
__device__ static inline int dot16(const uint32_t *q, uint4 x) {
    int i = dp4a_s32((int)q[0], (int)x.x, 0);
    i = dp4a_s32((int)q[1], (int)x.y, i), i = dp4a_s32((int)q[2], (int)x.z, i);
    return dp4a_s32((int)q[3], (int)x.w, i);
}

// x (n, in) bf16 -> int8 blocks of 32 for the integer product (llama.cpp's q8_1 idea): per block
// dx = max |x| / 127, xq = round(x / dx) (|x - dx xq| <= dx / 2), and xs = {dx, dx * the sum of
// xq over elements 0..15, dx, the same over 16..31}: each half's pair is one aligned float2. A warp per block, a lane per element (a thread
// per block ran 128 threads for a 4096-wide x: ~1 ms of every 8B token on an H200).
__global__ void xq8_kernel(int8_t *xq, float4 *xs, const bf16 *x, size_t blocks) {
    const size_t b = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    if (b >= blocks) return;   // whole warps: blocks * 32 threads are launched, rounded up
    const float v = __bfloat162float(x[b * 32 + lane]);
    float amax = fabsf(v);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float dx = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
    int q = (int)rintf(v * inv);
    q = q > 127 ? 127 : q < -127 ? -127 : q;
    xq[b * 32 + lane] = (int8_t)q;
    int sum = q;   // over this lane's half: lanes 0..15, 16..31
    for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const int hi = __shfl_sync(0xffffffffu, sum, 16);
    if (lane == 0) xs[b] = make_float4(dx, dx * (float)sum, dx, dx * (float)hi);
}

// out (NV, o) = x (NV, in) @ W (o, in)^T, W quantised (row_bytes per row), x as xq8_kernel's
// blocks; grid ceil(o / QW), QW * 32 threads: a warp per output row, a lane per 32-element group
// (its block's quants in registers, 8 dp4a against x's int8, then the scales): one pass over the
// blocks, the warp's loads of the blocks and of x contiguous.
template <uint32_t T, int NV>
__global__ void __launch_bounds__(QW * 32)
qgemv_kernel(bf16 *out, const int8_t *xq, const float4 *xs, const uint8_t *w, size_t row_bytes,
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
        uint32_t qw[8];
        float a[2], b[2];
        decode32<T>(row, g, qw, a, b);
#pragma unroll
        for (int v = 0; v < NV; v++) {
            const uint4 *xv = (const uint4 *)(xq + (size_t)v * in + (size_t)g * 32);
            const uint4 x0 = xv[0], x1 = xv[1];
            const float4 s = xs[(size_t)v * ng + g];
            const int i0 = dot16(qw, x0), i1 = dot16(qw + 4, x1);
            acc[v] += s.x * (a[0] * (float)i0 + a[1] * (float)i1) + b[0] * s.y + b[1] * s.w;
        }
    }
#pragma unroll
    for (int v = 0; v < NV; v++) {
        float t = acc[v];
        for (int x = 16; x > 0; x >>= 1) t += __shfl_xor_sync(0xffffffffu, t, x);
        if (lane == 0) out[(size_t)v * o + r] = __float2bfloat16(t);
    }
}

// The same product for the 256-element K types with a lane per 16 bytes of quants instead of per
// 32-element group: 8 lanes per block, 4 blocks per warp step, a warp per row. A lane's 16 bytes
// hold 32 weights, 16 consecutive elements of two sub-groups in the low and high nibbles, and the
// lane uses every bit it loads (the group kernel's lane loads a 32-byte run for one nibble of
// each byte, Q6_K's high bits for two of each 8). A lane loads KU steps' blocks before it
// multiplies, so for one row of x a 4096-wide row of W (16 blocks) is one round trip to memory, and decodes its two
// sub-groups' scales without a branch (the group kernel splits a warp between sub-blocks 0-3 and
// 4-7). grid ceil(o / QW), QW * 32 threads.
//  - Q4_K / Q5_K: run p (bytes 32p .. 32p + 31 of qs) holds sub-block 2p in the low nibbles and
//    2p + 1 in the high ones; chunk c = 2p + h is elements 16h .. 16h + 15 of both. The block's
//    16-byte head (d, dmin, the 12 scale bytes) is one address for its 8 lanes; Q5_K's fifth bits
//    of those elements are qh bytes 16h .. 16h + 15 (bit j for sub-block j). 16-byte loads that
//    skip L1 (ld_stream16): every byte is loaded once, and x's blocks, re-read by every row, stay.
//  - Q6_K: chunk c is ql bytes 16c .. 16c + 15: half c / 4, sub-groups k = c / 2 % 2 (low
//    nibbles) and k + 2 (high), elements 16h .. 16h + 15 (h = c % 2); their top two bits are qh
//    bytes 32 half + 16h .. + 15 (bits 2k, 2k + 4), their scales int8 8 half + 2k + h and + 4.
//    Blocks of 210 bytes are only 2-byte aligned: each 16-byte run is 5 aligned words shifted
//    by 0 or 16 bits (the words overlap between lanes: L1 serves the repeats, so plain loads).
template <uint32_t T> struct kchunk {   // one lane's loaded bytes of one block
    static constexpr int bytes = T == GGML_Q4_K ? 144 : T == GGML_Q5_K ? 176 : 210;
    uint32_t w[T == GGML_Q6_K ? 12 : T == GGML_Q5_K ? 12 : 8];
};

// the 16 bytes at p (2-byte aligned) as 4 words, from the 5 aligned words around them
__device__ static inline void words16_2(const uint8_t *p, uint32_t *w) {
    const int off = (int)((uintptr_t)p & 3);   // 0 or 2
    const uint32_t *a = (const uint32_t *)(p - off);   // (p - off keeps p's state space: LDG)
    const int sh = 8 * off;
    uint32_t u[5];
#pragma unroll
    for (int i = 0; i < 5; i++) u[i] = a[i];
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = sh ? (u[i] >> 16 | u[i + 1] << 16) : u[i];
}

template <uint32_t T> __device__ static inline void kchunk_load(const uint8_t *B, int c, kchunk<T> *k) {
    const int h = c % 2;
    if constexpr (T == GGML_Q6_K) {
        const int half = c / 4, kk = c / 2 % 2;
        words16_2(B + 16 * c, k->w);
        words16_2(B + 128 + 32 * half + 16 * h, k->w + 4);
        const int8_t *sc = (const int8_t *)(B + 192 + 8 * half + 2 * kk + h);
        k->w[8] = (uint32_t)(int32_t)sc[0], k->w[9] = (uint32_t)(int32_t)sc[4];
        k->w[10] = u16at(B + 208);
    } else {
        constexpr int QS = T == GGML_Q4_K ? 16 : 48;
        const uint4 hd = ld_stream16(B), q = ld_stream16(B + QS + 16 * c);
        k->w[0] = hd.x, k->w[1] = hd.y, k->w[2] = hd.z, k->w[3] = hd.w;
        k->w[4] = q.x, k->w[5] = q.y, k->w[6] = q.z, k->w[7] = q.w;
        if constexpr (T == GGML_Q5_K) {
            const uint4 qh = ld_stream16(B + 16 + 16 * h);
            k->w[8] = qh.x, k->w[9] = qh.y, k->w[10] = qh.z, k->w[11] = qh.w;
        }
    }
}

// The chunk's two sub-groups: quants lo[4], hi[4] (4 per word, unsigned, < 64 or < 32), the
// weights y = a q - m, and dg: x's block of hi's sub-group minus lo's
template <uint32_t T>
__device__ static inline void kchunk_decode(const kchunk<T> &k, int c, uint32_t *lo, uint32_t *hi, float *a,
                                            float *m, int *dg) {
    if constexpr (T == GGML_Q6_K) {
        const int kk = c / 2 % 2;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo[i] = (k.w[i] & 0x0F0F0F0Fu) | (k.w[4 + i] >> (2 * kk) & 0x03030303u) << 4;
            hi[i] = (k.w[i] >> 4 & 0x0F0F0F0Fu) | (k.w[4 + i] >> (2 * kk + 4) & 0x03030303u) << 4;
        }
        const float d = f16_to_f32(k.w[10]);
        a[0] = d * (float)(int32_t)k.w[8], a[1] = d * (float)(int32_t)k.w[9];
        m[0] = 32.0f * a[0], m[1] = 32.0f * a[1];   // d sc (q - 32)
        *dg = 2;
    } else {
        // scales and mins of sub-blocks 2p, 2p + 1 (dq_k4_scale_min) as byte pairs: for j < 4
        // scale bytes j and mins j + 4 (6 bits); for j >= 4 the low 4 bits from byte j + 4,
        // the top 2 from bits 6-7 of byte j - 4 (scale) or byte j (min)
        const int p = c / 2, sh = 16 * (p % 2);
        const uint32_t w0 = k.w[1] >> sh, w1 = k.w[2] >> sh, w2 = k.w[3] >> sh;
        const uint32_t sc = p < 2 ? w0 & 0x3F3Fu : (w2 & 0x0F0Fu) | (w0 & 0xC0C0u) >> 2;
        const uint32_t mn = p < 2 ? w1 & 0x3F3Fu : (w2 >> 4 & 0x0F0Fu) | (w1 & 0xC0C0u) >> 2;
        const float d = f16_to_f32(k.w[0] & 0xFFFF), dmin = f16_to_f32(k.w[0] >> 16);
        a[0] = d * (float)(sc & 0xFF), a[1] = d * (float)(sc >> 8 & 0xFF);
        m[0] = dmin * (float)(mn & 0xFF), m[1] = dmin * (float)(mn >> 8 & 0xFF);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            lo[i] = k.w[4 + i] & 0x0F0F0F0Fu, hi[i] = k.w[4 + i] >> 4 & 0x0F0F0F0Fu;
            if constexpr (T == GGML_Q5_K)   // bit 4 of element l of sub-block j: bit j of qh[l]
                lo[i] |= (k.w[8 + i] >> (2 * p) & 0x01010101u) << 4,
                hi[i] |= (k.w[8 + i] >> (2 * p + 1) & 0x01010101u) << 4;
        }
        *dg = 1;
    }
}

template <uint32_t T, int NV>
__global__ void __launch_bounds__(QW * 32, NV == 1 && T == GGML_Q4_K ? 8 : NV == 8 ? 4 : 1)   // <= 64, <= 128 registers
qgemv_k_kernel(bf16 *out, const int8_t *xq, const float4 *xs, const uint8_t *w, size_t row_bytes,
               int in, int o) {
    static_assert(T == GGML_Q4_K || T == GGML_Q5_K || T == GGML_Q6_K, "K-quant blocks of 256");
    const int lane = threadIdx.x % 32, r = blockIdx.x * QW + threadIdx.x / 32;
    if (r >= o) return;
    const int c = lane % 8, h = c % 2;   // chunk, half of its x blocks
    // x's block of the chunk's low sub-group within a weight block: Q4_K/Q5_K sub-block 2p,
    // Q6_K half * 4 + k
    const int g_lo = T == GGML_Q6_K ? c / 4 * 4 + c / 2 % 2 : c / 2 * 2;
    const uint8_t *row = w + (size_t)r * row_bytes;
    const int nb = in / 256, ng = in / 32;
    // warp steps (4 blocks each) whose loads are issued together: 4 for one row of x (a 4096-wide
    // row in one round trip); fewer for more rows, whose x loads and products take the registers
    // and the time (ptxas for sm_90 gave 193 registers to 8 rows at 4 steps)
    constexpr int KU = NV == 1 ? 4 : NV == 2 ? 2 : 1;
    float acc[NV];
#pragma unroll
    for (int v = 0; v < NV; v++) acc[v] = 0;
    for (int b0 = lane / 8; b0 < nb; b0 += 4 * KU) {
        kchunk<T> k[KU];
#pragma unroll
        for (int u = 0; u < KU; u++) {   // every load of the KU steps first
            const int b = b0 + 4 * u;
            if (b < nb) kchunk_load<T>(row + (size_t)b * kchunk<T>::bytes, c, &k[u]);
        }
#pragma unroll
        for (int u = 0; u < KU; u++) {
            const int b = b0 + 4 * u;
            if (b >= nb) continue;
            uint32_t lo[4], hi[4];
            float a[2], m[2];
            int dg;
            kchunk_decode<T>(k[u], c, lo, hi, a, m, &dg);
            const int g = 8 * b + g_lo;   // x's block of the low sub-group; g + dg the high's
#pragma unroll
            for (int v = 0; v < NV; v++) {
                const int8_t *xv = xq + (size_t)v * in + (size_t)g * 32 + 16 * h;
                const uint4 x0 = *(const uint4 *)xv, x1 = *(const uint4 *)(xv + 32 * dg);
                // {dx, dx * the sum of this half's xq} of x blocks g and g + dg
                const float2 s0 = ((const float2 *)(xs + (size_t)v * ng + g))[h];
                const float2 s1 = ((const float2 *)(xs + (size_t)v * ng + g + dg))[h];
                const int i0 = dot16(lo, x0), i1 = dot16(hi, x1);
                acc[v] += s0.x * (a[0] * (float)i0) + s1.x * (a[1] * (float)i1) - (m[0] * s0.y + m[1] * s1.y);
            }
        }
    }
#pragma unroll
    for (int v = 0; v < NV; v++) {
        float t = acc[v];
        for (int x = 16; x > 0; x >>= 1) t += __shfl_xor_sync(0xffffffffu, t, x);
        if (lane == 0) out[(size_t)v * o + r] = __float2bfloat16(t);
    }
}

// Q8_0's decode product with a lane per 16 quant bytes (half a 34-byte block) instead of a lane
// per block: 2 lanes per block, 16 blocks per warp step, a warp per row. Blocks of 34 bytes are
// only 2-byte aligned, so the group kernel reads a block as 16 two-byte pairs, each load of the
// warp spread over 32 blocks (1088 bytes, 34 sectors for 64 bytes used). Here a lane reads its 16
// bytes as 4 aligned words and a 2-byte tail, shifted by 0 or 16 bits (q8_half_load), and its
// block's d; each load of the warp spans 16 blocks (544 bytes). At one row of x a lane issues KU =
// 8 steps' loads (a 4096-wide row: 128 blocks) before its first product. grid ceil(o / QW),
// QW * 32 threads.
// The 16 bytes at p (2-byte aligned) as 4 words; reads [p - 2, p + 16) at most (never past p + 16,
// so the last block of a tensor is not overrun)
__device__ static inline void q8_half_load(const uint8_t *p, uint32_t *w) {
    const int off = (int)((uintptr_t)p & 3);   // 0 or 2
    const uint32_t *a = (const uint32_t *)(p - off);
    const uint32_t tail = u16at(p + 14);
    uint32_t u[4];
#pragma unroll
    for (int i = 0; i < 4; i++) u[i] = a[i];
#pragma unroll
    for (int i = 0; i < 3; i++) w[i] = off ? (u[i] >> 16 | u[i + 1] << 16) : u[i];
    w[3] = off ? (u[3] >> 16 | tail << 16) : u[3];
}

template <uint32_t T, int NV>
__global__ void __launch_bounds__(QW * 32, NV == 1 ? 8 : 1)   // one row of x: <= 64 registers
qgemv_q8_kernel(bf16 *out, const int8_t *xq, const float4 *xs, const uint8_t *w, size_t row_bytes,
                int in, int o) {
    static_assert(T == GGML_Q8_0, "Q8_0 blocks");
    const int lane = threadIdx.x % 32, r = blockIdx.x * QW + threadIdx.x / 32;
    if (r >= o) return;
    const int h = lane % 2;   // the block's half: quants 16h .. 16h + 15
    const uint8_t *row = w + (size_t)r * row_bytes;
    const int ng = in / 32;
    constexpr int KU = NV == 1 ? 8 : NV == 2 ? 4 : NV == 4 ? 2 : 1;
    float acc[NV];
#pragma unroll
    for (int v = 0; v < NV; v++) acc[v] = 0;
    for (int g0 = lane / 2; g0 < ng; g0 += 16 * KU) {
        uint32_t q[KU][4], dh[KU];
#pragma unroll
        for (int u = 0; u < KU; u++) {   // every load of the KU steps first
            const int g = g0 + 16 * u;
            if (g < ng) {
                const uint8_t *B = row + (size_t)g * 34;
                q8_half_load(B + 2 + 16 * h, q[u]);
                dh[u] = u16at(B);
            }
        }
#pragma unroll
        for (int u = 0; u < KU; u++) {
            const int g = g0 + 16 * u;
            if (g >= ng) continue;
            const float d = f16_to_f32(dh[u]);
#pragma unroll
            for (int v = 0; v < NV; v++) {
                const uint4 x = *(const uint4 *)(xq + (size_t)v * in + (size_t)g * 32 + 16 * h);
                const float dx = xs[(size_t)v * ng + g].x;   // x's block scale (both halves')
                acc[v] += dx * (d * (float)dot16(q[u], x));
            }
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
// as one 8-byte store (y 8-byte aligned: e % 4 == 0 in rows of a multiple of 32)
__device__ static inline void store4(bf16 *y, const float *q, float a, float b) {
    union { __nv_bfloat162 h[2]; uint2 u; } v;
    v.h[0] = __floats2bfloat162_rn(fmaf(a, q[0], b), fmaf(a, q[1], b));
    v.h[1] = __floats2bfloat162_rn(fmaf(a, q[2], b), fmaf(a, q[3], b));
    *(uint2 *)y = v.u;
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

// 32 bf16 at dst (16-byte aligned) = group g of row dequantised: y = a * q + b from decode32's
// quants and scales, one rounding to fp32 (fmaf) and one to bf16: the values decode4 + store4
// give (the same a, b and q; Q8_0's signed q with b = 0 there is q + 128 with b = -128 a, and
// both fmaf round the exact a q once)
template <uint32_t T> __device__ static inline void dequant32(uint4 *dst, const uint8_t *row, int g) {
    uint32_t qw[8];
    float a[2], b[2];
    decode32<T>(row, g, qw, a, b);
#pragma unroll
    for (int i = 0; i < 4; i++) {   // elements 8i .. 8i + 7: words 2i, 2i + 1, half i / 2
        union { __nv_bfloat162 h[4]; uint4 u; } v;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t word = qw[2 * i + j / 2];
            const int s0 = 16 * (j % 2);
            float q0, q1;
            if (T == GGML_Q8_0) q0 = (float)(int8_t)(word >> s0), q1 = (float)(int8_t)(word >> (s0 + 8));
            else q0 = qf(word >> s0 & 0xFF), q1 = qf(word >> (s0 + 8) & 0xFF);
            v.h[j] = __floats2bfloat162_rn(fmaf(a[i / 2], q0, b[i / 2]), fmaf(a[i / 2], q1, b[i / 2]));
        }
        dst[i] = v.u;
    }
}

// out (n, o) = x (n, in) @ W (o, in)^T for a batch of rows (batched decode, short prefills: QV_ROWS
// < n <= QT_ROWS) without the bf16 copy of W: a block computes a 64 x 64 tile of out (64 rows of
// x, 64 of W) in steps of 256 along in. Each step the block dequantises its 64 rows of W into shared
// memory (dequant32: the values dequant_kernel gives, rounded to bf16 as it rounds them), copies x's
// 64 x 256 bf16 tile beside it (cp.async), and each warp multiplies its 16 rows of x by the 64 of W
// with mma.sync (m16n8k16, fp32 accumulators; ldmatrix fragments as attn_fa2_kernel's Q K^T). The
// weights are read once per 64 rows of x, where the dequantise-then-cuBLASLt path writes and reads
// a bf16 copy of every weight each product. grid (ceil(o / 64), ceil(n / 64)), 128 threads,
// sizeof(qt_smem) dynamic shared memory (67.6 KB: opted in above 48 KB).
#define QT 64         // rows of x and of W per block
#define QT_K 256      // elements of in per step
#define QT_ROWS 256   // up to this many x rows take qgemm_kernel (SIFT_CUDA_QGEMM_ROWS overrides)
struct qt_smem {
    static constexpr int LD = QT_K + 8;   // padded row, bf16 elements (ldmatrix rows conflict-free)
    bf16 x[QT * LD];
    bf16 w[QT * LD];
};

template <uint32_t T>
__global__ void __launch_bounds__(128)
qgemm_kernel(bf16 *out, const bf16 *x, const uint8_t *w, size_t row_bytes, int n, int in, int o) {
    SHARED_DYNAMIC(unsigned char, smem_raw);
    qt_smem &sm = *(qt_smem *)smem_raw;
    constexpr int LD = qt_smem::LD;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, gr = lane / 4, tq = lane % 4;
    const int r0 = blockIdx.x * QT, i0 = blockIdx.y * QT;   // first row of W, of x
    float acc[QT / 8][4];   // out rows i0 + 16 warp + gr (+ 8), columns r0 + 8 nt + 2 tq (+ 1)
#pragma unroll
    for (int nt = 0; nt < QT / 8; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0;
    for (int k0 = 0; k0 < in; k0 += QT_K) {
        // x's tile: 64 rows x 32 chunks of 8 (rows past n and columns past in read as zeros)
        for (int e = tid; e < QT * (QT_K / 8); e += 128) {
            const int r = e / (QT_K / 8), c = e % (QT_K / 8) * 8, i = i0 + r, k = k0 + c;
            const bool ok = i < n && k < in;
            cp_async16(&sm.x[r * LD + c], x + (ok ? (size_t)i * in + k : 0), ok);
        }
        cp_async_commit();
        // W's tile, dequantised: 64 rows x 8 groups of 32, a group per thread and pass (its
        // scales decoded once, not per 4 elements as decode4 would)
        for (int e = tid; e < QT * (QT_K / 32); e += 128) {
            const int r = e / (QT_K / 32), c = e % (QT_K / 32) * 32, k = k0 + c;
            uint4 *dst = (uint4 *)&sm.w[r * LD + c];
            if (r0 + r < o && k < in) {
                dequant32<T>(dst, w + (size_t)(r0 + r) * row_bytes, k / 32);
            } else {   // zeros, by cp.async's zero fill (in the group the wait below covers)
#pragma unroll
                for (int i = 0; i < 4; i++) cp_async16(dst + i, x, false);   // x: 16-byte aligned
            }
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
#pragma unroll 4
        for (int kk = 0; kk < QT_K / 16; kk++) {
            uint32_t af[4];   // x rows 16 warp .. + 15, columns kk 16 .. + 15
            ldsm_x4(af, &sm.x[(warp * 16 + lane % 16) * LD + kk * 16 + lane / 16 * 8]);
#pragma unroll
            for (int n2 = 0; n2 < QT / 16; n2++) {
                uint32_t bf[4];   // W rows n2 16 + 0..7 (bf0, bf1) and + 8..15 (bf2, bf3)
                ldsm_x4(bf, &sm.w[(n2 * 16 + lane % 8 + lane / 16 * 8) * LD + kk * 16 + lane / 8 % 2 * 8]);
                mma16816(acc[2 * n2], af, bf[0], bf[1]);
                mma16816(acc[2 * n2 + 1], af, bf[2], bf[3]);
            }
        }
        __syncthreads();   // the tiles are overwritten next step
    }
#pragma unroll
    for (int nt = 0; nt < QT / 8; nt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int i = i0 + warp * 16 + gr + 8 * e, r = r0 + nt * 8 + 2 * tq;
            if (i >= n) continue;
            if (r < o) out[(size_t)i * o + r] = __float2bfloat16(acc[nt][2 * e]);
            if (r + 1 < o) out[(size_t)i * o + r + 1] = __float2bfloat16(acc[nt][2 * e + 1]);
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

// Which decode kernel takes Q4_K, Q5_K, Q6_K and Q8_0: SIFT_CUDA_QGEMV=chunk (qgemv_k_kernel,
// qgemv_q8_kernel) or group (qgemv_kernel, as every other type), until a device run decides per
// type; read at each product, so gpu_check can A/B them in one process (tunables_edit).
static int k_chunks(void) { return !tunables()->cuda_qgemv_group; }

// kernel K<T, nv> for nv = 8, 4, 2 or 1 rows of x
#define LAUNCH_NV(K)                                                                               \
    do {                                                                                           \
        if (nv == 8) CUDA_LAUNCH((K<T, 8>), grid, QW * 32, 0, c->stream, out, xq, xs, q, rb, in, o); \
        else if (nv == 4) CUDA_LAUNCH((K<T, 4>), grid, QW * 32, 0, c->stream, out, xq, xs, q, rb, in, o); \
        else if (nv == 2) CUDA_LAUNCH((K<T, 2>), grid, QW * 32, 0, c->stream, out, xq, xs, q, rb, in, o); \
        else CUDA_LAUNCH((K<T, 1>), grid, QW * 32, 0, c->stream, out, xq, xs, q, rb, in, o);     \
    } while (0)

template <uint32_t T>
static void gemv(cuda_impl *c, bf16 *out, const int8_t *xq, const float4 *xs, const bk_weight *w,
                 int nv, int in, int o) {
    unsigned grid = cuda_blocks((size_t)o, QW);
    const uint8_t *q = w->q;
    size_t rb = w->row_bytes;
    if constexpr (T == GGML_Q4_K || T == GGML_Q5_K || T == GGML_Q6_K) {
        if (k_chunks()) {
            LAUNCH_NV(qgemv_k_kernel);
            return;
        }
    } else if constexpr (T == GGML_Q8_0) {
        if (k_chunks()) {
            LAUNCH_NV(qgemv_q8_kernel);
            return;
        }
    }
    LAUNCH_NV(qgemv_kernel);
}
#undef LAUNCH_NV

template <uint32_t T>
static void dequant_rows(cuda_impl *c, bf16 *dst, const bk_weight *w, int in, int r0, int nr) {
    size_t quads4 = (size_t)nr * (in / 4);
    CUDA_LAUNCH(dequant_kernel<T>, cuda_blocks(quads4, THREADS), THREADS, 0, c->stream, dst, w->q,
                w->row_bytes, in, r0, nr);
}

template <uint32_t T>
static void gemm_tiles(cuda_impl *c, bf16 *out, const bf16 *x, const bk_weight *w, int n, int in, int o) {
    const size_t smem = sizeof(qt_smem);
    static bool configured;   // opt in to > 48 KiB of dynamic shared memory, once per type
    if (!configured) {
        CUDA_CHECK(cudaFuncSetAttribute(qgemm_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
    dim3 grid((unsigned)((o + QT - 1) / QT), (unsigned)((n + QT - 1) / QT));
    CUDA_LAUNCH(qgemm_kernel<T>, grid, 128, smem, c->stream, out, x, w->q, w->row_bytes, n, in, o);
}

// x rows up to which qgemm_kernel takes a product (more: dequantise + cuBLASLt); 0
// (SIFT_CUDA_QGEMM_ROWS) sends every product past QV_ROWS to the dequantisation (bench/gpu.sh's A/B)
static int tile_rows(void) {
    const int r = tunables()->cuda_qgemm_rows;
    return r >= 0 ? r : QT_ROWS;
}

// Rows per dequantised chunk: what the scratch holds, a multiple of 8 (16-byte aligned output
// columns); SIFT_CUDA_DQ_ROWS overrides it (gpu_check: several chunks on small weights).
static int chunk_rows(int in) {
    const int set = tunables()->cuda_dq_rows;
    int r = set > 0 ? set : (int)(DQ_SCRATCH / (unsigned)in);
    r -= r % 8;
    return r < 8 ? 8 : r;
}

void cuda_qmatmul(cuda_impl *c, void *out, const void *x, const bk_weight *w, int n, int in, int o) {
    CHECK_INTERNAL(in % 32 == 0 && w->q, "quantised product needs blocks and in %% 32 == 0 (in %d)", in);
    bf16 *y = (bf16 *)out;
    const bf16 *xb = (const bf16 *)x;
    if (n <= QV_ROWS) {
        size_t nb = (size_t)n * in / 32;   // x's blocks of 32: 32 int8 + a float4 each
        uint8_t *buf = (uint8_t *)dev_buf_reserve(c, &c->qx, nb * (32 + sizeof(float4)), "a quantised product");
        float4 *xs = (float4 *)buf;
        int8_t *xq = (int8_t *)(buf + nb * sizeof(float4));
        CUDA_LAUNCH(xq8_kernel, cuda_blocks(nb * 32, THREADS), THREADS, 0, c->stream, xq, xs, xb, nb);
        const int ng = in / 32;
        for (int v0 = 0; v0 < n;) {
            int nv = QV_MAX;   // the widest launch the rows left fill: 8, 4, 2, 1
            while (nv > n - v0) nv /= 2;
#define GEMV(T) gemv<T>(c, y + (size_t)v0 * o, xq + (size_t)v0 * in, xs + (size_t)v0 * ng, w, nv, in, o)
            FOR_TYPE(w->qtype, GEMV)
#undef GEMV
            v0 += nv;
        }
        return;
    }
    if (n <= tile_rows()) {
#define TILES(T) gemm_tiles<T>(c, y, xb, w, n, in, o)
        FOR_TYPE(w->qtype, TILES)
#undef TILES
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
