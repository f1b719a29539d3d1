// tests/test_spec.c — specprefill's token-importance arithmetic on hand-computed cases: average
// pooling with the padding counted, max over heads and layers, mean over query rows; chunk
// selection (ceil(num_chunks * keep) chunks, the short last chunk scored over its real length,
// the last chunk always kept unless keep_last is 0, ties to the earlier chunk, ascending token
// indices).
#include <stdlib.h>

#include "../attn/score.h"
#include "../policies/specprefill.h"
#include "check.h"

// chunk c of 32 tokens (the last of a 100-token prompt has 4) gets score v per token
static void fill_chunks(float *s, int m, const float *v) {
    for (int i = 0; i < m; i++) s[i] = v[i / 32];
}

// idx (n,) == [lo0, hi0) ++ [lo1, hi1) ++ ...
static int is_ranges(const int *idx, int n, const int *r, int nr) {
    int j = 0;
    for (int k = 0; k < nr; k++)
        for (int i = r[2 * k]; i < r[2 * k + 1]; i++, j++)
            if (j >= n || idx[j] != i) return 0;
    return j == n;
}

static void test_select(void) {
    float s[320];
    int idx[320], n;
    // chunks [0,32) [32,64) [64,96) [96,100); means 1, 3, 2 and 2.5 over the last chunk's 4
    // tokens (over 32 it would be 0.3125 and chunk 2 would win)
    fill_chunks(s, 100, (float[]){1, 3, 2, 2.5f});
    n = specprefill_select(s, 100, 32, 0.5f, 1, idx);   // ceil(4 * 0.5) = 2: chunks 1 and 3
    CHECK(n == 36 && is_ranges(idx, n, (int[]){32, 64, 96, 100}, 2), "n %d", n);
    n = specprefill_select(s, 100, 32, 0.3f, 1, idx);   // ceil(1.2) = 2: the same two
    CHECK(n == 36 && is_ranges(idx, n, (int[]){32, 64, 96, 100}, 2), "n %d", n);
    n = specprefill_select(s, 100, 32, 0.75f, 1, idx);  // 3 chunks: 1, 3, 2
    CHECK(n == 68 && is_ranges(idx, n, (int[]){32, 100}, 1), "n %d", n);
    n = specprefill_select(s, 100, 32, 1.0f, 1, idx);   // everything
    CHECK(n == 100 && is_ranges(idx, n, (int[]){0, 100}, 1), "n %d", n);

    // the last chunk is forced in even when it scores lowest: top 1 (chunk 1) + chunk 3
    fill_chunks(s, 100, (float[]){1, 3, 2, 0});
    n = specprefill_select(s, 100, 32, 0.25f, 1, idx);
    CHECK(n == 36 && is_ranges(idx, n, (int[]){32, 64, 96, 100}, 2), "n %d", n);
    n = specprefill_select(s, 100, 32, 0.5f, 1, idx);   // chunks 1, 2 + forced 3
    CHECK(n == 68 && is_ranges(idx, n, (int[]){32, 100}, 1), "n %d", n);

    // ties go to the earlier chunk: all equal, 2 of 4 -> chunks 0, 1, then the last
    fill_chunks(s, 100, (float[]){1, 1, 1, 1});
    n = specprefill_select(s, 100, 32, 0.5f, 1, idx);
    CHECK(n == 68 && is_ranges(idx, n, (int[]){0, 64, 96, 100}, 2), "n %d", n);

    // keep is a float: 10 chunks * 0.3f keeps 3 chunks (not ceil(3.0000001) = 4)
    float v[10];
    for (int c = 0; c < 10; c++) v[c] = (float)c;
    fill_chunks(s, 320, v);
    n = specprefill_select(s, 320, 32, 0.3f, 1, idx);
    CHECK(n == 96 && is_ranges(idx, n, (int[]){224, 320}, 1), "n %d", n);

    // one chunk of a short prompt (the caller runs full then, but the arithmetic holds)
    n = specprefill_select(s, 20, 32, 0.1f, 1, idx);
    CHECK(n == 20 && is_ranges(idx, n, (int[]){0, 20}, 1), "n %d", n);

    // --keep-last off: the top chunks alone, the last one only when it is among them
    fill_chunks(s, 100, (float[]){1, 3, 2, 0});
    n = specprefill_select(s, 100, 32, 0.25f, 0, idx);   // top 1: chunk 1
    CHECK(n == 32 && is_ranges(idx, n, (int[]){32, 64}, 1), "n %d", n);
    n = specprefill_select(s, 100, 32, 0.5f, 0, idx);    // top 2: chunks 1, 2
    CHECK(n == 64 && is_ranges(idx, n, (int[]){32, 96}, 1), "n %d", n);
    fill_chunks(s, 100, (float[]){1, 3, 2, 2.5f});
    n = specprefill_select(s, 100, 32, 0.5f, 0, idx);    // top 2: chunks 1, 3 (on or off alike)
    CHECK(n == 36 && is_ranges(idx, n, (int[]){32, 64, 96, 100}, 2), "n %d", n);
    fill_chunks(s, 100, (float[]){1, 1, 1, 1});
    n = specprefill_select(s, 100, 32, 0.5f, 0, idx);    // ties: chunks 0, 1, no forced 3
    CHECK(n == 64 && is_ranges(idx, n, (int[]){0, 64}, 1), "n %d", n);
}

// Steps D-E as the strategy composes them (score_window_pool of one query row over every key,
// then score_fold_max), against hand-computed pooling, maxima and sums.
static void test_fold(void) {
    // one layer, 2 heads over 5 keys, kernel 3 (padding 1, always / 3)
    float probs[2][5] = {{0.6f, 0.3f, 0.1f, 0, 0}, {0, 0, 0.2f, 0.2f, 0.6f}};
    float pooled[2][5], row[5] = {0}, sum[5] = {0};
    score_window_pool(&probs[0][0], 1, 2, 5, 5, 3, 1, &pooled[0][0]);
    score_fold_max(&pooled[0][0], 2, 5, row, sum, 0);
    // head 0 pooled: .9/3 1/3 .4/3 .1/3 0 ; head 1 pooled: 0 .2/3 .4/3 1/3 .8/3
    double want[5] = {0.3, 1.0 / 3, 0.4 / 3, 1.0 / 3, 0.8 / 3};
    for (int i = 0; i < 5; i++) {
        CHECK_CLOSE(row[i], want[i], 1e-6);
        CHECK(sum[i] == 0, "sum %d", i);
    }

    // the row's last layer folds into the same row (max over layers too), then goes into the sum
    float probs2[1][5] = {{0, 0, 0, 0, 1}};
    score_window_pool(&probs2[0][0], 1, 1, 5, 5, 3, 1, &pooled[0][0]);   // 0 0 0 1/3 1/3
    score_fold_max(&pooled[0][0], 1, 5, row, sum, 1);
    want[4] = 1.0 / 3;
    for (int i = 0; i < 5; i++) {
        CHECK_CLOSE(sum[i], want[i], 1e-6);
        CHECK(row[i] == 0, "row %d", i);
    }

    // a second query row (one layer), then the mean over rows is the score
    float probs3[1][5] = {{1, 0, 0, 0, 0}};
    score_window_pool(&probs3[0][0], 1, 1, 5, 5, 1, 1, &pooled[0][0]);   // kernel 1: no smoothing
    score_fold_max(&pooled[0][0], 1, 5, row, sum, 1);
    double score[5] = {(0.3 + 1) / 2, 1.0 / 6, 0.2 / 3, 1.0 / 6, 1.0 / 6};
    for (int i = 0; i < 5; i++) CHECK_CLOSE(sum[i] / 2, score[i], 1e-6);
}

int main(void) {
    test_select();
    test_fold();
    return check_summary("test_spec");
}
