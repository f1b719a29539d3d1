// qgemm/qgemm_avx2.c — the products on AVX2 + FMA (CPUs without AVX-512, and SIFT_ISA=avx2): an
// unpacked row against the digits (vpmaddwd), F16 / BF16 rows against fp32, and fused kernels
// that read Q4_0, Q4_1, Q8_0, Q4_K and Q6_K blocks directly, one or four activation rows at a time.
#include "../weights/dequant.h"
#include "internal.h"

// one 16-group per step: u (u8 -> i16) * q (i8 -> i16), vpmaddwd pairs -> 8 x i32
__attribute__((target("avx2,fma"))) float
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

__attribute__((target("avx2,fma,f16c"))) float
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

// ---- fused AVX2 kernels: blocks read directly, 16 products per vpmaddwd -----------------------
// For CPUs without AVX-512 (and under SIFT_ISA=avx2): the products of qgemm_avx512.c's kernels,
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
dot16x4_fn *fused16_dot4(enum q_isa isa, uint32_t type) {
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
dot16_fn *fused16_dot(enum q_isa isa, uint32_t type) {
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
