// backend/kv_cuda.cu — the CUDA backend's KV cache (append, keep, the device mirror of entry
// positions and length) and the glue to the attention kernels of attn/: causal attention, probabilities,
// the top-K selector, and selected attention completed from phi summaries.
#include "backend_cuda.cuh"

// ---- KV cache ---------------------------------------------------------------------------------

void mirror_drop(cuda_impl *c, const void *kbuf) {
    for (int i = 0; i < c->n_mirrors; i++)
        if (c->mirrors[i].kbuf == kbuf) {
            dev_free_after(c->stream, c->mirrors[i].dpos);
            c->mirrors[i] = c->mirrors[--c->n_mirrors];
            c->gen++;   // a recording that appends to this layer is stale
            return;
        }
}

void mirror_free_all(cuda_impl *c) {
    for (int i = 0; i < c->n_mirrors; i++) CUDA_CHECK(cudaFree(c->mirrors[i].dpos));
    free(c->mirrors);
    c->mirrors = NULL, c->n_mirrors = c->cap_mirrors = 0;
}


static pos_mirror *mirror_find(cuda_impl *c, const void *kbuf) {
    for (int i = 0; i < c->n_mirrors; i++)
        if (c->mirrors[i].kbuf == kbuf) return &c->mirrors[i];
    return NULL;
}

// Copies entries [from, from + n) of every KV head's host positions to the device mirror.
static void mirror_upload(cuda_impl *c, int *dpos, const kv_layer *L, int from, int n) {
    if (n <= 0) return;
    size_t pitch = (size_t)L->cap * sizeof(int);
    CUDA_CHECK(cuda_memcpy_2d_async(dpos + from, pitch, L->pos + from, pitch, (size_t)n * sizeof(int),
                                 (size_t)L->n_kv_head, cudaMemcpyHostToDevice, c->stream));
}

// *len = v
__global__ void kv_len_set_kernel(int *len, int v) { *len = v; }

// *len += n, once the append that read it is done (stream order)
__global__ void kv_len_add_kernel(int *len, int n) { *len += n; }

// L's device positions and length, made from the host copy the first time L's K buffer is seen.
static const pos_mirror *mirror_get(cuda_impl *c, const kv_layer *L) {
    pos_mirror *m = mirror_find(c, L->k);
    if (m) return m;
    if (c->n_mirrors == c->cap_mirrors) {
        c->cap_mirrors = c->cap_mirrors ? 2 * c->cap_mirrors : 64;
        c->mirrors = (pos_mirror *)xrealloc(c->mirrors, (size_t)c->cap_mirrors * sizeof *c->mirrors);
    }
    size_t n = (size_t)L->n_kv_head * (L->cap > 0 ? L->cap : 0);
    int *dpos = (int *)dev_alloc(c, (n + 1) * sizeof(int), "KV cache positions");
    m = &c->mirrors[c->n_mirrors++];
    *m = (pos_mirror){L->k, dpos, dpos + n};
    c->gen++;
    mirror_upload(c, dpos, L, 0, L->len);
    CUDA_LAUNCH(kv_len_set_kernel, 1, 1, 0, c->stream, m->dlen, L->len);
    return m;
}

void cuda_kv_prepare(backend *b, const kv_layer *L) { mirror_get(impl(b), L); }

void cuda_kv_pos_upload(backend *b, const kv_layer *L) {
    cuda_impl *c = impl(b);
    const pos_mirror *m = mirror_get(c, L);
    mirror_upload(c, m->dpos, L, 0, L->len);
}

// k, v (n, n_kv_head, hd) -> dk, dv (n_kv_head, cap, hd) and pos (n,) -> dpos (n_kv_head, cap) at
// entries *len .. *len + n (the device length: a recorded step appends where the cache ends at
// replay); V8: a thread per 8 elements (hd % 8 == 0), else one
template <int V>
__global__ void kv_append_kernel(bf16 *dk, bf16 *dv, int *dpos, const bf16 *k, const bf16 *v,
                                 const int *pos, const int *len, int n, int n_kv_head, int hd,
                                 int cap) {
    size_t e = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (e >= (size_t)n * n_kv_head * hd) return;
    size_t i = e / ((size_t)n_kv_head * hd);
    int g = (int)(e / hd % n_kv_head), c = (int)(e % hd), at = *len;
    size_t dst = ((size_t)g * cap + at + i) * hd + c;
    if (V == 8) {
        *(uint4 *)(dk + dst) = *(const uint4 *)(k + e);
        *(uint4 *)(dv + dst) = *(const uint4 *)(v + e);
    } else {
        dk[dst] = k[e];
        dv[dst] = v[e];
    }
    if (c == 0) dpos[(size_t)g * cap + at + i] = pos[i];
}

void cuda_kv_append(backend *b, kv_layer *L, const void *k, const void *v, const int *pos, int n) {
    cuda_impl *c = impl(b);
    CHECK_INTERNAL(L->len + n <= L->cap, "KV layer overflow: %d + %d > %d", L->len, n, L->cap);
    if (n == 0) return;
    const pos_mirror *m = mirror_get(c, L);
    // the host's length is the truth, except in a recording: it replays at the device's (which
    // the host follows, kv_note_append), so a cache the host rewound (L->len lowered) is right
    if (!c->recording) CUDA_LAUNCH(kv_len_set_kernel, 1, 1, 0, c->stream, m->dlen, L->len);
    // the pass's positions, already on the device for RoPE (no upload per layer)
    const int *dp = indices(c, STAGE_IDX, pos, n);
    int hd = L->head_dim, v8 = hd % 8 == 0 && ((uintptr_t)k | (uintptr_t)v | (uintptr_t)L->k |
                                               (uintptr_t)L->v) % 16 == 0;
    size_t total = (size_t)n * L->n_kv_head * hd;
    if (v8)
        CUDA_LAUNCH(kv_append_kernel<8>, cuda_blocks(total / 8, THREADS), THREADS, 0, c->stream,
                    (bf16 *)L->k, (bf16 *)L->v, m->dpos, (const bf16 *)k, (const bf16 *)v, dp,
                    m->dlen, n, L->n_kv_head, hd, L->cap);
    else
        CUDA_LAUNCH(kv_append_kernel<1>, cuda_blocks(total, THREADS), THREADS, 0, c->stream,
                    (bf16 *)L->k, (bf16 *)L->v, m->dpos, (const bf16 *)k, (const bf16 *)v, dp,
                    m->dlen, n, L->n_kv_head, hd, L->cap);
    CUDA_LAUNCH(kv_len_add_kernel, 1, 1, 0, c->stream, m->dlen, n);
    kv_note_append(L, pos, n);
}

// K/V (n_kv_head, cap, hd) -> nk/nv (n_kv_head, new_cap, hd): entry j of head g = idx[g*k + j]
__global__ void kv_keep_kernel(bf16 *nk, bf16 *nv, const bf16 *k, const bf16 *v, const int *idx,
                               int n_kv_head, int keep, int hd, int cap, int new_cap) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)n_kv_head * keep * hd) return;
    int g = (int)(e / ((size_t)keep * hd)), j = (int)(e / hd % keep), c = (int)(e % hd);
    size_t src = ((size_t)g * cap + idx[(size_t)g * keep + j]) * hd + c;
    size_t dst = ((size_t)g * new_cap + j) * hd + c;
    nk[dst] = k[src];
    nv[dst] = v[src];
}

void cuda_kv_keep(backend *b, kv_layer *L, const int *idx, int k, int new_cap) {
    cuda_impl *c = impl(b);
    int hd = L->head_dim, nh = L->n_kv_head;
    if (L->pos_stale) cuda_kv_pos_sync(b, L);   // the kept positions come from the host's
    size_t n = (size_t)nh * (new_cap > 0 ? new_cap : 1);
    bf16 *nk = (bf16 *)cuda_alloc(b, n * hd), *nv = (bf16 *)cuda_alloc(b, n * hd);
    CHECK_INTERNAL(nk && nv, "out of GPU memory keeping %d KV entries per head", k);
    size_t total = (size_t)nh * k * hd;
    if (total) {
        const int *ix = (const int *)stage(c, STAGE_IDX, idx, (size_t)nh * k * sizeof(int));
        CUDA_LAUNCH(kv_keep_kernel, cuda_blocks(total, THREADS), THREADS, 0, c->stream, nk, nv,
                    (const bf16 *)L->k, (const bf16 *)L->v, ix, nh, k, hd, L->cap, new_cap);
    }
    int *np = (int *)xmalloc(n * sizeof(int));
    for (int g = 0; g < nh; g++)
        for (int j = 0; j < k; j++)
            np[(size_t)g * new_cap + j] = L->pos[(size_t)g * L->cap + idx[g * k + j]];
    cuda_free(b, L->k);   // after the gather above has read it
    cuda_free(b, L->v);
    free(L->pos);
    L->k = nk, L->v = nv, L->pos = np, L->cap = new_cap, L->len = k;
    mirror_get(c, L);     // uploads the kept positions
}

static attn_cuda_args attn_args(cuda_impl *c, const void *q, const int *qpos, int n, int heads,
                                const kv_layer *L);

// dpos (n_kv_head, cap) -> (n_kv_head, new_cap) in place: entry j of head g = idx[g*k + j], then
// *len = k. In place is safe in this order: heads ascending, entries ascending in chunks of the
// block, each chunk read whole before it is written (idx ascending and new_cap <= cap: an entry
// is written at or below where it, or any entry after it, is read).
__global__ void kv_pos_keep_kernel(int *dpos, int *len, const int *idx, int n_kv_head, int k,
                                   int cap, int new_cap) {
    for (int g = 0; g < n_kv_head; g++)
        for (int j0 = 0; j0 < k; j0 += blockDim.x) {
            // threads past k read and write the old length's slot (no entry's): no branch
            // between the barriers
            int j = j0 + threadIdx.x, in = j < k;
            size_t spare = (size_t)n_kv_head * cap;
            int p = dpos[in ? (size_t)g * cap + idx[(size_t)g * k + (in ? j : 0)] : spare];
            __syncthreads();
            dpos[in ? (size_t)g * new_cap + j : spare] = p;
            __syncthreads();
        }
    if (threadIdx.x == 0) *len = k;
}

// kv_keep with device indices into the caller's nk, nv: the layer's device positions are kept
// in place in its mirror (now keyed by nk), the host's left stale; nothing allocated or freed.
void cuda_kv_keep_at(backend *b, kv_layer *L, const int *didx, int k, int new_cap, void *nk, void *nv) {
    cuda_impl *c = impl(b);
    int hd = L->head_dim, nh = L->n_kv_head;
    CHECK_INTERNAL(new_cap <= L->cap && k <= new_cap, "keep %d of %d entries into %d", k, L->cap, new_cap);
    mirror_get(c, L);
    pos_mirror *m = mirror_find(c, L->k);
    size_t total = (size_t)nh * k * hd;
    if (total)
        CUDA_LAUNCH(kv_keep_kernel, cuda_blocks(total, THREADS), THREADS, 0, c->stream, (bf16 *)nk,
                    (bf16 *)nv, (const bf16 *)L->k, (const bf16 *)L->v, didx, nh, k, hd, L->cap, new_cap);
    m->dlen = m->dpos + (size_t)nh * new_cap;
    CUDA_LAUNCH(kv_pos_keep_kernel, 1, 1024, 0, c->stream, m->dpos, m->dlen, didx, nh, k, L->cap, new_cap);
    m->kbuf = nk;
    c->gen++;   // a recording that reads this layer is stale
    L->k = nk, L->v = nv, L->cap = new_cap, L->len = k;
    L->pos_stale = 1;   // pos keeps its (larger) allocation; kv_pos_sync fills it
}

// The host's positions of L from its device mirror (the mirror's layout: L->cap per head).
void cuda_kv_pos_sync(backend *b, kv_layer *L) {
    cuda_impl *c = impl(b);
    if (!L->pos_stale) return;
    const pos_mirror *m = mirror_get(c, L);
    CUDA_CHECK(cuda_memcpy_async(L->pos, m->dpos, (size_t)L->n_kv_head * L->cap * sizeof(int),
                                 cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cuda_stream_sync(c->stream));
    L->pos_stale = 0;
}

void cuda_window_scores(backend *b, float *scores, const void *q, const int *qpos, int nq, int heads,
                        const kv_layer *L, int m, int c_, int kernel, int avg) {
    cuda_impl *c = impl(b);
    size_t total = (size_t)nq * heads * m;
    if (total == 0 || c_ == 0) return;
    attn_cuda_args a = attn_args(c, q, qpos, nq, heads, L);
    float *d = (float *)dev_buf_reserve(c, &c->probs, total * sizeof(float), "attention probabilities");
    attn_probs_cuda(d, &a, m, c->stream);
    score_window_pool_cuda(scores, d, nq, heads, m, c_, kernel, avg, c->stream);
}

void cuda_score_group_sum(backend *b, float *out, const float *in, int heads, int groups, int c_) {
    score_group_sum_cuda(out, in, heads, groups, c_, impl(b)->stream);
}

void cuda_score_fold_max(backend *b, float *row_max, float *sum, const float *in, int heads, int c_,
                         int last) {
    score_fold_max_cuda(row_max, sum, in, heads, c_, last, impl(b)->stream);
}

void cuda_score_select(backend *b, int *idx, int ld, const float *s, int rows, int c_, int k, int tail) {
    score_topk_rows_cuda(idx, (size_t)ld, s, (size_t)c_, rows, c_, k, 0, tail, impl(b)->stream);
}

void cuda_ints_to_host(backend *b, int *dst, const int *src, size_t n) {
    cuda_impl *c = impl(b);
    if (n == 0) return;
    CUDA_CHECK(cuda_memcpy_async(dst, src, n * sizeof(int), cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cuda_stream_sync(c->stream));
}

// (a copy from pageable host memory returns once the source is read)
void cuda_ints_from_host(backend *b, int *dst, const int *src, size_t n) {
    cuda_impl *c = impl(b);
    CHECK_INTERNAL(!c->recording, "an upload while recording a decode step");
    if (n) CUDA_CHECK(cuda_memcpy_async(dst, src, n * sizeof(int), cudaMemcpyHostToDevice, c->stream));
}

// ---- attention --------------------------------------------------------------------------------

static attn_cuda_args attn_args(cuda_impl *c, const void *q, const int *qpos, int n, int heads,
                                const kv_layer *L) {
    attn_cuda_args a = {q, NULL, n, heads, L->k, L->v, NULL, L->len, L->cap, L->n_kv_head,
                        L->head_dim, NULL};
    const pos_mirror *m = mirror_get(c, L);
    a.kpos = m->dpos;
    if (in_step(c, qpos, n))   // a bound decode step: the length as the device has it at replay
        a.dlen = m->dlen, a.len = L->cap;
    a.qpos = indices(c, STAGE_IDX, qpos, n);
    return a;
}

void cuda_attention(backend *b, void *out, const void *q, const int *qpos, int n, int heads,
                           const kv_layer *L) {
    cuda_impl *c = impl(b);
    if (n == 0) return;
    attn_cuda_args a = attn_args(c, q, qpos, n, heads, L);
    size_t wf = attn_cuda_work_floats(&a, c->n_sm);
    float *work = (float *)dev_buf_reserve(c, &c->attn_work, wf * sizeof(float), "attention partials");
    attn_causal_cuda(out, &a, work, c->n_sm, c->stream);
}

// ---- batched decode attention: one launch over every sequence's cache -------------------------

#define ARENA_ROWS 65536   // cache-table rows kept for bound steps (2.6 MB)

void arena_free(cuda_impl *c) {
    if (c->arena_d) CUDA_CHECK(cudaFree(c->arena_d));
    free(c->arena_h), free(c->table_off), free(c->table_len);
    c->arena_d = c->arena_h = NULL, c->table_off = c->table_len = NULL;
    c->arena_used = c->n_tables = 0;
}

// The device copy of t (k rows) for a bound step: the one made at an earlier step when equal
// (a recording finds the eager step's), else a new one (never while recording).
static const attn_cuda_cache *arena_table(cuda_impl *c, const attn_cuda_cache *t, int k) {
    for (int i = 0; i < c->n_tables; i++)
        if (c->table_len[i] == k && memcmp(c->arena_h + c->table_off[i], t, k * sizeof *t) == 0)
            return c->arena_d + c->table_off[i];
    CHECK_INTERNAL(!c->recording, "a new batched-attention table while recording a decode step");
    CHECK_INTERNAL(k <= ARENA_ROWS, "a batched decode of %d sequences", k);
    if (!c->arena_d) {
        c->arena_d = (attn_cuda_cache *)dev_alloc(c, ARENA_ROWS * sizeof *c->arena_d, "attention tables");
        c->arena_h = (attn_cuda_cache *)xmalloc(ARENA_ROWS * sizeof *c->arena_h);
        c->table_off = (int *)xmalloc(ARENA_ROWS * sizeof(int));
        c->table_len = (int *)xmalloc(ARENA_ROWS * sizeof(int));
    }
    if (c->arena_used + k > ARENA_ROWS) {   // full: start over (recordings that read it are stale)
        CUDA_CHECK(cuda_stream_sync(c->stream));
        c->arena_used = c->n_tables = 0;
        c->gen++;
    }
    int off = c->arena_used;
    memcpy(c->arena_h + off, t, k * sizeof *t);
    CUDA_CHECK(cuda_memcpy_async(c->arena_d + off, c->arena_h + off, k * sizeof *t,
                               cudaMemcpyHostToDevice, c->stream));
    c->table_off[c->n_tables] = off, c->table_len[c->n_tables++] = k;
    c->arena_used += k;
    return c->arena_d + off;
}

// k sequences' decode rows in one launch when each has one row, their q and out rows and
// positions are consecutive and the group kernel takes the head dim; else one call each.
void cuda_attention_multi(backend *b, int k, void *const *out, const void *const *q,
                          const int *const *qpos, const int *n, int heads, const kv_layer *const *L) {
    cuda_impl *c = impl(b);
    int hd = L[0]->head_dim, nkv = L[0]->n_kv_head, step = k >= 2 && in_step(c, qpos[0], k);
    size_t row = (size_t)heads * hd * sizeof(bf16);
    int one = k >= 2 && k <= ARENA_ROWS, bound = 0;
    for (int i = 0; i < k && one; i++) {
        one = n[i] == 1 && L[i]->head_dim == hd && L[i]->n_kv_head == nkv && qpos[i] == qpos[0] + i &&
              (const char *)q[i] == (const char *)q[0] + i * row &&
              (const char *)out[i] == (const char *)out[0] + i * row;
        int r = step ? L[i]->cap : L[i]->len;
        bound = r > bound ? r : bound;
    }
    attn_cuda_args a = {q[0], NULL, k, heads, NULL, NULL, NULL, bound, 0, nkv, hd, NULL};
    if (!one || !attn_decode_multi_takes(&a)) {
        for (int i = 0; i < k; i++) cuda_attention(b, out[i], q[i], qpos[i], n[i], heads, L[i]);
        return;
    }
    attn_cuda_cache *t = (attn_cuda_cache *)xmalloc((size_t)k * sizeof *t);
    for (int i = 0; i < k; i++) {
        const pos_mirror *m = mirror_get(c, L[i]);
        t[i] = (attn_cuda_cache){L[i]->k, L[i]->v, m->dpos, step ? m->dlen : NULL,
                                 step ? L[i]->cap : L[i]->len, L[i]->cap};
    }
    const attn_cuda_cache *dt = step ? arena_table(c, t, k)
                                     : (const attn_cuda_cache *)stage(c, STAGE_ROWS, t, (size_t)k * sizeof *t);
    free(t);
    a.qpos = indices(c, STAGE_IDX, qpos[0], k);
    size_t wf = attn_decode_multi_work_floats(&a, c->n_sm);
    float *work = (float *)dev_buf_reserve(c, &c->attn_work, wf * sizeof(float), "attention partials");
    attn_decode_multi_cuda(out[0], &a, dt, work, c->n_sm, c->stream);
}

void cuda_attn_probs(backend *b, float *probs, const void *q, const int *qpos, int n,
                            int heads, const kv_layer *L, int m) {
    cuda_impl *c = impl(b);
    size_t total = (size_t)n * heads * m;
    if (total == 0) return;
    attn_cuda_args a = attn_args(c, q, qpos, n, heads, L);
    float *d = (float *)dev_buf_reserve(c, &c->probs, total * sizeof(float), "attention probabilities");
    attn_probs_cuda(d, &a, m, c->stream);
    CUDA_CHECK(cuda_memcpy_async(probs, d, total * sizeof(float), cudaMemcpyDeviceToHost, c->stream));
    CUDA_CHECK(cuda_stream_sync(c->stream));
}

// ---- selected decode attention and the phi completion summary (attn/phi_cuda.cu) ----------

static phi_cuda_shape phi_shape(const phi_maps *p) {
    phi_cuda_shape s = {p->kind, p->d_in, p->d_emb, p->d_hid, p->d_phi, phi_n_par(p)};
    return s;
}

static void phi_dims_check(const phi_maps *p, int hd) {
    int dims[] = {p->d_in, p->d_emb, p->d_hid, p->d_phi};
    for (int i = 0; i < 4; i++)
        CHECK_INTERNAL(dims[i] <= PHI_CUDA_MAX_DIM, "phi map dimension %d over the CUDA limit %d",
                       dims[i], PHI_CUDA_MAX_DIM);
    CHECK_INTERNAL(hd <= 256 && p->d_in == hd, "phi maps on head dim %d (CUDA: <= 256, = d_in %d)",
                   hd, p->d_in);
}

// Device log features of n rows of x (row index rows[r], parameter block of[r] of dpar, host
// arrays; dpar in device memory): the phi_f buffer, (n, d_phi).
static float *phi_features(cuda_impl *c, const phi_maps *p, const float *dpar, const void *x,
                           const int *rows, const int *of, int n) {
    const int *drows = (const int *)stage(c, STAGE_ROWS, rows, (size_t)n * sizeof(int));
    const int *dof = (const int *)stage(c, STAGE_OF, of, (size_t)n * sizeof(int));
    float *F = (float *)dev_buf_reserve(c, &c->phi_f, ((size_t)n * p->d_phi + 1) * sizeof(float),
                                        "phi features");
    phi_features_cuda(F, x, drows, dof, n, dpar, phi_shape(p), c->stream);
    return F;
}

// The summaries into dsum (device, phi_summary_flat): every mid key's features (its KV head's
// parameter block of par_k, device), then one block per (feature, KV head). Nothing comes back.
void cuda_phi_summarize(backend *b, phi_summary *out, float *dsum, const phi_maps *p,
                        const float *par_k, int layer, const kv_layer *L, int lo, int hi) {
    cuda_impl *c = impl(b);
    int n = hi - lo, nkv = L->n_kv_head, hd = L->head_dim, f = p->d_phi;
    phi_dims_check(p, hd);
    CHECK_INTERNAL(dsum && par_k, "phi summaries on CUDA need their device buffers");
    for (int g = 0; g < nkv; g++) out[g].n = n;
    if (n <= 0) return;
    int *rows = (int *)xmalloc((size_t)nkv * n * sizeof(int)), *of = (int *)xmalloc((size_t)nkv * n * sizeof(int));
    for (int g = 0; g < nkv; g++)
        for (int i = 0; i < n; i++) rows[(size_t)g * n + i] = g * L->cap + lo + i, of[(size_t)g * n + i] = g;
    const float *par = par_k + (size_t)layer * nkv * phi_n_par(p);
    float *F = phi_features(c, p, par, L->k, rows, of, nkv * n);
    phi_summary_cuda(dsum, dsum + (size_t)nkv * f, dsum + (size_t)2 * nkv * f, F, L->v, nkv, n, L->cap,
                     lo, hd, f, c->stream);
    free(rows), free(of);
}

// The completion's device inputs for one decode row: lq (heads, d_phi) = log phi_q of each
// head's query, fsel (heads, k, d_phi) = log phi_k of each head's retrieved keys, from the
// device selection idx (heads, k); the summaries and parameters already in device memory.
static void phi_inputs(cuda_impl *c, const phi_completion *comp, const void *q, int heads,
                       const kv_layer *L, const int *idx, int k, float **lq, float **fsel) {
    const phi_maps *p = comp->maps;
    int nkv = L->n_kv_head, f = p->d_phi;
    size_t np = (size_t)phi_n_par(p);
    *lq = (float *)dev_buf_reserve(c, &c->phi_q, ((size_t)heads * f + 1) * sizeof(float), "phi queries");
    phi_features_sel_cuda(*lq, q, NULL, heads, 0, 0, 0, comp->par_q + (size_t)comp->layer * heads * np,
                          phi_shape(p), c->stream);
    *fsel = (float *)dev_buf_reserve(c, &c->phi_f, ((size_t)heads * k * f + 1) * sizeof(float), "phi features");
    phi_features_sel_cuda(*fsel, L->k, idx, heads, k, heads / nkv, L->cap,
                          comp->par_k + (size_t)comp->layer * nkv * np, phi_shape(p), c->stream);
}

void cuda_attn_select(backend *b, void *out, const void *q, int heads, const kv_layer *L,
                      const int *sel, int n_sel, int n_sub, const phi_completion *comp) {
    cuda_impl *c = impl(b);
    int nkv = L->n_kv_head, hd = L->head_dim;
    CHECK_INTERNAL(hd <= 256, "selected attention on head dim %d (CUDA: <= 256)", hd);
    const int *dsel = (const int *)stage(c, STAGE_IDX, sel, ((size_t)heads * n_sel + 1) * sizeof(int));
    float *work = (float *)dev_buf_reserve(c, &c->attn_work, ((size_t)heads * n_sel + 1) * sizeof(float),
                                           "selected attention scores");
    const phi_maps *p = comp ? comp->maps : NULL;
    if (!p || comp->sum[0].n <= n_sub) {   // nothing left to estimate: selection only
        phi_select_cuda(out, q, L->k, L->v, L->cap, heads, nkv, hd, dsel, n_sel, 0, NULL, NULL,
                        NULL, NULL, NULL, 0, 0, work, c->stream);
        return;
    }
    phi_dims_check(p, hd);
    int f = p->d_phi, *top = (int *)xmalloc(((size_t)heads * n_sub + 1) * sizeof(int));
    for (int h = 0; h < heads; h++)   // each head's first n_sub selected: the retrieved keys
        memcpy(top + (size_t)h * n_sub, sel + (size_t)h * n_sel, (size_t)n_sub * sizeof(int));
    const int *dtop = (const int *)stage(c, STAGE_ROWS, top, ((size_t)heads * n_sub + 1) * sizeof(int));
    float *lq, *fsel;
    phi_inputs(c, comp, q, heads, L, dtop, n_sub, &lq, &fsel);
    const float *d = comp->dsum;
    phi_select_cuda(out, q, L->k, L->v, L->cap, heads, nkv, hd, dsel, n_sel, n_sub, lq, fsel, d,
                    d + (size_t)nkv * f, d + (size_t)2 * nkv * f, f, comp->sum[0].n, work, c->stream);
    free(top);
}

// topk's step on the device (backend.h attn_topk_step): the mid region's raw scores (each K
// row read once per KV head), each head's top k into idx, the attention over those and the
// anchors, and the read counts; the length from the device in a bound step, so a recording
// replays at every length. Nothing crosses to the host; the scratch is sized by the capacity.
void cuda_attn_topk_step(backend *b, void *out, int *idx, double *stats, const void *q, int qpos,
                         int heads, const kv_layer *L, int sink, int n, int k, const topk_pages *pg,
                         const phi_completion *comp) {
    cuda_impl *c = impl(b);
    int nkv = L->n_kv_head, hd = L->head_dim;
    CHECK_INTERNAL(sink >= 0 && n >= 0 && k >= 0 && k <= n && sink + n <= L->len,
                   "top-%d of [%d, %d + %d) over %d entries", k, sink, sink, n, L->len);
    const pos_mirror *m = mirror_get(c, L);
    const int *dlen = in_step(c, &qpos, 1) ? m->dlen : NULL;
    const int paged = pg && pg->read < pg->n_pages && k > 0;
    const int *pidx = NULL;
    double krow = (double)L->k_row, sel_bytes = k > 0 ? (double)n * krow * nkv : 0, short_bytes = 0;
    if (paged) {   // bounds, the best pages per KV head, the exact scores of their entries
        int np = pg->n_pages, r = pg->read, P = pg->size;
        float *ub = pg->work_bounds ? pg->work_bounds
                    : (float *)dev_buf_reserve(c, &c->page_score, (size_t)nkv * np * sizeof(float), "page bounds");
        int *pi = pg->work_pages ? pg->work_pages
                  : (int *)dev_buf_reserve(c, &c->page_idx, (size_t)nkv * r * sizeof(int), "picked pages");
        float *d = pg->work_cand ? pg->work_cand
                   : (float *)dev_buf_reserve(c, &c->probs, (size_t)heads * r * P * sizeof(float), "page scores");
        score_page_bounds_cuda(ub, q, pg->bounds, heads, nkv, hd, np, c->stream);
        score_topk_rows_cuda(pi, (size_t)r, ub, (size_t)np, nkv, np, r, 0, 0, c->stream);
        score_page_dots_cuda(d, q, L->k, L->cap, heads, nkv, hd, sink, n, pi, r, P, c->stream);
        score_topk_rows_cuda(idx, (size_t)k, d, (size_t)r * P, heads, r * P, k, 0, 0, c->stream);
        score_page_map_cuda(idx, pi, heads, nkv, k, sink, r, P, c->stream);
        pidx = pi;
        sel_bytes = ((double)r * P * krow + (double)np * 2 * kv_row_bytes(pg->type, hd)) * nkv;
        short_bytes = (double)(np * P - n) * krow;   // the last page's missing entries
    } else if (k > 0) {
        float *d = (float *)dev_buf_reserve(c, &c->probs, (size_t)heads * n * sizeof(float), "top-K scores");
        score_dots_cuda(d, q, L->k, L->cap, heads, nkv, hd, sink, n, c->stream);
        score_topk_rows_cuda(idx, (size_t)k, d, (size_t)n, heads, n, k, sink, 0, c->stream);
    }
    int last = pg ? pg->n_pages - 1 : -1;
    if (!out) {
        if (stats)
            score_union_stats_cuda(stats, idx, nkv, heads / nkv, k, n, L->len, dlen, sel_bytes, pidx,
                                   paged ? pg->read : 0, last, short_bytes, 1, c->stream);
        return;
    }
    size_t ld = (size_t)k + L->cap - n;   // the selection at full capacity
    float *work = (float *)dev_buf_reserve(c, &c->attn_work, ((size_t)heads * ld + 1) * sizeof(float),
                                           "selected attention scores");
    float *lq = NULL, *fsel = NULL, *d = NULL;
    int f = 0;
    if (comp && comp->maps && n > k) {   // topk+phi: the rest of the mid region from its summaries
        phi_dims_check(comp->maps, hd);
        phi_inputs(c, comp, q, heads, L, idx, k, &lq, &fsel);
        d = (float *)comp->dsum, f = comp->maps->d_phi;
    }
    topk_attend_cuda(out, q, L->k, L->v, L->cap, heads, nkv, hd, idx, k, sink, n, L->len, dlen, lq,
                     fsel, d, d ? d + (size_t)nkv * f : NULL, d ? d + (size_t)2 * nkv * f : NULL, f,
                     work, ld, c->stream);
    score_union_stats_cuda(stats, idx, nkv, heads / nkv, k, n, L->len, dlen, sel_bytes, pidx,
                           paged ? pg->read : 0, last, short_bytes, 0, c->stream);
}

// Page bounds on the device (bf16 keys, bf16 bounds: exact), pages_build_cuda per KV head.
void cuda_kv_pages_build(backend *b, void *out, const kv_layer *L, int lo, int n, int size) {
    cuda_impl *c = impl(b);
    CHECK_INTERNAL(L->k_type == KV_BF16 && lo >= 0 && n >= 0 && lo + n <= L->len && size > 0,
                   "pages of %d over [%d, %d + %d) of %d (%s keys)", size, lo, lo, n, L->len,
                   kv_type_name(L->k_type));
    pages_build_cuda(out, L->k, L->cap, L->n_kv_head, L->head_dim, lo, n, size, c->stream);
}
