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

// Everything above the k-th largest value, then the values equal to it in index order until k:
// ties go to the lower index, and the indices come out ascending.
int score_topk(const float *s, int n, int k, int *idx) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    float *v = xmalloc((size_t)n * sizeof *v);
    memcpy(v, s, (size_t)n * sizeof *v);
    float thr = kth_largest(v, n, k);
    free(v);
    int above = 0, m = 0;
    for (int j = 0; j < n; j++) above += s[j] > thr;
    for (int j = 0, ties = k - above; j < n; j++)
        if (s[j] > thr || (s[j] == thr && ties-- > 0)) idx[m++] = j;
    return m;
}
