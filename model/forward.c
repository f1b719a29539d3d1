// model/forward.c — the shared forward pass (see forward.h), in llama2.c's shape: fwd_forward
// reads embed -> per layer: norm, q/k/v, RoPE, cache, attention, output, norm, MLP -> norm, LM
// head. Around it, the batch (several sequences' rows packed in one pass, each with its own
// cache and positions) and the strategy hooks, asked per sequence, in small helpers; the run
// state it works in (model/pass.h), planned once per run context. Below the pass: the mechanisms the
// hooks call (fwd_keep_rows, fwd_attn_probs, fwd_kv_keep, fwd_kv_from_stream, ...).
#include "pass.h"
#include "../attn/pages.h"
#include "../attn/phi.h"
#include "../attn/score.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../util/check.h"

static void run_state_free(backend *bk, fwd_run_state *r) {
    void *dev[] = {r->x, r->xb, r->q, r->k, r->v, r->att, r->hb, r->hb2, r->out};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) bk->free(bk, dev[i]);
    free(r->host), free(r->tok), free(r->pos), free(r->pos2);
    *r = (fwd_run_state){0};
}

fwd_run_state *fwd_plan(context *cx, int rows, int out_rows) {
    fwd_run_state *r = cx->run ? cx->run : (cx->run = xcalloc(1, sizeof *r));
    if (rows <= r->rows && out_rows <= r->out_rows) return r;
    const model *m = cx->m;
    backend *bk = m->bk;
    const model_config *c = &m->cfg;
    size_t n = rows > r->rows ? rows : r->rows, o = out_rows > r->out_rows ? out_rows : r->out_rows;
    size_t qd = (size_t)c->n_head * c->head_dim, kvd = (size_t)c->n_kv_head * c->head_dim;
    size_t wide = (size_t)c->d_model > qd ? (size_t)c->d_model : qd, f = c->d_ff;
    run_state_free(bk, r);
    void **dev[] = {&r->x, &r->xb, &r->q, &r->k, &r->v, &r->att, &r->hb, &r->hb2, &r->out};
    size_t len[] = {n * wide, n * wide, n * qd, n * kvd, n * kvd, n * qd, n * f, n * f, o * c->vocab};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        CHECK_INTERNAL(*dev[i] = bk->alloc(bk, len[i]),
                       "out of memory for the activations of %zu rows (try a shorter prompt)", n);
    r->host = xmalloc(o * c->vocab * sizeof(float));
    r->tok = xmalloc(n * sizeof(int)), r->pos = xmalloc(n * sizeof(int)), r->pos2 = xmalloc(n * sizeof(int));
    r->rows = (int)n, r->out_rows = (int)o;
    return r;
}

static void *row_ptr(const backend *bk, const void *p, long row, long width) {
    return (char *)p + (size_t)row * width * bk->elem_bytes;
}

void fwd_pass_begin(fwd_pass *p, context *cx, fwd_seq *seqs, int B) {
    CHECK_INTERNAL(B >= 1 && B <= FWD_MAX_BATCH, "a pass of %d sequences (1 .. %d)", B, FWD_MAX_BATCH);
    fwd_run_state *r = cx->run;
    model *m = cx->m;
    int n = 0;
    p->cx = cx, p->m = m, p->r = r, p->seqs = seqs, p->B = B, p->progress = 0;
    for (int b = 0; b < B; b++) {
        p->off[b] = n, p->hooks[b] = seqs[b].hooks;
        memcpy(r->tok + n, seqs[b].tokens, (size_t)seqs[b].n * sizeof(int));
        memcpy(r->pos + n, seqs[b].pos, (size_t)seqs[b].n * sizeof(int));
        p->views[b] = (fwd_state){.cx = cx, .m = m, .kv = seqs[b].kv, .n = seqs[b].n, .pos = r->pos + n,
                                  .x = row_ptr(m->bk, r->x, n, m->cfg.d_model), .r = r};
        n += seqs[b].n;
    }
    p->all = (fwd_state){.cx = cx, .m = m, .kv = seqs[0].kv, .n = n, .pos = r->pos, .x = r->x, .r = r};
    for (int b = 0; b < B; b++) p->view[b] = B > 1 ? &p->views[b] : &p->all;
}

// xb (n, d) -> q (n, qd) and, unless a hook feeds layer l's K/V, k, v (n, kvd). Each sequence's
// hook says where its K/V come from and which query projection it takes (kv_source): one
// product over the pass when every sequence takes the same, else one per sequence.
static void qkv(fwd_pass *p, int l) {
    backend *bk = p->m->bk;
    const model_config *c = &p->m->cfg;
    const layer_weights *w = &p->m->layers[l];
    fwd_run_state *r = p->r;
    int d = c->d_model, qd = c->n_head * c->head_dim, kvd = c->n_kv_head * c->head_dim, same = 1;
    for (int b = 0; b < p->B; b++) {
        const fwd_hooks *h = p->hooks[b];
        p->src[b] = l, p->wq[b] = w->wq, p->bq[b] = w->bq;
        p->fed[b] = h && h->kv_source && h->kv_source(h->ctx, l, &p->src[b], &p->wq[b], &p->bq[b]);
        CHECK_INTERNAL(p->wq[b] && (p->fed[b] || w->wk), "layer %d has no q/k/v projections", l);
        same &= p->fed[b] == p->fed[0] && p->wq[b] == p->wq[0] && p->bq[b] == p->bq[0];
    }
    for (int b = 0; b < (same ? 1 : p->B); b++) {
        int r0 = same ? 0 : p->off[b], n = same ? p->all.n : p->view[b]->n;
        void *out[] = {row_ptr(bk, r->q, r0, qd), row_ptr(bk, r->k, r0, kvd), row_ptr(bk, r->v, r0, kvd)};
        const bk_weight *wt[] = {p->wq[b], w->wk, w->wv}, *bias[] = {p->bq[b], w->bk, w->bv};
        bk->matmul_multi(bk, p->fed[b] ? 1 : 3, out, row_ptr(bk, r->xb, r0, d), wt, bias, n, d,
                         (const int[]){qd, kvd, kvd});
    }
}

// Per sequence: its K/V into its own cache (unless a hook fed the layer's), then att (n, qd) =
// its queries' attention over the cache layer it reads: its hook's own, else the backend's (the
// sequences without one in one call).
static int attend(fwd_pass *p, int l) {
    backend *bk = p->m->bk;
    const model_config *c = &p->m->cfg;
    fwd_run_state *r = p->r;
    int qd = c->n_head * c->head_dim, kvd = c->n_kv_head * c->head_dim, k = 0, rows[FWD_MAX_BATCH];
    void *out[FWD_MAX_BATCH];
    const void *q[FWD_MAX_BATCH];
    const int *pos[FWD_MAX_BATCH];
    const kv_layer *L[FWD_MAX_BATCH];
    for (int b = 0; b < p->B; b++) {
        fwd_state *v = p->view[b];
        const fwd_hooks *h = p->hooks[b];
        void *qb = row_ptr(bk, r->q, p->off[b], qd), *att = row_ptr(bk, r->att, p->off[b], qd);
        if (!p->fed[b])
            bk->kv_append(bk, &v->kv->layers[l], row_ptr(bk, r->k, p->off[b], kvd),
                          row_ptr(bk, r->v, p->off[b], kvd), v->pos, v->n);
        if (h && h->attention) {
            if (h->attention(h->ctx, v, p->src[b], qb, att) != 0) return -1;
        } else
            out[k] = att, q[k] = qb, pos[k] = v->pos, rows[k] = v->n, L[k++] = &v->kv->layers[p->src[b]];
    }
    if (k == 1) bk->attention(bk, out[0], q[0], pos[0], rows[0], c->n_head, L[0]);
    else if (k > 1) bk->attention_multi(bk, k, out, q, pos, rows, c->n_head, L);
    return 0;
}

// Per sequence, its hook after layer l's attention (block 0) or block (block 1). A pass of
// several sequences keeps its rows: no hook of it may drop one or stop early. 0, FWD_STOP, -1.
static int hooks_after(fwd_pass *p, int l, int block) {
    backend *bk = p->m->bk;
    const model_config *c = &p->m->cfg;
    int rc = 0;
    for (int b = 0; b < p->B && rc == 0; b++) {
        const fwd_hooks *h = p->hooks[b];
        fwd_state *v = p->view[b];
        int n = v->n;
        int (*aa)(void *, fwd_state *, int, const void *) = h && !block ? h->after_attention : NULL;
        int (*al)(void *, fwd_state *, int) = h && block ? h->after_layer : NULL;
        if (!aa && !al) continue;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        rc = aa ? aa(h->ctx, v, l, row_ptr(bk, p->r->q, p->off[b], c->n_head * c->head_dim))
                : al(h->ctx, v, l);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        p->cx->hook_ms += (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
        CHECK_INTERNAL((p->B == 1 || (rc != FWD_STOP && v->x == row_ptr(bk, p->all.x, p->off[b], c->d_model))) &&
                           (block || v->n == n), "a hook dropped rows inside a batched pass or attention");
    }
    return rc < 0 || (!block && rc) ? -1 : rc;
}

// The rows whose logits are wanted (each sequence's last that asks, or every row with all_rows)
// through the final norm and LM head: r->out (k, vocab). Returns k.
static int head(fwd_pass *p, int all_rows) {
    model *m = p->m;
    backend *bk = m->bk;
    const model_config *c = &m->cfg;
    fwd_run_state *r = p->r;
    int last[FWD_MAX_BATCH], k = 0, tail = 1;
    for (int b = 0; b < p->B && !all_rows; b++)
        if (p->seqs[b].logits) last[k] = p->off[b] + p->view[b]->n - 1, tail &= last[k] == last[0] + k, k++;
    if (all_rows) k = p->all.n, last[0] = 0;
    if (k == 0 || p->all.n == 0) return 0;
    // contiguous rows are read in place, others gathered (and normed into the spent stream)
    const void *x = row_ptr(bk, p->all.x, last[0], c->d_model);
    void *h = tail ? r->xb : p->all.x;
    if (!tail) bk->gather_rows(bk, r->xb, p->all.x, last, k, c->d_model), x = r->xb;
    bk->rmsnorm(bk, h, x, m->out_norm, k, c->d_model, c->rms_eps);
    bk->matmul(bk, r->out, h, m->lm_head, NULL, k, c->d_model, c->vocab);
    return k;
}

static unsigned long long backend_allocs(backend *bk) {
    bk_counters k = {0};
    if (bk->counters) bk->counters(bk, &k);
    return k.allocs;
}

static int forward_layers(fwd_pass *p, int all_rows);

int fwd_forward(fwd_pass *p, int all_rows) {
    unsigned long long a0 = backend_allocs(p->m->bk);
    int rc = forward_layers(p, all_rows);
    p->cx->pass_allocs += backend_allocs(p->m->bk) - a0;
    return rc;
}

static int forward_layers(fwd_pass *p, int all_rows) {
    model *m = p->m;
    backend *bk = m->bk;
    const model_config *c = &m->cfg;
    fwd_state *st = &p->all;
    fwd_run_state *r = p->r;
    int d = c->d_model, f = c->d_ff, hd = c->head_dim, qd = c->n_head * hd, rc = 0;
    float eps = c->rms_eps;

    bk->embed(bk, st->x, m->tok_embd, r->tok, st->n, d);   // x (n, d)
    bk->rows_as = p->cx->rows_as;   // the layers' products (not the head's): backend.h
    for (int l = 0; l < c->n_layer && st->n > 0 && rc == 0; l++) {
        const layer_weights *w = &m->layers[l];
        int n = st->n;
        // attention: x += Wo . attention(RoPE(q), cache l += (RoPE(k), v)), q k v = W . rmsnorm(x)
        bk->rmsnorm(bk, r->xb, st->x, w->attn_norm, n, d, eps);
        qkv(p, l);
        bk->rope(bk, r->q, st->pos, n, c->n_head, hd, c->inv_freq, c->rope);
        bk->rope(bk, r->k, st->pos, n, c->n_kv_head, hd, c->inv_freq, c->rope);
        if (attend(p, l) != 0 || hooks_after(p, l, 0) != 0) return bk->rows_as = 0, -1;
        bk->matmul(bk, r->xb, r->att, w->wo, NULL, n, qd, d);
        // MLP: x += W_down . (silu(W_gate . h) * (W_up . h)), h = rmsnorm(x)
        if (bk->add_rmsnorm) bk->add_rmsnorm(bk, r->xb, st->x, r->xb, w->ffn_norm, n, d, eps);
        else bk->add(bk, st->x, r->xb, (size_t)n * d), bk->rmsnorm(bk, r->xb, st->x, w->ffn_norm, n, d, eps);
        if (!bk->swiglu_matmul || bk->swiglu_matmul(bk, r->hb, r->xb, w->w_gate, w->w_up, n, d, f)) {
            bk->matmul_multi(bk, 2, (void *const[]){r->hb, r->hb2}, r->xb,
                             (const bk_weight *const[]){w->w_gate, w->w_up},
                             (const bk_weight *const[]){NULL, NULL}, n, d, (const int[]){f, f});
            bk->swiglu(bk, r->hb, r->hb, r->hb2, (size_t)n * f);
        }
        bk->matmul(bk, r->xb, r->hb, w->w_down, NULL, n, f, d);
        bk->add(bk, st->x, r->xb, (size_t)n * d);
        for (int b = 0; b < p->B; b++) p->view[b]->rows_done += p->view[b]->n;
        rc = hooks_after(p, l, 1);   // may drop rows (B = 1) or stop the pass (FWD_STOP)
        if (p->cx->on_layer && p->progress) p->cx->on_layer(p->cx->on_layer_ctx, l, c->n_layer, st->n);
    }
    bk->rows_as = 0;
    if (rc < 0) return -1;
    head(p, all_rows);   // logits (k, vocab) = lm_head . rmsnorm(x[wanted rows])
    return 0;
}

void fwd_logits_to_host(fwd_pass *p, int all_rows) {
    size_t vocab = p->m->cfg.vocab, j = 0, rows = all_rows ? p->all.n : 1, k = 0;   // k sequences
    for (int b = 0; b < p->B; b++) k += p->seqs[b].logits != NULL;
    if (k == 0 || p->all.n == 0) return;
    p->m->bk->to_host(p->m->bk, p->r->host, p->r->out, k * rows * vocab);
    for (int b = 0; b < p->B; b++)
        if (p->seqs[b].logits)
            memcpy(p->seqs[b].logits, p->r->host + j++ * vocab, rows * vocab * sizeof(float));
}

int fwd_device_draw(backend *bk, const void *out, fwd_seq *seqs, int B, int vocab) {
    sample_params p[FWD_MAX_BATCH];
    uint64_t state[FWD_MAX_BATCH];
    int tok[FWD_MAX_BATCH];
    for (int b = 0; b < B; b++) {
        if (!seqs[b].smp) return -1;
        p[b] = seqs[b].smp->p, state[b] = seqs[b].smp->state;
    }
    if (!bk->sample || bk->sample(bk, tok, out, B, vocab, p, state) != 0) return -1;
    for (int b = 0; b < B; b++) seqs[b].token = tok[b], sample_skip(seqs[b].smp);
    return 0;
}

// A K (is_v 0) or V buffer for cap entries of layer y of kv, on the backend (NULL when full).
static void *layer_buf(backend *bk, const kv_cache *kv, const kv_layer *y, int cap, int is_v) {
    size_t bytes = (size_t)y->n_kv_head * cap * (is_v ? y->v_row : y->k_row), e = kv->elem_bytes;
    return bk->alloc(bk, (bytes + e - 1) / e);
}

// The buffers of the entries the pass will keep (hooks->keep_caps), made before it.
static void keep_reserve(context *cx, const fwd_seq *q) {
    fwd_run_state *r = cx->run;
    const kv_cache *kv = q->kv;
    int L = kv->n_layer;
    const int *caps = q->hooks ? q->hooks->keep_caps : NULL;
    r->keep_layers = caps ? L : 0, r->n_spent = 0;
    if (!caps) return;
    backend *bk = cx->m->bk;
    r->keep_k = xcalloc((size_t)L, sizeof(void *)), r->keep_v = xcalloc((size_t)L, sizeof(void *));
    r->keep_cap = xcalloc((size_t)L, sizeof(int));
    r->spent = xcalloc(2 * (size_t)L, sizeof(void *));
    for (int l = 0; l < L; l++) {
        const kv_layer *y = &kv->layers[l];
        if (caps[l] <= 0) continue;
        r->keep_k[l] = layer_buf(bk, kv, y, caps[l], 0), r->keep_v[l] = layer_buf(bk, kv, y, caps[l], 1);
        CHECK_INTERNAL(r->keep_k[l] && r->keep_v[l], "out of memory for the kept KV of layer %d", l);
        r->keep_cap[l] = caps[l];
    }
}

// Frees the buffers the pass's keeps replaced and the reserved ones it did not use.
static void keep_release(context *cx) {
    fwd_run_state *r = cx->run;
    backend *bk = cx->m->bk;
    for (int i = 0; i < r->n_spent; i++) bk->free(bk, r->spent[i]);
    for (int l = 0; l < r->keep_layers; l++) bk->free(bk, r->keep_k[l]), bk->free(bk, r->keep_v[l]);
    free(r->keep_k), free(r->keep_v), free(r->keep_cap), free(r->spent);
    r->keep_k = r->keep_v = r->spent = NULL, r->keep_cap = NULL;
    r->keep_layers = r->n_spent = 0;
}

// The pass over B sequences (B = 1: all_rows may ask for every row's logits).
static int run_pass(context *cx, fwd_seq *seqs, int B, int all_rows) {
    int n = 0;
    for (int b = 0; b < B; b++) n += seqs[b].n;
    fwd_plan(cx, n, all_rows ? n : B);
    if (B == 1) keep_reserve(cx, &seqs[0]);
    fwd_pass p;
    fwd_pass_begin(&p, cx, seqs, B);
    p.progress = n > 1;
    int rc = fwd_forward(&p, all_rows);
    if (B == 1) keep_release(cx);
    if (rc != 0) return -1;
    // sequences with samplers (fwd_decode's eager steps, fwd_run_draw) have their tokens drawn
    // where the logits are: on the backend when every one has one and logits, else on the host
    int all = !all_rows;
    for (int b = 0; b < B; b++) all &= seqs[b].smp && seqs[b].logits;
    if (!all || fwd_device_draw(cx->m->bk, p.r->out, seqs, B, cx->m->cfg.vocab) != 0) {
        fwd_logits_to_host(&p, all_rows);
        for (int b = 0; b < B; b++)
            if (seqs[b].smp && seqs[b].logits) seqs[b].token = sample_next(seqs[b].smp, seqs[b].logits);
    }
    for (int b = 0; b < B; b++) seqs[b].rows_done = p.view[b]->rows_done;
    return 0;
}

long fwd_run(context *cx, kv_cache *kv, const int *tokens, const int *pos, int n,
             const fwd_hooks *hooks, float *logits, int all_rows) {
    fwd_seq one = {kv, tokens, pos, n, hooks, logits, 0, NULL, 0};
    return run_pass(cx, &one, 1, all_rows) < 0 ? -1 : one.rows_done;
}

int fwd_run_batch(context *cx, fwd_seq *seqs, int B) { return run_pass(cx, seqs, B, 0); }

long fwd_run_draw(context *cx, kv_cache *kv, const int *tokens, const int *pos, int n,
                  const fwd_hooks *hooks, float *logits, sampler *smp, int *token) {
    fwd_seq one = {kv, tokens, pos, n, hooks, logits, 0, smp, -1};
    if (run_pass(cx, &one, 1, 0) < 0) return -1;
    *token = one.token;
    return one.rows_done;
}

int fwd_row_class(const model *m, int n) {
    backend *bk = m->bk;
    if (!bk->row_class || n < 1) return -1;
    int cls = bk->row_class(bk, m->lm_head, n);
    for (int l = 0; l < m->cfg.n_layer && cls >= 0; l++) {
        const layer_weights *w = &m->layers[l];
        const bk_weight *ws[] = {w->wq, w->wk, w->wv, w->wo, w->w_gate, w->w_up, w->w_down,
                                 w->wqkv, w->w_gate_up};
        for (size_t i = 0; i < sizeof ws / sizeof *ws && cls >= 0; i++)
            if (ws[i] && bk->row_class(bk, ws[i], n) != cls) cls = -1;
    }
    return cls;
}

void fwd_free(context *cx) {
    fwd_decode_free(cx);
    if (cx->run) run_state_free(cx->m->bk, cx->run);
    free(cx->run);
    cx->run = NULL;
}

void fwd_keep_rows(fwd_state *s, const int *idx, int k) {
    backend *bk = s->m->bk;
    fwd_run_state *r = s->r;
    CHECK_INTERNAL(s->x == r->x && s->pos == r->pos, "rows dropped inside a batched pass");
    for (int j = 0; j < k; j++) {
        CHECK_INTERNAL(idx[j] >= 0 && idx[j] < s->n, "row index %d outside [0, %d)", idx[j], s->n);
        r->pos2[j] = s->pos[idx[j]];
    }
    bk->gather_rows(bk, r->xb, r->x, idx, k, s->m->cfg.d_model);   // into the normed rows' buffer
    void *x = r->x;
    int *pos = r->pos;
    r->x = s->x = r->xb, r->xb = x;
    r->pos = s->pos = r->pos2, r->pos2 = pos;
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

void *fwd_scratch(const model *m, size_t bytes) {
    size_t e = m->bk->elem_bytes;
    void *p = m->bk->alloc(m->bk, (bytes + e - 1) / e);
    CHECK_INTERNAL(p, "out of %s memory for %zu bytes of token scores", m->bk->name, bytes);
    return p;
}

void fwd_scratch_free(const model *m, void *p) { m->bk->free(m->bk, p); }

void fwd_window_scores(fwd_state *s, int l, const void *q, int nq, int m, int c, int kernel,
                       int avg, float *scores) {
    backend *bk = s->m->bk;
    const model_config *cf = &s->m->cfg;
    CHECK_INTERNAL(nq >= 1 && nq <= s->n && m >= 0 && m <= s->kv->layers[l].len && c >= 0 && c <= m,
                   "window scores of %d rows over %d entries (%d candidates)", nq, m, c);
    size_t off = (size_t)(s->n - nq) * cf->n_head * cf->head_dim * bk->elem_bytes;
    bk->window_scores(bk, scores, (const char *)q + off, s->pos + s->n - nq, nq, cf->n_head,
                      &s->kv->layers[l], m, c, kernel, avg);
}

void fwd_score_group_sum(const model *m, float *out, const float *in, int heads, int groups, int c) {
    CHECK_INTERNAL(groups >= 1 && heads % groups == 0, "%d heads in %d groups", heads, groups);
    m->bk->score_group_sum(m->bk, out, in, heads, groups, c);
}

void fwd_score_fold_max(const model *m, float *row_max, float *sum, const float *in, int heads,
                        int c, int last) {
    CHECK_INTERNAL(heads >= 1 && c >= 0, "fold %d heads over %d entries", heads, c);
    m->bk->score_fold_max(m->bk, row_max, sum, in, heads, c, last);
}

void fwd_score_select(const model *m, int *idx, int ld, const float *s, int rows, int c, int k,
                      int tail) {
    CHECK_INTERNAL(k >= 0 && k <= c && tail >= 0 && k + tail <= ld, "select %d of %d (+ %d) into %d",
                   k, c, tail, ld);
    m->bk->score_select(m->bk, idx, ld, s, rows, c, k, tail);
}

void fwd_kv_keep_at(fwd_state *s, int l, const int *idx, int k, int new_cap) {
    backend *bk = s->m->bk;
    fwd_run_state *r = s->r;
    kv_layer *L = &s->kv->layers[l];
    CHECK_INTERNAL(k >= 0 && k <= L->len && new_cap >= k && new_cap <= L->cap,
                   "keep %d of %d entries, capacity %d of %d", k, L->len, new_cap, L->cap);
    void *nk, *nv;
    if (r && l < r->keep_layers && r->keep_cap[l] == new_cap && r->keep_k[l]) {
        nk = r->keep_k[l], nv = r->keep_v[l];
        r->keep_k[l] = r->keep_v[l] = NULL;
    } else {   // not foreseen: made here (a pass that allocates, counted by the backend)
        nk = layer_buf(bk, s->kv, L, new_cap, 0), nv = layer_buf(bk, s->kv, L, new_cap, 1);
        CHECK_INTERNAL(nk && nv, "out of memory keeping %d KV entries of layer %d", k, l);
    }
    void *ok = L->k, *ov = L->v;
    bk->kv_keep_at(bk, L, idx, k, new_cap, nk, nv);
    if (r && r->spent && r->n_spent + 2 <= 2 * r->keep_layers)
        r->spent[r->n_spent++] = ok, r->spent[r->n_spent++] = ov;
    else bk->free(bk, ok), bk->free(bk, ov);
}

void fwd_ints_to_host(const model *m, int *dst, const int *src, size_t n) {
    m->bk->ints_to_host(m->bk, dst, src, n);
}

void fwd_ints_from_host(const model *m, int *dst, const int *src, size_t n) {
    m->bk->ints_from_host(m->bk, dst, src, n);
}

void fwd_floats_to_host(const model *m, float *dst, const float *src, size_t n) {
    _Static_assert(sizeof(float) == sizeof(int), "4-byte words");
    m->bk->ints_to_host(m->bk, (int *)dst, (const int *)src, n);
}

void fwd_floats_from_host(const model *m, float *dst, const float *src, size_t n) {
    m->bk->ints_from_host(m->bk, (int *)dst, (const int *)src, n);
}

void fwd_doubles_to_host(const model *m, double *dst, const double *src, size_t n) {
    _Static_assert(sizeof(double) == 2 * sizeof(int), "8-byte words");
    m->bk->ints_to_host(m->bk, (int *)dst, (const int *)src, 2 * n);
}

void fwd_doubles_from_host(const model *m, double *dst, const double *src, size_t n) {
    m->bk->ints_from_host(m->bk, (int *)dst, (const int *)src, 2 * n);
}

const int *fwd_kv_pos(const model *m, kv_layer *L) {
    if (L->pos_stale) m->bk->kv_pos_sync(m->bk, L);
    CHECK_INTERNAL(!L->pos_stale, "stale KV positions");
    return L->pos;
}

void fwd_kv_pos_sync(const model *m, kv_cache *kv) {
    for (int l = 0; l < kv->n_layer; l++) fwd_kv_pos(m, &kv->layers[l]);
}

void fwd_kv_from_stream(fwd_state *s, int dst, const fwd_kv_term *terms, int n_terms) {
    backend *bk = s->m->bk;
    const model_config *c = &s->m->cfg;
    int n = s->n, d = c->d_model, kvd = c->n_kv_head * c->head_dim;
    // after a layer, the pass's normed rows, k, v and attention output are free
    void *h = s->r->xb, *k = s->r->k, *v = s->r->v, *t = s->r->att;
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
}

bk_weight *fwd_vector_sum(model *m, const bk_weight *const *ws, int k, int n, float scale) {
    float *row = xmalloc((size_t)n * sizeof(float));
    double *sum = xcalloc((size_t)n, sizeof(double));
    for (int i = 0; i < k; i++) {
        m->bk->vector_to_host(m->bk, row, ws[i]);
        for (int j = 0; j < n; j++) sum[j] += row[j];
    }
    for (int j = 0; j < n; j++) row[j] = (float)(scale * sum[j]);
    free(sum);
    return m->bk->weight(m->bk, bk_f32(row, 1, (size_t)n));   // takes `row`
}

void fwd_weight_free(model *m, bk_weight *w) { m->bk->weight_free(m->bk, w); }

void fwd_attn_topk_step(fwd_state *s, int l, const void *q, int sink, int n, int k, int *idx,
                        double *stats, const topk_pages *pg, const phi_completion *comp, void *out) {
    backend *bk = s->m->bk;
    const kv_layer *L = &s->kv->layers[l];
    CHECK_INTERNAL(s->n == 1 && sink >= 0 && n >= 0 && sink + n <= L->len && k >= 0 && k <= n &&
                       bk->attn_topk_step, "top-%d of [%d, %d + %d) over %d entries", k, sink, sink,
                   n, L->len);
    CHECK_INTERNAL(!pg || (pg->n_pages == pages_count(n, pg->size) &&
                           (pg->read >= pg->n_pages || (long)pg->read * pg->size >= (long)k + pg->size)),
                   "%d of %d pages of %d for the top %d of %d", pg ? pg->read : 0, pg ? pg->n_pages : 0,
                   pg ? pg->size : 0, k, n);
    bk->attn_topk_step(bk, out, idx, stats, q, s->pos[0], s->m->cfg.n_head, L, sink, n, k, pg, comp);
}

void fwd_kv_pages_build(model *m, kv_cache *kv, int l, int lo, int n, int size, void *out) {
    const kv_layer *L = &kv->layers[l];
    CHECK_INTERNAL(lo >= 0 && n >= 0 && lo + n <= L->len && size > 0 && m->bk->kv_pages_build,
                   "pages of %d over [%d, %d + %d) of %d", size, lo, lo, n, L->len);
    m->bk->kv_pages_build(m->bk, out, L, lo, n, size);
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

void fwd_phi_summarize(model *m, kv_cache *kv, int l, const phi_maps *p, const float *par_k, int lo,
                       int hi, phi_summary *out, float *dsum) {
    kv_layer *L = &kv->layers[l];
    CHECK_INTERNAL(lo >= 0 && lo <= hi && hi <= L->len, "summary of [%d, %d) of %d", lo, hi, L->len);
    for (int g = 0; g < L->n_kv_head; g++)
        CHECK_INTERNAL(out[g].n == 0, "phi summary %d is not fresh (%d entries)", g, out[g].n);
    m->bk->phi_summarize(m->bk, out, dsum, p, par_k, l, L, lo, hi);
}

static void *kv_mem_alloc(void *ctx, size_t n) {
    backend *bk = ctx;
    return bk->alloc(bk, n);
}

static void kv_mem_free(void *ctx, void *p) {
    backend *bk = ctx;
    bk->free(bk, p);
}

void fwd_kv_types(const context *cx, enum kv_type *k, enum kv_type *v) {
    ctx_kv_types(&cx->p, cx->m->bk, k, v);
}

kv_cache *fwd_kv_create(const context *cx, const int *caps, char *err, size_t errlen) {
    const model *m = cx->m;
    const model_config *c = &m->cfg;
    enum kv_type kt, vt;
    fwd_kv_types(cx, &kt, &vt);
    size_t need = kv_bytes_for(c->n_layer, c->n_kv_head, c->head_dim, caps, kt, vt);
    size_t avail = m->bk->mem_available(m->bk);
    if (avail > 0 && need > avail) {
        long most = 0;
        for (int l = 0; l < c->n_layer; l++) most = caps[l] > most ? caps[l] : most;
        snprintf(err, errlen, "the KV cache for %ld tokens (K %s, V %s) needs %.2f GiB but only "
                 "%.2f GiB of %s memory is available (lower -c or -n, or a smaller --cache-type-k/-v)",
                 most, kv_type_name(kt), kv_type_name(vt), need / 1073741824.0,
                 avail / 1073741824.0, m->bk->name);
        return NULL;
    }
    kv_cache *kv = kv_create_typed(c->n_layer, c->n_kv_head, c->head_dim, caps, m->bk->elem_bytes,
                                   kt, vt, kv_mem_alloc, kv_mem_free, m->bk, err, errlen);
    for (int l = 0; kv && m->bk->kv_prepare && l < kv->n_layer; l++) m->bk->kv_prepare(m->bk, &kv->layers[l]);
    return kv;
}

kv_cache *fwd_kv_copy(const context *cx, const kv_cache *a, char *err, size_t errlen) {
    int *caps = xmalloc((size_t)a->n_layer * sizeof(int));
    for (int l = 0; l < a->n_layer; l++) caps[l] = a->layers[l].cap;
    kv_cache *kv = fwd_kv_copy_caps(cx, a, caps, err, errlen);
    free(caps);
    return kv;
}

int fwd_kv_read(const context *cx, kv_cache *kv, int l, int n, void *k, void *v, char *err,
                size_t errlen) {
    backend *bk = cx->m->bk;
    fwd_kv_pos_sync(cx->m, kv);
    const kv_layer *L = &kv->layers[l];
    if (n > L->len) return err_printf(err, errlen, "layer %d holds %d entries, not %d", l, L->len, n) - 1;
    if ((size_t)n * L->k_row % 4 || (size_t)n * L->v_row % 4)
        return err_printf(err, errlen, "%d rows of %zu and %zu bytes are not whole 4-byte words", n,
                          L->k_row, L->v_row) - 1;
    for (int g = 0; g < L->n_kv_head; g++) {
        for (int j = 0; j < n; j++)
            if (L->pos[(size_t)g * L->cap + j] != j)
                return err_printf(err, errlen, "layer %d, KV head %d: entry %d holds position %d (not "
                                  "a plain prefill's)", l, g, j, L->pos[(size_t)g * L->cap + j]) - 1;
        bk->ints_to_host(bk, (int *)((char *)k + (size_t)g * n * L->k_row),
                         (const int *)((const char *)L->k + (size_t)g * L->cap * L->k_row), (size_t)n * L->k_row / 4);
        bk->ints_to_host(bk, (int *)((char *)v + (size_t)g * n * L->v_row),
                         (const int *)((const char *)L->v + (size_t)g * L->cap * L->v_row), (size_t)n * L->v_row / 4);
    }
    return 0;
}

kv_cache *fwd_kv_write(const context *cx, int n, const void *const *k, const void *const *v,
                       char *err, size_t errlen) {
    backend *bk = cx->m->bk;
    int nl = cx->m->cfg.n_layer, *caps = xmalloc((size_t)nl * sizeof(int));
    for (int l = 0; l < nl; l++) caps[l] = n;
    kv_cache *kv = fwd_kv_create(cx, caps, err, errlen);
    free(caps);
    if (!kv) return NULL;
    int *pos = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    for (int j = 0; j < n; j++) pos[j] = j;
    for (int l = 0; l < nl; l++) {
        kv_layer *L = &kv->layers[l];
        if ((size_t)n * L->k_row % 4 || (size_t)n * L->v_row % 4) {
            err_printf(err, errlen, "%d rows of %zu and %zu bytes are not whole 4-byte words", n,
                       L->k_row, L->v_row);
            free(pos);
            kv_free(kv);
            return NULL;
        }
        for (int g = 0; g < L->n_kv_head; g++) {   // rows as stored, then the positions (host)
            bk->ints_from_host(bk, (int *)((char *)L->k + (size_t)g * L->cap * L->k_row),
                               (const int *)((const char *)k[l] + (size_t)g * n * L->k_row), (size_t)n * L->k_row / 4);
            bk->ints_from_host(bk, (int *)((char *)L->v + (size_t)g * L->cap * L->v_row),
                               (const int *)((const char *)v[l] + (size_t)g * n * L->v_row), (size_t)n * L->v_row / 4);
            memcpy(L->pos + (size_t)g * L->cap, pos, (size_t)n * sizeof(int));
        }
        L->len = n;
        if (bk->kv_pos_upload) bk->kv_pos_upload(bk, L);
    }
    free(pos);
    return kv;
}

kv_cache *fwd_kv_copy_caps(const context *cx, const kv_cache *a, const int *caps, char *err,
                           size_t errlen) {
    backend *bk = cx->m->bk;
    fwd_kv_pos_sync(cx->m, (kv_cache *)a);   // the positions are copied from the host's
    for (int l = 0; l < a->n_layer; l++)
        CHECK_INTERNAL(caps[l] >= a->layers[l].len, "a KV copy of %d entries into %d", a->layers[l].len, caps[l]);
    kv_cache *kv = fwd_kv_create(cx, caps, err, errlen);
    if (!kv) return NULL;
    // each layer's K and V, head by head: the first len rows (head_dim elements each) copied on
    // the backend, with the positions they hold
    int *idx = NULL, n_idx = 0;
    for (int l = 0; l < a->n_layer; l++) {
        const kv_layer *x = &a->layers[l];
        kv_layer *y = &kv->layers[l];
        if (x->len > n_idx) {   // the identity 0..len-1, grown to the longest layer so far
            idx = xrealloc(idx, (size_t)x->len * sizeof(int));
            for (int j = n_idx; j < x->len; j++) idx[j] = j;
            n_idx = x->len;
        }
        // rows as stored (a typed row is a whole number of backend elements: kv/kv.h)
        int kd = (int)(x->k_row / a->elem_bytes), vd = (int)(x->v_row / a->elem_bytes);
        for (int g = 0; g < x->n_kv_head; g++) {
            size_t ko = (size_t)g * x->cap * x->k_row, vo = (size_t)g * x->cap * x->v_row;
            size_t yk = (size_t)g * y->cap * y->k_row, yv = (size_t)g * y->cap * y->v_row;
            if (x->len) {
                bk->gather_rows(bk, (char *)y->k + yk, (const char *)x->k + ko, idx, x->len, kd);
                bk->gather_rows(bk, (char *)y->v + yv, (const char *)x->v + vo, idx, x->len, vd);
            }
            memcpy(y->pos + (size_t)g * y->cap, x->pos + (size_t)g * x->cap, (size_t)x->len * sizeof(int));
        }
        y->len = x->len;
        if (bk->kv_pos_upload) bk->kv_pos_upload(bk, y);
    }
    free(idx);
    return kv;
}
