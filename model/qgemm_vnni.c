// model/qgemm_vnni.c — prefill products in integer arithmetic on AVX-512 VNNI (see qgemm.h).
//
//   out (n, o) = x (n, in) @ W (o, in)^T, W in any block type with an 8-bit form (q_unpack_row).
//
// Two digits (the default): the activations' two digits per element, the int8 path's
// (q_quantize_row: per 32-block, d = max|x| / 127 / 256 and x ~ (256 q + l) d), joined into one
// int16 a = 256 q + l and interleaved for 32 tokens: for every 2 columns, 32 tokens x 2 int16
// (two zmm of 16 x 2). Weights, per unit of RU rows per thread: the 8-bit form u as int16,
// row-major, with per row and scale group g (GS = 32 elements, 16 for Q6_K) s and m (w = s u + m).
// One vpdpwssd multiplies 16 tokens' 2 int16 by one row's 2 int16 (broadcast) and adds into 16
// int32 lanes — exact: |a| <= 32639, u <= 255, a group's sum < 2^31. Per group:
//   y += s d (sum_g u a) + m (d sum_g a)
// with d sum_g a per token and group precomputed. Micro tile: 6 weight rows x 32 tokens (12 x 16
// for at most 16 tokens), 12 int32 + 12 fp32 accumulators, over `in` in passes of KC columns.
// Error against the fp32 product of the dequantised weights: the activations' rounding, the int8
// path's bound |y - y_f32| <= sum_i |w_i| d_blk(i) + fp32 summation (tests/test_qgemm.c).
// One digit (--weights fast, below): 8-bit activations on vpdpbusd, twice the products per
// instruction — llama.cpp's precision, which turned the default model's greedy chat answer into
// nonsense, as llama.cpp's own run does (bench/RESULTS.md).
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "../util/check.h"
#include "../weights/dequant.h"
#include "../weights/gguf.h"
#include "qgemm.h"

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))

#define MR 6          // weight rows per micro tile
#define RU 24         // weight rows per unit of work (MR x 4: unpacked once, used by every token)
#define NT 32         // tokens per micro tile (two vectors of 16)
#define KC 256        // columns per pass: a pass's slice of a token group (16 KiB) and of the
                      // unit's rows (12 KiB) stay in L1 while the unit's micro tiles reuse them

// The scale group of a type's 8-bit form: 32 elements, 16 for Q6_K.
static int group_of(uint32_t type) { return type == GGML_Q6_K ? 16 : 32; }

int q_vnni_supported(uint32_t type) {
    return q_type_supported(type) && type != GGML_F16 && type != GGML_BF16;
}

// x (n, in) -> a (n_tg, in/2, 32, 2) int16, d (n_tg, in/32, 32), dq (n_tg, in/gs, 32); tokens past
// n: zero. The digits are q_quantize_row's (the int8 path's, bit for bit). tmp: per thread
// 2 in + in/32 * 4 + in/16 * 4 bytes.
VNNI static void quantize_tokens(const float *x, int n, int in, int gs, int n_tg, int16_t *a,
                                 float *d, float *dq, uint8_t *tmp) {
    const int nb = in / 32, ng = in / gs;
    const size_t per = (size_t)2 * in + (size_t)nb * 4 + (size_t)in / 16 * 4;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n_tg * NT; t++) {
        const int tg = t / NT, lane = t % NT;
        uint32_t *at = (uint32_t *)a + (size_t)tg * (in / 2) * NT + lane;
        float *dt = d + (size_t)tg * nb * NT + lane, *qt = dq + (size_t)tg * ng * NT + lane;
        if (t >= n) {
            for (int k2 = 0; k2 < in / 2; k2++) at[(size_t)k2 * NT] = 0;
            for (int b = 0; b < nb; b++) dt[b * NT] = 0;
            for (int g = 0; g < ng; g++) qt[g * NT] = 0;
            continue;
        }
        int8_t *q = (int8_t *)(tmp + (size_t)omp_get_thread_num() * per);
        float *db = (float *)(q + 2 * in), *a16 = db + nb;
        q_quantize_row(Q_ISA_AVX512, x + (size_t)t * in, in, q, db, a16);
        for (int k = 0; k < in; k += 16) {   // 256 hi + lo as int16, stored as pairs (k, k + 1)
            __m256i hi = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + k)));
            __m256i lo = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + in + k)));
            uint32_t pair[8];
            _mm256_storeu_si256((__m256i *)pair, _mm256_add_epi16(_mm256_slli_epi16(hi, 8), lo));
            for (int j = 0; j < 8; j++) at[(size_t)(k / 2 + j) * NT] = pair[j];
        }
        for (int b = 0; b < nb; b++) dt[b * NT] = db[b];
        for (int g = 0; g < ng; g++) qt[g * NT] = gs == 16 ? a16[g] : a16[2 * g] + a16[2 * g + 1];
    }
}

// A unit's weights: u (RU, in) as int16, row-major, and per group g the RU rows' s and m.
typedef struct { int16_t *w; float *s, *m; } unit;

// One Q4_K row straight from its blocks into unit row r (what q_unpack_row gives, without the
// intermediate): u = nibble, s = d sc_j, m = -dmin m_j.
VNNI static void q4_k_unit_row(const uint8_t *b, int in, unit *u, int r) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    int16_t *wr = u->w + (size_t)r * in;
    for (int i = 0; i < in; i += 256, b += 144) {
        uint16_t h[2];
        memcpy(h, b, 4);
        const float d = _cvtsh_ss(h[0]), dmin = _cvtsh_ss(h[1]);
        for (int j = 0; j < 8; j++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (j / 2)));
            q = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(q, 4) : q, lo4);
            _mm512_storeu_si512(wr + i + 32 * j, _mm512_cvtepu8_epi16(q));
            int sc, mn;
            dq_k4_scale_min(b + 4, j, &sc, &mn);
            const int g = i / 32 + j;
            u->s[g * RU + r] = d * (float)sc;
            u->m[g * RU + r] = -dmin * (float)mn;
        }
    }
}

// rows r0 .. r0 + nr of W (nr <= RU) -> u; rows past nr are zero (their outputs are not written).
// tmp: in + in/16 * 8 bytes.
VNNI static void unpack_unit(uint32_t type, const uint8_t *w, size_t row_bytes, int r0, int nr,
                             int in, int gs, unit *u, uint8_t *tmp) {
    const int ng = in / gs, step = gs / 16;
    float *s16 = (float *)(tmp + in), *m16 = s16 + in / 16;
    for (int r = 0; r < RU; r++) {
        int16_t *wr = u->w + (size_t)r * in;
        if (r >= nr) {
            memset(wr, 0, (size_t)in * 2);
            for (int g = 0; g < ng; g++) u->s[g * RU + r] = u->m[g * RU + r] = 0;
            continue;
        }
        if (type == GGML_Q4_K) {
            q4_k_unit_row(w + (size_t)(r0 + r) * row_bytes, in, u, r);
            continue;
        }
        q_unpack_row(type, w + (size_t)(r0 + r) * row_bytes, in, tmp, s16, m16);
        for (int k = 0; k < in; k += 32)
            _mm512_storeu_si512(wr + k, _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(tmp + k))));
        for (int g = 0; g < ng; g++) {   // GS 32: both 16-groups share s, m
            u->s[g * RU + r] = s16[g * step];
            u->m[g * RU + r] = m16[g * step];
        }
    }
}

// acc (mr rows x NT tokens, fp32, row-major) += groups [g0, g1) of mr unit rows (w: the first row,
// stride in; s/m offset to the tile's first row) x one token group (a, d, dq at its start), of
// which tv vectors of 16 tokens are used: 6 rows x 32 tokens, or for a group of at most 16
// tokens (batched decode) 12 rows x 16. first: acc starts at 0.
VNNI static inline __attribute__((always_inline)) void
micro(const int gs, const int tv, const int16_t *w, int in, const float *s, const float *m,
      const int16_t *a, const float *d, const float *dq, int g0, int g1, float *acc, int first) {
    const int mr = tv == 2 ? MR : 2 * MR;
    __m512 f[2 * MR][2];
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < tv; v++)
            f[r][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + r * NT + 16 * v);
    for (int g = g0; g < g1; g++) {
        __m512i c[2 * MR][2];
        for (int r = 0; r < mr; r++)
            for (int v = 0; v < tv; v++) c[r][v] = _mm512_setzero_si512();
        const int16_t *ag = a + (size_t)g * gs * NT, *wg = w + (size_t)g * gs;
#pragma GCC unroll 16   // whole: a rolled loop made GCC copy every accumulator each step
        for (int k2 = 0; k2 < gs / 2; k2++) {
            __m512i x[2];
            for (int v = 0; v < tv; v++) x[v] = _mm512_loadu_si512(ag + k2 * 2 * NT + 32 * v);
            for (int r = 0; r < mr; r++) {
                int32_t wv;
                memcpy(&wv, wg + (size_t)r * in + 2 * k2, 4);
                const __m512i wb = _mm512_set1_epi32(wv);
                for (int v = 0; v < tv; v++) c[r][v] = _mm512_dpwssd_epi32(c[r][v], x[v], wb);
            }
        }
        const int blk = g * gs / 32;
        for (int v = 0; v < tv; v++) {
            const __m512 dv = _mm512_loadu_ps(d + blk * NT + 16 * v), qv = _mm512_loadu_ps(dq + g * NT + 16 * v);
            for (int r = 0; r < mr; r++) {
                const __m512 sr = _mm512_set1_ps(s[g * RU + r]), mv = _mm512_set1_ps(m[g * RU + r]);
                f[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[r][v]), _mm512_mul_ps(sr, dv), f[r][v]);
                f[r][v] = _mm512_fmadd_ps(mv, qv, f[r][v]);
            }
        }
    }
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < tv; v++) _mm512_storeu_ps(acc + r * NT + 16 * v, f[r][v]);
}

typedef void (*micro_fn)(const int16_t *, int, const float *, const float *, const int16_t *,
                         const float *, const float *, int, int, float *, int);
#define MICRO(name, gs, tv)                                                                        \
    VNNI static void name(const int16_t *w, int in, const float *s, const float *m,                 \
                          const int16_t *a, const float *d, const float *dq, int g0, int g1,        \
                          float *acc, int first) {                                                  \
        micro(gs, tv, w, in, s, m, a, d, dq, g0, g1, acc, first);                                    \
    }
MICRO(micro32x2, 32, 2)
MICRO(micro16x2, 16, 2)
MICRO(micro32x1, 32, 1)
MICRO(micro16x1, 16, 1)

VNNI static void matmul_vnni16(float *out, const float *x, int n, int in, uint32_t type, const void *w,
                               size_t row_bytes, int o, q_scratch *sc) {
    CHECK_INTERNAL(in % 32 == 0 && q_vnni_supported(type), "matmul_vnni16: type %u, %d columns", type, in);
    const int gs = group_of(type), ng = in / gs, n_tg = (n + NT - 1) / NT, nt = omp_get_max_threads();
    const size_t a_bytes = (size_t)n_tg * NT * in * 2, d_bytes = (size_t)n_tg * NT * (in / 32) * 4,
                 dq_bytes = (size_t)n_tg * NT * ng * 4,
                 qt_bytes = (size_t)nt * ((size_t)2 * in + (size_t)in / 32 * 4 + (size_t)in / 16 * 4);
    const size_t unit_bytes = (size_t)RU * in * 2 + (size_t)ng * RU * 8, tmp_bytes = (size_t)in + in / 16 * 8,
                 acc_bytes = (size_t)n_tg * RU * NT * 4, per = unit_bytes + tmp_bytes + acc_bytes + 192;
    uint8_t *buf = q_scratch_get(sc, a_bytes + d_bytes + dq_bytes + qt_bytes + (size_t)nt * per + 64);
    int16_t *a = (int16_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    float *d = (float *)((uint8_t *)a + a_bytes), *dq = (float *)((uint8_t *)d + d_bytes);
    uint8_t *qtmp = (uint8_t *)dq + dq_bytes, *per_thread = qtmp + qt_bytes;
    quantize_tokens(x, n, in, gs, n_tg, a, d, dq, qtmp);
    const int tv = n <= 16 ? 1 : 2, mr = tv == 2 ? MR : 2 * MR;   // at most 16 tokens: 12 x 16 tiles
    const micro_fn tile = gs == 32 ? (tv == 2 ? micro32x2 : micro32x1) : (tv == 2 ? micro16x2 : micro16x1);
    const int n_units = (o + RU - 1) / RU, kc_groups = KC / gs;
#pragma omp parallel
    {
        uint8_t *mine = (uint8_t *)(((uintptr_t)(per_thread + (size_t)omp_get_thread_num() * per) + 63) & ~(uintptr_t)63);
        unit u = {(int16_t *)mine, NULL, NULL};
        u.s = (float *)(mine + (size_t)RU * in * 2);
        u.m = u.s + (size_t)ng * RU;
        uint8_t *tmp = (uint8_t *)(u.m + (size_t)ng * RU);
        float *acc = (float *)(((uintptr_t)(tmp + tmp_bytes) + 63) & ~(uintptr_t)63);   // (n_tg, RU, NT)
#pragma omp for schedule(static)
        for (int un = 0; un < n_units; un++) {
            const int r0 = un * RU, nr = o - r0 < RU ? o - r0 : RU;
            unpack_unit(type, (const uint8_t *)w, row_bytes, r0, nr, in, gs, &u, tmp);
            for (int g0 = 0; g0 < ng; g0 += kc_groups) {
                const int g1 = ng - g0 < kc_groups ? ng : g0 + kc_groups;
                for (int tg = 0; tg < n_tg; tg++)
                    for (int m = 0; m < nr; m += mr)
                        tile(u.w + (size_t)m * in, in, u.s + m, u.m + m, a + (size_t)tg * in * NT,
                             d + (size_t)tg * (in / 32) * NT, dq + (size_t)tg * ng * NT, g0, g1,
                             acc + ((size_t)tg * RU + m) * NT, g0 == 0);
            }
            for (int t = 0; t < n; t++) {
                const float *src = acc + (size_t)(t / NT) * RU * NT + t % NT;
                float *dst = out + (size_t)t * o + r0;
                for (int r = 0; r < nr; r++) dst[r] = src[r * NT];
            }
        }
    }
}

// ---- one digit (--weights fast): 8-bit activations, vpdpbusd ------------------------------------
//
// Activations: per token and 32-block, d = max|x| / 127 and q = round(x / d) (one 8-bit digit,
// llama.cpp's Q8_0 rounding), stored unsigned as p = q + 128 and interleaved for 32 tokens: for
// every 4 columns, 32 tokens x 4 bytes. Weights: w' = u - c (c: the type's midpoint, so w' fits
// 8 bits), row-major int8, with per group s, c2 = s c + m and W' = sum_g w'. One vpdpbusd
// multiplies 16 tokens' 4 unsigned bytes by one row's 4 signed bytes — twice the products of a
// vpdpwssd. Per group, with the int32 lanes started at -128 W':
//   sum_g q u = (sum_g p w' - 128 W') + c Q,   y += s d (sum_g p w' - 128 W') + c2 d Q
// Error: |q d - x| <= d / 2 per element, |y - y_f32| <= sum_i |w_i| d_blk(i) / 2 + fp32 summation.

static int mid_of(uint32_t type) {
    switch (type) {
    case GGML_Q4_0: case GGML_Q4_1: case GGML_Q4_K: return 8;
    case GGML_Q5_0: case GGML_Q5_1: case GGML_Q5_K: return 16;
    case GGML_Q6_K: return 32;
    default: return 128;   // Q8_0: u = q + 128
    }
}

// x (n, in) -> p (n_tg, in/4, 32, 4), d (n_tg, in/32, 32), dq (n_tg, in/gs, 32); tokens past n:
// p = 128 (q = 0), d = dq = 0.
VNNI static void quantize_tokens8(const float *x, int n, int in, int gs, int n_tg, uint8_t *p,
                                 float *d, float *dq) {
    const int nb = in / 32, ng = in / gs;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n_tg * NT; t++) {
        const int tg = t / NT, lane = t % NT;
        uint32_t *pt = (uint32_t *)p + (size_t)tg * (in / 4) * NT + lane;
        float *dt = d + (size_t)tg * nb * NT + lane, *qt = dq + (size_t)tg * ng * NT + lane;
        if (t >= n) {
            for (int k4 = 0; k4 < in / 4; k4++) pt[(size_t)k4 * NT] = 0x80808080u;
            for (int b = 0; b < nb; b++) dt[b * NT] = 0;
            for (int g = 0; g < ng; g++) qt[g * NT] = 0;
            continue;
        }
        const float *xt = x + (size_t)t * in;
        for (int b = 0; b < nb; b++) {
            __m512 x0 = _mm512_loadu_ps(xt + 32 * b), x1 = _mm512_loadu_ps(xt + 32 * b + 16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
            float step = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
            int sum[2];
            dt[b * NT] = step;
            for (int h = 0; h < 2; h++) {
                __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(h ? x1 : x0, _mm512_set1_ps(inv)));
                q = _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
                __m128i u8 = _mm512_cvtepi32_epi8(_mm512_add_epi32(q, _mm512_set1_epi32(128)));
                uint32_t quad[4];
                _mm_storeu_si128((__m128i *)quad, u8);
                for (int j = 0; j < 4; j++) pt[(size_t)(8 * b + 4 * h + j) * NT] = quad[j];
                sum[h] = _mm512_reduce_add_epi32(q);
            }
            if (gs == 16) qt[2 * b * NT] = step * (float)sum[0], qt[(2 * b + 1) * NT] = step * (float)sum[1];
            else qt[b * NT] = step * (float)(sum[0] + sum[1]);
        }
    }
}

// A unit8's weights: w' (RU, in) row-major, and per group g the RU rows' -128 W' (init), s, c2.
typedef struct { int8_t *w; int32_t *init; float *s, *c2; } unit8;

// One Q4_K row straight from its blocks into unit8 row r (what q_unpack_row and the generic
// conversion below give, without the intermediate): w' = nibble - 8, s = d sc_j, m = -dmin m_j.
VNNI static void q4_k_unit_row8(const uint8_t *b, int in, unit8 *u, int r) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
    int8_t *wr = u->w + (size_t)r * in;
    for (int i = 0; i < in; i += 256, b += 144) {
        uint16_t h[2];
        memcpy(h, b, 4);
        const float d = _cvtsh_ss(h[0]), dmin = _cvtsh_ss(h[1]);
        for (int j = 0; j < 8; j++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (j / 2)));
            q = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(q, 4) : q, lo4);
            _mm256_storeu_si256((__m256i *)(wr + i + 32 * j), _mm256_sub_epi8(q, eight));
            __m256i s4 = _mm256_sad_epu8(q, _mm256_setzero_si256());   // 4 partial sums of u
            __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
            int sum = (int)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 8 * 32;
            int sc, mn;
            dq_k4_scale_min(b + 4, j, &sc, &mn);
            const int g = i / 32 + j;
            const float s = d * (float)sc;
            u->init[g * RU + r] = -128 * sum;
            u->s[g * RU + r] = s;
            u->c2[g * RU + r] = s * 8.0f - dmin * (float)mn;
        }
    }
}

// rows r0 .. r0 + nr of W (nr <= RU) -> u; rows past nr are zero (their outputs are not written).
// tmp: in + in/16 * 8 bytes.
VNNI static void unpack_unit8(uint32_t type, const uint8_t *w, size_t row_bytes, int r0, int nr,
                             int in, int gs, unit8 *u, uint8_t *tmp) {
    const int ng = in / gs, c = mid_of(type), step = gs / 16;
    float *s16 = (float *)(tmp + in), *m16 = s16 + in / 16;
    for (int r = 0; r < RU; r++) {
        int8_t *wr = u->w + (size_t)r * in;
        if (r >= nr) {
            memset(wr, 0, (size_t)in);
            for (int g = 0; g < ng; g++) u->init[g * RU + r] = 0, u->s[g * RU + r] = u->c2[g * RU + r] = 0;
            continue;
        }
        if (type == GGML_Q4_K) {
            q4_k_unit_row8(w + (size_t)(r0 + r) * row_bytes, in, u, r);
            continue;
        }
        q_unpack_row(type, w + (size_t)(r0 + r) * row_bytes, in, tmp, s16, m16);
        const __m256i vc = _mm256_set1_epi8((char)c);
        for (int k = 0; k < in; k += 32)
            _mm256_storeu_si256((__m256i *)(wr + k), _mm256_sub_epi8(_mm256_loadu_si256((const __m256i *)(tmp + k)), vc));
        for (int g = 0; g < ng; g++) {
            __m128i b = _mm_loadu_si128((const __m128i *)(wr + g * gs));
            int sum = _mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(b));
            if (gs == 32) sum += _mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(wr + g * gs + 16))));
            float s = s16[g * step], m = m16[g * step];   // GS 32: both 16-groups share s, m
            u->init[g * RU + r] = -128 * sum;
            u->s[g * RU + r] = s;
            u->c2[g * RU + r] = s * (float)c + m;
        }
    }
}

// acc (mr rows x NT tokens, fp32, row-major) += groups [g0, g1) of mr unit8 rows (w: the first row,
// stride in; init/s/c2 offset to the tile's first row) x one token group (p, d, dq at its start),
// of which tv vectors of 16 tokens are used: 6 rows x 32 tokens, or for a group of at most 16
// tokens (batched decode) 12 rows x 16. first: acc starts at 0.
VNNI static inline __attribute__((always_inline)) void
micro8(const int gs, const int tv, const int8_t *w, int in, const int32_t *init, const float *s,
      const float *c2, const uint8_t *p, const float *d, const float *dq, int g0, int g1, float *acc,
      int first) {
    const int mr = tv == 2 ? MR : 2 * MR;
    __m512 f[2 * MR][2];
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < tv; v++)
            f[r][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + r * NT + 16 * v);
    for (int g = g0; g < g1; g++) {
        __m512i a[2 * MR][2];
        for (int r = 0; r < mr; r++)
            for (int v = 0; v < tv; v++) a[r][v] = _mm512_set1_epi32(init[g * RU + r]);
        const uint8_t *pg = p + (size_t)g * gs * NT;
        const int8_t *wg = w + (size_t)g * gs;
#pragma GCC unroll 8
        for (int k4 = 0; k4 < gs / 4; k4++) {
            __m512i x[2];
            for (int v = 0; v < tv; v++) x[v] = _mm512_loadu_si512(pg + k4 * 128 + 64 * v);
            for (int r = 0; r < mr; r++) {
                int32_t wv;
                memcpy(&wv, wg + (size_t)r * in + 4 * k4, 4);
                __m512i wb = _mm512_set1_epi32(wv);
                for (int v = 0; v < tv; v++) a[r][v] = _mm512_dpbusd_epi32(a[r][v], x[v], wb);
            }
        }
        const int blk = g * gs / 32;
        for (int v = 0; v < tv; v++) {
            const __m512 dv = _mm512_loadu_ps(d + blk * NT + 16 * v), qv = _mm512_loadu_ps(dq + g * NT + 16 * v);
            for (int r = 0; r < mr; r++) {
                const __m512 sr = _mm512_set1_ps(s[g * RU + r]), cr = _mm512_set1_ps(c2[g * RU + r]);
                f[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[r][v]), _mm512_mul_ps(sr, dv), f[r][v]);
                f[r][v] = _mm512_fmadd_ps(cr, qv, f[r][v]);
            }
        }
    }
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < tv; v++) _mm512_storeu_ps(acc + r * NT + 16 * v, f[r][v]);
}

typedef void (*micro8_fn)(const int8_t *, int, const int32_t *, const float *, const float *,
                         const uint8_t *, const float *, const float *, int, int, float *, int);
#define MICRO8(name, gs, tv)                                                                        \
    VNNI static void name(const int8_t *w, int in, const int32_t *init, const float *s,              \
                          const float *c2, const uint8_t *p, const float *d, const float *dq,       \
                          int g0, int g1, float *acc, int first) {                                  \
        micro8(gs, tv, w, in, init, s, c2, p, d, dq, g0, g1, acc, first);                             \
    }
MICRO8(micro8_32x2, 32, 2)
MICRO8(micro8_16x2, 16, 2)
MICRO8(micro8_32x1, 32, 1)
MICRO8(micro8_16x1, 16, 1)

VNNI static void matmul_vnni8(float *out, const float *x, int n, int in, uint32_t type, const void *w,
                        size_t row_bytes, int o, q_scratch *sc) {
    CHECK_INTERNAL(in % 32 == 0 && q_vnni_supported(type), "matmul_vnni8: type %u, %d columns", type, in);
    const int gs = group_of(type), ng = in / gs, n_tg = (n + NT - 1) / NT, nt = omp_get_max_threads();
    const size_t p_bytes = (size_t)n_tg * NT * in, d_bytes = (size_t)n_tg * NT * (in / 32) * 4,
                 dq_bytes = (size_t)n_tg * NT * ng * 4;
    const size_t unit_bytes = (size_t)RU * in + (size_t)ng * RU * 12, tmp_bytes = (size_t)in + in / 16 * 8,
                 acc_bytes = (size_t)n_tg * RU * NT * 4, per = unit_bytes + tmp_bytes + acc_bytes + 192;
    uint8_t *buf = q_scratch_get(sc, p_bytes + d_bytes + dq_bytes + (size_t)nt * per + 64);
    uint8_t *p = (uint8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    float *d = (float *)(p + p_bytes), *dq = (float *)((uint8_t *)d + d_bytes);
    uint8_t *per_thread = (uint8_t *)dq + dq_bytes;
    quantize_tokens8(x, n, in, gs, n_tg, p, d, dq);
    const int tv = n <= 16 ? 1 : 2, mr = tv == 2 ? MR : 2 * MR;   // at most 16 tokens: 12 x 16 tiles
    const micro8_fn tile = gs == 32 ? (tv == 2 ? micro8_32x2 : micro8_32x1) : (tv == 2 ? micro8_16x2 : micro8_16x1);
    const int n_units = (o + RU - 1) / RU, kc_groups = KC / gs;
#pragma omp parallel
    {
        uint8_t *mine = (uint8_t *)(((uintptr_t)(per_thread + (size_t)omp_get_thread_num() * per) + 63) & ~(uintptr_t)63);
        unit8 u = {(int8_t *)mine, NULL, NULL, NULL};
        u.init = (int32_t *)(mine + (size_t)RU * in);
        u.s = (float *)(u.init + (size_t)ng * RU);
        u.c2 = u.s + (size_t)ng * RU;
        uint8_t *tmp = (uint8_t *)(u.c2 + (size_t)ng * RU);
        float *acc = (float *)(((uintptr_t)(tmp + tmp_bytes) + 63) & ~(uintptr_t)63);   // (n_tg, RU, NT)
#pragma omp for schedule(static)
        for (int un = 0; un < n_units; un++) {
            const int r0 = un * RU, nr = o - r0 < RU ? o - r0 : RU;
            unpack_unit8(type, (const uint8_t *)w, row_bytes, r0, nr, in, gs, &u, tmp);
            for (int g0 = 0; g0 < ng; g0 += kc_groups) {
                const int g1 = ng - g0 < kc_groups ? ng : g0 + kc_groups;
                for (int tg = 0; tg < n_tg; tg++)
                    for (int m = 0; m < nr; m += mr)
                        tile(u.w + (size_t)m * in, in, u.init + m, u.s + m, u.c2 + m,
                             p + (size_t)tg * in * NT, d + (size_t)tg * (in / 32) * NT,
                             dq + (size_t)tg * ng * NT, g0, g1, acc + ((size_t)tg * RU + m) * NT, g0 == 0);
            }
            for (int t = 0; t < n; t++) {
                const float *src = acc + (size_t)(t / NT) * RU * NT + t % NT;
                float *dst = out + (size_t)t * o + r0;
                for (int r = 0; r < nr; r++) dst[r] = src[r * NT];
            }
        }
    }
}

// The peak of vpdpbusd (digits 1) or vpdpwssd (2) on all threads: 12 independent accumulators
// per step (no loads), timed over `steps`. Tera integer operations per second (a multiply-add = 2).
VNNI double q_vnni_peak_tops(int digits, int steps) {
    double t0 = omp_get_wtime();
    int nt = 1;
    int64_t sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
#pragma omp single
        nt = omp_get_num_threads();
        __m512i a[12], x = _mm512_set1_epi16(1), y = _mm512_set1_epi16(2);
        for (int j = 0; j < 12; j++) a[j] = _mm512_set1_epi32(j);
        for (int i = 0; i < steps; i++) {
            if (digits == 1)
                for (int j = 0; j < 12; j++) a[j] = _mm512_dpbusd_epi32(a[j], x, y);
            else
                for (int j = 0; j < 12; j++) a[j] = _mm512_dpwssd_epi32(a[j], x, y);
            __asm__ volatile("" : "+v"(x), "+v"(y));
        }
        for (int j = 0; j < 12; j++) sink += _mm512_reduce_add_epi32(a[j]);
    }
    double s = omp_get_wtime() - t0;
    return sink == 42 ? 0 : 2.0 * (digits == 1 ? 64 : 32) * 12 * (double)steps * nt / s / 1e12;
}

void q_matmul_vnni(float *out, const float *x, int n, int in, uint32_t type, const void *w,
                   size_t row_bytes, int o, int digits, q_scratch *sc) {
    (digits == 1 ? matmul_vnni8 : matmul_vnni16)(out, x, n, in, type, w, row_bytes, o, sc);
}
