// qgemm/internal.h — what the CPU product files of this room share (included by them only, never
// outside qgemm/): the kernels' types and tables, the activation rows they read, and small pieces
// of blocks that several kernels decode alike, on AVX2 + F16C (x86-64-v3, the build's floor; the
// AVX-512 code takes target attributes, as AVX512 below, so one build runs on either CPU).
//   qgemm_cpu.c     the ISA choice and the drivers: x quantised once, weight rows to the kernels
//   qgemm_forms.c   the activations' two digits (and the K form) and the weights' 8-bit form
//   qgemm_scalar.c  the portable products (SIFT_ISA=scalar; dot_q8_avx512's last 32 columns)
//   qgemm_avx2.c    AVX2 products: an unpacked row, F16/BF16 rows, the fused block kernels
//   qgemm_avx512.c  AVX-512 VNNI products: the same, K-quants with integer sub-block scales
//   qgemm_strip.c   AVX-512 Q4_K products 16 weight rows at a time, and their forms
//   qgemm_vnni.c, qgemm_amx.c: the prefill GEMMs (qgemm.h)
#pragma once
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "../weights/gguf.h"
#include "qgemm.h"

#define G 16            // elements per scale group
#define PREFETCH 4096   // bytes ahead in the weight stream (bench/RESULTS.md: 2048-8192 within noise)
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,fma")))

// One activation row as a kernel reads it: high digits q, low digits ql, steps d, sums a (per
// 32-block: the group sums then the block sums; the K form: its own, qgemm_cpu.c's q_act).
typedef struct {
    const int8_t *q, *ql;
    const float *d, *a;
} act_row;
// The same with the digits joined, x = 256 q + l in the AVX2 kernels' order (qgemm_avx2.c)
typedef struct {
    const int16_t *x;
    const float *d, *a;
} act16_row;

// The products' types. sum_g s_g d_g (u . q)_g + sum_g m_g a_g on an unpacked row (a = the
// activation's scaled group sums):
typedef float dot_q8_fn(const uint8_t *u, const float *s, const float *m, const int8_t *q, const int8_t *ql,
                        const float *d, const float *a, int cols);
// the same straight from a row of blocks (the fused kernels of one type); a: the activation row's
// cols/16 group sums followed by its cols/32 block sums
typedef float dot_blk_fn(const uint8_t *row, const int8_t *q, const int8_t *ql, const float *d, const float *a,
                         int cols);
// the same on the two digits joined, x16 = 256 q + l (the AVX2 kernels)
typedef float dot16_fn(const uint8_t *row, const int16_t *x16, const float *d, const float *a, int cols);
// four activation rows at once, out[r] bit-identical to the one-row kernel's (AVX-512, AVX2)
typedef void dot4_fn(const uint8_t *row, const act_row *x, int cols, float *out);
typedef void dot16x4_fn(const uint8_t *row, const act16_row *x, int cols, float *out);
// R <= 4 activation rows x 16 weight rows (row_bytes apart) -> out[t * stride + r] (qgemm_strip.c)
typedef void strip_fn(int R, const uint8_t *w, size_t row_bytes, const act_row *x, int cols, float *out,
                      size_t stride);
// w (cols,) of F16 or BF16 . x (cols,) fp32
typedef float dot_f16_fn(const uint16_t *w, int bf16, const float *x, int cols);

// The unpacked-row and F16/BF16 products of each ISA (qgemm_scalar.c, _avx2.c, _avx512.c)
dot_q8_fn dot_q8_scalar, dot_q8_avx2, dot_q8_avx512;
dot_f16_fn dot_f16_scalar, dot_f16_avx2, dot_f16_avx512;
// The fused kernels of a type on an ISA, or NULL (none: the type's rows are unpacked first).
// digits 1: the K-quant kernels skip the low digits' products; the 32-block kernels read them, zero.
dot_blk_fn *fused_dot(enum q_isa isa, uint32_t type, int digits);     // AVX-512, one row
dot4_fn *fused_dot4(enum q_isa isa, uint32_t type, int digits);       // AVX-512, four rows
strip_fn *fused_strip(enum q_isa isa, uint32_t type, int digits);     // AVX-512 Q4_K, 16 rows
dot16_fn *fused16_dot(enum q_isa isa, uint32_t type);                 // AVX2, one row
dot16x4_fn *fused16_dot4(enum q_isa isa, uint32_t type);              // AVX2, four rows
// The K-quant kernels' activation form of one row (qgemm_forms.c)
void quantize_row_k(const float *x, int cols, int digits, int8_t *q6, int8_t *q4, float *kd, float *s32,
                    float *s16);

// The 6-bit scales and mins of a Q4_K / Q5_K super-block as two 8-byte vectors (dq_k4_scale_min's
// rule on 32-bit words: bytes 0-3 hold sc0-3 and the top bits of sc4-7, 4-7 m0-3 and the top
// bits of m4-7, 8-11 the low nibbles of sc4-7 | m4-7).
static inline void k_scales8(const uint8_t *s, uint64_t *sc, uint64_t *mn) {
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4), memcpy(&w1, s + 4, 4), memcpy(&w2, s + 8, 4);
    uint32_t sc_lo = w0 & 0x3f3f3f3fu, m_lo = w1 & 0x3f3f3f3fu;
    uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4;
    uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u) << 4;
    *sc = sc_lo | (uint64_t)sc_hi << 32;
    *mn = m_lo | (uint64_t)m_hi << 32;
}

// 8 unsigned bytes -> 8 floats
static inline __m256 u8x8_to_ps(uint64_t v) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)v)));
}

// The 6-bit values of elements 32k .. 32k+31 (k = 0..3) of one half (128 elements) of a Q6_K
// super-block, from the half's ql bytes l0 = ql[0..32), l1 = ql[32..64) and qh bytes hb: the low
// nibbles of l0 / l1 (k = 0, 1) or their high nibbles (k = 2, 3), with bits 2k, 2k+1 of hb on top.
static inline __m256i q6k_u32(__m256i l0, __m256i l1, __m256i hb, int k) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F), lo2 = _mm256_set1_epi8(0x03);
    __m256i lo = k % 2 ? l1 : l0;
    if (k >= 2) lo = _mm256_srli_epi16(lo, 4);
    return _mm256_or_si256(_mm256_and_si256(lo, lo4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * k), lo2), 4));
}

static inline float f16(const uint8_t *p) {   // F16C (x86-64-v3 has it): exact, as dq_f16_to_f32
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

static inline uint16_t ld16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

// 8 f16 fields at p, p + stride, ... -> 8 floats
static inline __m256 f16x8(const uint8_t *p, int stride) {   // AVX2 + F16C: both kernel sets
    return _mm256_cvtph_ps(_mm_set_epi16((short)ld16(p + 7 * stride), (short)ld16(p + 6 * stride),
                                         (short)ld16(p + 5 * stride), (short)ld16(p + 4 * stride),
                                         (short)ld16(p + 3 * stride), (short)ld16(p + 2 * stride),
                                         (short)ld16(p + stride), (short)ld16(p)));
}

// A Q4_K super-block's head, every row kernel's step: its lines PREFETCH ahead on their way, d,
// dmin, and the 8 six-bit scales and mins (k_scales8)
static inline __attribute__((always_inline)) void q4k_head(const uint8_t *b, float *dd, float *dmin, uint64_t *sc,
                                                            uint64_t *mn) {
    _mm_prefetch((const char *)b + PREFETCH, _MM_HINT_T0);
    _mm_prefetch((const char *)b + PREFETCH + 64, _MM_HINT_T0);
    _mm_prefetch((const char *)b + PREFETCH + 128, _MM_HINT_T0);
    *dd = f16(b), *dmin = f16(b + 2);
    k_scales8(b + 4, sc, mn);
}

// Eight 32-blocks of Q4_0 / Q4_1 / Q8_0 at b (bb bytes each), the head of every kernel's step:
// the lines PREFETCH ahead on their way, the blocks' d (dw) and offsets m (mw: Q4_1's own, else
// -8 d or -128 d) as floats
static inline __attribute__((always_inline)) void blk32_head8(uint32_t type, const uint8_t *b, int bb,
                                                               __m256 *dw, __m256 *mw) {
    _mm_prefetch((const char *)b + PREFETCH, _MM_HINT_T0);
    _mm_prefetch((const char *)b + PREFETCH + 64, _MM_HINT_T0);
    _mm_prefetch((const char *)b + PREFETCH + 128, _MM_HINT_T0);
    if (bb > 20) _mm_prefetch((const char *)b + PREFETCH + 192, _MM_HINT_T0);
    *dw = f16x8(b, bb);
    *mw = type == GGML_Q4_1 ? f16x8(b + 2, bb) : _mm256_mul_ps(*dw, _mm256_set1_ps(type == GGML_Q4_0 ? -8.0f : -128.0f));
}
