// simt/include/cuda_bf16.h — bfloat16 for the SIMT emulation build: CUDA's storage
// (16 bits, the top half of an fp32) and conversions (round to nearest even; NaN stays NaN).
#pragma once
#include "../simt.h"

struct __nv_bfloat16 {
    unsigned short __x;
};
struct __align__(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

static inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.__x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        h.__x = 0x7fff; // NaN: CUDA's canonical one
    else
        h.__x = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return h;
}
static inline __nv_bfloat16 __float2bfloat16(float f) {
    return __float2bfloat16_rn(f);
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    return __nv_bfloat162{__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}
static inline __nv_bfloat162 __float22bfloat162_rn(float2 f) {
    return __floats2bfloat162_rn(f.x, f.y);
}
static inline float2 __bfloat1622float2(__nv_bfloat162 v) {
    return float2{__bfloat162float(v.x), __bfloat162float(v.y)};
}
static inline float __low2float(__nv_bfloat162 v) {
    return __bfloat162float(v.x);
}
static inline float __high2float(__nv_bfloat162 v) {
    return __bfloat162float(v.y);
}
