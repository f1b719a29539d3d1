// attn/attn_cpu.c — causal attention on the CPU. Prefill: query blocks of ATTN_QB rows, scores and
// outputs as two sgemms per (head, block), tasks spread over OpenMP threads (BLAS runs
// single-threaded inside). Decode (n == 1): one pass per head, dot products and a weighted sum.
#include "attn.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"

#define ATTN_QB 128

// softmax of s[0..m) in place over entries whose key is visible (kpos <= qp); others become 0.
static void masked_softmax(float *s, const int *kpos, int m, int qp) {
    float mx = -INFINITY;
    for (int j = 0; j < m; j++)
        if (kpos[j] <= qp && s[j] > mx) mx = s[j];
    if (mx == -INFINITY) {  // no visible key: the output row is zero
        memset(s, 0, (size_t)m * sizeof *s);
        return;
    }
    double sum = 0;
    for (int j = 0; j < m; j++) {
        s[j] = kpos[j] <= qp ? expf(s[j] - mx) : 0.0f;
        sum += s[j];
    }
    float inv = (float)(1.0 / sum);
    for (int j = 0; j < m; j++) s[j] *= inv;
}

// Number of leading keys that can matter to queries up to position qmax: 1 + last visible index.
static int visible_prefix(const int *kpos, int len, int qmax) {
    int end = 0;
    for (int j = 0; j < len; j++)
        if (kpos[j] <= qmax) end = j + 1;
    return end;
}

static void attn_block(float *out, const float *q, const int *qpos, int nb, int heads, int h,
                       const float *k, const float *v, const int *kpos, int len, int hd,
                       float *s) {
    int qmax = qpos[0];
    for (int i = 1; i < nb; i++)
        if (qpos[i] > qmax) qmax = qpos[i];
    int m = visible_prefix(kpos, len, qmax);
    int ld = heads * hd;
    if (m == 0) {
        for (int i = 0; i < nb; i++) memset(out + (size_t)i * ld + (size_t)h * hd, 0, hd * sizeof(float));
        return;
    }
    float scale = 1.0f / sqrtf((float)hd);
    // S (nb, m) = scale * Q (nb, hd) @ K (m, hd)^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb, m, hd, scale, q + (size_t)h * hd, ld,
                k, hd, 0.0f, s, m);
    for (int i = 0; i < nb; i++) masked_softmax(s + (size_t)i * m, kpos, m, qpos[i]);
    // O (nb, hd) = P (nb, m) @ V (m, hd)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nb, hd, m, 1.0f, s, m, v, hd, 0.0f,
                out + (size_t)h * hd, ld);
}

static void attn_decode_head(float *out, const float *q, int qp, const float *k, const float *v,
                             const int *kpos, int len, int hd, float *s) {
    float scale = 1.0f / sqrtf((float)hd);
    for (int j = 0; j < len; j++) {
        const float *kj = k + (size_t)j * hd;
        float dot = 0;
        for (int c = 0; c < hd; c++) dot += q[c] * kj[c];
        s[j] = dot * scale;
    }
    masked_softmax(s, kpos, len, qp);
    memset(out, 0, (size_t)hd * sizeof *out);
    for (int j = 0; j < len; j++) {
        if (s[j] == 0.0f) continue;
        const float *vj = v + (size_t)j * hd;
        for (int c = 0; c < hd; c++) out[c] += s[j] * vj[c];
    }
}

void attn_causal_cpu(float *out, const float *q, const int *qpos, int n, int heads,
                     const float *k, const float *v, const int *kpos, int len, int cap,
                     int n_kv_head, int hd) {
    int group = heads / n_kv_head;
    int nblocks = (n + ATTN_QB - 1) / ATTN_QB;
    int rows = n == 1 ? 1 : ATTN_QB;
    int nthreads = omp_get_max_threads();
    float *scratch = xmalloc((size_t)nthreads * rows * (size_t)(len > 0 ? len : 1) * sizeof(float));
#pragma omp parallel for schedule(dynamic)
    for (int t = 0; t < heads * nblocks; t++) {
        int h = t % heads, b = t / heads, g = h / group;
        float *s = scratch + (size_t)omp_get_thread_num() * rows * (size_t)(len > 0 ? len : 1);
        const float *kg = k + (size_t)g * cap * hd, *vg = v + (size_t)g * cap * hd;
        const int *pg = kpos + (size_t)g * cap;
        int i0 = b * ATTN_QB, nb = n - i0 < ATTN_QB ? n - i0 : ATTN_QB;
        if (n == 1)
            attn_decode_head(out + (size_t)h * hd, q + (size_t)h * hd, qpos[0], kg, vg, pg, len, hd, s);
        else
            attn_block(out + (size_t)i0 * heads * hd, q + (size_t)i0 * heads * hd, qpos + i0, nb,
                       heads, h, kg, vg, pg, len, hd, s);
    }
    free(scratch);
}
