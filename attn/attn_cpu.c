// attn/attn_cpu.c — causal attention on the CPU: scores and outputs as two sgemms per task,
// a vectorised masked softmax between them; tasks spread over OpenMP threads (OpenBLAS runs
// single-threaded inside a parallel region). Prefill tasks are (head, block of queries);
// decode tasks are KV heads, so each cached K/V row is read once per step.
#include "attn.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "../util/fastexp.h"
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define ATTN_X86 1
#endif

#define ATTN_QB 128
#define ATTN_SMALL 8   // up to this many query rows per call: loops, not sgemm
#define ATTN_KT 64     // keys (values) a typed prefill decodes into its tile at a time


// softmax of s[0..m) in place over entries whose key is visible (kpos <= qp); others become 0.
static void masked_softmax(float *s, const int *kpos, int m, int qp) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < m; j++) {
        s[j] = kpos[j] <= qp ? s[j] : -INFINITY;
        mx = s[j] > mx ? s[j] : mx;
    }
    if (mx == -INFINITY) {  // no visible key: the output row is zero
        memset(s, 0, (size_t)m * sizeof *s);
        return;
    }
#ifdef ATTN_X86
    const float sum = exp8_sum(s, s, m, mx);   // (a row's sum whatever m: util/fastexp.h)
#else
    float sum = 0;   // (in order: the same bits whatever m, as the lanes above)
    for (int j = 0; j < m; j++) {
        s[j] = exp_nonpos(s[j] - mx);
        sum += s[j];
    }
#endif
    float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j < m; j++) s[j] *= inv;
}

// Number of leading keys that can matter to queries up to position qmax: 1 + last visible index.
static int visible_prefix(const int *kpos, int len, int qmax) {
    int end = 0;
    for (int j = 0; j < len; j++)
        if (kpos[j] <= qmax) end = j + 1;
    return end;
}

#ifdef ATTN_X86
// Elements c..c+7 of a stored row of type t as fp32 (hd a multiple of 8; q8_0: c's block scale).
static inline __attribute__((always_inline)) __m256 load8(enum kv_type t, const char *row, int c) {
    switch (t) {
    case KV_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * c))), 16));
    case KV_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * c)));
    case KV_Q8_0: {
        const char *b = row + (size_t)(c / 32) * 34;
        uint16_t dh;
        memcpy(&dh, b, 2);
        __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b + 2 + c % 32))));
        return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(dh)), q);
    }
    default: return _mm256_loadu_ps((const float *)row + c);
    }
}


// Eight dot products' lanes summed at once, each in hsum8's order (util/fastexp.h) (lo + hi halves, then lanes
// 0 + 2 and 1 + 3, then those two): the same bits as hsum8 on each. v[2k] and v[2k+1] -> lanes k
// and 4 + k of the result.
static inline __attribute__((always_inline)) __m256 hsum8x8(const __m256 *v) {
    __m256 a[4];
    for (int k = 0; k < 4; k++)
        a[k] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x31));
    const __m256 d01 = _mm256_add_ps(_mm256_shuffle_ps(a[0], a[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm256_shuffle_ps(a[0], a[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 d23 = _mm256_add_ps(_mm256_shuffle_ps(a[2], a[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm256_shuffle_ps(a[2], a[3], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm256_add_ps(_mm256_shuffle_ps(d01, d23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm256_shuffle_ps(d01, d23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Scores of NI (<= 4) query rows q[i * ld] against keys j0 .. j0 + 1 (one key when `two` is 0),
// 8 elements at a time converted in registers: s[i * m + j] = (q_i . k_j) * scale, each dot
// product summed in hsum8's order (hsum8x8 on the four rows' two keys).
static inline __attribute__((always_inline)) void qk_pair(const int NI, enum kv_type kt, const float *q, int ld,
                                                          const char *k, size_t krow, int j0, int two, int hd,
                                                          float scale, float *s, int m) {
    __m256 acc[8];
    for (int t = 0; t < 8; t++) acc[t] = _mm256_setzero_ps();
    const char *r0 = k + (size_t)j0 * krow, *r1 = two ? r0 + krow : r0;
    for (int c = 0; c < hd; c += 8) {
        const __m256 x0 = load8(kt, r0, c), x1 = load8(kt, r1, c);
#pragma GCC unroll 4
        for (int i = 0; i < NI; i++) {
            const __m256 qi = _mm256_loadu_ps(q + (size_t)i * ld + c);
            acc[2 * i] = _mm256_fmadd_ps(qi, x0, acc[2 * i]);
            acc[2 * i + 1] = _mm256_fmadd_ps(qi, x1, acc[2 * i + 1]);
        }
    }
    float d[8];
    _mm256_storeu_ps(d, _mm256_mul_ps(hsum8x8(acc), _mm256_set1_ps(scale)));
    for (int i = 0; i < NI; i++) {
        s[(size_t)i * m + j0] = d[i];
        if (two) s[(size_t)i * m + j0 + 1] = d[4 + i];
    }
}

// out rows i < NI (columns c .. c + 8 CW) += sum over keys j0 .. j1 of s[i * m + j] v_j, the
// accumulators in registers across the keys: per element the same FMA chain in key order as one
// key at a time through memory.
static inline __attribute__((always_inline)) void pv_cols(const int NI, const int CW, enum kv_type vt, float *out,
                                                          int ld, const float *s, int m, const char *v, size_t vrow,
                                                          int j0, int j1, int c) {
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int i = 0; i < NI; i++)
        for (int w = 0; w < CW; w++) acc[i][w] = _mm256_loadu_ps(out + (size_t)i * ld + c + 8 * w);
    for (int j = j0; j < j1; j++) {
        int any = 0;
        for (int i = 0; i < NI; i++) any |= s[(size_t)i * m + j] != 0;
        if (!any) continue;   // invisible to these rows: skipped, as before (adding 0 x v changes nothing
                              // for a finite v; the old loop decided over all nb rows, this over the group)
        const char *row = v + (size_t)j * vrow;
        __m256 x[2];
        for (int w = 0; w < CW; w++) x[w] = load8(vt, row, c + 8 * w);
#pragma GCC unroll 4
        for (int i = 0; i < NI; i++) {
            const __m256 p = _mm256_set1_ps(s[(size_t)i * m + j]);
            for (int w = 0; w < CW; w++) acc[i][w] = _mm256_fmadd_ps(p, x[w], acc[i][w]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < NI; i++)
        for (int w = 0; w < CW; w++) _mm256_storeu_ps(out + (size_t)i * ld + c + 8 * w, acc[i][w]);
}

#define DECODE_KT 64   // keys per tile of the weighted sum: their value rows stay in L1 across columns

// NI (<= 4) query rows of a decode step straight on the stored rows (kt, vt constant where it is
// inlined): the scores two keys at a time (qk_pair), the softmax, then the weighted sum per tile
// of DECODE_KT keys and 16 columns at a time, accumulators in registers (pv_cols). Row i's values
// depend on row i alone (for finite caches): the same bits in a group of 1, 2, 3 or 4. hd a
// multiple of 8.
static inline __attribute__((always_inline)) void decode_ni(const int NI, enum kv_type kt, enum kv_type vt,
                                                            float *out, const float *q, int ld, const int *qpos,
                                                            int qstride, const char *k, const char *v,
                                                            const int *kpos, int m, int hd, float *s) {
    const size_t krow = kv_row_bytes(kt, hd), vrow = kv_row_bytes(vt, hd);
    const float scale = 1.0f / sqrtf((float)hd);
    int j = 0;
    for (; j + 2 <= m; j += 2) qk_pair(NI, kt, q, ld, k, krow, j, 1, hd, scale, s, m);
    if (j < m) qk_pair(NI, kt, q, ld, k, krow, j, 0, hd, scale, s, m);
    for (int i = 0; i < NI; i++) {
        masked_softmax(s + (size_t)i * m, kpos, m, qpos[i * qstride]);
        memset(out + (size_t)i * ld, 0, (size_t)hd * sizeof(float));
    }
    for (int j0 = 0; j0 < m; j0 += DECODE_KT) {
        const int j1 = m - j0 < DECODE_KT ? m : j0 + DECODE_KT;
        int c = 0;
        for (; c + 16 <= hd; c += 16) pv_cols(NI, 2, vt, out, ld, s, m, v, vrow, j0, j1, c);
        if (c < hd) pv_cols(NI, 1, vt, out, ld, s, m, v, vrow, j0, j1, c);
    }
}

// A decode step's scores and weighted sum straight on the stored rows, up to four query rows at
// a time (decode_ni). s (nb, m): scores, then probabilities. hd a multiple of 8.
static inline __attribute__((always_inline)) void decode_rows_t(
    enum kv_type kt, enum kv_type vt, float *out, const float *q, int ld, const int *qpos,
    int qstride, int nb, const char *k, const char *v, const int *kpos, int m, int hd, float *s) {
    for (int i0 = 0; i0 < nb; i0 += 4) {
        const int ni = nb - i0 < 4 ? nb - i0 : 4;
        float *o = out + (size_t)i0 * ld, *si = s + (size_t)i0 * m;
        const float *qi = q + (size_t)i0 * ld;
        const int *pi = qpos + (size_t)i0 * qstride;
        switch (ni) {
        case 1: decode_ni(1, kt, vt, o, qi, ld, pi, qstride, k, v, kpos, m, hd, si); break;
        case 2: decode_ni(2, kt, vt, o, qi, ld, pi, qstride, k, v, kpos, m, hd, si); break;
        case 3: decode_ni(3, kt, vt, o, qi, ld, pi, qstride, k, v, kpos, m, hd, si); break;
        default: decode_ni(4, kt, vt, o, qi, ld, pi, qstride, k, v, kpos, m, hd, si); break;
        }
    }
}

// decode_rows_t with the types as constants: one instance per (K, V) pair
#define DR(a, b) decode_rows_t(a, b, out, q, ld, qpos, qstride, nb, k, v, kpos, m, hd, s)
#define DR_V(a)                                                                    \
    switch (vt) {                                                                  \
    case KV_F32: DR(a, KV_F32); break;                                             \
    case KV_BF16: DR(a, KV_BF16); break;                                           \
    case KV_F16: DR(a, KV_F16); break;                                             \
    case KV_Q8_0: DR(a, KV_Q8_0); break;                                           \
    }
static void decode_rows(enum kv_type kt, enum kv_type vt, float *out, const float *q, int ld,
                        const int *qpos, int qstride, int nb, const char *k, const char *v,
                        const int *kpos, int m, int hd, float *s) {
    switch (kt) {
    case KV_F32: DR_V(KV_F32); break;
    case KV_BF16: DR_V(KV_BF16); break;
    case KV_F16: DR_V(KV_F16); break;
    case KV_Q8_0: DR_V(KV_Q8_0); break;
    }
}
#undef DR_V
#undef DR
#endif

// Rows j0 .. j0 + n of a K or V buffer of type t (rows of rb bytes) as fp32: f32 rows in place,
// others decoded into tile (n <= ATTN_KT).
static const float *rows_f32(enum kv_type t, const char *p, size_t rb, int j0, int n, int hd,
                             float *tile) {
    if (t == KV_F32) return (const float *)(p + (size_t)j0 * rb);
    kv_rows_decode(t, tile, p + (size_t)j0 * rb, n, hd);
    return tile;
}

// nb query rows (row r at q + r*ld, position qpos[r * qstride]) against one KV head's keys, K
// and V rows of types kt and vt (kv_row_bytes each; kvrow.h): out rows (same layout as q) =
// softmax(q k^T / sqrt(hd), masked by position) v. s: scratch (nb, len); tile: ATTN_KT * hd floats
// for decoded rows. The fp32 pair (the reference) reads its rows in place: a prefill is one sgemm
// each way, a decode step the portable loops below.
static void attn_rows(float *out, const float *q, int ld, const int *qpos, int qstride, int nb,
                      const char *k, enum kv_type kt, const char *v, enum kv_type vt,
                      const int *kpos, int len, int hd, float *s, float *tile) {
    const size_t krow = kv_row_bytes(kt, hd), vrow = kv_row_bytes(vt, hd);
    const int f32 = kt == KV_F32 && vt == KV_F32;
    int qmax = qpos[0];
    for (int i = 1; i < nb; i++)
        if (qpos[i * qstride] > qmax) qmax = qpos[i * qstride];
    int m = visible_prefix(kpos, len, qmax);
    if (m == 0) {
        for (int i = 0; i < nb; i++) memset(out + (size_t)i * ld, 0, hd * sizeof(float));
        return;
    }
    float scale = 1.0f / sqrtf((float)hd);
    if (nb > ATTN_SMALL) {   // prefill: S (nb, m) = scale Q K^T, softmax, O (nb, hd) = P V, by sgemm
        const int step = f32 ? m : ATTN_KT;   // keys (values) per product
        for (int j0 = 0; j0 < m; j0 += step) {
            int jn = m - j0 < step ? m - j0 : step;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, jn, hd, scale, q, ld,
                        rows_f32(kt, k, krow, j0, jn, hd, tile), hd, 0.0f, s + j0, m);
        }
        for (int i = 0; i < nb; i++) masked_softmax(s + (size_t)i * m, kpos, m, qpos[i * qstride]);
        for (int j0 = 0; j0 < m; j0 += step) {
            int jn = m - j0 < step ? m - j0 : step;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, hd, jn, 1.0f, s + j0, m,
                        rows_f32(vt, v, vrow, j0, jn, hd, tile), hd, j0 ? 1.0f : 0.0f, out, ld);
        }
        return;
    }
#ifdef ATTN_X86
    if (hd % 8 == 0 && !f32) {   // converted in registers, no scratch row
        decode_rows(kt, vt, out, q, ld, qpos, qstride, nb, k, v, kpos, m, hd, s);
        return;
    }
#endif
    // a decode step's few rows (sgemm's packing costs more than the product here): each key row
    // read (decoded into L1) once for all nb query rows
    for (int j = 0; j < m; j++) {
        const float *kj = rows_f32(kt, k, krow, j, 1, hd, tile);
        for (int i = 0; i < nb; i++) {
            const float *qi = q + (size_t)i * ld;
            float d = 0;
#pragma omp simd reduction(+ : d)
            for (int c = 0; c < hd; c++) d += qi[c] * kj[c];
            s[(size_t)i * m + j] = d * scale;
        }
    }
    for (int i = 0; i < nb; i++) {
        masked_softmax(s + (size_t)i * m, kpos, m, qpos[i * qstride]);
        memset(out + (size_t)i * ld, 0, (size_t)hd * sizeof(float));
    }
    for (int j = 0; j < m; j++) {
        int any = 0;
        for (int i = 0; i < nb; i++) any |= s[(size_t)i * m + j] != 0;
        if (!any) continue;   // invisible to every row
        const float *vj = rows_f32(vt, v, vrow, j, 1, hd, tile);
        for (int i = 0; i < nb; i++) {
            const float p = s[(size_t)i * m + j];
            float *oi = out + (size_t)i * ld;
            if (p == 0) continue;   // invisible to this row
#pragma omp simd
            for (int c = 0; c < hd; c++) oi[c] += p * vj[c];
        }
    }
}

void attn_causal_cpu(float *out, const float *q, const int *qpos, int n, int heads, const void *k,
                     enum kv_type kt, const void *v, enum kv_type vt, const int *kpos, int len,
                     int cap, int n_kv_head, int hd) {
    int group = heads / n_kv_head;
    // prefill: a task per (head, block of ATTN_QB queries); decode: a task per KV head, whose
    // `group` query heads are consecutive rows sharing one position (K and V read once).
    int decode = n == 1;
    int rows = decode ? group : ATTN_QB;
    int tasks = decode ? n_kv_head : heads * ((n + ATTN_QB - 1) / ATTN_QB);
    size_t krow = kv_row_bytes(kt, hd), vrow = kv_row_bytes(vt, hd);
    size_t per_thread = (size_t)rows * (size_t)(len > 0 ? len : 1) + (size_t)ATTN_KT * hd;
    float *scratch = xmalloc((size_t)omp_get_max_threads() * per_thread * sizeof(float));
#pragma omp parallel for schedule(dynamic)
    for (int t = 0; t < tasks; t++) {
        float *s = scratch + (size_t)omp_get_thread_num() * per_thread;
        float *tile = s + (size_t)rows * (size_t)(len > 0 ? len : 1);
        int g = decode ? t : (t % heads) / group;
        const char *kg = (const char *)k + (size_t)g * cap * krow,
                   *vg = (const char *)v + (size_t)g * cap * vrow;
        const int *pg = kpos + (size_t)g * cap;
        if (decode) {
            size_t o = (size_t)g * group * hd;
            attn_rows(out + o, q + o, hd, qpos, 0, group, kg, kt, vg, vt, pg, len, hd, s, tile);
        } else {
            int h = t % heads, i0 = (t / heads) * ATTN_QB;
            int nb = n - i0 < ATTN_QB ? n - i0 : ATTN_QB;
            size_t o = (size_t)i0 * heads * hd + (size_t)h * hd;
            attn_rows(out + o, q + o, heads * hd, qpos + i0, 1, nb, kg, kt, vg, vt, pg, len, hd, s,
                      tile);
        }
    }
    free(scratch);
}

void attn_probs_cpu(float *probs, const float *q, const int *qpos, int n, int heads, const void *k,
                    enum kv_type kt, const int *kpos, int m, int cap, int n_kv_head, int hd) {
    int group = heads / n_kv_head, decode = n == 1, tasks = decode ? n_kv_head : heads;
    float scale = 1.0f / sqrtf((float)hd);
    size_t krow = kv_row_bytes(kt, hd);
    if (m <= 0) return;
    const int step = kt == KV_F32 ? m : ATTN_KT;   // keys per product: f32 rows read in place
    float *tiles = xmalloc((size_t)omp_get_max_threads() * ATTN_KT * hd * sizeof(float));
    // decode: a task per KV head, its `group` query heads consecutive rows (K read once);
    // otherwise a task per query head over all n rows (row stride `heads` in q and probs)
#pragma omp parallel for schedule(dynamic) if (tasks > 1)
    for (int t = 0; t < tasks; t++) {
        int g = decode ? t : t / group, h0 = decode ? t * group : t, rows = decode ? group : n;
        int ld = decode ? hd : heads * hd, ldp = decode ? m : heads * m;
        const int *pg = kpos + (size_t)g * cap;
        const char *kg = (const char *)k + (size_t)g * cap * krow;
        float *p = probs + (size_t)h0 * m, *tile = tiles + (size_t)omp_get_thread_num() * ATTN_KT * hd;
        // P (rows, m) = scale * Q (rows, hd) @ K_g (m, hd)^T, then the masked softmax per row
        for (int j0 = 0; j0 < m; j0 += step) {
            int jn = m - j0 < step ? m - j0 : step;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, jn, hd, scale,
                        q + (size_t)h0 * hd, ld, rows_f32(kt, kg, krow, j0, jn, hd, tile), hd, 0.0f,
                        p + j0, ldp);
        }
        for (int r = 0; r < rows; r++) masked_softmax(p + (size_t)r * ldp, pg, m, qpos[decode ? 0 : r]);
    }
    free(tiles);
}

void attn_scores_cpu(float *s, int lds, const float *q, int nq, int ld, const void *k, enum kv_type kt,
                     int n, int hd) {
    const size_t krow = kv_row_bytes(kt, hd);
#ifdef ATTN_X86
    if (hd % 8 == 0) {   // qk_pair: four query rows against two keys at a time
        for (int i0 = 0; i0 < nq; i0 += 4) {
            const int ni = nq - i0 < 4 ? nq - i0 : 4;
            const float *qi = q + (size_t)i0 * ld;
            float *si = s + (size_t)i0 * lds;
            for (int j = 0; j < n; j += 2) {
                const int two = j + 1 < n;
                switch (ni) {
                case 1: qk_pair(1, kt, qi, ld, k, krow, j, two, hd, 1.0f, si, lds); break;
                case 2: qk_pair(2, kt, qi, ld, k, krow, j, two, hd, 1.0f, si, lds); break;
                case 3: qk_pair(3, kt, qi, ld, k, krow, j, two, hd, 1.0f, si, lds); break;
                default: qk_pair(4, kt, qi, ld, k, krow, j, two, hd, 1.0f, si, lds); break;
                }
            }
        }
        return;
    }
#endif
    float *row = xmalloc((size_t)hd * sizeof(float));
    for (int j = 0; j < n; j++) {   // each key row decoded once for every query row
        kv_row_decode(kt, row, (const char *)k + (size_t)j * krow, hd);
        for (int i = 0; i < nq; i++) {
            const float *qi = q + (size_t)i * ld;
            float d = 0;
            for (int c = 0; c < hd; c++) d += qi[c] * row[c];
            s[(size_t)i * lds + j] = d;
        }
    }
    free(row);
}

void attn_page_bounds_cpu(float *ub, const float *q, int nq, int ld, const void *b, enum kv_type bt,
                          int n_pages, int hd) {
    const size_t brow = kv_row_bytes(bt, hd);
#ifdef ATTN_X86
    if (hd % 8 == 0 && bt != KV_Q8_0) {   // the two bound rows converted in registers
        for (int p = 0; p < n_pages; p++) {
            const char *lo = (const char *)b + (size_t)p * 2 * brow, *hi = lo + brow;
            float best = -INFINITY;
            for (int i0 = 0; i0 < nq; i0 += 4) {
                const int ni = nq - i0 < 4 ? nq - i0 : 4;
                __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                                 _mm256_setzero_ps()};
                for (int c = 0; c < hd; c += 8) {
                    const __m256 l = load8(bt, lo, c), h = load8(bt, hi, c);
                    for (int i = 0; i < ni; i++) {
                        const __m256 qi = _mm256_loadu_ps(q + (size_t)(i0 + i) * ld + c);
                        acc[i] = _mm256_add_ps(acc[i], _mm256_max_ps(_mm256_mul_ps(qi, l),
                                                                     _mm256_mul_ps(qi, h)));
                    }
                }
                for (int i = 0; i < ni; i++) {
                    float u = hsum8(acc[i]);
                    best = u > best ? u : best;
                }
            }
            ub[p] = best;
        }
        return;
    }
#endif
    float *lo = xmalloc((size_t)hd * 2 * sizeof(float)), *hi = lo + hd;
    for (int p = 0; p < n_pages; p++) {
        kv_row_decode(bt, lo, (const char *)b + (size_t)p * 2 * brow, hd);
        kv_row_decode(bt, hi, (const char *)b + ((size_t)p * 2 + 1) * brow, hd);
        float best = -INFINITY;
        for (int i = 0; i < nq; i++) {
            const float *qi = q + (size_t)i * ld;
            float u = 0;
            for (int c = 0; c < hd; c++) {
                float a = qi[c] * lo[c], z = qi[c] * hi[c];
                u += a > z ? a : z;
            }
            best = u > best ? u : best;
        }
        ub[p] = best;
    }
    free(lo);
}
