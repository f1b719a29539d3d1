// qgemm/qgemm_avx512.c — the products on AVX-512 VNNI (vpdpbusd: 64 products an instruction; target
// attributes, run only where q_isa_pick finds them): an unpacked row against the digits, F16 /
// BF16 rows against fp32, and fused kernels that read blocks directly, one or four activation rows
// at a time: Q4_0, Q4_1, Q8_0 per 32-block, Q4_K and Q6_K per super-block with integer sub-block
// scales. Q4_K's 16-row strips: qgemm_strip.c.
#include "../weights/dequant.h"
#include "internal.h"

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
AVX512 float
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

__attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c"))) float
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

// The 32 u8 of one 32-element block of Q4_0 / Q4_1 / Q8_0 at b.
AVX512 static inline __m256i block32_u(uint32_t type, const uint8_t *b) {
    if (type == GGML_Q4_0) return nibbles32_v(b + 2);
    if (type == GGML_Q4_1) return nibbles32_v(b + 4);
    return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), _mm256_set1_epi8((char)0x80));
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


// The one-row and four-row entries of each 32-block type (one code per row: the same bits)
#define BLK32_KERNELS(name, TYPE)                                                                  \
    AVX512 static float dot_##name##_avx512(const uint8_t *b, const int8_t *q, const int8_t *ql,    \
                                            const float *d, const float *a, int cols) {             \
        return dot_blk32_avx512(TYPE, b, q, ql, d, a, cols);                                        \
    }                                                                                               \
    AVX512 static void dot4_##name##_avx512(const uint8_t *b, const act_row *x, int cols, float *out) { \
        dot4_blk32_avx512(TYPE, b, x, cols, out);                                                   \
    }
BLK32_KERNELS(q4_0, GGML_Q4_0)
BLK32_KERNELS(q4_1, GGML_Q4_1)
BLK32_KERNELS(q8_0, GGML_Q8_0)

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
dot_blk_fn *fused_dot(enum q_isa isa, uint32_t type, int digits) {
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
dot4_fn *fused_dot4(enum q_isa isa, uint32_t type, int digits) {
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
