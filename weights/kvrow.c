// weights/kvrow.c — KV cache row encodings (see kvrow.h).
#include "kvrow.h"

#include <math.h>
#include <string.h>
#include <strings.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#include "dequant.h"

#define QK8 32          // elements per q8_0 block
#define Q8_BYTES 34     // fp16 scale + 32 int8

static const char *const names[KV_N_TYPES] = {"f32", "bf16", "f16", "q8_0"};

const char *kv_type_name(enum kv_type t) {
    return (unsigned)t < KV_N_TYPES ? names[t] : "?";
}

int kv_type_parse(const char *s) {
    for (int t = 0; t < KV_N_TYPES; t++)
        if (strcasecmp(s, names[t]) == 0) return t;
    return -1;
}

size_t kv_row_bytes(enum kv_type t, int hd) {
    if (hd <= 0) return 0;
    switch (t) {
    case KV_F32: return (size_t)hd * 4;
    case KV_BF16:
    case KV_F16: return ((size_t)hd * 2 + 3) & ~(size_t)3;
    case KV_Q8_0: return hd % QK8 ? 0 : ((size_t)hd / QK8 * Q8_BYTES + 3) & ~(size_t)3;
    }
    return 0;
}

uint16_t kv_f32_to_bf16(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40);   // NaN stays NaN
    b += 0x7fffu + ((b >> 16) & 1);   // round to nearest, ties to the even bf16
    return (uint16_t)(b >> 16);
}

uint16_t kv_f32_to_f16(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000);
    uint32_t a = b & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00;            // NaN
    if (a >= 0x477ff000u) return sign | 0x7c00;           // >= 65520 rounds to inf
    if (a < 0x38800000u) {                                // below 2^-14: a subnormal (or 0)
        float m = fabsf(x) * 0x1p24f;                      // exact: units of 2^-24
        return sign | (uint16_t)rintf(m);                  // 1024 is the smallest normal: right
    }
    uint32_t h = ((a >> 23) - 112) << 10 | (a & 0x7fffff) >> 13, rem = a & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;   // a carry moves into the exponent
    return sign | (uint16_t)h;
}

static void q8_encode(uint8_t *dst, const float *x, int hd) {
    for (int b = 0; b < hd / QK8; b++, x += QK8, dst += Q8_BYTES) {
        float amax = 0;
        for (int i = 0; i < QK8; i++) amax = fmaxf(amax, fabsf(x[i]));
        uint16_t dh = kv_f32_to_f16(amax / 127.0f);
        // quantise with the scale as stored, so the error per element is at most d/2
        float d = dq_f16_to_f32(dh), id = d > 0 ? 1.0f / d : 0;
        memcpy(dst, &dh, 2);
        for (int i = 0; i < QK8; i++) {
            float q = rintf(x[i] * id);
            dst[2 + i] = (uint8_t)(int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
        }
    }
}

// F16C's conversion rounds to nearest even as kv_f32_to_f16 does (tests/test_kvcache.c: the same
// bits on every finite value and infinity; a NaN keeps part of its payload); 8 at a time (the scalar loop had been 3 % of a batch job's time)
static void f16_encode(uint16_t *h, const float *x, int hd) {
    int i = 0;
#ifdef __F16C__
    for (; i + 8 <= hd; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < hd; i++) h[i] = kv_f32_to_f16(x[i]);
}

void kv_row_encode(enum kv_type t, void *dst, const float *src, int hd) {
    uint16_t *h = dst;
    switch (t) {
    case KV_F32: memcpy(dst, src, (size_t)hd * 4); break;
    case KV_BF16: for (int i = 0; i < hd; i++) h[i] = kv_f32_to_bf16(src[i]); break;
    case KV_F16: f16_encode(h, src, hd); break;
    case KV_Q8_0: q8_encode(dst, src, hd); break;
    }
}

static void f16_decode(float *y, const uint16_t *h, int hd) {
    int i = 0;
#ifdef __F16C__
    for (; i + 8 <= hd; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
    for (; i < hd; i++) y[i] = dq_f16_to_f32(h[i]);
}

void kv_row_decode(enum kv_type t, float *y, const void *src, int hd) {
    switch (t) {
    case KV_F32: memcpy(y, src, (size_t)hd * 4); break;
    case KV_BF16: {
        const uint16_t *h = src;
        uint32_t *u = (uint32_t *)y;
#pragma omp simd
        for (int i = 0; i < hd; i++) u[i] = (uint32_t)h[i] << 16;
        break;
    }
    case KV_F16: f16_decode(y, src, hd); break;
    case KV_Q8_0: {
        const uint8_t *b = src;
        for (int k = 0; k < hd / QK8; k++, b += Q8_BYTES, y += QK8) {
            uint16_t dh;
            memcpy(&dh, b, 2);
            const float d = dq_f16_to_f32(dh);
            const int8_t *q = (const int8_t *)(b + 2);
#pragma omp simd
            for (int i = 0; i < QK8; i++) y[i] = d * (float)q[i];
        }
        break;
    }
    }
}

void kv_rows_decode(enum kv_type t, float *dst, const void *src, int n, int hd) {
    size_t rb = kv_row_bytes(t, hd);
    for (int r = 0; r < n; r++) kv_row_decode(t, dst + (size_t)r * hd, (const char *)src + r * rb, hd);
}
