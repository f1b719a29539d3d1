// tests/test_select.c — token selection of fastkv / snapkv / streamingllm against hand-built
// answers: pooling edge rules (max-pool padding ignored, avg-pool zero padding), the FastKV window
// scores from hand-made probabilities (max- and avg-pooled), per-KV-group and all-head sums, top-k
// plus window (ties to the lower index, ascending), the budget arithmetic and the fixed budgets'
// window rule, and one attention layer end to end: window softmax scores vs a float64 reference
// and the per-KV-head cache it keeps; topk's decode step (its selection, reads and attention).
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../attn/attn.h"
#include "../attn/pages.h"
#include "../attn/score.h"
#include "../util/check.h"
#include "../model/forward.h"
#include "../policies/window_score.h"
#include "check.h"

static void test_maxpool_edges(void) {
    // kernel 7: a spike reaches 3 tokens each side, clipped at both ends
    float s[10] = {5, 0, 0, 0, 0, 0, 0, 0, 0, 0}, out[10];
    score_maxpool(s, 10, 7, out);
    for (int j = 0; j < 10; j++)
        CHECK(out[j] == (j <= 3 ? 5 : 0), "left spike, out[%d] = %g", j, out[j]);
    memset(s, 0, sizeof s);
    s[9] = 5;
    score_maxpool(s, 10, 7, out);
    for (int j = 0; j < 10; j++)
        CHECK(out[j] == (j >= 6 ? 5 : 0), "right spike, out[%d] = %g", j, out[j]);
    // padding is ignored, not zero: all-negative scores stay negative at the edges
    float neg[4] = {-1, -2, -3, -4};
    score_maxpool(neg, 4, 7, out);
    for (int j = 0; j < 4; j++) CHECK(out[j] == -1, "negative, out[%d] = %g", j, out[j]);
    score_maxpool(neg, 4, 3, out);
    float want[4] = {-1, -1, -2, -3};
    for (int j = 0; j < 4; j++) CHECK(out[j] == want[j], "kernel 3, out[%d] = %g", j, out[j]);
}

static void test_avgpool(void) {
    // zero padding counted: edges divide by the full kernel
    float s[3] = {3, 6, 9}, out[3], want[3] = {3, 6, 5};
    score_avgpool(s, 3, 3, out);
    for (int j = 0; j < 3; j++) CHECK_CLOSE(out[j], want[j], 1e-6);
    float t[6] = {7, 0, 0, 0, 0, 14}, o5[6];
    float w5[6] = {7.0 / 5, 7.0 / 5, 7.0 / 5, 14.0 / 5, 14.0 / 5, 14.0 / 5};
    score_avgpool(t, 6, 5, o5);
    for (int j = 0; j < 6; j++) CHECK_CLOSE(o5[j], w5[j], 1e-6);
}

static void test_window_scores(void) {
    // w = 2 window rows, 2 heads, n = 6 keys -> c = 4 candidates; probs (w, heads, n)
    float probs[2][2][6] = {
        {{0.5f, 0.1f, 0.0f, 0.1f, 0.3f, 0.0f}, {0.0f, 0.0f, 0.6f, 0.0f, 0.4f, 0.0f}},
        {{0.2f, 0.2f, 0.0f, 0.1f, 0.2f, 0.3f}, {0.1f, 0.0f, 0.1f, 0.0f, 0.4f, 0.4f}},
    };
    // s_0 = {0.7, 0.3, 0.0, 0.2}; s_1 = {0.1, 0.0, 0.7, 0.0} (keys 4, 5 are the window: excluded)
    float pooled[2][4], p1[2][4] = {{0.7f, 0.3f, 0.0f, 0.2f}, {0.1f, 0.0f, 0.7f, 0.0f}};
    score_window_pool(&probs[0][0][0], 2, 2, 6, 6 - 2, 1, WINDOW_POOL_MAX, &pooled[0][0]);
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++) CHECK_CLOSE(pooled[h][j], p1[h][j], 1e-6);
    // kernel 3: max-pool per head BEFORE summing heads
    float p3[2][4] = {{0.7f, 0.7f, 0.3f, 0.2f}, {0.1f, 0.7f, 0.7f, 0.7f}};
    score_window_pool(&probs[0][0][0], 2, 2, 6, 6 - 2, 3, WINDOW_POOL_MAX, &pooled[0][0]);
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++) CHECK_CLOSE(pooled[h][j], p3[h][j], 1e-6);
    float all[4], want[4] = {0.8f, 1.4f, 1.0f, 0.9f};
    score_group_sum(&pooled[0][0], 2, 1, 4, all);
    for (int j = 0; j < 4; j++) CHECK_CLOSE(all[j], want[j], 1e-6);
    // --pool avg, kernel 3: per head, zero padding, every sum / 3:
    // s_0 -> {0+.7+.3, .7+.3+0, .3+0+.2, .2+0+0} / 3; s_1 -> {0+.1+0, .1+0+.7, 0+.7+0, .7+0+0} / 3
    float pa[2][4] = {{1.0f / 3, 1.0f / 3, 0.5f / 3, 0.2f / 3},
                      {0.1f / 3, 0.8f / 3, 0.7f / 3, 0.7f / 3}};
    score_window_pool(&probs[0][0][0], 2, 2, 6, 6 - 2, 3, WINDOW_POOL_AVG, &pooled[0][0]);
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < 4; j++) CHECK_CLOSE(pooled[h][j], pa[h][j], 1e-6);
    // where the two disagree: one head, w = 1, n = 8 (c = 7), s = {0, 5, 0, 0, 3, 3, 3};
    // max-pool 3 -> {5, 5, 5, 0, 3, 3, 3}: top 1 is key 0 (ties to the lower index);
    // avg-pool 3 -> {5, 5, 5, 3, 6, 9, 6} / 3: top 1 is key 5
    float one[8] = {0, 5, 0, 0, 3, 3, 3, 1}, sc[7];
    int top[2];
    score_window_pool(one, 1, 1, 8, 8 - 1, 3, WINDOW_POOL_MAX, sc);
    score_select(sc, 1, 8 - 1, 2 - 1, 1, top, 2);
    CHECK(top[0] == 0 && top[1] == 7, "max-pool keeps %d %d", top[0], top[1]);
    score_window_pool(one, 1, 1, 8, 8 - 1, 3, WINDOW_POOL_AVG, sc);
    CHECK_CLOSE(sc[5], 3.0, 1e-6);
    score_select(sc, 1, 8 - 1, 2 - 1, 1, top, 2);
    CHECK(top[0] == 5 && top[1] == 7, "avg-pool keeps %d %d", top[0], top[1]);
    // 4 heads in 2 KV groups: group g sums heads 2g, 2g+1
    float ph[4][3] = {{1, 2, 3}, {10, 20, 30}, {4, 0, 4}, {0, 4, 1}}, grp[2][3];
    float wg[2][3] = {{11, 22, 33}, {4, 4, 5}};
    score_group_sum(&ph[0][0], 4, 2, 3, &grp[0][0]);
    for (int g = 0; g < 2; g++)
        for (int j = 0; j < 3; j++)
            CHECK(grp[g][j] == wg[g][j], "group %d, j %d: %g", g, j, grp[g][j]);
}

static void test_select_window(void) {
    // per KV group: top (k - w) of the n - w candidates + the window, ascending, ties to lower
    int n = 10, w = 3, k = 5;
    float sc[2][7] = {{0, 9, 1, 9, 9, 0, 0}, {5, 0, 0, 0, 0, 0, 6}};
    int idx[2][5], want[2][5] = {{1, 3, 7, 8, 9}, {0, 6, 7, 8, 9}};
    score_select(&sc[0][0], 2, n - w, k - w, w, &idx[0][0], k);
    for (int g = 0; g < 2; g++)
        for (int j = 0; j < k; j++)
            CHECK(idx[g][j] == want[g][j], "g %d: idx[%d] = %d", g, j, idx[g][j]);
    // TSP rows (one group): the window is kept even when the prefix scores are all higher; sorted
    float ts[5] = {3, 1, 4, 1, 5};
    int rows[4], wr[4] = {2, 4, 5, 6};
    score_select(ts, 1, 7 - 2, 4 - 2, 2, rows, 4);
    for (int j = 0; j < 4; j++) CHECK(rows[j] == wr[j], "rows[%d] = %d", j, rows[j]);
    // k == w: the window only
    score_select(ts, 1, 7 - 2, 2 - 2, 2, rows, 2);
    CHECK(rows[0] == 5 && rows[1] == 6, "window only: %d %d", rows[0], rows[1]);
}

static void test_budget(void) {
    CHECK(window_budget(100, 0.7f) == 70, "100 * 0.7 = %d", window_budget(100, 0.7f));
    CHECK(window_budget(200, 0.1f) == 20, "200 * 0.1 = %d", window_budget(200, 0.1f));
    CHECK(window_budget(1403, 0.2f) == 280, "1403 * 0.2 = %d", window_budget(1403, 0.2f));
    CHECK(window_budget(7, 0.5f) == 3, "7 * 0.5 = %d", window_budget(7, 0.5f));
    CHECK(window_budget(280, 0.1f / 0.2f) == 140, "280 * 0.1 / 0.2 = %d",
          window_budget(280, 0.1f / 0.2f));
    CHECK(window_budget(9, 1.0f) == 9, "9 * 1 = %d", window_budget(9, 1.0f));
    // fixed budgets (--kv-len, --tsp-len): 0 is off; otherwise more than the window
    char err[160] = "";
    CHECK(window_len_check("--kv-len", 0, 8, err, sizeof err) == 0, "0 is off");
    CHECK(window_len_check("--kv-len", 9, 8, err, sizeof err) == 0, "9 > window 8");
    CHECK(window_len_check("--tsp-len", 8, 8, err, sizeof err) == -1 &&
          strcmp(err, "--tsp-len 8 must exceed --window 8 (the window is always kept)") == 0,
          "8 = window 8: '%s'", err);
}

// One attention layer: 4 query heads over 2 KV heads (hd 2), n = 12 keys at positions 0..11,
// window w = 2, kernel 3. Every query is (1, 0); keys are 0 except KV head 0: key 2 = (4, 0),
// key 7 = (2, 0); KV head 1: key 6 = (4, 0). Budget 4 keeps the top 2 + the window per KV head:
// head 0 -> the pooled plateau of key 2 = {1, 2, 3} -> {1, 2} (ties to lower), + {10, 11};
// head 1 -> {5, 6} + {10, 11}.
static void test_layer(void) {
    enum { N = 12, H = 4, HKV = 2, HD = 2, W = 2, NGEN = 3 };
    model m = {.cfg = {.n_layer = 1, .n_head = H, .n_kv_head = HKV, .head_dim = HD}};
    m.bk = backend_cpu_create(1, BK_WEIGHTS_NATIVE);
    char err[200];
    int cap = N + NGEN, pos[N];
    context cx = {.m = &m};
    kv_cache *kv = fwd_kv_create(&cx, &cap, err, sizeof err);
    float k[N][HKV][HD] = {{{0}}}, v[N][HKV][HD], q[N][H][HD];
    k[2][0][0] = 4, k[7][0][0] = 2, k[6][1][0] = 4;
    for (int i = 0; i < N; i++) {
        pos[i] = i;
        for (int g = 0; g < HKV; g++) v[i][g][0] = (float)i, v[i][g][1] = (float)g;
        for (int h = 0; h < H; h++) q[i][h][0] = 1, q[i][h][1] = 0;
    }
    m.bk->kv_append(m.bk, &kv->layers[0], k, v, pos, N);
    fwd_state s = {.cx = &cx, .m = &m, .kv = kv, .n = N, .pos = pos};

    // float64 reference: window rows r = 10, 11; softmax over keys j <= r
    double ref[H][N - W] = {{0}};
    for (int r = N - W; r < N; r++)
        for (int h = 0; h < H; h++) {
            int g = h / (H / HKV);
            double e[N], sum = 0;
            for (int j = 0; j <= r; j++) sum += e[j] = exp(k[j][g][0] / sqrt(HD));
            for (int j = 0; j < N - W; j++) ref[h][j] += e[j] / sum;
        }
    window_buf wb = window_buf_make(&m, N, W, 4, 0);
    window_score_layer(&s, 0, q, W, 3, WINDOW_POOL_MAX, &wb);
    const float *pooled = wb.pooled;   // the CPU's backend memory is the host's
    for (int h = 0; h < H; h++)
        for (int j = 0; j < N - W; j++) {
            double mx = ref[h][j];
            if (j > 0 && ref[h][j - 1] > mx) mx = ref[h][j - 1];
            if (j < N - W - 1 && ref[h][j + 1] > mx) mx = ref[h][j + 1];
            CHECK_CLOSE(pooled[h * (N - W) + j], mx, 1e-6);
        }

    window_compress(&s, 0, &wb, W, 4, NGEN);
    kv_layer *L = &kv->layers[0];
    int want[HKV][4] = {{1, 2, 10, 11}, {5, 6, 10, 11}};
    CHECK(L->len == 4 && L->cap == 4 + NGEN, "len %d cap %d", L->len, L->cap);
    CHECK(kv_bytes(kv) == 2 * (size_t)HKV * (4 + NGEN) * HD * sizeof(float), "bytes %zu",
          kv_bytes(kv));
    for (int g = 0; g < HKV; g++)
        for (int j = 0; j < 4; j++) {
            int p = L->pos[g * L->cap + j];
            CHECK(p == want[g][j], "KV head %d entry %d: position %d", g, j, p);
            CHECK(((float *)L->v)[(g * L->cap + j) * HD] == (float)p, "V of entry %d moved", j);
        }
    window_buf_free(&wb);
    kv_free(kv);
    m.bk->destroy(m.bk);
}

// topk's decode step (backend op attn_topk_step, the CPU twin): 4 query heads over 2 KV heads
// (hd 2), 12 entries, sink 2, mid [2, 9), the tail and decode tokens [9, 12), K = 2. KV head 0:
// head 0 (q = (1, 0)) scores a_j, two 5s at 3 and 5; head 1 (q = (0, 1)) scores b_j, 4s at 2, 4
// and 8: the lower two, {2, 4}; their union is 4 entries. KV head 1: every mid key 0, so both
// heads take {2, 3} (ties to the lower index), a union of 2. Reads: 4 + 2 + 2 x (2 + 3) anchors
// = 16 of 24 cached. The output against a float64 softmax over each head's set.
static void test_topk_step(void) {
    enum { N = 12, H = 4, HKV = 2, HD = 2, SINK = 2, MID = 7, K = 2 };
    model m = {.cfg = {.n_layer = 1, .n_head = H, .n_kv_head = HKV, .head_dim = HD}};
    m.bk = backend_cpu_create(1, BK_WEIGHTS_NATIVE);
    char err[200];
    int cap = N, pos[N];
    context cx = {.m = &m};
    kv_cache *kv = fwd_kv_create(&cx, &cap, err, sizeof err);
    const float a[N] = {3, 1, 1, 5, 2, 5, 0, 3, 0, 2, 1, 0}, b[N] = {0, 2, 4, 0, 4, 0, 1, 0, 4, 1, 3, 2};
    float k[N][HKV][HD] = {{{0}}}, v[N][HKV][HD], q[H][HD] = {{1, 0}, {0, 1}, {1, 0}, {-1, 0}};
    for (int i = 0; i < N; i++) {
        pos[i] = i;
        k[i][0][0] = a[i], k[i][0][1] = b[i];
        if (i < SINK || i >= SINK + MID) k[i][1][0] = (float)i;   // KV head 1: mid keys all 0
        for (int g = 0; g < HKV; g++) v[i][g][0] = (float)i, v[i][g][1] = (float)(g + 1);
    }
    m.bk->kv_append(m.bk, &kv->layers[0], k, v, pos, N);
    fwd_state s = {.cx = &cx, .m = &m, .kv = kv, .n = 1, .pos = &pos[N - 1]};
    int idx[H * K];
    double stats[4] = {0, 0, 0, 0};
    float out[H][HD];
    fwd_attn_topk_step(&s, 0, q, SINK, MID, K, idx, stats, NULL, NULL, out);
    const int want[H][K] = {{3, 5}, {2, 4}, {2, 3}, {2, 3}};
    for (int h = 0; h < H; h++)
        for (int j = 0; j < K; j++)
            CHECK(idx[h * K + j] == want[h][j], "head %d: top %d is %d, not %d", h, j, idx[h * K + j], want[h][j]);
    CHECK(stats[0] == 16 && stats[1] == 24 && stats[2] == 1, "reads %g of %g, steps %g", stats[0], stats[1], stats[2]);
    // the exact selector scored every mid K row of both KV heads: 7 x 2 rows of 8 bytes
    CHECK(stats[3] == 112, "selector bytes %g", stats[3]);
    for (int h = 0; h < H; h++) {   // float64: softmax over the top K, [0, 2) and [9, 12)
        int g = h / (H / HKV), set[K + SINK + 3], n = 0;
        for (int j = 0; j < K; j++) set[n++] = want[h][j];
        for (int j = 0; j < SINK; j++) set[n++] = j;
        for (int j = SINK + MID; j < N; j++) set[n++] = j;
        double e[K + SINK + 3], z = 0, y[HD] = {0};
        for (int i = 0; i < n; i++)
            z += e[i] = exp((q[h][0] * k[set[i]][g][0] + q[h][1] * k[set[i]][g][1]) / sqrt(HD));
        for (int i = 0; i < n; i++)
            for (int c = 0; c < HD; c++) y[c] += e[i] / z * v[set[i]][g][c];
        for (int c = 0; c < HD; c++) CHECK_CLOSE(out[h][c], y[c], 1e-5);
    }
    fwd_attn_topk_step(&s, 0, q, SINK, MID, 0, idx, stats, NULL, NULL, out);   // K = 0: the anchors alone
    CHECK(stats[0] == 16 + 10 && stats[1] == 48 && stats[2] == 2 && stats[3] == 112, "K 0: reads %g of %g",
          stats[0], stats[1]);

    // The page selector over the same cache, pages of 2 over the mid region [2, 9): {2, 3},
    // {4, 5}, {6, 7}, {8}. KV head 0's bounds (lo, hi) = ((1, 0), (5, 4)), ((2, 0), (5, 4)),
    // ((0, 0), (3, 1)), ((0, 4), (0, 4)): for head 0 (q = (1, 0)) 5, 5, 3, 0 and for head 1
    // (q = (0, 1)) 4, 4, 1, 4, so the pages' bounds are 5, 5, 3, 4. KV head 1: all 0 (ties: the
    // lower pages).
    char *bounds = xmalloc(2 * pages_bytes(KV_F32, MID, 2, HD));
    fwd_kv_pages_build(&m, kv, 0, SINK, MID, 2, bounds);
    const float want_b[4][2][HD] = {{{1, 0}, {5, 4}}, {{2, 0}, {5, 4}}, {{0, 0}, {3, 1}}, {{0, 4}, {0, 4}}};
    CHECK(memcmp(bounds, want_b, sizeof want_b) == 0, "KV head 0's page bounds");
    // Two pages read: {2..5}, which hold every head's exact top 2: the exact selection, index
    // for index; the selector read 4 bound pages x 2 rows + 4 keys per KV head.
    topk_pages pg = {bounds, KV_F32, 2, 4, 2, NULL, NULL, NULL};
    double ps[4] = {0, 0, 0, 0};
    int pidx[H * K];
    fwd_attn_topk_step(&s, 0, q, SINK, MID, K, pidx, ps, &pg, NULL, out);
    for (int i = 0; i < H * K; i++) CHECK(pidx[i] == want[i / K][i % K], "pages: head %d's %d is %d", i / K, i % K, pidx[i]);
    CHECK(ps[0] == 16 && ps[3] == 2 * (8 + 4) * 8, "pages: reads %g, selector bytes %g", ps[0], ps[3]);
    // K = 3, three pages read: KV head 0 takes pages 0, 1 and 3 (bounds 5, 5, 4: head 1's 4 at
    // entry 8 outbids page 2's 3), so head 0 gets the top 3 of a over {2..5, 8} = {3, 4, 5}
    // where the exact selector gives {3, 5, 7}; head 1 gets {2, 4, 8}, as exact; KV head 1
    // pages 0..2, {2, 3, 4} for both heads, as exact. Bytes: (8 + 5 + 8 + 6) rows of 8.
    enum { K3 = 3 };
    int p3[H * K3];
    const int want3[H][K3] = {{3, 4, 5}, {2, 4, 8}, {2, 3, 4}, {2, 3, 4}};
    pg.read = 3;
    ps[3] = 0;
    fwd_attn_topk_step(&s, 0, q, SINK, MID, K3, p3, ps, &pg, NULL, NULL);
    for (int i = 0; i < H * K3; i++)
        CHECK(p3[i] == want3[i / K3][i % K3], "pages K 3: head %d's %d is %d", i / K3, i % K3, p3[i]);
    CHECK(ps[3] == (8 + 5 + 8 + 6) * 8, "pages K 3 (selection alone): selector bytes %g", ps[3]);
    free(bounds);
    kv_free(kv);
    m.bk->destroy(m.bk);
}

// score_topk against a brute-force rule (entry j is taken iff fewer than k entries beat it:
// larger, or equal and at a lower index), over random rows with many ties, k both far below n
// (k <= n / 4: the heap's range) and near it (quickselect's).
static void test_topk_rule(void) {
    uint64_t st = 11;
    int bad = 0;
    for (int t = 0; t < 300; t++) {
        st = st * 6364136223846793005ull + 1;
        int n = 1 + (int)((st >> 33) % 700), levels = 1 + (int)((st >> 20) % 40);
        int k = t % 3 == 0 ? n : 1 + (int)((st >> 45) % (uint64_t)(t % 3 == 1 ? n : (n / 4 > 0 ? n / 4 : 1)));
        float *x = xmalloc((size_t)n * sizeof *x);
        int *got = xmalloc((size_t)n * sizeof *got), m = 0;
        for (int j = 0; j < n; j++) st = st * 6364136223846793005ull + 1, x[j] = (float)((st >> 30) % (uint64_t)levels) - 7;
        int w = score_topk(x, n, k, got);
        for (int j = 0; j < n; j++) {
            int beat = 0;
            for (int i = 0; i < n; i++) beat += x[i] > x[j] || (x[i] == x[j] && i < j);
            if (beat < k) bad += m >= w || got[m++] != j;
        }
        bad += m != w || w != k;
        free(x), free(got);
    }
    CHECK(bad == 0, "score_topk disagrees with the rule %d times", bad);
}

// Page bounds by hand: attn_page_bounds_cpu's sum of max(q lo, q hi) per query, the largest of
// them; pages_round's outward rounding (f16, bf16) at a value between two neighbours, at 0, and
// past f16's range; pages_build_cpu over q8_0 keys (f16 bounds): every decoded key inside.
static void test_pages(void) {
    // q0 = (1, -2): max(-1, 2) + max(0, -6) = 2; q1 = (-1, 1): max(1, -2) + max(0, 3) = 4
    const float q[2][8] = {{1, -2}, {-1, 1}}, b[2][8] = {{-1, 0}, {2, 3}};
    float ub;
    attn_page_bounds_cpu(&ub, q[0], 2, 8, b, KV_F32, 1, 8);
    CHECK(ub == 4, "page bound %g, not 4", ub);
    attn_page_bounds_cpu(&ub, q[0], 1, 8, b, KV_F32, 1, 8);
    CHECK(ub == 2, "one query's page bound %g, not 2", ub);
    for (int t = 0; t < 2; t++) {   // 1/3 lies strictly between two neighbours in f16 and bf16
        enum kv_type ty = t ? KV_BF16 : KV_F16;
        uint16_t lo, hi;
        float flo, fhi, third = 1.0f / 3;
        pages_round(ty, third, 0, &lo), pages_round(ty, third, 1, &hi);
        kv_row_decode(ty, &flo, &lo, 1), kv_row_decode(ty, &fhi, &hi, 1);
        CHECK(flo < third && fhi > third && hi == lo + 1, "%s: 1/3 rounded to [%g, %g]", kv_type_name(ty), flo, fhi);
        pages_round(ty, -third, 0, &lo), pages_round(ty, -third, 1, &hi);
        kv_row_decode(ty, &flo, &lo, 1), kv_row_decode(ty, &fhi, &hi, 1);
        CHECK(flo < -third && fhi > -third, "%s: -1/3 rounded to [%g, %g]", kv_type_name(ty), flo, fhi);
        pages_round(ty, 0.5f, 1, &hi);   // representable: unchanged
        kv_row_decode(ty, &fhi, &hi, 1);
        CHECK(fhi == 0.5f, "%s: 0.5 rounded up to %g", kv_type_name(ty), fhi);
    }
    uint16_t h;
    float f;
    pages_round(KV_F16, 1e-9f, 1, &h);   // below the smallest subnormal: up to it
    CHECK(h == 0x0001, "f16 1e-9 up: %04x", h);
    pages_round(KV_F16, 70000.0f, 0, &h);   // past the largest finite: down to it (65504)
    kv_row_decode(KV_F16, &f, &h, 1);
    CHECK(f == 65504.0f, "f16 70000 down: %g", f);
    enum { N = 37, HD = 64, P = 8 };   // q8_0 keys, f16 bounds rounded outward
    float x[N][HD], row[HD];
    size_t kr = kv_row_bytes(KV_Q8_0, HD), br = kv_row_bytes(KV_F16, HD);
    char *k = xmalloc(N * kr), *bd = xmalloc(pages_bytes(KV_Q8_0, N, P, HD));
    uint64_t st = 7;
    for (int j = 0; j < N; j++) {
        for (int c = 0; c < HD; c++) st = st * 6364136223846793005ull + 1, x[j][c] = (float)((int64_t)(st >> 11) % 20001) / 7777.0f;
        kv_row_encode(KV_Q8_0, k + j * kr, x[j], HD);
    }
    pages_build_cpu(bd, k, KV_Q8_0, N, P, HD);
    CHECK(pages_count(N, P) == 5 && pages_bytes(KV_Q8_0, N, P, HD) == 5 * 2 * br, "pages of q8_0 keys");
    int inside = 1;
    for (int j = 0; j < N; j++) {
        float lo[HD], hi[HD];
        kv_row_decode(KV_F16, lo, bd + (j / P) * 2 * br, HD);
        kv_row_decode(KV_F16, hi, bd + ((j / P) * 2 + 1) * br, HD);
        kv_row_decode(KV_Q8_0, row, k + j * kr, HD);
        for (int c = 0; c < HD; c++) inside &= lo[c] <= row[c] && row[c] <= hi[c];
    }
    CHECK(inside, "a q8_0 key outside its page's f16 bounds");
    free(k), free(bd);
}

int main(void) {
    test_maxpool_edges();
    test_avgpool();
    test_window_scores();
    test_select_window();
    test_budget();
    test_layer();
    test_topk_step();
    test_pages();
    test_topk_rule();
    return check_summary("test_select");
}
