// tests/test_tune.c — jobs/tune.c's rule for --parallel: shared passes or one sequence at a time,
// from pairs of measured passes. The windows (the latest TUNE_WIN ratios, their median); the
// pick: pairs until enough ratios, then the way of the median, a pair at doubling intervals, the
// note once on the first measured fallback, the interval restarted when the way changes; and
// simulated jobs with noisy pass times (shared faster, alone faster, and a machine that changes
// halfway): the time the rule spends is within a few % of the faster way's, never the slower's.
#include <math.h>
#include <stdlib.h>

#include "../jobs/tune.h"
#include "check.h"

static void windows(void) {
    tune_win w = {0};
    CHECK(isnan(tune_median(&w)), "empty window");
    tune_add(&w, 3), tune_add(&w, 1);
    CHECK(tune_median(&w) == 2, "median of 1, 3: %g", tune_median(&w));
    tune_add(&w, 2);
    CHECK(tune_median(&w) == 2 && w.n == 3, "median of 3, 1, 2");
    for (int i = 0; i < TUNE_WIN; i++) tune_add(&w, 10 + i);   // the older ones fall out
    CHECK(w.n == TUNE_WIN && tune_median(&w) == 10 + TUNE_WIN / 2, "latest kept: %g", tune_median(&w));
}

// n choices, a pair's ratio added each time one is asked for; returns the pairs (and adds the
// choices of alone to *alone)
static int choose(tune_choice *c, tune_win *w, int n, double ratio, int *alone, int *note) {
    int pairs = 0;
    for (int i = 0; i < n; i++) {
        int way = tune_pick(c, w, 3, note);
        if (way == TUNE_PAIR) pairs++, tune_add(w, ratio);
        *alone += way == TUNE_ALONE;
    }
    return pairs;
}

static void picks(void) {
    tune_choice c;
    tune_choice_init(&c);
    tune_win w = {0};
    int note = 0, alone = 0;
    for (int i = 0; i < 3; i++) {   // too few ratios: a pair each time
        CHECK(tune_pick(&c, &w, 3, &note) == TUNE_PAIR, "pair %d", i);
        tune_add(&w, 1.25);   // alone 1.25x the shared way's time: shared wins
    }
    int pairs = choose(&c, &w, 200, 1.25, &alone, &note);
    CHECK(alone == 0 && note == 0 && c.way == TUNE_TOGETHER, "shared faster: alone %d, note %d", alone, note);
    // agreeing pairs at choices 8, 24 (8 + 16), 56, 120, 184: intervals 8, 16, 32, 64, 64
    CHECK(pairs == 5 && c.every == TUNE_EVERY_MAX, "pairs at doubling intervals: %d of 200", pairs);
    // pairs that disagree (0.8) but leave the median: the interval starts again at each (the
    // first at choice 48 of 64, the 64-interval's end, then two 8 apart)
    pairs = choose(&c, &w, 64, 0.8, &alone, &note);
    CHECK(pairs == 3 && c.way == TUNE_TOGETHER && c.every == TUNE_EVERY, "disagreeing pairs: %d, every %d", pairs,
          c.every);
    // a pair that asked and got no ratio is asked again at the next choice
    while (tune_pick(&c, &w, 3, &note) != TUNE_PAIR) {}
    CHECK(tune_pick(&c, &w, 3, &note) == TUNE_PAIR, "a pair without a ratio asked again");
    // the machine changes: alone 0.8x the time; the median turns with a 4th ratio of 0.8 of 7
    tune_add(&w, 0.8);
    int way = tune_pick(&c, &w, 3, &note);
    CHECK(way == TUNE_ALONE && note == 1 && c.way == TUNE_ALONE && c.every == TUNE_EVERY,
          "turned: way %d note %d every %d", way, note, c.every);
    note = 0;
    pairs = choose(&c, &w, 7, 0.8, &alone, &note);
    CHECK(pairs == 1 && note == 0, "interval restarted at %d: %d pairs in 7, note again %d", TUNE_EVERY, pairs, note);
    // back to shared: no note (it is for the fallback); alone again later: no second note
    for (int i = 0; i < TUNE_WIN; i++) tune_add(&w, 1.5);
    CHECK(tune_pick(&c, &w, 3, &note) == TUNE_TOGETHER && note == 0, "back to shared");
    for (int i = 0; i < TUNE_WIN; i++) tune_add(&w, 0.5);
    CHECK(tune_pick(&c, &w, 3, &note) == TUNE_ALONE && note == 0, "second fallback: no second note");
}

static double uniform(unsigned long long *s) {   // splitmix64 -> [0, 1)
    unsigned long long z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
}

static double noise(unsigned long long *s) {   // x 0.7 .. 1.3, and 1 in 10 3x slower (another process)
    double u = uniform(s);
    return (0.7 + 0.6 * u) * (uniform(s) < 0.1 ? 3 : 1);
}

// n decode steps of B > 2 sequences, as tune_step runs them under the rule (force -1; a pair: one
// sequence alone, the other B - 1 in one pass), or every step shared (force TUNE_TOGETHER) or
// alone (TUNE_ALONE): a token costs shared[i] in a shared pass at step i and alone[i] in a pass
// of its own, with noise per token (the same draws whatever runs). Returns the total time.
static double simulate(int n, int B, const double *shared, const double *alone, int force, int *n_alone) {
    tune_choice c;
    tune_choice_init(&c);
    tune_win w = {0};
    unsigned long long s = 12345;
    double total = 0;
    int note = 0;
    *n_alone = 0;
    for (int i = 0; i < n; i++) {
        double a[B], sh[B], all_a = 0, all_sh = 0, rest = 0;
        for (int b = 0; b < B; b++) {
            a[b] = alone[i] * noise(&s), sh[b] = shared[i] * noise(&s);
            all_a += a[b], all_sh += sh[b], rest += b ? sh[b] : 0;
        }
        int way = force >= 0 ? force : tune_pick(&c, &w, TUNE_DEC_MIN, &note);
        if (way == TUNE_PAIR) tune_add(&w, a[0] / (rest / (B - 1)));
        total += way == TUNE_TOGETHER ? all_sh : way == TUNE_ALONE ? all_a : a[0] + rest;
        *n_alone += way == TUNE_ALONE;
    }
    return total;
}

// The rule's time against each way's alone, on the same passes: within `slack` of the faster.
static void job(const char *what, int n, int B, const double *shared, const double *alone, double slack) {
    int k, k0;
    double t = simulate(n, B, shared, alone, -1, &k);
    double ts = simulate(n, B, shared, alone, TUNE_TOGETHER, &k0), ta = simulate(n, B, shared, alone, TUNE_ALONE, &k0);
    double best = ts < ta ? ts : ta;
    CHECK(t <= slack * best, "%s: the rule %.0f, shared %.0f, alone %.0f (%d of %d steps alone)", what, t, ts, ta,
          k, n);
}

static void jobs(void) {
    enum { N = 600, B = 8 };
    static double one[N], fast[N], slow[N], turn[N], late[N];
    for (int i = 0; i < N; i++) {
        one[i] = 1, fast[i] = 0.55, slow[i] = 1.1;   // shared 1.8x faster a token; 1.1x slower (the 0.91x)
        turn[i] = i < N / 2 ? 0.55 : 1.3;             // a machine whose shared pass loses from step 300
        late[i] = i < N / 2 ? 1.3 : 0.55;             // and one where it starts winning there
    }
    job("shared faster", N, B, fast, one, 1.03);
    job("alone faster", N, B, slow, one, 1.03);
    job("shared loses from halfway", N, B, turn, one, 1.05);
    job("shared wins from halfway", N, B, late, one, 1.05);
    job("a short job, shared faster", 31, B, fast, one, 1.06);
    job("a short job, alone faster", 31, B, slow, one, 1.05);
}

int main(void) {
    windows();
    picks();
    jobs();
    return check_summary("test_tune");
}
