// jobs/prefix.c — the job's shared prefixes (--prefix-cache): requests whose tokens start
// alike (one document, many questions; one long system message) prefill what they share once.
// Sharing is found from the tokens: every request of the job tokenized up front, the token
// sequences sorted, runs of neighbours sharing --prefix-min tokens grouped on what they all share
// (a part of a run sharing --prefix-min more grouped on its own), each group's prefix cut where a
// prefill may stop and resume bit for bit (policies/policy.h: prefix_cut). A group's prefix is
// prefilled when its first request starts (policies/generate.c: prefix_build), each unit whose
// strategy prefills plainly (full, topk, topk+phi, full+Y: strategy_chunks) copies its cache and
// prefills only its own rest, and it is freed when its last unit has copied it: a prefix's cache
// is held from its first request's start to its last one's.
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <errno.h>
#include <sys/stat.h>

#include "../policies/prompt_cache.h"
#include "internal.h"

// One prefix of a group as a kind of unit copies it: plain (by NULL) or compressed by the prefill
// strategy `by` (--prefix-cache on: compress once, ask many).
typedef struct prefix_entry {
    const strategy *by;
    kv_prefix *pf;      // built by its first user; NULL before, and after its last
    int users;          // units still to copy it
    int failed;         // building it failed (out of memory): its units prefill alone
} prefix_entry;

struct prefix_group {
    int n;              // the prefix's tokens
    int *ids;           // them (the first request's)
    int n_req;          // requests in the group
    int n_as;           // the shortest prefill among its users (for its last chunk's products)
    prefix_entry e[MAX_STRATEGIES + 1];
    int n_e;
};

// Whether u would copy its request's prefix, and which (*by: NULL a plain one, for a strategy that
// prefills plainly: full, topk, topk+phi, full+Y; else, with --prefix-cache on, the prefill
// strategy that compresses one: its prefill part's, compresses_prefix). Only choice 0 of a request.
static int user_of(const runner *R, const unit *u, const strategy **by) {
    *by = NULL;
    if (u->choice != 0) return 0;
    if (strategy_chunks(u->s)) return 1;
    const strategy *pre = u->s->prefill_part ? u->s->prefill_part : u->s;
    if (R->o->prefix_cache > 0 && pre->compresses_prefix) {
        *by = pre;
        return 1;
    }
    return 0;
}
static int is_user(const runner *R, const unit *u) {
    const strategy *by;
    return user_of(R, u, &by);
}
static int plain_user(const runner *R, const unit *u) {
    const strategy *by;
    return user_of(R, u, &by) && !by;
}

// The rows u's strategy prefills of a prompt of n tokens before its rest may start: all (full, a
// prefill strategy), or all but the last (a decode strategy alone or after full runs the last one
// through its decode hooks).
static int prefill_rows(const runner *R, const unit *u, int n) {
    const strategy *by;
    user_of(R, u, &by);
    return by || (u->s->phase == PHASE_NONE && !u->s->decode_part) ? n : n - 1;
}

// The entry of group g for prefixes by `by` (made when missing).
static prefix_entry *entry(struct prefix_group *g, const strategy *by) {
    for (int i = 0; i < g->n_e; i++)
        if (g->e[i].by == by) return &g->e[i];
    CHECK_INTERNAL(g->n_e < MAX_STRATEGIES + 1, "a shared prefix of %d kinds", g->n_e + 1);
    g->e[g->n_e] = (prefix_entry){.by = by};
    return &g->e[g->n_e++];
}

typedef struct { int *ids, n, job; } seq_ref;

static int seq_cmp(const void *a, const void *b) {
    const seq_ref *x = a, *y = b;
    int n = x->n < y->n ? x->n : y->n;
    for (int i = 0; i < n; i++)
        if (x->ids[i] != y->ids[i]) return x->ids[i] < y->ids[i] ? -1 : 1;
    return (x->n > y->n) - (x->n < y->n);
}

static int lcp(const seq_ref *x, const seq_ref *y) {
    int n = x->n < y->n ? x->n : y->n, i = 0;
    while (i < n && x->ids[i] == y->ids[i]) i++;
    return i;
}

typedef struct {
    runner *R;
    job *jobs;
    seq_ref *s;     // the requests' tokens, sorted
    int *lcp;       // lcp[i]: tokens s[i] and s[i + 1] share
    char *grouped;  // s[i] has its group
    struct prefix_group *g;
    int ng, cap;
} planner;

// A group of the requests s[i] of `members` (not yet grouped) on their first m shared tokens,
// cut where a prefill may stop and resume (prefix_cut) for the shortest of them; none when that
// leaves fewer than --prefix-min tokens.
static void group(planner *pl, const int *members, int k, int m) {
    runner *R = pl->R;
    int n_as = INT_MAX;   // the shortest prefill among the members' users (topk's: n - 1)
    for (int i = 0; i < k; i++) {
        const seq_ref *x = &pl->s[members[i]];
        const job *J = &pl->jobs[x->job];
        for (int u = 0; u < J->n_units; u++)
            if (is_user(R, &J->u[u])) {
                int np = prefill_rows(R, &J->u[u], x->n);
                n_as = np < n_as ? np : n_as;
            }
    }
    int P = prefix_cut(m, n_as, R->cx->p.ubatch);
    if (k < 2 || P < R->o->prefix_min) return;
    if (pl->ng == pl->cap) pl->g = xrealloc(pl->g, (size_t)(pl->cap = pl->cap ? 2 * pl->cap : 8) * sizeof *pl->g);
    struct prefix_group *g = &pl->g[pl->ng++];
    *g = (struct prefix_group){.n = P, .n_req = k, .n_as = n_as};
    g->ids = xmalloc((size_t)P * sizeof(int));
    memcpy(g->ids, pl->s[members[0]].ids, (size_t)P * sizeof(int));
    for (int i = 0; i < k; i++) {
        job *J = &pl->jobs[pl->s[members[i]].job];
        J->rq->prefix_group = pl->ng;
        pl->grouped[members[i]] = 1;
        for (int u = 0; u < J->n_units; u++) {
            const strategy *by;
            if (user_of(R, &J->u[u], &by)) entry(g, by)->users++;
        }
    }
}

// The sorted requests s[a, b) (b - a >= 2), each sharing at least --prefix-min tokens with its
// neighbour: their common prefix (m, the least of their neighbours' shares) is theirs, unless a
// sub-run between the places where the share is m shares --prefix-min tokens more (one document
// of several after one system message): such a sub-run is grouped on its own (recursively), the
// run's others on m.
static void plan_run(planner *pl, int a, int b) {
    int m = INT_MAX;
    for (int i = a; i < b - 1; i++) m = pl->lcp[i] < m ? pl->lcp[i] : m;
    for (int c = a, d; c < b; c = d) {
        d = c + 1;
        while (d < b && pl->lcp[d - 1] > m) d++;
        int mm = INT_MAX;
        for (int i = c; i < d - 1; i++) mm = pl->lcp[i] < mm ? pl->lcp[i] : mm;
        if (d - c >= 2 && mm - m >= pl->R->o->prefix_min) plan_run(pl, c, d);
    }
    int *rest = xmalloc((size_t)(b - a) * sizeof(int)), k = 0;
    for (int i = a; i < b; i++)
        if (!pl->grouped[i]) rest[k++] = i;
    group(pl, rest, k, m);
    free(rest);
}

void prefix_plan(runner *R, job *jobs, int n_jobs) {
    R->prefix_group = NULL, R->n_prefix_group = 0;
    if (!R->prefix_on || n_jobs < 2) return;
    seq_ref *s = xcalloc((size_t)n_jobs, sizeof *s);
    int n = 0;
    char err[512];
    for (int j = 0; j < n_jobs; j++) {   // the requests with a unit that would copy a prefix
        job *J = &jobs[j];
        int users = 0;
        for (int k = 0; k < J->n_units; k++) users += is_user(R, &J->u[k]);
        if (J->rq->error || users == 0) continue;
        int *ids = NULL, m = jobs_prompt_ids(R, J->rq, &ids, err, sizeof err);
        if (m < 0) continue;   // its unit says why when it starts
        s[n++] = (seq_ref){ids, m, j};
    }
    qsort(s, (size_t)n, sizeof *s, seq_cmp);
    planner pl = {.R = R, .jobs = jobs, .s = s};
    pl.lcp = xcalloc((size_t)(n > 0 ? n : 1), sizeof(int));
    pl.grouped = xcalloc((size_t)(n > 0 ? n : 1), 1);
    for (int i = 0; i + 1 < n; i++) pl.lcp[i] = lcp(&s[i], &s[i + 1]);
    for (int a = 0, b; a < n; a = b) {   // runs whose neighbours share --prefix-min tokens
        b = a + 1;
        while (b < n && pl.lcp[b - 1] >= R->o->prefix_min) b++;
        if (b - a >= 2) plan_run(&pl, a, b);
    }
    for (int i = 0; i < n; i++) free(s[i].ids);
    free(s), free(pl.lcp), free(pl.grouped);
    R->prefix_group = pl.g, R->n_prefix_group = pl.ng;
    long tok = 0;
    int reqs = 0;
    for (int k = 0; k < pl.ng; k++) tok += pl.g[k].n, reqs += pl.g[k].n_req;
    if (!R->o->quiet && pl.ng)
        fprintf(stderr, "sift: prefix cache: %d shared prefix%s (%ld tokens) among %d requests\n",
                pl.ng, pl.ng == 1 ? "" : "es", tok, reqs);
}

// The --prompt-cache file's prefix for u: the longest cut (prefix_cut) of what its tokens share
// with the file's, loaded for that length (kept while later requests take the same); NULL: none.
static const kv_prefix *file_prefix(runner *R, unit *u, int at_least) {
    if (!R->pc_valid || !plain_user(R, u)) return NULL;
    const pcache_view *v = &R->pc_view;
    int n = u->n_ids < v->n_tok ? u->n_ids : v->n_tok, share = 0;
    while (share < n && u->ids[share] == pcache_token(v, share)) share++;
    int P = prefix_cut(share, prefill_rows(R, u, u->n_ids), R->cx->p.ubatch);
    if (P < 1 || P < at_least) return NULL;
    if (!R->pc_prefix || R->pc_prefix->n != P) {
        prefix_free(R->pc_prefix);
        char err[512];
        R->pc_prefix = pcache_prefix(R->cx, v, P, err, sizeof err);
        if (!R->pc_prefix) {
            if (!R->o->quiet) fprintf(stderr, "sift: prompt cache: not loaded (%s)\n", err);
            R->pc_valid = 0;
            return NULL;
        }
        R->pc_load_ms += R->pc_prefix->ms;
    }
    R->pc_loaded_tok += P;
    return R->pc_prefix;
}

const kv_prefix *prefix_take(runner *R, unit *u) {
    int k = u->rq->prefix_group - 1;
    const strategy *by;
    if (u->prefix_counted || !user_of(R, u, &by)) return NULL;
    const kv_prefix *f = by ? NULL : file_prefix(R, u, k >= 0 ? R->prefix_group[k].n : 0);
    if (f || k < 0) return f;
    struct prefix_group *g = &R->prefix_group[k];
    prefix_entry *e = entry(g, by);
    if (e->failed || u->n_ids <= g->n || memcmp(u->ids, g->ids, (size_t)g->n * sizeof(int)))
        return NULL;   // its tokens changed since the plan (a file rewritten): it prefills alone
    if (!e->pf) {
        char err[512];
        e->pf = by ? prefix_build_with(R->cx, by, R->o->so, R->o->run, g->ids, g->n, err, sizeof err)
                   : prefix_build(R->cx, g->ids, g->n, g->n_as, err, sizeof err);
        if (!e->pf) {
            e->failed = 1;
            if (!R->o->quiet)
                fprintf(stderr, "sift: prefix cache: a shared prefix of %d tokens%s%s not kept (%s): its "
                        "requests prefill it each\n", g->n, by ? " compressed by " : "", by ? by->name : "", err);
            return NULL;
        }
        R->prefix_built++, R->prefix_tok += g->n, R->prefix_ms += e->pf->ms;
        size_t b = kv_bytes(e->pf->kv);
        R->prefix_bytes += b;
        if (R->prefix_bytes > R->prefix_peak) R->prefix_peak = R->prefix_bytes;
    }
    return e->pf;
}

void prefix_put(runner *R, unit *u) {
    int k = u->rq->prefix_group - 1;
    const strategy *by;
    if (k < 0 || u->prefix_counted || !user_of(R, u, &by)) return;
    u->prefix_counted = 1;
    prefix_entry *e = entry(&R->prefix_group[k], by);
    if (--e->users > 0 || !e->pf) return;
    R->prefix_bytes -= kv_bytes(e->pf->kv);
    prefix_free(e->pf);   // its last user has its copy
    e->pf = NULL;
}

int prefix_file_open(runner *R, char *err, size_t errlen) {
    const run_opts *o = R->o;
    if (!o->prompt_cache) return 0;
    int plain = 0;
    for (int i = 0; i < o->n_strategies; i++) plain |= strategy_chunks(o->strategies[i]);
    if (!plain)
        return err_printf(err, errlen, "--prompt-cache holds a plain prefill, which strategy '%s' "
                          "does not run (full, topk, topk+phi and full+Y read one)", o->strategies[0]->name) - 1;
    FILE *f = fopen(o->prompt_cache, "rb");
    if (!f && errno == ENOENT) {
        if (o->prompt_cache_ro)
            return err_printf(err, errlen, "--prompt-cache-ro: %s does not exist", o->prompt_cache) - 1;
        return 0;   // made after the first prompt's prefill
    }
    if (!f) return err_printf(err, errlen, "--prompt-cache %s: %s", o->prompt_cache, strerror(errno)) - 1;
    struct stat st;
    double t0 = now_ms();
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return err_printf(err, errlen, "--prompt-cache %s: not a regular file", o->prompt_cache) - 1;
    }
    R->pc_len = (size_t)st.st_size;
    R->pc_buf = malloc(R->pc_len ? R->pc_len : 1);
    if (!R->pc_buf) {
        fclose(f);
        return err_printf(err, errlen, "--prompt-cache %s: out of memory for %zu bytes", o->prompt_cache, R->pc_len) - 1;
    }
    size_t got = fread(R->pc_buf, 1, R->pc_len, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || got != R->pc_len)
        return err_printf(err, errlen, "--prompt-cache %s: read %zu of %zu bytes", o->prompt_cache, got, R->pc_len) - 1;
    pcache_meta want = pcache_meta_of(R->cx, o->weights);
    if (pcache_parse(R->pc_buf, R->pc_len, o->prompt_cache, 0, &R->pc_view, err, errlen) ||
        pcache_match(&R->pc_view, &want, o->prompt_cache, err, errlen) ||
        pcache_check_tokens(&R->pc_view, R->m->cfg.vocab, o->prompt_cache, err, errlen))
        return -1;
    R->pc_valid = 1;
    R->pc_load_ms = now_ms() - t0;   // read and checked; each prefix's upload adds its time
    if (!o->quiet)
        fprintf(stderr, "sift: prompt cache: %s holds %d tokens (%.1f MiB)\n", o->prompt_cache,
                R->pc_view.n_tok, R->pc_len / 1048576.0);
    return 0;
}

void prefix_file_save(runner *R, unit *u) {
    const run_opts *o = R->o;
    if (!o->prompt_cache || o->prompt_cache_ro || R->pc_saved || !plain_user(R, u)) return;
    int S = prefix_cut(u->n_ids, prefill_rows(R, u, u->n_ids), R->cx->p.ubatch);
    if (S < 1) return;
    R->pc_saved = 1;   // the run's first plain prefill, whatever comes of it
    if (R->pc_valid && R->pc_view.n_tok >= S) {   // the file holds these tokens already?
        int same = 1;
        for (int i = 0; i < S && same; i++) same = pcache_token(&R->pc_view, i) == u->ids[i];
        if (same) return;
    }
    char err[600];
    pcache_meta meta = pcache_meta_of(R->cx, o->weights);
    double t0 = now_ms();
    if (pcache_save(o->prompt_cache, &meta, R->cx, u->g.kv, u->ids, S, err, sizeof err) != 0) {
        fprintf(stderr, "sift: error: %s\n", err);
        R->pc_failed = 1;
        return;
    }
    R->pc_saved_tok = S;
    if (!o->quiet)
        fprintf(stderr, "sift: prompt cache: the first %d tokens of '%s' saved to %s in %.2f s\n", S,
                u->rq->id, o->prompt_cache, (now_ms() - t0) / 1e3);
}

void prefix_plan_free(runner *R) {
    prefix_free(R->pc_prefix);
    R->pc_prefix = NULL;
    free(R->pc_buf);
    R->pc_buf = NULL;
    for (int k = 0; k < R->n_prefix_group; k++) {
        for (int i = 0; i < R->prefix_group[k].n_e; i++) prefix_free(R->prefix_group[k].e[i].pf);
        free(R->prefix_group[k].ids);
    }
    free(R->prefix_group);
    R->prefix_group = NULL, R->n_prefix_group = 0;
}
