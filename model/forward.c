// model/forward.c — the shared forward pass (see forward.h). Reads top to bottom like the model:
// embed -> per layer: norm, QKV, RoPE, cache, attention, out-proj, residual, norm, SwiGLU MLP,
// residual, hook -> final norm -> LM head.
#include "forward.h"
#include "../attn/phi.h"
#include "../attn/score.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"

typedef struct {
    void *xb, *q, *k, *v, *att, *hb, *hb2;   // scratch activations sized for n rows
} scratch;

static scratch scratch_alloc(backend *bk, const model_config *c, int n) {
    size_t qd = (size_t)c->n_head * c->head_dim, kvd = (size_t)c->n_kv_head * c->head_dim;
    size_t d = (size_t)c->d_model, f = (size_t)c->d_ff;
    scratch s = {
        bk->alloc(bk, n * (d > qd ? d : qd)), bk->alloc(bk, n * qd), bk->alloc(bk, n * kvd),
        bk->alloc(bk, n * kvd), bk->alloc(bk, n * qd), bk->alloc(bk, n * f), bk->alloc(bk, n * f),
    };
    CHECK_INTERNAL(s.xb && s.q && s.k && s.v && s.att && s.hb && s.hb2,
                   "out of memory for activations of %d rows (try a shorter prompt)", n);
    return s;
}

static void scratch_free(backend *bk, scratch *s) {
    void *all[] = {s->xb, s->q, s->k, s->v, s->att, s->hb, s->hb2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) bk->free(bk, all[i]);
}

// out[j] (n, o[j]) = x (n, in) @ w[j]^T + bias[j], j < k: one backend call when it offers it
static void matmuls(backend *bk, int k, void *const *out, const void *x, const bk_weight *const *w,
                    const bk_weight *const *bias, int n, int in, const int *o) {
    if (bk->matmul_multi) bk->matmul_multi(bk, k, out, x, w, bias, n, in, o);
    else
        for (int j = 0; j < k; j++) bk->matmul(bk, out[j], x, w[j], bias[j], n, in, o[j]);
}

// A pass: the rows of B sequences, concatenated (B = 1: one sequence, as fwd_run gives it).
// all is the whole pass; view[b] is sequence b as its hooks see it (its cache, rows, positions;
// x = its rows of all->x). With B = 1, view[0] IS all, so hooks may drop rows (fwd_keep_rows);
// with B > 1 they may not (decode hooks never do).
typedef struct {
    int B;
    fwd_state *all, *view;
    const fwd_hooks *const *hooks;   // (B,), entries may be NULL
    int *off;                        // (B,) first row of each sequence in the pass
} pass;

static void *row_ptr(const backend *bk, const void *p, long row, long width) {
    return (char *)p + (size_t)row * width * bk->elem_bytes;
}

// One transformer block on the alive rows: x += attn(norm(x)); x += mlp(norm(x)). The
// projections and the MLP run once over every row of the pass; the cache append, attention
// and hooks run per sequence.
static int layer_forward(pass *ps, scratch *s, int l) {
    fwd_state *st = ps->all;
    model *m = st->m;
    backend *bk = m->bk;
    const model_config *c = &m->cfg;
    const layer_weights *w = &m->layers[l];
    int n = st->n, d = c->d_model, hd = c->head_dim, B = ps->B;
    int qd = c->n_head * hd, kvd = c->n_kv_head * hd;

    // per sequence: where this layer's K/V come from (a hook may feed them), which q projection
    int src[FWD_MAX_BATCH], fed[FWD_MAX_BATCH] = {0}, uniform = 1;
    const bk_weight *wq[FWD_MAX_BATCH], *bq[FWD_MAX_BATCH];
    for (int b = 0; b < B; b++) {
        const fwd_hooks *h = ps->hooks[b];
        src[b] = l, wq[b] = w->wq, bq[b] = w->bq;
        fed[b] = h && h->kv_source && h->kv_source(h->ctx, l, &src[b], &wq[b], &bq[b]);
        CHECK_INTERNAL(wq[b] && (fed[b] || w->wk), "layer %d has no q/k/v projections", l);
        uniform &= fed[b] == fed[0] && wq[b] == wq[0] && bq[b] == bq[0];
    }
    bk->rmsnorm(bk, s->xb, st->x, w->attn_norm, n, d, c->rms_eps);
    // q (n, qd), and unless a hook feeds this layer's KV: k, v (n, kvd); one product over the
    // pass when every sequence takes the same, else one per sequence
    for (int b = 0; b < (uniform ? 1 : B); b++) {
        int r0 = uniform ? 0 : ps->off[b], nr = uniform ? n : ps->view[b].n;
        void *qkv[] = {row_ptr(bk, s->q, r0, qd), row_ptr(bk, s->k, r0, kvd), row_ptr(bk, s->v, r0, kvd)};
        const bk_weight *wqkv[] = {wq[b], w->wk, w->wv}, *bqkv[] = {bq[b], w->bk, w->bv};
        matmuls(bk, fed[b] ? 1 : 3, qkv, row_ptr(bk, s->xb, r0, d), wqkv, bqkv, nr, d,
                (const int[]){qd, kvd, kvd});
    }
    bk->rope(bk, s->q, st->pos, n, c->n_head, hd, c->inv_freq, c->rope);
    if (uniform && !fed[0]) bk->rope(bk, s->k, st->pos, n, c->n_kv_head, hd, c->inv_freq, c->rope);
    for (int b = 0; b < B; b++) {   // each sequence's K/V into its own cache
        fwd_state *v = &ps->view[b];
        if (fed[b]) continue;
        void *k = row_ptr(bk, s->k, ps->off[b], kvd);
        if (!uniform) bk->rope(bk, k, v->pos, v->n, c->n_kv_head, hd, c->inv_freq, c->rope);
        bk->kv_append(bk, &v->kv->layers[l], k, row_ptr(bk, s->v, ps->off[b], kvd), v->pos, v->n);
    }
    // attention, att (n, qd): a hook's own, else the backend's (sequences without a hook in one
    // call when the backend takes several)
    void *m_out[FWD_MAX_BATCH];
    const void *m_q[FWD_MAX_BATCH];
    const int *m_pos[FWD_MAX_BATCH];
    int m_rows[FWD_MAX_BATCH], k = 0;
    const kv_layer *m_L[FWD_MAX_BATCH];
    for (int b = 0; b < B; b++) {
        fwd_state *v = &ps->view[b];
        const fwd_hooks *h = ps->hooks[b];
        void *q = row_ptr(bk, s->q, ps->off[b], qd), *att = row_ptr(bk, s->att, ps->off[b], qd);
        if (h && h->attention) {
            if (h->attention(h->ctx, v, src[b], q, att) != 0) return -1;
        } else if (B > 1 && bk->attention_multi) {
            m_out[k] = att, m_q[k] = q, m_pos[k] = v->pos, m_rows[k] = v->n;
            m_L[k++] = &v->kv->layers[src[b]];
        } else
            bk->attention(bk, att, q, v->pos, v->n, c->n_head, &v->kv->layers[src[b]]);
    }
    if (k) bk->attention_multi(bk, k, m_out, m_q, m_pos, m_rows, c->n_head, m_L);
    for (int b = 0; b < B; b++) {
        fwd_state *v = &ps->view[b];
        const fwd_hooks *h = ps->hooks[b];
        int nv = v->n;
        if (h && h->after_attention &&
            h->after_attention(h->ctx, v, l, row_ptr(bk, s->q, ps->off[b], qd)) != 0)
            return -1;
        CHECK_INTERNAL(B == 1 || (v->n == nv && v->x == row_ptr(bk, st->x, ps->off[b], d)),
                       "a hook dropped rows inside a batched pass");
    }
    n = st->n;   // B = 1: an after_attention hook may have dropped rows
    bk->matmul(bk, s->xb, s->att, w->wo, NULL, n, qd, d);
    if (bk->add_rmsnorm) bk->add_rmsnorm(bk, s->xb, st->x, s->xb, w->ffn_norm, n, d, c->rms_eps);
    else {
        bk->add(bk, st->x, s->xb, (size_t)n * d);
        bk->rmsnorm(bk, s->xb, st->x, w->ffn_norm, n, d, c->rms_eps);
    }
    // hb (n, d_ff) = silu(gate) * up
    if (!bk->swiglu_matmul || bk->swiglu_matmul(bk, s->hb, s->xb, w->w_gate, w->w_up, n, d, c->d_ff)) {
        void *gu[] = {s->hb, s->hb2};
        const bk_weight *wgu[] = {w->w_gate, w->w_up}, *nob[] = {NULL, NULL};
        matmuls(bk, 2, gu, s->xb, wgu, nob, n, d, (const int[]){c->d_ff, c->d_ff});
        bk->swiglu(bk, s->hb, s->hb, s->hb2, (size_t)n * c->d_ff);
    }
    bk->matmul(bk, s->xb, s->hb, w->w_down, NULL, n, c->d_ff, d);
    bk->add(bk, st->x, s->xb, (size_t)n * d);
    for (int b = 0; b < B; b++) ps->view[b].rows_done += ps->view[b].n;
    if (B > 1) st->rows_done += n;
    return 0;
}

// logits (rows, vocab) of the last `rows` alive rows
static void lm_head(fwd_state *st, scratch *s, float *logits, int rows) {
    model *m = st->m;
    backend *bk = m->bk;
    const model_config *c = &m->cfg;
    size_t d = c->d_model;
    void *last = (char *)st->x + (size_t)(st->n - rows) * d * bk->elem_bytes;
    bk->rmsnorm(bk, s->xb, last, m->out_norm, rows, c->d_model, c->rms_eps);
    void *out = bk->alloc(bk, (size_t)rows * c->vocab);
    CHECK_INTERNAL(out, "out of memory for logits");
    bk->matmul(bk, out, s->xb, m->lm_head, NULL, rows, c->d_model, c->vocab);
    bk->to_host(bk, logits, out, (size_t)rows * c->vocab);
    bk->free(bk, out);
}

// logits[b] (vocab,) = the last row of each sequence of a batched pass, one LM-head product
static void lm_head_batch(pass *ps, scratch *s, fwd_seq *seqs) {
    fwd_state *st = ps->all;
    backend *bk = st->m->bk;
    const model_config *c = &st->m->cfg;
    int B = ps->B, last[FWD_MAX_BATCH], k = 0;
    for (int b = 0; b < B; b++)
        if (seqs[b].logits) last[k++] = ps->off[b] + ps->view[b].n - 1;
    if (k == 0) return;
    void *x = bk->alloc(bk, (size_t)k * c->d_model), *out = bk->alloc(bk, (size_t)k * c->vocab);
    CHECK_INTERNAL(x && out, "out of memory for logits");
    bk->gather_rows(bk, x, st->x, last, k, c->d_model);
    bk->rmsnorm(bk, s->xb, x, st->m->out_norm, k, c->d_model, c->rms_eps);
    bk->matmul(bk, out, s->xb, st->m->lm_head, NULL, k, c->d_model, c->vocab);
    float *host = xmalloc((size_t)k * c->vocab * sizeof(float));
    bk->to_host(bk, host, out, (size_t)k * c->vocab);
    for (int b = 0, j = 0; b < B; b++)
        if (seqs[b].logits)
            memcpy(seqs[b].logits, host + (size_t)j++ * c->vocab, (size_t)c->vocab * sizeof(float));
    free(host);
    bk->free(bk, x);
    bk->free(bk, out);
}

// The pass over B sequences (B = 1: all_rows may ask for every row's logits).
static int run_pass(model *m, fwd_seq *seqs, int B, int all_rows) {
    backend *bk = m->bk;
    const model_config *c = &m->cfg;
    CHECK_INTERNAL(B >= 1 && B <= FWD_MAX_BATCH, "a pass of %d sequences (1 .. %d)", B, FWD_MAX_BATCH);
    int n = 0, off[FWD_MAX_BATCH];
    const fwd_hooks *hooks[FWD_MAX_BATCH];
    for (int b = 0; b < B; b++) off[b] = n, n += seqs[b].n, hooks[b] = seqs[b].hooks;
    fwd_state st = {.m = m, .kv = seqs[0].kv, .n = n};
    st.pos = xmalloc((size_t)n * sizeof(int));
    st.row_id = xmalloc((size_t)n * sizeof(int));
    int *tokens = xmalloc((size_t)n * sizeof(int));
    for (int b = 0; b < B; b++) {
        memcpy(st.pos + off[b], seqs[b].pos, (size_t)seqs[b].n * sizeof(int));
        memcpy(tokens + off[b], seqs[b].tokens, (size_t)seqs[b].n * sizeof(int));
    }
    for (int i = 0; i < n; i++) st.row_id[i] = i;
    st.x = bk->alloc(bk, (size_t)n * c->d_model);
    CHECK_INTERNAL(st.x, "out of memory for %d rows", n);
    scratch s = scratch_alloc(bk, c, n);
    fwd_state views[FWD_MAX_BATCH];
    for (int b = 0; b < B && B > 1; b++)
        views[b] = (fwd_state){.m = m, .kv = seqs[b].kv, .n = seqs[b].n, .pos = st.pos + off[b],
                               .row_id = st.row_id + off[b],
                               .x = row_ptr(bk, st.x, off[b], c->d_model)};
    pass ps = {B, &st, B > 1 ? views : &st, hooks, off};

    bk->embed(bk, st.x, m->tok_embd, tokens, n, c->d_model);
    int rc = 0;
    for (int l = 0; l < c->n_layer && st.n > 0 && rc == 0; l++) {
        rc = layer_forward(&ps, &s, l);
        for (int b = 0; b < B && rc == 0; b++)
            if (hooks[b] && hooks[b]->after_layer) {
                rc = hooks[b]->after_layer(hooks[b]->ctx, &ps.view[b], l);
                CHECK_INTERNAL(B == 1 || rc != FWD_STOP, "a hook stopped a batched pass early");
            }
        if (m->on_layer && n > 1) m->on_layer(m->on_layer_ctx, l, c->n_layer, st.n);
    }
    if (B == 1 && rc >= 0 && seqs[0].logits && st.n > 0)
        lm_head(&st, &s, seqs[0].logits, all_rows ? st.n : 1);
    else if (B > 1 && rc >= 0)
        lm_head_batch(&ps, &s, seqs);
    for (int b = 0; b < B; b++) seqs[b].rows_done = ps.view[b].rows_done;

    scratch_free(bk, &s);
    bk->free(bk, st.x);
    free(st.pos);
    free(st.row_id);
    free(tokens);
    return rc < 0 ? -1 : 0;
}

long fwd_run(model *m, kv_cache *kv, const int *tokens, const int *pos, int n,
             const fwd_hooks *hooks, float *logits, int all_rows) {
    fwd_seq one = {kv, tokens, pos, n, hooks, logits, 0, NULL, 0, 0};
    return run_pass(m, &one, 1, all_rows) < 0 ? -1 : one.rows_done;
}

int fwd_run_batch(model *m, fwd_seq *seqs, int B) { return run_pass(m, seqs, B, 0); }

// ---- the decode step through fixed buffers, recorded and replayed (fwd_decode) -----------------

struct fwd_decoder {
    int B;                               // sequences the buffers are for (0: none yet)
    int tok[FWD_MAX_BATCH], pos[FWD_MAX_BATCH], row_id[FWD_MAX_BATCH];   // bound each step
    void *x, *out;                       // (B, d) residual stream, (B, vocab) logits
    scratch s;
    float *host;                         // (B, vocab) logits on the host
    int *lens;                           // (B, n_layer) cache lengths before a recording
    uint64_t key;                        // the caches (and their buffers) the steps run on
    void *graph;                         // the recorded step, or NULL
    int eager;                           // steps run on these caches (the first eagerly: it sizes
                                         // every buffer a recording reads)
    long fixed, recorded, replayed;
};

static int decode_dense(const fwd_seq *q) {
    const fwd_hooks *h = q->hooks;
    return q->n == 1 && q->logits &&
           (!h || (!h->after_attention && !h->after_layer && !h->kv_source && !h->attention));
}

static int graphs_wanted(void) {
    const char *e = getenv("SIFT_CUDA_GRAPHS");
    return !(e && strcmp(e, "0") == 0);
}

static void decoder_drop_graph(backend *bk, struct fwd_decoder *d) {
    if (d->graph) bk->graph_free(bk, d->graph);
    d->graph = NULL;
}

static void decoder_release(model *m, struct fwd_decoder *d) {
    backend *bk = m->bk;
    decoder_drop_graph(bk, d);
    if (d->B) {
        scratch_free(bk, &d->s);
        bk->free(bk, d->x);
        bk->free(bk, d->out);
    }
    free(d->host);
    free(d->lens);
    d->host = NULL, d->lens = NULL, d->B = 0;
}

static void decoder_size(model *m, struct fwd_decoder *d, int B) {
    const model_config *c = &m->cfg;
    decoder_release(m, d);
    d->s = scratch_alloc(m->bk, c, B);
    d->x = m->bk->alloc(m->bk, (size_t)B * c->d_model);
    d->out = m->bk->alloc(m->bk, (size_t)B * c->vocab);
    CHECK_INTERNAL(d->x && d->out, "out of memory for a decode step of %d sequences", B);
    d->host = xmalloc((size_t)B * c->vocab * sizeof(float));
    d->lens = xmalloc((size_t)B * c->n_layer * sizeof(int));
    for (int b = 0; b < B; b++) d->row_id[b] = b;
    d->B = B, d->key = 0, d->eager = 0;
}

// FNV-1a over the caches and their layers' buffers and capacities: equal keys, equal launches.
static uint64_t decoder_key(const fwd_seq *seqs, int B) {
    uint64_t h = 1469598103934665603ull;
#define MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
    for (int b = 0; b < B; b++) {
        const kv_cache *kv = seqs[b].kv;
        MIX((uintptr_t)kv);
        for (int l = 0; l < kv->n_layer; l++)
            MIX((uintptr_t)kv->layers[l].k), MIX((uintptr_t)kv->layers[l].v), MIX(kv->layers[l].cap);
    }
#undef MIX
    return h;
}

// The step's ops on the fixed buffers: embed, every layer, final norm, LM head.
static void decoder_ops(model *m, struct fwd_decoder *d, fwd_seq *seqs, int B) {
    backend *bk = m->bk;
    const model_config *c = &m->cfg;
    fwd_state st = {.m = m, .kv = seqs[0].kv, .n = B, .pos = d->pos, .row_id = d->row_id, .x = d->x};
    fwd_state views[FWD_MAX_BATCH];
    int off[FWD_MAX_BATCH];
    const fwd_hooks *hooks[FWD_MAX_BATCH];
    for (int b = 0; b < B; b++) {
        off[b] = b, hooks[b] = seqs[b].hooks;
        views[b] = (fwd_state){.m = m, .kv = seqs[b].kv, .n = 1, .pos = d->pos + b,
                               .row_id = d->row_id + b, .x = row_ptr(bk, d->x, b, c->d_model)};
    }
    pass ps = {B, &st, B > 1 ? views : &st, hooks, off};
    bk->embed(bk, d->x, m->tok_embd, d->tok, B, c->d_model);
    for (int l = 0; l < c->n_layer; l++)
        CHECK_INTERNAL(layer_forward(&ps, &d->s, l) == 0, "a dense decode step aborted");
    bk->rmsnorm(bk, d->s.xb, d->x, m->out_norm, B, c->d_model, c->rms_eps);
    bk->matmul(bk, d->out, d->s.xb, m->lm_head, NULL, B, c->d_model, c->vocab);
}

// The next tokens drawn on the backend when every sequence has a sampler and the backend
// takes their settings: 0, else -1 (nothing drawn).
static int decoder_sample(backend *bk, struct fwd_decoder *d, fwd_seq *seqs, int B, int vocab) {
    if (!bk->sample) return -1;
    sample_params p[FWD_MAX_BATCH] = {{0}};
    uint64_t state[FWD_MAX_BATCH] = {0};
    for (int b = 0; b < B; b++) {
        if (!seqs[b].smp) return -1;
        p[b] = seqs[b].smp->p, state[b] = seqs[b].smp->state;
    }
    if (bk->sample(bk, d->tok, d->out, B, vocab, p, state) != 0) return -1;
    for (int b = 0; b < B; b++) {
        seqs[b].token = d->tok[b], seqs[b].sampled = 1;
        if (p[b].temp > 0) sample_uniform(seqs[b].smp);   // the draw the backend made
    }
    return 0;
}

int fwd_decode(model *m, fwd_seq *seqs, int B) {
    backend *bk = m->bk;
    const model_config *c = &m->cfg;
    int fixed = bk->step_bind != NULL && B >= 1 && B <= FWD_MAX_BATCH;
    for (int b = 0; b < B && fixed; b++) fixed = decode_dense(&seqs[b]);
    if (!fixed) return fwd_run_batch(m, seqs, B);
    struct fwd_decoder *d = m->decoder ? m->decoder : (m->decoder = xcalloc(1, sizeof *d));
    if (d->B != B) decoder_size(m, d, B);
    uint64_t key = decoder_key(seqs, B);
    if (key != d->key) decoder_drop_graph(bk, d), d->key = key, d->eager = 0;
    for (int b = 0; b < B; b++) d->tok[b] = seqs[b].tokens[0], d->pos[b] = seqs[b].pos[0];
    bk->step_bind(bk, d->tok, d->pos, B);
    for (int b = 0; b < B; b++)   // a replay appends where the device says: the host checks first
        for (int l = 0; l < c->n_layer; l++) {
            const kv_layer *y = &seqs[b].kv->layers[l];
            CHECK_INTERNAL(y->len < y->cap, "KV layer overflow: %d + 1 > %d", y->len, y->cap);
        }
    int done = 0;
    if (d->graph) {
        if (bk->graph_launch(bk, d->graph) == 0) {   // the device appended: note it on the host
            for (int b = 0; b < B; b++)
                for (int l = 0; l < c->n_layer; l++)
                    kv_note_append(&seqs[b].kv->layers[l], &d->pos[b], 1);
            d->replayed++, done = 1;
        } else
            decoder_drop_graph(bk, d), d->eager = 0;   // stale: one eager step sizes buffers again
    }
    if (!done) {
        // the first step on these caches runs eagerly: it sizes every buffer a recording reads
        int record = d->eager > 0 && bk->graph_begin && graphs_wanted();
        for (int b = 0; b < B && record; b++)
            for (int l = 0; l < c->n_layer; l++) d->lens[b * c->n_layer + l] = seqs[b].kv->layers[l].len;
        if (record && bk->graph_begin(bk) != 0) record = 0;
        decoder_ops(m, d, seqs, B);
        if (record) {
            d->graph = bk->graph_end(bk);
            if (d->graph && bk->graph_launch(bk, d->graph) == 0) d->recorded++;
            else {   // nothing ran: undo the host's notes of the appends and run it eagerly
                decoder_drop_graph(bk, d);
                for (int b = 0; b < B; b++)
                    for (int l = 0; l < c->n_layer; l++)
                        seqs[b].kv->layers[l].len = d->lens[b * c->n_layer + l];
                decoder_ops(m, d, seqs, B);
            }
        }
        d->eager++;
    }
    bk->step_bind(bk, NULL, NULL, 0);
    d->fixed++;
    for (int b = 0; b < B; b++) seqs[b].rows_done = c->n_layer, seqs[b].sampled = 0;
    if (decoder_sample(bk, d, seqs, B, c->vocab) == 0) return 0;
    bk->to_host(bk, d->host, d->out, (size_t)B * c->vocab);
    for (int b = 0; b < B; b++)
        memcpy(seqs[b].logits, d->host + (size_t)b * c->vocab, (size_t)c->vocab * sizeof(float));
    return 0;
}

void fwd_decode_counts(const model *m, long *fixed, long *recorded, long *replayed) {
    const struct fwd_decoder *d = m->decoder;
    *fixed = d ? d->fixed : 0, *recorded = d ? d->recorded : 0, *replayed = d ? d->replayed : 0;
}

void fwd_decode_free(model *m) {
    if (!m->decoder) return;
    decoder_release(m, m->decoder);
    free(m->decoder);
    m->decoder = NULL;
}

void fwd_keep_rows(fwd_state *s, const int *idx, int k) {
    backend *bk = s->m->bk;
    int d = s->m->cfg.d_model;
    void *x = bk->alloc(bk, (size_t)(k > 0 ? k : 1) * d);
    CHECK_INTERNAL(x, "out of memory selecting %d rows", k);
    bk->gather_rows(bk, x, s->x, idx, k, d);
    bk->free(bk, s->x);
    s->x = x;
    int *pos = xmalloc((size_t)(k > 0 ? k : 1) * sizeof(int)), *id = xmalloc((size_t)(k > 0 ? k : 1) * sizeof(int));
    for (int j = 0; j < k; j++) {
        CHECK_INTERNAL(idx[j] >= 0 && idx[j] < s->n, "row index %d outside [0, %d)", idx[j], s->n);
        pos[j] = s->pos[idx[j]];
        id[j] = s->row_id[idx[j]];
    }
    free(s->pos);
    free(s->row_id);
    s->pos = pos;
    s->row_id = id;
    s->n = k;
}

void fwd_attn_probs(fwd_state *s, int l, const void *q, int nq, int m, float *probs) {
    backend *bk = s->m->bk;
    const model_config *c = &s->m->cfg;
    CHECK_INTERNAL(nq >= 1 && nq <= s->n && m >= 0 && m <= s->kv->layers[l].len,
                   "attention probabilities of %d rows over %d entries", nq, m);
    size_t off = (size_t)(s->n - nq) * c->n_head * c->head_dim * bk->elem_bytes;
    bk->attn_probs(bk, probs, (const char *)q + off, s->pos + s->n - nq, nq, c->n_head,
                   &s->kv->layers[l], m);
}

void fwd_kv_keep(fwd_state *s, int l, const int *idx, int k, int new_cap) {
    kv_layer *L = &s->kv->layers[l];
    CHECK_INTERNAL(k >= 0 && k <= L->len && new_cap >= k, "keep %d of %d entries, capacity %d", k,
                   L->len, new_cap);
    for (int g = 0; g < L->n_kv_head; g++)
        for (int j = 0; j < k; j++)
            CHECK_INTERNAL(idx[g * k + j] >= 0 && idx[g * k + j] < L->len &&
                               (j == 0 || idx[g * k + j] > idx[g * k + j - 1]),
                           "KV keep indices must be ascending and inside [0, %d)", L->len);
    s->m->bk->kv_keep(s->m->bk, L, idx, k, new_cap);
}

void fwd_kv_from_stream(fwd_state *s, int dst, const fwd_kv_term *terms, int n_terms) {
    backend *bk = s->m->bk;
    const model_config *c = &s->m->cfg;
    int n = s->n, d = c->d_model, kvd = c->n_kv_head * c->head_dim;
    void *h = bk->alloc(bk, (size_t)n * d), *k = bk->alloc(bk, (size_t)n * kvd),
         *v = bk->alloc(bk, (size_t)n * kvd), *t = bk->alloc(bk, (size_t)n * kvd);
    CHECK_INTERNAL(h && k && v && t, "out of memory for K/V of %d rows", n);
    for (int i = 0; i < n_terms; i++) {
        const fwd_kv_term *e = &terms[i];
        bk->rmsnorm(bk, h, s->x, e->norm, n, d, c->rms_eps);
        bk->matmul(bk, i ? t : k, h, e->wk, e->bk, n, d, kvd);   // k (n, kvd)
        if (i) bk->add(bk, k, t, (size_t)n * kvd);
        bk->matmul(bk, i ? t : v, h, e->wv, e->bv, n, d, kvd);   // v (n, kvd)
        if (i) bk->add(bk, v, t, (size_t)n * kvd);
    }
    bk->rope(bk, k, s->pos, n, c->n_kv_head, c->head_dim, c->inv_freq, c->rope);
    bk->kv_append(bk, &s->kv->layers[dst], k, v, s->pos, n);
    void *all[] = {h, k, v, t};
    for (int i = 0; i < 4; i++) bk->free(bk, all[i]);
}

bk_weight *fwd_vector_sum(model *m, const bk_weight *const *ws, int k, int n, float scale) {
    backend *bk = m->bk;
    float *ones = xmalloc((size_t)n * sizeof(float)), *row = xmalloc((size_t)n * sizeof(float));
    double *sum = xcalloc((size_t)n, sizeof(double));
    for (int j = 0; j < n; j++) ones[j] = 1.0f;
    bk_weight *table = bk->weight(bk, bk_f32(ones, 1, (size_t)n));   // takes `ones`
    void *x = bk->alloc(bk, (size_t)n), *y = bk->alloc(bk, (size_t)n);
    CHECK_INTERNAL(x && y, "out of memory");
    int zero = 0;
    bk->embed(bk, x, table, &zero, 1, n);                     // x (1, n) = ones
    for (int i = 0; i < k; i++) {
        bk->rmsnorm(bk, y, x, ws[i], 1, n, 0.0f);             // y = ones / rms(ones) * w = w
        bk->to_host(bk, row, y, (size_t)n);
        for (int j = 0; j < n; j++) sum[j] += row[j];
    }
    for (int j = 0; j < n; j++) row[j] = (float)(scale * sum[j]);
    bk->free(bk, x);
    bk->free(bk, y);
    bk->weight_free(bk, table);
    free(sum);
    return bk->weight(bk, bk_f32(row, 1, (size_t)n));   // takes `row`
}

void fwd_weight_free(model *m, bk_weight *w) { m->bk->weight_free(m->bk, w); }

void fwd_attn_topk(fwd_state *s, int l, const void *q, int m, int lo, int n, int k, int *idx) {
    backend *bk = s->m->bk;
    int heads = s->m->cfg.n_head;
    CHECK_INTERNAL(s->n == 1 && lo >= 0 && n >= 0 && lo + n <= m && m <= s->kv->layers[l].len &&
                       k >= 0 && k <= n, "top-%d of [%d, %d + %d) over %d entries", k, lo, lo, n, m);
    if (k == 0) return;
    if (bk->attn_topk) {
        bk->attn_topk(bk, idx, q, s->pos[0], heads, &s->kv->layers[l], m, lo, n, k);
        return;
    }
    float *probs = xmalloc((size_t)heads * m * sizeof(float));
    fwd_attn_probs(s, l, q, 1, m, probs);   // softmax keeps the scores' order
    for (int h = 0; h < heads; h++) {
        int *out = idx + (size_t)h * k, got = score_topk(probs + (size_t)h * m + lo, n, k, out);
        CHECK_INTERNAL(got == k, "top-%d of %d gave %d", k, n, got);
        for (int i = 0; i < k; i++) out[i] += lo;
    }
    free(probs);
}

void fwd_attn_select(fwd_state *s, int l, const void *q, const int *sel, int n_sel, int n_sub,
                     const phi_completion *comp, void *out) {
    kv_layer *L = &s->kv->layers[l];
    CHECK_INTERNAL(s->n == 1 && n_sel >= 0 && n_sub >= 0 && n_sub <= n_sel,
                   "selected attention of %d rows over %d entries", s->n, n_sel);
    int heads = s->m->cfg.n_head;
    for (long i = 0; i < (long)heads * n_sel; i++)
        CHECK_INTERNAL(sel[i] >= 0 && sel[i] < L->len, "selected entry %d outside [0, %d)", sel[i],
                       L->len);
    s->m->bk->attn_select(s->m->bk, out, q, heads, L, sel, n_sel, n_sub, comp);
}

void fwd_phi_summarize(model *m, kv_cache *kv, int l, const phi_maps *p, int lo, int hi,
                       phi_summary *out) {
    kv_layer *L = &kv->layers[l];
    CHECK_INTERNAL(lo >= 0 && lo <= hi && hi <= L->len, "summary of [%d, %d) of %d", lo, hi, L->len);
    for (int g = 0; g < L->n_kv_head; g++)
        CHECK_INTERNAL(out[g].n == 0, "phi summary %d is not fresh (%d entries)", g, out[g].n);
    m->bk->phi_summarize(m->bk, out, p, l, L, lo, hi);
}

static void *kv_mem_alloc(void *ctx, size_t n) {
    backend *bk = ctx;
    return bk->alloc(bk, n);
}

static void kv_mem_free(void *ctx, void *p) {
    backend *bk = ctx;
    bk->free(bk, p);
}

kv_cache *fwd_kv_create(model *m, const int *caps, char *err, size_t errlen) {
    const model_config *c = &m->cfg;
    size_t need = kv_bytes_for(c->n_layer, c->n_kv_head, c->head_dim, caps, m->bk->elem_bytes);
    size_t avail = m->bk->mem_available ? m->bk->mem_available(m->bk) : 0;
    if (avail > 0 && need > avail) {
        long most = 0;
        for (int l = 0; l < c->n_layer; l++) most = caps[l] > most ? caps[l] : most;
        snprintf(err, errlen, "the KV cache for %ld tokens needs %.2f GiB but only %.2f GiB of %s "
                 "memory is available (lower -c or -n)", most, need / 1073741824.0,
                 avail / 1073741824.0, m->bk->name);
        return NULL;
    }
    return kv_create(c->n_layer, c->n_kv_head, c->head_dim, caps, m->bk->elem_bytes, kv_mem_alloc,
                     kv_mem_free, m->bk, err, errlen);
}
