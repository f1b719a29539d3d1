// tests/tool_batch.c — batched decode (gen_step over many sequences, one forward pass per step)
// against each sequence run alone (gen_step over one), for the Python tests.
// usage: tool_batch MODEL.gguf STRATEGY[,STRATEGY...] [N_PROMPTS [pack MAX_ROWS]]
// Prompts: N_PROMPTS (default 5) id sequences of different lengths (40 + 37 i tokens, ids from a
// fixed hash) with different n_predict (6 + 3 i), so they finish at different steps; greedy.
// When a list of strategies is given, prompt i runs strategy i % count (a mixed batch, as the
// A/B mode makes). Prints one line per prompt: `prompt STRATEGY ALONE_TOKENS | BATCH_TOKENS |
// max_abs max_rel | SEL` where max_* compare every step's logits (batched vs alone) and SEL says
// whether decode read the same keys as often in both (per cache layer and prompt position:
// strategy_run.count_selected; 1 same, 0 not, - no selection), then `batch steps S` (the
// shared passes the batch took).
// pack: the batched side prefills every prompt whose strategy packs (gen_packs) in shared passes
// (gen_open, then gen_prefill_packed of at most MAX_ROWS rows over the prompts not yet prefilled,
// one pass before each decode step, as jobs/run.c does), and every third prompt is short (5, 8,
// 11, ... tokens: the row kernels' class where the long ones take the wide products); then
// `prefill passes P` (shared passes that prefilled packed prompts) and `packed K` (prompts they
// prefilled) close the output.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../policies/policy.h"
#include "../util/check.h"
#include "tool_weights.h"

#define MAX_STEPS 64

typedef struct {
    gen_seq *g;
    long *sel;    // (cache layers, prompt) decode's exact reads per key, or NULL
    float *log;   // (MAX_STEPS, vocab): the logits each step sampled from (step 0: prefill's)
    int *ids, n;
    int vocab;
} rec;

// Before gen_end: r's decode selection counts (NULL without a selecting decode strategy).
static void keep_selection(rec *r, int n_prompt) {
    gen_seq *g = r->g;
    if (!g->info.decode_selected) return;
    int L = g->kv->n_layer;
    r->sel = xcalloc((size_t)L * n_prompt, sizeof(long));
    for (int l = 0; l < L; l++)
        g->info.decode_selected(g->info.decode.ctx, l, &g->kv->layers[l], r->sel + (size_t)l * n_prompt,
                                n_prompt);
}

static int on_tok(void *ctx, int id) {
    rec *r = ctx;
    if (r->n < MAX_STEPS) {
        memcpy(r->log + (size_t)r->n * r->vocab, r->g->logits, (size_t)r->vocab * sizeof(float));
        r->ids[r->n] = id;
    }
    r->n++;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tool_batch MODEL.gguf STRATEGY[,STRATEGY...] [N_PROMPTS]\n");
        return 2;
    }
    int np = argc > 3 ? atoi(argv[3]) : 5;
    int pack = argc > 5 && !strcmp(argv[4], "pack"), max_rows = pack ? atoi(argv[5]) : 0;
    const strategy *ss[16];
    int ns = 0;
    char *list = strdup(argv[2]);
    for (char *t = strtok(list, ","); t && ns < 16; t = strtok(NULL, ",")) {
        if (!(ss[ns++] = strategy_find(t))) {
            fprintf(stderr, "unknown strategy %s\n", t);
            return 2;
        }
    }
    char err[512];
    gguf_file *f = gguf_open(argv[1], err, sizeof err);
    backend *bk = f ? backend_cpu_create(0, tool_weights()) : NULL;
    model *m = f ? model_load_gguf(f, bk, err, sizeof err) : NULL;
    if (!m) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    strategy_opts o = strategy_opts_default();
    strategy_run run = {.count_selected = 1};
    context *cx = ctx_new(m, NULL);
    int vocab = m->cfg.vocab;
    int **ids = xcalloc((size_t)np, sizeof *ids), *len = xcalloc((size_t)np, sizeof *len);
    int *npred = xcalloc((size_t)np, sizeof *npred);
    for (int i = 0; i < np; i++) {
        len[i] = pack && i % 3 == 1 ? 4 + i : 40 + 37 * i, npred[i] = 6 + 3 * i;
        ids[i] = xmalloc((size_t)len[i] * sizeof(int));
        for (int j = 0; j < len[i]; j++) ids[i][j] = (int)((j * 7919u + i * 104729u + 13) % (unsigned)vocab);
    }
    rec *alone = xcalloc((size_t)np, sizeof *alone), *batch = xcalloc((size_t)np, sizeof *batch);
    gen_seq *ga = xcalloc((size_t)np, sizeof *ga), *gb = xcalloc((size_t)np, sizeof *gb);
    sampler *sa = xcalloc((size_t)np, sizeof *sa), *sb = xcalloc((size_t)np, sizeof *sb);
    for (int i = 0; i < np; i++) {
        const strategy *s = ss[i % ns];
        rec *r[2] = {&alone[i], &batch[i]};
        gen_seq *g[2] = {&ga[i], &gb[i]};
        sampler *sm[2] = {&sa[i], &sb[i]};
        for (int k = 0; k < 2; k++) {
            *r[k] = (rec){g[k], NULL, xmalloc((size_t)MAX_STEPS * vocab * sizeof(float)),
                          xmalloc(MAX_STEPS * sizeof(int)), 0, vocab};
            sampler_init(sm[k], &(sample_params){.temp = 0}, vocab);
        }
        // alone: begin, step until done, end — before any batched sequence exists
        if (gen_begin(g[0], s, cx, &o, &run, ids[i], len[i], npred[i], sm[0], on_tok, r[0], NULL, err,
                      sizeof err)) {
            fprintf(stderr, "%s: %s\n", s->name, err);
            return 1;
        }
        while (!g[0]->done) gen_step(&g[0], 1);
        keep_selection(r[0], len[i]);
        gen_end(g[0]);
    }
    // batched: every prompt begun, then shared steps until all are done (they finish apart)
    gen_seq **all = xmalloc((size_t)np * sizeof *all), **wait = xmalloc((size_t)np * sizeof *wait);
    int n_wait = 0;
    for (int i = 0; i < np; i++) {
        const strategy *s = ss[i % ns];
        int rc = pack && gen_packs(s)
                     ? gen_open(&gb[i], s, cx, ids[i], len[i], npred[i], &sb[i], on_tok, &batch[i], err, sizeof err)
                     : gen_begin(&gb[i], s, cx, &o, &run, ids[i], len[i], npred[i], &sb[i], on_tok,
                                 &batch[i], NULL, err, sizeof err);
        if (rc) {
            fprintf(stderr, "%s: %s\n", s->name, err);
            return 1;
        }
        if (pack && gen_packs(s)) wait[n_wait++] = &gb[i];
    }
    int steps = 0, left = np, passes = 0, packed = n_wait;
    while (left > 0) {
        if (n_wait > 0) {   // one shared prefill pass, then the decode step of the prefilled
            gen_prefill_packed(wait, n_wait, max_rows);
            passes++;
            int k = 0;
            for (int i = 0; i < n_wait; i++)
                if (!wait[i]->fed) wait[k++] = wait[i];
            n_wait = k;
        }
        int b = 0;
        for (int i = 0; i < np; i++)
            if (!gb[i].ids) all[b++] = &gb[i];   // prefilled (gen_begin, or a packed pass)
        gen_step(all, b);
        steps++;
        left = 0;
        for (int i = 0; i < np; i++) left += !gb[i].done;
    }
    for (int i = 0; i < np; i++) {
        keep_selection(&batch[i], len[i]);
        int L = gb[i].kv->n_layer;
        gen_end(&gb[i]);
        double max_abs = 0, max_rel = 0;
        int n = alone[i].n < batch[i].n ? alone[i].n : batch[i].n;
        for (int t = 0; t < n && t < MAX_STEPS; t++) {
            const float *a = alone[i].log + (size_t)t * vocab, *b = batch[i].log + (size_t)t * vocab;
            double scale = 0;
            for (int v = 0; v < vocab; v++) scale = fmax(scale, fabs(a[v]));
            for (int v = 0; v < vocab; v++) {
                double d = fabs((double)a[v] - b[v]);
                max_abs = fmax(max_abs, d);
                max_rel = fmax(max_rel, d / (scale > 0 ? scale : 1));
            }
        }
        printf("prompt %s", ss[i % ns]->name);
        for (int t = 0; t < alone[i].n && t < MAX_STEPS; t++) printf(" %d", alone[i].ids[t]);
        printf(" |");
        for (int t = 0; t < batch[i].n && t < MAX_STEPS; t++) printf(" %d", batch[i].ids[t]);
        printf(" | %.3g %.3g | ", max_abs, max_rel);
        if (!alone[i].sel || !batch[i].sel) printf("-\n");
        else printf("%d\n", !memcmp(alone[i].sel, batch[i].sel, (size_t)L * len[i] * sizeof(long)));
        free(alone[i].sel), free(batch[i].sel);
        free(alone[i].log), free(alone[i].ids), free(batch[i].log), free(batch[i].ids);
        sampler_free(&sa[i]), sampler_free(&sb[i]);
        free(ids[i]);
    }
    printf("batch steps %d\n", steps);
    if (pack) printf("prefill passes %d\npacked %d\n", passes, packed);
    free(wait), free(all), free(ga), free(gb), free(sa), free(sb), free(alone), free(batch);
    free(ids), free(len), free(npred), free(list);
    ctx_free(cx);
    model_free(m);
    bk->destroy(bk);
    gguf_close(f);
    return 0;
}
