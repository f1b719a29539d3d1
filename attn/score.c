// attn/score.c — see score.h.
#include "score.h"

#include <stdlib.h>

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

typedef struct {
    float v;
    int i;
} scored;

static int by_score_desc(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? 1 : -1;
    return x->i - y->i;
}

static int by_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

int score_topk(const float *s, int n, int k, int *idx) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    scored *c = xmalloc((size_t)n * sizeof *c);
    for (int j = 0; j < n; j++) c[j] = (scored){s[j], j};
    qsort(c, (size_t)n, sizeof *c, by_score_desc);
    for (int j = 0; j < k; j++) idx[j] = c[j].i;
    qsort(idx, (size_t)k, sizeof *idx, by_int);
    free(c);
    return k;
}
