// util/fastexp.h — exp for arguments <= 0 (softmax and log-sum-exp after subtracting the max)
// in plain float arithmetic, so loops over it vectorize (libm's exp and expf do not).
#pragma once
#include <stdint.h>
#include <string.h>

// exp(x) for the softmax's x <= 0: exp(r) * 2^n with x = n ln2 + r, |r| <= ln2/2, r's Taylor
// series to degree 6 (truncation < 1.3e-7 relative); 0 below -87. Plain arithmetic so the
// loops below vectorize (libm's expf does not).
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
