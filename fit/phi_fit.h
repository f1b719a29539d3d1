// fit/phi_fit.h — fitting topk+phi's MLP feature maps offline (what `sift fit-phi` runs, cmd/
// fit_phi.c): distillation on logged queries and keys of one KV group (specs/topk-phi.md,
// "Training the maps"), then calibration and the gate (phi_fit.c), and the held-out end-to-end
// check against full attention (phi_check.c). The maps themselves, their kernels and the .phi
// file are attention's (attn/phi.h); decode reads them in policies/topk_phi.c.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "../attn/phi.h"
#include "../model/forward.h"

// One KV group's data: keys (n_keys, hd) post-RoPE from full attention; queries (n_q, hd) of the
// group's heads (head[i] in [0, group)); query i's support (mid region) is keys [lo, end[i]).
typedef struct phi_fit_set {
    int hd, group, lo, n_keys, n_q;
    const float *k, *q;
    const int *head, *end;
    // [D] Position augmentation (shift_max > 0): each minibatch rotates every key and query as
    // RoPE would for positions shifted by one seeded delta in [0, shift_max] (q.k is unchanged:
    // RoPE is relative; the maps see the absolute angles of later positions), and every other
    // minibatch the queries by a further seeded amount up to shift_max - delta (the same keys
    // seen from farther away: the teacher's scores change, the relative distances of a longer
    // prompt than the logged one).
    const float *inv_freq;   // (hd / 2,) the model's RoPE inverse frequencies
    int rope_neox, shift_max;
} phi_fit_set;

// theta ((group + 1) * n_par): the group's q maps, then its k map (kind MLP, shape p).
// The spec's loss 0.99 KL + 0.01 (top + 2 far + 4 Z) (tau = 1, Huber delta 1) averaged over
// queries sel (nsel,); grad (same shape as theta, accumulated) if not NULL; *kl = mean KL.
double phi_fit_loss(const phi_maps *p, float *theta, const phi_fit_set *d, const int *sel,
                    int nsel, float *grad, double *kl);
// Mean KL(softmax(r) || softmax(r^)) over queries sel of any maps (par_q per group head);
// *mass_bias (may be NULL) = mean LSE(r^) - LSE(r), the log of estimated over true mass.
double phi_fit_kl(const phi_maps *p, const float *const *par_q, const float *par_k,
                  const phi_fit_set *d, const int *sel, int nsel, double *mass_bias);
// [D] After the fit: shift each query head's output bias so that its log-mass error over
// queries sel has mean -margin x its standard deviation (margin 0: unbiased; the KL term is
// blind to this per-query offset, and the completion adds absolute mass; a margin makes
// overestimates rare, as the spec's one-sided L_Z and L_fp terms intend). The error is measured
// where decode uses the maps: over each query's support minus its top ceil(frac * n) keys by
// true score (frac 0: the whole support). With d->shift_max > 0: the mean of the biases set at
// six shifts (keys and queries together by 0, 1/3, 2/3, all of shift_max; queries alone by half
// and all of it: the distances of a longer prompt).
void phi_fit_calibrate(const phi_maps *p, float *theta, const phi_fit_set *d, const int *sel,
                       int nsel, double frac, double margin);
// [D] The gate: per query head, the log-mass offset of PHI_GATE_DELTAS (PHI_GATE_OFF: the
// completion off, decode as topk) whose decode step is closest to full attention over queries
// sel: exact = the sink [0, lo), the tail [end, end + tail) and the top ceil(frac * n) of the
// support by true score, the rest estimated as decode does (the student kernel summed over it,
// times e^offset, clamped to the top-K bound); error = |y - y_full|^2 / |y_full|^2 summed over
// the queries and the shifts phi_fit_calibrate averages over. v (n_keys, hd): the values. Adds each head's
// offset to its output bias; chosen (group,) (may be NULL) receives them.
#define PHI_N_GATE 9
#define PHI_GATE_OFF (-60.0f)
extern const float PHI_GATE_DELTAS[PHI_N_GATE];
void phi_fit_gate(const phi_maps *p, float *theta, const phi_fit_set *d, const float *v, int tail,
                  const int *sel, int nsel, double frac, float *chosen);
// Mean log-mass error LSE(r^) - LSE(r) over the support minus each query's top ceil(frac * n)
// keys (by true score), over queries sel; par_q per group head; *spread (may be NULL) = its
// standard deviation over the queries.
double phi_fit_remainder_bias(const phi_maps *p, const float *const *par_q, const float *par_k,
                              const phi_fit_set *d, const int *sel, int nsel, double frac,
                              double *spread);
// Seeded start: g0 = x / d^(1/4), wo = random features, bo = -log(d_phi)/2, alpha = 0.
void phi_fit_init(const phi_maps *p, float *theta, int group, uint64_t seed);
// One Adam step (beta 0.9, 0.999) at step t >= 1.
void phi_fit_adam(float *theta, const float *grad, float *m, float *v, size_t n, int t, float lr);
// k_out (n_keys, hd), q_out (n_q, hd) = d's keys and queries rotated by RoPE angles delta *
// inv_freq (pairs (2j, 2j+1), or (j, j + hd/2) when rope_neox).
void phi_fit_rotate(const phi_fit_set *d, double delta, float *k_out, float *q_out);
// Fits theta with Adam for `steps` minibatches of `batch` queries drawn (seeded) from train
// (n_train,); on_step (may be NULL) sees each step's loss. Returns the last minibatch loss.
double phi_fit_run(const phi_maps *p, float *theta, const phi_fit_set *d, const int *train,
                   int n_train, int steps, int batch, float lr, uint64_t seed,
                   void (*on_step)(void *ctx, int step, double loss), void *ctx);

// The held-out check (phi_check.c): one prefill of ids[0..n-1) at positions pos0.. (RoPE is
// relative: a shift changes no score, only the angles the maps see); then full attention decodes
// `rows` steps (the prompt's last token, then its own greedy tokens) and, with n_free > 0,
// n_free free greedy steps. Regions as topk+phi's (sink, tail of the n - 1 prefilled tokens).
// NULL + err when it cannot run.
typedef struct topk_cmp topk_cmp;
topk_cmp *topk_cmp_begin(context *cx, const int *ids, int n, int pos0, int sink, int tail, int rows,
                         int n_free, char *err, size_t errlen);
// Full's greedy tokens: the forced ones (rows,), or (free_run) its free ones (n_free,).
const int *topk_cmp_full(const topk_cmp *c, int free_run);
// Decodes from the shared prefill with top-k retrieval (k mid entries per query head) and,
// with maps (borrowed; NULL: `topk`), their completion: full's tokens forced, kl (rows,) =
// KL(full || this) per row, *agree = share of rows whose argmax is full's; free_tok (n_free,)
// (may be NULL) = its own greedy tokens. The cache is rewound after each run, so maps may be
// changed between runs.
void topk_cmp_run(topk_cmp *c, const phi_maps *maps, int k, double *kl, double *agree, int *free_tok);
void topk_cmp_end(topk_cmp *c);
