// jobs/prefix.c — the job's shared prefixes (--prefix-cache): requests whose tokens start
// alike (one document, many questions; one long system message) prefill what they share once.
// Sharing is found from the tokens: every request of the job tokenized up front, the token
// sequences sorted, each request's longest common prefix with its neighbours (the longest it
// shares with any request), aligned to where a prompt's prefill may stop and resume bit for bit
// (policies/policy.h: prefix_aligned); requests with the same aligned prefix of at least
// --prefix-min tokens form a group. A group's prefix is prefilled when its first request starts
// (policies/generate.c: prefix_build), each unit whose strategy prefills plainly (full, topk,
// topk+phi, full+Y: strategy_chunks) copies its cache and prefills only its own rest, and it is
// freed when its last unit has copied it: a prefix's cache is held from its first request's start
// to its last one's.
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct prefix_group {
    int n;              // the prefix's tokens
    int *ids;           // them (the first request's)
    unsigned long long hash;
    int n_req, users;   // requests in the group; units still to copy it
    int n_as;           // the shortest prefill among its users (for its last chunk's products)
    kv_prefix *pf;      // built by its first user; NULL before, and after its last
    int failed;         // building it failed (out of memory): its units prefill alone
};

// A unit that would copy its request's prefix: choice 0 of a strategy that prefills plainly.
static int is_user(const unit *u) { return u->choice == 0 && strategy_chunks(u->s); }

static unsigned long long fnv(const int *v, int n) {
    unsigned long long h = 1469598103934665603ULL;
    for (int i = 0; i < n; i++) h = (h ^ (unsigned)v[i]) * 1099511628211ULL;
    return h;
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

void prefix_plan(runner *R, job *jobs, int n_jobs) {
    R->prefix_group = NULL, R->n_prefix_group = 0;
    if (!R->prefix_on || n_jobs < 2) return;
    seq_ref *s = xcalloc((size_t)n_jobs, sizeof *s);
    int n = 0;
    char err[512];
    for (int j = 0; j < n_jobs; j++) {   // the requests with a unit that would copy a prefix
        job *J = &jobs[j];
        int users = 0;
        for (int k = 0; k < J->n_units; k++) users += is_user(&J->u[k]);
        if (J->rq->error || users == 0) continue;
        int *ids = NULL, m = jobs_prompt_ids(R, J->rq, &ids, err, sizeof err);
        if (m < 0) continue;   // its unit says why when it starts
        s[n++] = (seq_ref){ids, m, j};
    }
    qsort(s, (size_t)n, sizeof *s, seq_cmp);
    int U = R->cx->p.ubatch, cap = 16;
    struct prefix_group *g = xcalloc((size_t)cap, sizeof *g);
    int ng = 0;
    for (int i = 0; i < n; i++) {
        int share = 0;   // the longest prefix it shares with another request
        if (i > 0) share = lcp(&s[i - 1], &s[i]);
        if (i + 1 < n) {
            int b = lcp(&s[i], &s[i + 1]);
            share = b > share ? b : share;
        }
        // at least two of its rows left to prefill (a decode strategy prefills all but the last)
        if (share > s[i].n - 2) share = s[i].n - 2;
        int P = share > 0 ? prefix_aligned(share, U) : 0;
        if (P < R->o->prefix_min || P < 1) continue;
        unsigned long long h = fnv(s[i].ids, P);
        int k = 0;
        while (k < ng && !(g[k].n == P && g[k].hash == h && !memcmp(g[k].ids, s[i].ids, (size_t)P * sizeof(int)))) k++;
        if (k == ng) {
            if (ng == cap) g = xrealloc(g, (size_t)(cap *= 2) * sizeof *g);
            g[ng] = (struct prefix_group){.n = P, .hash = h, .n_as = s[i].n};
            g[ng].ids = xmalloc((size_t)P * sizeof(int));
            memcpy(g[ng].ids, s[i].ids, (size_t)P * sizeof(int));
            ng++;
        }
        g[k].n_req++;
        job *J = &jobs[s[i].job];
        J->rq->prefix_group = k + 1;
        for (int u = 0; u < J->n_units; u++) g[k].users += is_user(&J->u[u]);
        // a decode strategy's prefill is one token shorter than the prompt
        if (s[i].n - 1 < g[k].n_as) g[k].n_as = s[i].n - 1;
    }
    for (int i = 0; i < n; i++) free(s[i].ids);
    free(s);
    // a prefix one request holds (its tokens matched another's only unaligned) is no saving
    for (int j = 0; j < n_jobs; j++)
        if (jobs[j].rq->prefix_group && g[jobs[j].rq->prefix_group - 1].n_req < 2) jobs[j].rq->prefix_group = 0;
    R->prefix_group = g, R->n_prefix_group = ng;
    for (int k = 0; k < ng; k++)
        if (g[k].n_req >= 2) R->prefix_planned++, R->prefix_planned_tok += g[k].n;
    if (!R->o->quiet && R->prefix_planned)
        fprintf(stderr, "sift: prefix cache: %d shared prefix%s (%ld tokens) among %d requests\n",
                R->prefix_planned, R->prefix_planned == 1 ? "" : "es", R->prefix_planned_tok, n);
}

const kv_prefix *prefix_take(runner *R, unit *u) {
    int k = u->rq->prefix_group - 1;
    if (k < 0 || !is_user(u) || u->prefix_counted) return NULL;
    struct prefix_group *g = &R->prefix_group[k];
    if (g->failed || u->n_ids <= g->n || memcmp(u->ids, g->ids, (size_t)g->n * sizeof(int)))
        return NULL;   // its tokens changed since the plan (a file rewritten): it prefills alone
    if (!g->pf) {
        char err[512];
        g->pf = prefix_build(R->cx, g->ids, g->n, g->n_as, err, sizeof err);
        if (!g->pf) {
            g->failed = 1;
            if (!R->o->quiet)
                fprintf(stderr, "sift: prefix cache: a shared prefix of %d tokens not kept (%s): its "
                        "requests prefill it each\n", g->n, err);
            return NULL;
        }
        R->prefix_built++, R->prefix_tok += g->n, R->prefix_ms += g->pf->ms;
        size_t b = kv_bytes(g->pf->kv);
        R->prefix_bytes += b;
        if (R->prefix_bytes > R->prefix_peak) R->prefix_peak = R->prefix_bytes;
    }
    return g->pf;
}

void prefix_put(runner *R, unit *u) {
    int k = u->rq->prefix_group - 1;
    if (k < 0 || !is_user(u) || u->prefix_counted) return;
    u->prefix_counted = 1;
    struct prefix_group *g = &R->prefix_group[k];
    if (--g->users > 0 || !g->pf) return;
    R->prefix_bytes -= kv_bytes(g->pf->kv);
    prefix_free(g->pf);   // its last user has its copy
    g->pf = NULL;
}

void prefix_plan_free(runner *R) {
    for (int k = 0; k < R->n_prefix_group; k++) {
        prefix_free(R->prefix_group[k].pf);
        free(R->prefix_group[k].ids);
    }
    free(R->prefix_group);
    R->prefix_group = NULL, R->n_prefix_group = 0;
}
