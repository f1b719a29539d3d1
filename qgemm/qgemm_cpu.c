// qgemm/qgemm_cpu.c — products on GGUF-encoded weight rows (see qgemm.h for the method and its
// error bound). Three ISA paths for the inner products, picked at run time; the unpacking of
// blocks to (u, s, m) is portable C shared by all of them.
#include "qgemm.h"

#include <cblas.h>
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "../util/check.h"
#include "../weights/dequant.h"
#include "../weights/gguf.h"
#include "kblock.h"

#define G 16   // elements per scale group

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

enum q_isa q_isa_pick(const char **err) {
    enum q_isa best = cpu_best_isa();
    const char *env = getenv("SIFT_ISA");
    if (err) *err = NULL;
    if (!env || !*env) return best;
    enum q_isa want;
    if (strcmp(env, "scalar") == 0) want = Q_ISA_SCALAR;
    else if (strcmp(env, "avx2") == 0) want = Q_ISA_AVX2;
    else if (strcmp(env, "avx512") == 0) want = Q_ISA_AVX512;
    else {
        if (err) *err = "SIFT_ISA must be scalar, avx2 or avx512";
        return best;
    }
    return want < best ? want : best;
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

static int is_float16(uint32_t type) { return type == GGML_F16 || type == GGML_BF16; }

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
__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
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

static inline float f16(const uint8_t *p) {   // F16C (x86-64-v3 has it): exact, as dq_f16_to_f32
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

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
static void unpack_row(uint32_t type, const uint8_t *b, int cols, uint8_t *u, float *s, float *m) {
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
        CHECK_INTERNAL(0, "unpack_row: type %u has no 8-bit form", type);
    }
}

void q_unpack_row(uint32_t type, const void *row, int cols, uint8_t *u, float *s, float *m) {
    unpack_row(type, row, cols, u, s, m);
}

// ---- inner products: one unpacked weight row . one quantised activation row ------------------

// sum_g s_g d_g (u . q)_g + sum_g m_g a_g   (a = the activation's scaled group sums)
typedef float (*dot_q8_fn)(const uint8_t *u, const float *s, const float *m, const int8_t *q,
                           const int8_t *ql, const float *d, const float *a, int cols);
// the same straight from a row of blocks (the fused kernels of one type); a: the activation row's
// cols/16 group sums followed by its cols/32 block sums
// the same on the two digits joined, x16 = 256 q + l (the AVX2 kernels)
typedef float (*dot16_fn)(const uint8_t *row, const int16_t *x16, const float *d, const float *a,
                          int cols);
typedef float (*dot_blk_fn)(const uint8_t *row, const int8_t *q, const int8_t *ql, const float *d,
                            const float *a, int cols);
// w (cols,) of F16 or BF16 . x (cols,) fp32
typedef float (*dot_f16_fn)(const uint16_t *w, int bf16, const float *x, int cols);

static float dot_q8_scalar(const uint8_t *u, const float *s, const float *m, const int8_t *q,
                           const int8_t *ql, const float *d, const float *a, int cols) {
    float acc = 0;
    for (int g = 0; g < cols / G; g++) {
        int32_t p = 0;
        for (int i = 0; i < G; i++)
            p += (int32_t)u[g * G + i] * (256 * q[g * G + i] + ql[g * G + i]);
        acc += s[g] * d[g / 2] * (float)p + m[g] * a[g];
    }
    return acc;
}

static float dot_f16_scalar(const uint16_t *w, int bf16, const float *x, int cols) {
    float acc = 0;
    for (int i = 0; i < cols; i++) acc += (bf16 ? dq_bf16_to_f32(w[i]) : dq_f16_to_f32(w[i])) * x[i];
    return acc;
}

static float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// one 16-group per step: u (u8 -> i16) * q (i8 -> i16), vpmaddwd pairs -> 8 x i32
__attribute__((target("avx2,fma"))) static float
dot_q8_avx2(const uint8_t *u, const float *s, const float *m, const int8_t *q, const int8_t *ql,
            const float *d, const float *a, int cols) {
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    int ng = cols / G, g = 0;
    for (; g < ng; g++) {
        __m256i uu = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(u + g * G)));
        __m256i qq = _mm256_add_epi16(
            _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + g * G))), 8),
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(ql + g * G))));
        __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(uu, qq));
        acc = _mm256_fmadd_ps(p, _mm256_set1_ps(s[g] * d[g / 2]), acc);
    }
    for (g = 0; g + 8 <= ng; g += 8)
        accm = _mm256_fmadd_ps(_mm256_loadu_ps(m + g), _mm256_loadu_ps(a + g), accm);
    float tail = 0;
    for (; g < ng; g++) tail += m[g] * a[g];
    return hsum256(acc) + hsum256(accm) + tail;
}

__attribute__((target("avx2,fma,f16c"))) static float
dot_f16_avx2(const uint16_t *w, int bf16, const float *x, int cols) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= cols; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(w + i));
        __m256 wf = bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                         : _mm256_cvtph_ps(h);
        acc = _mm256_fmadd_ps(wf, _mm256_loadu_ps(x + i), acc);
    }
    float tail = 0;
    for (; i < cols; i++) tail += (bf16 ? dq_bf16_to_f32(w[i]) : dq_f16_to_f32(w[i])) * x[i];
    return hsum256(acc) + tail;
}

#define PREFETCH 4096   // bytes ahead in the weight stream (bench/RESULTS.md: 2048-8192 within noise)
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,fma")))

// u (64 x u8) . (256 q + ql) per 4-byte lane, exact in int32 (|256 q + ql| <= 32639)
AVX512 static inline __m512i dot2(__m512i u, const int8_t *q, const int8_t *ql) {
    __m512i hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_loadu_si512(q));
    __m512i lo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, _mm512_loadu_si512(ql));
    return _mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo);
}

AVX512 static inline __m256i dot2_256(__m256i u, const int8_t *q, const int8_t *ql) {
    __m256i hi = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, _mm256_loadu_si256((const __m256i *)q));
    __m256i lo = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, _mm256_loadu_si256((const __m256i *)ql));
    return _mm256_add_epi32(_mm256_slli_epi32(hi, 8), lo);
}

// four 16-groups per step: vpdpbusd gives 16 x i32, lanes 4k..4k+3 belong to group k; each
// lane is scaled by its group's s_g d_g (permuted from 4 floats) and accumulated in fp32
AVX512 static float
dot_q8_avx512(const uint8_t *u, const float *s, const float *m, const int8_t *q, const int8_t *ql,
              const float *d, const float *a, int cols) {
    const __m512i lane_group = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512 acc = _mm512_setzero_ps(), accm = _mm512_setzero_ps();
    int i = 0;
    for (; i + 64 <= cols; i += 64) {
        __m512i p = dot2(_mm512_loadu_si512(u + i), q + i, ql + i);
        const float *dd = d + i / 32;
        __m128 sd = _mm_mul_ps(_mm_loadu_ps(s + i / G), _mm_set_ps(dd[1], dd[1], dd[0], dd[0]));
        __m512 lanes = _mm512_permutexvar_ps(lane_group, _mm512_castps128_ps512(sd));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), lanes, acc);
    }
    float tail = 0;   // a last 32 columns: both terms of their groups, scalar
    if (i < cols) tail = dot_q8_scalar(u + i, s + i / G, m + i / G, q + i, ql + i, d + i / 32,
                                       a + i / G, cols - i);
    int ng = i / G, g = 0;
    for (; g + 16 <= ng; g += 16)
        accm = _mm512_fmadd_ps(_mm512_loadu_ps(m + g), _mm512_loadu_ps(a + g), accm);
    for (; g < ng; g++) tail += m[g] * a[g];
    return _mm512_reduce_add_ps(acc) + _mm512_reduce_add_ps(accm) + tail;
}

__attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c"))) static float
dot_f16_avx512(const uint16_t *w, int bf16, const float *x, int cols) {
    __m512 acc = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= cols; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(w + i));
        __m512 wf = bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
                         : _mm512_cvtph_ps(h);
        acc = _mm512_fmadd_ps(wf, _mm512_loadu_ps(x + i), acc);
    }
    float tail = 0;
    for (; i < cols; i++) tail += (bf16 ? dq_bf16_to_f32(w[i]) : dq_f16_to_f32(w[i])) * x[i];
    return _mm512_reduce_add_ps(acc) + tail;
}


// ---- fused AVX-512 kernels: blocks read directly, 64 elements per vpdpbusd --------------------


// 32 bytes of nibbles -> 64 u8: the low nibbles (elements 0..31), then the high ones (32..63)
AVX512 static inline __m512i nibbles64(__m256i v) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    __m256i lo = _mm256_and_si256(v, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// 16 bytes of a 32-element block's nibbles -> 32 u8 (low nibbles = elements 0..15)
AVX512 static inline __m256i nibbles32_v(const uint8_t *qs) {
    const __m128i lo4 = _mm_set1_epi8(0x0F);
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), lo4), _mm_and_si128(v, lo4));
}

// lane picks: 8 lanes of scale 2p, then 8 of scale 2p+1 (p = 0..3)
#define PICK_PAIRS                                                                     \
    {_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),                 \
     _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2),                 \
     _mm512_set_epi32(5, 5, 5, 5, 5, 5, 5, 5, 4, 4, 4, 4, 4, 4, 4, 4),                 \
     _mm512_set_epi32(7, 7, 7, 7, 7, 7, 7, 7, 6, 6, 6, 6, 6, 6, 6, 6)}

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

// The 32 u8 of one 32-element block of Q4_0 / Q4_1 / Q8_0 at b.
AVX512 static inline __m256i block32_u(uint32_t type, const uint8_t *b) {
    if (type == GGML_Q4_0) return nibbles32_v(b + 2);
    if (type == GGML_Q4_1) return nibbles32_v(b + 4);
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), _mm256_set1_epi8((char)0x80));
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

// Q4_0 / Q4_1 / Q8_0 (w = d u + m, m = -8 d | the block's m | -128 d): eight 32-blocks per step,
// their d as one vector, lanes scaled per block; the m terms as a vector FMA with the activation's
// 32-block sums; single blocks at the end.
AVX512 static inline __attribute__((always_inline)) float
dot_blk32_avx512(uint32_t type, const uint8_t *b, const int8_t *q, const int8_t *ql,
                 const float *d, const float *a, int cols) {
    const int bb = type == GGML_Q4_0 ? 18 : type == GGML_Q4_1 ? 20 : 34;
    const float *a32 = a + cols / G;   // the 32-block sums after the row's group sums
    const __m512i pick[4] = PICK_PAIRS;
    __m512 acc = _mm512_setzero_ps();
    __m256 accm = _mm256_setzero_ps();
    int i = 0;
    for (; i + 256 <= cols; i += 256, b += 8 * bb) {
        __m256 dw, mw;
        blk32_head8(type, b, bb, &dw, &mw);
        accm = _mm256_fmadd_ps(mw, _mm256_loadu_ps(a32 + i / 32), accm);
        __m512 ws = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_loadu_ps(d + i / 32)));
        for (int p = 0; p < 4; p++) {
            const uint8_t *b0 = b + 2 * p * bb;
            __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(block32_u(type, b0)),
                                           block32_u(type, b0 + bb), 1);
            __m512i s = dot2(u, q + i + 64 * p, ql + i + 64 * p);
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(pick[p], ws), acc);
        }
    }
    float tail = 0;
    for (; i < cols; i += 32, b += bb) {
        __m256i s = dot2_256(block32_u(type, b), q + i, ql + i);
        float d0 = f16(b), m0 = type == GGML_Q4_1 ? f16(b + 2) : type == GGML_Q4_0 ? -8 * d0 : -128 * d0;
        acc = _mm512_add_ps(acc, _mm512_zextps256_ps512(_mm256_mul_ps(
                                     _mm256_cvtepi32_ps(s), _mm256_set1_ps(d0 * d[i / 32]))));
        tail += m0 * a32[i / 32];
    }
    return _mm512_reduce_add_ps(acc) + hsum256(accm) + tail;
}

// dot_blk32_avx512 for FOUR activation rows at once (a batched decode step): the weight blocks
// are read, their scales converted and their nibbles unpacked once, then dotted with each row.
// Every row's arithmetic is dot_blk32_avx512's, in the same order, so each out[r] is bit-identical
// to the one-row kernel's result.
typedef struct {
    const int8_t *q, *ql;
    const float *d, *a;
} act_row;

AVX512 static inline __attribute__((always_inline)) void
dot4_blk32_avx512(uint32_t type, const uint8_t *b, const act_row *x, int cols, float *out) {
    const int bb = type == GGML_Q4_0 ? 18 : type == GGML_Q4_1 ? 20 : 34;
    const __m512i pick[4] = PICK_PAIRS;
    __m512 acc[4];
    __m256 accm[4];
    for (int r = 0; r < 4; r++) acc[r] = _mm512_setzero_ps(), accm[r] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 256 <= cols; i += 256, b += 8 * bb) {
        __m256 dw, mw;
        blk32_head8(type, b, bb, &dw, &mw);
        __m512 ws[4];
        for (int r = 0; r < 4; r++) {
            const float *a32 = x[r].a + cols / G;
            accm[r] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(a32 + i / 32), accm[r]);
            ws[r] = _mm512_castps256_ps512(_mm256_mul_ps(dw, _mm256_loadu_ps(x[r].d + i / 32)));
        }
        for (int p = 0; p < 4; p++) {
            const uint8_t *b0 = b + 2 * p * bb;
            __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(block32_u(type, b0)),
                                           block32_u(type, b0 + bb), 1);
            for (int r = 0; r < 4; r++) {
                __m512i sv = dot2(u, x[r].q + i + 64 * p, x[r].ql + i + 64 * p);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sv), _mm512_permutexvar_ps(pick[p], ws[r]), acc[r]);
            }
        }
    }
    float tail[4] = {0, 0, 0, 0};
    for (; i < cols; i += 32, b += bb) {
        __m256i u = block32_u(type, b);
        float d0 = f16(b), m0 = type == GGML_Q4_1 ? f16(b + 2) : type == GGML_Q4_0 ? -8 * d0 : -128 * d0;
        for (int r = 0; r < 4; r++) {
            __m256i sv = dot2_256(u, x[r].q + i, x[r].ql + i);
            acc[r] = _mm512_add_ps(acc[r], _mm512_zextps256_ps512(_mm256_mul_ps(
                                           _mm256_cvtepi32_ps(sv), _mm256_set1_ps(d0 * x[r].d[i / 32]))));
            tail[r] += m0 * (x[r].a + cols / G)[i / 32];
        }
    }
    for (int r = 0; r < 4; r++) out[r] = _mm512_reduce_add_ps(acc[r]) + hsum256(accm[r]) + tail[r];
}

typedef void (*dot4_fn)(const uint8_t *row, const act_row *x, int cols, float *out);

AVX512 static void dot4_q4_0_avx512(const uint8_t *b, const act_row *x, int cols, float *out) {
    dot4_blk32_avx512(GGML_Q4_0, b, x, cols, out);
}
AVX512 static void dot4_q4_1_avx512(const uint8_t *b, const act_row *x, int cols, float *out) {
    dot4_blk32_avx512(GGML_Q4_1, b, x, cols, out);
}
AVX512 static void dot4_q8_0_avx512(const uint8_t *b, const act_row *x, int cols, float *out) {
    dot4_blk32_avx512(GGML_Q8_0, b, x, cols, out);
}

AVX512 static float dot_q4_0_avx512(const uint8_t *b, const int8_t *q, const int8_t *ql,
                                    const float *d, const float *a, int cols) {
    return dot_blk32_avx512(GGML_Q4_0, b, q, ql, d, a, cols);
}

AVX512 static float dot_q4_1_avx512(const uint8_t *b, const int8_t *q, const int8_t *ql,
                                    const float *d, const float *a, int cols) {
    return dot_blk32_avx512(GGML_Q4_1, b, q, ql, d, a, cols);
}

AVX512 static float dot_q8_0_avx512(const uint8_t *b, const int8_t *q, const int8_t *ql,
                                    const float *d, const float *a, int cols) {
    return dot_blk32_avx512(GGML_Q8_0, b, q, ql, d, a, cols);
}

// ---- K-quants on AVX-512: one activation step per 256-block, integer sub-block scales -------
// The 32-block kernels above turn every 4-element int32 lane into fp32 with its group's scale
// (cvt, permute, FMA per 64 products); on AMD Zen 4 that fix-up, not the multiplies, bounds them.
// For Q4_K and Q6_K the activations take one step per 256-block instead (q_act's K form: the same
// two digits, |x - x^| <= d_256 / 256), so the sub-block scales, small integers, apply in int:
// vpmaddubsw multiplies the 8-bit weights with a digit and adds pairs (|sum| <= 2 * 63 * 127,
// no saturation), vpdpwssd multiplies those with the int16 scales and accumulates in int32 (per
// lane and super-block at most 16002 * 128 * 8 for Q6_K, 3810 * 63 * 8 for Q4_K), and each digit's
// sum becomes fp32 once per super-block: y += d_w d_x (256 S_hi + S_lo).

// int16 lane indices for vpermw: 16 lanes of index a, then 16 of index b
AVX512 static inline __m512i idx16x2(int a, int b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)a)), _mm256_set1_epi16((short)b), 1);
}
// 8 lanes each of a, a+1, a+2, a+3
AVX512 static inline __m512i idx8x4(int a) {
    return _mm512_set_epi16(a + 3, a + 3, a + 3, a + 3, a + 3, a + 3, a + 3, a + 3, a + 2, a + 2, a + 2,
                            a + 2, a + 2, a + 2, a + 2, a + 2, a + 1, a + 1, a + 1, a + 1, a + 1, a + 1,
                            a + 1, a + 1, a, a, a, a, a, a, a, a);
}

// One half (128 elements) of a K super-block against R activation rows at element off: u0, u1
// the unsigned weights of elements [off, off+64) and [off+64, off+128) in the activations' order,
// s0, s1 their sub-block scales per int16 pair lane. hi[r] / lo[r] (int32) accumulate the high /
// low digit's products (digits 1: the low digits are zero and skipped).
AVX512 static inline __attribute__((always_inline)) void
k_half(int R, int digits, __m512i u0, __m512i u1, __m512i s0, __m512i s1, const act_row *x, int off,
       __m512i *hi, __m512i *lo) {
    for (int r = 0; r < R; r++) {
        const int8_t *q = x[r].q + off, *ql = x[r].ql + off;
        hi[r] = _mm512_dpwssd_epi32(hi[r], _mm512_maddubs_epi16(u0, _mm512_loadu_si512(q)), s0);
        hi[r] = _mm512_dpwssd_epi32(hi[r], _mm512_maddubs_epi16(u1, _mm512_loadu_si512(q + 64)), s1);
        if (digits == 1) continue;
        lo[r] = _mm512_dpwssd_epi32(lo[r], _mm512_maddubs_epi16(u0, _mm512_loadu_si512(ql)), s0);
        lo[r] = _mm512_dpwssd_epi32(lo[r], _mm512_maddubs_epi16(u1, _mm512_loadu_si512(ql + 64)), s1);
    }
}

// The super-block's fp32 fix-up, once per row: facc[r] += d_w d_x[blk] (256 hi[r] + lo[r]).
AVX512 static inline __attribute__((always_inline)) void
k_fixup(int R, const __m512i *hi, const __m512i *lo, float dw, const act_row *x, int blk, __m512 *facc) {
    for (int r = 0; r < R; r++) {
        __m512 s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi[r]), _mm512_set1_ps(256.0f), _mm512_cvtepi32_ps(lo[r]));
        facc[r] = _mm512_fmadd_ps(s, _mm512_set1_ps(dw * x[r].d[blk]), facc[r]);
    }
}

// Q4_K, R activation rows in the K form with Q4_K's element order (x[r].q: high digits, .ql: low,
// both with the middle 32-chunks of every 128 swapped; .d: steps per 256; .a: 32-block sums).
// A 64-byte load of qs holds, in its low nibbles, sub-blocks 4h and 4h+2 (elements 0-31, 64-95 of
// half h), in its high nibbles 4h+1 and 4h+3 — matched by that order. Mins: -dmin mn_j s_j.
AVX512 static inline __attribute__((always_inline)) void
q4k_rows(int R, int digits, const uint8_t *b, const act_row *x, int cols, float *out) {
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    const __m512i ilo[2] = {idx16x2(0, 2), idx16x2(4, 6)}, ihi[2] = {idx16x2(1, 3), idx16x2(5, 7)};
    __m512 facc[4];
    __m256 macc[4];
    for (int r = 0; r < R; r++) facc[r] = _mm512_setzero_ps(), macc[r] = _mm256_setzero_ps();
    for (int i = 0; i < cols; i += 256, b += 144) {
        float dd, dmin;
        uint64_t sc, mn;
        q4k_head(b, &dd, &dmin, &sc, &mn);
        __m512i sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc)));
        __m256 mnd = _mm256_mul_ps(u8x8_to_ps(mn), _mm256_set1_ps(-dmin));
        __m512i hi_acc[4], lo_acc[4];
        for (int r = 0; r < R; r++) hi_acc[r] = lo_acc[r] = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            __m512i v = _mm512_loadu_si512(b + 16 + 64 * h);
            __m512i ul = _mm512_and_si512(v, lo4), uh = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
            k_half(R, digits, ul, uh, _mm512_permutexvar_epi16(ilo[h], sc16),
                   _mm512_permutexvar_epi16(ihi[h], sc16), x, i + 128 * h, hi_acc, lo_acc);
        }
        k_fixup(R, hi_acc, lo_acc, dd, x, i / 256, facc);
        for (int r = 0; r < R; r++) macc[r] = _mm256_fmadd_ps(mnd, _mm256_loadu_ps(x[r].a + i / 32), macc[r]);
    }
    for (int r = 0; r < R; r++) out[r] = _mm512_reduce_add_ps(facc[r]) + hsum256(macc[r]);
}

// The 128 u6 of half `half` of a Q6_K super-block at b: elements 0..63 (u01) and 64..127 (u23).
AVX512 static inline void q6k_half(const uint8_t *b, int half, __m512i *u01, __m512i *u23) {
    const uint8_t *lq = b + 64 * half, *qh = b + 128 + 32 * half;
    __m256i l0 = _mm256_loadu_si256((const __m256i *)lq);
    __m256i l1 = _mm256_loadu_si256((const __m256i *)(lq + 32));
    __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    *u01 = _mm512_inserti64x4(_mm512_castsi256_si512(q6k_u32(l0, l1, h, 0)), q6k_u32(l0, l1, h, 1), 1);
    *u23 = _mm512_inserti64x4(_mm512_castsi256_si512(q6k_u32(l0, l1, h, 2)), q6k_u32(l0, l1, h, 3), 1);
}

// Q6_K, R activation rows in the K form, element order (.a: 16-group sums): w = d sc_g (u - 32);
// the maddubs pair sums of u01 / u23 take the scales of their 16-groups (8 lanes each), the -32
// offsets the activation's 16-group sums.
AVX512 static inline __attribute__((always_inline)) void
q6k_rows(int R, int digits, const uint8_t *b, const act_row *x, int cols, float *out) {
    const __m512i i01[2] = {idx8x4(0), idx8x4(8)}, i23[2] = {idx8x4(4), idx8x4(12)};
    __m512 facc[4], macc[4];
    for (int r = 0; r < R; r++) facc[r] = macc[r] = _mm512_setzero_ps();
    for (int i = 0; i < cols; i += 256, b += 210) {
        for (int k = 0; k < 4; k++) _mm_prefetch((const char *)b + PREFETCH + 64 * k, _MM_HINT_T0);
        const float dq = f16(b + 208);
        __m128i sc8 = _mm_loadu_si128((const __m128i *)(b + 192));
        __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
        __m512 scf = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc8)), _mm512_set1_ps(dq));
        __m512i hi_acc[4], lo_acc[4];
        for (int r = 0; r < R; r++) hi_acc[r] = lo_acc[r] = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            __m512i u01, u23;
            q6k_half(b, h, &u01, &u23);
            k_half(R, digits, u01, u23, _mm512_permutexvar_epi16(i01[h], sc16),
                   _mm512_permutexvar_epi16(i23[h], sc16), x, i + 128 * h, hi_acc, lo_acc);
        }
        k_fixup(R, hi_acc, lo_acc, dq, x, i / 256, facc);
        for (int r = 0; r < R; r++) macc[r] = _mm512_fmadd_ps(scf, _mm512_loadu_ps(x[r].a + i / 16), macc[r]);
    }
    for (int r = 0; r < R; r++) out[r] = _mm512_reduce_add_ps(facc[r]) - 32 * _mm512_reduce_add_ps(macc[r]);
}

// ---- Q4_K, 16 weight rows at once: the rows in the lanes (AVX-512) ---------------------------
// The row kernels above keep one weight row per vector, so each 64 products need vpmaddubsw and
// vpdpwssd (the sub-block scales differ within the vector). q4k_strip transposes a strip of 16
// rows on the fly instead: lane l of a vector holds 4 bytes of one row's quants at one offset of
// the super-block, so one vpdpbusd per digit (the activation's 4 bytes at that offset broadcast)
// adds 4 products to each of the 16 rows, and a sub-block's 32 products per row end in one int32
// lane, meeting their scale once per sub-block: y += d sc_j d_x (256 hi_j + lo_j) - dmin mn_j a_j,
// with 256 hi_j + lo_j < 2^24 (32 products of at most 15 * 127 per digit) converted exactly. The
// activations are the K form's (two digits per 256-block), so the bound of qgemm.h holds as for
// q4k_rows; the fp32 sums run per sub-block, the same for every row count. Per activation row it
// keeps two int32 sums and one fp32 sum, so four rows share each transpose in the registers.
// Measured against q4k_rows: bench/RESULTS.md.
// acc += u . the 4 bytes at p broadcast (vpdpbusd with an embedded broadcast: one instruction, the
// load folded in, which GCC does not form from the intrinsics)
AVX512 static inline __m512i dpbusd_b(__m512i acc, __m512i u, const int8_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)p));
    return acc;
}

// Lane l of a strip's vectors holds row sigma(l) of the strip: lanes 0-3 rows 0-3, 4-7 rows 8-11,
// 8-11 rows 4-7, 12-15 rows 12-15 (what the transposes below give without a last permute).
// 32 bytes at offset off of each super-block (16 rows, row_bytes apart from b) -> raw[8]: raw[d]
// lane l = row sigma(l)'s dword d of those bytes. Two rows per load (r in the low 256 bits, r + 8
// in the high), then an 8 x 8 transpose within each 256-bit half.
AVX512 static inline __attribute__((always_inline)) void
strip_t8(const uint8_t *b, size_t row_bytes, int off, __m512i *raw) {
    __m512i z[8], a[8];
    for (int r = 0; r < 8; r++)
        z[r] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b + r * row_bytes + off))),
                                  _mm256_loadu_si256((const __m256i *)(b + (r + 8) * row_bytes + off)), 1);
    for (int i = 0; i < 4; i++)
        a[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]), a[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    for (int i = 0; i < 2; i++) {   // z[4i + k]: rows 4i..4i+3 (and + 8), dword k (128-bit lanes 0, 2) and k + 4 (1, 3)
        z[4 * i + 0] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        z[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        z[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        z[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    for (int k = 0; k < 4; k++) {
        raw[k] = _mm512_shuffle_i32x4(z[k], z[4 + k], 0x88);
        raw[k + 4] = _mm512_shuffle_i32x4(z[k], z[4 + k], 0xDD);
    }
}

// A strip's super-block scales, lane l for row sigma(l): d, -dmin, and the 8 six-bit scales and
// mins packed as Q4_K packs them (sub-blocks 0-3 and 4-7, one byte each per lane)
typedef struct {
    __m512 dw, ndmin;
    __m512i sc03, mn03, sc47, mn47;
} strip_scales;

// The scales of 16 rows from their first 16 bytes (d, dmin, 12 scale bytes): q4[m]'s 128-bit
// lane k holds the bytes of the row that lanes 4k..4k+3 take from q4[0..3] (lane 4k + m: q4[m])
AVX512 static inline __attribute__((always_inline)) strip_scales strip_scales_of(const __m512i *q4) {
    const __m512i m3f = _mm512_set1_epi32(0x3F3F3F3F), m0f = _mm512_set1_epi32(0x0F0F0F0F),
                  m30 = _mm512_set1_epi32(0x30303030);
    __m512i wk[4];   // wk[k] lane l = lane l's row's dword k
    const __m512i t0 = _mm512_unpacklo_epi32(q4[0], q4[1]), t1 = _mm512_unpackhi_epi32(q4[0], q4[1]),
                  t2 = _mm512_unpacklo_epi32(q4[2], q4[3]), t3 = _mm512_unpackhi_epi32(q4[2], q4[3]);
    wk[0] = _mm512_unpacklo_epi64(t0, t2), wk[1] = _mm512_unpackhi_epi64(t0, t2);
    wk[2] = _mm512_unpacklo_epi64(t1, t3), wk[3] = _mm512_unpackhi_epi64(t1, t3);
    strip_scales h;
    h.dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(wk[0]));
    h.ndmin = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(wk[0], 16))));
    h.sc03 = _mm512_and_si512(wk[1], m3f), h.mn03 = _mm512_and_si512(wk[2], m3f);
    h.sc47 = _mm512_or_si512(_mm512_and_si512(wk[3], m0f), _mm512_and_si512(_mm512_srli_epi32(wk[1], 2), m30));
    h.mn47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(wk[3], 4), m0f),
                             _mm512_and_si512(_mm512_srli_epi32(wk[2], 2), m30));
    return h;
}

// the 16 rows' scales of the super-block at b (rows row_bytes apart), lane l for row sigma(l)
AVX512 static inline __attribute__((always_inline)) strip_scales strip_head(const uint8_t *b, size_t row_bytes) {
    __m512i q4[4];
    for (int m = 0; m < 4; m++) {
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(b + m * row_bytes)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(b + (8 + m) * row_bytes)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(b + (4 + m) * row_bytes)), 2);
        q4[m] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(b + (12 + m) * row_bytes)), 3);
    }
    return strip_scales_of(q4);
}

// Sub-block j of the super-block at element i, per activation row t (v[t] lane l: row sigma(l)'s
// 256 hi_j + lo_j, its digits' exact sums; < 2^24: 32 products of at most 15 * 127 per digit, so
// the conversion is exact): facc[t] += d sc_j dx (256 hi_j + lo_j), then += -dmin mn_j a_j.
// The fp32 steps of a row run in this order, sub-block after sub-block, whichever kernel formed v.
AVX512 static inline __attribute__((always_inline)) void
strip_sub(int R, const strip_scales *h, int j, const __m512i *v, const act_row *x, int i, const float *dx,
          __m512 *facc) {
    const __m512i ff = _mm512_set1_epi32(0xFF);
    const __m512i sc = _mm512_and_si512(_mm512_srli_epi32(j < 4 ? h->sc03 : h->sc47, 8 * (j % 4)), ff),
                  mn = _mm512_and_si512(_mm512_srli_epi32(j < 4 ? h->mn03 : h->mn47, 8 * (j % 4)), ff);
    const __m512 dsc = _mm512_mul_ps(h->dw, _mm512_cvtepi32_ps(sc)), dmn = _mm512_mul_ps(h->ndmin, _mm512_cvtepi32_ps(mn));
    for (int t = 0; t < R; t++) {
        facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v[t]), _mm512_mul_ps(dsc, _mm512_set1_ps(dx[t])), facc[t]);
        facc[t] = _mm512_fmadd_ps(dmn, _mm512_set1_ps(x[t].a[i / 32 + j]), facc[t]);
    }
}

// R activation rows (K form, Q4_K order) x 16 weight rows of Q4_K (row_bytes apart) from w:
// out[t * stride + r].
AVX512 static inline __attribute__((always_inline)) void
q4k_strip(int R, int digits, int l1, const uint8_t *w, size_t row_bytes, const act_row *x, int cols,
          float *out, size_t stride) {
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    __m512 facc[4];
    for (int t = 0; t < R; t++) facc[t] = _mm512_setzero_ps();
    for (int i = 0; i < cols; i += 256) {
        const uint8_t *b = w + (size_t)(i / 256) * 144;
        const strip_scales hd = strip_head(b, row_bytes);
        float dx[4];
        for (int t = 0; t < R; t++) dx[t] = x[t].d[i / 256];
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++)
#pragma GCC unroll 2
            for (int g = 0; g < 2; g++) {   // qs bytes [64c + 32g, + 32): sub-blocks 4c + 2g (low nibbles), + 1 (high)
                __m512i raw[8];
                strip_t8(b, row_bytes, 16 + 64 * c + 32 * g, raw);
#pragma GCC unroll 2
                for (int nh = 0; nh < 2; nh++) {   // low nibbles: sub-block j = 4c + 2g, high: j + 1
                    const int j = 4 * c + 2 * g + nh;
                    __m512i ah[4], al[4];
                    for (int t = 0; t < R; t++) ah[t] = al[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
                    for (int d = 0; d < 8; d++) {
                        const __m512i u = nh ? _mm512_and_si512(_mm512_srli_epi16(raw[d], 4), lo4) : _mm512_and_si512(raw[d], lo4);
                        const int at = i + 128 * c + 32 * g + 64 * nh + 4 * d;   // position in the K form's Q4_K order
                        for (int t = 0; t < R; t++) {
                            ah[t] = dpbusd_b(ah[t], u, x[t].q + at);
                            if (digits == 2) al[t] = dpbusd_b(al[t], u, x[t].ql + at);
                        }
                    }
                    for (int t = 0; t < R; t++) {
                        ah[t] = _mm512_slli_epi32(ah[t], 8);
                        if (digits == 2) ah[t] = _mm512_add_epi32(ah[t], al[t]);
                    }
                    strip_sub(R, &hd, j, ah, x, i, dx, facc);
                }
                if (c == 0 && g == 0) {
                    // The next strip (the 16 rows after these, contiguous), a share per
                    // super-block: one stream a strip ahead, as the row kernels' along their row.
                    // Issued after the first quarter's loads and work: issued before the
                    // super-block's own loads, they held those back (the asm fences keep the
                    // compiler from hoisting them). To L2 or to L1 (l1), as q_strip_get says:
                    // which streams faster depends on the core.
                    __asm__ volatile("" ::: "memory");
                    const uint8_t *p = w + 16 * row_bytes + (size_t)(i / 256) * 16 * 144;
                    for (int l = 0; l < 16 * 144; l += 64)
                        if (l1) _mm_prefetch((const char *)p + l, _MM_HINT_T0);
                        else _mm_prefetch((const char *)p + l, _MM_HINT_T1);
                    __asm__ volatile("" ::: "memory");
                }
            }
    }
    const __m512i sigma = _mm512_set_epi32(15, 14, 13, 12, 7, 6, 5, 4, 11, 10, 9, 8, 3, 2, 1, 0);
    for (int t = 0; t < R; t++) _mm512_storeu_ps(out + (size_t)t * stride, _mm512_permutexvar_ps(sigma, facc[t]));
}

// One activation row (decode) against the same 16 rows in the same arithmetic, 8 rows at a time
// along their super-blocks (q4k_rows8). The strip's loads per weight byte are many: each
// dpbusd broadcasts 4 activation bytes from memory, 13 loads per 144-byte block; on a core whose
// load queue fills with them behind the weights' misses, fewer weight bytes are in flight and the
// stream slows (bench/RESULTS.md). Here a super-block's activations are loaded once (8 vectors,
// 4 at one digit) for 8 rows, each row's 144 bytes in 3 loads: about 4 loads per block. Per row,
// vpdpbusd forms the 8 sub-block sums 256 hi_j + lo_j exactly (int32, as the strip's lanes hold
// them); 8 rows' sums are transposed to the lanes (lane r: row r) and strip_sub's fp32 steps run
// on them in the strip's order: the same bits as q4k_strip for every row and digit count. Which
// of the two streams faster depends on the core, so q_strip_tune times both.
// One 64-byte load of qs holds sub-blocks 4h, 4h+2 (low nibbles, lanes 0-7 and 8-15) and 4h+1,
// 4h+3 (high); the K form's Q4_K order matches each with its 64 activation bytes.
AVX512 static inline __attribute__((always_inline)) void
q4k_rows8(int digits, const uint8_t *w, size_t row_bytes, const act_row *x, int cols, float *out) {
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    __m512 facc = _mm512_setzero_ps();
    for (int i = 0; i < cols; i += 256) {
        const uint8_t *b0 = w + (size_t)(i / 256) * 144;
        __m512i aq[4], al[4];
        for (int k = 0; k < 4; k++) {
            aq[k] = _mm512_loadu_si512(x->q + i + 64 * k);
            if (digits == 2) al[k] = _mm512_loadu_si512(x->ql + i + 64 * k);
        }
        __m256i e[8];   // e[r]: row r's 8 sub-block sums, sub-blocks 0, 1, 4, 5, 2, 3, 6, 7
        for (int r = 0; r < 8; r++) {
            const uint8_t *b = b0 + r * row_bytes;
            const __m512i v0 = _mm512_loadu_si512(b + 16), v1 = _mm512_loadu_si512(b + 80);
            const __m512i u[4] = {_mm512_and_si512(v0, lo4), _mm512_and_si512(_mm512_srli_epi16(v0, 4), lo4),
                                  _mm512_and_si512(v1, lo4), _mm512_and_si512(_mm512_srli_epi16(v1, 4), lo4)};
            __m512i p[4];   // u[k] against elements 64k of the K form: sub-blocks (0, 2), (1, 3), (4, 6), (5, 7), 8 lanes each
            for (int k = 0; k < 4; k++) {
                p[k] = _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u[k], aq[k]), 8);
                if (digits == 2) p[k] = _mm512_dpbusd_epi32(p[k], u[k], al[k]);
            }
            // each 8-lane group to one sum: per 128-bit lane the sums of p0..p3, then lanes 0 + 1, 2 + 3
            const __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1])),
                          c = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
            const __m512i z = _mm512_add_epi32(_mm512_unpacklo_epi64(a, c), _mm512_unpackhi_epi64(a, c));
            e[r] = _mm512_castsi512_si256(_mm512_add_epi32(_mm512_shuffle_i32x4(z, z, 0x08), _mm512_shuffle_i32x4(z, z, 0x0D)));
        }
        {   // the next 8 rows (contiguous), a share per super-block, to L1: one stream 8 rows ahead, as
            // q4k_strip prefetches its next strip (a prefetch per row a few blocks ahead instead
            // streamed at half this rate here). The fences keep them after this block's loads.
            __asm__ volatile("" ::: "memory");
            const uint8_t *pn = w + 8 * row_bytes + (size_t)(i / 256) * 8 * 144;
            for (int l = 0; l < 8 * 144; l += 64) _mm_prefetch((const char *)pn + l, _MM_HINT_T0);
            __asm__ volatile("" ::: "memory");
        }
        // the 8 rows' scales, lane r for row r (lanes 8-15 repeat them)
        __m512i q4[4];
        for (int m = 0; m < 4; m++)
            q4[m] = _mm512_broadcast_i64x4(_mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + m * row_bytes))),
                _mm_loadu_si128((const __m128i *)(b0 + (4 + m) * row_bytes)), 1));
        const strip_scales hd = strip_scales_of(q4);
        // e (8 rows x 8 sums) -> v[k] lane r = row r's sum k
        __m256i v[8];
        {
            __m256i t[8];
            for (int k = 0; k < 4; k++)
                t[2 * k] = _mm256_unpacklo_epi32(e[2 * k], e[2 * k + 1]), t[2 * k + 1] = _mm256_unpackhi_epi32(e[2 * k], e[2 * k + 1]);
            __m256i g[8];   // g[4h + k]: rows 4h..4h+3 (h = 0: 0-3 via t 0..3, h = 1: 4-7), sums k and k + 4 in the 128-bit halves
            for (int h = 0; h < 2; h++) {
                g[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
                g[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
                g[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
                g[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
            }
            for (int k = 0; k < 4; k++) {
                v[k] = _mm256_permute2x128_si256(g[k], g[4 + k], 0x20);
                v[k + 4] = _mm256_permute2x128_si256(g[k], g[4 + k], 0x31);
            }
        }
        static const int at[8] = {0, 1, 4, 5, 2, 3, 6, 7};   // sub-block j's sum: v[at[j]]
        const float dx = x->d[i / 256];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {   // the strip's steps; lanes 8-15 unused
            const __m512i vj = _mm512_castsi256_si512(v[at[j]]);
            strip_sub(1, &hd, j, &vj, x, i, &dx, &facc);
        }
    }
    _mm256_storeu_ps(out, _mm512_castps512_ps256(facc));
}

typedef void (*strip_fn)(int R, const uint8_t *w, size_t row_bytes, const act_row *x, int cols, float *out,
                         size_t stride);
#define STRIP_KERNEL(name, D, L1)                                                                  \
    AVX512 static void strip_##name##_##D##_##L1(int R, const uint8_t *w, size_t row_bytes,        \
                                                 const act_row *x, int cols, float *out, size_t stride) { \
        switch (R) {                                                                               \
        case 1: name##_strip(1, D, L1, w, row_bytes, x, cols, out, stride); break;                 \
        case 2: name##_strip(2, D, L1, w, row_bytes, x, cols, out, stride); break;                 \
        case 3: name##_strip(3, D, L1, w, row_bytes, x, cols, out, stride); break;                 \
        default: name##_strip(4, D, L1, w, row_bytes, x, cols, out, stride); break;                \
        }                                                                                          \
    }
STRIP_KERNEL(q4k, 1, 0)
STRIP_KERNEL(q4k, 2, 0)
STRIP_KERNEL(q4k, 1, 1)
STRIP_KERNEL(q4k, 2, 1)
// A strip through q4k_rows8 at one activation row (two groups of 8 rows), through the strip at
// more (its prefetch level L1)
#define ROWS8_KERNEL(D, L1)                                                                        \
    AVX512 static void strip_rows8_##D##_##L1(int R, const uint8_t *w, size_t row_bytes, const act_row *x, \
                                              int cols, float *out, size_t stride) {               \
        if (R > 1) {                                                                               \
            strip_q4k_##D##_##L1(R, w, row_bytes, x, cols, out, stride);                           \
            return;                                                                                \
        }                                                                                          \
        q4k_rows8(D, w, row_bytes, x, cols, out);                                                  \
        q4k_rows8(D, w + 8 * row_bytes, row_bytes, x, cols, out + 8);                              \
    }
ROWS8_KERNEL(1, 0)
ROWS8_KERNEL(2, 0)
ROWS8_KERNEL(1, 1)
ROWS8_KERNEL(2, 1)

// How whole 16-row blocks of Q4_K run (qgemm.h): strips prefetching to L2, one activation row
// through them too, until q_strip_tune or q_strip_set says otherwise.
static q_strip_form strip_form = {2, 0};
q_strip_form q_strip_get(void) { return strip_form; }
void q_strip_set(q_strip_form f) {
    CHECK_INTERNAL((f.level == 1 || f.level == 2) && (f.rows8 == 0 || f.rows8 == 1), "q_strip_set: level %d, rows8 %d",
                   f.level, f.rows8);
    strip_form = f;
}
q_strip_form q_strip_env(const char **err) {
    const char *v = getenv("SIFT_STRIP_PREFETCH"), *r = getenv("SIFT_STRIP_ROWS8");
    static char msg[160];
    q_strip_form f = {0, -1};
    if (err) *err = NULL;
    if (v && (strcmp(v, "l1") == 0 || strcmp(v, "l2") == 0)) f.level = v[1] - '0';
    else if (v && err) snprintf(msg, sizeof msg, "SIFT_STRIP_PREFETCH must be l1 or l2 (it is '%.64s')", v), *err = msg;
    if (r && (strcmp(r, "on") == 0 || strcmp(r, "off") == 0)) f.rows8 = r[1] == 'n';
    else if (r && err && !*err) snprintf(msg, sizeof msg, "SIFT_STRIP_ROWS8 must be on or off (it is '%.64s')", r), *err = msg;
    return f;
}

int q_rows_strip(enum q_isa isa, uint32_t type) { return isa == Q_ISA_AVX512 && type == GGML_Q4_K; }

static strip_fn fused_strip(enum q_isa isa, uint32_t type, int digits) {   // (Q4_K rows: whole 256-blocks)
    if (!q_rows_strip(isa, type)) return NULL;
    if (strip_form.rows8) return digits == 1 ? (strip_form.level == 1 ? strip_rows8_1_1 : strip_rows8_1_0)
                                             : (strip_form.level == 1 ? strip_rows8_2_1 : strip_rows8_2_0);
    if (strip_form.level == 1) return digits == 1 ? strip_q4k_1_1 : strip_q4k_2_1;
    return digits == 1 ? strip_q4k_1_0 : strip_q4k_2_0;
}

// One-row and four-row forms per digit count D (the same arithmetic per row: bit-identical outputs)
#define K_KERNELS(name, D)                                                                         \
    AVX512 static float dot_##name##_avx512_##D(const uint8_t *b, const int8_t *q, const int8_t *ql, \
                                                 const float *d, const float *a, int cols) {       \
        act_row x = {q, ql, d, a};                                                                 \
        float y;                                                                                   \
        name##_rows(1, D, b, &x, cols, &y);                                                        \
        return y;                                                                                  \
    }                                                                                              \
    AVX512 static void dot4_##name##_avx512_##D(const uint8_t *b, const act_row *x, int cols,      \
                                                 float *out) {                                     \
        name##_rows(4, D, b, x, cols, out);                                                        \
    }
K_KERNELS(q4k, 2)
K_KERNELS(q6k, 2)
K_KERNELS(q4k, 1)
K_KERNELS(q6k, 1)

// (digits: the K-quant kernels skip the low digits' products at 1; the 32-block kernels read
// them, zero)
static dot_blk_fn fused_dot(enum q_isa isa, uint32_t type, int digits) {
    if (isa != Q_ISA_AVX512) return NULL;
    switch (type) {
    case GGML_Q4_0: return dot_q4_0_avx512;
    case GGML_Q4_1: return dot_q4_1_avx512;
    case GGML_Q8_0: return dot_q8_0_avx512;
    case GGML_Q4_K: return digits == 1 ? dot_q4k_avx512_1 : dot_q4k_avx512_2;
    case GGML_Q6_K: return digits == 1 ? dot_q6k_avx512_1 : dot_q6k_avx512_2;
    default: return NULL;
    }
}

// The four-row kernel of a type (AVX-512: every type with a fused kernel), or NULL: rows go one
// at a time.
static dot4_fn fused_dot4(enum q_isa isa, uint32_t type, int digits) {
    if (isa != Q_ISA_AVX512) return NULL;
    switch (type) {
    case GGML_Q4_0: return dot4_q4_0_avx512;
    case GGML_Q4_1: return dot4_q4_1_avx512;
    case GGML_Q8_0: return dot4_q8_0_avx512;
    case GGML_Q4_K: return digits == 1 ? dot4_q4k_avx512_1 : dot4_q4k_avx512_2;
    case GGML_Q6_K: return digits == 1 ? dot4_q6k_avx512_1 : dot4_q6k_avx512_2;
    default: return NULL;
    }
}

// ---- fused AVX2 kernels: blocks read directly, 16 products per vpmaddwd -----------------------
// For CPUs without AVX-512 (and under SIFT_ISA=avx2): the products of the AVX-512 kernels above,
// in the same form (sum_g s_g d_g sum_i u_i x16_i + the offsets' terms), on the activations' two
// digits joined into int16, x16 = 256 q + l (q_act's x16), each 32-block's 16 even elements first,
// then its 16 odd ones (x16[32b + j] = x[32b + 2j], x16[32b + 16 + j] = x[32b + 2j + 1]). In that
// order the weights need no widening shuffles: a 16-bit lane of their bytes holds an even element
// in its low byte and the next odd one in its high byte, so a mask gives the evens as int16 and a
// shift the odds (nibbles: a shift and a mask each). Each vpmaddwd multiplies 16 weights with 16
// x16, pairs added (exact in int32, |u x16| <= 255 * 32639); per 32-block (K-quants: per
// sub-block or pair of 16-groups) one conversion and FMA with its scale. Versus unpacking each row
// first (the generic path), 4-8x the products per second.

// Each kernel takes R = 1 (decode) or 4 (batched decode) activation rows: a weight block's loads,
// its scales' conversion and its quants' unpacking to int16 are done once for the R rows, and
// every row's arithmetic is the same code whatever R, so a row of a batch gives the bits it gives
// alone (tests/test_qgemm.c: test_rows_alone). A row's per-block scales are broadcast from a small
// array (a load, not a lane permute in the inner loop; Q6_K's pairs of group scales are permuted
// into vectors once per 256-block and loaded): four rows' accumulators fill the 16 ymm registers,
// so the loops are unrolled to keep them there.
typedef struct {
    const int16_t *x;
    const float *d, *a;
} act16_row;
typedef void (*dot16x4_fn)(const uint8_t *row, const act16_row *x, int cols, float *out);

// u16 (16 x i16, quants) . x16 (16) -> 8 x i32 (adjacent pairs summed)
static inline __m256i madd16(__m256i u16, const int16_t *x) {
    return _mm256_madd_epi16(u16, _mm256_loadu_si256((const __m256i *)x));
}

// The even (u[0]) and odd (u[1]) quants of a Q4_0 / Q4_1 / Q8_0 block as int16, x16's order. Q8_0:
// the 32 bytes' low and high byte of each 16-bit lane. Q4_0 / Q4_1: byte k holds element k (low
// nibble) and 16 + k (high), so with the 16 bytes in both halves, the 16-bit lane j of the low half
// shifted by 0 / 8 gives elements 2j / 2j + 1, of the high half by 4 / 12 elements 16 + 2j / 17 + 2j
// (per-dword shifts: the upper word's bits that reach the lower word lie above its mask).
static inline void blk32_u16(uint32_t type, const uint8_t *b, __m256i *u) {
    if (type == GGML_Q8_0) {
        __m256i v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), _mm256_set1_epi8((char)0x80));
        u[0] = _mm256_and_si256(v, _mm256_set1_epi16(0xFF)), u[1] = _mm256_srli_epi16(v, 8);
        return;
    }
    const __m256i m4 = _mm256_set1_epi16(0x0F);
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + (type == GGML_Q4_0 ? 2 : 4))));
    u[0] = _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_set_epi32(4, 4, 4, 4, 0, 0, 0, 0)), m4);
    u[1] = _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_set_epi32(12, 12, 12, 12, 8, 8, 8, 8)), m4);
}

static inline __attribute__((always_inline)) void
blk32_rows_avx2(const int R, uint32_t type, const uint8_t *b, const act16_row *x, int cols, float *out) {
    const int bb = type == GGML_Q4_0 ? 18 : type == GGML_Q4_1 ? 20 : 34;
    __m256 acc0[4], acc1[4], accm[4];   // (R <= 4)
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc0[r] = acc1[r] = accm[r] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 256 <= cols; i += 256, b += 8 * bb) {
        __m256 dw, mw;
        blk32_head8(type, b, bb, &dw, &mw);
        float ws[R][8];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            accm[r] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(x[r].a + cols / G + i / 32), accm[r]);
            _mm256_storeu_ps(ws[r], _mm256_mul_ps(dw, _mm256_loadu_ps(x[r].d + i / 32)));
        }
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) {   // even blocks into acc0, odd into acc1 (the one-row kernel's pairs)
            __m256i u[2];
            blk32_u16(type, b + k * bb, u);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const int16_t *xk = x[r].x + i + 32 * k;
                __m256i s = _mm256_add_epi32(madd16(u[0], xk), madd16(u[1], xk + 16));
                if (k % 2 == 0) acc0[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcast_ss(&ws[r][k]), acc0[r]);
                else acc1[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_broadcast_ss(&ws[r][k]), acc1[r]);
            }
        }
    }
    float tail[4] = {0, 0, 0, 0};   // (R <= 4)
    for (; i < cols; i += 32, b += bb) {
        float d0 = f16(b), m0 = type == GGML_Q4_1 ? f16(b + 2) : type == GGML_Q4_0 ? -8 * d0 : -128 * d0;
        __m256i u[2];
        blk32_u16(type, b, u);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const int16_t *xk = x[r].x + i;
            __m256i s0 = _mm256_add_epi32(madd16(u[0], xk), madd16(u[1], xk + 16));
            acc0[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(d0 * x[r].d[i / 32]), acc0[r]);
            tail[r] += m0 * (x[r].a + cols / G)[i / 32];
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) out[r] = hsum256(_mm256_add_ps(acc0[r], acc1[r])) + hsum256(accm[r]) + tail[r];
}

// Q4_K: per 64 elements, 32 bytes of qs: low nibbles = sub-block 2p, high = 2p+1, byte k holding
// element k of each; its 16-bit lane j: bits 0-3, 8-11 = elements 2j, 2j + 1 of sub-block 2p,
// bits 4-7, 12-15 those of 2p+1. The 8 sub-block scales d sc_j d_x,j, mins as a vector term.
static inline __attribute__((always_inline)) void
q4k_rows_avx2(const int R, const uint8_t *b, const act16_row *x, int cols, float *out) {
    const __m256i m4 = _mm256_set1_epi16(0x0F);
    __m256 acc0[4], acc1[4], accm[4];   // (R <= 4)
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc0[r] = acc1[r] = accm[r] = _mm256_setzero_ps();
    for (int i = 0; i < cols; i += 256, b += 144) {
        float dd, dmin;
        uint64_t sc, mn;
        q4k_head(b, &dd, &dmin, &sc, &mn);
        const __m256 scd = _mm256_mul_ps(u8x8_to_ps(sc), _mm256_set1_ps(dd)),
                     mnd = _mm256_mul_ps(u8x8_to_ps(mn), _mm256_set1_ps(-dmin));
        float ws[R][8];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            _mm256_storeu_ps(ws[r], _mm256_mul_ps(scd, _mm256_loadu_ps(x[r].d + i / 32)));
            accm[r] = _mm256_fmadd_ps(mnd, _mm256_loadu_ps(x[r].a + cols / G + i / 32), accm[r]);
        }
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * p));
            const __m256i l0 = _mm256_and_si256(v, m4), l1 = _mm256_and_si256(_mm256_srli_epi16(v, 8), m4);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {   // sub-block 2p (low nibbles)
                const int16_t *xp = x[r].x + i + 64 * p;
                __m256i s0 = _mm256_add_epi32(madd16(l0, xp), madd16(l1, xp + 16));
                acc0[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_broadcast_ss(&ws[r][2 * p]), acc0[r]);
            }
            const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4), h1 = _mm256_srli_epi16(v, 12);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {   // sub-block 2p + 1 (high nibbles)
                const int16_t *xp = x[r].x + i + 64 * p + 32;
                __m256i s1 = _mm256_add_epi32(madd16(h0, xp), madd16(h1, xp + 16));
                acc1[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_broadcast_ss(&ws[r][2 * p + 1]), acc1[r]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) out[r] = hsum256(_mm256_add_ps(acc0[r], acc1[r])) + hsum256(accm[r]);
}

// Q6_K: per half of 128, the 6-bit values of elements 32k..32k+31 (as q6k_half), their evens and
// odds (the low and high byte of each 16-bit lane) against x16's; a product's lanes 0-3 are sums in
// 16-group 2k of the half, lanes 4-7 in 2k+1, so one FMA takes both groups' scales d sc_g (times
// d_x of their 32-block for the main term) as one vector; offsets -32 s_g against the activation's
// 16-group sums.
static inline __attribute__((always_inline)) void
q6k_rows_avx2(const int R, const uint8_t *b, const act16_row *x, int cols, float *out) {
    const __m256i d_of_group = _mm256_set_epi32(3, 3, 2, 2, 1, 1, 0, 0), lo8 = _mm256_set1_epi16(0xFF);
    __m256 acc0[4], acc1[4], accm[4];   // (R <= 4)
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc0[r] = acc1[r] = accm[r] = _mm256_setzero_ps();
    for (int i = 0; i < cols; i += 256, b += 210) {
        for (int k = 0; k < 4; k++) _mm_prefetch((const char *)b + PREFETCH + 64 * k, _MM_HINT_T0);
        const __m256 dd = _mm256_set1_ps(f16(b + 208));
        __m128i sc8 = _mm_loadu_si128((const __m128i *)(b + 192));
        // per row, per 32-chunk c (groups 2c, 2c+1): 4 lanes of each group's scale
        float ws[R][8][8];
        for (int h = 0; h < 2; h++) {
            const __m256 sc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h ? _mm_srli_si128(sc8, 8) : sc8)), dd);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const float *d = x[r].d + i / 32;
                const __m256 w8 = _mm256_mul_ps(sc, _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(d + 4 * h)), d_of_group));
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++)
                    _mm256_storeu_ps(ws[r][4 * h + c], _mm256_permutevar8x32_ps(w8, _mm256_set_epi32(2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1,
                                                                                                    2 * c, 2 * c, 2 * c, 2 * c)));
                accm[r] = _mm256_fmadd_ps(sc, _mm256_loadu_ps(x[r].a + i / 16 + 8 * h), accm[r]);
            }
        }
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++) {
            const uint8_t *lq = b + 64 * half, *qh = b + 128 + 32 * half;
            __m256i l0 = _mm256_loadu_si256((const __m256i *)lq);
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(lq + 32));
            __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const __m256i u = q6k_u32(l0, l1, hb, k);
                const __m256i ue = _mm256_and_si256(u, lo8), uo = _mm256_srli_epi16(u, 8);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const int16_t *xk = x[r].x + i + 128 * half + 32 * k;
                    const __m256 s = _mm256_cvtepi32_ps(_mm256_add_epi32(madd16(ue, xk), madd16(uo, xk + 16)));
                    if (k % 2 == 0) acc0[r] = _mm256_fmadd_ps(s, _mm256_loadu_ps(ws[r][4 * half + k]), acc0[r]);
                    else acc1[r] = _mm256_fmadd_ps(s, _mm256_loadu_ps(ws[r][4 * half + k]), acc1[r]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) out[r] = hsum256(_mm256_add_ps(acc0[r], acc1[r])) - 32 * hsum256(accm[r]);
}

// The one-row (dot16_fn) and four-row (dot16x4_fn) entries: one code, so every row's arithmetic is
// the same in both by construction
#define AVX2_ROWS(name, CALL)                                                                          \
    static float dot_##name##_avx2(const uint8_t *b, const int16_t *x, const float *d, const float *a, int cols) { \
        const act16_row r = {x, d, a};                                                                  \
        float y;                                                                                        \
        CALL(1, b, &r, cols, &y);                                                                       \
        return y;                                                                                       \
    }                                                                                                   \
    static void dot4_##name##_avx2(const uint8_t *b, const act16_row *x, int cols, float *out) { CALL(4, b, x, cols, out); }
#define BLK32_Q4_0(R, ...) blk32_rows_avx2(R, GGML_Q4_0, __VA_ARGS__)
#define BLK32_Q4_1(R, ...) blk32_rows_avx2(R, GGML_Q4_1, __VA_ARGS__)
#define BLK32_Q8_0(R, ...) blk32_rows_avx2(R, GGML_Q8_0, __VA_ARGS__)
AVX2_ROWS(q4_0, BLK32_Q4_0)
AVX2_ROWS(q4_1, BLK32_Q4_1)
AVX2_ROWS(q8_0, BLK32_Q8_0)
AVX2_ROWS(q4_k, q4k_rows_avx2)
AVX2_ROWS(q6_k, q6k_rows_avx2)

// The AVX2 four-row kernel of a type, or NULL (one row at a time)
static dot16x4_fn fused16_dot4(enum q_isa isa, uint32_t type) {
    if (isa != Q_ISA_AVX2) return NULL;
    switch (type) {
    case GGML_Q4_0: return dot4_q4_0_avx2;
    case GGML_Q4_1: return dot4_q4_1_avx2;
    case GGML_Q8_0: return dot4_q8_0_avx2;
    case GGML_Q4_K: return dot4_q4_k_avx2;
    case GGML_Q6_K: return dot4_q6_k_avx2;
    default: return NULL;
    }
}

// The AVX2 kernel of a type (on q_act's x16), or NULL: the generic path.
static dot16_fn fused16_dot(enum q_isa isa, uint32_t type) {
    if (isa != Q_ISA_AVX2) return NULL;
    switch (type) {
    case GGML_Q4_0: return dot_q4_0_avx2;
    case GGML_Q4_1: return dot_q4_1_avx2;
    case GGML_Q8_0: return dot_q8_0_avx2;
    case GGML_Q4_K: return dot_q4_k_avx2;
    case GGML_Q6_K: return dot_q6_k_avx2;
    default: return NULL;
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
static inline float fused_one(dot_blk_fn fused, uint32_t type, const uint8_t *row, const q_act *a,
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
static inline void fused_rows(dot_blk_fn fused, dot4_fn fused4, strip_fn strip, uint32_t type,
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
static inline void fused16_rows(dot16_fn f, dot16x4_fn f4, const uint8_t *row, size_t row_bytes, int nr,
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
    dot_blk_fn fused[Q_MULTI_MAX];
    dot4_fn fused4[Q_MULTI_MAX];
    dot16_fn f16k[Q_MULTI_MAX];
    dot16x4_fn f16k4[Q_MULTI_MAX];
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
    strip_fn strip[Q_MULTI_MAX];
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
    dot_q8_fn dot = isa == Q_ISA_AVX512 ? dot_q8_avx512 : isa == Q_ISA_AVX2 ? dot_q8_avx2
                                                                              : dot_q8_scalar;
    dot_blk_fn fused = fused_dot(isa, type, digits);
    dot4_fn fused4 = fused_dot4(isa, type, digits);
    strip_fn strip = fused_strip(isa, type, digits);
    dot16_fn f16k = fused16_dot(isa, type);
    dot16x4_fn f16k4 = fused16_dot4(isa, type);
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
                unpack_row(type, w + (size_t)(r0 + r) * row_bytes, in, u, s, m);
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
    dot_f16_fn dot = isa == Q_ISA_AVX512 ? dot_f16_avx512 : isa == Q_ISA_AVX2 ? dot_f16_avx2
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
    else if (is_float16(type)) matmul_f16(isa, out, x, n, in, type, w, row_bytes, o);
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
        return strip_form = tuned;
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
        strip_form = form[rep % 3];
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
    return strip_form = tuned;
}
