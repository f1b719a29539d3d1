// jobs/tune.c — --parallel measured against one sequence at a time (see tune.h): the windows of
// ratios, the rule that picks a way from them, and the runner's two calls that run a decode step
// or a prefill the way it picks, timing the passes of each pair.
#include "tune.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "../util/tunables.h"

void tune_add(tune_win *w, double x) {
    w->added++;
    w->v[w->at] = x;
    w->at = (w->at + 1) % TUNE_WIN;
    if (w->n < TUNE_WIN) w->n++;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double tune_median(const tune_win *w) {
    if (w->n == 0) return NAN;
    double v[TUNE_WIN];
    memcpy(v, w->v, (size_t)w->n * sizeof *v);
    qsort(v, (size_t)w->n, sizeof *v, cmp_double);
    return w->n % 2 ? v[w->n / 2] : (v[w->n / 2 - 1] + v[w->n / 2]) / 2;
}

void tune_choice_init(tune_choice *c) { *c = (tune_choice){-1, 0, TUNE_EVERY, 0, 0}; }

int tune_pick(tune_choice *c, const tune_win *ratio, int min, int *note) {
    if (ratio->n < min) return TUNE_PAIR;
    int way = tune_median(ratio) < 1 ? TUNE_ALONE : TUNE_TOGETHER;
    if (way != c->way) {   // measured for the first time, or turned: a pair again soon
        c->way = way, c->every = c->left = TUNE_EVERY;
    } else if (ratio->added != c->seen) {   // a pair since the last choice: did it agree?
        double last = ratio->v[(ratio->at + TUNE_WIN - 1) % TUNE_WIN];
        int agrees = (last < 1) == (way == TUNE_ALONE);
        c->every = !agrees ? TUNE_EVERY : 2 * c->every < TUNE_EVERY_MAX ? 2 * c->every : TUNE_EVERY_MAX;
        c->left = c->every;
    }
    c->seen = ratio->added;
    if (way == TUNE_ALONE && !c->fell_back) c->fell_back = *note = 1;
    return --c->left > 0 ? way : TUNE_PAIR;   // (until that pair's ratio comes, a pair each choice)
}

void tune_init(par_tune *t, const model *m, int parallel, int quiet) {
    *t = (par_tune){.quiet = quiet, .slots = parallel};
    for (int b = 0; b < TUNE_BUCKETS; b++) tune_choice_init(&t->dec_c[b]);
    tune_choice_init(&t->pre_c);
    int way = tunables()->parallel_way;
    if (parallel < 2 || strcmp(m->bk->name, "cpu") != 0 || way == TUN_WAY_TOGETHER) return;
    t->on = way == TUN_WAY_ALONE ? 2 : 1;
}

static int bucket_of(int B) {
    int k = 0;
    while (B >>= 1) k++;
    return k < TUNE_BUCKETS ? k : TUNE_BUCKETS - 1;
}

int tune_prefill(par_tune *t, gen_seq *const *g, int k, int max_rows) {
    if (!t->on || k < 2 || max_rows <= 0) {
        t->pre_half = 0;   // a pending pair's second half could not pack: no pair
        return gen_prefill_packed(g, k, max_rows);
    }
    int note = 0, way = t->on == 2     ? TUNE_ALONE
                        : t->pre_half > 0 ? TUNE_TOGETHER
                                          : tune_pick(&t->pre_c, &t->pre, TUNE_PRE_MIN, &note);
    if (note && !(t->said & 1) && !t->quiet)
        fprintf(stderr, "sift: --parallel %d: prompts prefilled in one pass measured slower here than one at a "
                "time (alone %.2fx the time a row): prefilling one at a time while that holds\n", t->slots,
                tune_median(&t->pre));
    t->said |= note;
    unsigned char was[FWD_MAX_BATCH];   // the prompts fed before: this pass's are the others
    CHECK_INTERNAL(k <= FWD_MAX_BATCH, "a prefill choice among %d prompts", k);
    for (int i = 0; i < k; i++) was[i] = (unsigned char)g[i]->fed;
    double t0 = now_ms();
    int b = gen_prefill_packed(g, k, way == TUNE_TOGETHER ? max_rows : 0);
    double ms = now_ms() - t0;
    long rows = 0;
    for (int i = 0; i < k; i++) rows += g[i]->fed && !was[i] ? g[i]->n_prompt : 0;
    if (way == TUNE_PAIR) t->pre_half = ms / rows;
    else if (t->pre_half > 0) {   // the pair's second half: a ratio when the pass packed
        if (b > 1) tune_add(&t->pre, t->pre_half / (ms / rows));
        t->pre_half = 0;
    }
    return b;
}

// gen_step over g[0 .. k) in one pass (all) or one pass per sequence; ms a token it took.
static double timed_step(gen_seq *const *g, int k, int live, int all) {
    double t0 = now_ms();
    if (all) gen_step(g, k);
    else
        for (int i = 0; i < k; i++)
            if (!g[i]->done) gen_step(&g[i], 1);
    return (now_ms() - t0) / live;
}

void tune_step(par_tune *t, gen_seq *const *g, int k) {
    int live = 0;
    for (int i = 0; i < k; i++) live += !g[i]->done;
    if (!t->on || live < 2) {
        gen_step(g, k);
        t->dec_half = 0;
        return;
    }
    int bucket = bucket_of(live), note = 0;
    if (t->dec_half > 0) {   // a pair's second half: the shared pass, at the same width
        double ms = timed_step(g, k, live, 1);
        if (bucket == t->dec_bucket) tune_add(&t->dec[bucket], t->dec_half / ms);
        t->dec_half = 0;
        return;
    }
    int way = t->on == 2 ? TUNE_ALONE : tune_pick(&t->dec_c[bucket], &t->dec[bucket], TUNE_DEC_MIN, &note);
    if (note && !(t->said & 2) && !t->quiet)
        fprintf(stderr, "sift: --parallel %d: one decode pass over %d sequences measured slower here than a pass "
                "each (alone %.2fx the time a token): decoding one sequence at a time while that holds\n",
                t->slots, live, tune_median(&t->dec[bucket]));
    t->said |= 2 * note;
    if (way == TUNE_PAIR && live > 2) {   // a pair in one step: the first live sequence alone, the others shared
        int i = 0;
        while (g[i]->done) i++;
        double one = timed_step(&g[i], 1, 1, 1), shared = timed_step(g + i + 1, k - i - 1, live - 1, 1);
        tune_add(&t->dec[bucket], one / shared);
        return;
    }
    double ms = timed_step(g, k, live, way == TUNE_TOGETHER);
    if (way == TUNE_PAIR) t->dec_half = ms, t->dec_bucket = bucket;   // two sequences: a step alone, then shared
}
