// policies/generate.c — the generation loop all strategies share: prefill (the strategy's) ->
// sample -> decode one token at a time at position n + t, one sequence (run_generate) or many
// sharing each decode pass (gen_begin, gen_step, gen_end); several full prefills packed into one
// pass (gen_open, gen_prefill_packed); a sequence's copy after its prefill (gen_fork, gen_first),
// so that several answers share one prefill.
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../util/check.h"
#include "policy.h"

// Rows [lo, hi) of a prompt (ids; pos: its positions, NULL: 0 .. hi-1) into kv, which holds
// its rows before lo, without hooks, in passes along the prompt's chunk grid: the chunks [kU,
// (k+1)U) of U = cx->p.ubatch rows (0: the whole prompt one chunk), cut at lo and hi. Only the
// last pass computes logits (its last row's, into logits: may be NULL). A pass shorter than its
// chunk of a prompt of n_as rows, [kU, min(n_as, (k+1)U)), chooses its products' path as that
// chunk does (context.rows_as): a suffix after a reused prefix, or a prefix's last rows, round
// as in the prompt's own prefill. Rows over layers, as fwd_run.
static long run_span(context *cx, kv_cache *kv, const int *ids, const int *pos, int lo, int hi,
                     int n_as, float *logits) {
    int U = cx->p.ubatch > 0 && cx->p.ubatch < n_as ? cx->p.ubatch : 0;
    long rows = 0;
    int *own = NULL;
    if (!pos) {
        pos = own = xmalloc((size_t)hi * sizeof(int));
        for (int i = 0; i < hi; i++) own[i] = i;
    }
    int chunked = U > 0 && U < hi - lo;
    if (chunked) cx->prefill_total = hi;
    for (int b = lo; b < hi;) {
        int c0 = U ? b / U * U : 0, c1 = U ? c0 + U : n_as;
        if (c1 > n_as) c1 = n_as;
        int e = U && c0 + U < hi ? c0 + U : hi;
        cx->prefill_done = chunked ? b : 0;
        cx->rows_as = e - b < c1 - c0 ? c1 - c0 : 0;
        rows += fwd_run(cx, kv, ids + b, pos + b, e - b, NULL, e == hi ? logits : NULL, 0);
        b = e;
    }
    cx->rows_as = 0;
    cx->prefill_done = cx->prefill_total = 0;
    free(own);
    return rows;
}

// ids (n,) at pos (n,; NULL: 0 .. n-1) into the empty kv: run_span of the whole prompt.
static long run_chunked(context *cx, kv_cache *kv, const int *ids, const int *pos, int n,
                        float *logits) {
    return run_span(cx, kv, ids, pos, 0, n, n, logits);
}

int prefix_cut(int share, int n_min, int ubatch) {
    int P = share < n_min - PREFIX_REST ? share : n_min - PREFIX_REST;
    if (P <= 0) return 0;
    int k0 = ubatch > 0 ? P / ubatch * ubatch : 0;
    return k0 + (P - k0) / PREFIX_ALIGN * PREFIX_ALIGN;
}

kv_prefix *prefix_build(context *cx, const int *ids, int n, int n_as, char *err, size_t errlen) {
    double t0 = now_ms();
    int L = cx->m->cfg.n_layer, *caps = xmalloc((size_t)L * sizeof(int));
    for (int l = 0; l < L; l++) caps[l] = n;
    kv_cache *kv = fwd_kv_create(cx, caps, err, errlen);
    free(caps);
    if (!kv) return NULL;
    kv_prefix *p = xcalloc(1, sizeof *p);
    p->kv = kv, p->n = n;
    p->ids = xmalloc((size_t)n * sizeof(int));
    memcpy(p->ids, ids, (size_t)n * sizeof(int));
    run_span(cx, kv, ids, NULL, 0, n, n_as > n ? n_as : n, NULL);
    p->ms = now_ms() - t0;
    return p;
}

kv_prefix *prefix_build_with(context *cx, const strategy *s, const strategy_opts *o,
                             const strategy_run *run, const int *ids, int n, char *err, size_t errlen) {
    CHECK_INTERNAL(s->compresses_prefix, "a prefix compressed by '%s'", s->name);
    double t0 = now_ms();
    float *logits = xmalloc((size_t)cx->m->cfg.vocab * sizeof(float));   // not wanted
    prefill_info info = {0};
    cx->prefix = NULL;
    kv_cache *kv = s->prefill(cx, ids, n, 0, o, run, logits, &info, err, errlen);
    free(logits);
    if (!kv) return NULL;
    kv_prefix *p = xcalloc(1, sizeof *p);
    p->kv = kv, p->n = n, p->by = s;
    p->ids = xmalloc((size_t)n * sizeof(int));
    memcpy(p->ids, ids, (size_t)n * sizeof(int));
    snprintf(p->note, sizeof p->note, "%.199s", info.note);
    p->ms = now_ms() - t0;
    return p;
}

kv_cache *prefix_resume(context *cx, const kv_prefix *pf, const int *ids, int n, int n_gen,
                        float *logits, prefill_info *info, char *err, size_t errlen) {
    CHECK_INTERNAL(pf->n < n && !memcmp(pf->ids, ids, (size_t)pf->n * sizeof(int)),
                   "a prompt of %d tokens resumed from a prefix of %d it does not start with", n, pf->n);
    int L = cx->m->cfg.n_layer, *caps = xmalloc((size_t)L * sizeof(int)), *pos = xmalloc((size_t)n * sizeof(int));
    for (int l = 0; l < L; l++) caps[l] = pf->kv->layers[l].len + (n - pf->n) + n_gen;
    for (int i = 0; i < n; i++) pos[i] = i;
    kv_cache *kv = fwd_kv_copy_caps(cx, pf->kv, caps, err, errlen);
    if (kv) {
        info->rows_done = run_span(cx, kv, ids, pos, pf->n, n, n, logits);
        info->prefix_n = pf->n, info->prefix_compressed = 1;
        snprintf(info->note, sizeof info->note, "the first %d tokens compressed once by %s for the "
                 "requests that share them, query-agnostic (scored by their own last tokens)%s%.150s",
                 pf->n, pf->by->name, pf->note[0] ? ": " : "", pf->note);
    }
    free(caps);
    free(pos);
    return kv;
}

void prefix_free(kv_prefix *p) {
    if (!p) return;
    kv_free(p->kv);
    free(p->ids);
    free(p);
}

kv_cache *prefill_run(context *cx, const int *ids, int n, int n_gen, const int *caps,
                      const fwd_hooks *hooks, float *logits, prefill_info *info, char *err,
                      size_t errlen) {
    model *m = cx->m;
    int L = m->cfg.n_layer;
    int *all = xmalloc((size_t)L * sizeof(int)), *pos = xmalloc((size_t)n * sizeof(int));
    for (int l = 0; l < L; l++) all[l] = caps ? caps[l] : n + n_gen;
    for (int i = 0; i < n; i++) pos[i] = i;
    // a shared prefix this prompt starts with (gen_begin): copied, the rest prefilled after it;
    // taken by this prefill alone (a plain one: no hooks, every layer's capacity the prompt's)
    const kv_prefix *pf = cx->prefix;
    cx->prefix = NULL;
    int P = pf && !hooks && !caps && pf->n < n && !memcmp(pf->ids, ids, (size_t)pf->n * sizeof(int)) ? pf->n : 0;
    kv_cache *kv = P ? fwd_kv_copy_caps(cx, pf->kv, all, err, errlen) : fwd_kv_create(cx, all, err, errlen);
    if (kv && hooks) info->rows_done = fwd_run(cx, kv, ids, pos, n, hooks, logits, 0);
    else if (kv) info->rows_done = run_span(cx, kv, ids, pos, P, n, n, logits), info->prefix_n = P;
    free(all);
    free(pos);
    return kv;
}

// The backend's counts now (zero when it keeps none); *allocs = the passes' allocations of cx
// and of a draft's context.
static bk_counters counts_now(const context *cx, const strategy_run *run, unsigned long long *allocs) {
    backend *bk = cx->m->bk;
    bk_counters k = {0};
    if (bk->counters) bk->counters(bk, &k);
    if (allocs) *allocs = cx->pass_allocs + (run && run->draft ? run->draft->pass_allocs : 0);
    return k;
}

static void counters_json(FILE *out, bk_counters k, double per) {
    const unsigned long long *v = &k.h2d_bytes;
    static const char *const NAMES[] = {"h2d_bytes", "d2h_bytes", "syncs", "allocs", "launches",
                                        "graph_replays"};
    for (int i = 0; i < 6; i++)
        fprintf(out, "%s\"%s\":%.6g", i ? "," : "{", NAMES[i], per > 0 ? v[i] / per : (double)v[i]);
    fprintf(out, "}");
}

void run_stats_counters_json(FILE *out, const run_stats *st) {
    if (!st->has_counters) {
        fprintf(out, "null");
        return;
    }
    fprintf(out, "{\"prefill\":");
    counters_json(out, st->dev_prefill, 0);
    fprintf(out, ",\"decode_step\":");
    if (st->dev_decode_steps) counters_json(out, st->dev_decode, st->dev_decode_steps);
    else fprintf(out, "null");
    fprintf(out, "}");
}

double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int run_generate(const strategy *s, context *cx, const strategy_opts *o, const strategy_run *run,
                 const int *ids, int n, int n_predict, sampler *smp, run_token_fn on_token,
                 void *ctx, run_stats *st, float *first_logits, char *err, size_t errlen) {
    gen_seq g;
    if (gen_begin(&g, s, cx, o, run, ids, n, n_predict, smp, on_token, ctx, first_logits, err,
                  errlen))
        return -1;
    gen_seq *one = &g;
    while (!g.done) gen_step(&one, 1);
    gen_end(&g);
    *st = g.st;
    return 0;
}

int run_warm_up(const strategy *s, context *cx, const strategy_opts *o, const strategy_run *run, int n,
                char *err, size_t errlen) {
    model *m = cx->m;
    int *ids = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) ids[i] = (100 + 7 * i) % m->cfg.vocab;
    sampler smp;
    sampler_init(&smp, &(sample_params){.temp = 0, .seed = 1}, m->cfg.vocab);
    run_stats st;
    int rc = run_generate(s, cx, o, run, ids, n, 2, &smp, NULL, NULL, &st, NULL, err, errlen);
    sampler_free(&smp);
    free(ids);
    return rc;
}

int gen_begin(gen_seq *g, const strategy *s, context *cx, const strategy_opts *o,
              const strategy_run *run, const int *ids, int n, int n_predict, sampler *smp,
              run_token_fn on_token, void *ctx, float *first_logits, char *err, size_t errlen) {
    const model *m = cx->m;
    *g = (gen_seq){.cx = cx, .smp = smp, .on_token = on_token, .ctx = ctx, .n_prompt = n,
                   .n_predict = n_predict};
    g->st.prompt_n = n, g->st.prefill_shared = 1;
    g->logits = xmalloc((size_t)m->cfg.vocab * sizeof(float));
    double t0 = now_ms();
    unsigned long long a0, a1;
    bk_counters k0 = counts_now(cx, run, &a0);
    context *dcx = run && run->draft && run->draft != cx ? run->draft : NULL;
    double h0 = cx->hook_ms + (dcx ? dcx->hook_ms : 0);
    strategy_run r = run ? *run : (strategy_run){0};   // the request's sampling, for tokens
    r.sampling = smp->p;                                // the strategy draws itself
    cx->prefix = r.prefix;   // for a plain prefill to take (prefill_run), cleared after
    g->kv = strategy_prefill(s, cx, ids, n, n_predict, o, &r, g->logits, &g->info, err, errlen);
    cx->prefix = NULL;
    if (!g->kv) {
        free(g->logits);
        return -1;
    }
    g->st.rows_done = g->info.rows_done;
    g->st.draft_rows = g->info.draft_rows;
    g->st.prefix_n = g->info.prefix_n;
    g->st.prefix_compressed = g->info.prefix_compressed;
    g->st.hook_ms = cx->hook_ms + (dcx ? dcx->hook_ms : 0) - h0;
    memcpy(g->st.note, g->info.note, sizeof g->info.note);
    memcpy(g->st.label, g->info.label, sizeof g->info.label);
    g->st.kv_bytes = kv_bytes(g->kv);
    if (first_logits) memcpy(first_logits, g->logits, (size_t)m->cfg.vocab * sizeof(float));
    gen_first(g, smp, on_token, ctx);
    g->st.prompt_ms = now_ms() - t0;
    g->st.has_counters = m->bk->counters != NULL;
    g->st.dev_prefill = bk_counters_add(counts_now(cx, run, &a1), k0, -1);
    g->st.dev_prefill.allocs = a1 - a0;
    return 0;
}

int gen_packs(const strategy *s) {
    return s->phase == PHASE_NONE && !s->prefill_part && !s->decode_part;   // full
}

int gen_open(gen_seq *g, const strategy *s, context *cx, const int *ids, int n, int n_predict,
             sampler *smp, run_token_fn on_token, void *ctx, char *err, size_t errlen) {
    model *m = cx->m;
    CHECK_INTERNAL(gen_packs(s) && n >= 1, "strategy '%s' opened for a packed prefill", s->name);
    *g = (gen_seq){.cx = cx, .smp = smp, .on_token = on_token, .ctx = ctx, .n_prompt = n,
                   .n_predict = n_predict, .ids = ids, .t_open = now_ms()};
    g->st.prompt_n = n;
    int L = m->cfg.n_layer, *caps = xmalloc((size_t)L * sizeof(int));
    for (int l = 0; l < L; l++) caps[l] = n + n_predict;   // as prefill_run gives full
    g->kv = fwd_kv_create(cx, caps, err, errlen);
    free(caps);
    if (!g->kv) return -1;
    g->logits = xmalloc((size_t)m->cfg.vocab * sizeof(float));
    return 0;
}

// What gen_begin does after its prefill, for s prefilled in a pass shared by `shared` prompts.
static void packed_done(gen_seq *s, int shared) {
    s->st.kv_bytes = kv_bytes(s->kv);
    s->st.prefill_shared = shared;
    s->fed = 1, s->ids = NULL;
    gen_first(s, s->smp, s->on_token, s->ctx);
    s->st.prompt_ms = now_ms() - s->t_open;
}

int gen_prefill_packed(gen_seq *const *g, int k, int max_rows) {
    context *cx = g[0]->cx;
    const model *m = cx->m;
    CHECK_INTERNAL(k >= 1 && !g[0]->fed && g[0]->ids, "a packed prefill of %d sequences", k);
    // with --ubatch U a pass holds at most U rows: a longer g[0] runs alone in chunks (as
    // prefill_run would run it), the others pack up to U rows
    int U = cx->p.ubatch;
    if (U > 0 && g[0]->n_prompt > U) {
        gen_seq *s = g[0];
        s->info.rows_done = s->st.rows_done = run_chunked(cx, s->kv, s->ids, NULL, s->n_prompt, s->logits);
        packed_done(s, 1);
        return 1;
    }
    if (U > 0 && max_rows > U) max_rows = U;
    // g[0]'s rounding class, and the LM head's (one row per prompt: one alone)
    int cls = fwd_row_class(m, g[0]->n_prompt), head = fwd_row_class(m, 1);
    int pick[FWD_MAX_BATCH], b = 1, rows = g[0]->n_prompt, longest = rows;
    pick[0] = 0;
    for (int i = 1; i < k && cls >= 0 && head >= 0 && b < FWD_MAX_BATCH; i++) {
        const gen_seq *s = g[i];
        int n = s->n_prompt;
        if (s->fed || !s->ids || s->cx != cx || rows + n > max_rows || fwd_row_class(m, n) != cls ||
            fwd_row_class(m, rows + n) != cls || fwd_row_class(m, b + 1) != head)
            continue;
        pick[b++] = i, rows += n;
        if (n > longest) longest = n;
    }
    int *pos = xmalloc((size_t)longest * sizeof(int));   // every prompt from position 0
    for (int i = 0; i < longest; i++) pos[i] = i;
    fwd_seq seqs[FWD_MAX_BATCH];
    for (int j = 0; j < b; j++) {
        gen_seq *s = g[pick[j]];
        seqs[j] = (fwd_seq){s->kv, s->ids, pos, s->n_prompt, NULL, s->logits, 0, NULL, 0};
    }
    CHECK_INTERNAL(fwd_run_batch(cx, seqs, b) == 0, "a packed prefill without hooks aborted");
    free(pos);
    for (int j = 0; j < b; j++) {
        gen_seq *s = g[pick[j]];
        s->info.rows_done = s->st.rows_done = seqs[j].rows_done;
        packed_done(s, b);
    }
    return b;
}

void gen_first(gen_seq *g, sampler *smp, run_token_fn on_token, void *ctx) {
    g->smp = smp, g->on_token = on_token, g->ctx = ctx;
    g->tok = sample_next(smp, g->logits);
    g->st.predicted_n = 1;
    g->done = (on_token && on_token(ctx, g->tok)) || g->n_predict <= 1;
}

// Whether src's decode needs nothing but its cache: no hooks, no decode state, no side data.
static int decode_plain(const gen_seq *src) {
    const prefill_info *i = &src->info;
    const fwd_hooks *h = &i->decode;
    return !h->ctx && !h->after_attention && !h->after_layer && !h->kv_source && !h->attention &&
           !i->decode_free && !i->decode_report && !i->decode_read_bytes && !i->decode_selected &&
           !src->kv->side;
}

int gen_fork(gen_seq *dst, const gen_seq *src, const char *strategy_name, char *err, size_t errlen) {
    if (!decode_plain(src))
        return err_printf(err, errlen, "strategy '%s' keeps per-sequence decode state that cannot "
                          "be copied: several choices (n > 1) need a strategy whose decode reads "
                          "only its cache (full, or a prefill strategy)", strategy_name) - 1;
    const model *m = src->cx->m;
    kv_cache *kv = fwd_kv_copy(src->cx, src->kv, err, errlen);
    if (!kv) return -1;
    *dst = *src;
    dst->kv = kv;
    dst->logits = xmalloc((size_t)m->cfg.vocab * sizeof(float));
    memcpy(dst->logits, src->logits, (size_t)m->cfg.vocab * sizeof(float));
    dst->smp = NULL, dst->on_token = NULL, dst->ctx = NULL;
    dst->tok = -1, dst->done = 0, dst->read_sum = 0;
    // the prefill is the source's: the copy's own work starts at its first token
    dst->st.prompt_n = 0, dst->st.prompt_ms = 0, dst->st.rows_done = 0, dst->st.draft_rows = 0, dst->st.hook_ms = 0;
    dst->st.predicted_n = 0, dst->st.decode_runs = 0, dst->st.decode_ms = 0;
    dst->st.dev_prefill = (bk_counters){0}, dst->st.dev_decode = (bk_counters){0};
    dst->st.dev_decode_steps = 0;
    return 0;
}

void gen_step(gen_seq *const *g, int k) {
    fwd_seq seqs[FWD_MAX_BATCH];
    gen_seq *live[FWD_MAX_BATCH];
    int pos[FWD_MAX_BATCH], b = 0;
    for (int i = 0; i < k; i++) {
        if (g[i]->done) continue;
        CHECK_INTERNAL(b < FWD_MAX_BATCH && g[i]->cx == g[0]->cx, "a decode step of %d sequences", k);
        live[b] = g[i];
        pos[b] = g[i]->n_prompt + g[i]->st.predicted_n - 1;   // the last sampled token's position
        seqs[b] = (fwd_seq){g[i]->kv, &g[i]->tok, &pos[b], 1, &g[i]->info.decode, g[i]->logits, 0,
                            g[i]->smp, 0};
        b++;
    }
    if (b == 0) return;
    for (int i = 0; i < b; i++)   // a plain decode step reads every cached entry + its own
        if (!live[i]->info.decode_read_bytes) {
            const kv_cache *kv = live[i]->kv;
            double e = 0;
            for (int l = 0; l < kv->n_layer; l++) {
                const kv_layer *y = &kv->layers[l];
                e += (double)(y->len + (y->cap > y->len)) * y->n_kv_head * (y->k_row + y->v_row);
            }
            live[i]->read_sum += e;
        }
    double t0 = now_ms();
    bk_counters k0 = counts_now(live[0]->cx, NULL, NULL);
    fwd_decode(live[0]->cx, seqs, b);
    for (int i = 0; i < b; i++) {
        gen_seq *s = live[i];
        s->tok = seqs[i].token;
        s->st.decode_runs++;
        s->st.predicted_n++;
        s->done = (s->on_token && s->on_token(s->ctx, s->tok)) || s->st.predicted_n >= s->n_predict;
    }
    double dt = now_ms() - t0;   // a shared step: each sequence waited all of it
    bk_counters dk = bk_counters_add(counts_now(live[0]->cx, NULL, NULL), k0, -1);
    for (int i = 0; i < b; i++) {
        live[i]->st.decode_ms += dt;
        if (live[i]->st.decode_runs >= 2)   // after its first step (which sizes the buffers)
            live[i]->st.dev_decode = bk_counters_add(live[i]->st.dev_decode, dk, 1),
            live[i]->st.dev_decode_steps++;
    }
}

void gen_end(gen_seq *g) {
    run_stats *st = &g->st;
    if (g->info.decode_read_bytes) st->kv_read_per_step = g->info.decode_read_bytes(g->info.decode.ctx);
    else if (st->decode_runs) st->kv_read_per_step = g->read_sum / st->decode_runs;
    st->selector_recall = g->info.decode_recall ? g->info.decode_recall(g->info.decode.ctx) : -1;
    if (g->info.decode_report) {
        size_t used = strlen(st->note);
        if (used && used + 2 < sizeof st->note) used += (size_t)snprintf(st->note + used, 3, "; ");
        g->info.decode_report(g->info.decode.ctx, st->note + used, sizeof st->note - used);
    }
    if (g->info.decode_free) g->info.decode_free(g->info.decode.ctx);
    kv_free(g->kv);
    free(g->logits);
    g->kv = NULL, g->logits = NULL;
}
