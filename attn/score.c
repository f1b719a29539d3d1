// attn/score.c — see score.h.
#include "score.h"

#include <stdlib.h>
#include <string.h>

#include "../util/check.h"

void score_maxpool(const float *s, int n, int kernel, float *out) {
    int r = kernel / 2;
    for (int j = 0; j < n; j++) {
        int lo = j - r < 0 ? 0 : j - r, hi = j + r >= n ? n - 1 : j + r;
        float m = s[lo];
        for (int t = lo + 1; t <= hi; t++)
            if (s[t] > m) m = s[t];
        out[j] = m;
    }
}

void score_avgpool(const float *s, int n, int kernel, float *out) {
    int r = kernel / 2;
    for (int j = 0; j < n; j++) {
        int lo = j - r < 0 ? 0 : j - r, hi = j + r >= n ? n - 1 : j + r;
        double sum = 0;
        for (int t = lo; t <= hi; t++) sum += s[t];
        out[j] = (float)(sum / kernel);
    }
}

// The k-th largest of v[0..n) (1 <= k <= n), by quickselect; v is reordered.
static float kth_largest(float *v, int n, int k) {
    int lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = v[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {   // descending: left part >= pivot >= right part
            while (v[i] > pivot) i++;
            while (v[j] < pivot) j--;
            if (i <= j) {
                float t = v[i];
                v[i++] = v[j];
                v[j--] = t;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return v[want];
    }
    return v[want];
}

// The k-th largest of s[0..n) for k small against n: a min-heap of the k largest so far, so
// most values cost one comparison with its root (1 <= k <= n).
static float kth_largest_heap(const float *s, int n, int k) {
    float *h = xmalloc((size_t)k * sizeof *h);
    for (int i = 0; i < k; i++) {   // heapify the first k
        int c = i;
        h[c] = s[i];
        while (c > 0 && h[(c - 1) / 2] > h[c]) {
            float t = h[c];
            h[c] = h[(c - 1) / 2], h[(c - 1) / 2] = t, c = (c - 1) / 2;
        }
    }
    for (int i = k; i < n; i++) {
        if (!(s[i] > h[0])) continue;
        int c = 0;   // replace the root and sift it down
        h[0] = s[i];
        for (;;) {
            int l = 2 * c + 1, r = l + 1, m = c;
            if (l < k && h[l] < h[m]) m = l;
            if (r < k && h[r] < h[m]) m = r;
            if (m == c) break;
            float t = h[c];
            h[c] = h[m], h[m] = t, c = m;
        }
    }
    float thr = h[0];
    free(h);
    return thr;
}

// Everything above the k-th largest value, then the values equal to it in index order until k:
// ties go to the lower index, and the indices come out ascending.
int score_topk(const float *s, int n, int k, int *idx) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    float thr;
    if ((long)k * 4 <= n) thr = kth_largest_heap(s, n, k);   // decode's selector: K << N
    else {
        float *v = xmalloc((size_t)n * sizeof *v);
        memcpy(v, s, (size_t)n * sizeof *v);
        thr = kth_largest(v, n, k);
        free(v);
    }
    int above = 0, m = 0;
    for (int j = 0; j < n; j++) above += s[j] > thr;
    for (int j = 0, ties = k - above; j < n; j++)
        if (s[j] > thr || (s[j] == thr && ties-- > 0)) idx[m++] = j;
    return m;
}

void score_window_pool(const float *probs, int nq, int heads, int m, int c, int kernel, int avg,
                       float *out) {
    float *sum = xmalloc((size_t)(c > 0 ? c : 1) * sizeof(float));
    for (int h = 0; h < heads; h++) {
        for (int j = 0; j < c; j++) {
            float acc = 0;
            for (int r = 0; r < nq; r++) acc += probs[((size_t)r * heads + h) * m + j];
            sum[j] = acc;
        }
        (avg ? score_avgpool : score_maxpool)(sum, c, kernel, out + (size_t)h * c);
    }
    free(sum);
}

void score_fold_max(const float *in, int heads, int c, float *row_max, float *sum, int last) {
    for (int j = 0; j < c; j++) {
        float m = row_max[j];
        for (int h = 0; h < heads; h++)
            if (in[(size_t)h * c + j] > m) m = in[(size_t)h * c + j];
        if (last) sum[j] += m, m = 0;
        row_max[j] = m;
    }
}

void score_group_sum(const float *in, int heads, int groups, int c, float *out) {
    int per = heads / groups;
    for (int g = 0; g < groups; g++)
        for (int j = 0; j < c; j++) {
            float acc = 0;
            for (int h = g * per; h < (g + 1) * per; h++) acc += in[(size_t)h * c + j];
            out[(size_t)g * c + j] = acc;
        }
}

void score_select(const float *s, int rows, int c, int k, int tail, int *idx, int ld) {
    CHECK_INTERNAL(k >= 0 && k <= c && k + tail <= ld, "select %d of %d (+ %d) into rows of %d",
                   k, c, tail, ld);
    for (int r = 0; r < rows; r++) {
        int *out = idx + (size_t)r * ld, top = score_topk(s + (size_t)r * c, c, k, out);
        for (int j = 0; j < tail; j++) out[top + j] = c + j;
    }
}

int score_union_count(const int *idx, int lists, int k) {
    int n = 0;
    for (int h = 0; h < lists; h++)
        for (int i = 0; i < k; i++) {
            int e = idx[(size_t)h * k + i], seen = 0;
            for (int p = 0; p < h && !seen; p++) seen = score_sorted_has(idx + (size_t)p * k, k, e);
            n += !seen;
        }
    return n;
}
