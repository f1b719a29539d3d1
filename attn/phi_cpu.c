// attn/phi_cpu.c — feature maps, summaries and completed decode attention on the CPU (fp32,
// accumulations in double where a sum runs over the sequence). Reads like specs/topk-phi.md.
#include "phi.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"

int phi_n_par(const phi_maps *p) {
    if (p->kind == PHI_PRF) return p->d_phi * p->d_in;
    int e = p->d_emb, h = p->d_hid;
    return e * p->d_in + e + h * e + h + e * h + e + 1 + p->d_phi * e + p->d_phi;
}

const float *phi_par_q(const phi_maps *p, int layer, int head) {
    return p->q + ((size_t)layer * p->n_head + head) * phi_n_par(p);
}

const float *phi_par_k(const phi_maps *p, int layer, int kv_head) {
    return p->k + ((size_t)layer * p->n_kv_head + kv_head) * phi_n_par(p);
}

phi_maps *phi_maps_alloc(const phi_maps *shape) {
    phi_maps *p = xmalloc(sizeof *p);
    *p = *shape;
    size_t n = (size_t)phi_n_par(p);
    p->q = xcalloc((size_t)p->n_layer * p->n_head * n, sizeof(float));
    p->k = xcalloc((size_t)p->n_layer * p->n_kv_head * n, sizeof(float));
    return p;
}

phi_maps *phi_maps_mlp(int n_layer, int n_head, int n_kv_head, int d_in, int d_emb, int d_hid,
                       int d_phi) {
    return phi_maps_alloc(&(phi_maps){PHI_MLP, n_layer, n_head, n_kv_head, d_in, d_emb, d_hid, d_phi,
                                 NULL, NULL, 0, ""});
}

double phi_gauss(uint64_t *state) {   // splitmix64 -> two uniforms -> Box-Muller
    double u[2];
    for (int i = 0; i < 2; i++) {
        uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        u[i] = ((z >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

// w (rows, d): blocks of d orthonormal rows (Gram-Schmidt of Gaussian rows), each row then given
// the length of an independent Gaussian vector, so rows are marginally Gaussian.
static void orthogonal_gaussian(float *w, int rows, int d, uint64_t *state) {
    double *b = xmalloc((size_t)d * d * sizeof(double));
    for (int r0 = 0; r0 < rows; r0 += d) {
        for (int i = 0; i < d; i++) {
            double *bi = b + (size_t)i * d, nrm = 0;
            for (int j = 0; j < d; j++) bi[j] = phi_gauss(state);
            for (int p = 0; p < i; p++) {
                double dot = 0, *bp = b + (size_t)p * d;
                for (int j = 0; j < d; j++) dot += bi[j] * bp[j];
                for (int j = 0; j < d; j++) bi[j] -= dot * bp[j];
            }
            for (int j = 0; j < d; j++) nrm += bi[j] * bi[j];
            for (int j = 0; j < d; j++) bi[j] /= sqrt(nrm);
        }
        for (int i = 0; i < d && r0 + i < rows; i++) {
            double len = 0;
            for (int j = 0; j < d; j++) {
                double g = phi_gauss(state);
                len += g * g;
            }
            for (int j = 0; j < d; j++) w[(size_t)(r0 + i) * d + j] = (float)(b[(size_t)i * d + j] * sqrt(len));
        }
    }
    free(b);
}

phi_maps *phi_maps_prf(int n_layer, int n_head, int n_kv_head, int d_in, int d_phi, uint64_t seed) {
    phi_maps *p = phi_maps_alloc(&(phi_maps){PHI_PRF, n_layer, n_head, n_kv_head, d_in, 0, 0, d_phi,
                                        NULL, NULL, 0, ""});
    size_t n = (size_t)phi_n_par(p);
    int group = n_head / n_kv_head;
    uint64_t state = seed;
    for (int l = 0; l < n_layer; l++)
        for (int g = 0; g < n_kv_head; g++) {
            float *wk = p->k + ((size_t)l * n_kv_head + g) * n;
            orthogonal_gaussian(wk, d_phi, d_in, &state);
            for (int j = 0; j < group; j++)
                memcpy(p->q + ((size_t)l * n_head + g * group + j) * n, wk, n * sizeof(float));
        }
    return p;
}

void phi_maps_free(phi_maps *p) {
    if (!p) return;
    free(p->q);
    free(p->k);
    free(p);
}

void phi_maps_shift_q(phi_maps *p, float delta) {
    CHECK_INTERNAL(p->kind == PHI_MLP, "phi_maps_shift_q: only fitted (MLP) maps have an output bias");
    for (int i = 0; i < p->n_layer * p->n_head; i++) {
        phi_mlp_view w = phi_mlp_params(p, p->q + (size_t)i * phi_n_par(p));
        for (int f = 0; f < p->d_phi; f++) w.bo[f] += delta;
    }
}

phi_mlp_view phi_mlp_params(const phi_maps *p, const float *par) {
    int d = p->d_in, e = p->d_emb, h = p->d_hid, f = p->d_phi;
    phi_mlp_view v;
    v.ws = (float *)par, v.bs = v.ws + e * d, v.w1 = v.bs + e, v.b1 = v.w1 + h * e, v.w2 = v.b1 + h;
    v.b2 = v.w2 + e * h, v.alpha = v.b2 + e, v.wo = v.alpha + 1, v.bo = v.wo + f * e;
    return v;
}

phi_mlp_acts phi_mlp_acts_alloc(const phi_maps *p, int n) {
    size_t e = p->d_emb, h = p->d_hid, f = p->d_phi, r = n > 0 ? n : 1;
    return (phi_mlp_acts){n, xmalloc(r * e * 4), xmalloc(r * h * 4), xmalloc(r * h * 4),
                          xmalloc(r * e * 4), xmalloc(r * e * 4), xmalloc(r * f * 4)};
}

void phi_mlp_acts_free(phi_mlp_acts *a) {
    free(a->g0), free(a->z), free(a->a), free(a->dd), free(a->g1), free(a->y);
}

// out (n, o) = x (n, i; row stride ldx) @ W (o, i)^T + b (o,)
static void linear(float *out, const float *x, int ldx, const float *w, const float *b, int n,
                   int i, int o) {
    for (int r = 0; r < n; r++) memcpy(out + (size_t)r * o, b, o * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, o, i, 1.0f, x, ldx, w, i, 1.0f, out, o);
}

void phi_mlp_forward(const phi_maps *p, const float *par, const float *x, int stride,
                     phi_mlp_acts *a) {
    int n = a->n, d = p->d_in, e = p->d_emb, h = p->d_hid, f = p->d_phi;
    if (n <= 0) return;
    phi_mlp_view w = phi_mlp_params(p, par);
    linear(a->g0, x, stride, w.ws, w.bs, n, d, e);   // g0 = Ws x + bs
    linear(a->z, a->g0, e, w.w1, w.b1, n, e, h);
    for (size_t i = 0; i < (size_t)n * h; i++) a->a[i] = 0.5f * a->z[i] * (1.0f + erff(a->z[i] * 0.70710678f));
    linear(a->dd, a->a, h, w.w2, w.b2, n, h, e);     // D = W2 gelu(W1 g0 + b1) + b2
    for (size_t i = 0; i < (size_t)n * e; i++) a->g1[i] = a->g0[i] + *w.alpha * a->dd[i];
    linear(a->y, a->g1, e, w.wo, w.bo, n, e, f);     // log phi = Wo g1 + bo
}

void phi_log_features_rows(const phi_maps *p, const float *par, const float *x, int n, int stride,
                           float *out) {
    int d = p->d_in, f = p->d_phi;
    if (n <= 0) return;
    if (p->kind == PHI_PRF) {   // x~ = x / d^(1/4): w x~ - |x~|^2 / 2 - log(f) / 2
        float sc = 1.0f / sqrtf(sqrtf((float)d));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, f, d, sc, x, stride, par, d, 0.0f,
                    out, f);
        for (int r = 0; r < n; r++) {
            const float *xr = x + (size_t)r * stride;
            float nrm = 0;
            for (int j = 0; j < d; j++) nrm += (xr[j] * sc) * (xr[j] * sc);
            for (int c = 0; c < f; c++) out[(size_t)r * f + c] -= 0.5f * nrm + 0.5f * logf((float)f);
        }
        return;
    }
    phi_mlp_acts a = phi_mlp_acts_alloc(p, n);
    phi_mlp_forward(p, par, x, stride, &a);
    memcpy(out, a.y, (size_t)n * f * sizeof(float));
    phi_mlp_acts_free(&a);
}

void phi_log_features(const phi_maps *p, const float *par, const float *x, float *out) {
    phi_log_features_rows(p, par, x, 1, p->d_in, out);
}

phi_summary phi_summary_alloc(int d_phi, int hd) {
    phi_summary s = {.m = xmalloc((size_t)d_phi * sizeof(float)),
                     .u = xcalloc((size_t)d_phi, sizeof(float)),
                     .t = xcalloc((size_t)d_phi * hd, sizeof(float))};
    for (int f = 0; f < d_phi; f++) s.m[f] = -INFINITY;
    return s;
}

void phi_summary_free(phi_summary *s) {
    free(s->m);
    free(s->u);
    free(s->t);
    free(s->slot);
    free(s->feat);
}

#define PHI_ROWS 256   // keys per batch of feature maps

// m, u~, T~ over rows 0..n: a running max per feature; when a key's log feature a exceeds m,
// the sums so far are rescaled by exp(m - a) and the key enters with weight 1.
// expf(x) for x <= 0, but 0 where it would underflow (x <= -87: below 1.7e-38 of the largest
// term, exp(0) = 1, which every sum here holds): libm's expf takes a slow path that sets errno for
// those, and the random features' log values put most (key, feature) pairs there (perf: 3 % of
// topk+phi's whole 1B-shape run at 4,096 tokens was expf and its underflow path).
static inline float exp_le0(float x) { return x > -87.0f ? expf(x) : 0.0f; }

void phi_summary_build(phi_summary *s, const phi_maps *p, const float *par, const float *k,
                       const float *v, int n, int hd, int stride) {
    int nf = p->d_phi;
    float *feats = xmalloc((size_t)PHI_ROWS * nf * sizeof(float));
    for (int i0 = 0; i0 < n; i0 += PHI_ROWS) {
        int nb = n - i0 < PHI_ROWS ? n - i0 : PHI_ROWS;
        phi_log_features_rows(p, par, k + (size_t)i0 * stride, nb, stride, feats);
        for (int i = 0; i < nb; i++) {
            const float *vi = v + (size_t)(i0 + i) * stride, *a = feats + (size_t)i * nf;
            for (int f = 0; f < nf; f++) {
                float *tf = s->t + (size_t)f * hd, w = 1.0f;
                if (a[f] > s->m[f]) {
                    float r = s->m[f] == -INFINITY ? 0.0f : exp_le0(s->m[f] - a[f]);
                    s->u[f] *= r;
                    for (int j = 0; j < hd; j++) tf[j] *= r;
                    s->m[f] = a[f];
                } else
                    w = exp_le0(a[f] - s->m[f]);
                s->u[f] += w;
                for (int j = 0; j < hd; j++) tf[j] += w * vi[j];
            }
        }
    }
    free(feats);
    s->n += n;
}

void phi_summary_memo(phi_summary *s, const phi_maps *p, const float *par_k, const float *k,
                      const int *idx, int n, int hd) {
    int nf = p->d_phi, n_new = 0, top = 0;
    for (int i = 0; i < n; i++) top = idx[i] + 1 > top ? idx[i] + 1 : top;
    if (top > s->n_slot) {   // cover entries up to the largest index
        s->slot = xrealloc(s->slot, (size_t)top * sizeof(int));
        for (int i = s->n_slot; i < top; i++) s->slot[i] = -1;
        s->n_slot = top;
    }
    int *miss = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    for (int i = 0; i < n; i++)   // claim a row for each key not yet held (-2: claimed now)
        if (s->slot[idx[i]] == -1) s->slot[idx[i]] = -2, miss[n_new++] = idx[i];
    if (n_new > 0) {
        if (s->n_feat + n_new > s->cap_feat) {
            s->cap_feat = (s->n_feat + n_new) * 2;
            s->feat = xrealloc(s->feat, (size_t)s->cap_feat * nf * sizeof(float));
        }
        float *rows = xmalloc((size_t)n_new * hd * sizeof(float));   // gathered keys (n_new, hd)
        for (int i = 0; i < n_new; i++)
            memcpy(rows + (size_t)i * hd, k + (size_t)miss[i] * hd, (size_t)hd * sizeof(float));
        phi_log_features_rows(p, par_k, rows, n_new, hd, s->feat + (size_t)s->n_feat * nf);
        for (int i = 0; i < n_new; i++) s->slot[miss[i]] = s->n_feat + i;
        s->n_feat += n_new;
        free(rows);
    }
    free(miss);
}

size_t phi_summary_memo_bytes(const phi_summary *s, int d_phi) {
    return (size_t)s->n_slot * sizeof(int) + (size_t)s->cap_feat * d_phi * sizeof(float);
}

// log Z_E and y_E = softmax(s_E) @ v over the exact set
// Returns log Z_E; *smin (may be NULL) = the lowest score among the first n_sub entries.
static float exact_part(float *y, const float *q, const float *k, const float *v, const int *idx,
                        int n, int hd, int n_sub, float *smin) {
    float sc[n], mx = -INFINITY, scale = 1.0f / sqrtf((float)hd);
    for (int i = 0; i < n; i++) {   // q (hd,) . K (n, hd) -> s (n,), in vector lanes
        const float *ki = k + (size_t)idx[i] * hd;
        float dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int j = 0; j < hd; j++) dot += q[j] * ki[j];
        sc[i] = dot * scale;
        mx = sc[i] > mx ? sc[i] : mx;
    }
    if (smin) {
        *smin = INFINITY;
        for (int i = 0; i < n_sub && i < n; i++) *smin = sc[i] < *smin ? sc[i] : *smin;
    }
    double z = 0;
    double acc[hd];
    memset(acc, 0, sizeof acc);
    for (int i = 0; i < n; i++) {   // softmax (n,) @ V (n, hd) -> y (hd,)
        // (below -708 exp underflows through libm's slow path; a weight under 1e-307 against
        // the largest one's 1 changes neither z nor acc)
        float d = sc[i] - mx;
        double w = d < -708 ? 0 : exp(d);
        const float *vi = v + (size_t)idx[i] * hd;
        z += w;
#pragma omp simd
        for (int j = 0; j < hd; j++) acc[j] += w * vi[j];
    }
    for (int j = 0; j < hd; j++) y[j] = (float)(acc[j] / z);
    return mx + (float)log(z);
}

// log Z^_R and y^_R from the summary minus the retrieved rows idx[0..n_sub). With
// w_if = exp(log phi_k(k_i)[f] - m[f]) and c_f = exp(a_f - max a) / u~_R[f]:
//   Z^_R y^_R ~ sum_f c_f (T~_M[f] - sum_i w_if v_i) = sum_f c_f T~_M[f] - sum_i (sum_f c_f w_if) v_i,
// the right-hand side costing n_sub (d_phi + hd) instead of n_sub d_phi hd.
static float completion_part(float *y, const float *q, const float *k, const float *v,
                             const int *idx, int n_sub, int hd, const phi_maps *p,
                             const float *par_q, const float *par_k, const phi_summary *s) {
    int nf = p->d_phi;
    float lq[nf], ur[nf], a[nf], ak[nf];
    double c[nf];
    float *w = xmalloc((size_t)(n_sub > 0 ? n_sub : 1) * nf * sizeof(float));   // (n_sub, nf)
    memset(ur, 0, sizeof ur);
    for (int i = 0; i < n_sub; i++) {   // u~_K with the cache's shift m
        int e = idx[i];
        const float *lk = ak;
        if (e < s->n_slot && s->slot[e] >= 0)
            lk = s->feat + (size_t)s->slot[e] * nf;
        else
            phi_log_features(p, par_k, k + (size_t)e * hd, ak);
        for (int f = 0; f < nf; f++) ur[f] += w[(size_t)i * nf + f] = exp_le0(lk[f] - s->m[f]);
    }
    phi_log_features(p, par_q, q, lq);
    float amax = -INFINITY;
    for (int f = 0; f < nf; f++) {   // a_f = log phi_q + m + log u~_R
        ur[f] = fmaxf(s->u[f] - ur[f], PHI_EPS);   // u~_R
        a[f] = lq[f] + s->m[f] + logf(ur[f]);
        amax = a[f] > amax ? a[f] : amax;
    }
    double z = 0, acc[hd];
    memset(acc, 0, sizeof acc);
    for (int f = 0; f < nf; f++) {   // softmax_f(a) @ (T~_R / u~_R), unnormalised: c_f T~_M[f]
        double e = exp(a[f] - amax);
        z += e;
        c[f] = e / ur[f];
        for (int j = 0; j < hd; j++) acc[j] += c[f] * s->t[(size_t)f * hd + j];
    }
    for (int i = 0; i < n_sub; i++) {   // minus (sum_f c_f w_if) v_i
        const float *vi = v + (size_t)idx[i] * hd;
        double ci = 0;
        for (int f = 0; f < nf; f++) ci += c[f] * w[(size_t)i * nf + f];
        for (int j = 0; j < hd; j++) acc[j] -= ci * vi[j];
    }
    for (int j = 0; j < hd; j++) y[j] = (float)(acc[j] / z);
    free(w);
    return amax + (float)log(z);
}

void phi_attend_head(float *y, const float *q, const float *k, const float *v, const int *idx,
                     int n_sel, int hd, int n_sub, const phi_maps *p, const float *par_q,
                     const float *par_k, const phi_summary *s) {
    float ye[hd], yr[hd], smin = INFINITY;
    float lze = n_sel > 0 ? exact_part(ye, q, k, v, idx, n_sel, hd, n_sub, &smin) : -INFINITY;
    if (!s || s->n <= n_sub) {   // nothing left to estimate: selection only, renormalised
        for (int j = 0; j < hd; j++) y[j] = n_sel > 0 ? ye[j] : 0.0f;
        return;
    }
    float lzr = completion_part(yr, q, k, v, idx, n_sub, hd, p, par_q, par_k, s);
    // [D] The top-K bound: the first n_sub entries are the region's top K by exact score, so each
    // of the s->n - n_sub left has a score <= the lowest of them: Z_R <= (n - n_sub) e^smin. An
    // estimate above that bound is wrong by construction; it is clamped to it.
    if (n_sub > 0) lzr = fminf(lzr, logf((float)(s->n - n_sub)) + smin);
    float mx = lze > lzr ? lze : lzr;   // (N_E + N^_R) / (Z_E + Z^_R), weights exp(log Z - M*)
    float we = n_sel > 0 ? expf(lze - mx) : 0.0f, wr = expf(lzr - mx);
    for (int j = 0; j < hd; j++) y[j] = (we * (n_sel > 0 ? ye[j] : 0.0f) + wr * yr[j]) / (we + wr);
}
