// attn/phi.h — linear-attention completion for decode attention over a subset of the cache.
// Positive feature maps phi (R^hd -> R^d_phi, > 0, kept in the log domain) per query head and
// per KV head of each layer: a one-block ReZero MLP (learned) or positive random features
// (training-free). A summary of a region of keys/values under phi_k — m (max log feature),
// u~ and T~ (shifted sums) — stands in for the softmax mass of the entries not read exactly.
// CPU versions here (phi_cpu.c); a CUDA twin can sit beside them.
#pragma once
#include <stddef.h>
#include <stdint.h>

enum phi_kind { PHI_MLP = 1, PHI_PRF = 2 };

// Feature maps of a whole model. Per head one parameter block of phi_n_par() floats:
//   MLP: ws (emb, in), bs (emb), w1 (hid, emb), b1 (hid), w2 (emb, hid), b2 (emb), alpha (1),
//        wo (dphi, emb), bo (dphi);  log phi(x) = wo g1 + bo, g1 = g0 + alpha * (w2 gelu(w1 g0 + b1)
//        + b2), g0 = ws x + bs.
//   PRF: w (dphi, in);  log phi(x) = w x~ - |x~|^2 / 2 - log(dphi) / 2, x~ = x / in^(1/4).
typedef struct phi_maps {
    int kind, n_layer, n_head, n_kv_head, d_in, d_emb, d_hid, d_phi;
    float *q;   // (n_layer, n_head, n_par)
    float *k;   // (n_layer, n_kv_head, n_par)
    int n_ctx;  // fitted maps: tokens of the fit's prefill (positions it saw); 0 = unknown
    char verdict[320];   // fit-phi's end-to-end check, one line ("" = none recorded)
} phi_maps;

// The summary of one KV head over a region of n entries.
typedef struct phi_summary {
    int n;          // entries summarised
    float *m;       // (d_phi,) max log phi_k over the region
    float *u;       // (d_phi,) sum exp(log phi_k - m)
    float *t;       // (d_phi, hd) sum exp(log phi_k - m) v
    // [D] log phi_k of the keys decode has retrieved, memoised (CPU): keys and maps are fixed for
    // the request, and a key stays in the top K for many steps and query heads. slot[i] = row of
    // feat (d_phi floats each) holding cache entry i, -1 if not computed; n_slot entries covered.
    int *slot, n_slot, n_feat, cap_feat;
    float *feat;
} phi_summary;

// What decode attention needs to complete a selection: the maps and layer, and one summary per
// KV head over a region that contains the first n_sub selected entries of every query head.
typedef struct phi_completion {
    const phi_maps *maps;
    int layer;
    phi_summary *sum;   // (n_kv_head,); the CPU backend memoises retrieved keys' features in it
    // The same in backend memory (what a GPU reads; phi_summary_flat's layout for dsum): the
    // maps' parameters (maps->q, maps->k as laid out there) and this layer's summaries.
    const float *par_q, *par_k, *dsum;
} phi_completion;
// Floats of one layer's summaries in backend memory: m (n_kv_head, d_phi), then u
// (n_kv_head, d_phi), then t (n_kv_head, d_phi, hd).
static inline size_t phi_summary_flat(int n_kv_head, int d_phi, int hd) {
    return (size_t)n_kv_head * d_phi * (hd + 2);
}

#define PHI_EPS 1e-6f   // clamp of u~ after subtraction (units of the largest term, exp(0) = 1)

int phi_n_par(const phi_maps *p);
const float *phi_par_q(const phi_maps *p, int layer, int head);
const float *phi_par_k(const phi_maps *p, int layer, int kv_head);
// Training-free positive random features: per layer and KV head a Gaussian matrix with
// orthogonal rows (blocks of d_in), seeded; each query head uses its KV head's matrix.
phi_maps *phi_maps_prf(int n_layer, int n_head, int n_kv_head, int d_in, int d_phi, uint64_t seed);
// Zero-initialised maps of the given kind and sizes (shape's q, k ignored).
phi_maps *phi_maps_alloc(const phi_maps *shape);
// Zero-initialised MLP maps (ReZero alpha = 0); parameters to be filled by a fit or a file.
phi_maps *phi_maps_mlp(int n_layer, int n_head, int n_kv_head, int d_in, int d_emb, int d_hid,
                       int d_phi);
void phi_maps_free(phi_maps *p);
// [D] Adds delta to log phi_q of every query head (the MLP's output bias bo): every estimate
// of the completion's mass is multiplied by e^delta. Fitted (MLP) maps only.
void phi_maps_shift_q(phi_maps *p, float delta);

// out (n, d_phi) = log phi of the rows of x (n, d_in; row stride `stride` floats), with
// parameter block par: a few sgemms over the batch.
void phi_log_features_rows(const phi_maps *p, const float *par, const float *x, int n, int stride,
                           float *out);
// out (d_phi,) = log phi(x (d_in,)): the same for one row
void phi_log_features(const phi_maps *p, const float *par, const float *x, float *out);

// The MLP map on a batch, with its activations kept (fit/phi_fit.c backpropagates through them).
typedef struct phi_mlp_view {   // one parameter block's matrices (layout above)
    float *ws, *bs, *w1, *b1, *w2, *b2, *alpha, *wo, *bo;
} phi_mlp_view;
typedef struct phi_mlp_acts {   // activations of n rows
    int n;
    float *g0, *z, *a, *dd, *g1, *y;   // (n, e) (n, h) (n, h) (n, e) (n, e) (n, d_phi)
} phi_mlp_acts;
phi_mlp_view phi_mlp_params(const phi_maps *p, const float *par);
phi_mlp_acts phi_mlp_acts_alloc(const phi_maps *p, int n);
void phi_mlp_acts_free(phi_mlp_acts *a);
// a->y = log phi(x) for x (a->n, d_in; row stride `stride`): g0 = Ws x + bs; z = W1 g0 + b1;
// a = gelu(z); dd = W2 a + b2; g1 = g0 + alpha dd; y = Wo g1 + bo
void phi_mlp_forward(const phi_maps *p, const float *par, const float *x, int stride,
                     phi_mlp_acts *a);

// Single-pass stable summary of keys k and values v (n, hd) with row stride `stride` floats:
// running max per feature, earlier sums rescaled by exp(m_old - m_new) when it rises.
void phi_summary_build(phi_summary *s, const phi_maps *p, const float *par, const float *k,
                       const float *v, int n, int hd, int stride);
phi_summary phi_summary_alloc(int d_phi, int hd);
// Makes s hold log phi_k of rows idx[0..n) of k (row stride hd), computing the missing ones in
// one batch. Not thread-safe per summary: one caller per KV head.
void phi_summary_memo(phi_summary *s, const phi_maps *p, const float *par_k, const float *k,
                      const int *idx, int n, int hd);
// Bytes the memo holds.
size_t phi_summary_memo_bytes(const phi_summary *s, int d_phi);
void phi_summary_free(phi_summary *s);

// Decode attention of one query head (fp32). q (hd,) . K (n_sel rows idx[]) -> y (hd,):
// the exact set E = rows idx[0..n_sel) of k, v (row stride hd); without completion
// y = softmax over E @ v. With a summary s of a region R0 (and c's maps, q parameters par_q,
// k parameters par_k) holding idx[0..n_sub), R0's top n_sub by score: the rest R0 \ idx[0..n_sub)
// is estimated from s minus the retrieved rows, its mass clamped to the top-K bound
// (s->n - n_sub) exp(lowest retrieved score) [D], and merged with E by one normalisation in the
// log domain.
void phi_attend_head(float *y, const float *q, const float *k, const float *v, const int *idx,
                     int n_sel, int hd, int n_sub, const phi_maps *p, const float *par_q,
                     const float *par_k, const phi_summary *s);

// ---- the .phi file (attn/phi_file.c): fitted maps next to the model ----
// Little-endian: magic "SIFTPHI\0", u32 version (1), u32 kind, n_layer, n_head, n_kv_head, d_in,
// d_emb, d_hid, d_phi, n_ctx (0 = unknown; files before it had 0 there); then float32 q parameters (n_layer, n_head, n_par) and k parameters
// (n_layer, n_kv_head, n_par); then optionally fit-phi's verdict: u32 length (1..319) and that
// many printable ASCII bytes. Every size is checked against the length; values must be finite.
int phi_maps_save(const phi_maps *p, const char *path, char *err, size_t errlen);
phi_maps *phi_maps_load(const char *path, char *err, size_t errlen);
// The same from memory (name for messages). NULL + one-line err on any malformed input.
phi_maps *phi_maps_parse(const void *buf, size_t len, const char *name, char *err, size_t errlen);

// A standard normal draw from a splitmix64 state.
double phi_gauss(uint64_t *state);
