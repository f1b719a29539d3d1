// policies/policy.c — the strategy registry and the generation loop all strategies share:
// prefill (strategy-specific) -> sample -> decode one token at a time at position n + t.
#include "policy.h"
#include "compose.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
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

kv_cache *strategy_prefill(const strategy *s, model *m, const int *ids, int n, int n_gen,
                           const strategy_opts *o, float *logits, prefill_info *info, char *err,
                           size_t errlen) {
    if (s->decode_part)
        return compose_prefill(s->prefill_part, s->decode_part, m, ids, n, n_gen, o, logits, info,
                               err, errlen);
    return s->prefill(m, ids, n, n_gen, o, logits, info, err, errlen);
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

#define OFF(f) offsetof(strategy_opts, f)
static const opt_def OPTS[] = {
    {"--speed-depth", "K", OPT_INT, OFF(speed_depth), 1, 4096, NULL, 0, "ceil(0.875 L)", "speed",
     "layers that see the prompt"},
    {"--anchor", "bos|none", OPT_CHOICE, OFF(anchor), 0, 0, "bos=1|none=0", 1, NULL, "speed",
     "keep the first prompt token in upper layers"},
    {"--tsp-layer", "N", OPT_INT, OFF(tsp_layer), 0, 4096, NULL, -1, "L/2-1", "fastkv",
     "token-selective propagation after layer N"},
    {"--tsp-rate", "R", OPT_FLOAT, OFF(tsp_rate), 1e-6, 1, NULL, 0.2, NULL, "fastkv",
     "share of rows propagated, (0,1]"},
    {"--kv-rate", "R", OPT_FLOAT, OFF(kv_rate), 1e-6, 1, NULL, 0.1, NULL,
     "fastkv, snapkv, streamingllm", "KV kept per layer, (0,1]"},
    {"--window", "W", OPT_INT, OFF(window), 1, 1 << 20, NULL, 8, NULL, "fastkv, snapkv",
     "observation window, always kept"},
    {"--pool-kernel", "K", OPT_ODD, OFF(pool_kernel), 1, 1025, NULL, 7, NULL, "fastkv, snapkv",
     "window-score pooling kernel, odd"},
    {"--pool", "max|avg", OPT_CHOICE, OFF(pool), 0, 0, "max=0|avg=1", 0, NULL, "fastkv, snapkv",
     "window-score pooling: max (padding ignored) or avg (zero padding, / kernel)"},
    {"--kv-len", "N", OPT_INT, OFF(kv_len), 0, 1 << 30, NULL, 0, NULL, "fastkv, snapkv",
     "KV kept per layer and KV head, a fixed count > --window; 0 = --kv-rate"},
    {"--tsp-len", "N", OPT_INT, OFF(tsp_len), 0, 1 << 30, NULL, 0, NULL, "fastkv",
     "rows propagated past the TSP layer, a fixed count > --window; 0 = --tsp-rate"},
    {"--keep", "P", OPT_FLOAT, OFF(keep), 1e-6, 1, NULL, 0.3, NULL, "specprefill",
     "share of prompt chunks kept, (0,1]"},
    {"--lookahead", "N", OPT_INT, OFF(lookahead), 1, 1024, NULL, 8, NULL, "specprefill",
     "draft query rows incl. the last prompt token"},
    {"--chunk", "C", OPT_INT, OFF(chunk), 1, 1 << 20, NULL, 32, NULL, "specprefill",
     "chunk size in tokens"},
    {"--spec-pool", "K", OPT_ODD, OFF(spec_pool), 1, 1025, NULL, 13, NULL, "specprefill",
     "average-pool kernel, odd"},
    {"--draft", "MODEL", OPT_PATH, OFF(draft_path), 0, 0, NULL, 0, "none", "specprefill",
     "draft model with the same vocabulary"},
    {"--draft-layers", "N", OPT_INT, OFF(draft_layers), 1, 4096, NULL, 0, "ceil(L/2) without --draft",
     "specprefill", "self-draft from the main model's first N layers"},
    {"--keep-last", "on|off", OPT_CHOICE, OFF(keep_last), 0, 0, "on=1|off=0", 1, NULL,
     "specprefill", "always keep the last chunk; off: the top chunks alone (the authors' code)"},
    {"--swiftkv-layers", "l", OPT_INT, OFF(swiftkv_layers), 1, 4096, NULL, 0,
     "L/2, or a checkpoint's own", "swiftkv", "layers the whole prompt runs"},
    {"--swiftkv-group", "G", OPT_INT, OFF(swiftkv_group), 1, 4096, NULL, 0, "1", "swiftkv",
     "layers sharing one KV cache, divides L-l"},
    {"--swiftkv-norm", "own|shared", OPT_CHOICE, OFF(swiftkv_fold), 0, 0, "own=1|shared=0", -1,
     "shared", "swiftkv", "training-free init: each layer's input norm folded into its K/V "
     "(own), or layer l's norm (shared); without a distilled checkpoint EXPERIMENTAL "
     "(bench/EVAL.md)"},
    {"--sink", "N", OPT_INT, OFF(sink), 0, 1 << 20, NULL, 4, NULL, "topk+phi, topk",
     "anchors read exactly at decode: the first N prompt tokens"},
    {"--tail", "N", OPT_INT, OFF(tail), 0, 1 << 20, NULL, 16, NULL, "topk+phi, topk",
     "anchors read exactly at decode: the last N prompt tokens"},
    {"--topk", "K", OPT_INT, OFF(topk), 0, 1 << 22, NULL, -1, "from --budget", "topk+phi, topk",
     "entries retrieved per query head; 0 = sink + tail only"},
    {"--budget", "F", OPT_FLOAT, OFF(budget), 1e-6, 1, NULL, 0.02, NULL, "topk+phi, topk",
     "exact reads as a share of the prompt, phi cache included; the K it leaves is raised to "
     "min(16, mid tokens) when lower (a short prompt), and the note says so"},
    {"--phi", "FILE", OPT_PATH, OFF(phi_path), 0, 0, NULL, 0, "random features", "topk+phi",
     "fitted maps (sift fit-phi)"},
};
#define N_OPTS (int)(sizeof OPTS / sizeof *OPTS)

const opt_def *strategy_opts_table(int *n) {
    *n = N_OPTS;
    return OPTS;
}

const opt_def *strategy_opt_find(const char *flag) {
    for (int i = 0; i < N_OPTS; i++)
        if (strcmp(OPTS[i].flag, flag) == 0) return &OPTS[i];
    return NULL;
}

// The value of choice `name` in "a=1|b=0"; 0 or -1 when it is not one.
static int choice_value(const char *choices, const char *name, int *value) {
    size_t n = strlen(name);
    for (const char *p = choices; *p;) {
        const char *eq = strchr(p, '='), *bar = strchr(p, '|');
        if ((size_t)(eq - p) == n && strncmp(p, name, n) == 0) {
            *value = atoi(eq + 1);
            return 0;
        }
        if (!bar) break;
        p = bar + 1;
    }
    return -1;
}

int strategy_opt_set(strategy_opts *o, const opt_def *d, const char *v, char *err, size_t errlen) {
    char *field = (char *)o + d->offset, *end;
    if (d->type == OPT_PATH) {
        *(const char **)field = v;
        return 0;
    }
    if (d->type == OPT_CHOICE) {
        if (choice_value(d->choices, v, (int *)field) == 0) return 0;
        char names[128];   // "a=1|b=0" -> "a or b"
        size_t j = 0;
        for (const char *p = d->choices; *p && j + 5 < sizeof names; p++)
            if (*p == '|') j += (size_t)snprintf(names + j, sizeof names - j, " or ");
            else if (*p == '=') p += strcspn(p, "|") - 1;
            else names[j++] = *p;
        names[j] = 0;
        return err_printf(err, errlen, "%s must be %s, not '%s'", d->flag, names, v);
    }
    errno = 0;
    double x = d->type == OPT_FLOAT ? strtod(v, &end) : (double)strtoll(v, &end, 10);
    if (errno || end == v || *end || !isfinite(x))
        return err_printf(err, errlen, "invalid %s '%s' for %s", d->type == OPT_FLOAT ? "number"
                          : "integer", v, d->flag);
    if (x < d->lo || x > d->hi)
        return err_printf(err, errlen, "%s %s is out of range [%g, %g]", d->flag, v, d->lo, d->hi);
    if (d->type == OPT_ODD && (long long)x % 2 == 0)
        return err_printf(err, errlen, "%s %s must be odd (a window centred on each token)", d->flag, v);
    if (d->type == OPT_FLOAT) *(float *)field = (float)x;
    else *(int *)field = (int)x;
    return 0;
}

int strategy_opt_used_by(const opt_def *d, const char *name) {
    const strategy *s = strategy_find(name);
    if (s && s->decode_part)
        return strategy_opt_used_by(d, s->prefill_part->name) || strategy_opt_used_by(d, s->decode_part->name);
    size_t n = strlen(name);
    for (const char *p = d->used_by; p && *p;) {
        size_t k = strcspn(p, ",");
        if (k == n && strncmp(p, name, n) == 0) return 1;
        p += k;
        while (*p == ',' || *p == ' ') p++;
    }
    return 0;
}

void strategy_opt_json(const strategy_opts *o, const opt_def *d, char *buf, size_t len) {
    const char *field = (const char *)o + d->offset;
    if (d->type == OPT_PATH) {
        const char *s = *(const char *const *)field;
        if (!s) snprintf(buf, len, "null");
        else {   // a path: quotes and backslashes escaped, control bytes dropped
            size_t j = 0;
            buf[j++] = '"';
            for (; *s && j + 3 < len; s++) {
                if (*s == '"' || *s == '\\') buf[j++] = '\\';
                if ((unsigned char)*s >= 0x20) buf[j++] = *s;
            }
            buf[j++] = '"';
            buf[j] = 0;
        }
    } else if (d->type == OPT_FLOAT) snprintf(buf, len, "%.6g", *(const float *)field);
    else snprintf(buf, len, "%d", *(const int *)field);
}

strategy_opts strategy_opts_default(void) {
    strategy_opts o;
    memset(&o, 0, sizeof o);
    for (int i = 0; i < N_OPTS; i++) {
        char *field = (char *)&o + OPTS[i].offset;
        if (OPTS[i].type == OPT_FLOAT) *(float *)field = (float)OPTS[i].def;
        else if (OPTS[i].type != OPT_PATH) *(int *)field = (int)OPTS[i].def;
    }
    return o;
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

int run_warm_up(const strategy *s, model *m, const strategy_opts *o, int n, char *err,
                size_t errlen) {
    int *ids = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) ids[i] = (100 + 7 * i) % m->cfg.vocab;
    sampler smp;
    sampler_init(&smp, &(sample_params){.temp = 0, .seed = 1}, m->cfg.vocab);
    run_stats st;
    int rc = run_generate(s, m, o, ids, n, 2, &smp, NULL, NULL, &st, err, errlen);
    sampler_free(&smp);
    free(ids);
    return rc;
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
    strategy_opts so = *o;   // the request's sampling, for tokens the strategy draws itself
    so.sampling = smp->p;
    g->kv = strategy_prefill(s, m, ids, n, n_predict, &so, g->logits, &g->info, err, errlen);
    if (!g->kv) {
        free(g->logits);
        return -1;
    }
    g->st.rows_done = g->info.rows_done;
    g->st.draft_rows = g->info.draft_rows;
    memcpy(g->st.note, g->info.note, sizeof g->info.note);
    memcpy(g->st.label, g->info.label, sizeof g->info.label);
    g->st.kv_bytes = kv_bytes(g->kv);
    if (first_logits) memcpy(first_logits, g->logits, (size_t)m->cfg.vocab * sizeof(float));
    g->tok = sample_next(smp, g->logits);
    g->st.prompt_ms = now_ms() - t0;
    g->st.predicted_n = 1;
    g->done = (on_token && on_token(ctx, g->tok)) || n_predict <= 1;
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
                e += (double)(y->len + (y->cap > y->len)) * y->n_kv_head * 2 * y->head_dim;
            }
            live[i]->read_sum += e * kv->elem_bytes;
        }
    double t0 = now_ms();
    fwd_decode(live[0]->m, seqs, b);
    for (int i = 0; i < b; i++) {
        gen_seq *s = live[i];
        s->tok = seqs[i].token;
        s->st.decode_runs++;
        s->st.predicted_n++;
        s->done = (s->on_token && s->on_token(s->ctx, s->tok)) || s->st.predicted_n >= s->n_predict;
    }
    double dt = now_ms() - t0;   // a shared step: each sequence waited all of it
    for (int i = 0; i < b; i++) live[i]->st.decode_ms += dt;
}

void gen_end(gen_seq *g) {
    run_stats *st = &g->st;
    if (g->info.decode_read_bytes) st->kv_read_per_step = g->info.decode_read_bytes(g->info.decode.ctx);
    else if (st->decode_runs) st->kv_read_per_step = g->read_sum / st->decode_runs;
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

void strategy_settings_json(FILE *out, const strategy_opts *so, const char *strategy_name) {
    int n, first = 1;
    const opt_def *t = strategy_opts_table(&n);
    fputc('{', out);
    for (int i = 0; i < n; i++) {
        if (!strategy_opt_used_by(&t[i], strategy_name)) continue;
        char v[600], key[40];
        strategy_opt_json(so, &t[i], v, sizeof v);
        size_t k = 0;
        for (const char *p = t[i].flag + 2; *p && k + 1 < sizeof key; p++) key[k++] = *p == '-' ? '_' : *p;
        key[k] = 0;
        fprintf(out, "%s\"%s\":%s", first ? "" : ",", key, v);
        first = 0;
    }
    fputc('}', out);
}
