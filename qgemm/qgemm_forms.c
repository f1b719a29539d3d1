// qgemm/qgemm_forms.c — the operands' forms the products read (qgemm.h): an activation row to two
// 8-bit digits per element with one step per 32-block (q_quantize_row: scalar C, and an AVX-512
// twin in the same fp32 operations), or per 256-block for the AVX-512 K-quant kernels
// (quantize_row_k); a weight row of a block type to unsigned 8-bit values with a scale and an
// offset per 16-group (q_unpack_row: the form of the types that have no fused kernel).
#include "../util/check.h"
#include "internal.h"

// ---- activations: 8-bit blocks of 32 ------------------------------------------------------------

static void quantize_row_scalar(const float *x, int cols, int8_t *q, float *d, float *a) {
    int8_t *lo = q + cols;
    for (int b = 0; b < cols; b += 32) {
        float amax = 0;
        for (int i = 0; i < 32; i++) {
            float v = x[b + i] < 0 ? -x[b + i] : x[b + i];
            amax = v > amax ? v : amax;
        }
        float step = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
        int sum[2] = {0, 0};
        for (int i = 0; i < 32; i++) {
            int h = (int)__builtin_lrintf(x[b + i] * inv);   // |h| <= 127 by construction
            h = h > 127 ? 127 : h < -127 ? -127 : h;
            int l = (int)__builtin_lrintf((x[b + i] - (float)h * step) * inv * 256.0f);
            l = l > 127 ? 127 : l < -127 ? -127 : l;          // |l| <= 128 before the clamp
            q[b + i] = (int8_t)h, lo[b + i] = (int8_t)l;
            sum[i / G] += 256 * h + l;
        }
        d[b / 32] = step / 256.0f;
        for (int k = 0; k < 2; k++) a[b / G + k] = d[b / 32] * (float)sum[k];
    }
}

// The two digits of 16 values x at a block's step (vinv = 1 / step, or 0 for a zero block), as
// quantize_row_scalar computes them: h = round(x / step), l = round((x - h step) / step * 256),
// both clamped to +-127, so that x ~ (256 h + l) step / 256.
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline void
two_digits16(__m512 xv, __m512 vstep, __m512 vinv, __m512i *h, __m512i *l) {
    const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
    *h = _mm512_max_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(xv, vinv)), lim), nlim);
    __m512 r = _mm512_sub_ps(xv, _mm512_mul_ps(_mm512_cvtepi32_ps(*h), vstep));
    *l = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_mul_ps(r, vinv), _mm512_set1_ps(256.0f)));
    *l = _mm512_max_epi32(_mm512_min_epi32(*l, lim), nlim);
}

// The same, 16 lanes at a time, in the same fp32 operations (no contraction): bit-identical.
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
quantize_row_avx512(const float *x, int cols, int8_t *q, float *d, float *a) {
    int8_t *lo = q + cols;
    for (int b = 0; b < cols; b += 32) {
        __m512 x0 = _mm512_loadu_ps(x + b), x1 = _mm512_loadu_ps(x + b + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        float step = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
        __m512 vstep = _mm512_set1_ps(step), vinv = _mm512_set1_ps(inv);
        d[b / 32] = step / 256.0f;
        for (int k = 0; k < 2; k++) {
            __m512i h, l;
            two_digits16(k ? x1 : x0, vstep, vinv, &h, &l);
            _mm_storeu_si128((__m128i *)(q + b + 16 * k), _mm512_cvtepi32_epi8(h));
            _mm_storeu_si128((__m128i *)(lo + b + 16 * k), _mm512_cvtepi32_epi8(l));
            int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(h, 8), l));
            a[b / G + k] = d[b / 32] * (float)sum;
        }
    }
}

// The K-quant kernels' form of one row (cols % 256 == 0; q_act's K form): per 256-block step
// d = max|x| / 127 and quantize_row_avx512's two digits; q6 (2 cols): high digits then low, in
// element order; q4 (2 cols): the same with the middle two 32-chunks of every 128 swapped (Q4_K's
// nibble order); kd (cols/256) = d / 256; s32 (cols/32), s16 (cols/16) = kd * sums of 256 q + l.
// digits 1: the low digits zero (llama.cpp's Q8_K rounding, |x - x^| <= d / 2).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void
quantize_row_k(const float *x, int cols, int digits, int8_t *q6, int8_t *q4, float *kd, float *s32,
               float *s16) {
    static const int chunk[4] = {0, 64, 32, 96};   // where 32-chunk c of a 128 goes in Q4_K's order
    for (int b = 0; b < cols; b += 256) {
        __m512 mx = _mm512_setzero_ps();
        for (int k = 0; k < 256; k += 16) mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(x + b + k)));
        float amax = _mm512_reduce_max_ps(mx);
        float step = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
        __m512 vstep = _mm512_set1_ps(step), vinv = _mm512_set1_ps(inv);
        kd[b / 256] = step / 256.0f;
        int pair = 0;
        for (int k = 0; k < 256; k += 16) {
            __m512i h, l;
            two_digits16(_mm512_loadu_ps(x + b + k), vstep, vinv, &h, &l);
            if (digits == 1) l = _mm512_setzero_si512();   // the high digit alone: x^ = q d
            __m128i h8 = _mm512_cvtepi32_epi8(h), l8 = _mm512_cvtepi32_epi8(l);
            int at = b + (k / 128) * 128 + chunk[(k % 128) / 32] + k % 32;
            _mm_storeu_si128((__m128i *)(q6 + b + k), h8);
            _mm_storeu_si128((__m128i *)(q6 + cols + b + k), l8);
            _mm_storeu_si128((__m128i *)(q4 + at), h8);
            _mm_storeu_si128((__m128i *)(q4 + cols + at), l8);
            int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_slli_epi32(h, 8), l));
            s16[(b + k) / 16] = kd[b / 256] * (float)sum;
            if (k % 32 == 0) pair = sum;
            else s32[(b + k) / 32] = kd[b / 256] * (float)(pair + sum);
        }
    }
}

void q_quantize_row(enum q_isa isa, const float *x, int cols, int8_t *q, float *d, float *a) {
    if (isa == Q_ISA_AVX512) quantize_row_avx512(x, cols, q, d, a);
    else quantize_row_scalar(x, cols, q, d, a);
}

// ---- weights: blocks -> (u, s, m) per 16-element group -------------------------------------------

// 32 nibbles of qs[16] (low nibbles = elements 0..15, high = 16..31), with 5th bits from qh.
static void nibbles32(const uint8_t *qs, const uint8_t *qh4, uint8_t *u) {
    uint32_t qh = 0;
    if (qh4) memcpy(&qh, qh4, 4);
    for (int j = 0; j < 16; j++) {
        u[j] = (uint8_t)((qs[j] & 0xF) | ((qh >> j) & 1) << 4);
        u[j + 16] = (uint8_t)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
    }
}

// One row of `cols` elements of a quantised type -> u (cols,), s and m (cols/16,).
void q_unpack_row(uint32_t type, const void *row, int cols, uint8_t *u, float *s, float *m) {
    const uint8_t *b = row;
    switch (type) {
    case GGML_Q4_0: case GGML_Q4_1: case GGML_Q5_0: case GGML_Q5_1: case GGML_Q8_0: {
        for (int i = 0; i < cols; i += 32, u += 32, s += 2, m += 2) {
            float d = f16(b), off;
            if (type == GGML_Q4_0) nibbles32(b + 2, NULL, u), off = -8 * d, b += 18;
            else if (type == GGML_Q4_1) nibbles32(b + 4, NULL, u), off = f16(b + 2), b += 20;
            else if (type == GGML_Q5_0) nibbles32(b + 6, b + 2, u), off = -16 * d, b += 22;
            else if (type == GGML_Q5_1) nibbles32(b + 8, b + 4, u), off = f16(b + 2), b += 24;
            else {
                for (int j = 0; j < 32; j++) u[j] = b[2 + j] ^ 0x80;   // q + 128
                off = -128 * d, b += 34;
            }
            s[0] = s[1] = d;
            m[0] = m[1] = off;
        }
        return;
    }
    case GGML_Q4_K: case GGML_Q5_K:   // sub-blocks j, j+1: the low, high nibbles of 32 bytes
        for (int i = 0; i < cols; i += 256) {
            const int q5 = type == GGML_Q5_K;
            const float d = f16(b), dmin = f16(b + 2);
            uint64_t sc8, mn8;
            k_scales8(b + 4, &sc8, &mn8);
            float sc[8], mn[8];
            _mm256_storeu_ps(sc, _mm256_mul_ps(_mm256_set1_ps(d), u8x8_to_ps(sc8)));
            _mm256_storeu_ps(mn, _mm256_mul_ps(_mm256_set1_ps(-dmin), u8x8_to_ps(mn8)));
            const __m256i lo4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
            const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
            const uint8_t *qs = b + (q5 ? 48 : 16);
            for (int j = 0; j < 8; j += 2, u += 64, s += 4, m += 4) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 16 * j));
                const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(qh, j), one),
                              h1 = _mm256_and_si256(_mm256_srli_epi16(qh, j + 1), one);
                _mm256_storeu_si256((__m256i *)u, _mm256_or_si256(_mm256_and_si256(q, lo4), _mm256_slli_epi16(h0, 4)));
                _mm256_storeu_si256((__m256i *)(u + 32), _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), lo4),
                                                                         _mm256_slli_epi16(h1, 4)));
                s[0] = s[1] = sc[j], s[2] = s[3] = sc[j + 1];
                m[0] = m[1] = mn[j], m[2] = m[3] = mn[j + 1];
            }
            b += q5 ? 176 : 144;
        }
        return;
    case GGML_Q6_K:
        for (int i = 0; i < cols; i += 256, b += 210) {
            const float d = f16(b + 208);
            const int8_t *sc = (const int8_t *)(b + 192);
            for (int half = 0; half < 2; half++) {
                const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
                const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql),
                              l1 = _mm256_loadu_si256((const __m256i *)(ql + 32)),
                              hb = _mm256_loadu_si256((const __m256i *)qh);
                for (int k = 0; k < 4; k++)
                    _mm256_storeu_si256((__m256i *)(u + 128 * half + 32 * k), q6k_u32(l0, l1, hb, k));
            }
            for (int g = 0; g < 16; g++) {
                s[g] = d * (float)sc[g];
                m[g] = -32.0f * s[g];
            }
            u += 256, s += 16, m += 16;
        }
        return;
    default:
        CHECK_INTERNAL(0, "q_unpack_row: type %u has no 8-bit form", type);
    }
}
