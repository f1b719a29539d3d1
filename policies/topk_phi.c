// policies/topk_phi.c — `topk+phi` and `topk` (specs/topk-phi.md): a decode-time method. Prefill
// is full attention; at its end each layer summarises, per KV head, the mid region
// M = [sink, N - tail) under the key feature maps phi_k (m, u~, T~). Each decode step, per query
// head: exhaustive scores over M, the top K of them read exactly together with the anchors
// (first `sink`, last `tail` prompt tokens) and every decode token; the rest of M is estimated
// from the summary minus the retrieved tokens, merged by one normalisation (attn/phi.h).
// `topk` is the same selection renormalised without completion; --topk 0 is sink + tail only.
// Maps: --phi FILE (fitted by `sift fit-phi`) or positive random features (training-free).
// The selector (beyond the paper, which leaves its cost out of the budget): `exact` scores every
// mid key; `pages` (Quest's bounds, attn/pages.h) keeps per page of P mid keys their element-wise
// min and max, built here at attach (over whatever entries a prefill strategy kept), reads the
// bounds each step and scores exactly only the keys of the pages with the largest bounds.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../attn/pages.h"
#include "../attn/phi.h"
#include "../util/check.h"
#include "policy.h"
#include "topk_phi.h"

#define PRF_SEED 0x5EEDull

// Index sets, per cache layer, over the prompt entries some prefill left there (per KV head the
// same count, maybe different tokens): anchors A = the first `sink` entries and the last `tail`,
// mid M = the rest; entries from np on are decode tokens.
typedef struct {
    int np, n_mid, k;              // prompt entries, mid entries [sink, sink + n_mid), retrieved
    int sink, tail;
    topk_pages pg;                 // --selector pages: the mid region's bounds (backend memory)
                                   // and the pages a step reads; pg.bounds NULL: exact
} topk_layer;

typedef struct {
    const model *m;
    int n_layer, n_kv_head, head_dim;
    double entry_bytes;            // one cached entry's K and V rows, as stored
    topk_layer *ly;                // (n_layer,)
    const phi_maps *maps;          // NULL: selection only (`topk`)
    phi_maps *own_maps;            // maps when freed with the state, else NULL
    phi_summary *sum;              // (n_layer, n_kv_head) over each layer's mid region
    // Backend memory (topk+phi): the maps' q and k parameters, and every layer's summaries
    // (phi_summary_flat floats a layer), which a GPU's decode reads instead of sum.
    float *dpar_q, *dpar_k, *dsum;
    int own_dpar;                  // dpar_q, dpar_k freed with the state (else the model's)
    size_t flat;
    int *sel, *mark;               // scratch: (heads, n_sel) selections then (heads, k) top K,
                                   // (len,) union stamps
    int cap, stamp;
    // Backend memory: the top K of the step's layer (heads, max K) and, on the device path,
    // the read counts (read_entries, full_entries, layer_steps) that the steps add to there.
    int *didx;
    double *dstats;
    int device;                    // steps run whole in backend memory (topk without --kept-map)
    double read_entries, full_entries;   // exact entries read / held, summed over steps, layers
    double sel_bytes;              // the selector's reads (K rows scored, bounds), summed
    long layer_steps;
    // --selector-recall: the exact selector's top K of the step's layer (backend memory), both
    // selections on the host, and per layer the recall summed over steps and query heads.
    int *didx_exact, *h_sel, *h_exact;
    float *work_bounds, *work_cand;   // --selector pages: a step's work (topk_pages), backend memory
    int *work_pages;
    double *recall_sum;
    long *recall_n;
    // --kept-map (strategy_run.count_selected): per cache layer and KV head, how often each
    // entry was read exactly (n_layer, n_kv_head, cap_max); steps per cache layer.
    int *counts, cap_max;
    long *steps;
} topk_state;

static void topk_state_free(void *ctx) {
    topk_state *t = ctx;
    if (t->sum)
        for (int i = 0; i < t->n_layer * t->n_kv_head; i++) phi_summary_free(&t->sum[i]);
    free(t->sum);
    phi_maps_free(t->own_maps);
    free(t->sel);
    free(t->mark);
    free(t->counts);
    free(t->steps);
    free(t->h_sel), free(t->h_exact), free(t->recall_sum), free(t->recall_n);
    for (int l = 0; l < t->n_layer; l++)
        if (t->ly[l].pg.bounds) fwd_scratch_free(t->m, (void *)t->ly[l].pg.bounds);
    if (t->didx_exact) fwd_scratch_free(t->m, t->didx_exact);
    if (t->work_bounds)
        fwd_scratch_free(t->m, t->work_bounds), fwd_scratch_free(t->m, t->work_pages),
        fwd_scratch_free(t->m, t->work_cand);
    fwd_scratch_free(t->m, t->didx);
    fwd_scratch_free(t->m, t->dstats);
    if (t->own_dpar) fwd_scratch_free(t->m, t->dpar_q), fwd_scratch_free(t->m, t->dpar_k);
    fwd_scratch_free(t->m, t->dsum);
    free(t->ly);
    free(t);
}

int topk_phi_cache_tokens(const phi_maps *maps) {
    return (int)ceil(maps->d_phi / 2.0 + (double)maps->d_phi / maps->d_in);
}

phi_maps *topk_phi_fallback_maps(const model *m, int d_phi) {
    const model_config *c = &m->cfg;
    return phi_maps_prf(c->n_layer, c->n_head, c->n_kv_head, c->head_dim, d_phi, PRF_SEED);
}

// Maps with their parameters in the model's backend memory (q and k blocks as phi_maps lays
// them out): what topk+phi's decode reads on a device.
typedef struct {
    const model *m;
    phi_maps *maps;
    float *dpar_q, *dpar_k;
} resident_maps;

static resident_maps resident_upload(const model *m, phi_maps *maps) {
    size_t nq = (size_t)maps->n_layer * maps->n_head * phi_n_par(maps);
    size_t nk = (size_t)maps->n_layer * maps->n_kv_head * phi_n_par(maps);
    resident_maps r = {m, maps, fwd_scratch(m, nq * sizeof(float)), fwd_scratch(m, nk * sizeof(float))};
    fwd_floats_from_host(m, r.dpar_q, maps->q, nq);
    fwd_floats_from_host(m, r.dpar_k, maps->k, nk);
    return r;
}

static const char fallback_kind = 0;   // model_derived's tag of the fallback maps

static void fallback_free(void *state) {
    resident_maps *r = state;
    fwd_scratch_free(r->m, r->dpar_q), fwd_scratch_free(r->m, r->dpar_k);
    phi_maps_free(r->maps);
    free(r);
}

// The training-free maps of m (d_phi = head dim), drawn, orthogonalised and uploaded once per
// model and kept with it (model_derived): no prompt builds or stages them again.
static const resident_maps *fallback_for(model *m) {
    resident_maps *r = model_derived_get(m, &fallback_kind);
    if (r) return r;
    r = xmalloc(sizeof *r);
    *r = resident_upload(m, topk_phi_fallback_maps(m, m->cfg.head_dim));
    model_derived_put(m, &fallback_kind, r, fallback_free);
    return r;
}

// Budgets: n = ceil(f N) exact reads; the phi cache costs R_phi token-equivalents, so
// topk+phi retrieves ceil(R_phi) fewer than topk at the same budget. On a short prompt that
// leaves few or no keys (2 % of 2K tokens is 41 reads: sink 4 + tail 16 + the phi cache's 33
// token-equivalents leave K = 0, and decode cannot read a needle at all), so a K derived from
// --budget is never below TOPK_MIN_K (nor the mid region): the floor reads more than the budget,
// and *raised says by how much so that the note can say so. An explicit --topk stands as given.
#define TOPK_MIN_K 16
static int budget_k_of(const strategy_opts *o, int n, int cache_tokens, int *raised) {
    *raised = 0;
    if (o->topk >= 0) return o->topk;
    int total = (int)ceil((double)o->budget * n);
    int k = total - o->sink - o->tail - cache_tokens;
    k = k > 0 ? k : 0;
    int n_mid = n - o->sink - o->tail, floor_k = TOPK_MIN_K < n_mid ? TOPK_MIN_K : n_mid;
    if (k < floor_k) *raised = floor_k - k, k = floor_k;
    return k;
}
static int budget_k(const strategy_opts *o, int n, const phi_maps *maps, int *raised) {
    return budget_k_of(o, n, maps ? topk_phi_cache_tokens(maps) : 0, raised);
}

// GQA: per KV head, entries read exactly this step = the union of its query heads' selections
// (with --kept-map, each prompt entry of the union counted).
static void account(topk_state *t, int kl, int heads, int n_sel, int len) {
    int group = heads / t->n_kv_head;
    for (int g = 0; g < t->n_kv_head; g++) {
        t->stamp++;
        int *count = t->counts ? t->counts + ((size_t)kl * t->n_kv_head + g) * t->cap_max : NULL;
        for (int h = g * group; h < (g + 1) * group; h++)
            for (int j = 0; j < n_sel; j++) {
                int e = t->sel[(size_t)h * n_sel + j];
                if (t->mark[e] == t->stamp) continue;
                t->read_entries++;
                t->mark[e] = t->stamp;
                if (count) count[e]++;
            }
    }
    t->full_entries += (double)len * t->n_kv_head;
    t->layer_steps++;
    if (t->steps) t->steps[kl]++;
}

static long topk_selected(void *ctx, int layer, const kv_layer *kl, long *sel, int n_prompt) {
    topk_state *t = ctx;
    if (!t->counts || layer >= t->n_layer) return 0;
    for (int g = 0; g < t->n_kv_head; g++) {
        const int *count = t->counts + ((size_t)layer * t->n_kv_head + g) * t->cap_max;
        for (int e = 0; e < kl->len; e++) {   // the prompt's entries and decode's
            int pos = kl->pos[(size_t)g * kl->cap + e];
            if (pos >= 0 && pos < n_prompt) sel[pos] += count[e];
        }
    }
    return t->steps[layer] * t->n_kv_head;
}

static void ensure_scratch(topk_state *t, int heads, int len) {
    if (len <= t->cap) return;
    t->cap = len * 2;
    t->sel = xrealloc(t->sel, (size_t)heads * 2 * t->cap * sizeof(int));   // selections + top K
    free(t->mark);
    t->mark = xcalloc((size_t)t->cap, sizeof(int));
    t->stamp = 0;
}

// --selector-recall: the share of the exact selector's top K (didx_exact) the step's own
// selection (didx) holds, per query head; both ascending.
static void recall_count(topk_state *t, int kl, int heads, int k) {
    fwd_ints_to_host(t->m, t->h_sel, t->didx, (size_t)heads * k);
    fwd_ints_to_host(t->m, t->h_exact, t->didx_exact, (size_t)heads * k);
    for (int h = 0; h < heads; h++) {
        const int *a = t->h_sel + (size_t)h * k, *e = t->h_exact + (size_t)h * k;
        int both = 0;
        for (int i = 0, j = 0; i < k && j < k;)
            if (a[i] == e[j]) both++, i++, j++;
            else if (a[i] < e[j]) i++;
            else j++;
        t->recall_sum[kl] += (double)both / k;
    }
    t->recall_n[kl] += heads;
}

// One decode step, query layer l over cache layer kl (its own, or a shared one). A layer
// without mid entries reads every entry exactly. `topk` runs whole in backend memory
// (recordable: the anchors and decode tokens are implicit, the length the device's; topk+phi's
// completion reads the summaries and maps there); --kept-map brings the top K to the host and
// counts there; --selector-recall also runs the exact selector and compares on the host.
static int topk_attention(void *ctx, fwd_state *s, int kl, const void *q, void *out) {
    topk_state *t = ctx;
    const topk_layer *y = &t->ly[kl];
    phi_completion comp = {t->maps, kl, t->sum + (size_t)kl * t->n_kv_head, t->dpar_q, t->dpar_k,
                           t->dsum ? t->dsum + kl * t->flat : NULL};
    const phi_completion *c = t->maps && y->n_mid > 0 ? &comp : NULL;
    const topk_pages *pg = y->pg.bounds ? &y->pg : NULL;
    int heads = s->m->cfg.n_head, recall = t->recall_sum && pg && y->k > 0;
    if (recall)   // the exhaustive top K, to compare with
        fwd_attn_topk_step(s, kl, q, y->sink, y->n_mid, y->k, t->didx_exact, NULL, NULL, NULL, NULL);
    if (t->device) {
        fwd_attn_topk_step(s, kl, q, y->sink, y->n_mid, y->k, t->didx, t->dstats, pg, c, out);
        if (recall) recall_count(t, kl, heads, y->k);
        return 0;
    }
    int len = s->kv->layers[kl].len;
    int n_sel = y->k + y->sink + (len - (y->np - y->tail));
    ensure_scratch(t, heads, len);
    int *top = t->sel + (size_t)heads * n_sel;   // 1-2: scores over M (or its best pages), K(q)
    if (y->k > 0) {
        fwd_attn_topk_step(s, kl, q, y->sink, y->n_mid, y->k, t->didx, t->dstats, pg, NULL, NULL);
        fwd_ints_to_host(s->m, top, t->didx, (size_t)heads * y->k);
        if (recall) recall_count(t, kl, heads, y->k);
    }
    // 3: the exact set E = K(q) U A U decode tokens
    for (int h = 0; h < heads; h++) {
        int *sel = t->sel + (size_t)h * n_sel, j = y->k;
        memcpy(sel, top + (size_t)h * y->k, (size_t)y->k * sizeof(int));
        for (int i = 0; i < y->sink; i++) sel[j++] = i;
        for (int i = y->np - y->tail; i < len; i++) sel[j++] = i;   // tail, then decode tokens
    }
    // 4-6 (topk+phi): the rest of M from its completion cache minus K(q), one normalisation
    fwd_attn_select(s, kl, q, t->sel, n_sel, y->k, c, out);
    account(t, kl, heads, n_sel, len);
    return 0;
}

// The counts in backend memory, read back (after the steps: a copy and a wait): all four on
// the device path; the selector's bytes alone where the host counts the rest (--kept-map).
static void stats_sync(topk_state *t) {
    double st[4];
    fwd_doubles_to_host(t->m, st, t->dstats, 4);
    if (t->device) t->read_entries = st[0], t->full_entries = st[1], t->layer_steps = (long)st[2];
    t->sel_bytes = st[3];
}

static double topk_read_bytes(void *ctx) {   // mean per decode step, all layers
    topk_state *t = ctx;
    stats_sync(t);
    double steps = (double)t->layer_steps / t->n_layer;
    return steps > 0 ? (t->read_entries * t->entry_bytes + t->sel_bytes) / steps : 0;
}

static double topk_recall(void *ctx) {   // mean over layers, steps and query heads
    topk_state *t = ctx;
    double sum = 0;
    long n = 0;
    for (int l = 0; l < t->n_layer; l++) sum += t->recall_sum[l], n += t->recall_n[l];
    return n ? sum / n : -1;
}

static void topk_report(void *ctx, char *buf, size_t len) {
    topk_state *t = ctx;
    stats_sync(t);
    if (t->layer_steps == 0) return;
    double exact = t->read_entries / t->layer_steps * t->entry_bytes / 1024;
    double sel = t->sel_bytes / t->layer_steps / 1024;
    double full = t->full_entries / t->layer_steps * t->entry_bytes / 1024;
    int n = snprintf(buf, len, "decode read %.1f KiB of KV per step per layer (cached %.1f KiB, "
                     "%.1f%%): exactly %.1f KiB, selector %.1f KiB", exact + sel, full,
                     100 * (exact + sel) / full, exact, sel);
    const topk_pages *pg = NULL;
    for (int l = 0; l < t->n_layer && !pg; l++) pg = t->ly[l].pg.bounds ? &t->ly[l].pg : NULL;
    if (n >= 0 && (size_t)n < len)
        n += pg ? snprintf(buf + n, len - n, " (pages: bounds of %d-key pages, then the keys of %d "
                           "of their %d%s)", pg->size, pg->read, pg->n_pages,
                           t->n_layer > 1 ? " in the first paged layer" : "")
                : snprintf(buf + n, len - n, " (exact: every mid key scored)");
    if (t->maps && n >= 0 && (size_t)n < len) {
        size_t memo = 0;   // retrieved keys' features the CPU kept (0 on the GPU)
        for (int i = 0; i < t->n_layer * t->n_kv_head; i++)
            memo += phi_summary_memo_bytes(&t->sum[i], t->maps->d_phi);
        n += snprintf(buf + n, len - n, " + phi cache %.1f KiB/layer once",
                      (double)t->n_kv_head * t->maps->d_phi * (t->head_dim + 2) * 4 / 1024);
        if (memo && n >= 0 && (size_t)n < len)
            n += snprintf(buf + n, len - n, " (+ %.1f KiB/layer of memoised key features)",
                          (double)memo / t->n_layer / 1024);
    }
    double r = t->recall_sum ? topk_recall(t) : -1;
    if (r >= 0 && n >= 0 && (size_t)n < len) {   // the mean, then the lowest layer's
        int worst = -1;
        for (int l = 0; l < t->n_layer; l++)
            if (t->recall_n[l] && (worst < 0 || t->recall_sum[l] / t->recall_n[l] <
                                                    t->recall_sum[worst] / t->recall_n[worst]))
                worst = l;
        snprintf(buf + n, len - n, "; selector recall of the exact top K %.3f (lowest: layer %d, "
                 "%.3f)", r, worst, t->recall_sum[worst] / t->recall_n[worst]);
    }
}

// The feature maps of --phi FILE, shapes checked against m.
static phi_maps *load_maps(const model *m, const strategy_opts *o, char *err, size_t errlen) {
    const model_config *c = &m->cfg;
    phi_maps *p = phi_maps_load(o->phi_path, err, errlen);
    if (p && (p->n_layer != c->n_layer || p->n_head != c->n_head ||
              p->n_kv_head != c->n_kv_head || p->d_in != c->head_dim)) {
        err_printf(err, errlen, "phi file '%s' is for %d layers, %d/%d heads, head dim %d; the "
                   "model has %d layers, %d/%d heads, head dim %d (fit it with sift fit-phi)",
                   o->phi_path, p->n_layer, p->n_head, p->n_kv_head, p->d_in, c->n_layer,
                   c->n_head, c->n_kv_head, c->head_dim);
        phi_maps_free(p);
        return NULL;
    }
    return p;
}

// Decode state over kv, whose entries now are all prompt entries (a full prefill, or whatever a
// prefill strategy kept): per layer the index sets, K (clamped to M) and, with maps, the
// completion cache over M (m, u~, T~: fp32, one pass per layer and KV head). Attached to kv as
// its side data (freed with it, own_maps too). With device, topk's steps count in backend memory.
// maps' parameters in backend memory come with them (res, the model's) or are uploaded here.
// Pages a step reads per KV head (--selector pages): --pages, or enough for max(2048, 8 K)
// keys; never fewer than ceil(K / P) + 1 (so that the pages' entries always hold K), nor more
// than there are (then the step is exact).
static int pages_read(const strategy_opts *o, int k, int n_pages) {
    int P = o->page_size, r = o->pages > 0 ? o->pages : (int)((fmax(2048, 8.0 * k) + P - 1) / P);
    int floor_r = (k + P - 1) / P + 1;
    r = r > floor_r ? r : floor_r;
    return r < n_pages ? r : n_pages;
}

static topk_state *topk_attach(model *m, kv_cache *kv, int sink, int tail, int k,
                               const phi_maps *maps, phi_maps *own_maps, const resident_maps *res,
                               int device, const strategy_opts *sel) {
    const model_config *c = &m->cfg;
    topk_state *t = xcalloc(1, sizeof *t);
    *t = (topk_state){.m = m, .n_layer = kv->n_layer, .n_kv_head = c->n_kv_head, .head_dim = c->head_dim,
                      .entry_bytes = (double)(kv->layers[0].k_row + kv->layers[0].v_row), .maps = maps, .own_maps = own_maps,
                      .ly = xcalloc((size_t)kv->n_layer, sizeof(topk_layer))};
    int kmax = 0;
    for (int l = 0; l < kv->n_layer; l++) {
        topk_layer *y = &t->ly[l];
        y->np = kv->layers[l].len;
        y->sink = sink < y->np ? sink : y->np;
        y->tail = tail < y->np - y->sink ? tail : y->np - y->sink;
        y->n_mid = y->np - y->sink - y->tail;
        y->k = k < y->n_mid ? k : y->n_mid;
        kmax = y->k > kmax ? y->k : kmax;
    }
    size_t nidx = (size_t)c->n_head * (kmax > 0 ? kmax : 1);
    t->didx = fwd_scratch(m, nidx * sizeof(int));
    t->device = device;
    const double zero[4] = {0, 0, 0, 0};
    t->dstats = fwd_scratch(m, sizeof zero);
    fwd_doubles_from_host(m, t->dstats, zero, 4);
    kv->side = t;
    kv->side_free = topk_state_free;
    size_t side = 0;
    int np_max = 0, read_max = 0;
    if (sel && sel->selector == 1)   // the page bounds of each layer's mid region
        for (int l = 0; l < kv->n_layer; l++) {
            topk_layer *y = &t->ly[l];
            if (y->k == 0) continue;   // nothing to select
            enum kv_type bt = pages_bound_type(kv->layers[l].k_type);
            size_t bytes = (size_t)c->n_kv_head * pages_bytes(kv->layers[l].k_type, y->n_mid, sel->page_size,
                                                                c->head_dim);
            int np = pages_count(y->n_mid, sel->page_size);
            void *b = fwd_scratch(m, bytes);
            fwd_kv_pages_build(m, kv, l, y->sink, y->n_mid, sel->page_size, b);
            y->pg = (topk_pages){b, bt, sel->page_size, np, pages_read(sel, y->k, np), NULL, NULL, NULL};
            side += bytes;
            np_max = np > np_max ? np : np_max;
            read_max = y->pg.read > read_max ? y->pg.read : read_max;
        }
    if (np_max > 0) {   // one step's work, shared by the layers (planned here, not in a pass)
        t->work_bounds = fwd_scratch(m, (size_t)c->n_kv_head * np_max * sizeof(float));
        t->work_pages = fwd_scratch(m, (size_t)c->n_kv_head * read_max * sizeof(int));
        t->work_cand = fwd_scratch(m, (size_t)c->n_head * read_max * sel->page_size * sizeof(float));
        for (int l = 0; l < kv->n_layer; l++)
            if (t->ly[l].pg.bounds)
                t->ly[l].pg.work_bounds = t->work_bounds, t->ly[l].pg.work_pages = t->work_pages,
                t->ly[l].pg.work_cand = t->work_cand;
    }
    if (sel && sel->selector_recall && sel->selector == 1) {
        t->didx_exact = fwd_scratch(m, nidx * sizeof(int));
        t->h_sel = xmalloc(nidx * sizeof(int)), t->h_exact = xmalloc(nidx * sizeof(int));
        t->recall_sum = xcalloc((size_t)kv->n_layer, sizeof(double));
        t->recall_n = xcalloc((size_t)kv->n_layer, sizeof(long));
    }
    if (maps) {
        resident_maps r = res ? *res : resident_upload(m, (phi_maps *)maps);
        t->dpar_q = r.dpar_q, t->dpar_k = r.dpar_k, t->own_dpar = !res;
        t->flat = phi_summary_flat(c->n_kv_head, maps->d_phi, c->head_dim);
        t->dsum = fwd_scratch(m, (size_t)kv->n_layer * t->flat * sizeof(float));
        t->sum = xmalloc((size_t)kv->n_layer * c->n_kv_head * sizeof *t->sum);
        for (int i = 0; i < kv->n_layer * c->n_kv_head; i++)
            t->sum[i] = phi_summary_alloc(maps->d_phi, c->head_dim);
        for (int l = 0; l < kv->n_layer; l++)
            if (t->ly[l].n_mid > 0)
                fwd_phi_summarize(m, kv, l, maps, t->dpar_k, t->ly[l].sink, t->ly[l].sink + t->ly[l].n_mid,
                                  t->sum + (size_t)l * c->n_kv_head, t->dsum + l * t->flat);
        side += (size_t)kv->n_layer * c->n_kv_head * maps->d_phi * (c->head_dim + 2) * sizeof(float);
    }
    kv->side_bytes = side;
    return t;
}

fwd_hooks topk_phi_hooks(model *m, kv_cache *kv, int sink, int tail, int k, const phi_maps *maps) {
    topk_state *t = topk_attach(m, kv, sink, tail, k, maps, NULL, NULL, 1, NULL);
    return (fwd_hooks){.ctx = t, .attention = topk_attention, .recordable = t->device};
}

// attach (policy.h) for topk and topk+phi: n is the prompt's length (for --budget).
static int topk_attach_run(context *cx, kv_cache *kv, int n, const strategy_opts *o,
                           const strategy_run *run, prefill_info *info, char *err, size_t errlen,
                           int with_phi) {
    model *m = cx->m;
    if (kv->side)
        return err_printf(err, errlen, "the cache already carries another strategy's decode state");
    const resident_maps *res = with_phi && !o->phi_path ? fallback_for(m) : NULL;
    phi_maps *own = with_phi && o->phi_path ? load_maps(m, o, err, errlen) : NULL;
    const phi_maps *maps = res ? res->maps : own;
    if (with_phi && !maps) return -1;
    int raised, k = budget_k(o, n, maps, &raised);
    topk_state *t = topk_attach(m, kv, o->sink, o->tail, k, maps, own, res, !run->count_selected, o);
    info->decode = (fwd_hooks){.ctx = t, .attention = topk_attention,
                               .recordable = t->device && !t->recall_sum};
    info->decode_report = topk_report;
    info->decode_read_bytes = topk_read_bytes;
    if (t->recall_sum) info->decode_recall = topk_recall;
    if (run->count_selected) {
        for (int l = 0; l < kv->n_layer; l++)
            t->cap_max = kv->layers[l].cap > t->cap_max ? kv->layers[l].cap : t->cap_max;
        t->counts = xcalloc((size_t)kv->n_layer * t->n_kv_head * (t->cap_max ? t->cap_max : 1), sizeof(int));
        t->steps = xcalloc((size_t)kv->n_layer, sizeof(long));
        info->decode_selected = topk_selected;
    }
    // The remark: the regions of the first layer, and the range of mid sizes over layers when a
    // prefill strategy left different ones.
    int lo = 1 << 30, hi = 0, kmax = 0;
    for (int l = 0; l < kv->n_layer; l++) {
        lo = t->ly[l].n_mid < lo ? t->ly[l].n_mid : lo;
        hi = t->ly[l].n_mid > hi ? t->ly[l].n_mid : hi;
        kmax = t->ly[l].k > kmax ? t->ly[l].k : kmax;
    }
    size_t w = strlen(info->note);
    if (w && w + 2 < sizeof info->note) w += (size_t)snprintf(info->note + w, sizeof info->note - w, "; ");
    char mid[48];
    if (lo == hi) snprintf(mid, sizeof mid, "%d", hi);
    else snprintf(mid, sizeof mid, "%d..%d (per layer)", lo, hi);
    w += (size_t)snprintf(info->note + w, sizeof info->note - w, "sink %d + tail %d + top-%d of %s mid "
                          "entries%s", o->sink, o->tail, kmax, mid, !maps ? "" : o->phi_path ?
                          "; phi: fitted maps (--phi)" : "; phi: random features (training-free "
                          "fallback, no --phi)");
    const topk_pages *pg = NULL;
    for (int l = 0; l < kv->n_layer && !pg; l++) pg = t->ly[l].pg.bounds ? &t->ly[l].pg : NULL;
    if (pg && w < sizeof info->note)
        w += (size_t)snprintf(info->note + w, sizeof info->note - w, "; selector pages: %d keys a "
                              "page, %d of %d pages scored exactly%s", pg->size, pg->read, pg->n_pages,
                              pg->read >= pg->n_pages ? " (all: exact)" : "");
    if (raised && w < sizeof info->note)   // the budget left fewer keys than the floor
        w += (size_t)snprintf(info->note + w, sizeof info->note - w, "; K raised by %d to the "
                              "floor %d: --budget %g of %d tokens left %d after sink + tail%s",
                              raised, k, o->budget, n, k - raised,
                              with_phi ? " + the phi cache" : "");
    // The maps see post-RoPE vectors: past the positions of their fit they extrapolate
    // (bench/EVAL.md measures the remainder mass overestimated e^5 at 2x, e^11 at 4x).
    if (maps && maps->n_ctx > 0 && n > maps->n_ctx && w < sizeof info->note)
        w += (size_t)snprintf(info->note + w, sizeof info->note - w, ", fitted on %d tokens: prompt "
                              "of %d is beyond them", maps->n_ctx, n);
    if (maps && o->phi_path && w < sizeof info->note)   // fit-phi's recorded check
        snprintf(info->note + w, sizeof info->note - w, "; %s", maps->verdict[0] ? maps->verdict
                 : "no fit-phi verdict in the file (fitted before the end-to-end check)");
    return 0;
}

static int topk_phi_attach(context *cx, kv_cache *kv, int n, const strategy_opts *o,
                           const strategy_run *run, prefill_info *info, char *err, size_t errlen) {
    return topk_attach_run(cx, kv, n, o, run, info, err, errlen, 1);
}

static int topk_only_attach(context *cx, kv_cache *kv, int n, const strategy_opts *o,
                            const strategy_run *run, prefill_info *info, char *err, size_t errlen) {
    return topk_attach_run(cx, kv, n, o, run, info, err, errlen, 0);
}

// Alone: a full prefill of the prompt but its last token, which is the first query — so the
// first generated token already sees the method. N = n - 1 prefilled tokens define the regions.
static kv_cache *topk_run(context *cx, const int *ids, int n, int n_gen, const strategy_opts *o,
                          const strategy_run *run, float *logits, prefill_info *info, char *err,
                          size_t errlen, int with_phi) {
    if (n - 1 <= o->sink + o->tail) {
        snprintf(info->note, sizeof info->note, "prompt of %d tokens has no mid region (sink %d + "
                 "tail %d + the last token): ran full", n, o->sink, o->tail);
        return prefill_run(cx, ids, n, n_gen, NULL, NULL, logits, info, err, errlen);
    }
    int np = n - 1;
    kv_cache *kv = prefill_run(cx, ids, np, n_gen + 1, NULL, NULL, NULL, info, err, errlen);
    if (!kv) return NULL;
    if (topk_attach_run(cx, kv, n, o, run, info, err, errlen, with_phi) != 0) {
        kv_free(kv);
        return NULL;
    }
    info->rows_done += fwd_run(cx, kv, ids + np, &np, 1, &info->decode, logits, 0);
    return kv;
}

static kv_cache *topk_phi_prefill(context *cx, const int *ids, int n, int n_gen,
                                  const strategy_opts *o, const strategy_run *run, float *logits,
                                  prefill_info *info, char *err, size_t errlen) {
    return topk_run(cx, ids, n, n_gen, o, run, logits, info, err, errlen, 1);
}

static kv_cache *topk_prefill(context *cx, const int *ids, int n, int n_gen, const strategy_opts *o,
                              const strategy_run *run, float *logits, prefill_info *info,
                              char *err, size_t errlen) {
    return topk_run(cx, ids, n, n_gen, o, run, logits, info, err, errlen, 0);
}

static int topk_check(const model *m, const strategy_opts *o, char *err, size_t errlen) {
    if (o->sink < 0 || o->tail < 0) return err_printf(err, errlen, "--sink and --tail must be >= 0");
    if (o->selector_recall && o->selector != 1)
        return err_printf(err, errlen, "--selector-recall on compares --selector pages with the exact "
                          "selector: add --selector pages");
    if (o->selector == 1 && !m->bk->kv_pages_build)
        return err_printf(err, errlen, "--selector pages: the %s backend has no page bounds",
                          m->bk->name);
    return 0;
}

static int topk_phi_check(const model *m, const strategy_opts *o, char *err, size_t errlen) {
    if (topk_check(m, o, err, errlen) != 0) return -1;
    if (!o->phi_path) return 0;   // the fallback maps: built at the first attach
    phi_maps *p = load_maps(m, o, err, errlen);   // validates the file against the model once
    phi_maps_free(p);
    return p ? 0 : -1;
}

// The work of a decode step (the exhaustive selector) over the entries a prefill left, per layer
// and KV head: every mid entry's K row scored; the union of the group's top K (at most group x K
// distinct entries), the anchors and the decode tokens read exactly (K and V); with phi, the
// summary (d_phi x (head_dim + 2) floats) too, and at prefill each mid key's features
// (d_phi x head_dim) folded into it. d_phi: the training-free maps' head_dim.
static void topk_cost_run(const cost_shape *sh, const strategy_opts *o, cost_work *w, int with_phi) {
    const model_config *c = sh->c;
    int L = c->n_layer, hd = c->head_dim, group = c->n_head / c->n_kv_head, raised;
    double e = w->kv_entries / L, mid = fmax(e - o->sink - o->tail, 0), d_phi = hd;
    int k = budget_k_of(o, (int)sh->n, with_phi ? (int)ceil(d_phi / 2 + d_phi / hd) : 0, &raised);
    double exact = fmin(mid, (double)group * k) + fmin(e, (double)o->sink + o->tail) + sh->n_gen / 2.0;
    double scored = mid;   // K rows the selector reads: every mid key, or (pages) the bounds'
    if (o->selector == 1 && k > 0) {   // share (2 rows a page) and the best pages' keys
        int np = pages_count((int)mid, o->page_size);
        scored = fmin(mid, (double)pages_read(o, k, np) * o->page_size) + 2.0 * np;
    }
    w->weight_bytes = sh->weight_bytes;
    w->kv_bytes = (double)L * c->n_kv_head * (scored * sh->k_row + exact * (sh->k_row + sh->v_row));
    if (!with_phi) return;
    w->kv_bytes += (double)L * c->n_kv_head * d_phi * (hd + 2) * 4;
    w->gemm_flops += (double)L * c->n_kv_head * mid * (2 * hd * d_phi + 2 * d_phi * (hd + 2));
}
static void topk_phi_cost(const cost_shape *sh, const strategy_opts *o, cost_work *w) {
    topk_cost_run(sh, o, w, 1);
}
static void topk_only_cost(const cost_shape *sh, const strategy_opts *o, cost_work *w) {
    topk_cost_run(sh, o, w, 0);
}

const strategy strategy_topk_phi = {
    .name = "topk+phi",
    .about = "decode reads sink + tail + top-K KV exactly, the rest from a phi summary (--phi)",
    .prefill = topk_phi_prefill,
    .check = topk_phi_check,
    .phase = PHASE_DECODE,
    .attach = topk_phi_attach,
    .cost_decode = topk_phi_cost,
};

const strategy strategy_topk = {
    .name = "topk",
    .about = "decode reads sink + tail + top-K KV exactly, renormalised (--topk 0: sink + tail)",
    .prefill = topk_prefill,
    .check = topk_check,
    .phase = PHASE_DECODE,
    .attach = topk_only_attach,
    .cost_decode = topk_only_cost,
};
