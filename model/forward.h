// model/forward.h — the shared forward pass. One layer loop serves every strategy: it runs a set
// of ROWS (hidden states) at explicit original POSITIONS through the layers, appending each
// layer's K/V to that layer's cache, and calls the policy's hooks between layers. Strategy names
// never appear here: hooks get mechanisms (fwd_keep_rows, the KV cache) and decide. The pass
// (forward.c) works in a run context's buffers (model/context.h); the decode step (decode.c)
// records it.
#pragma once
#include "../kv/kv.h"
#include "context.h"

typedef struct fwd_state {
    context *cx;      // the run the pass is in
    model *m;         // cx->m
    kv_cache *kv;
    int n;            // rows alive
    int *pos;         // (n,) original absolute positions, host
    void *x;          // (n, d) residual stream, backend memory
    long rows_done;   // rows processed summed over layers (a measure of prefill work)
    struct fwd_run_state *r;   // the buffers of the pass the rows are in (model/pass.h)
} fwd_state;

typedef struct fwd_hooks {
    void *ctx;
    // After layer l's attention, once the alive rows' K/V are in layer l's cache; q is the rows'
    // post-RoPE queries (n, heads, hd) in backend memory. May read attention probabilities
    // (fwd_attn_probs) and edit layer l's cache (fwd_kv_keep), not drop rows. Returns 0 (or -1
    // to abort).
    int (*after_attention)(void *ctx, fwd_state *s, int l, const void *q);
    // After layer l's block. May shrink the row set (fwd_keep_rows), append K/V computed from
    // the rows (fwd_kv_from_stream) or edit caches.
    // Returns 0 to go on, FWD_STOP to skip the remaining layers (the logits then come from the
    // final norm + LM head on the alive rows: a shallow "draft" of the model), -1 to abort.
    int (*after_layer)(void *ctx, fwd_state *s, int l);
    // Asked before layer l's block: return 1 if the layer's K/V come from elsewhere (already in
    // cache layer *kv_layer, e.g. put there by fwd_kv_from_stream): the layer then computes and
    // appends no K/V of its own and its queries attend to cache layer *kv_layer; it may also
    // replace the query projection (*wq, *bq, preset to the layer's own). 0: the normal path.
    int (*kv_source)(void *ctx, int l, int *kv_layer, const bk_weight **wq, const bk_weight **bq);
    // Optional: replaces layer l's attention of the alive rows: out (n, heads, hd) from their
    // post-RoPE queries q, once their K/V are in layer l's cache. Returns 0 (or -1 to abort).
    int (*attention)(void *ctx, fwd_state *s, int l, const void *q, void *out);
    // Optional (a one-sequence pass): per layer, the capacity its cache is kept to by
    // fwd_kv_keep_at in this pass, 0 for none: the kept buffers are made before the pass, so
    // that the pass allocates nothing.
    const int *keep_caps;
    // Set when the hooks' decode-step work (one row) is device ops on the pass's buffers that
    // read no host data, edit no cache but by appends (fwd_kv_from_stream) and issue the same
    // launches every step (kv_source's answers fixed): such a step may be recorded as a CUDA
    // graph and replayed, as a dense one is (fwd_decode).
    int recordable;
} fwd_hooks;

#define FWD_STOP 1

// Runs tokens (n,) at positions pos (n,) through every layer of m, appending K/V to kv.
// logits (host): the last alive row's logits (vocab,), or every row's (n, vocab) when all_rows
// (only valid when no hook drops rows). hooks may be NULL. Returns rows processed over layers.
long fwd_run(context *cx, kv_cache *kv, const int *tokens, const int *pos, int n,
             const fwd_hooks *hooks, float *logits, int all_rows);

// One sequence of a batched pass: its tokens (n,) at positions pos (n,) appended to its own
// cache through its own hooks (may be NULL: none that drop rows or stop early); logits (host,
// may be NULL) receives its last row's logits (vocab,); rows_done is set (rows over layers).
typedef struct fwd_seq {
    kv_cache *kv;
    const int *tokens, *pos;
    int n;
    const fwd_hooks *hooks;
    float *logits;
    long rows_done;
    // fwd_decode, fwd_run_batch (may be NULL): the sequence's sampler. token is set to the next
    // token sample_next draws from the logits, the sampler advanced; drawn where the logits are
    // when every sequence of the pass has a sampler and logits and the backend samples (logits
    // then not written).
    sampler *smp;
    int token;
} fwd_seq;

#define FWD_MAX_BATCH 256   // sequences in one pass

// fwd_run over B sequences at once: the norms, projections, MLP and LM head run once over
// every sequence's rows; the cache append, attention and hooks per sequence. Each sequence's
// logits equal what fwd_run gives it alone, up to the backend's rounding of a product over more
// rows. 0, or -1 when a hook aborted.
int fwd_run_batch(context *cx, fwd_seq *seqs, int B);

// fwd_run of one sequence, then the next token after its last row drawn by smp into *token: on
// the backend when it samples with smp's settings (only the token crosses to the host; logits
// left unwritten), else into logits (host, vocab) and by sample_next. Rows processed over
// layers, or -1 (a hook aborted).
long fwd_run_draw(context *cx, kv_cache *kv, const int *tokens, const int *pos, int n,
                  const fwd_hooks *hooks, float *logits, sampler *smp, int *token);

// The rounding class of m's products over n rows (the backend's row_class, over every matrix
// weight of m): rows run through passes of two row counts of one class >= 0 get the same products
// bit for bit, so several sequences whose row counts alone are of class C may share a pass of
// class C with the logits each gets alone; -1: unknown (never share a pass across classes).
int fwd_row_class(const model *m, int n);

// A decode step: fwd_run_batch for B sequences of one row each. Where the backend records
// steps (backend.h: step_bind, graph_*) and no sequence's hooks act at decode (none, hooks with
// no functions: a dense decode over the cache the strategy kept, or recordable hooks), the step
// runs in the
// context's pass buffers (planned for B rows) on the same caches, reads its token and positions
// from one upload and the caches' lengths from the device, and is recorded on its second call
// on the same caches and buffers and replayed after (SIFT_CUDA_GRAPHS=0: never recorded); a replay
// appends to the cache layers the recorded step appended to. A replay gives the logits the same
// launches give eagerly, bit for bit. Elsewhere it is fwd_run_batch. With samplers
// (fwd_seq.smp) it draws the next tokens. 0, or -1 (a hook aborted).
int fwd_decode(context *cx, fwd_seq *seqs, int B);
// The context's decode steps so far: run through fwd_decode's fixed buffers, recorded, replayed.
void fwd_decode_counts(const context *cx, long *fixed, long *recorded, long *replayed);
// Frees the pass's buffers and the recorded decode step (ctx_free calls it; the backend must
// still live).
void fwd_free(context *cx);

// Keep rows idx (k,) of the alive set, in that order (idx into the current alive rows). Only in
// after_layer of a one-sequence pass.
void fwd_keep_rows(fwd_state *s, const int *idx, int k);

// probs (nq, heads, m), host: for each of the LAST nq alive rows and each query head, the
// softmax of q.k / sqrt(hd) over the first m entries of layer l's cache, restricted to the keys
// visible to that row (entry position <= row position; invisible entries get 0).
void fwd_attn_probs(fwd_state *s, int l, const void *q, int nq, int m, float *probs);

// Layer l's cache keeps, for each KV head g, the entries idx[g*k .. g*k+k) (indices into its
// current entries, ascending), in a new buffer of capacity new_cap >= k (room for decode).
void fwd_kv_keep(fwd_state *s, int l, const int *idx, int k, int new_cap);

// ---- token scoring in backend memory (backend.h: window_scores ..): what FastKV, SnapKV and
// SpecPrefill compose, so that no per-token score or index crosses to the host in a pass ----

// Backend memory of `bytes` for scores (fp32) or indices (int32): made before the pass that
// uses it, freed after with fwd_scratch_free.
void *fwd_scratch(const model *m, size_t bytes);
void fwd_scratch_free(const model *m, void *p);
// scores (heads, c), backend memory: for each query head, the softmax attention of the LAST nq
// alive rows over the first m entries of layer l (fwd_attn_probs'), summed over the rows for
// entries j < c, then pooled along j (avg 0: max-pool, 1: avg-pool; kernel): score_window_pool.
void fwd_window_scores(fwd_state *s, int l, const void *q, int nq, int m, int c, int kernel,
                       int avg, float *scores);
// out (groups, c) = score_group_sum of in (heads, c); backend memory.
void fwd_score_group_sum(const model *m, float *out, const float *in, int heads, int groups, int c);
// row_max, sum (c,) folded with in (heads, c): score_fold_max (at the query row's last layer,
// sum += row_max and row_max = 0); backend memory.
void fwd_score_fold_max(const model *m, float *row_max, float *sum, const float *in, int heads,
                        int c, int last);
// idx (rows, ld) = score_select of s (rows, c): the top k of each row, then c .. c + tail - 1.
void fwd_score_select(const model *m, int *idx, int ld, const float *s, int rows, int c, int k,
                      int tail);
// fwd_kv_keep with idx (n_kv_head, k) in backend memory (fwd_score_select's), into the buffers
// made for layer l before the pass (fwd_hooks.keep_caps; else new ones); the buffers it replaces
// are freed when the pass ends.
void fwd_kv_keep_at(fwd_state *s, int l, const int *idx, int k, int new_cap);
// dst (n,), host = src (n,) int32 backend memory; and the other way.
void fwd_ints_to_host(const model *m, int *dst, const int *src, size_t n);
void fwd_ints_from_host(const model *m, int *dst, const int *src, size_t n);
// The same for fp32 scores and fp64 counts (their words copied as they are).
void fwd_floats_to_host(const model *m, float *dst, const float *src, size_t n);
void fwd_floats_from_host(const model *m, float *dst, const float *src, size_t n);
void fwd_doubles_to_host(const model *m, double *dst, const double *src, size_t n);
void fwd_doubles_from_host(const model *m, double *dst, const double *src, size_t n);
// L's host positions, made current first where a keep on the device left them behind.
const int *fwd_kv_pos(const model *m, kv_layer *L);
// fwd_kv_pos of every layer of kv (before the host reads kv_layer.pos: a report, a copy).
void fwd_kv_pos_sync(const model *m, kv_cache *kv);

// One term of a K/V projection from the residual stream (fwd_kv_from_stream); biases may be NULL.
typedef struct {
    const bk_weight *norm, *wk, *bk, *wv, *bv;
} fwd_kv_term;

// Appends to cache layer dst the K/V of the alive rows computed from their residual stream x:
//   k = RoPE(sum_t Wk_t . rmsnorm(x; norm_t) + bk_t, pos),  v = sum_t Wv_t . rmsnorm(x; norm_t) + bv_t
// Only in after_layer (it works in the pass's buffers).
void fwd_kv_from_stream(fwd_state *s, int dst, const fwd_kv_term *terms, int n_terms);

// A new (1, n) vector weight scale * (ws[0] + ... + ws[k-1]), each ws[i] an (n,) vector weight
// on m's backend (read back with the backend's vector_to_host). Free with fwd_weight_free.
bk_weight *fwd_vector_sum(model *m, const bk_weight *const *ws, int k, int n, float scale);
void fwd_weight_free(model *m, bk_weight *w);
// topk's decode attention for the one alive row over layer l (backend op attn_topk_step): idx
// (heads, k), backend memory = per query head the k entries of the mid region [sink, sink + n)
// with the largest raw score (ties to the lower index, ascending; absolute entry indices), among
// all of them (pg NULL) or among the best pages' (pg, attn/pages.h); then, unless out is NULL,
// out (heads, hd) = attention over those, [0, sink) and every entry after the mid region, and
// stats (4,), backend memory, += the entries read exactly, the entries cached, 1, the
// selector's bytes (out NULL: the last alone); with comp (topk+phi), completed from its
// summaries of the mid region. Recordable: in a bound decode step the length is the device's.
void fwd_attn_topk_step(fwd_state *s, int l, const void *q, int sink, int n, int k, int *idx,
                        double *stats, const topk_pages *pg, const phi_completion *comp, void *out);
// The page bounds of entries [lo, lo + n) of layer l of kv, pages of `size` (backend op
// kv_pages_build), into out, backend memory of n_kv_head x pages_bytes(...).
void fwd_kv_pages_build(model *m, kv_cache *kv, int l, int lo, int n, int size, void *out);

// out (heads, hd) for the one alive row: attention over selected entries of layer l's cache,
// optionally completed by summaries (backend op attn_select, see backend/backend.h).
void fwd_attn_select(fwd_state *s, int l, const void *q, const int *sel, int n_sel, int n_sub,
                     const phi_completion *comp, void *out);

// The summaries of entries [lo, hi) of layer l of kv under p (backend op phi_summarize): into
// dsum (backend memory, phi_summary_flat floats; par_k = p->k in backend memory) and, where
// decode reads them from the host, out (n_kv_head,); out[g].n always.
void fwd_phi_summarize(model *m, kv_cache *kv, int l, const phi_maps *p, const float *par_k, int lo,
                       int hi, phi_summary *out, float *dsum);

// A KV cache on the model's backend with capacity caps[l] per layer, rows of the context's
// types (NULL + err if out of memory).
kv_cache *fwd_kv_create(const context *cx, const int *caps, char *err, size_t errlen);
// A copy of cache a (made in cx) with the same capacities, entries and positions, its rows
// copied on the backend (NULL + err if out of memory).
kv_cache *fwd_kv_copy(const context *cx, const kv_cache *a, char *err, size_t errlen);
// The same into a cache of capacity caps[l] per layer (each at least a's length there).
kv_cache *fwd_kv_copy_caps(const context *cx, const kv_cache *a, const int *caps, char *err,
                           size_t errlen);
// The first n entries of layer l of kv, K and V rows as stored, each KV head's n rows in turn,
// into k (n_kv_head * n * k_row bytes) and v, on the host; their positions must be 0 .. n-1
// (a plain prefill's). 0, or -1 + err (positions not in order; rows that are not a whole
// number of 4-byte words: the backend copies words).
int fwd_kv_read(const context *cx, kv_cache *kv, int l, int n, void *k, void *v, char *err,
                size_t errlen);
// A new cache of capacity n per layer holding n entries at positions 0 .. n-1, layer l's rows
// from k[l], v[l] (as fwd_kv_read writes them). NULL + err (out of memory, or rows as above).
kv_cache *fwd_kv_write(const context *cx, int n, const void *const *k, const void *const *v,
                       char *err, size_t errlen);
// The K and V row types of the caches fwd_kv_create makes in cx (its kv_k/kv_v, or the
// backend's own element).
void fwd_kv_types(const context *cx, enum kv_type *k, enum kv_type *v);
