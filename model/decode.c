// model/decode.c — the decode step (fwd_decode, see forward.h): one row per sequence through the
// same pass as any other (fwd_forward), in the context's run state planned for the batch, on
// positions and tokens bound to the device once per step; recorded as a CUDA graph on its second
// call on the same caches and buffers and replayed after (SIFT_CUDA_GRAPHS=0: never recorded);
// then each sequence's next token drawn, on the device when the backend samples.
#include "pass.h"
#include "../util/tunables.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"

struct fwd_decoder {
    int B;                 // sequences of the step lens is sized for (0: none yet)
    int *lens;             // (B, n_layer) cache lengths before a recording
    int *grow;             // (B, n_layer) entries the recorded step appends to each cache layer
    uint64_t key;          // the caches and buffers the steps run on
    void *graph;           // the recorded step, or NULL
    int eager;             // steps run on these caches (the first eagerly: it sizes every buffer
                           // a recording reads)
    long fixed, recorded, replayed;
};

// Whether a sequence's step may run in the fixed buffers and be recorded: one row, logits, and
// no hook acting or only recordable ones (forward.h: fwd_hooks.recordable).
static int decode_fixed(const fwd_seq *q) {
    const fwd_hooks *h = q->hooks;
    return q->n == 1 && q->logits &&
           (!h || h->recordable ||
            (!h->after_attention && !h->after_layer && !h->kv_source && !h->attention));
}

static int graphs_wanted(void) { return tunables()->cuda_graphs; }

static void drop_graph(backend *bk, struct fwd_decoder *d) {
    if (d->graph) bk->graph_free(bk, d->graph);
    d->graph = NULL;
}

// FNV-1a over the caches, their layers' buffers and capacities, the sequences' hooks and the
// run state's buffers: equal keys, equal launches.
static uint64_t step_key(const fwd_seq *seqs, int B, const fwd_run_state *r) {
    uint64_t h = 1469598103934665603ull;
#define MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
    for (int b = 0; b < B; b++) {
        const kv_cache *kv = seqs[b].kv;
        MIX((uintptr_t)kv);
        for (int l = 0; l < kv->n_layer; l++)
            MIX((uintptr_t)kv->layers[l].k), MIX((uintptr_t)kv->layers[l].v), MIX(kv->layers[l].cap);
        const fwd_hooks *hk = seqs[b].hooks;
        MIX((uintptr_t)(hk ? hk->ctx : NULL)), MIX((uintptr_t)(hk ? hk->after_layer : NULL));
        MIX((uintptr_t)(hk ? hk->kv_source : NULL));
        MIX((uintptr_t)(hk ? hk->attention : NULL));
    }
    const void *bufs[] = {r->x, r->xb, r->q, r->k, r->v, r->att, r->hb, r->hb2, r->out, r->tok, r->pos};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) MIX((uintptr_t)bufs[i]);
#undef MIX
    return h;
}

// The step on the context's run state: bound, then replayed, recorded or run eagerly.
static void step_fixed(context *cx, struct fwd_decoder *d, fwd_seq *seqs, int B) {
    const model *m = cx->m;
    backend *bk = m->bk;
    int L = m->cfg.n_layer;
    fwd_run_state *r = fwd_plan(cx, B, B);
    if (d->B != B) {
        free(d->lens), free(d->grow);
        d->lens = xmalloc((size_t)B * L * sizeof(int)), d->grow = xmalloc((size_t)B * L * sizeof(int));
        d->B = B;
    }
    uint64_t key = step_key(seqs, B, r);
    if (key != d->key) drop_graph(bk, d), d->key = key, d->eager = 0;
    fwd_pass p;
    fwd_pass_begin(&p, cx, seqs, B);
    bk->step_bind(bk, r->tok, r->pos, B);
    for (int b = 0; b < B && d->graph; b++)   // a replay appends where the device says: the host checks first
        for (int l = 0; l < L; l++) {
            const kv_layer *y = &seqs[b].kv->layers[l];
            int g = d->grow[b * L + l];
            CHECK_INTERNAL(y->len + g <= y->cap, "KV layer overflow: %d + %d > %d", y->len, g, y->cap);
        }
    if (d->graph && bk->graph_launch(bk, d->graph) == 0) {   // the device appended: note it here
        for (int b = 0; b < B; b++)
            for (int l = 0; l < L; l++)
                if (d->grow[b * L + l]) kv_note_append(&seqs[b].kv->layers[l], &r->pos[b], 1);
        d->replayed++;
    } else {
        if (d->graph) drop_graph(bk, d), d->eager = 0;   // stale: one eager step sizes buffers again
        int record = d->eager > 0 && bk->graph_begin && graphs_wanted();
        for (int b = 0; b < B && record; b++)
            for (int l = 0; l < L; l++) d->lens[b * L + l] = seqs[b].kv->layers[l].len;
        if (record && bk->graph_begin(bk) != 0) record = 0;
        CHECK_INTERNAL(fwd_forward(&p, 0) == 0, "a dense decode step aborted");
        if (record) {
            d->graph = bk->graph_end(bk);
            for (int b = 0; b < B; b++)   // what the recording appends, per cache layer (0 or 1)
                for (int l = 0; l < L; l++) {
                    int g = seqs[b].kv->layers[l].len - d->lens[b * L + l];
                    CHECK_INTERNAL(g == 0 || g == 1, "a decode step appended %d entries", g);
                    d->grow[b * L + l] = g;
                }
            if (d->graph && bk->graph_launch(bk, d->graph) == 0) d->recorded++;
            else {   // nothing ran: undo the host's notes of the appends and run it eagerly
                drop_graph(bk, d);
                for (int b = 0; b < B; b++)
                    for (int l = 0; l < L; l++) seqs[b].kv->layers[l].len = d->lens[b * L + l];
                CHECK_INTERNAL(fwd_forward(&p, 0) == 0, "a dense decode step aborted");
            }
        }
        d->eager++;
    }
    bk->step_bind(bk, NULL, NULL, 0);
    d->fixed++;
    for (int b = 0; b < B; b++) seqs[b].rows_done = L;
    if (fwd_device_draw(bk, r->out, seqs, B, m->cfg.vocab) != 0) fwd_logits_to_host(&p, 0);
}

int fwd_decode(context *cx, fwd_seq *seqs, int B) {
    int fixed = cx->m->bk->step_bind != NULL && B >= 1 && B <= FWD_MAX_BATCH;
    for (int b = 0; b < B && fixed; b++) fixed = decode_fixed(&seqs[b]);
    for (int b = 0; b < B; b++) seqs[b].token = -1;
    if (fixed) step_fixed(cx, cx->decoder ? cx->decoder : (cx->decoder = xcalloc(1, sizeof *cx->decoder)),
                          seqs, B);
    else if (fwd_run_batch(cx, seqs, B) != 0) return -1;
    for (int b = 0; b < B; b++)   // the host draws what the device did not
        if (seqs[b].smp && seqs[b].token < 0) seqs[b].token = sample_next(seqs[b].smp, seqs[b].logits);
    return 0;
}

void fwd_decode_counts(const context *cx, long *fixed, long *recorded, long *replayed) {
    const struct fwd_decoder *d = cx->decoder;
    *fixed = d ? d->fixed : 0, *recorded = d ? d->recorded : 0, *replayed = d ? d->replayed : 0;
}

void fwd_decode_free(context *cx) {
    if (!cx->decoder) return;
    drop_graph(cx->m->bk, cx->decoder);
    free(cx->decoder->lens);
    free(cx->decoder->grow);
    free(cx->decoder);
    cx->decoder = NULL;
}
