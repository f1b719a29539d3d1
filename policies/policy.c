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
    memset(st, 0, sizeof *st);
    st->prompt_n = n;
    float *logits = xmalloc((size_t)m->cfg.vocab * sizeof(float));
    double t0 = now_ms();
    prefill_info info = {0};
    kv_cache *kv = s->prefill(m, ids, n, n_predict, o, logits, &info, err, errlen);
    if (!kv) {
        free(logits);
        return -1;
    }
    st->rows_done = info.rows_done;
    memcpy(st->note, info.note, sizeof info.note);
    st->kv_bytes = kv_bytes(kv);
    if (first_logits) memcpy(first_logits, logits, (size_t)m->cfg.vocab * sizeof(float));
    int tok = sample_next(smp, logits);
    st->prompt_ms = now_ms() - t0;
    st->predicted_n = 1;
    int stop = on_token(ctx, tok);
    double t1 = now_ms();
    for (int t = 1; t < n_predict && !stop; t++) {
        int pos = n + t - 1;
        fwd_run(m, kv, &tok, &pos, 1, &info.decode, logits, 0);
        tok = sample_next(smp, logits);
        st->decode_runs++;
        st->predicted_n++;
        stop = on_token(ctx, tok);
    }
    st->decode_ms = now_ms() - t1;
    if (info.decode_report) {
        size_t used = strlen(st->note);
        if (used && used + 2 < sizeof st->note) used += (size_t)snprintf(st->note + used, 3, "; ");
        info.decode_report(info.decode.ctx, st->note + used, sizeof st->note - used);
    }
    if (info.decode_free) info.decode_free(info.decode.ctx);
    kv_free(kv);
    free(logits);
    return 0;
}
