// cmd/fit_phi.c — `sift fit-phi`: learns topk+phi's feature maps for a model by distillation
// (specs/topk-phi.md, "Training the maps"). One full prefill of --ctx tokens of --data text logs,
// per layer, the post-RoPE queries of sampled positions and every key; then per layer and KV
// group the maps are fitted with Adam on the spec's loss (attn/phi_fit.c), support = each
// query's mid region. The output file is rewritten after every layer with a FILE.progress
// note, so an interrupted run resumes at the next layer (same flags, same result: every draw is
// seeded from --seed, the layer and the group). Ends with per-layer held-out KL, fitted vs the
// random-feature fallback.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../attn/phi.h"
#include "../util/check.h"
#include "cmd.h"

typedef struct {
    const char *model, *data, *out, *device;
    enum bk_weights weights;   // --weights native|f32 (CPU)
    int ctx, steps, queries, batch, d_phi, sink, tail, threads, positions;
    float lr, cal, margin;
    int recal;   // --recalibrate: keep --out's maps, redo only the calibration
    uint64_t seed;
} fit_opts;

typedef struct {   // what the prefill logged
    int n, n_q, *qpos;   // tokens, sampled query positions (n_q,) ascending
    int shift_max, neox; // position augmentation up to --positions (phi_fit_set)
    const float *inv_freq;
    float **q;           // per layer (n_q, heads, hd)
    float **k;           // per layer (n_kv_head, n, hd)
} fit_log;

static void fit_parse(int argc, char **argv, fit_opts *o) {
    *o = (fit_opts){.ctx = 1024, .steps = 150, .queries = 48, .batch = 16, .sink = 4, .tail = 16,
                    .lr = 3e-3f, .cal = 0.02f, .margin = 1.0f, .seed = 1, .device = "cpu"};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (cli_is_flag(a, "-h", "--help")) {
            printf("usage: sift fit-phi [-m MODEL] --data TEXT --out FILE.phi [--ctx 1024]\n"
                   "         [--steps 150] [--queries 48] [--batch 16] [--lr 0.003] [--seed 1]\n"
                   "         [--d-phi HEAD_DIM] [--sink 4] [--tail 16] [--calibrate 0.02]\n"
                   "         [--margin 1] [--positions N] [--recalibrate] [-t N] [--device D] [--weights native|f32]\n"
                   "learns topk+phi's feature maps on the first --ctx tokens of TEXT; use them with\n"
                   "--strategy topk+phi --phi FILE.phi. The maps read post-RoPE vectors, so each step\n"
                   "also shows them the data at positions shifted by up to --positions - ctx (RoPE is\n"
                   "relative: scores do not change); default the model's context length.\n"
                   "--calibrate F, --margin M: each query head's log-mass error on the mid region\n"
                   "minus its top F share of keys (what decode estimates after top-K retrieval; 0: all\n"
                   "of it) is shifted to mean -M standard deviations, so overestimates are rare.\n"
                   "--recalibrate: keep the maps in --out and redo only that calibration.\n"
                   "--device cpu|cuda|auto: where the logging prefill runs (default cpu: fp32 logs, the\n"
                   "same maps on every machine; cuda: bf16 logs, for a long --ctx). The fit itself runs\n"
                   "on the CPU with -t threads. Rerun the same command to resume.\n");
            exit(0);
        }
        if (cli_is_flag(a, NULL, "--recalibrate")) {
            o->recal = 1;
            continue;
        }
        if (i + 1 >= argc) cli_usage_error("fit-phi: %s needs a value", a);
        const char *v = argv[++i];
        if (cli_is_flag(a, "-m", "--model")) o->model = v;
        else if (cli_is_flag(a, NULL, "--data")) o->data = v;
        else if (cli_is_flag(a, "-o", "--out")) o->out = v;
        else if (cli_is_flag(a, "-c", "--ctx")) o->ctx = (int)cli_int(a, v, 64, 1 << 20);
        else if (cli_is_flag(a, NULL, "--steps")) o->steps = (int)cli_int(a, v, 1, 1 << 20);
        else if (cli_is_flag(a, NULL, "--queries")) o->queries = (int)cli_int(a, v, 4, 1 << 16);
        else if (cli_is_flag(a, NULL, "--batch")) o->batch = (int)cli_int(a, v, 1, 1 << 16);
        else if (cli_is_flag(a, NULL, "--lr")) o->lr = cli_float(a, v, 1e-7, 1);
        else if (cli_is_flag(a, "-s", "--seed")) o->seed = (uint64_t)cli_int(a, v, 0, 1LL << 62);
        else if (cli_is_flag(a, NULL, "--d-phi")) o->d_phi = (int)cli_int(a, v, 1, 4096);
        else if (cli_is_flag(a, NULL, "--sink")) o->sink = (int)cli_int(a, v, 0, 1 << 20);
        else if (cli_is_flag(a, NULL, "--tail")) o->tail = (int)cli_int(a, v, 0, 1 << 20);
        else if (cli_is_flag(a, NULL, "--calibrate")) o->cal = cli_float(a, v, 0, 0.5);
        else if (cli_is_flag(a, NULL, "--margin")) o->margin = cli_float(a, v, 0, 10);
        else if (cli_is_flag(a, NULL, "--positions")) o->positions = (int)cli_int(a, v, 64, 1 << 26);
        else if (cli_is_flag(a, "-t", "--threads")) o->threads = (int)cli_int(a, v, 1, 1024);
        else if (cli_is_flag(a, NULL, "--device")) o->device = cli_device(v);
        else if (cli_is_flag(a, NULL, "--weights")) o->weights = cli_weights(v);
        else cli_usage_error("fit-phi: unknown flag '%s'", a);
    }
    if (!o->data || !o->out) cli_usage_error("fit-phi needs --data TEXT and --out FILE.phi");
    if (o->threads == 0) o->threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
}

// The first ctx tokens of the data file (BOS first when the model wants one); -1 on error.
static int fit_tokens(const fit_opts *o, const loaded *L, int **ids) {
    char err[512];
    size_t len;
    char *text = cli_read_all(o->data, &len, err, sizeof err);
    int *raw = NULL, n = text ? tok_encode(L->t, text, len, 0, &raw, err, sizeof err) : -1;
    free(text);
    if (n < 0) {
        fprintf(stderr, "sift: error: fit-phi: %s\n", err);
        return -1;
    }
    int bos = tok_add_bos(L->t) && tok_bos(L->t) >= 0, total = n + bos;
    int need = o->sink + o->tail + 64, use = total < o->ctx ? total : o->ctx;
    if (use < need || use > L->m->cfg.ctx_len) {
        fprintf(stderr, "sift: error: fit-phi: %s gives %d tokens; need %d to %d (--ctx %d, the "
                "model's context %d)\n", o->data, total, need, L->m->cfg.ctx_len, o->ctx,
                L->m->cfg.ctx_len);
        free(raw);
        return -1;
    }
    *ids = xmalloc((size_t)use * sizeof(int));
    if (bos) (*ids)[0] = tok_bos(L->t);
    memcpy(*ids + bos, raw, (size_t)(use - bos) * sizeof(int));
    free(raw);
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
static void fit_collect(model *m, const int *ids, int n, const fit_opts *o, fit_log *g) {
    const model_config *c = &m->cfg;
    int lo = o->sink + o->tail + 32 > n / 4 ? o->sink + o->tail + 32 : n / 4;
    g->n = n;
    g->qpos = xmalloc((size_t)o->queries * sizeof(int));
    g->n_q = sample_positions(lo, n, o->queries, o->seed, g->qpos);
    g->q = xcalloc((size_t)c->n_layer, sizeof(float *));
    g->k = xcalloc((size_t)c->n_layer, sizeof(float *));
    fwd_hooks hooks = {.ctx = g, .after_attention = log_queries};
    prefill_info info = {0};
    char err[512];
    kv_cache *kv = prefill_run(m, ids, n, 0, NULL, &hooks, NULL, &info, err, sizeof err);
    CHECK_INTERNAL(kv, "fit-phi prefill: %s", err);
    for (int l = 0; l < c->n_layer; l++) {
        const kv_layer *L = &kv->layers[l];
        size_t per = (size_t)n * c->head_dim;
        g->k[l] = xmalloc((size_t)c->n_kv_head * per * sizeof(float));
        for (int h = 0; h < c->n_kv_head; h++)
            m->bk->to_host(m->bk, g->k[l] + h * per,
                           (const char *)L->k + (size_t)h * L->cap * c->head_dim * m->bk->elem_bytes, per);
    }
    kv_free(kv);
}

typedef struct {   // one layer's fit, its KV groups running in parallel
    int layer, n_layer, total;   // total = steps x KV groups
    long done;                   // steps done so far (all groups)
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
    if (done % 10 && done != p->total) return;
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

// Fits KV group kvh of layer l into p; qual[0..4): quality() at the logged positions,
// qual[4..8) at positions shifted by the whole --positions augmentation (the farthest the maps
// serve). Touches only its group's parameters in p, so groups can run at once.
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
    if (o->recal)   // the maps as they are in --out
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
    free(kr), free(qr);
    free(q), free(theta), free(head), free(end), free(train), free(held);
}

// Fits layer l's maps into p, one KV group per thread (each seeded by its own index, so the
// result does not depend on the thread count); qual (8,) = the groups' quality summed in order.
static void fit_layer(phi_maps *p, const phi_maps *prf, const fit_log *g, int l, const fit_opts *o,
                      double *qual) {
    int nkv = p->n_kv_head;
    double *part = xcalloc((size_t)nkv * 8, sizeof(double));
    fit_progress prog = {l, p->n_layer, o->steps * nkv, 0};
#pragma omp parallel for schedule(dynamic) if (nkv > 1)
    for (int kvh = 0; kvh < nkv; kvh++) fit_group(p, prf, g, l, kvh, o, &prog, part + (size_t)kvh * 8);
    memset(qual, 0, 8 * sizeof *qual);
    for (int kvh = 0; kvh < nkv; kvh++)
        for (int i = 0; i < 8; i++) qual[i] += part[(size_t)kvh * 8 + i];
    free(part);
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
            done < old->n_layer) {
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

int cmd_fit_phi(int argc, char **argv) {
    fit_opts o;
    fit_parse(argc, argv, &o);
    if (cli_refuse_synthetic(o.model, "fit-phi")) return 2;
    loaded L;
    strategy_opts so = strategy_opts_default();
    // the prefill that logs queries and keys runs on --device (default the fp32 CPU reference);
    // the fit runs on the CPU
    cli_hw hw = {o.device, o.threads, o.weights, o.ctx, GGML_F32};
    if (cli_load(&L, o.model, NULL, &hw, NULL, 0, &so) != 0) {
        cli_unload(&L);
        return 1;
    }
    const model_config *c = &L.m->cfg;
    int *ids = NULL, n = fit_tokens(&o, &L, &ids), rc = n < 0;
    int d_phi = o.d_phi ? o.d_phi : c->head_dim, start = 0;
    phi_maps *p = phi_maps_mlp(c->n_layer, c->n_head, c->n_kv_head, c->head_dim, c->head_dim,
                               2 * c->head_dim, d_phi);
    phi_maps *prf = phi_maps_prf(c->n_layer, c->n_head, c->n_kv_head, c->head_dim, d_phi, 0x5EED);
    char prog[4096], key[512], err[512];
    snprintf(prog, sizeof prog, "%s.progress", o.out);
    progress_key(key, sizeof key, &o, L.path, d_phi);
    if (!rc && o.recal) {   // the maps to recalibrate, checked against the model
        phi_maps *old = phi_maps_load(o.out, err, sizeof err);
        if (old && (old->kind != PHI_MLP || old->n_layer != c->n_layer || old->n_head != c->n_head ||
                    old->n_kv_head != c->n_kv_head || old->d_in != c->head_dim)) {
            snprintf(err, sizeof err, "'%s' holds no fitted maps for this model", o.out);
            phi_maps_free(old);
            old = NULL;
        }
        if (!old) {
            fprintf(stderr, "sift: error: fit-phi --recalibrate: %s\n", err);
            rc = 1;
        } else {
            phi_maps_free(p);
            p = old;
        }
    } else if (!rc && (start = resume_point(prog, key, &o, &p)) > 0)
        fprintf(stderr, "fit-phi: resuming %s at layer %d (from %s)\n", o.out, start + 1, prog);
    if (o.positions == 0) o.positions = c->ctx_len;   // default: every position the model takes
    fit_log g = {0};
    g.inv_freq = c->inv_freq, g.neox = c->rope == ROPE_NEOX;
    g.shift_max = o.positions > n ? o.positions - n : 0;
    double *kl = xcalloc(8 * (size_t)c->n_layer, sizeof(double));   // per layer: fit_layer's
    if (!rc) {
        fprintf(stderr, "fit-phi: logging queries and keys of %d tokens of %s (full prefill)\n", n, o.data);
        fit_collect(L.m, ids, n, &o, &g);
    }
    for (int l = start; l < c->n_layer && !rc; l++) {
        p->n_ctx = n + g.shift_max;   // the positions the maps were shown
        fit_layer(p, prf, &g, l, &o, kl + 8 * l);
        FILE *fp = NULL;
        if (phi_maps_save(p, o.out, err, sizeof err) != 0 || !(fp = fopen(prog, "w"))) {
            fprintf(stderr, "\nsift: error: fit-phi: %s\n", fp ? err : strerror(errno));
            rc = 1;
        } else {
            fprintf(fp, "%d %s\n", l + 1, key);
            fclose(fp);
        }
    }
    if (!rc) {
        remove(prog);
        fprintf(stderr, "\n");
        printf("fit-phi: %s (%d layers, %d/%d heads, d_phi %d), %d tokens, %d queries x %d heads,\n"
               "positions shifted by up to %d in training\n"
               "held-out queries: KL(full || maps) over the mid region, and the log-mass bias\n"
               "LSE(r^) - LSE(r) of the remainder after the top %g of keys (what decode estimates);\n"
               "at the logged positions and shifted by %d (far)\n"
               "| layer | KL fitted | KL random | bias fitted | bias random | KL fitted far | "
               "KL random far | bias fitted far | bias random far |\n"
               "|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
               o.out, c->n_layer, c->n_head, c->n_kv_head, d_phi, n, g.n_q, c->n_head, g.shift_max,
               o.cal, g.shift_max);
        double mean[8] = {0};
        for (int l = start; l <= c->n_layer; l++) {   // the last row: the mean
            const double *q = l < c->n_layer ? kl + 8 * l : mean;
            if (l < c->n_layer) printf("| %d ", l);
            else printf("| mean ");
            printf("| %.4f | %.4f | %+.3f | %+.3f | %.4f | %.4f | %+.3f | %+.3f |\n", q[0], q[1],
                   q[2], q[3], q[4], q[5], q[6], q[7]);
            for (int i = 0; i < 8 && l < c->n_layer; i++) mean[i] += q[i] / (c->n_layer - start);
        }
    }
    for (int l = 0; g.q && l < c->n_layer; l++) free(g.q[l]), free(g.k[l]);
    free(g.q), free(g.k), free(g.qpos), free(kl), free(ids);
    phi_maps_free(p);
    phi_maps_free(prf);
    cli_unload(&L);
    return rc;
}
