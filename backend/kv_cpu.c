// backend/kv_cpu.c — the CPU backend's KV cache (append, keep) and the glue to the attention
// kernels of attn/: causal attention, probabilities, selected attention with phi completion.
#include "../attn/attn.h"
#include "../attn/pages.h"
#include "../attn/phi.h"
#include "../attn/score.h"
#include "../kv/kv.h"
#include "backend_cpu.h"

// Row j of KV head g of L's keys (values), as stored.
static const char *k_row(const kv_layer *L, int g, size_t j) {
    return (const char *)L->k + ((size_t)g * L->cap + j) * L->k_row;
}
static const char *v_row(const kv_layer *L, int g, size_t j) {
    return (const char *)L->v + ((size_t)g * L->cap + j) * L->v_row;
}

// append k, v (n, n_kv_head, hd) to L at L->len, each row encoded in L's K (V) type
void cpu_kv_append(backend *b, kv_layer *L, const void *k, const void *v, const int *pos, int n) {
    (void)b;
    CHECK_INTERNAL(L->len + n <= L->cap, "KV layer overflow: %d + %d > %d", L->len, n, L->cap);
    int hd = L->head_dim;
    for (int g = 0; g < L->n_kv_head; g++)
        for (int i = 0; i < n; i++) {
            size_t src = ((size_t)i * L->n_kv_head + g) * hd;
            kv_row_encode(L->k_type, (char *)k_row(L, g, L->len + i), (const float *)k + src, hd);
            kv_row_encode(L->v_type, (char *)v_row(L, g, L->len + i), (const float *)v + src, hd);
        }
    kv_note_append(L, pos, n);
}

void cpu_attention(backend *b, void *out, const void *q, const int *qpos, int n, int heads,
                   const kv_layer *L) {
    (void)b;
    attn_causal_cpu(out, q, qpos, n, heads, L->k, L->k_type, L->v, L->v_type, L->pos, L->len,
                    L->cap, L->n_kv_head, L->head_dim);
}

// The sequences spread over the threads (each one's attention then runs on one thread: the
// nested parallel region inside is serial), instead of a parallel region per sequence.
void cpu_attention_multi(backend *b, int k, void *const *out, const void *const *q,
                         const int *const *qpos, const int *n, int heads,
                         const kv_layer *const *L) {
#pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < k; i++) cpu_attention(b, out[i], q[i], qpos[i], n[i], heads, L[i]);
}

void cpu_attn_probs(backend *b, float *probs, const void *q, const int *qpos, int n,
                    int heads, const kv_layer *L, int m) {
    (void)b;
    attn_probs_cpu(probs, q, qpos, n, heads, L->k, L->k_type, L->pos, m, L->cap, L->n_kv_head,
                   L->head_dim);
}

// scores (heads, c): the window rows' probabilities (attn_probs_cpu), summed and pooled
// (score_window_pool)
void cpu_window_scores(backend *b, float *scores, const void *q, const int *qpos, int nq, int heads,
                       const kv_layer *L, int m, int c, int kernel, int avg) {
    float *probs = xmalloc(((size_t)nq * heads * m + 1) * sizeof(float));
    cpu_attn_probs(b, probs, q, qpos, nq, heads, L, m);
    score_window_pool(probs, nq, heads, m, c, kernel, avg, scores);
    free(probs);
}

void cpu_score_group_sum(backend *b, float *out, const float *in, int heads, int groups, int c) {
    (void)b;
    score_group_sum(in, heads, groups, c, out);
}

void cpu_score_fold_max(backend *b, float *row_max, float *sum, const float *in, int heads, int c,
                        int last) {
    (void)b;
    score_fold_max(in, heads, c, row_max, sum, last);
}

void cpu_score_select(backend *b, int *idx, int ld, const float *s, int rows, int c, int k, int tail) {
    (void)b;
    score_select(s, rows, c, k, tail, idx, ld);
}

void cpu_ints_from_host(backend *b, int *dst, const int *src, size_t n) {
    (void)b;
    memcpy(dst, src, n * sizeof(int));
}

void cpu_ints_to_host(backend *b, int *dst, const int *src, size_t n) {
    (void)b;
    memcpy(dst, src, n * sizeof(int));
}

// L keeps per KV head g the entries idx[g*k + j], moved into nk, nv of capacity new_cap (rows
// move as stored: a q8_0 row with its block scales); the old K and V are the caller's
static void keep_into(kv_layer *L, const int *idx, int k, int new_cap, char *nk, char *nv) {
    int nh = L->n_kv_head;
    size_t n = (size_t)nh * (new_cap > 0 ? new_cap : 1);
    int *np = xmalloc(n * sizeof(int));
    for (int g = 0; g < nh; g++)
        for (int j = 0; j < k; j++) {
            size_t dst = (size_t)g * new_cap + j;
            memcpy(nk + dst * L->k_row, k_row(L, g, idx[g * k + j]), L->k_row);
            memcpy(nv + dst * L->v_row, v_row(L, g, idx[g * k + j]), L->v_row);
            np[dst] = L->pos[(size_t)g * L->cap + idx[g * k + j]];
        }
    free(L->pos);
    L->k = nk;
    L->v = nv;
    L->pos = np;
    L->cap = new_cap;
    L->len = k;
}

void cpu_kv_keep_at(backend *b, kv_layer *L, const int *idx, int k, int new_cap, void *nk, void *nv) {
    (void)b;
    keep_into(L, idx, k, new_cap, nk, nv);
}

void cpu_kv_keep(backend *b, kv_layer *L, const int *idx, int k, int new_cap) {
    (void)b;
    size_t n = (size_t)L->n_kv_head * (new_cap > 0 ? new_cap : 1);
    void *ok = L->k, *ov = L->v;
    keep_into(L, idx, k, new_cap, xmalloc(n * L->k_row), xmalloc(n * L->v_row));
    free(ok);
    free(ov);
}

// fp32 views of the rows of KV head g that the group's heads select (sel of heads g*group ..
// +group, n_sel each) in f, a buffer of L->len rows (stride hd) where only those rows are decoded
// (the others are never read), so a step decodes what it reads.
static void decode_selected(float *f, const kv_layer *L, int is_v, int g, const int *sel, int group,
                            int n_sel) {
    int hd = L->head_dim;
    const int *s = sel + (size_t)g * group * n_sel;
    for (int i = 0; i < group * n_sel; i++)
        kv_row_decode(is_v ? L->v_type : L->k_type, f + (size_t)s[i] * hd,
                      is_v ? v_row(L, g, s[i]) : k_row(L, g, s[i]), hd);
}

void cpu_attn_select(backend *b, void *out, const void *q, int heads, const kv_layer *L,
                     const int *sel, int n_sel, int n_sub, const phi_completion *comp) {
    cpu_impl *c = impl(b);
    int hd = L->head_dim, nh = L->n_kv_head, group = heads / nh;
    int typed = L->k_type != KV_F32 || L->v_type != KV_F32;
    // per KV head the fp32 rows the kernels read: the cache itself, or the selected rows decoded
    // into the backend's buffer, kept across steps (its pages stay mapped: a fresh one per step
    // faulted in every page a selected row lands on)
    size_t per = (size_t)(L->len > 0 ? L->len : 1) * hd;
    if (typed && 2 * nh * per > c->sel_cap) {
        free(c->sel_rows);
        c->sel_cap = 2 * nh * per + (2 * nh * per) / 2;
        c->sel_rows = xmalloc(c->sel_cap * sizeof(float));
    }
    const float **kb = xmalloc((size_t)nh * sizeof *kb), **vb = xmalloc((size_t)nh * sizeof *vb);
#pragma omp parallel for if (typed && nh > 1)
    for (int g = 0; g < nh; g++) {
        if (typed) {
            float *fk = c->sel_rows + 2 * g * per, *fv = fk + per;
            decode_selected(fk, L, 0, g, sel, group, n_sel);
            decode_selected(fv, L, 1, g, sel, group, n_sel);
            kb[g] = fk, vb[g] = fv;
        } else {
            kb[g] = (const float *)L->k + (size_t)g * L->cap * hd;
            vb[g] = (const float *)L->v + (size_t)g * L->cap * hd;
        }
    }
    if (comp && comp->maps) {   // log phi_k of the retrieved keys, once per key per request
#pragma omp parallel for if (nh > 1)
        for (int g = 0; g < nh; g++)
            if (comp->sum[g].n > n_sub)
                for (int h = g * group; h < (g + 1) * group; h++)
                    phi_summary_memo(&comp->sum[g], comp->maps, phi_par_k(comp->maps, comp->layer, g),
                                     kb[g], sel + (size_t)h * n_sel, n_sub, hd);
    }
#pragma omp parallel for if (heads > 1)
    for (int h = 0; h < heads; h++) {
        int g = h / group;
        const phi_maps *p = comp ? comp->maps : NULL;
        phi_attend_head((float *)out + (size_t)h * hd, (const float *)q + (size_t)h * hd, kb[g], vb[g],
                        sel + (size_t)h * n_sel, n_sel, hd, n_sub, p,
                        p ? phi_par_q(p, comp->layer, h) : NULL,
                        p ? phi_par_k(p, comp->layer, g) : NULL, comp ? &comp->sum[g] : NULL);
    }
    free(kb);
    free(vb);
}

// One KV head's selector: idx (group, k) = each query head's top k of the mid region's K rows
// kb (n of them, entry indices from sink), scored against the group's heads q (group, hd) —
// over every row, or (pg) over the rows of the pg->read pages with the largest bounds; the
// bytes it read added to *bytes.
static void select_group(int *idx, const float *q, int group, const char *kb, enum kv_type kt,
                         int sink, int n, int k, const char *bounds, const topk_pages *pg,
                         int hd, double *bytes) {
    size_t krow = kv_row_bytes(kt, hd);
    if (!pg || pg->read >= pg->n_pages) {   // exhaustive: every mid key
        float *s = xmalloc((size_t)group * n * sizeof(float));
        attn_scores_cpu(s, n, q, group, hd, kb, kt, n, hd);
        for (int i = 0; i < group; i++) {
            int *top = idx + (size_t)i * k, got = score_topk(s + (size_t)i * n, n, k, top);
            CHECK_INTERNAL(got == k, "top-%d of %d gave %d", k, n, got);
            for (int j = 0; j < k; j++) top[j] += sink;
        }
        free(s);
        *bytes += (double)n * krow;
        return;
    }
    int P = pg->size, np = pg->n_pages, r = pg->read;
    CHECK_INTERNAL(r >= 1 && (long)r * P >= (long)k + P, "%d pages of %d for the top %d", r, P, k);
    float *ub = xmalloc((size_t)np * sizeof(float));
    int *pages = xmalloc((size_t)r * sizeof(int));
    attn_page_bounds_cpu(ub, q, group, hd, bounds, pg->type, np, hd);
    score_topk(ub, np, r, pages);   // ascending, so the candidates below are too
    int *cand = xmalloc((size_t)r * P * sizeof(int)), nc = 0;   // the pages' entries, ascending
    for (int i = 0; i < r; i++)
        for (int j = pages[i] * P; j < (pages[i] + 1) * P && j < n; j++) cand[nc++] = j;
    float *s = xmalloc((size_t)group * nc * sizeof(float));
    for (int i = 0, off = 0; i < r; i++) {   // (the last page may be partial)
        int j0 = pages[i] * P, m = j0 + P <= n ? P : n - j0;
        attn_scores_cpu(s + off, nc, q, group, hd, kb + (size_t)j0 * krow, kt, m, hd);
        off += m;
    }
    for (int i = 0; i < group; i++) {
        int *top = idx + (size_t)i * k, got = score_topk(s + (size_t)i * nc, nc, k, top);
        CHECK_INTERNAL(got == k, "top-%d of %d candidates gave %d", k, nc, got);
        for (int j = 0; j < k; j++) top[j] = sink + cand[top[j]];
    }
    *bytes += (double)nc * krow + (double)np * 2 * kv_row_bytes(pg->type, hd);
    free(s);
    free(cand);
    free(pages);
    free(ub);
}

// topk's step (backend.h attn_topk_step): per KV head the selector (select_group: the mid
// region's K rows read once for the group's query heads, or the bounds and the best pages'
// rows), each head's top k (score_topk), then attention over the selection and the anchors as
// attn_select computes it.
void cpu_attn_topk_step(backend *b, void *out, int *idx, double *stats, const void *q, int qpos,
                        int heads, const kv_layer *L, int sink, int n, int k, const topk_pages *pg,
                        const phi_completion *comp) {
    (void)qpos;
    int hd = L->head_dim, nh = L->n_kv_head, group = heads / nh, len = L->len;
    CHECK_INTERNAL(sink >= 0 && n >= 0 && k >= 0 && k <= n && sink + n <= len,
                   "top-%d of [%d, %d + %d) over %d entries", k, sink, sink, n, len);
    CHECK_INTERNAL(!pg || pg->n_pages == pages_count(n, pg->size), "%d pages of %d over %d entries",
                   pg ? pg->n_pages : 0, pg ? pg->size : 0, n);
    double sel_bytes = 0;
    if (k > 0) {
        size_t per = pg ? (size_t)pg->n_pages * 2 * kv_row_bytes(pg->type, hd) : 0;
#pragma omp parallel for if (nh > 1) reduction(+ : sel_bytes)
        for (int g = 0; g < nh; g++)
            select_group(idx + (size_t)g * group * k, (const float *)q + (size_t)g * group * hd,
                         group, (const char *)k_row(L, g, sink), L->k_type, sink, n, k,
                         pg ? (const char *)pg->bounds + g * per : NULL, pg, hd, &sel_bytes);
    }
    if (!out) {
        if (stats) stats[3] += sel_bytes;
        return;
    }
    int tail = len - sink - n, n_sel = k + sink + tail;   // K(q), the sink, the tail and decode's
    int *sel = xmalloc(((size_t)heads * n_sel + 1) * sizeof(int));
    for (int h = 0; h < heads; h++) {
        int *e = sel + (size_t)h * n_sel, j = k;
        memcpy(e, idx + (size_t)h * k, (size_t)k * sizeof(int));
        for (int i = 0; i < sink; i++) e[j++] = i;
        for (int i = sink + n; i < len; i++) e[j++] = i;
    }
    cpu_attn_select(b, out, q, heads, L, sel, n_sel, k, comp);
    free(sel);
    double read = 0;
    for (int g = 0; g < nh; g++) read += score_union_count(idx + (size_t)g * group * k, group, k) + sink + tail;
    stats[0] += read, stats[1] += (double)len * nh, stats[2] += 1, stats[3] += sel_bytes;
}

void cpu_kv_pages_build(backend *b, void *out, const kv_layer *L, int lo, int n, int size) {
    (void)b;
    size_t per = pages_bytes(L->k_type, n, size, L->head_dim);
#pragma omp parallel for if (L->n_kv_head > 1)
    for (int g = 0; g < L->n_kv_head; g++)
        pages_build_cpu((char *)out + g * per, k_row(L, g, lo), L->k_type, n, size, L->head_dim);
}

// Summaries read K and V of [lo, hi) once each: typed rows are decoded into fp32 first; out is
// what decode reads, dsum its copy in the flat layout (gpu_check compares it with the GPU's).
void cpu_phi_summarize(backend *b, phi_summary *out, float *dsum, const phi_maps *p,
                       const float *par_k, int layer, const kv_layer *L, int lo, int hi) {
    (void)b, (void)par_k;
    int hd = L->head_dim, n = hi - lo;
    int typed = L->k_type != KV_F32 || L->v_type != KV_F32;
#pragma omp parallel for
    for (int g = 0; g < L->n_kv_head; g++) {
        float *kf = NULL, *vf = NULL;
        if (typed && n > 0) {
            kf = xmalloc((size_t)n * hd * sizeof(float));
            vf = xmalloc((size_t)n * hd * sizeof(float));
            kv_rows_decode(L->k_type, kf, k_row(L, g, lo), n, hd);
            kv_rows_decode(L->v_type, vf, v_row(L, g, lo), n, hd);
        }
        phi_summary_build(&out[g], p, phi_par_k(p, layer, g),
                          kf ? kf : (const float *)k_row(L, g, lo),
                          vf ? vf : (const float *)v_row(L, g, lo), n, hd, hd);
        free(kf);
        free(vf);
    }
    int nh = L->n_kv_head, f = p->d_phi;
    for (int g = 0; dsum && g < nh; g++) {
        memcpy(dsum + (size_t)g * f, out[g].m, (size_t)f * sizeof(float));
        memcpy(dsum + (size_t)(nh + g) * f, out[g].u, (size_t)f * sizeof(float));
        memcpy(dsum + (size_t)2 * nh * f + (size_t)g * f * hd, out[g].t, (size_t)f * hd * sizeof(float));
    }
}
