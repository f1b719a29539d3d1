// qgemm/qgemm_vnni.c — prefill products in integer arithmetic on AVX-512 VNNI (see qgemm.h).
//
//   out (n, o) = x (n, in) @ W (o, in)^T, W in any block type with an 8-bit form (q_unpack_row).
//
// Weights, per unit of RU rows per thread: the 8-bit form (w = s u + m, s and m per scale group g
// of GS = 32 elements, 16 for Q6_K) unpacked row-major as w' = u - c (c: the type's midpoint, so
// w' fits 8 bits), with per row and group s, c2 = s c + m and init. Activations, once per call,
// interleaved for 32 tokens so that one zmm holds 16 tokens x 4 bytes. The int32 lanes of a
// group start at init; per group, after its products (sum_g w' a, exact):
//   y += s d (lanes) + c2 (d Q)
// with d the activations' step of that 32-block and d Q their scaled sum over it, both per token
// and precomputed (Q6_K: c2 = 32 s - 32 s = 0, one FMA per group, not two). Two precisions:
//
// digits 2 (the default): the int8 path's two digits per element (q_quantize_row: x ~ (256 q + l)
//   d, d = max|x_blk| / 127 / 256). Tiles of 32 tokens (W_I16): a = 256 q + l as int16, 32 tokens
//   x 2 int16 per 2 columns, w' as int16, init = 0; one vpdpwssd adds 16 tokens' 2 products a w'
//   into each int32 lane — exact: |a| <= 32639, |w'| <= 255, a group's sum < 2^31. At most 16
//   tokens (batched decode, short prompts: W_B2): w' as int8 and each digit + 128 apart, vpdpbusd
//   per digit into two sums from init = -128 W' (W' = sum_g w'), joined as 256 S_hi + S_lo — the
//   same integer, so the same outputs bit for bit, with half the bytes to unpack and broadcast.
//   Error against the fp32 product of the dequantised weights: the int8 path's, sum_i |w_i|
//   d_blk(i) + fp32 summation.
// digits 1 (--weights fast): one 8-bit digit, q = round(x / d), d = max|x_blk| / 127 (llama.cpp's
//   Q8_0 rounding), stored unsigned p = q + 128, 32 tokens x 4 bytes per 4 columns; w' as int8,
//   init = -128 W', since sum_g q u = (sum_g p w' - 128 W') + c Q. One vpdpbusd adds 4 products
//   per lane: twice vpdpwssd's. Error: |q d - x| <= d / 2 per element, sum_i |w_i| d_blk(i) / 2 +
//   fp32 summation. llama.cpp's precision — which turned the default model's greedy chat answer
//   into nonsense, as llama.cpp's own run does (bench/RESULTS.md): not the default.
//
// Micro tiles: 6 weight rows x 32 tokens (12 x 16 for at most 16 tokens; W_B2: 8 x 16), int32 and
// fp32 accumulators, over `in` in passes of KC columns. tests/test_qgemm.c checks both bounds and
// that the two forms of digits 2 agree bit for bit.
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "../util/check.h"
#include "../weights/dequant.h"
#include "../weights/gguf.h"
#include "internal.h"
#include "qgemm.h"

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))

#define MR 6          // weight rows per micro tile
#define RU 24         // weight rows per unit of work (MR x 4: unpacked once, used by every token)
#define NT 32         // tokens per micro tile (two vectors of 16)
#define KC 256        // columns per pass: a pass's slice of a token group and of the unit's rows
                      // stay in L1 while the unit's micro tiles reuse them

// The weights' form in a unit, all of w' = u - c (c: the type's midpoint) with c2 = s c + m:
// W_S8 (digits 1) and W_B2 (digits 2, at most 16 tokens): w' as int8, init = -128 W' (W' = sum_g
// w'); W_I16 (digits 2, tiles of 32 tokens): w' as int16, init = 0. W_B2 multiplies each digit
// (stored + 128, unsigned) apart by vpdpbusd into two int32 sums that start at init, joined per
// group as 256 S_hi + S_lo = sum_g w' (256 q + l): W_I16's vpdpwssd sum, so that both forms give
// the same outputs bit for bit, with half the bytes to unpack and to broadcast.
enum { W_S8 = 1, W_I16 = 2, W_B2 = 3 };
static int wbytes(int wf) { return wf == W_I16 ? 2 : 1; }

// The scale group of a type's 8-bit form, and its midpoint (digits 1: u - c fits a signed byte).
static int group_of(uint32_t type) { return type == GGML_Q6_K ? 16 : 32; }
static int mid_of(uint32_t type) {
    switch (type) {
    case GGML_Q4_0: case GGML_Q4_1: case GGML_Q4_K: return 8;
    case GGML_Q5_0: case GGML_Q5_1: case GGML_Q5_K: return 16;
    case GGML_Q6_K: return 32;
    default: return 128;   // Q8_0: u = q + 128
    }
}

int q_vnni_supported(uint32_t type) {
    return q_type_supported(type) && type != GGML_F16 && type != GGML_BF16;
}

// ---- activations ---------------------------------------------------------------------------------

// Token t of the call (tg = t / NT, lane = t % NT) has its 4-byte column words at
// a + (tg * in/per * NT + k/per * NT + lane) * 4 (per = 4 / digits elements a word), its steps at
// d[(tg * in/32 + b) * NT + lane], its scaled sums of 32-blocks at dq[(tg * in/32 + b) * NT + lane]
// (the c2 term of the types with 32-groups; Q6_K's 16-groups have c2 = 0 and read none).

// digits 2: the digits are q_quantize_row's (the int8 path's, bit for bit): for the int16 tiles
// (W_I16) joined as 256 hi + lo, int16 pairs (k, k + 1); for the byte tiles (W_B2) + 128
// (unsigned), per 4 columns a word of the 4 high digits, then a word of the 4 low ones. tmp: per
// thread 2 in + in/32 * 4 + in/16 * 4 bytes.
VNNI static void tokens_two(int wf, const float *x, int t, int in, uint32_t *at, float *dt,
                            float *qt, uint8_t *tmp) {
    const int nb = in / 32;
    int8_t *q = (int8_t *)tmp;
    float *db = (float *)(q + 2 * in), *a16 = db + nb;
    q_quantize_row(Q_ISA_AVX512, x + (size_t)t * in, in, q, db, a16);
    for (int k = 0; k < in; k += 16) {
        const __m128i hi = _mm_loadu_si128((const __m128i *)(q + k)),
                      lo = _mm_loadu_si128((const __m128i *)(q + in + k));
        uint32_t w[8];
        if (wf == W_B2) {   // + 128 = flipping the sign bit
            _mm_storeu_si128((__m128i *)w, _mm_xor_si128(hi, _mm_set1_epi8((char)0x80)));
            _mm_storeu_si128((__m128i *)(w + 4), _mm_xor_si128(lo, _mm_set1_epi8((char)0x80)));
            for (int j = 0; j < 4; j++) at[(size_t)(k / 2 + 2 * j) * NT] = w[j], at[(size_t)(k / 2 + 2 * j + 1) * NT] = w[4 + j];
        } else {
            _mm256_storeu_si256((__m256i *)w, _mm256_add_epi16(_mm256_slli_epi16(_mm256_cvtepi8_epi16(hi), 8),
                                                               _mm256_cvtepi8_epi16(lo)));
            for (int j = 0; j < 8; j++) at[(size_t)(k / 2 + j) * NT] = w[j];
        }
    }
    for (int b = 0; b < nb; b++) dt[b * NT] = db[b], qt[b * NT] = a16[2 * b] + a16[2 * b + 1];
}

// digits 1: q = round(x / d) per 32-block, stored as q + 128.
VNNI static void tokens_one(const float *x, int t, int in, uint32_t *pt, float *dt, float *qt) {
    const float *xt = x + (size_t)t * in;
    for (int b = 0; b < in / 32; b++) {
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
        qt[b * NT] = step * (float)(sum[0] + sum[1]);
    }
}

// x (n, in) -> a, d, dq for n_tg groups of NT tokens, in the activations' form for the weights'
// form wf; tokens past n contribute nothing (a zero digit: 0, or 128 unsigned; d = dq = 0).
VNNI static void quantize_tokens(int wf, const float *x, int n, int in, int n_tg, uint32_t *a,
                                 float *d, float *dq, uint8_t *tmp) {
    const int digits = wf == W_S8 ? 1 : 2, nb = in / 32, words = in / (4 / digits);
    const size_t per = (size_t)2 * in + (size_t)nb * 4 + (size_t)in / 16 * 4;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n_tg * NT; t++) {
        const int tg = t / NT, lane = t % NT;
        uint32_t *at = a + (size_t)tg * words * NT + lane;
        float *dt = d + (size_t)tg * nb * NT + lane, *qt = dq + (size_t)tg * nb * NT + lane;
        if (t >= n) {
            for (int k = 0; k < words; k++) at[(size_t)k * NT] = wf == W_I16 ? 0 : 0x80808080u;
            for (int b = 0; b < nb; b++) dt[b * NT] = qt[b * NT] = 0;
        } else if (wf != W_S8)
            tokens_two(wf, x, t, in, at, dt, qt, tmp + (size_t)omp_get_thread_num() * per);
        else
            tokens_one(x, t, in, at, dt, qt);
    }
}

// ---- weights -------------------------------------------------------------------------------------

// A unit: w (RU, in) row-major with a row stride of ld elements (w' as int16 for W_I16, else
// int8), and per row r and group g its init, s and c2: at [g * RU + r], a group's rows side by
// side, which micro's tiles address from one pointer; for the byte form (W_B2, at most 16
// tokens) at [r * gn + g], a row's groups side by side, so that a K-quant super-block's are
// written as one vector each (there the unpacking costs about as much as the products; in
// micro's tiles that layout took 3 % more time at 128 tokens). ld is in plus one cache line: at a
// stride of a power of two (4 KB for 2048 columns) a micro tile's 12 rows at the same column fall
// in one set of the 8-way L1 and evict each other.
typedef struct { void *w; int ld, gn, by_row; int32_t *init; float *s, *c2; } unit;

static size_t unit_at(const unit *u, int g, int r) { return u->by_row ? (size_t)r * u->gn + g : (size_t)g * RU + r; }
static void unit_group(unit *u, int g, int r, int32_t init, float s, float c2) {
    const size_t at = unit_at(u, g, r);
    u->init[at] = init, u->s[at] = s, u->c2[at] = c2;
}

// The cache lines of [p, p + bytes) on their way to L1 (l2: to L2 only, which holds more
// misses in flight without stalling the core).
static inline void prefetch_lines(const uint8_t *p, size_t bytes, int l2) {
    for (uintptr_t at = (uintptr_t)p & ~(uintptr_t)63; at < (uintptr_t)p + bytes; at += 64)
        if (l2) _mm_prefetch((const char *)at, _MM_HINT_T1);
        else _mm_prefetch((const char *)at, _MM_HINT_T0);
}

// One Q4_K super-block b (columns i .. i+255) straight into unit row r (u = nibble, s = d sc_j, m =
// -dmin m_j; the 8 sub-blocks' scales and mins decoded at once).
VNNI static void q4_k_unit_block(int wf, const uint8_t *b, int i, unit *u, int r) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
    {
        uint16_t h[2];
        memcpy(h, b, 4);
        const float d = _cvtsh_ss(h[0]), dmin = _cvtsh_ss(h[1]);
        uint64_t sc8, mn8;
        k_scales8(b + 4, &sc8, &mn8);
        float sc[8], mn[8];
        _mm256_storeu_ps(sc, _mm256_mul_ps(_mm256_set1_ps(d), u8x8_to_ps(sc8)));
        _mm256_storeu_ps(mn, _mm256_mul_ps(_mm256_set1_ps(-dmin), u8x8_to_ps(mn8)));
        for (int j = 0; j < 8; j++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (j / 2)));
            q = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(q, 4) : q, lo4);
            const int g = i / 32 + j;
            const float s = sc[j], m = mn[j];
            const size_t at = (size_t)r * u->ld + i + 32 * j;
            if (wf == W_I16) {
                _mm512_storeu_si512((int16_t *)u->w + at, _mm512_cvtepi8_epi16(_mm256_sub_epi8(q, eight)));
                unit_group(u, g, r, 0, s, s * 8.0f + m);
                continue;
            }
            _mm256_storeu_si256((__m256i *)((int8_t *)u->w + at), _mm256_sub_epi8(q, eight));
            __m256i s4 = _mm256_sad_epu8(q, _mm256_setzero_si256());   // 4 partial sums of u
            __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
            int sum = (int)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 8 * 32;
            unit_group(u, g, r, -128 * sum, s, s * 8.0f + m);
        }
    }
}

// One Q6_K super-block b (columns i .. i+255) straight into unit row r (u = the 6-bit value, s =
// d sc_g and m = -32 s per 16-group g; digits 1: w' = u - 32, so init = -128 sum_g w' and c2 =
// 32 s + m = 0).
VNNI static void q6_k_unit_block(int wf, const uint8_t *b, int i, unit *u, int r) {
    {
        uint16_t h;
        memcpy(&h, b + 208, 2);
        const __m128i sc = _mm_loadu_si128((const __m128i *)(b + 192));
        float s16[16];
        _mm512_storeu_ps(s16, _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(h)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc))));
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = b + 64 * half;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql),
                          l1 = _mm256_loadu_si256((const __m256i *)(ql + 32)),
                          hb = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * half));
            for (int k = 0; k < 4; k++) {
                const __m256i q = q6k_u32(l0, l1, hb, k);   // groups j, j + 1 of the super-block
                const int j = 8 * half + 2 * k, g = i / 16 + j;
                const size_t at = (size_t)r * u->ld + i + 16 * j;
                if (wf == W_I16) {
                    _mm512_storeu_si512((int16_t *)u->w + at,
                                        _mm512_sub_epi16(_mm512_cvtepu8_epi16(q), _mm512_set1_epi16(32)));
                    unit_group(u, g, r, 0, s16[j], s16[j] * 32.0f + -32.0f * s16[j]);
                    unit_group(u, g + 1, r, 0, s16[j + 1], s16[j + 1] * 32.0f + -32.0f * s16[j + 1]);
                    continue;
                }
                _mm256_storeu_si256((__m256i *)((int8_t *)u->w + at), _mm256_sub_epi8(q, _mm256_set1_epi8(32)));
                __m256i s4 = _mm256_sad_epu8(q, _mm256_setzero_si256());   // 8-byte sums of u
                __m128i lo = _mm256_castsi256_si128(s4), hi = _mm256_extracti128_si256(s4, 1);
                int sum0 = (int)(_mm_cvtsi128_si64(lo) + _mm_extract_epi64(lo, 1)) - 32 * 16;
                int sum1 = (int)(_mm_cvtsi128_si64(hi) + _mm_extract_epi64(hi, 1)) - 32 * 16;
                unit_group(u, g, r, -128 * sum0, s16[j], s16[j] * 32.0f + -32.0f * s16[j]);
                unit_group(u, g + 1, r, -128 * sum1, s16[j + 1], s16[j + 1] * 32.0f + -32.0f * s16[j + 1]);
            }
        }
    }
}

// The byte form (W_B2) of one Q4_K super-block b (columns i .. i+255) of unit row r: as
// q4_k_unit_block, with the 8 sub-blocks' s, c2 and init formed and stored as one vector each
// (the unit's [r * gn + g] layout).
VNNI static void q4_k_unit_block_b2(const uint8_t *b, int i, unit *u, int r) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    uint16_t h[2];
    memcpy(h, b, 4);
    uint64_t sc8, mn8;
    k_scales8(b + 4, &sc8, &mn8);
    const size_t at = (size_t)r * u->gn + i / 32;   // (the super-block's first group)
    const __m256 s = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(h[0])), u8x8_to_ps(sc8)),
                 m = _mm256_mul_ps(_mm256_set1_ps(-_cvtsh_ss(h[1])), u8x8_to_ps(mn8));
    _mm256_storeu_ps(u->s + at, s);
    _mm256_storeu_ps(u->c2 + at, _mm256_add_ps(_mm256_mul_ps(s, _mm256_set1_ps(8.0f)), m));   // (8 s: exact)
    __m512i sums[4];   // sums[c]: dwords 0 and 8 = the sums of u over sub-blocks 2c and 2c + 1
    for (int c = 0; c < 4; c++) {   // qs bytes [32c, + 32): sub-blocks 2c (low nibbles), 2c + 1 (high)
        const __m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * c));
        const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, lo4)),
                                             _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4), 1);
        _mm512_storeu_si512((int8_t *)u->w + (size_t)r * u->ld + i + 64 * c, _mm512_sub_epi8(q, _mm512_set1_epi8(8)));
        __m512i t = _mm512_sad_epu8(q, _mm512_setzero_si512());                  // 4 qwords per sub-block
        t = _mm512_add_epi64(t, _mm512_shuffle_epi32(t, _MM_PERM_BADC));         // per 128 bits
        sums[c] = _mm512_add_epi64(t, _mm512_shuffle_i64x2(t, t, _MM_SHUFFLE(2, 3, 0, 1)));
    }
    const __m512i pick = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 24, 16, 8, 0);
    const __m512i lo = _mm512_permutex2var_epi32(sums[0], pick, sums[1]),   // dwords 0-3: sub-blocks 0-3
                  hi = _mm512_permutex2var_epi32(sums[2], pick, sums[3]);   // 4-7
    const __m256i all = _mm256_set_m128i(_mm512_castsi512_si128(hi), _mm512_castsi512_si128(lo));
    // init = -128 (sum u - 8 * 32)
    _mm256_storeu_si256((__m256i *)(u->init + at), _mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(256), all), 7));
}

// The byte form (W_B2) of one Q6_K super-block b (columns i .. i+255) of unit row r: as
// q6_k_unit_block, with the 16 groups' s, c2 (0) and init formed and stored as one vector each.
VNNI static void q6_k_unit_block_b2(const uint8_t *b, int i, unit *u, int r) {
    uint16_t h;
    memcpy(&h, b + 208, 2);
    const size_t at = (size_t)r * u->gn + i / 16;   // (the super-block's first group)
    _mm512_storeu_ps(u->s + at, _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(h)),
                                              _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 192))))));
    _mm512_storeu_ps(u->c2 + at, _mm512_setzero_ps());
    __m512i sums[4];   // sums[2 half + k/2]: dword 4l = the sum of u over group 8 half + 4 (k/2) + l
    for (int half = 0; half < 2; half++) {
        const uint8_t *ql = b + 64 * half;
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql),
                      l1 = _mm256_loadu_si256((const __m256i *)(ql + 32)),
                      hb = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * half));
        for (int k = 0; k < 4; k += 2) {   // groups 8 half + 2k .. + 3: 64 elements
            const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(q6k_u32(l0, l1, hb, k)), q6k_u32(l0, l1, hb, k + 1), 1);
            _mm512_storeu_si512((int8_t *)u->w + (size_t)r * u->ld + i + 128 * half + 32 * k, _mm512_sub_epi8(q, _mm512_set1_epi8(32)));
            const __m512i sad = _mm512_sad_epu8(q, _mm512_setzero_si512());   // 2 qwords per group
            sums[2 * half + k / 2] = _mm512_add_epi64(sad, _mm512_shuffle_epi32(sad, _MM_PERM_BADC));
        }
    }
    const __m512i pick = _mm512_set_epi32(28, 24, 20, 16, 12, 8, 4, 0, 28, 24, 20, 16, 12, 8, 4, 0);
    const __m512i lo = _mm512_permutex2var_epi32(sums[0], pick, sums[1]),   // groups 0-7 (twice)
                  hi = _mm512_permutex2var_epi32(sums[2], pick, sums[3]);   // groups 8-15
    const __m512i all = _mm512_inserti64x4(lo, _mm512_castsi512_si256(hi), 1);
    // init = -128 (sum u - 32 * 16)
    _mm512_storeu_si512(u->init + at, _mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(512), all), 7));
}

// rows r0 .. r0 + nr of W (nr <= RU) -> u; rows past nr are zero (their outputs are not written).
// tmp: in + in/16 * 8 bytes.
VNNI static void unpack_unit(int wf, uint32_t type, const uint8_t *w, size_t row_bytes, int r0,
                             int nr, int in, int gs, unit *u, uint8_t *tmp) {
    const int ng = in / gs, c = mid_of(type);
    float *s16 = (float *)(tmp + in), *m16 = s16 + in / 16;
    for (int r = nr; r < RU; r++) {
        memset((uint8_t *)u->w + (size_t)r * u->ld * wbytes(wf), 0, (size_t)in * wbytes(wf));
        for (int g = 0; g < ng; g++) unit_group(u, g, r, 0, 0, 0);
    }
    if (type == GGML_Q4_K || type == GGML_Q6_K) {
        // super-block by super-block, the rows inner (in the [g * RU + r] layout a group's rows'
        // init, s and c2 land side by side, not a cache line apart row after row)
        const size_t bb = type == GGML_Q4_K ? 144 : 210;
        for (int i = 0; i < in; i += 256)
            for (int r = 0; r < nr; r++) {
                const uint8_t *b = w + (size_t)(r0 + r) * row_bytes + (size_t)(i / 256) * bb;
                if (i + 256 < in) prefetch_lines(b + bb, bb, 0);   // the row's next super-block,
                                                                 // wanted after the other rows'
                if (wf == W_B2) {
                    if (type == GGML_Q4_K) q4_k_unit_block_b2(b, i, u, r);
                    else q6_k_unit_block_b2(b, i, u, r);
                } else if (type == GGML_Q4_K) q4_k_unit_block(wf, b, i, u, r);
                else q6_k_unit_block(wf, b, i, u, r);
            }
        return;
    }
    CHECK_INTERNAL(gs == 32, "q_matmul_vnni: type %u unpacked by rows with groups of %d", type, gs);
    for (int r = 0; r < nr; r++) {
        q_unpack_row(type, w + (size_t)(r0 + r) * row_bytes, in, tmp, s16, m16);
        for (int g = 0; g < ng; g++) {   // both 16-groups of a 32-group share s, m
            const float s = s16[2 * g], m = m16[2 * g];
            const __m256i ug = _mm256_loadu_si256((const __m256i *)(tmp + g * gs));
            if (wf == W_I16) {   // (u - c as int16: -c <= u - c <= 255 - c)
                __m512i v = _mm512_sub_epi16(_mm512_cvtepu8_epi16(ug), _mm512_set1_epi16((short)c));
                _mm512_storeu_si512((int16_t *)u->w + (size_t)r * u->ld + g * gs, v);
                unit_group(u, g, r, 0, s, s * (float)c + m);
                continue;
            }
            // (w' = u - c as int8: each type's u lies within c - 128 .. c + 127, mid_of)
            _mm256_storeu_si256((__m256i *)((int8_t *)u->w + (size_t)r * u->ld + g * gs),
                                _mm256_sub_epi8(ug, _mm256_set1_epi8((char)c)));
            const __m256i s4 = _mm256_sad_epu8(ug, _mm256_setzero_si256());   // 4 partial sums of u
            const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
            const int sum = (int)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - c * gs;
            unit_group(u, g, r, -128 * sum, s, s * (float)c + m);
        }
    }
}

// ---- the micro kernel and the driver -------------------------------------------------------------

// acc (mr rows x NT tokens, fp32, row-major) += groups [g0, g1) of mr unit rows (w: the first row,
// rows ld elements apart; init/s/c2 offset to the tile's first row, at [g * RU + r]; gn unused,
// micro_b2's) x one token group (a, d, dq at
// its start), of which tv vectors of 16 tokens are used: 6 rows x 32 tokens, or for at most 16
// tokens 12 rows x 16 (digits 1; digits 2 there takes micro_b2). first: acc starts at 0.
VNNI static inline __attribute__((always_inline)) void
micro(const int digits, const int gs, const int tv, const uint8_t *w, int ld, int gn, const int32_t *init,
      const float *s, const float *c2, const uint8_t *a, const float *d, const float *dq, int g0,
      int g1, float *acc, int first) {
    const int mr = tv == 2 ? MR : 2 * MR, words = gs * digits / 4;   // 4-byte words per group
    (void)gn;
    __m512 f[2 * MR][2];
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < tv; v++)
            f[r][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + r * NT + 16 * v);
    for (int g = g0; g < g1; g++) {
        __m512i c[2 * MR][2];
        for (int r = 0; r < mr; r++)
            for (int v = 0; v < tv; v++)   // (digits 2: init is 0)
                c[r][v] = digits == 2 ? _mm512_setzero_si512() : _mm512_set1_epi32(init[g * RU + r]);
        const uint8_t *ag = a + (size_t)g * words * NT * 4, *wg = w + (size_t)g * words * 4;
#pragma GCC unroll 16   // whole: a rolled loop made GCC copy every accumulator each step
        for (int k = 0; k < words; k++) {
            __m512i x[2];
            for (int v = 0; v < tv; v++) x[v] = _mm512_loadu_si512(ag + k * NT * 4 + 64 * v);
            for (int r = 0; r < mr; r++) {
                int32_t wv;
                memcpy(&wv, wg + (size_t)r * ld * digits + 4 * k, 4);
                const __m512i wb = _mm512_set1_epi32(wv);
                for (int v = 0; v < tv; v++)
                    c[r][v] = digits == 2 ? _mm512_dpwssd_epi32(c[r][v], x[v], wb)
                                          : _mm512_dpbusd_epi32(c[r][v], x[v], wb);
            }
        }
        const int blk = g * gs / 32;
        for (int v = 0; v < tv; v++) {
            const __m512 dv = _mm512_loadu_ps(d + blk * NT + 16 * v), qv = _mm512_loadu_ps(dq + blk * NT + 16 * v);
            for (int r = 0; r < mr; r++) {
                const __m512 sr = _mm512_set1_ps(s[g * RU + r]), cr = _mm512_set1_ps(c2[g * RU + r]);
                f[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[r][v]), _mm512_mul_ps(sr, dv), f[r][v]);
                if (gs == 32) f[r][v] = _mm512_fmadd_ps(cr, qv, f[r][v]);   // (GS 16, Q6_K: c2 = 0)
            }
        }
    }
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < tv; v++) _mm512_storeu_ps(acc + r * NT + 16 * v, f[r][v]);
}

// The byte form's tile (W_B2, at most 16 tokens): acc (MB rows x NT, the first 16 tokens used) +=
// groups [g0, g1) of MB unit rows of int8 w' (rows ld bytes apart; init, s, c2 of row r and group
// g at [r * gn + g]) x one token group whose words alternate 4 high and 4 low digits + 128. Per group and row the two digits' products run in two
// int32 sums from init, joined as 256 S_hi + S_lo (W_I16's integer), then W_I16's fp32 fix-up.
#define MB 8
VNNI static inline __attribute__((always_inline)) void
micro_b2(const int gs, const uint8_t *w, int ld, int gn, const int32_t *init, const float *s, const float *c2,
         const uint8_t *a, const float *d, const float *dq, int g0, int g1, float *acc, int first) {
    const int quads = gs / 4;   // 4-column steps per group
    __m512 f[MB];
    for (int r = 0; r < MB; r++) f[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + r * NT);
    for (int g = g0; g < g1; g++) {
        __m512i h[MB], l[MB];
        for (int r = 0; r < MB; r++) h[r] = l[r] = _mm512_set1_epi32(init[r * gn + g]);
        const uint8_t *ag = a + (size_t)g * quads * 2 * NT * 4, *wg = w + (size_t)g * gs;
#pragma GCC unroll 8
        for (int k = 0; k < quads; k++) {
            const __m512i xh = _mm512_loadu_si512(ag + 2 * k * NT * 4),
                          xl = _mm512_loadu_si512(ag + (2 * k + 1) * NT * 4);
            for (int r = 0; r < MB; r++) {
                int32_t wv;
                memcpy(&wv, wg + (size_t)r * ld + 4 * k, 4);
                const __m512i wb = _mm512_set1_epi32(wv);
                h[r] = _mm512_dpbusd_epi32(h[r], xh, wb);
                l[r] = _mm512_dpbusd_epi32(l[r], xl, wb);
            }
        }
        const int blk = g * gs / 32;
        const __m512 dv = _mm512_loadu_ps(d + blk * NT), qv = _mm512_loadu_ps(dq + blk * NT);
        for (int r = 0; r < MB; r++) {
            const __m512i c = _mm512_add_epi32(_mm512_slli_epi32(h[r], 8), l[r]);
            f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c), _mm512_mul_ps(_mm512_set1_ps(s[r * gn + g]), dv), f[r]);
            if (gs == 32) f[r] = _mm512_fmadd_ps(_mm512_set1_ps(c2[r * gn + g]), qv, f[r]);
        }
    }
    for (int r = 0; r < MB; r++) _mm512_storeu_ps(acc + r * NT, f[r]);
}

typedef void (*micro_fn)(const uint8_t *, int, int, const int32_t *, const float *, const float *,
                         const uint8_t *, const float *, const float *, int, int, float *, int);
#define MICRO(name, digits, gs, tv)                                                                \
    VNNI static void name(const uint8_t *w, int ld, int gn, const int32_t *init, const float *s,     \
                          const float *c2, const uint8_t *a, const float *d, const float *dq,       \
                          int g0, int g1, float *acc, int first) {                                  \
        micro(digits, gs, tv, w, ld, gn, init, s, c2, a, d, dq, g0, g1, acc, first);                 \
    }
#define MICRO_B2(name, gs)                                                                         \
    VNNI static void name(const uint8_t *w, int ld, int gn, const int32_t *init, const float *s,     \
                          const float *c2, const uint8_t *a, const float *d, const float *dq,       \
                          int g0, int g1, float *acc, int first) {                                  \
        micro_b2(gs, w, ld, gn, init, s, c2, a, d, dq, g0, g1, acc, first);                          \
    }
MICRO_B2(micro_b2_32, 32)
MICRO_B2(micro_b2_16, 16)
MICRO(micro_2_32x2, 2, 32, 2)
MICRO(micro_2_16x2, 2, 16, 2)
MICRO(micro_1_32x2, 1, 32, 2)
MICRO(micro_1_16x2, 1, 16, 2)
MICRO(micro_1_32x1, 1, 32, 1)
MICRO(micro_1_16x1, 1, 16, 1)
static const micro_fn MICROS[2][2][2] = {   // [digits - 1][gs == 32][tv - 1]
    {{micro_1_16x1, micro_1_16x2}, {micro_1_32x1, micro_1_32x2}},
    {{micro_b2_16, micro_2_16x2}, {micro_b2_32, micro_2_32x2}},   // (at most 16 tokens: W_B2)
};

// k products sharing x (decode's Q/K/V and gate/up: the activations quantised once, every
// matrix's units in one parallel region). Unit un of the call is matrix j's unit un - first[j].
VNNI void q_matmul_vnni_multi(int k, float *const *out, const float *x, int n, int in,
                              const uint32_t *type, const void *const *w, const size_t *row_bytes,
                              const int *o, int digits, q_scratch *sc) {
    CHECK_INTERNAL(k >= 1 && k <= Q_MULTI_MAX && in % 32 == 0 && (digits == 1 || digits == 2),
                   "q_matmul_vnni: %d products, %d columns, %d digits", k, in, digits);
    int first[Q_MULTI_MAX + 1] = {0}, ng_max = in / 32;
    for (int j = 0; j < k; j++) {
        CHECK_INTERNAL(q_vnni_supported(type[j]), "q_matmul_vnni: type %u", type[j]);
        first[j + 1] = first[j] + (o[j] + RU - 1) / RU;
        if (in / group_of(type[j]) > ng_max) ng_max = in / group_of(type[j]);
    }
    const int nb = in / 32, n_tg = (n + NT - 1) / NT, nt = omp_get_max_threads(), n_units = first[k];
    const int tv = n <= 16 ? 1 : 2;   // at most 16 tokens: one vector of tokens per tile
    const int wf = digits == 1 ? W_S8 : tv == 1 ? W_B2 : W_I16, wb = wbytes(wf);
    const int mr = wf == W_B2 ? MB : tv == 2 ? MR : 2 * MR;
    const size_t a_bytes = (size_t)n_tg * NT * in * digits, d_bytes = (size_t)n_tg * NT * nb * 4,
                 qt_bytes = (size_t)nt * ((size_t)2 * in + (size_t)in / 32 * 4 + (size_t)in / 16 * 4);
    const int ld = in + 64 / wb;   // (unit)
    const size_t unit_bytes = (size_t)RU * ld * wb + (size_t)ng_max * RU * 12,
                 tmp_bytes = (size_t)in + in / 16 * 8, acc_bytes = (size_t)n_tg * RU * NT * 4,
                 per = unit_bytes + tmp_bytes + acc_bytes + 192;
    uint8_t *buf = q_scratch_get(sc, a_bytes + 2 * d_bytes + qt_bytes + (size_t)nt * per + 64);
    uint8_t *a = (uint8_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    float *d = (float *)(a + a_bytes), *dq = (float *)((uint8_t *)d + d_bytes);
    uint8_t *qtmp = (uint8_t *)dq + d_bytes, *per_thread = qtmp + qt_bytes;
    quantize_tokens(wf, x, n, in, n_tg, (uint32_t *)a, d, dq, qtmp);
#pragma omp parallel
    {
        uint8_t *mine = (uint8_t *)(((uintptr_t)(per_thread + (size_t)omp_get_thread_num() * per) + 63) & ~(uintptr_t)63);
        unit u = {mine, ld, ng_max, wf == W_B2, NULL, NULL, NULL};
        u.init = (int32_t *)(mine + (size_t)RU * ld * wb);
        u.s = (float *)(u.init + (size_t)ng_max * RU);
        u.c2 = u.s + (size_t)ng_max * RU;
        uint8_t *tmp = (uint8_t *)(u.c2 + (size_t)ng_max * RU);
        float *acc = (float *)(((uintptr_t)(tmp + tmp_bytes) + 63) & ~(uintptr_t)63);   // (n_tg, RU, NT)
#pragma omp for schedule(guided)
        for (int un = 0; un < n_units; un++) {
            int j = 0;
            while (un >= first[j + 1]) j++;
            const int gs = group_of(type[j]), ng = in / gs, kc_groups = KC / gs;
            const int r0 = (un - first[j]) * RU, nr = o[j] - r0 < RU ? o[j] - r0 : RU;
            const uint8_t *wj = w[j];
            const micro_fn tile = MICROS[digits - 1][gs == 32][tv - 1];
            // the next unit, maybe of the next matrix: rows [rn0, rn0 + rn) of wn
            int jn = j, rn0 = r0 + RU;
            if (rn0 >= o[j]) jn = j + 1, rn0 = 0;
            const int rn = un + 1 >= n_units ? 0 : o[jn] - rn0 < RU ? o[jn] - rn0 : RU;
            unpack_unit(wf, type[j], wj, row_bytes[j], r0, nr, in, gs, &u, tmp);
            for (int g0 = 0; g0 < ng; g0 += kc_groups) {
                const int g1 = ng - g0 < kc_groups ? ng : g0 + kc_groups;
                // the next unit's blocks, a pass's share of each row, on their way while this
                // pass computes (its unpacking would otherwise wait on memory for every line)
                if (rn > 0) {
                    const size_t lo = row_bytes[jn] * g0 / ng, hi = row_bytes[jn] * g1 / ng;
                    for (int r = 0; r < rn; r++)
                        prefetch_lines((const uint8_t *)w[jn] + (size_t)(rn0 + r) * row_bytes[jn] + lo, hi - lo, 1);
                }
                for (int tg = 0; tg < n_tg; tg++)
                    for (int m = 0; m < nr; m += mr)
                        tile((const uint8_t *)u.w + (size_t)m * ld * wb, ld, ng_max, u.init + unit_at(&u, 0, m),
                             u.s + unit_at(&u, 0, m), u.c2 + unit_at(&u, 0, m), a + (size_t)tg * in * digits * NT, d + (size_t)tg * nb * NT,
                             dq + (size_t)tg * nb * NT, g0, g1, acc + ((size_t)tg * RU + m) * NT, g0 == 0);
            }
            for (int t = 0; t < n; t++) {
                const float *src = acc + (size_t)(t / NT) * RU * NT + t % NT;
                float *dst = out[j] + (size_t)t * o[j] + r0;
                for (int r = 0; r < nr; r++) dst[r] = src[r * NT];
            }
        }
    }
}

VNNI void q_matmul_vnni(float *out, const float *x, int n, int in, uint32_t type, const void *w,
                        size_t row_bytes, int o, int digits, q_scratch *sc) {
    q_matmul_vnni_multi(1, &out, x, n, in, &type, &w, &row_bytes, &o, digits, sc);
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
