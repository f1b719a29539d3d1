// backend/ops_cpu.c — the CPU backend's elementwise and row ops: embed, RMSNorm, RoPE, SwiGLU
// (AVX-512 where the CPU has it), residual add, row gather. CUDA twins: ops_cuda.cu.
#include <immintrin.h>
#include <math.h>

#include "../weights/dequant.h"
#include "backend_cpu.h"

// out (n, d) = table[tokens[i]] (rows of a quantised table dequantised)
void cpu_embed(backend *b, void *out, const bk_weight *table, const int *tokens, int n, int d) {
    (void)b;
    for (int i = 0; i < n; i++)
        dq_to_f32(table->type, (const uint8_t *)table->data + (size_t)tokens[i] * table->row_bytes,
                  (float *)out + (size_t)i * d, (uint64_t)d);
}

// out (n, d) = x / sqrt(mean(x^2) + eps) * w
void cpu_rmsnorm(backend *b, void *out, const void *x, const bk_weight *w, int n, int d,
                 float eps) {
    (void)b;
#pragma omp parallel for if (n > 16)
    for (int i = 0; i < n; i++) {
        const float *xi = (const float *)x + (size_t)i * d;
        float *oi = (float *)out + (size_t)i * d;
        double ss = 0;   // (the squares exact in double; summed in lanes: without the simd
                         // reduction the adds ran one after another, 4 cycles each)
#pragma omp simd reduction(+ : ss)
        for (int j = 0; j < d; j++) ss += (double)xi[j] * xi[j];
        float r = (float)(1.0 / sqrt(ss / d + eps));
        for (int j = 0; j < d; j++) oi[j] = xi[j] * r * w->f[j];
    }
}

// The angles' cosines and sines of rows pos[0..n) (n, half each), computed in double as before
// and kept: the next call with the same positions and frequencies (every layer's q and k in a
// pass) reuses them.
static const float *rope_angles(cpu_impl *c, const int *pos, int n, int half, const float *inv_freq) {
    if (c->rope.n == n && c->rope.half == half && !memcmp(c->rope.pos, pos, (size_t)n * sizeof *pos) &&
        !memcmp(c->rope.inv_freq, inv_freq, (size_t)half * sizeof *inv_freq))
        return c->rope.cs;
    if ((size_t)n * half > (size_t)c->rope.cap || c->rope.half != half) {
        free(c->rope.cs), free(c->rope.pos), free(c->rope.inv_freq);
        c->rope.cap = n * half;
        c->rope.cs = xmalloc((size_t)2 * n * half * sizeof(float));
        c->rope.pos = xmalloc((size_t)n * sizeof(int));
        c->rope.inv_freq = xmalloc((size_t)half * sizeof(float));
    }
    float *cs = c->rope.cs, *sn = cs + (size_t)n * half;
#pragma omp parallel for if (n > 16)
    for (int i = 0; i < n; i++)
        for (int j = 0; j < half; j++) {
            double theta = (double)pos[i] * inv_freq[j];
            cs[(size_t)i * half + j] = (float)cos(theta);
            sn[(size_t)i * half + j] = (float)sin(theta);
        }
    memcpy(c->rope.pos, pos, (size_t)n * sizeof *pos);
    memcpy(c->rope.inv_freq, inv_freq, (size_t)half * sizeof *inv_freq);
    c->rope.n = n, c->rope.half = half;
    return cs;
}

// rotate x (n, heads, hd) in place; pair (a, b) = (2j, 2j+1) for NORM, (j, j + hd/2) for NEOX
void cpu_rope(backend *b, void *x, const int *pos, int n, int heads, int hd,
              const float *inv_freq, enum rope_style style) {
    int half = hd / 2;
    if (n <= 0 || half <= 0) return;
    const float *cs = rope_angles(impl(b), pos, n, half, inv_freq), *sn = cs + (size_t)n * half;
#pragma omp parallel for if (n > 16)
    for (int i = 0; i < n; i++) {
        const float *c = cs + (size_t)i * half, *s = sn + (size_t)i * half;
        for (int h = 0; h < heads; h++) {
            float *xh = (float *)x + ((size_t)i * heads + h) * hd;
            for (int j = 0; j < half; j++) {
                int ia = style == ROPE_NORM ? 2 * j : j, ib = style == ROPE_NORM ? 2 * j + 1 : j + half;
                float a = xh[ia], bb = xh[ib];
                xh[ia] = a * c[j] - bb * s[j];
                xh[ib] = a * s[j] + bb * c[j];
            }
        }
    }
}

// e^x for 16 lanes: x = k ln2 + r (|r| <= ln2 / 2, ln2 in two parts), e^r by its degree-6
// Taylor polynomial (relative error < 2e-7, as libm's expf within a few ulp), times 2^k (scalef).
// x is clamped to [-87, 80]: e^-87 = 1.6e-38 is still normal (subnormal results cost a microcode
// assist each: 74 % of SwiGLU's time before the clamp), and e^80 = 5.5e34 keeps its reciprocal
// normal and finite (an infinite one made SwiGLU's Newton step NaN).
__attribute__((target("avx512f,fma"))) static inline __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(80.0f));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), 0);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145752f), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860677e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
}

// out = silu(gate) * up, 16 lanes at a time; 1 / (1 + e^-g) by an IEEE division, not rcp14 and a
// Newton step: rcp14's bits differ between CPUs (AMD Zen 4 and Zen 5 do), and so did every
// output after the first MLP — `--weights fast`'s perplexity moved 0.3 % with them. Gates
// beyond the clamp: silu(g) = g for g > 87 as the scalar form, 0 for g < -80 (true |silu| <
// 1e-33 there; a NaN gate stays NaN).
__attribute__((target("avx512f,fma"))) static void swiglu_avx512(float *o, const float *g,
                                                                  const float *u, size_t n) {
#pragma omp parallel for if (n > 65536)
    for (size_t i = 0; i < n / 16 * 16; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
        __m512 den = _mm512_add_ps(_mm512_set1_ps(1.0f), e), r = _mm512_div_ps(_mm512_set1_ps(1.0f), den);
        __mmask16 tiny = _mm512_cmp_ps_mask(gv, _mm512_set1_ps(-80.0f), _CMP_LT_OQ);
        __m512 s = _mm512_maskz_mul_ps((__mmask16)~tiny, gv, r);   // silu(g < -80) = 0 (< 1e-33)
        _mm512_storeu_ps(o + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
    }
    for (size_t i = n / 16 * 16; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

// out = silu(gate) * up
void cpu_swiglu(backend *b, void *out, const void *gate, const void *up, size_t n) {
    float *o = out;
    const float *g = gate, *u = up;
    if (impl(b)->isa == Q_ISA_AVX512) {
        swiglu_avx512(o, g, u, n);
        return;
    }
#pragma omp parallel for if (n > 65536)
    for (size_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

void cpu_add(backend *b, void *x, const void *y, size_t n) {
    (void)b;
    float *a = x;
    const float *c = y;
    for (size_t i = 0; i < n; i++) a[i] += c[i];
}

// out (k, d) = x[idx[j]]
void cpu_gather_rows(backend *b, void *out, const void *x, const int *idx, int k, int d) {
    (void)b;
    for (int j = 0; j < k; j++)
        memcpy((float *)out + (size_t)j * d, (const float *)x + (size_t)idx[j] * d, d * sizeof(float));
}
