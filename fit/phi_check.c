// fit/phi_check.c — the held-out harness of `sift fit-phi`'s end-to-end check (and
// bench/phi_needles.py, through tests/tool_phi): topk / topk+phi decode (policies/topk_phi.c's
// hooks) against full attention from one shared prefill, KL and greedy agreement per step.
#include <stdlib.h>
#include <string.h>

#include "../backend/sample.h"
#include "../policies/topk_phi.h"
#include "../util/check.h"
#include "phi_fit.h"

// Decodes `steps` tokens from kv (np prefilled) through hooks: the first is ids_np, then
// forced[i - 1] (forced non-NULL) or the previous row's argmax; rows (steps, vocab); toks
// (steps,) the argmax of each row. Rewinds kv to np entries afterwards.
static void decode_from(context *cx, kv_cache *kv, int np, int pos0, int id_np, const int *forced,
                        int steps, const fwd_hooks *hooks, float *rows, int *toks) {
    int vocab = cx->m->cfg.vocab, id = id_np;
    for (int t = 0; t < steps; t++) {
        int pos = pos0 + np + t;
        float *row = rows + (size_t)t * vocab;
        fwd_run(cx, kv, &id, &pos, 1, hooks, row, 0);
        toks[t] = sample_argmax(row, vocab);
        id = forced ? forced[t] : toks[t];
    }
    for (int l = 0; l < kv->n_layer; l++) kv->layers[l].len = np;
}

struct topk_cmp {
    context *cx;
    kv_cache *kv;
    const int *ids;
    int np, pos0, sink, tail, rows, n_free;
    float *ref, *got;   // (rows, vocab) full's rows; (steps, vocab) scratch
    int *full_tok, *full_free, *toks;
};

topk_cmp *topk_cmp_begin(context *cx, const int *ids, int n, int pos0, int sink, int tail, int rows,
                         int n_free, char *err, size_t errlen) {
    const model *m = cx->m;
    int np = n - 1, vocab = m->cfg.vocab, steps = rows > n_free ? rows : n_free;
    if (np - sink - tail < 1 || rows < 1) {
        err_printf(err, errlen, "prompt of %d tokens has no mid region (sink %d + tail %d)", n, sink, tail);
        return NULL;
    }
    int L = m->cfg.n_layer, *caps = xmalloc((size_t)L * sizeof(int)), *pos = xmalloc((size_t)n * sizeof(int));
    for (int l = 0; l < L; l++) caps[l] = n + steps;
    for (int i = 0; i < np; i++) pos[i] = pos0 + i;
    kv_cache *kv = fwd_kv_create(cx, caps, err, errlen);
    free(caps);
    if (!kv) {
        free(pos);
        return NULL;
    }
    topk_cmp *c = xcalloc(1, sizeof *c);
    *c = (topk_cmp){cx, kv, ids, np, pos0, sink, tail, rows, n_free,
                    xmalloc((size_t)rows * vocab * sizeof(float)), xmalloc((size_t)steps * vocab * sizeof(float)),
                    xmalloc((size_t)rows * sizeof(int)), xcalloc((size_t)n_free + 1, sizeof(int)),
                    xmalloc((size_t)steps * sizeof(int))};
    fwd_run(cx, kv, ids, pos, np, NULL, NULL, 0);
    free(pos);
    decode_from(cx, kv, np, pos0, ids[np], NULL, rows, NULL, c->ref, c->full_tok);
    if (n_free > 0) decode_from(cx, kv, np, pos0, ids[np], NULL, n_free, NULL, c->got, c->full_free);
    return c;
}

const int *topk_cmp_full(const topk_cmp *c, int free_run) { return free_run ? c->full_free : c->full_tok; }

void topk_cmp_run(topk_cmp *c, const phi_maps *maps, int k, double *kl, double *agree, int *free_tok) {
    int vocab = c->cx->m->cfg.vocab;
    kv_cache *kv = c->kv;
    fwd_hooks h = topk_phi_hooks(c->cx->m, kv, c->sink, c->tail, k, maps);
    decode_from(c->cx, kv, c->np, c->pos0, c->ids[c->np], c->full_tok, c->rows, &h, c->got, c->toks);
    *agree = 0;
    for (int r = 0; r < c->rows; r++) {
        kl[r] = sample_kl(c->ref + (size_t)r * vocab, c->got + (size_t)r * vocab, vocab);
        *agree += (c->toks[r] == c->full_tok[r]) / (double)c->rows;
    }
    if (c->n_free > 0 && free_tok) {
        decode_from(c->cx, kv, c->np, c->pos0, c->ids[c->np], NULL, c->n_free, &h, c->got, c->toks);
        memcpy(free_tok, c->toks, (size_t)c->n_free * sizeof(int));
    }
    kv->side_free(kv->side);
    kv->side = NULL, kv->side_free = NULL, kv->side_bytes = 0;
}

void topk_cmp_end(topk_cmp *c) {
    if (!c) return;
    kv_free(c->kv);
    free(c->ref), free(c->got), free(c->full_tok), free(c->full_free), free(c->toks);
    free(c);
}
