// tests/tool_logits.c — drives sift's forward pass for tests/test_logits.py.
// usage: tool_logits MODEL.gguf OUT.f32 [--greedy N] ID ID ...
// Writes float32 logits (n_ids, vocab), row-major, of every prompt position (strategy full) to
// OUT.f32; with --greedy N also prints the N greedily generated ids on one line.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../policies/policy.h"
#include "../util/check.h"

static int collect(void *ctx, int id) {
    (void)ctx;
    printf("%d ", id);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: tool_logits MODEL OUT.f32 [--greedy N] ID...\n");
        return 2;
    }
    int a = 3, greedy = 0;
    if (strcmp(argv[a], "--greedy") == 0 && a + 1 < argc) {
        greedy = atoi(argv[a + 1]);
        a += 2;
    }
    int n = argc - a;
    int *ids = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    for (int i = 0; i < n; i++) ids[i] = atoi(argv[a + i]);
    char err[512];
    gguf_file *f = gguf_open(argv[1], err, sizeof err);
    if (!f) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    backend *bk = backend_cpu_create(0);
    model *m = model_load_gguf(f, bk, err, sizeof err);
    if (!m || n < 1) {
        fprintf(stderr, "%s\n", m ? "no ids" : err);
        return 1;
    }
    int vocab = m->cfg.vocab, *caps = xmalloc((size_t)m->cfg.n_layer * sizeof(int));
    int *pos = xmalloc((size_t)n * sizeof(int));
    for (int l = 0; l < m->cfg.n_layer; l++) caps[l] = n;
    for (int i = 0; i < n; i++) pos[i] = i;
    kv_cache *kv = fwd_kv_create(m, caps, err, sizeof err);
    float *logits = xmalloc((size_t)n * vocab * sizeof(float));
    fwd_run(m, kv, ids, pos, n, NULL, logits, 1);
    FILE *out = fopen(argv[2], "wb");
    if (!out || fwrite(logits, sizeof(float), (size_t)n * vocab, out) != (size_t)n * vocab) {
        fprintf(stderr, "cannot write %s\n", argv[2]);
        return 1;
    }
    fclose(out);
    if (greedy > 0) {
        sampler smp;
        sampler_init(&smp, &(sample_params){.temp = 0}, vocab);
        run_stats st;
        strategy_opts o = strategy_opts_default();
        if (run_generate(strategy_find("full"), m, &o, ids, n, greedy, &smp, collect, NULL, &st,
                         err, sizeof err) != 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        printf("\n");
        sampler_free(&smp);
    }
    kv_free(kv);
    free(logits);
    free(caps);
    free(pos);
    free(ids);
    model_free(m);
    bk->destroy(bk);
    gguf_close(f);
    return 0;
}
