// util/fastexp.h — exp for arguments <= 0 (softmax and log-sum-exp after subtracting the max)
// in plain float arithmetic (libm's exp and expf are calls), one lane or eight;
// and hsum8, the sum of 8 lanes that exp8_sum and attention's decode take.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

// exp(x) for the softmax's x <= 0: exp(r) * 2^n with x = n ln2 + r, |r| <= ln2/2, r's Taylor
// series to degree 6 (truncation < 1.3e-7 relative); 0 below -87. Plain arithmetic, but GCC
// keeps a loop over it scalar (its float-to-int conversion may trap, so the loop is not
// if-converted): hot loops take exp8_nonpos below.
static inline float exp_nonpos(float x) {
    float xc = x > -87.0f ? x : -87.0f;
    float n = (xc * 1.44269504f + 12582912.0f) - 12582912.0f;   // round to nearest: 1.5 * 2^23
    float r = xc - n * 0.693145752f - n * 1.42860677e-6f;   // ln2 split in hi + lo
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float y = p * scale;
    return x > -87.0f ? y : 0.0f;
}

#if defined(__AVX2__)
#include <immintrin.h>
// exp_nonpos on 8 lanes: its operations in its order, each multiply and add rounded on its own
// (C11 mode contracts none into an fma), so every lane is bit-identical to exp_nonpos of it
// (tests/test_kvcache.c). Masked keys' -inf (and anything below -87) give 0.
static inline __m256 exp8_nonpos(__m256 x) {
    const __m256 lim = _mm256_set1_ps(-87.0f), magic = _mm256_set1_ps(12582912.0f);
    const __m256 keep = _mm256_cmp_ps(x, lim, _CMP_GT_OQ);
    const __m256 xc = _mm256_blendv_ps(lim, x, keep);
    const __m256 t = _mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504f)), magic);
    const __m256 n = _mm256_sub_ps(t, magic);
    const __m256 r = _mm256_sub_ps(_mm256_sub_ps(xc, _mm256_mul_ps(n, _mm256_set1_ps(0.693145752f))),
                                   _mm256_mul_ps(n, _mm256_set1_ps(1.42860677e-6f)));
    __m256 p = _mm256_add_ps(_mm256_set1_ps(1.0f / 120), _mm256_mul_ps(r, _mm256_set1_ps(1.0f / 720)));
    p = _mm256_add_ps(_mm256_set1_ps(1.0f / 24), _mm256_mul_ps(r, p));
    p = _mm256_add_ps(_mm256_set1_ps(1.0f / 6), _mm256_mul_ps(r, p));
    p = _mm256_add_ps(_mm256_set1_ps(0.5f), _mm256_mul_ps(r, p));
    p = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(r, p));
    p = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(r, p));
    // 2^n: t = 1.5 * 2^23 + n holds n in its low bits
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(127 - 0x4B400000)), 23);
    return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

// The sum of v's 8 lanes in a fixed order: lo + hi halves, then lanes 0 + 2 and 1 + 3, then those
// two (attention's hsum8x8 gives these bits for eight vectors at once)
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// y[j] = exp(x[j] - mx) for j < n (y may be x), 8 lanes at a time; returns their sum. The last
// vector is loaded under a mask with -inf in the lanes past n (exp: 0), so element j always adds
// into lane j % 8 and trailing -inf elements add exact zeros: the sum's bits do not depend on
// how many such elements follow (attention's rows in blocks of any length: tests/test_chunk.py).
static inline float exp8_sum(float *y, const float *x, int n, float mx) {
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 sum = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 e = exp8_nonpos(_mm256_sub_ps(_mm256_loadu_ps(x + j), vmx));
        _mm256_storeu_ps(y + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (j < n) {
        const __m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - j), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 v = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(x + j, k), _mm256_castsi256_ps(k));
        const __m256 e = exp8_nonpos(_mm256_sub_ps(v, vmx));
        _mm256_maskstore_ps(y + j, k, e);
        sum = _mm256_add_ps(sum, e);
    }
    return hsum8(sum);
}
#endif
