// tests/tool_phi.c — drives the topk+phi kernels and decode path for tests/test_phi.py.
// usage:
//   tool_phi attend IN.bin OUT.bin
//     IN: int32 kind, hd, d_emb, d_hid, d_phi, n, n_sel, n_sub, lo, hi; float32 par_q (n_par),
//     par_k (n_par), q (hd,), K (n, hd), V (n, hd); int32 sel (n_sel,).
//     OUT float32: log phi_q(q) (d_phi,), summary of rows [lo, hi): m (d_phi,), u (d_phi,),
//     T (d_phi, hd); y with completion (hd,); y selection only (hd,).
//   tool_phi fit IN.bin INIT.phi FIT.phi
//     IN: int32 hd, d_emb, d_hid, d_phi, n_keys, n_q, n_train, steps, seed, lo; float32
//     K (n_keys, hd), Q (n_q, hd); int32 end (n_q,). One head fitted on queries [0, n_train)
//     (support keys [lo, end[i])), minibatches of 16, lr 1e-2, mass calibration; writes the initial and fitted
//     maps as .phi files (1 layer, 1 head) and prints the loss over the training queries before
//     and after, and the first and last minibatch losses.
//   tool_phi calibrate IN.bin FIT.phi FRAC CAL.phi
//     IN as for fit; FIT.phi's head is calibrated on queries [0, n_train) with phi_fit_calibrate
//     at FRAC and written to CAL.phi; prints the remainder bias at FRAC over those queries
//     before and after.
//   tool_phi decode MODEL OUT.f32 [--strategy S] [--set KEY=VALUE]... [--cont ID]... ID...
//     prefill ID... with strategy S (default full), then decode the forced continuation --cont
//     ids; OUT = float32 logits (1 + n_cont, vocab): the prefill's, then each decode step's.
//     --set keys: sink, tail, topk, budget, phi (a path). --greedy N instead of --cont: the
//     continuation is N greedy tokens (argmax of the previous row).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../attn/phi.h"
#include "../policies/policy.h"
#include "../util/check.h"

static void read_exact(FILE *fp, void *p, size_t bytes) {
    if (fread(p, 1, bytes, fp) != bytes) {
        fprintf(stderr, "short input\n");
        exit(1);
    }
}

static int attend(const char *in, const char *outp) {
    FILE *fp = fopen(in, "rb");
    if (!fp) return 1;
    int h[10];
    read_exact(fp, h, sizeof h);
    int hd = h[1], n = h[5], n_sel = h[6], n_sub = h[7], lo = h[8], hi = h[9];
    phi_maps *p = phi_maps_alloc(&(phi_maps){h[0], 1, 1, 1, hd, h[2], h[3], h[4], NULL, NULL, 0});
    int np = phi_n_par(p), f = p->d_phi;
    float *q = xmalloc(hd * sizeof(float)), *k = xmalloc((size_t)n * hd * sizeof(float));
    float *v = xmalloc((size_t)n * hd * sizeof(float));
    int *sel = xmalloc((size_t)(n_sel ? n_sel : 1) * sizeof(int));
    read_exact(fp, p->q, np * sizeof(float));
    read_exact(fp, p->k, np * sizeof(float));
    read_exact(fp, q, hd * sizeof(float));
    read_exact(fp, k, (size_t)n * hd * sizeof(float));
    read_exact(fp, v, (size_t)n * hd * sizeof(float));
    read_exact(fp, sel, (size_t)n_sel * sizeof(int));
    fclose(fp);

    float *lq = xmalloc(f * sizeof(float)), *y = xmalloc(2 * hd * sizeof(float));
    phi_log_features(p, p->q, q, lq);
    phi_summary s = phi_summary_alloc(f, hd);
    phi_summary_build(&s, p, p->k, k + (size_t)lo * hd, v + (size_t)lo * hd, hi - lo, hd, hd);
    phi_attend_head(y, q, k, v, sel, n_sel, hd, n_sub, p, p->q, p->k, &s);
    phi_attend_head(y + hd, q, k, v, sel, n_sel, hd, n_sub, NULL, NULL, NULL, NULL);
    FILE *out = fopen(outp, "wb");
    if (!out) return 1;
    fwrite(lq, sizeof(float), f, out);
    fwrite(s.m, sizeof(float), f, out);
    fwrite(s.u, sizeof(float), f, out);
    fwrite(s.t, sizeof(float), (size_t)f * hd, out);
    fwrite(y, sizeof(float), 2 * (size_t)hd, out);
    fclose(out);
    phi_summary_free(&s);
    phi_maps_free(p);
    free(q), free(k), free(v), free(sel), free(lq), free(y);
    return 0;
}

static void first_last(void *ctx, int step, double loss) {
    double *fl = ctx;
    if (step == 1) fl[0] = loss;
    fl[1] = loss;
}

static int fit(const char *in, const char *init_path, const char *fit_path) {
    FILE *fp = fopen(in, "rb");
    if (!fp) return 1;
    int h[10];
    read_exact(fp, h, sizeof h);
    int hd = h[0], nk = h[4], nq = h[5], n_train = h[6], steps = h[7];
    phi_maps *p = phi_maps_mlp(1, 1, 1, hd, h[1], h[2], h[3]);
    float *k = xmalloc((size_t)nk * hd * 4), *q = xmalloc((size_t)nq * hd * 4);
    int *end = xmalloc((size_t)nq * sizeof(int)), *head = xcalloc((size_t)nq, sizeof(int));
    int *train = xmalloc((size_t)n_train * sizeof(int));
    read_exact(fp, k, (size_t)nk * hd * 4);
    read_exact(fp, q, (size_t)nq * hd * 4);
    read_exact(fp, end, (size_t)nq * sizeof(int));
    fclose(fp);
    for (int i = 0; i < n_train; i++) train[i] = i;
    phi_fit_set d = {hd, 1, h[9], nk, nq, k, q, head, end};
    float *theta = xmalloc(2 * (size_t)phi_n_par(p) * 4);
    char err[256];
    phi_fit_init(p, theta, 1, (uint64_t)h[8]);
    memcpy(p->q, theta, (size_t)phi_n_par(p) * 4);
    memcpy(p->k, theta + phi_n_par(p), (size_t)phi_n_par(p) * 4);
    double before = phi_fit_loss(p, theta, &d, train, n_train, NULL, NULL), fl[2];
    if (phi_maps_save(p, init_path, err, sizeof err)) return 1;
    phi_fit_run(p, theta, &d, train, n_train, steps, 16, 1e-2f, (uint64_t)h[8], first_last, fl);
    phi_fit_calibrate(p, theta, &d, train, n_train, 0);
    memcpy(p->q, theta, (size_t)phi_n_par(p) * 4);
    memcpy(p->k, theta + phi_n_par(p), (size_t)phi_n_par(p) * 4);
    double after = phi_fit_loss(p, theta, &d, train, n_train, NULL, NULL);
    if (phi_maps_save(p, fit_path, err, sizeof err)) return 1;
    printf("%.9g %.9g %.9g %.9g\n", before, after, fl[0], fl[1]);
    phi_maps_free(p);
    free(k), free(q), free(end), free(head), free(train), free(theta);
    return 0;
}

static int calibrate(const char *in, const char *fit_path, double frac, const char *cal_path) {
    FILE *fp = fopen(in, "rb");
    char err[256];
    phi_maps *p = phi_maps_load(fit_path, err, sizeof err);
    if (!fp || !p) return 1;
    int h[10];
    read_exact(fp, h, sizeof h);
    int hd = h[0], nk = h[4], nq = h[5], n_train = h[6], np = phi_n_par(p);
    float *k = xmalloc((size_t)nk * hd * 4), *q = xmalloc((size_t)nq * hd * 4);
    int *end = xmalloc((size_t)nq * sizeof(int)), *head = xcalloc((size_t)nq, sizeof(int));
    int *train = xmalloc((size_t)n_train * sizeof(int));
    read_exact(fp, k, (size_t)nk * hd * 4);
    read_exact(fp, q, (size_t)nq * hd * 4);
    read_exact(fp, end, (size_t)nq * sizeof(int));
    fclose(fp);
    for (int i = 0; i < n_train; i++) train[i] = i;
    phi_fit_set d = {hd, 1, h[9], nk, nq, k, q, head, end};
    float *theta = xmalloc(2 * (size_t)np * 4);
    memcpy(theta, p->q, (size_t)np * 4);
    memcpy(theta + np, p->k, (size_t)np * 4);
    const float *pq[1] = {theta};
    double before = phi_fit_remainder_bias(p, pq, theta + np, &d, train, n_train, frac);
    phi_fit_calibrate(p, theta, &d, train, n_train, frac);
    double after = phi_fit_remainder_bias(p, pq, theta + np, &d, train, n_train, frac);
    memcpy(p->q, theta, (size_t)np * 4);
    if (phi_maps_save(p, cal_path, err, sizeof err)) return 1;
    printf("%.9g %.9g\n", before, after);
    phi_maps_free(p);
    free(k), free(q), free(end), free(head), free(train), free(theta);
    return 0;
}

static int set_opt(strategy_opts *o, const char *kv) {
    const char *eq = strchr(kv, '=');
    if (!eq) return -1;
    const char *v = eq + 1;
    size_t n = (size_t)(eq - kv);
    if (n == 4 && !strncmp(kv, "sink", 4)) o->sink = atoi(v);
    else if (n == 4 && !strncmp(kv, "tail", 4)) o->tail = atoi(v);
    else if (n == 4 && !strncmp(kv, "topk", 4)) o->topk = atoi(v);
    else if (n == 6 && !strncmp(kv, "budget", 6)) o->budget = (float)atof(v);
    else if (n == 3 && !strncmp(kv, "phi", 3)) o->phi_path = v;
    else return -1;
    return 0;
}

static int decode(int argc, char **argv) {
    const char *sname = "full";
    strategy_opts o = strategy_opts_default();
    int a = 4, *cont = xmalloc((size_t)(argc + 1024) * sizeof(int)), n_cont = 0, greedy = 0;
    for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
        if (!strcmp(argv[a], "--strategy")) sname = argv[a + 1];
        else if (!strcmp(argv[a], "--greedy")) n_cont = greedy = atoi(argv[a + 1]) < 1024 ? atoi(argv[a + 1]) : 1024;
        else if (!strcmp(argv[a], "--cont")) cont[n_cont++] = atoi(argv[a + 1]);
        else if (strcmp(argv[a], "--set") || set_opt(&o, argv[a + 1])) {
            fprintf(stderr, "bad option %s %s\n", argv[a], argv[a + 1]);
            return 2;
        }
    }
    int n = argc - a, *ids = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    for (int i = 0; i < n; i++) ids[i] = atoi(argv[a + i]);
    char err[512];
    backend *bk = backend_cpu_create(0);
    gguf_file *f = gguf_open(argv[2], err, sizeof err);
    model *m = f ? model_load_gguf(f, bk, err, sizeof err) : NULL;
    const strategy *s = strategy_find(sname);
    if (!m || !s || n < 1 || (s->check && s->check(m, &o, err, sizeof err))) {
        fprintf(stderr, "%s\n", !s ? "unknown strategy" : n < 1 ? "no ids" : err);
        return 1;
    }
    int vocab = m->cfg.vocab;
    float *logits = xmalloc((size_t)(1 + n_cont) * vocab * sizeof(float));
    prefill_info info = {0};
    kv_cache *kv = s->prefill(m, ids, n, n_cont, &o, logits, &info, err, sizeof err);
    if (!kv) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    for (int t = 0; t < n_cont; t++) {
        int pos = n + t;
        if (greedy) {   // argmax of the previous row
            const float *prev = logits + (size_t)t * vocab;
            cont[t] = 0;
            for (int j = 1; j < vocab; j++)
                if (prev[j] > prev[cont[t]]) cont[t] = j;
        }
        fwd_run(m, kv, &cont[t], &pos, 1, info.decode.attention ? &info.decode : NULL,
                logits + (size_t)(1 + t) * vocab, 0);
    }
    FILE *out = fopen(argv[3], "wb");
    if (!out) return 1;
    fwrite(logits, sizeof(float), (size_t)(1 + n_cont) * vocab, out);
    fclose(out);
    if (info.note[0]) fprintf(stderr, "note: %s\n", info.note);
    kv_free(kv);
    model_free(m);
    gguf_close(f);
    bk->destroy(bk);
    free(logits), free(ids), free(cont);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "attend")) return attend(argv[2], argv[3]);
    if (argc == 5 && !strcmp(argv[1], "fit")) return fit(argv[2], argv[3], argv[4]);
    if (argc >= 5 && !strcmp(argv[1], "decode")) return decode(argc, argv);
    if (argc == 6 && !strcmp(argv[1], "calibrate")) return calibrate(argv[2], argv[3], atof(argv[4]), argv[5]);
    fprintf(stderr, "usage: tool_phi attend IN OUT | fit IN INIT FIT | calibrate IN FIT FRAC CAL | decode MODEL OUT [opts] ID...\n");
    return 2;
}
