// cmd/fit_phi.c — `sift fit-phi`: learns topk+phi's feature maps for a model by distillation
// (specs/topk-phi.md, "Training the maps"). One full prefill of -c tokens of --data text logs,
// per layer, the post-RoPE queries of sampled positions and every key; then per layer and KV
// group the maps are fitted with Adam on the spec's loss (fit/phi_fit.c), support = each
// query's mid region. The output file is rewritten after every layer with a FILE.progress
// note, so an interrupted run resumes at the next layer (same flags, same result: every draw is
// seeded from --seed, the layer and the group). Ends with per-layer held-out KL, fitted vs the
// random-feature fallback, and an end-to-end check on the text after the fit's tokens: decode
// steps with the maps vs the fallback vs topk at the same budget, against full (fit_check); the
// check picks the maps' log-mass offset and records its verdict in the file.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../attn/phi.h"
#include "../fit/phi_fit.h"
#include "../policies/topk_phi.h"
#include "../util/check.h"
#include "../util/outfile.h"
#include "cmd.h"
#include "flags.h"

typedef struct {
    const char *model, *data, *out, *device;
    enum bk_weights weights;   // --weights native|fast|exact|f32 (CPU)
    int ctx, steps, queries, batch, d_phi, sink, tail, threads, positions;
    int check;   // --check N: held-out tokens of the end-to-end check (0: none)
    float lr, cal, margin;
    int recal;   // --recalibrate: keep -o's maps, redo only the calibration
    int verify;  // --verify: keep -o's maps as they are, run only the end-to-end check
    uint64_t seed;
} fit_opts;

typedef struct {   // what the prefill logged
    int n, n_q, *qpos;   // tokens, sampled query positions (n_q,) ascending
    int shift_max, neox; // position augmentation up to --positions (phi_fit_set)
    const float *inv_freq;
    float **q;           // per layer (n_q, heads, hd)
    float **k, **v;      // per layer (n_kv_head, n, hd): keys, values
} fit_log;

static void fit_parse(int argc, char **argv, fit_opts *o) {
    flag_set f;
    flags_parse(&f, SUB_FIT, argc, argv, 2);
    const flag_val *v = f.v;
    *o = (fit_opts){.model = v[FL_MODEL].s, .data = v[FL_DATA].s, .out = v[FL_OUTPUT].s,
                    .device = cli_device(v[FL_DEVICE].s), .weights = cli_weights(v[FL_WEIGHTS].s),
                    .ctx = (int)v[FL_CTX].i, .steps = (int)v[FL_STEPS].i, .queries = (int)v[FL_QUERIES].i,
                    .batch = (int)v[FL_FIT_BATCH].i, .d_phi = (int)v[FL_D_PHI].i, .sink = f.so.sink,
                    .tail = f.so.tail, .threads = (int)v[FL_THREADS].i, .positions = (int)v[FL_POSITIONS].i,
                    .check = (int)v[FL_CHECK].i, .lr = (float)v[FL_LR].f, .cal = (float)v[FL_CALIBRATE].f,
                    .margin = (float)v[FL_MARGIN].f, .recal = v[FL_RECAL].given > 0,
                    .verify = v[FL_VERIFY].given > 0, .seed = (uint64_t)v[FL_SEED].i};
    for (int k = 0; k < f.n_sp; k++)   // the table gives fit-phi topk+phi's --sink and --tail only
        if (f.sp[k].d->offset != offsetof(strategy_opts, sink) && f.sp[k].d->offset != offsetof(strategy_opts, tail))
            cli_usage_error("fit-phi does not take %s", f.sp[k].d->flag);
    if (v[FL_SEED].i < 0) cli_usage_error("fit-phi: --seed -1 (random) is sift run's; the fit is seeded");
    if (o->ctx < 64) cli_usage_error("fit-phi: -c %d: the fit reads at least 64 tokens", o->ctx);
    if (!o->data || !o->out) cli_usage_error("fit-phi needs --data TEXT and -o FILE.phi");
    if (o->verify && o->recal) cli_usage_error("fit-phi: --verify and --recalibrate exclude each other");
    if (o->verify && o->check == 0) cli_usage_error("fit-phi: --verify runs the check: --check must be > 0");
    if (o->threads == 0) o->threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    flags_done(&f);
}

// The data file's tokens (BOS first when the model wants one) into ids (*total of them); returns
// how many the fit uses (the first -c), -1 on error.
static int fit_tokens(const fit_opts *o, const loaded *L, int **ids, int *total_out) {
    char err[512];
    size_t len;
    char *text = tok_read_text(o->data, &len, err, sizeof err);
    int *raw = NULL, n = text && tok_text_check(text, len, o->data, err, sizeof err) == 0
                             ? tok_encode(L->t, text, len, 0, &raw, err, sizeof err) : -1;
    free(text);
    if (n < 0) {
        fprintf(stderr, "sift: error: fit-phi: %s\n", err);
        return -1;
    }
    int bos = tok_add_bos(L->t) && tok_bos(L->t) >= 0, total = n + bos;
    int need = o->sink + o->tail + 64, use = total < o->ctx ? total : o->ctx;
    if (use < need || use > L->m->cfg.ctx_len) {
        fprintf(stderr, "sift: error: fit-phi: %s gives %d tokens; need %d to %d (-c %d, the "
                "model's context %d)\n", o->data, total, need, L->m->cfg.ctx_len, o->ctx,
                L->m->cfg.ctx_len);
        free(raw);
        return -1;
    }
    *ids = xmalloc((size_t)total * sizeof(int));
    if (bos) (*ids)[0] = tok_bos(L->t);
    memcpy(*ids + bos, raw, (size_t)n * sizeof(int));
    free(raw);
    *total_out = total;
    return use;
}

static uint64_t mix(uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// n_q distinct positions, ascending, in [lo, n) (as many as fit), seeded.
static int sample_positions(int lo, int n, int n_q, uint64_t seed, int *pos) {
    int span = n - lo, k = 0;
    char *taken = xcalloc((size_t)span, 1);
    if (n_q > span) n_q = span;
    for (uint64_t t = 0; k < n_q; t++) {
        int p = (int)(mix(seed + t) % (uint64_t)span);
        if (!taken[p]) taken[p] = 1, k++;
    }
    for (int p = 0, j = 0; p < span; p++)
        if (taken[p]) pos[j++] = lo + p;
    free(taken);
    return n_q;
}

static int log_queries(void *ctx, fwd_state *s, int l, const void *q) {
    fit_log *g = ctx;
    const model_config *c = &s->m->cfg;
    size_t row = (size_t)c->n_head * c->head_dim;
    float *all = xmalloc((size_t)s->n * row * sizeof(float));
    s->m->bk->to_host(s->m->bk, all, q, (size_t)s->n * row);
    g->q[l] = xmalloc((size_t)g->n_q * row * sizeof(float));
    for (int i = 0; i < g->n_q; i++)
        memcpy(g->q[l] + i * row, all + (size_t)g->qpos[i] * row, row * sizeof(float));
    free(all);
    return 0;
}

// Full prefill of ids, logging sampled queries and all keys per layer.
static void fit_collect(context *cx, const int *ids, int n, const fit_opts *o, fit_log *g) {
    const model *m = cx->m;
    const model_config *c = &m->cfg;
    int lo = o->sink + o->tail + 32 > n / 4 ? o->sink + o->tail + 32 : n / 4;
    g->n = n;
    g->qpos = xmalloc((size_t)o->queries * sizeof(int));
    g->n_q = sample_positions(lo, n, o->queries, o->seed, g->qpos);
    g->q = xcalloc((size_t)c->n_layer, sizeof(float *));
    g->k = xcalloc((size_t)c->n_layer, sizeof(float *));
    g->v = xcalloc((size_t)c->n_layer, sizeof(float *));
    fwd_hooks hooks = {.ctx = g, .after_attention = log_queries};
    prefill_info info = {0};
    char err[512];
    kv_cache *kv = prefill_run(cx, ids, n, 0, NULL, &hooks, NULL, &info, err, sizeof err);
    CHECK_INTERNAL(kv, "fit-phi prefill: %s", err);
    for (int l = 0; l < c->n_layer; l++) {
        const kv_layer *L = &kv->layers[l];
        size_t per = (size_t)n * c->head_dim;
        g->k[l] = xmalloc((size_t)c->n_kv_head * per * sizeof(float));
        g->v[l] = xmalloc((size_t)c->n_kv_head * per * sizeof(float));
        int native = L->k_type == kv_native_type(m->bk->elem_bytes) &&
                     L->v_type == kv_native_type(m->bk->elem_bytes);
        CHECK_INTERNAL(native || strcmp(m->bk->name, "cpu") == 0, "a %s KV cache on %s",
                       kv_type_name(L->k_type), m->bk->name);
        for (int h = 0; h < c->n_kv_head; h++) {
            const char *kh = (const char *)L->k + (size_t)h * L->cap * L->k_row,
                       *vh = (const char *)L->v + (size_t)h * L->cap * L->v_row;
            if (native) {
                m->bk->to_host(m->bk, g->k[l] + h * per, kh, per);
                m->bk->to_host(m->bk, g->v[l] + h * per, vh, per);
            } else {   // a typed cache on the CPU: host memory, decoded row by row
                kv_rows_decode(L->k_type, g->k[l] + h * per, kh, n, c->head_dim);
                kv_rows_decode(L->v_type, g->v[l] + h * per, vh, n, c->head_dim);
            }
        }
    }
    kv_free(kv);
}

typedef struct {   // one layer's fit, its KV groups running in parallel
    int layer, n_layer, total;   // total = steps x KV groups
    long done;                   // steps done so far (all groups)
    int tty;                     // stderr is a terminal: a bar; else one line per layer
} fit_progress;

typedef struct {
    fit_progress *all;
    int group;
} group_progress;

static void show_progress(void *ctx, int step, double loss) {
    group_progress *gp = ctx;
    fit_progress *p = gp->all;
    long done;
    (void)step;
#pragma omp atomic capture
    done = ++p->done;
    if (!p->tty || flag_verbosity < 1 || (done % 10 && done != p->total)) return;
    double frac = (p->layer + (double)done / p->total) / p->n_layer;
    char bar[31];
    for (int i = 0; i < 30; i++) bar[i] = i < (int)(frac * 30) ? '#' : '.';
    bar[30] = 0;
#pragma omp critical(fit_phi_progress)
    fprintf(stderr, "\rfit-phi [%s] %5.1f%%  layer %d/%d  step %ld/%d  loss %.4f (group %d) ", bar,
            100 * frac, p->layer + 1, p->n_layer, done, p->total, loss, gp->group + 1);
}

// q[0..4) += (held-out KL over the mid region, log-mass bias of the remainder after the top
// --calibrate share) of KV group kvh of layer l under the fitted maps p, then the random
// features prf, each divided by the number of KV heads.
static void quality(const phi_maps *p, const phi_maps *prf, int l, int kvh, const phi_fit_set *d,
                    const int *held, int n_held, double cal, double *q) {
    const float *pq[d->group], *rq[d->group];
    for (int j = 0; j < d->group; j++)
        pq[j] = phi_par_q(p, l, kvh * d->group + j), rq[j] = phi_par_q(prf, l, kvh * d->group + j);
    const float *pk = phi_par_k(p, l, kvh), *rk = phi_par_k(prf, l, kvh);
    q[0] += phi_fit_kl(p, pq, pk, d, held, n_held, NULL) / p->n_kv_head;
    q[1] += phi_fit_kl(prf, rq, rk, d, held, n_held, NULL) / p->n_kv_head;
    q[2] += phi_fit_remainder_bias(p, pq, pk, d, held, n_held, cal, NULL) / p->n_kv_head;
    q[3] += phi_fit_remainder_bias(prf, rq, rk, d, held, n_held, cal, NULL) / p->n_kv_head;
}

#define FIT_NQ 9   // per layer: quality() near, far, and the query heads the gate turned off

// Fits KV group kvh of layer l into p; qual[0..4): quality() at the logged positions,
// qual[4..8) at positions shifted by the whole --positions augmentation (the farthest the maps
// serve), qual[8] += its query heads whose completion the gate turned off. Touches only its group's parameters in p, so groups can run at once.
static void fit_group(phi_maps *p, const phi_maps *prf, const fit_log *g, int l, int kvh,
                      const fit_opts *o, fit_progress *prog, double *qual) {
    int hd = p->d_in, group = p->n_head / p->n_kv_head, nq = g->n_q * group, np = phi_n_par(p);
    float *q = xmalloc((size_t)nq * hd * sizeof(float)), *theta = xmalloc((size_t)(group + 1) * np * 4);
    int *head = xmalloc((size_t)nq * sizeof(int)), *end = xmalloc((size_t)nq * sizeof(int));
    int *train = xmalloc((size_t)nq * sizeof(int)), *held = xmalloc((size_t)nq * sizeof(int));
    float *kr = xmalloc((size_t)g->n * hd * 4), *qr = xmalloc((size_t)nq * hd * 4);
    int n_train = 0, n_held = 0;
    for (int i = 0; i < g->n_q; i++)
        for (int j = 0; j < group; j++) {
            int r = i * group + j, h = kvh * group + j;
            memcpy(q + (size_t)r * hd, g->q[l] + ((size_t)i * p->n_head + h) * hd, hd * sizeof(float));
            head[r] = j;
            end[r] = g->qpos[i] + 1 - o->tail;   // mid region of a prompt ending at qpos
            if (i % 4 == 3) held[n_held++] = r;   // every 4th position is held out
            else train[n_train++] = r;
        }
    phi_fit_set d = {hd, group, o->sink, g->n, nq, g->k[l] + (size_t)kvh * g->n * hd, q, head, end,
                     g->inv_freq, g->neox, g->shift_max};
    uint64_t seed = mix(o->seed * 1000003 + (uint64_t)l * 64 + kvh);
    group_progress gp = {prog, kvh};
    if (o->recal)   // the maps as they are in -o
        for (int j = 0; j <= group; j++)
            memcpy(theta + (size_t)j * np, j < group ? phi_par_q(p, l, kvh * group + j) : phi_par_k(p, l, kvh),
                   (size_t)np * 4);
    else {
        phi_fit_init(p, theta, group, seed);
        phi_fit_run(p, theta, &d, train, n_train, o->steps, o->batch, o->lr, seed, show_progress, &gp);
    }
    phi_fit_calibrate(p, theta, &d, train, n_train, o->cal, o->margin);
    for (int j = 0; j <= group; j++)
        memcpy(j < group ? (float *)phi_par_q(p, l, kvh * group + j) : (float *)phi_par_k(p, l, kvh),
               theta + (size_t)j * np, (size_t)np * 4);
    quality(p, prf, l, kvh, &d, held, n_held, o->cal, qual);
    phi_fit_set far = d;
    phi_fit_rotate(&d, g->shift_max, kr, qr);
    far.k = kr, far.q = qr;
    quality(p, prf, l, kvh, &far, held, n_held, o->cal, qual + 4);
    // the gate last (quality() reported the calibrated maps): its offsets go into p too
    float chosen[group];
    phi_fit_gate(p, theta, &d, g->v[l] + (size_t)kvh * g->n * hd, o->tail, train, n_train, o->cal, chosen);
    for (int j = 0; j < group; j++) {
        qual[8] += chosen[j] == PHI_GATE_OFF;
        memcpy((float *)phi_par_q(p, l, kvh * group + j), theta + (size_t)j * np, (size_t)np * 4);
    }
    free(kr), free(qr);
    free(q), free(theta), free(head), free(end), free(train), free(held);
}

// Fits layer l's maps into p, one KV group per thread (each seeded by its own index, so the
// result does not depend on the thread count); qual (FIT_NQ,) = the groups' summed in order.
static void fit_layer(phi_maps *p, const phi_maps *prf, const fit_log *g, int l, const fit_opts *o,
                      double *qual) {
    int nkv = p->n_kv_head;
    double *part = xcalloc((size_t)nkv * FIT_NQ, sizeof(double));
    fit_progress prog = {l, p->n_layer, o->steps * nkv, 0, isatty(2)};
#pragma omp parallel for schedule(dynamic) if (nkv > 1)
    for (int kvh = 0; kvh < nkv; kvh++) fit_group(p, prf, g, l, kvh, o, &prog, part + (size_t)kvh * FIT_NQ);
    memset(qual, 0, FIT_NQ * sizeof *qual);
    for (int kvh = 0; kvh < nkv; kvh++)
        for (int i = 0; i < FIT_NQ; i++) qual[i] += part[(size_t)kvh * FIT_NQ + i];
    free(part);
    if (!prog.tty)   // a log gets one line per layer, not a bar's carriage returns
        if (flag_verbosity >= 1) fprintf(stderr, "fit-phi: layer %d/%d %s (held-out KL %.4f, random features %.4f; completion "
                "off in %.0f of %d query heads)\n", l + 1, p->n_layer, o->recal ? "recalibrated" : "fitted",
                qual[0], qual[1], qual[8], p->n_head);
}

// FILE.progress: "layers_done model ctx steps queries batch lr seed d_phi sink tail calibrate
// margin positions"
static void progress_key(char *buf, size_t len, const fit_opts *o, const char *model, int d_phi) {
    snprintf(buf, len, "%s %d %d %d %d %g %llu %d %d %d %g %g %d", cli_base_name(model), o->ctx,
             o->steps, o->queries, o->batch, o->lr, (unsigned long long)o->seed, d_phi, o->sink,
             o->tail, o->cal, o->margin, o->positions);
}

// Layers already fitted by an interrupted run with the same settings (0: start afresh).
static int resume_point(const char *prog_path, const char *key, const fit_opts *o, phi_maps **p) {
    FILE *fp = fopen(prog_path, "r");
    char line[600], err[512];
    int done = 0;
    if (!fp) return 0;
    if (fgets(line, sizeof line, fp) && sscanf(line, "%d", &done) == 1) {
        const char *rest = strchr(line, ' ');
        line[strcspn(line, "\n")] = 0;
        phi_maps *old = rest && !strcmp(rest + 1, key) ? phi_maps_load(o->out, err, sizeof err) : NULL;
        if (old && old->n_layer == (*p)->n_layer && old->d_phi == (*p)->d_phi && done > 0 &&
            done <= old->n_layer) {   // n_layer: every layer fitted, the check still to run
            phi_maps_free(*p);
            *p = old;
        } else {
            phi_maps_free(old);
            done = 0;
        }
    }
    fclose(fp);
    return done;
}

// [D] The end-to-end check. The fit's own held-out KL did not predict decode (a map that won
// on it lost every needle prompt: bench/EVAL.md), so fit-phi decodes too: n held-out tokens
// (the data after the fit's), CHECK_ROWS steps of full's greedy tokens forced, KL(full || x)
// per step for x = topk, random features and the fitted maps at each log-mass offset of
// CHECK_DELTAS (log phi_q + delta: every remainder estimate times e^delta; large negative
// offsets approach topk with fewer tokens), at the same budget: ceil(2 % of n) exact reads
// (at least sink + tail + phi cache + 16), topk spending the phi cache's share on more
// tokens. It runs at the text's own positions and again shifted to end at the last position
// the maps were fitted for (RoPE is relative: full is unchanged, the maps see far angles).
// The offset with the lowest mean KL stays in the maps; the verdict names the winner.
static const float CHECK_DELTAS[] = {1, 0, -1, -2, -4, PHI_GATE_OFF};
#define N_DELTAS ((int)(sizeof CHECK_DELTAS / sizeof *CHECK_DELTAS))
#define CHECK_MIN 512   // held-out tokens below which the check is skipped (with a warning)
#define CHECK_ROWS 16

// Prints the verdict and stores it in p (skipped with a warning when too little text is held
// out). select 0 (--verify): the maps as they are, no offset chosen.
static void fit_check(context *cx, phi_maps *p, const int *held, int n_held, int n_fit, const fit_opts *o,
                     int select) {
    const model *m = cx->m;
    const model_config *c = &m->cfg;
    if (n_held < CHECK_MIN) {
        snprintf(p->verdict, sizeof p->verdict, "unchecked: %d held-out tokens after the fit's %d "
                 "(the check needs %d)", n_held, n_fit, CHECK_MIN);
        fprintf(stderr, "fit-phi: warning: %s has %d tokens after the %d the fit used; the "
                "end-to-end check needs %d: give more text (%d tokens or more) or a smaller -c\n",
                o->data, n_held, n_fit, CHECK_MIN, n_fit + CHECK_MIN);
        return;
    }
    int n = n_held < o->check ? n_held : o->check, r_fit = topk_phi_cache_tokens(p);
    phi_maps *prf = topk_phi_fallback_maps(m, c->head_dim);
    int r_prf = topk_phi_cache_tokens(prf), r_max = r_fit > r_prf ? r_fit : r_prf;
    int budget = (int)ceil(0.02 * (n - 1)), floor_b = o->sink + o->tail + r_max + 16;
    if (budget < floor_b) budget = floor_b;
    int k_topk = budget - o->sink - o->tail, n_pos = p->n_ctx > n ? 2 : 1;
    int n_d = select ? N_DELTAS : 1;   // --verify: offset 0 only
    static const float as_is[1] = {0};
    const float *deltas = select ? CHECK_DELTAS : as_is;
    double kl[2 + N_DELTAS] = {0}, agree[2 + N_DELTAS] = {0}, row[CHECK_ROWS], a;
    float cur = 0;
    char err[512];
    for (int si = 0; si < n_pos; si++) {
        int pos0 = si ? p->n_ctx - n : 0;
        if (flag_verbosity >= 1) fprintf(stderr, "fit-phi: end-to-end check %d/%d: %d held-out tokens at positions %d-%d\n",
                si + 1, n_pos, n, pos0, pos0 + n - 1);
        topk_cmp *cmp = topk_cmp_begin(cx, held, n, pos0, o->sink, o->tail, CHECK_ROWS, 0, err, sizeof err);
        if (!cmp) {
            fprintf(stderr, "fit-phi: warning: the end-to-end check did not run: %s\n", err);
            snprintf(p->verdict, sizeof p->verdict, "unchecked: %.280s", err);
            if (cur != 0) phi_maps_shift_q(p, -cur);
            phi_maps_free(prf);
            return;
        }
        for (int v = 0; v < 2 + n_d; v++) {
            if (v >= 2 && deltas[v - 2] != cur) phi_maps_shift_q(p, deltas[v - 2] - cur), cur = deltas[v - 2];
            const phi_maps *maps = v == 0 ? NULL : v == 1 ? prf : p;
            int k = k_topk - (v == 0 ? 0 : v == 1 ? r_prf : r_fit);
            topk_cmp_run(cmp, maps, k, row, &a, NULL);
            for (int r = 0; r < CHECK_ROWS; r++) kl[v] += row[r] / CHECK_ROWS / n_pos;
            agree[v] += a / n_pos;
        }
        topk_cmp_end(cmp);
    }
    int best = 0;
    for (int d = 1; d < n_d; d++)
        if (kl[2 + d] < kl[2 + best]) best = d;
    if (deltas[best] != cur) phi_maps_shift_q(p, deltas[best] - cur);
    double f = kl[2 + best];
    int loses = f > kl[1] || f > kl[0];
    printf("\nend-to-end check: %d held-out tokens of %s (after the fit's %d), %d decode steps of full's\n"
           "greedy tokens forced, at positions from 0%s; budget %d exact reads: topk K = %d, topk+phi\n"
           "K = %d (fitted) / %d (random features)\n"
           "| decode | mean KL to full | greedy agreement |\n|---|---:|---:|\n"
           "| topk | %.4f | %.0f %% |\n| topk+phi, random features (no --phi) | %.4f | %.0f %% |\n",
           n, o->data, n_fit, CHECK_ROWS, n_pos > 1 ? " and shifted to end at the fit's last position" : "",
           budget, k_topk, k_topk - r_fit, k_topk - r_prf, kl[0], 100 * agree[0], kl[1], 100 * agree[1]);
    for (int d = 0; d < n_d; d++)
        if (deltas[d] == PHI_GATE_OFF)
            printf("| topk+phi, fitted, completion off (topk at K = %d)%s | %.4f | %.0f %% |\n",
                   k_topk - r_fit, d == best ? " (kept)" : "", kl[2 + d], 100 * agree[2 + d]);
        else if (!select)
            printf("| topk+phi, the maps in %s | %.4f | %.0f %% |\n", o->out, kl[2], 100 * agree[2]);
        else
            printf("| topk+phi, fitted, log-mass offset %+g%s | %.4f | %.0f %% |\n", deltas[d],
                   d == best ? " (kept)" : "", kl[2 + d], 100 * agree[2 + d]);
    const char *who = !loses ? "the fitted maps win" : f > kl[1] && f > kl[0] ? "the fitted maps lose to both"
                      : f > kl[1] ? "the fitted maps lose to random features" : "the fitted maps lose to topk";
    char kept[48];
    if (!select) snprintf(kept, sizeof kept, "as in the file");
    else if (deltas[best] == PHI_GATE_OFF) snprintf(kept, sizeof kept, "completion off");
    else snprintf(kept, sizeof kept, "offset %+g", deltas[best]);
    snprintf(p->verdict, sizeof p->verdict, "%s (fit-phi check on %d held-out tokens: mean KL to full "
             "%.4f fitted, %s; %.4f random features; %.4f topk at the same budget)", who, n, f, kept,
             kl[1], kl[0]);
    printf("verdict: %s\n", p->verdict);
    if (f > kl[1])   // worse than no map at all
        fprintf(stderr, "fit-phi: warning: the maps in %s lose to random features on held-out text: use "
                "--strategy topk+phi without --phi, or fit on more text (--data with several thousand "
                "tokens after the first -c, -c 2048, --steps 300)\n", o->out);
    else if (f > kl[0])
        fprintf(stderr, "fit-phi: note: topk at the same budget did better on this text (K %d vs %d: the phi "
                "cache's %d token-equivalents buy more as retrieved tokens at %d tokens)\n", k_topk,
                k_topk - r_fit, r_fit, n);
    phi_maps_free(prf);
}

int cmd_fit_phi(int argc, char **argv) {
    fit_opts o;
    fit_parse(argc, argv, &o);
    if (cli_refuse_synthetic(o.model, "fit-phi")) return 2;
    char prog[4096], key[512], err[512];
    snprintf(prog, sizeof prog, "%s.progress", o.out);
    // the maps and the progress file are written after each layer: a bad path fails now
    const char *outs[2] = {o.out, prog}, *names[2] = {"-o", "progress file"};
    if (cli_check_outputs(outs, names, 2)) return 2;
    loaded L;
    strategy_opts so = strategy_opts_default();
    // the prefill that logs queries and keys runs on --device (default the fp32 CPU reference);
    // the fit runs on the CPU
    // the KV cache in the backend's own element, not the f16 default: fp32 K and V on the CPU,
    // which the fit reads
    cli_hw hw = {o.device, o.threads, o.weights, o.ctx, GGML_F32, "native", "native", 0};
    if (cli_load(&L, o.model, NULL, &hw, NULL, 0, &so, NULL) != 0) {
        cli_unload(&L);
        return 1;
    }
    const model_config *c = &L.m->cfg;
    int *ids = NULL, total = 0, n = fit_tokens(&o, &L, &ids, &total), rc = n < 0;
    int d_phi = o.d_phi ? o.d_phi : c->head_dim, start = 0;
    phi_maps *p = phi_maps_mlp(c->n_layer, c->n_head, c->n_kv_head, c->head_dim, c->head_dim,
                               2 * c->head_dim, d_phi);
    phi_maps *prf = topk_phi_fallback_maps(L.m, d_phi);
    progress_key(key, sizeof key, &o, L.path, d_phi);
    if (!rc && (o.recal || o.verify)) {   // the maps to recalibrate or verify, checked against the model
        phi_maps *old = phi_maps_load(o.out, err, sizeof err);
        if (old && ((o.recal && old->kind != PHI_MLP) || old->n_layer != c->n_layer ||
                    old->n_head != c->n_head || old->n_kv_head != c->n_kv_head || old->d_in != c->head_dim)) {
            snprintf(err, sizeof err, "'%s' holds no fitted maps for this model", o.out);
            phi_maps_free(old);
            old = NULL;
        }
        if (!old) {
            fprintf(stderr, "sift: error: fit-phi %s: %s\n", o.recal ? "--recalibrate" : "--verify", err);
            rc = 1;
        } else {
            phi_maps_free(p);
            p = old;
            if (o.verify) start = c->n_layer;   // nothing to fit
        }
    } else if (!rc && (start = resume_point(prog, key, &o, &p)) > 0) {
        if (start < c->n_layer && flag_verbosity >= 1)
            fprintf(stderr, "fit-phi: resuming %s at layer %d (from %s)\n", o.out, start + 1, prog);
        else if (flag_verbosity >= 1)
            fprintf(stderr, "fit-phi: resuming %s: every layer is fitted, the check is left (%s)\n",
                    o.out, prog);
    }
    if (o.positions == 0) o.positions = c->ctx_len;   // default: every position the model takes
    fit_log g = {0};
    g.inv_freq = c->inv_freq, g.neox = c->rope == ROPE_NEOX;
    g.shift_max = o.positions > n ? o.positions - n : 0;
    double *kl = xcalloc(FIT_NQ * (size_t)c->n_layer, sizeof(double));   // per layer: fit_layer's
    if (!rc && start < c->n_layer) {
        if (flag_verbosity >= 1) fprintf(stderr, "fit-phi: logging queries and keys of %d tokens of %s (full prefill)\n", n, o.data);
        fit_collect(L.cx, ids, n, &o, &g);
    }
    for (int l = start; l < c->n_layer && !rc; l++) {
        p->n_ctx = n + g.shift_max;   // the positions the maps were shown
        fit_layer(p, prf, &g, l, &o, kl + FIT_NQ * l);
        // the maps, then the progress line that names them (each written whole: util/outfile.c)
        char line[600];
        int len = snprintf(line, sizeof line, "%d %s\n", l + 1, key);
        if (phi_maps_save(p, o.out, err, sizeof err) != 0 ||
            outfile_write(prog, line, (size_t)len, "progress file", err, sizeof err) != 0) {
            fprintf(stderr, "%ssift: error: fit-phi: %s\n", isatty(2) ? "\n" : "", err);
            rc = 1;
        }
    }
    if (!rc && start < c->n_layer) {
        if (isatty(2)) fprintf(stderr, "\n");   // ends the bar's line
        printf("fit-phi: %s (%d layers, %d/%d heads, d_phi %d), %d tokens, %d queries x %d heads,\n"
               "positions shifted by up to %d in training\n"
               "held-out queries: KL(full || maps) over the mid region, and the log-mass bias\n"
               "LSE(r^) - LSE(r) of the remainder after the top %g of keys (what decode estimates);\n"
               "at the logged positions and shifted by %d (far); then the gate's count of query heads\n"
               "whose completion it turned off (their decode step was closer to full without it)\n"
               "| layer | KL fitted | KL random | bias fitted | bias random | KL fitted far | "
               "KL random far | bias fitted far | bias random far | heads off |\n"
               "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
               o.out, c->n_layer, c->n_head, c->n_kv_head, d_phi, n, g.n_q, c->n_head, g.shift_max,
               o.cal, g.shift_max);
        double mean[FIT_NQ] = {0};
        for (int l = start; l <= c->n_layer; l++) {   // the last row: the mean
            const double *q = l < c->n_layer ? kl + FIT_NQ * l : mean;
            if (l < c->n_layer) printf("| %d ", l);
            else printf("| mean ");
            printf("| %.4f | %.4f | %+.3f | %+.3f | %.4f | %.4f | %+.3f | %+.3f | %.*f |\n", q[0], q[1],
                   q[2], q[3], q[4], q[5], q[6], q[7], l < c->n_layer ? 0 : 2, q[8]);
            for (int i = 0; i < FIT_NQ && l < c->n_layer; i++) mean[i] += q[i] / (c->n_layer - start);
        }
    }
    for (int l = 0; g.q && l < c->n_layer; l++) free(g.q[l]), free(g.k[l]), free(g.v[l]);
    free(g.q), free(g.k), free(g.v), free(g.qpos), free(kl);
    if (!rc && o.check > 0) {   // held out: the tokens after the fit's, BOS first when the model wants one
        int bos = tok_add_bos(L.t) && tok_bos(L.t) >= 0, n_held = total - n + bos;
        int *held = xmalloc((size_t)n_held * sizeof(int));
        if (bos) held[0] = tok_bos(L.t);
        memcpy(held + bos, ids + n, (size_t)(total - n) * sizeof(int));
        fit_check(L.cx, p, held, n_held, n, &o, !o.verify);
        free(held);
        if (phi_maps_save(p, o.out, err, sizeof err) != 0) {
            fprintf(stderr, "sift: error: fit-phi: %s\n", err);
            rc = 1;
        }
    }
    if (!rc && !o.verify) remove(prog);   // only now: an interrupted check resumes after the last layer
    free(ids);
    phi_maps_free(p);
    phi_maps_free(prf);
    cli_unload(&L);
    return rc;
}
