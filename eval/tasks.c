// eval/tasks.c — the task generators. Each prompt is planned once from (seed, task, ctx, sample):
// needles with their depths (or, for cwe, the words and their counts), the question and the
// answer prefix. Then the body grows by whole haystack sentences (cwe: list entries) until one
// more would push prompt + answer tokens past ctx.
//   niah        one needle "The secret code for the <key> is <7 digits>." at depth d
//   multikey    the asked needle at depth d + 3 needles with other keys at random depths
//   multivalue  4 needles with one key and 4 values; all 4 are asked for
//   vt          "VAR A = 12345." then "VAR B = VAR A." ... (5 names, in order); all names asked
//   cwe         a numbered list: 5 words 12 times each, every other word twice; the 5 asked
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "eval.h"

static const struct {
    const char *name;
    int n_gen;
} TASKS[EVAL_N_TASKS] = {
    [EVAL_NIAH] = {"niah", 12},   [EVAL_MULTIKEY] = {"multikey", 12},
    [EVAL_MULTIVALUE] = {"multivalue", 48}, [EVAL_VT] = {"vt", 32}, [EVAL_CWE] = {"cwe", 32}};

const char *eval_task_name(eval_task t) { return TASKS[t].name; }
int eval_task_n_gen(eval_task t) { return TASKS[t].n_gen; }

int eval_task_find(const char *name) {
    for (int i = 0; i < EVAL_N_TASKS; i++)
        if (strcmp(TASKS[i].name, name) == 0) return i;
    return -1;
}

const char *eval_task_names(void) { return "niah, multikey, multivalue, vt, cwe"; }

// ---- growing strings ----

typedef struct {
    char *s;
    size_t len, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s) {
    size_t n = strlen(s);
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->s = xrealloc(b->s, b->cap);
    }
    memcpy(b->s + b->len, s, n + 1);
    b->len += n;
}

// ---- the plan of one prompt ----

#define MAX_NEEDLES 6
#define CWE_COMMON 5
#define CWE_COMMON_FREQ 12
#define CWE_RARE_FREQ 2

typedef struct {
    const eval_spec *spec;
    const eval_haystack *h;
    uint64_t hay_seed, shuffle_seed;
    char preamble[256], question[256], prefix[128];
    char needles[MAX_NEEDLES][128];   // in text order
    double at[MAX_NEEDLES];          // depth of each needle in [0,1], ascending
    int n_needles;
} plan;

static const char *const ADJ[] = {
    "amber", "brisk", "crimson", "dusty", "eager", "frosty", "gentle", "hollow",
    "ivory", "jolly", "lunar", "misty", "noble", "olive", "proud", "rusty",
    "scarlet", "silver", "tidy", "vivid", "woolen", "zesty", "bright", "velvet"};
static const char *const NOUN[] = {
    "falcon", "harbor", "meadow", "orchard", "pebble", "quarry", "river", "saddle",
    "thimble", "valley", "willow", "anchor", "barrel", "candle", "dragon", "ember",
    "feather", "hammer", "island", "jigsaw", "ladder", "mitten", "compass", "violin"};
#define N_ADJ (sizeof ADJ / sizeof *ADJ)
#define N_NOUN (sizeof NOUN / sizeof *NOUN)

// n distinct keys "adjective noun" (adjective and noun both distinct across keys).
static void pick_keys(uint64_t *st, int n, char keys[][24]) {
    int adj[MAX_NEEDLES], noun[MAX_NEEDLES];
    for (int i = 0; i < n; i++) {
        int fresh;
        do {
            adj[i] = (int)(eval_rand(st) % N_ADJ);
            noun[i] = (int)(eval_rand(st) % N_NOUN);
            fresh = 1;
            for (int j = 0; j < i; j++) fresh &= adj[j] != adj[i] && noun[j] != noun[i];
        } while (!fresh);
        snprintf(keys[i], 24, "%s %s", ADJ[adj[i]], NOUN[noun[i]]);
    }
}

// n distinct numbers with `digits` digits.
static void pick_numbers(uint64_t *st, int n, int digits, long *out) {
    long lo = 1;
    for (int i = 1; i < digits; i++) lo *= 10;
    for (int i = 0; i < n; i++) {
        int fresh;
        do {
            out[i] = lo + (long)(eval_rand(st) % (uint64_t)(9 * lo));
            fresh = 1;
            for (int j = 0; j < i; j++) fresh &= out[j] != out[i];
        } while (!fresh);
    }
}

static double uniform(uint64_t *st) { return (eval_rand(st) >> 11) * (1.0 / 9007199254740992.0); }

static int by_depth(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static const char *const CODES_PREAMBLE =
    "Read the long text below. Hidden in it are secret codes, each one given for a name. "
    "Remember them: afterwards you will be asked about them.\n\n";

static void add_answer(eval_prompt *p, const char *s) {
    snprintf(p->answers[p->n_answers++], sizeof p->answers[0], "%.31s", s);
}

// niah and multikey: the asked needle (key 0) at the sample's depth, n-1 others at random.
static void plan_keys(plan *pl, uint64_t *st, int n, eval_prompt *p) {
    char keys[MAX_NEEDLES][24];
    long vals[MAX_NEEDLES];
    pick_keys(st, n, keys);
    pick_numbers(st, n, 7, vals);
    double d = (pl->spec->sample + 0.5) / pl->spec->n_samples;
    p->depth = d;
    double at[MAX_NEEDLES];
    at[0] = d;
    for (int i = 1; i < n; i++) at[i] = uniform(st);
    // text order: sort needle indices by depth, keeping the asked one's text attached
    int order[MAX_NEEDLES];
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && at[order[j]] < at[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    for (int i = 0; i < n; i++) {
        int k = order[i];
        pl->at[i] = at[k];
        snprintf(pl->needles[i], sizeof pl->needles[i], "The secret code for the %.23s is %ld.",
                 keys[k], vals[k]);
    }
    pl->n_needles = n;
    snprintf(pl->preamble, sizeof pl->preamble, "%s", CODES_PREAMBLE);
    snprintf(pl->question, sizeof pl->question,
             "\n\nQuestion: what is the secret code for the %s? Answer with the number only.",
             keys[0]);
    snprintf(pl->prefix, sizeof pl->prefix, "The secret code for the %s is", keys[0]);
    char v[32];
    snprintf(v, sizeof v, "%ld", vals[0]);
    add_answer(p, v);
}

static void plan_multivalue(plan *pl, uint64_t *st, eval_prompt *p) {
    char key[1][24];
    long vals[4];
    pick_keys(st, 1, key);
    pick_numbers(st, 4, 7, vals);
    pl->n_needles = 4;
    for (int i = 0; i < 4; i++) pl->at[i] = uniform(st);
    qsort(pl->at, 4, sizeof *pl->at, by_depth);
    for (int i = 0; i < 4; i++) {
        snprintf(pl->needles[i], sizeof pl->needles[i], "One of the secret codes for the %.23s is %ld.",
                 key[0], vals[i]);
        char v[32];
        snprintf(v, sizeof v, "%ld", vals[i]);
        add_answer(p, v);
    }
    snprintf(pl->preamble, sizeof pl->preamble, "%s", CODES_PREAMBLE);
    snprintf(pl->question, sizeof pl->question,
             "\n\nQuestion: what are all the secret codes for the %s? List every one of them.",
             key[0]);
    snprintf(pl->prefix, sizeof pl->prefix, "The secret codes for the %s are", key[0]);
}

static void plan_vt(plan *pl, uint64_t *st, eval_prompt *p) {
    enum { HOPS = 5 };
    char names[HOPS][8];
    for (int i = 0; i < HOPS; i++) {
        int fresh;
        do {
            for (int c = 0; c < 5; c++) names[i][c] = (char)('A' + eval_rand(st) % 26);
            names[i][5] = 0;
            fresh = 1;
            for (int j = 0; j < i; j++) fresh &= strcmp(names[i], names[j]) != 0;
        } while (!fresh);
        add_answer(p, names[i]);
    }
    long value;
    pick_numbers(st, 1, 5, &value);
    pl->n_needles = HOPS;
    for (int i = 0; i < HOPS; i++) pl->at[i] = uniform(st);
    qsort(pl->at, HOPS, sizeof *pl->at, by_depth);
    snprintf(pl->needles[0], sizeof pl->needles[0], "VAR %s = %ld.", names[0], value);
    for (int i = 1; i < HOPS; i++)
        snprintf(pl->needles[i], sizeof pl->needles[i], "VAR %s = VAR %s.", names[i], names[i - 1]);
    snprintf(pl->preamble, sizeof pl->preamble,
             "Read the long text below. Hidden in it are variable assignments. Keep track of "
             "them: afterwards you will be asked which variables hold a certain value.\n\n");
    snprintf(pl->question, sizeof pl->question,
             "\n\nQuestion: which variables hold the value %ld, directly or through other "
             "variables? List all of them.", value);
    snprintf(pl->prefix, sizeof pl->prefix, "The variables holding the value %ld are:", value);
}

// cwe word i: three consonant-vowel syllables from a bijection of i (distinct for i < 70^3).
static void cwe_word(uint64_t seed, long i, char out[8]) {
    static const char C[] = "bdfgklmnprstvz", V[] = "aeiou";
    long n = 70L * 70 * 70, x = (long)((i * 7919L + (long)(seed % (uint64_t)n)) % n);
    for (int s = 0; s < 3; s++, x /= 70) {
        out[2 * s] = C[(x % 70) / 5];
        out[2 * s + 1] = V[x % 5];
    }
    out[6] = 0;
}

static void plan_cwe(plan *pl, eval_prompt *p) {
    for (int i = 0; i < CWE_COMMON; i++) {
        char w[8];
        cwe_word(pl->shuffle_seed, i, w);
        add_answer(p, w);
    }
    snprintf(pl->preamble, sizeof pl->preamble,
             "Below is a numbered list of words. A few words occur much more often than the "
             "rest.\n\n");
    snprintf(pl->question, sizeof pl->question,
             "\n\nQuestion: which five words occur most often in the list above? Answer with "
             "the five words only.");
    snprintf(pl->prefix, sizeof pl->prefix, "The five most frequent words are:");
}

// ---- building the text for k units ----

// cwe body: the common words CWE_COMMON_FREQ times, k rare words CWE_RARE_FREQ times, shuffled.
static void cwe_body(const plan *pl, long k, sbuf *b) {
    long n = CWE_COMMON * CWE_COMMON_FREQ + k * CWE_RARE_FREQ;
    long *w = xmalloc((size_t)n * sizeof(long));
    long at = 0;
    for (long i = 0; i < CWE_COMMON; i++)
        for (int r = 0; r < CWE_COMMON_FREQ; r++) w[at++] = i;
    for (long i = 0; i < k; i++)
        for (int r = 0; r < CWE_RARE_FREQ; r++) w[at++] = CWE_COMMON + i;
    uint64_t st = pl->shuffle_seed;
    for (long i = n - 1; i > 0; i--) {
        long j = (long)(eval_rand(&st) % (uint64_t)(i + 1)), t = w[i];
        w[i] = w[j];
        w[j] = t;
    }
    for (long i = 0; i < n; i++) {
        char word[8], line[32];
        cwe_word(pl->shuffle_seed, w[i], word);
        snprintf(line, sizeof line, "%s%ld. %s", i ? "\n" : "", i + 1, word);
        sb_add(b, line);
    }
    free(w);
}

// Haystack body: k sentences with needle j placed before sentence round(at[j] * k).
static void hay_body(const plan *pl, long k, sbuf *b) {
    int next = 0, first = 1;
    for (long i = 0; i <= k; i++) {
        for (; next < pl->n_needles && (long)(pl->at[next] * k + 0.5) <= i; next++) {
            sb_add(b, first ? "" : " ");
            sb_add(b, pl->needles[next]);
            first = 0;
        }
        if (i == k) break;
        char *s = eval_haystack_sentence(pl->h, pl->hay_seed, i);
        sb_add(b, first ? "" : " ");
        sb_add(b, s);
        free(s);
        first = 0;
    }
}

// The whole prompt text for k units (malloc'd).
static char *build(const plan *pl, const tok *t, long k) {
    sbuf user = {0};
    sb_add(&user, pl->preamble);
    if (pl->spec->task == EVAL_CWE) cwe_body(pl, k, &user);
    else hay_body(pl, k, &user);
    sb_add(&user, pl->question);
    sbuf all = {0};
    char *chat = pl->spec->chat
                     ? tok_chat_apply(tok_chat_kind(t), tok_chat_default_system(t), user.s)
                     : NULL;
    sb_add(&all, chat ? chat : user.s);
    sb_add(&all, chat ? "" : "\n\n");
    sb_add(&all, pl->prefix);
    free(chat);
    free(user.s);
    return all.s;
}

static int count(const plan *pl, const tok *t, long k, char *err, size_t errlen) {
    char *text = build(pl, t, k);
    int *ids = NULL, n = tok_encode_prompt(t, text, strlen(text), 1, &ids, err, errlen);
    free(text);
    free(ids);
    return n;
}

// The largest k whose prompt has at most budget tokens; -2 + err if not even k = 0 fits, -1 + err
// on a tokenizer failure.
static long fit(const plan *pl, const tok *t, int budget, char *err, size_t errlen) {
    int t0 = count(pl, t, 0, err, errlen);
    if (t0 < 0) return -1;
    if (t0 > budget) {
        err_printf(err, errlen, "%s needs %d prompt tokens before any filler, more than "
                   "--n-prompt %d leaves (%d after the answer's %d)",
                   eval_task_name(pl->spec->task), t0, pl->spec->ctx, budget,
                   eval_task_n_gen(pl->spec->task));
        return -2;
    }
    long k = (budget - t0) / 16 + 1;
    for (int it = 0; it < 6; it++) {   // secant steps on tokens(k) = t0 + k * per_unit
        int tk = count(pl, t, k, err, errlen);
        if (tk < 0) return -1;
        double per = (double)(tk - t0) / k;
        long next = per > 0 ? (long)((budget - t0) / per) : k;
        if (next < 1) next = 1;
        if (next == k) break;
        k = next;
    }
    int tk;
    while (k > 0 && (tk = count(pl, t, k, err, errlen)) > budget) k--;
    while ((tk = count(pl, t, k + 1, err, errlen)) >= 0 && tk <= budget) k++;
    return tk < 0 ? -1 : k;
}

int eval_make_prompt(const tok *t, const eval_haystack *h, const eval_spec *spec, eval_prompt *p,
                     char *err, size_t errlen) {
    *p = (eval_prompt){.depth = -1};
    uint64_t st = spec->seed * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)spec->task << 48) ^
                  ((uint64_t)spec->ctx << 20) ^ (uint64_t)spec->sample;
    eval_rand(&st);
    plan pl = {.spec = spec, .h = h, .hay_seed = eval_rand(&st), .shuffle_seed = eval_rand(&st)};
    switch (spec->task) {
    case EVAL_NIAH: plan_keys(&pl, &st, 1, p); break;
    case EVAL_MULTIKEY: plan_keys(&pl, &st, 4, p); break;
    case EVAL_MULTIVALUE: plan_multivalue(&pl, &st, p); break;
    case EVAL_VT: plan_vt(&pl, &st, p); break;
    default: plan_cwe(&pl, p); break;
    }
    long k = fit(&pl, t, spec->ctx - eval_task_n_gen(spec->task), err, errlen);
    if (k < 0) return (int)k;
    p->text = build(&pl, t, k);
    p->n_ids = tok_encode_prompt(t, p->text, strlen(p->text), 1, &p->ids, err, errlen);
    if (p->n_ids < 0) return -1;
    // the context: the tokens the prompt shares with its text cut before the question
    plan cut = pl;
    cut.question[0] = 0, cut.prefix[0] = 0;
    char *text = build(&cut, t, k);
    int *ids = NULL, n = tok_encode_prompt(t, text, strlen(text), 1, &ids, err, errlen);
    free(text);
    if (n < 0) return -1;
    while (p->n_context < n && p->n_context < p->n_ids && ids[p->n_context] == p->ids[p->n_context]) p->n_context++;
    free(ids);
    return 0;
}

void eval_prompt_free(eval_prompt *p) {
    free(p->text);
    free(p->ids);
    *p = (eval_prompt){0};
}
