// qgemm/qgemm_scalar.c — the portable products, qgemm.h's method in plain C: an unpacked weight row
// (q_unpack_row's u, s, m) against an activation row's two digits, and an F16 / BF16 row against
// fp32. A CPU without AVX2 (or SIFT_ISA=scalar) runs these alone; dot_q8_avx512 takes a row's last
// 32 columns here.
#include "../weights/dequant.h"
#include "internal.h"

float dot_q8_scalar(const uint8_t *u, const float *s, const float *m, const int8_t *q,
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

float dot_f16_scalar(const uint16_t *w, int bf16, const float *x, int cols) {
    float acc = 0;
    for (int i = 0; i < cols; i++) acc += (bf16 ? dq_bf16_to_f32(w[i]) : dq_f16_to_f32(w[i])) * x[i];
    return acc;
}
