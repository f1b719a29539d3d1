// jobs/tune.h — --parallel measured against one sequence at a time, as the job runs (CPU
// backend): each decode step is one pass over the sequences in flight or one pass per sequence,
// and each prefill of several queued prompts one packed pass or one prompt alone, whichever the
// job's own passes measured cheaper (ms per decoded token, ms per prompt row). A measurement is a
// pair of adjacent passes, one each way (so a change of the machine's load between them moves
// both), and a choice is the median of the latest pairs' ratios. A sequence's tokens do not depend
// on which way it ran (the row kernels and packed passes round each row by itself: the same bits
// alone or together), so the choice moves time only. Where the shared pass loses, the job runs
// one at a time and says so once on stderr; pairs are still taken now and then (at intervals
// that double while they agree with the choice), so the choice follows the machine.
#pragma once
#include "../policies/policy.h"

#define TUNE_WIN 7            // ratios a window keeps (the latest), compared by their median
#define TUNE_BUCKETS 9        // decode: steps of B sequences by floor(log2 B), 2 .. 256
#define TUNE_DEC_MIN 5        // pairs before a measured choice: decode (per bucket)
#define TUNE_PRE_MIN 1        // prefill (a packed pass holds many rows)
#define TUNE_EVERY 8          // first interval (choices) between pairs once a choice is measured
#define TUNE_EVERY_MAX 64     // the interval doubles up to this while the choice holds

typedef struct {
    double v[TUNE_WIN];
    int n, at;     // samples held (<= TUNE_WIN), the slot of the next
    long added;    // samples ever added
} tune_win;

void tune_add(tune_win *w, double x);
double tune_median(const tune_win *w);   // NaN when empty

// What the next pass does: the shared way, one at a time, or a pair: a decode step of 3 or more
// sequences runs its first alone and the others in one pass; otherwise (a decode step of two, a
// prefill) the pass runs one at a time and the next pass, shared, completes the pair.
enum { TUNE_TOGETHER = 0, TUNE_ALONE = 1, TUNE_PAIR = 2 };

// One choice between the ways, repeated: the state the rule keeps between choices.
typedef struct {
    int way;            // the way the last measured choice picked (-1: none yet)
    int left, every;    // choices until the next pair, and that interval
    long seen;          // the window's `added` at the last choice
    int fell_back;      // 1 once a measured choice picked alone (the note is printed then)
} tune_choice;

void tune_choice_init(tune_choice *c);
// The next pass from the window of ratios (time a unit one at a time / the shared way's): a pair
// until the window holds min of them; then the measured way, alone when the median ratio is below
// 1 (c->way), and a pair every c->every choices: TUNE_EVERY after the way changes or a pair
// disagrees with it (its ratio on the other side of 1), doubling up to TUNE_EVERY_MAX with each
// pair that agrees. A pair that left no ratio (the step's width changed) is asked again at the
// next choice. *note is set to 1 on the first measured choice of alone (the runner's cue to say
// so), else left as is.
int tune_pick(tune_choice *c, const tune_win *ratio, int min, int *note);

typedef struct {
    int on;                          // 1 measuring, 2 every pass alone, 0 the plain calls
    int quiet, slots;
    tune_win dec[TUNE_BUCKETS];      // decode ratios (ms a token alone / in one pass), by bucket
    tune_win pre;                    // prefill ratios (ms a row alone / packed)
    tune_choice dec_c[TUNE_BUCKETS], pre_c;
    int said;                        // notes printed: 1 prefill's, 2 decode's (each once a run)
    double dec_half, pre_half;       // a pair's first pass: ms a token / row (0: none pending)
    int dec_bucket;                  // the bucket of the pending decode pass
} par_tune;

// Measuring (t->on 1) for --parallel N (N > 1) on the CPU backend; elsewhere every call below is
// the plain one (gen_prefill_packed, gen_step): a GPU's recorded decode step is kept per batch,
// and wins there. SIFT_PARALLEL_WAY (util/tunables.h) sets the way instead of measuring it:
// together (the plain calls: every pass shared), alone (t->on 2: every pass one sequence or
// prompt), measure (the default).
void tune_init(par_tune *t, const model *m, int parallel, int quiet);
// gen_prefill_packed(g, k, max_rows), or the first prompt alone, as measured; returns the
// prompts prefilled (g: opened, not yet prefilled; k <= FWD_MAX_BATCH).
int tune_prefill(par_tune *t, gen_seq *const *g, int k, int max_rows);
// One decode step over g (k sequences): gen_step over all, or over each alone, as measured.
void tune_step(par_tune *t, gen_seq *const *g, int k);
