// policies/registry.c — the strategies by name: the registered ones, and compositions
// PREFILL+DECODE made on first use (policies/compose.c runs them); strategy_prefill and
// strategy_check route a name's calls to its strategy or to its two parts.
#include <stdio.h>
#include <string.h>

#include "compose.h"
#include "policy.h"

extern const strategy strategy_full, strategy_speed, strategy_fastkv, strategy_snapkv,
    strategy_streamingllm, strategy_specprefill, strategy_swiftkv, strategy_topk_phi, strategy_topk;

static const strategy *const all_strategies[] = {
    &strategy_full, &strategy_speed, &strategy_fastkv, &strategy_snapkv, &strategy_streamingllm,
    &strategy_specprefill, &strategy_swiftkv, &strategy_topk_phi, &strategy_topk};
#define N_STRATEGIES (int)(sizeof all_strategies / sizeof *all_strategies)

// Composed strategies, made on first use: one slot per (prefill part, decode part) pair.
static strategy composed[N_STRATEGIES * N_STRATEGIES];
static char composed_name[N_STRATEGIES * N_STRATEGIES][64];

// The registered strategy called name[0..len), or NULL.
static const strategy *find_base(const char *name, size_t len) {
    for (int i = 0; i < N_STRATEGIES; i++)
        if (strlen(all_strategies[i]->name) == len && strncmp(all_strategies[i]->name, name, len) == 0)
            return all_strategies[i];
    return NULL;
}

// A split of name at a '+' into two registered strategies (*a + *b), the first '+' that works.
static int split_pair(const char *name, const strategy **a, const strategy **b) {
    for (const char *p = strchr(name, '+'); p; p = strchr(p + 1, '+')) {
        *a = find_base(name, (size_t)(p - name));
        *b = find_base(p + 1, strlen(p + 1));
        if (*a && *b) return 1;
    }
    return 0;
}

const char *strategy_refusal(const char *name) {
    static char why[256];
    const strategy *a, *b;
    if (find_base(name, strlen(name)) || !split_pair(name, &a, &b)) return NULL;
    if (a->phase == PHASE_DECODE && b->phase == PHASE_DECODE)
        snprintf(why, sizeof why, "%s: two decode strategies do not compose (each replaces the "
                 "decode attention)", name);
    else if (a->phase == PHASE_DECODE)
        snprintf(why, sizeof why, "%s: the decode strategy goes second (%s+%s)", name, b->name, a->name);
    else if (b->phase == PHASE_NONE)
        snprintf(why, sizeof why, "%s: decoding with full attention is what %s does alone", name, a->name);
    else
        snprintf(why, sizeof why, "%s: two prefill strategies do not compose (each builds the "
                 "cache its own way); a prefill strategy composes with a decode strategy "
                 "(topk, topk+phi)", name);
    return why;
}

const strategy *strategy_find(const char *name) {
    const strategy *a, *b;
    if ((a = find_base(name, strlen(name)))) return a;
    if (!split_pair(name, &a, &b) || a->phase == PHASE_DECODE || b->phase != PHASE_DECODE) return NULL;
    int i = 0, j = 0;
    while (all_strategies[i] != a) i++;
    while (all_strategies[j] != b) j++;
    strategy *c = &composed[i * N_STRATEGIES + j];
    if (!c->name) {
        char *nm = composed_name[i * N_STRATEGIES + j];
        snprintf(nm, sizeof composed_name[0], "%s+%s", a->name, b->name);
        *c = (strategy){.name = nm, .about = "a prefill strategy, then a decode strategy",
                        .supplies_qkv = a->supplies_qkv, .phase = PHASE_PREFILL,
                        .prefill_part = a, .decode_part = b};
    }
    return c;
}

kv_cache *strategy_prefill(const strategy *s, context *cx, const int *ids, int n, int n_gen,
                           const strategy_opts *o, const strategy_run *run, float *logits,
                           prefill_info *info, char *err, size_t errlen) {
    static const strategy_run none;   // no draft, no end test, greedy, nothing counted
    if (!run) run = &none;
    const strategy *pre = s->prefill_part ? s->prefill_part : s;
    const kv_prefix *pf = run->prefix;
    if (pf && pf->by && pf->by == pre && pf->n < n) {   // compress once, ask many: pre's part done
        cx->prefix = NULL;
        kv_cache *kv = prefix_resume(cx, pf, ids, n, n_gen, logits, info, err, errlen);
        if (kv && s->decode_part && s->decode_part->attach(cx, kv, n, o, run, info, err, errlen) != 0) {
            kv_free(kv);
            return NULL;
        }
        return kv;
    }
    if (s->decode_part)
        return compose_prefill(s->prefill_part, s->decode_part, cx, ids, n, n_gen, o, run, logits,
                               info, err, errlen);
    return s->prefill(cx, ids, n, n_gen, o, run, logits, info, err, errlen);
}

void strategy_cost(const strategy *s, const cost_shape *sh, const strategy_opts *o, cost_work *w) {
    const strategy *p = s->prefill_part ? s->prefill_part : s, *d = s->decode_part ? s->decode_part : s;
    *w = (cost_work){0};
    if (p->cost_prefill) p->cost_prefill(sh, o, w);
    else cost_full_prefill(sh, w);
    if (d->cost_decode) d->cost_decode(sh, o, w);
    else cost_dense_decode(sh, w);
}

int strategy_chunks(const strategy *s) {
    if (s->prefill_part) return strategy_chunks(s->prefill_part);   // full+Y runs Y's prefill
    return s->phase == PHASE_NONE || s->phase == PHASE_DECODE;
}

long strategy_prefill_rows(const strategy *s, long n, int ubatch) {
    return strategy_chunks(s) && ubatch > 0 && ubatch < n ? ubatch : n;
}

long strategies_prefill_rows(const strategy *const *list, int n, long n_tok, int ubatch, int *chunks) {
    long rows = n > 0 ? 0 : n_tok;
    int all = n > 0;
    for (int i = 0; i < n; i++) {
        long r = strategy_prefill_rows(list[i], n_tok, ubatch);
        rows = r > rows ? r : rows;
        all &= strategy_chunks(list[i]);
    }
    if (chunks) *chunks = all;
    return rows;
}

int strategy_check(const strategy *s, const model *m, const strategy_opts *o, char *err,
                   size_t errlen) {
    if (s->decode_part) return compose_check(s->prefill_part, s->decode_part, m, o, err, errlen);
    return s->check ? s->check(m, o, err, errlen) : 0;
}

int strategy_count(void) { return N_STRATEGIES; }
const strategy *strategy_at(int i) { return all_strategies[i]; }

const char *strategy_names(void) {
    static char buf[256];
    if (!buf[0])
        for (int i = 0; i < N_STRATEGIES; i++) {
            if (i) strcat(buf, ", ");
            strcat(buf, all_strategies[i]->name);
        }
    return buf;
}
