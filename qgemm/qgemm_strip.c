// qgemm/qgemm_strip.c — Q4_K on AVX-512, 16 weight rows at a time (q_rows_strip, qgemm.h): the strip
// kernel (q4k_strip: the rows in the vector lanes), its one-activation-row twin in two groups of 8
// rows (q4k_rows8), and the form they run in (prefetch level; which of the two takes a decode
// row: q_strip_get / q_strip_set; qgemm_cpu.c's q_strip_tune times them). Every form, the same bits.
#include "../util/check.h"
#include "internal.h"

// ---- Q4_K, 16 weight rows at once: the rows in the lanes (AVX-512) ---------------------------
// The row kernels of qgemm_avx512.c keep one weight row per vector, so each 64 products need
// vpmaddubsw and vpdpwssd (the sub-block scales differ within the vector). q4k_strip transposes a
// strip of 16 rows on the fly instead: lane l of a vector holds 4 bytes of one row's quants at one
// offset of the super-block, so one vpdpbusd per digit (the activation's 4 bytes at that offset
// broadcast) adds 4 products to each of the 16 rows, and a sub-block's 32 products per row end in
// one int32 lane, meeting their scale once per sub-block: y += d sc_j d_x (256 hi_j + lo_j) - dmin
// mn_j a_j, with 256 hi_j + lo_j < 2^24 (32 products of at most 15 * 127 per digit) converted
// exactly. The activations are the K form's (two digits per 256-block), so the bound of qgemm.h
// holds as for q4k_rows; the fp32 sums run per sub-block, the same for every row count. Per
// activation row it keeps two int32 sums and one fp32 sum, so four rows share each transpose in the
// registers. Measured against q4k_rows: bench/RESULTS.md.
// acc += u . the 4 bytes at p broadcast (vpdpbusd with an embedded broadcast: one instruction, the
// load folded in, which GCC does not form from the intrinsics)
AVX512 static inline __m512i dpbusd_b(__m512i acc, __m512i u, const int8_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)p));
    return acc;
}

// Lane l of a strip's vectors holds row sigma(l) of the strip: lanes 0-3 rows 0-3, 4-7 rows 8-11,
// 8-11 rows 4-7, 12-15 rows 12-15 (what the transposes below give without a last permute).
// 32 bytes at offset off of each super-block (16 rows, row_bytes apart from b) -> raw[8]: raw[d]
// lane l = row sigma(l)'s dword d of those bytes. Two rows per load (r in the low 256 bits, r + 8
// in the high), then an 8 x 8 transpose within each 256-bit half.
AVX512 static inline __attribute__((always_inline)) void
strip_t8(const uint8_t *b, size_t row_bytes, int off, __m512i *raw) {
    __m512i z[8], a[8];
    for (int r = 0; r < 8; r++)
        z[r] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b + r * row_bytes + off))),
                                  _mm256_loadu_si256((const __m256i *)(b + (r + 8) * row_bytes + off)), 1);
    for (int i = 0; i < 4; i++)
        a[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]), a[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    for (int i = 0; i < 2; i++) {   // z[4i + k]: rows 4i..4i+3 (and + 8), dword k (128-bit lanes 0, 2) and k + 4 (1, 3)
        z[4 * i + 0] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        z[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        z[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        z[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    for (int k = 0; k < 4; k++) {
        raw[k] = _mm512_shuffle_i32x4(z[k], z[4 + k], 0x88);
        raw[k + 4] = _mm512_shuffle_i32x4(z[k], z[4 + k], 0xDD);
    }
}

// A strip's super-block scales, lane l for row sigma(l): d, -dmin, and the 8 six-bit scales and
// mins packed as Q4_K packs them (sub-blocks 0-3 and 4-7, one byte each per lane)
typedef struct {
    __m512 dw, ndmin;
    __m512i sc03, mn03, sc47, mn47;
} strip_scales;

// The scales of 16 rows from their first 16 bytes (d, dmin, 12 scale bytes): q4[m]'s 128-bit
// lane k holds the bytes of the row that lanes 4k..4k+3 take from q4[0..3] (lane 4k + m: q4[m])
AVX512 static inline __attribute__((always_inline)) strip_scales strip_scales_of(const __m512i *q4) {
    const __m512i m3f = _mm512_set1_epi32(0x3F3F3F3F), m0f = _mm512_set1_epi32(0x0F0F0F0F),
                  m30 = _mm512_set1_epi32(0x30303030);
    __m512i wk[4];   // wk[k] lane l = lane l's row's dword k
    const __m512i t0 = _mm512_unpacklo_epi32(q4[0], q4[1]), t1 = _mm512_unpackhi_epi32(q4[0], q4[1]),
                  t2 = _mm512_unpacklo_epi32(q4[2], q4[3]), t3 = _mm512_unpackhi_epi32(q4[2], q4[3]);
    wk[0] = _mm512_unpacklo_epi64(t0, t2), wk[1] = _mm512_unpackhi_epi64(t0, t2);
    wk[2] = _mm512_unpacklo_epi64(t1, t3), wk[3] = _mm512_unpackhi_epi64(t1, t3);
    strip_scales h;
    h.dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(wk[0]));
    h.ndmin = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(wk[0], 16))));
    h.sc03 = _mm512_and_si512(wk[1], m3f), h.mn03 = _mm512_and_si512(wk[2], m3f);
    h.sc47 = _mm512_or_si512(_mm512_and_si512(wk[3], m0f), _mm512_and_si512(_mm512_srli_epi32(wk[1], 2), m30));
    h.mn47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(wk[3], 4), m0f),
                             _mm512_and_si512(_mm512_srli_epi32(wk[2], 2), m30));
    return h;
}

// the 16 rows' scales of the super-block at b (rows row_bytes apart), lane l for row sigma(l)
AVX512 static inline __attribute__((always_inline)) strip_scales strip_head(const uint8_t *b, size_t row_bytes) {
    __m512i q4[4];
    for (int m = 0; m < 4; m++) {
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(b + m * row_bytes)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(b + (8 + m) * row_bytes)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(b + (4 + m) * row_bytes)), 2);
        q4[m] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(b + (12 + m) * row_bytes)), 3);
    }
    return strip_scales_of(q4);
}

// Sub-block j of the super-block at element i, per activation row t (v[t] lane l: row sigma(l)'s
// 256 hi_j + lo_j, its digits' exact sums; < 2^24: 32 products of at most 15 * 127 per digit, so
// the conversion is exact): facc[t] += d sc_j dx (256 hi_j + lo_j), then += -dmin mn_j a_j.
// The fp32 steps of a row run in this order, sub-block after sub-block, whichever kernel formed v.
AVX512 static inline __attribute__((always_inline)) void
strip_sub(int R, const strip_scales *h, int j, const __m512i *v, const act_row *x, int i, const float *dx,
          __m512 *facc) {
    const __m512i ff = _mm512_set1_epi32(0xFF);
    const __m512i sc = _mm512_and_si512(_mm512_srli_epi32(j < 4 ? h->sc03 : h->sc47, 8 * (j % 4)), ff),
                  mn = _mm512_and_si512(_mm512_srli_epi32(j < 4 ? h->mn03 : h->mn47, 8 * (j % 4)), ff);
    const __m512 dsc = _mm512_mul_ps(h->dw, _mm512_cvtepi32_ps(sc)), dmn = _mm512_mul_ps(h->ndmin, _mm512_cvtepi32_ps(mn));
    for (int t = 0; t < R; t++) {
        facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v[t]), _mm512_mul_ps(dsc, _mm512_set1_ps(dx[t])), facc[t]);
        facc[t] = _mm512_fmadd_ps(dmn, _mm512_set1_ps(x[t].a[i / 32 + j]), facc[t]);
    }
}

// R activation rows (K form, Q4_K order) x 16 weight rows of Q4_K (row_bytes apart) from w:
// out[t * stride + r].
AVX512 static inline __attribute__((always_inline)) void
q4k_strip(int R, int digits, int l1, const uint8_t *w, size_t row_bytes, const act_row *x, int cols,
          float *out, size_t stride) {
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    __m512 facc[4];
    for (int t = 0; t < R; t++) facc[t] = _mm512_setzero_ps();
    for (int i = 0; i < cols; i += 256) {
        const uint8_t *b = w + (size_t)(i / 256) * 144;
        const strip_scales hd = strip_head(b, row_bytes);
        float dx[4];
        for (int t = 0; t < R; t++) dx[t] = x[t].d[i / 256];
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++)
#pragma GCC unroll 2
            for (int g = 0; g < 2; g++) {   // qs bytes [64c + 32g, + 32): sub-blocks 4c + 2g (low nibbles), + 1 (high)
                __m512i raw[8];
                strip_t8(b, row_bytes, 16 + 64 * c + 32 * g, raw);
#pragma GCC unroll 2
                for (int nh = 0; nh < 2; nh++) {   // low nibbles: sub-block j = 4c + 2g, high: j + 1
                    const int j = 4 * c + 2 * g + nh;
                    __m512i ah[4], al[4];
                    for (int t = 0; t < R; t++) ah[t] = al[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
                    for (int d = 0; d < 8; d++) {
                        const __m512i u = nh ? _mm512_and_si512(_mm512_srli_epi16(raw[d], 4), lo4) : _mm512_and_si512(raw[d], lo4);
                        const int at = i + 128 * c + 32 * g + 64 * nh + 4 * d;   // position in the K form's Q4_K order
                        for (int t = 0; t < R; t++) {
                            ah[t] = dpbusd_b(ah[t], u, x[t].q + at);
                            if (digits == 2) al[t] = dpbusd_b(al[t], u, x[t].ql + at);
                        }
                    }
                    for (int t = 0; t < R; t++) {
                        ah[t] = _mm512_slli_epi32(ah[t], 8);
                        if (digits == 2) ah[t] = _mm512_add_epi32(ah[t], al[t]);
                    }
                    strip_sub(R, &hd, j, ah, x, i, dx, facc);
                }
                if (c == 0 && g == 0) {
                    // The next strip (the 16 rows after these, contiguous), a share per
                    // super-block: one stream a strip ahead, as the row kernels' along their row.
                    // Issued after the first quarter's loads and work: issued before the
                    // super-block's own loads, they held those back (the asm fences keep the
                    // compiler from hoisting them). To L2 or to L1 (l1), as q_strip_get says:
                    // which streams faster depends on the core.
                    __asm__ volatile("" ::: "memory");
                    const uint8_t *p = w + 16 * row_bytes + (size_t)(i / 256) * 16 * 144;
                    for (int l = 0; l < 16 * 144; l += 64)
                        if (l1) _mm_prefetch((const char *)p + l, _MM_HINT_T0);
                        else _mm_prefetch((const char *)p + l, _MM_HINT_T1);
                    __asm__ volatile("" ::: "memory");
                }
            }
    }
    const __m512i sigma = _mm512_set_epi32(15, 14, 13, 12, 7, 6, 5, 4, 11, 10, 9, 8, 3, 2, 1, 0);
    for (int t = 0; t < R; t++) _mm512_storeu_ps(out + (size_t)t * stride, _mm512_permutexvar_ps(sigma, facc[t]));
}

// One activation row (decode) against the same 16 rows in the same arithmetic, 8 rows at a time
// along their super-blocks (q4k_rows8). The strip's loads per weight byte are many: each
// dpbusd broadcasts 4 activation bytes from memory, 13 loads per 144-byte block; on a core whose
// load queue fills with them behind the weights' misses, fewer weight bytes are in flight and the
// stream slows (bench/RESULTS.md). Here a super-block's activations are loaded once (8 vectors,
// 4 at one digit) for 8 rows, each row's 144 bytes in 3 loads: about 4 loads per block. Per row,
// vpdpbusd forms the 8 sub-block sums 256 hi_j + lo_j exactly (int32, as the strip's lanes hold
// them); 8 rows' sums are transposed to the lanes (lane r: row r) and strip_sub's fp32 steps run
// on them in the strip's order: the same bits as q4k_strip for every row and digit count. Which
// of the two streams faster depends on the core, so q_strip_tune times both.
// One 64-byte load of qs holds sub-blocks 4h, 4h+2 (low nibbles, lanes 0-7 and 8-15) and 4h+1,
// 4h+3 (high); the K form's Q4_K order matches each with its 64 activation bytes.
AVX512 static inline __attribute__((always_inline)) void
q4k_rows8(int digits, const uint8_t *w, size_t row_bytes, const act_row *x, int cols, float *out) {
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    __m512 facc = _mm512_setzero_ps();
    for (int i = 0; i < cols; i += 256) {
        const uint8_t *b0 = w + (size_t)(i / 256) * 144;
        __m512i aq[4], al[4];
        for (int k = 0; k < 4; k++) {
            aq[k] = _mm512_loadu_si512(x->q + i + 64 * k);
            if (digits == 2) al[k] = _mm512_loadu_si512(x->ql + i + 64 * k);
        }
        __m256i e[8];   // e[r]: row r's 8 sub-block sums, sub-blocks 0, 1, 4, 5, 2, 3, 6, 7
        for (int r = 0; r < 8; r++) {
            const uint8_t *b = b0 + r * row_bytes;
            const __m512i v0 = _mm512_loadu_si512(b + 16), v1 = _mm512_loadu_si512(b + 80);
            const __m512i u[4] = {_mm512_and_si512(v0, lo4), _mm512_and_si512(_mm512_srli_epi16(v0, 4), lo4),
                                  _mm512_and_si512(v1, lo4), _mm512_and_si512(_mm512_srli_epi16(v1, 4), lo4)};
            __m512i p[4];   // u[k] against elements 64k of the K form: sub-blocks (0, 2), (1, 3), (4, 6), (5, 7), 8 lanes each
            for (int k = 0; k < 4; k++) {
                p[k] = _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u[k], aq[k]), 8);
                if (digits == 2) p[k] = _mm512_dpbusd_epi32(p[k], u[k], al[k]);
            }
            // each 8-lane group to one sum: per 128-bit lane the sums of p0..p3, then lanes 0 + 1, 2 + 3
            const __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1])),
                          c = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
            const __m512i z = _mm512_add_epi32(_mm512_unpacklo_epi64(a, c), _mm512_unpackhi_epi64(a, c));
            e[r] = _mm512_castsi512_si256(_mm512_add_epi32(_mm512_shuffle_i32x4(z, z, 0x08), _mm512_shuffle_i32x4(z, z, 0x0D)));
        }
        {   // the next 8 rows (contiguous), a share per super-block, to L1: one stream 8 rows ahead, as
            // q4k_strip prefetches its next strip (a prefetch per row a few blocks ahead instead
            // streamed at half this rate here). The fences keep them after this block's loads.
            __asm__ volatile("" ::: "memory");
            const uint8_t *pn = w + 8 * row_bytes + (size_t)(i / 256) * 8 * 144;
            for (int l = 0; l < 8 * 144; l += 64) _mm_prefetch((const char *)pn + l, _MM_HINT_T0);
            __asm__ volatile("" ::: "memory");
        }
        // the 8 rows' scales, lane r for row r (lanes 8-15 repeat them)
        __m512i q4[4];
        for (int m = 0; m < 4; m++)
            q4[m] = _mm512_broadcast_i64x4(_mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b0 + m * row_bytes))),
                _mm_loadu_si128((const __m128i *)(b0 + (4 + m) * row_bytes)), 1));
        const strip_scales hd = strip_scales_of(q4);
        // e (8 rows x 8 sums) -> v[k] lane r = row r's sum k
        __m256i v[8];
        {
            __m256i t[8];
            for (int k = 0; k < 4; k++)
                t[2 * k] = _mm256_unpacklo_epi32(e[2 * k], e[2 * k + 1]), t[2 * k + 1] = _mm256_unpackhi_epi32(e[2 * k], e[2 * k + 1]);
            __m256i g[8];   // g[4h + k]: rows 4h..4h+3 (h = 0: 0-3 via t 0..3, h = 1: 4-7), sums k and k + 4 in the 128-bit halves
            for (int h = 0; h < 2; h++) {
                g[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
                g[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
                g[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
                g[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
            }
            for (int k = 0; k < 4; k++) {
                v[k] = _mm256_permute2x128_si256(g[k], g[4 + k], 0x20);
                v[k + 4] = _mm256_permute2x128_si256(g[k], g[4 + k], 0x31);
            }
        }
        static const int at[8] = {0, 1, 4, 5, 2, 3, 6, 7};   // sub-block j's sum: v[at[j]]
        const float dx = x->d[i / 256];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {   // the strip's steps; lanes 8-15 unused
            const __m512i vj = _mm512_castsi256_si512(v[at[j]]);
            strip_sub(1, &hd, j, &vj, x, i, &dx, &facc);
        }
    }
    _mm256_storeu_ps(out, _mm512_castps512_ps256(facc));
}

#define STRIP_KERNEL(name, D, L1)                                                                  \
    AVX512 static void strip_##name##_##D##_##L1(int R, const uint8_t *w, size_t row_bytes,        \
                                                 const act_row *x, int cols, float *out, size_t stride) { \
        switch (R) {                                                                               \
        case 1: name##_strip(1, D, L1, w, row_bytes, x, cols, out, stride); break;                 \
        case 2: name##_strip(2, D, L1, w, row_bytes, x, cols, out, stride); break;                 \
        case 3: name##_strip(3, D, L1, w, row_bytes, x, cols, out, stride); break;                 \
        default: name##_strip(4, D, L1, w, row_bytes, x, cols, out, stride); break;                \
        }                                                                                          \
    }
STRIP_KERNEL(q4k, 1, 0)
STRIP_KERNEL(q4k, 2, 0)
STRIP_KERNEL(q4k, 1, 1)
STRIP_KERNEL(q4k, 2, 1)
// A strip through q4k_rows8 at one activation row (two groups of 8 rows), through the strip at
// more (its prefetch level L1)
#define ROWS8_KERNEL(D, L1)                                                                        \
    AVX512 static void strip_rows8_##D##_##L1(int R, const uint8_t *w, size_t row_bytes, const act_row *x, \
                                              int cols, float *out, size_t stride) {               \
        if (R > 1) {                                                                               \
            strip_q4k_##D##_##L1(R, w, row_bytes, x, cols, out, stride);                           \
            return;                                                                                \
        }                                                                                          \
        q4k_rows8(D, w, row_bytes, x, cols, out);                                                  \
        q4k_rows8(D, w + 8 * row_bytes, row_bytes, x, cols, out + 8);                              \
    }
ROWS8_KERNEL(1, 0)
ROWS8_KERNEL(2, 0)
ROWS8_KERNEL(1, 1)
ROWS8_KERNEL(2, 1)

// How whole 16-row blocks of Q4_K run (qgemm.h): strips prefetching to L2, one activation row
// through them too, until q_strip_tune or q_strip_set says otherwise.
static q_strip_form strip_form = {2, 0};
q_strip_form q_strip_get(void) { return strip_form; }
q_strip_form q_strip_set(q_strip_form f) {
    CHECK_INTERNAL((f.level == 1 || f.level == 2) && (f.rows8 == 0 || f.rows8 == 1), "q_strip_set: level %d, rows8 %d",
                   f.level, f.rows8);
    return strip_form = f;
}

int q_rows_strip(enum q_isa isa, uint32_t type) { return isa == Q_ISA_AVX512 && type == GGML_Q4_K; }

strip_fn *fused_strip(enum q_isa isa, uint32_t type, int digits) {   // (Q4_K rows: whole 256-blocks)
    if (!q_rows_strip(isa, type)) return NULL;
    if (strip_form.rows8) return digits == 1 ? (strip_form.level == 1 ? strip_rows8_1_1 : strip_rows8_1_0)
                                             : (strip_form.level == 1 ? strip_rows8_2_1 : strip_rows8_2_0);
    if (strip_form.level == 1) return digits == 1 ? strip_q4k_1_1 : strip_q4k_2_1;
    return digits == 1 ? strip_q4k_1_0 : strip_q4k_2_0;
}
