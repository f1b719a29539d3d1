// util/fastexp.h — exp for arguments <= 0 (softmax and log-sum-exp after subtracting the max)
// in plain float arithmetic (libm's exp and expf are calls), one lane or eight.
#pragma once
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
#endif
