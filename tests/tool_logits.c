// tests/tool_logits.c — drives sift's forward pass for the Python tests.
// usage: tool_logits MODEL OUT.f32 [--greedy N] [--strategy NAME] [--set KEY=VALUE]...
//                    [--temp T --seed S] [--cache T] ID...
// (MODEL: a GGUF file or a Hugging Face directory)
// Without --strategy: writes float32 logits (n_ids, vocab), row-major, of every prompt position
// (plain full pass). With --strategy: writes the logits (vocab,) the strategy's prefill gives
// for the first generated token. --greedy N also prints the N greedily generated ids (strategy
// full unless --strategy) on one line; --steps FILE with it writes those N tokens' logits
// (N, vocab) there (row 0 the prefill's, row t decode step t's). --ubatch U: a plain prefill
// (prefill_run without hooks) runs in chunks of U rows (ctx_params.ubatch; default 0: one
// pass). --cache T: the KV cache of type T (f32, bf16, f16, q8_0) for K and V, as sift's
// --cache-type-k/-v. --class N prints fwd_row_class of N rows on stderr ("class N C"). --set keys: the strategy_opts fields speed_depth, anchor,
// tsp_layer, tsp_rate, kv_rate, window, pool_kernel, pool (0 max, 1 avg), kv_len, tsp_len, keep,
// lookahead, chunk, spec_pool, draft_layers, keep_last, swiftkv_layers, swiftkv_group,
// swiftkv_fold, sink, tail, topk, budget; --draft PATH loads a draft model. --temp T (with
// --strategy, not --greedy): the prefill runs as a request sampled at temperature T with seed S
// (--seed, default 0; no other filter) through run_generate, so the request's sampling
// reaches the strategy as it does in sift; prints the sampled id.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../policies/policy.h"
#include "../util/check.h"
#include "tool_weights.h"
#include "../weights/hf.h"
#include "../weights/kvrow.h"

static int collect(void *ctx, int id) {
    (void)ctx;
    printf("%d ", id);
    return 0;
}

static int set_opt(strategy_opts *o, const char *kv) {
    const char *eq = strchr(kv, '=');
    if (!eq) return -1;
    size_t n = (size_t)(eq - kv);
    double v = atof(eq + 1);
    struct { const char *key; int *i; float *f; } t[] = {
        {"speed_depth", &o->speed_depth, NULL}, {"anchor", &o->anchor, NULL},
        {"tsp_layer", &o->tsp_layer, NULL},     {"tsp_rate", NULL, &o->tsp_rate},
        {"kv_rate", NULL, &o->kv_rate},         {"window", &o->window, NULL},
        {"pool_kernel", &o->pool_kernel, NULL}, {"pool", &o->pool, NULL},
        {"kv_len", &o->kv_len, NULL},           {"tsp_len", &o->tsp_len, NULL},
        {"keep", NULL, &o->keep},
        {"lookahead", &o->lookahead, NULL},     {"chunk", &o->chunk, NULL},
        {"spec_pool", &o->spec_pool, NULL},     {"draft_layers", &o->draft_layers, NULL},
        {"keep_last", &o->keep_last, NULL},
        {"swiftkv_layers", &o->swiftkv_layers, NULL}, {"swiftkv_group", &o->swiftkv_group, NULL},
        {"swiftkv_fold", &o->swiftkv_fold, NULL},
        {"sink", &o->sink, NULL},               {"tail", &o->tail, NULL},
        {"topk", &o->topk, NULL},               {"budget", NULL, &o->budget},
    };
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (strlen(t[i].key) == n && strncmp(kv, t[i].key, n) == 0) {
            if (t[i].i) *t[i].i = (int)v;
            else *t[i].f = (float)v;
            return 0;
        }
    return -1;
}

// A GGUF file, or a Hugging Face directory (*h set, *f NULL).
static model *load(const char *path, backend *bk, gguf_file **f, hf_dir **h) {
    char err[512];
    *f = NULL;
    *h = hf_is_dir(path) ? hf_open(path, err, sizeof err) : NULL;
    if (!*h) *f = hf_is_dir(path) ? NULL : gguf_open(path, err, sizeof err);
    model *m = *h ? model_load_hf(*h, bk, err, sizeof err)
                  : *f ? model_load_gguf(*f, bk, err, sizeof err) : NULL;
    if (!m) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    return m;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: tool_logits MODEL OUT.f32 [--greedy N] [--strategy S] "
                        "[--set K=V]... [--draft PATH] [--cache T] ID...\n");
        return 2;
    }
    int a = 3, greedy = 0, ubatch = 0, cls_rows = 0, cache = -1;
    float temp = -1;
    unsigned long long seed = 0;
    const char *sname = NULL, *draft_path = NULL, *steps_path = NULL;
    strategy_opts o = strategy_opts_default();
    for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
        if (strcmp(argv[a], "--greedy") == 0) greedy = atoi(argv[a + 1]);
        else if (strcmp(argv[a], "--strategy") == 0) sname = argv[a + 1];
        else if (strcmp(argv[a], "--draft") == 0) draft_path = argv[a + 1];
        else if (strcmp(argv[a], "--temp") == 0) temp = (float)atof(argv[a + 1]);
        else if (strcmp(argv[a], "--seed") == 0) seed = strtoull(argv[a + 1], NULL, 10);
        else if (strcmp(argv[a], "--steps") == 0) steps_path = argv[a + 1];
        else if (strcmp(argv[a], "--ubatch") == 0) ubatch = atoi(argv[a + 1]);
        else if (strcmp(argv[a], "--class") == 0) cls_rows = atoi(argv[a + 1]);
        else if (strcmp(argv[a], "--cache") == 0 && kv_type_parse(argv[a + 1]) >= 0) cache = kv_type_parse(argv[a + 1]);
        else if (strcmp(argv[a], "--set") != 0 || set_opt(&o, argv[a + 1]) != 0) {
            fprintf(stderr, "bad option %s %s\n", argv[a], argv[a + 1]);
            return 2;
        }
    }
    int n = argc - a;
    if (n < 1) {
        fprintf(stderr, "no ids\n");
        return 2;
    }
    int *ids = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) ids[i] = atoi(argv[a + i]);
    backend *bk = backend_cpu_create(0, tool_weights());
    gguf_file *f, *df = NULL;
    hf_dir *h, *dh = NULL;
    model *m = load(argv[1], bk, &f, &h), *draft = draft_path ? load(draft_path, bk, &df, &dh) : NULL;
    ctx_params cp = {.ubatch = ubatch};
    if (cache >= 0) cp.kv_typed = 1, cp.kv_k = cp.kv_v = (enum kv_type)cache;
    context *cx = ctx_new(m, &cp), *dcx = draft ? ctx_new(draft, &cp) : NULL;
    strategy_run run = {.draft = dcx};
    if (cls_rows > 0) fprintf(stderr, "class %d %d\n", cls_rows, fwd_row_class(m, cls_rows));
    const strategy *s = strategy_find(sname ? sname : "full");
    char err[512];
    if (!s || (strategy_check(s, m, &o, err, sizeof err) != 0)) {
        fprintf(stderr, "%s\n", s ? err : "unknown strategy");
        return 1;
    }
    int vocab = m->cfg.vocab, rows = sname ? 1 : n;
    float *logits = xmalloc((size_t)rows * vocab * sizeof(float));
    kv_cache *kv = NULL;
    if (sname && temp >= 0 && greedy == 0) {   // a sampled request: gen_begin hands its sampling on
        sampler smp;
        sampler_init(&smp, &(sample_params){.temp = temp, .top_p = 1, .seed = seed}, vocab);
        run_stats st;
        if (run_generate(s, cx, &o, &run, ids, n, 1, &smp, collect, NULL, &st, logits, err,
                         sizeof err) != 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        printf("\n");
        sampler_free(&smp);
    } else if (sname) {
        prefill_info info = {0};
        kv = strategy_prefill(s, cx, ids, n, greedy > 0 ? greedy : 1, &o, &run, logits, &info, err, sizeof err);
        if (!kv) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        if (info.note[0]) fprintf(stderr, "note: %s\n", info.note);
        if (info.decode_free) info.decode_free(info.decode.ctx);
    } else {
        int *caps = xmalloc((size_t)m->cfg.n_layer * sizeof(int)), *pos = xmalloc((size_t)n * sizeof(int));
        for (int l = 0; l < m->cfg.n_layer; l++) caps[l] = n;
        for (int i = 0; i < n; i++) pos[i] = i;
        kv = fwd_kv_create(cx, caps, err, sizeof err);
        fwd_run(cx, kv, ids, pos, n, NULL, logits, 1);
        free(caps);
        free(pos);
    }
    kv_free(kv);
    FILE *out = fopen(argv[2], "wb");
    if (!out || fwrite(logits, sizeof(float), (size_t)rows * vocab, out) != (size_t)rows * vocab) {
        fprintf(stderr, "cannot write %s\n", argv[2]);
        return 1;
    }
    fclose(out);
    if (greedy > 0) {
        sampler smp;
        sampler_init(&smp, &(sample_params){.temp = 0}, vocab);
        gen_seq g;   // run_generate's loop, keeping every step's logits
        if (gen_begin(&g, s, cx, &o, &run, ids, n, greedy, &smp, collect, NULL, NULL, err, sizeof err)) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        float *steps = xmalloc((size_t)greedy * vocab * sizeof(float));
        int rows_out = 0;
        memcpy(steps, g.logits, (size_t)vocab * sizeof(float));
        rows_out++;
        gen_seq *one = &g;
        while (!g.done) {
            gen_step(&one, 1);
            memcpy(steps + (size_t)rows_out++ * vocab, g.logits, (size_t)vocab * sizeof(float));
        }
        gen_end(&g);
        FILE *so = steps_path ? fopen(steps_path, "wb") : NULL;
        if (steps_path && (!so || fwrite(steps, sizeof(float), (size_t)rows_out * vocab, so) !=
                                      (size_t)rows_out * vocab)) {
            fprintf(stderr, "cannot write %s\n", steps_path);
            return 1;
        }
        if (so) fclose(so);
        free(steps);
        printf("\n");
        sampler_free(&smp);
    }
    free(logits);
    free(ids);
    ctx_free(cx);
    ctx_free(dcx);
    model_free(m);
    model_free(draft);
    bk->destroy(bk);
    gguf_close(f);
    gguf_close(df);
    hf_close(h);
    hf_close(dh);
    return 0;
}
