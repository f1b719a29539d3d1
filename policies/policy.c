// policies/policy.c — the strategy registry and the generation loop all strategies share:
// prefill (strategy-specific) -> sample -> decode one token at a time at position n + t.
#include "policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../util/check.h"

extern const strategy strategy_full;
extern const strategy strategy_speed;
extern const strategy strategy_fastkv;
extern const strategy strategy_snapkv;
extern const strategy strategy_streamingllm;
extern const strategy strategy_specprefill;
extern const strategy strategy_swiftkv;
extern const strategy strategy_topk_phi;
extern const strategy strategy_topk;

static const strategy *const all_strategies[] = {
    &strategy_full, &strategy_speed, &strategy_fastkv, &strategy_snapkv, &strategy_streamingllm,
    &strategy_specprefill, &strategy_swiftkv, &strategy_topk_phi, &strategy_topk};
#define N_STRATEGIES (int)(sizeof all_strategies / sizeof *all_strategies)

const strategy *strategy_find(const char *name) {
    for (int i = 0; i < N_STRATEGIES; i++)
        if (strcmp(all_strategies[i]->name, name) == 0) return all_strategies[i];
    return NULL;
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

strategy_opts strategy_opts_default(void) {
    return (strategy_opts){.anchor = 1, .tsp_layer = -1, .tsp_rate = 0.2f, .kv_rate = 0.1f,
                           .window = 8, .pool_kernel = 7, .keep = 0.3f, .lookahead = 8,
                           .chunk = 32, .spec_pool = 13, .swiftkv_fold = -1, .sink = 4,
                           .tail = 16, .topk = -1, .budget = 0.02f};
}

kv_cache *prefill_run(model *m, const int *ids, int n, int n_gen, const int *caps,
                      const fwd_hooks *hooks, float *logits, prefill_info *info, char *err,
                      size_t errlen) {
    int L = m->cfg.n_layer;
    int *all = xmalloc((size_t)L * sizeof(int)), *pos = xmalloc((size_t)n * sizeof(int));
    for (int l = 0; l < L; l++) all[l] = caps ? caps[l] : n + n_gen;
    for (int i = 0; i < n; i++) pos[i] = i;
    kv_cache *kv = fwd_kv_create(m, all, err, errlen);
    if (kv) info->rows_done = fwd_run(m, kv, ids, pos, n, hooks, logits, 0);
    free(all);
    free(pos);
    return kv;
}

double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int run_generate(const strategy *s, model *m, const strategy_opts *o, const int *ids, int n,
                 int n_predict, sampler *smp, run_token_fn on_token, void *ctx, run_stats *st,
                 char *err, size_t errlen) {
    return run_generate_first(s, m, o, ids, n, n_predict, smp, on_token, ctx, st, NULL, err,
                              errlen);
}

int run_generate_first(const strategy *s, model *m, const strategy_opts *o, const int *ids, int n,
                       int n_predict, sampler *smp, run_token_fn on_token, void *ctx,
                       run_stats *st, float *first_logits, char *err, size_t errlen) {
    gen_seq g;
    if (gen_begin(&g, s, m, o, ids, n, n_predict, smp, on_token, ctx, first_logits, err, errlen))
        return -1;
    gen_seq *one = &g;
    while (!g.done) gen_step(&one, 1);
    gen_end(&g);
    *st = g.st;
    return 0;
}

int gen_begin(gen_seq *g, const strategy *s, model *m, const strategy_opts *o, const int *ids,
              int n, int n_predict, sampler *smp, run_token_fn on_token, void *ctx,
              float *first_logits, char *err, size_t errlen) {
    memset(g, 0, sizeof *g);
    *g = (gen_seq){.m = m, .smp = smp, .on_token = on_token, .ctx = ctx, .n_prompt = n,
                   .n_predict = n_predict};
    g->st.prompt_n = n;
    g->logits = xmalloc((size_t)m->cfg.vocab * sizeof(float));
    double t0 = now_ms();
    g->kv = s->prefill(m, ids, n, n_predict, o, g->logits, &g->info, err, errlen);
    if (!g->kv) {
        free(g->logits);
        return -1;
    }
    g->st.rows_done = g->info.rows_done;
    memcpy(g->st.note, g->info.note, sizeof g->info.note);
    g->st.kv_bytes = kv_bytes(g->kv);
    if (first_logits) memcpy(first_logits, g->logits, (size_t)m->cfg.vocab * sizeof(float));
    g->tok = sample_next(smp, g->logits);
    g->st.prompt_ms = now_ms() - t0;
    g->st.predicted_n = 1;
    g->done = on_token(ctx, g->tok) || n_predict <= 1;
    return 0;
}

void gen_step(gen_seq *const *g, int k) {
    fwd_seq seqs[FWD_MAX_BATCH];
    gen_seq *live[FWD_MAX_BATCH];
    int pos[FWD_MAX_BATCH], b = 0;
    for (int i = 0; i < k; i++) {
        if (g[i]->done) continue;
        CHECK_INTERNAL(b < FWD_MAX_BATCH && g[i]->m == g[0]->m, "a decode step of %d sequences", k);
        live[b] = g[i];
        pos[b] = g[i]->n_prompt + g[i]->st.predicted_n - 1;   // the last sampled token's position
        seqs[b] = (fwd_seq){g[i]->kv, &g[i]->tok, &pos[b], 1, &g[i]->info.decode, g[i]->logits, 0};
        b++;
    }
    if (b == 0) return;
    double t0 = now_ms();
    fwd_run_batch(live[0]->m, seqs, b);
    for (int i = 0; i < b; i++) {
        gen_seq *s = live[i];
        s->tok = sample_next(s->smp, s->logits);
        s->st.decode_runs++;
        s->st.predicted_n++;
        s->done = s->on_token(s->ctx, s->tok) || s->st.predicted_n >= s->n_predict;
    }
    double dt = now_ms() - t0;   // a shared step: each sequence waited all of it
    for (int i = 0; i < b; i++) live[i]->st.decode_ms += dt;
}

void gen_end(gen_seq *g) {
    run_stats *st = &g->st;
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
