// attn/phi_cpu.c — feature maps, summaries and completed decode attention on the CPU (fp32,
// accumulations in double where a sum runs over the sequence). Reads like specs/topk-phi.md.
#include "phi.h"

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
                                 NULL, NULL, 0});
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
                                        NULL, NULL, 0});
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

// y (o,) = W (o, i) x (i,) + b (o,)   (b may be NULL)
static void affine(float *y, const float *w, const float *b, const float *x, int o, int i) {
    for (int r = 0; r < o; r++) {
        float acc = b ? b[r] : 0;
        for (int j = 0; j < i; j++) acc += w[(size_t)r * i + j] * x[j];
        y[r] = acc;
    }
}

static float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678f)); }

void phi_log_features(const phi_maps *p, const float *par, const float *x, float *out) {
    int d = p->d_in, e = p->d_emb, h = p->d_hid, f = p->d_phi;
    if (p->kind == PHI_PRF) {   // x~ = x / d^(1/4): w x~ - |x~|^2 / 2 - log(f) / 2
        float sc = 1.0f / sqrtf(sqrtf((float)d)), nrm = 0;
        for (int j = 0; j < d; j++) nrm += (x[j] * sc) * (x[j] * sc);
        affine(out, par, NULL, x, f, d);
        for (int r = 0; r < f; r++) out[r] = out[r] * sc - 0.5f * nrm - 0.5f * logf((float)f);
        return;
    }
    const float *ws = par, *bs = ws + e * d, *w1 = bs + e, *b1 = w1 + h * e, *w2 = b1 + h;
    const float *b2 = w2 + e * h, *alpha = b2 + e, *wo = alpha + 1, *bo = wo + f * e;
    float g0[e], a1[h], dd[e];
    affine(g0, ws, bs, x, e, d);
    affine(a1, w1, b1, g0, h, e);
    for (int j = 0; j < h; j++) a1[j] = gelu(a1[j]);
    affine(dd, w2, b2, a1, e, h);
    for (int j = 0; j < e; j++) g0[j] += *alpha * dd[j];   // g1
    affine(out, wo, bo, g0, f, e);
}

phi_summary phi_summary_alloc(int d_phi, int hd) {
    phi_summary s = {0, xmalloc((size_t)d_phi * sizeof(float)), xcalloc((size_t)d_phi, sizeof(float)),
                     xcalloc((size_t)d_phi * hd, sizeof(float))};
    for (int f = 0; f < d_phi; f++) s.m[f] = -INFINITY;
    return s;
}

void phi_summary_free(phi_summary *s) {
    free(s->m);
    free(s->u);
    free(s->t);
}

// m, u~, T~ over rows 0..n: a running max per feature; when a key's log feature a exceeds m,
// the sums so far are rescaled by exp(m - a) and the key enters with weight 1.
void phi_summary_build(phi_summary *s, const phi_maps *p, const float *par, const float *k,
                       const float *v, int n, int hd, int stride) {
    int nf = p->d_phi;
    float a[nf];
    for (int i = 0; i < n; i++) {
        const float *vi = v + (size_t)i * stride;
        phi_log_features(p, par, k + (size_t)i * stride, a);
        for (int f = 0; f < nf; f++) {
            float *tf = s->t + (size_t)f * hd, w = 1.0f;
            if (a[f] > s->m[f]) {
                float r = s->m[f] == -INFINITY ? 0.0f : expf(s->m[f] - a[f]);
                s->u[f] *= r;
                for (int j = 0; j < hd; j++) tf[j] *= r;
                s->m[f] = a[f];
            } else
                w = expf(a[f] - s->m[f]);
            s->u[f] += w;
            for (int j = 0; j < hd; j++) tf[j] += w * vi[j];
        }
    }
    s->n += n;
}

// log Z_E and y_E = softmax(s_E) @ v over the exact set
static float exact_part(float *y, const float *q, const float *k, const float *v, const int *idx,
                        int n, int hd) {
    float sc[n], mx = -INFINITY, scale = 1.0f / sqrtf((float)hd);
    for (int i = 0; i < n; i++) {   // q (hd,) . K (n, hd) -> s (n,)
        const float *ki = k + (size_t)idx[i] * hd;
        float dot = 0;
        for (int j = 0; j < hd; j++) dot += q[j] * ki[j];
        sc[i] = dot * scale;
        mx = sc[i] > mx ? sc[i] : mx;
    }
    double z = 0;
    double acc[hd];
    memset(acc, 0, sizeof acc);
    for (int i = 0; i < n; i++) {   // softmax (n,) @ V (n, hd) -> y (hd,)
        double w = exp(sc[i] - mx);
        const float *vi = v + (size_t)idx[i] * hd;
        z += w;
        for (int j = 0; j < hd; j++) acc[j] += w * vi[j];
    }
    for (int j = 0; j < hd; j++) y[j] = (float)(acc[j] / z);
    return mx + (float)log(z);
}

// log Z^_R and y^_R from the summary minus the retrieved rows idx[0..n_sub)
static float completion_part(float *y, const float *q, const float *k, const float *v,
                             const int *idx, int n_sub, int hd, const phi_maps *p,
                             const float *par_q, const float *par_k, const phi_summary *s) {
    int nf = p->d_phi;
    float lq[nf], ak[nf], uk[nf], a[nf];
    float *tk = xcalloc((size_t)nf * hd, sizeof(float));
    memset(uk, 0, sizeof uk);
    for (int i = 0; i < n_sub; i++) {   // u~_K, T~_K with the cache's shift m
        const float *vi = v + (size_t)idx[i] * hd;
        phi_log_features(p, par_k, k + (size_t)idx[i] * hd, ak);
        for (int f = 0; f < nf; f++) {
            float w = expf(ak[f] - s->m[f]);
            uk[f] += w;
            for (int j = 0; j < hd; j++) tk[(size_t)f * hd + j] += w * vi[j];
        }
    }
    phi_log_features(p, par_q, q, lq);
    float amax = -INFINITY;
    for (int f = 0; f < nf; f++) {   // a_f = log phi_q + m + log u~_R
        uk[f] = fmaxf(s->u[f] - uk[f], PHI_EPS);   // u~_R
        a[f] = lq[f] + s->m[f] + logf(uk[f]);
        amax = a[f] > amax ? a[f] : amax;
    }
    double z = 0, acc[hd];
    memset(acc, 0, sizeof acc);
    for (int f = 0; f < nf; f++) {   // softmax_f(a) @ (T~_R / u~_R)
        double w = exp(a[f] - amax);
        z += w;
        for (int j = 0; j < hd; j++)
            acc[j] += w * (s->t[(size_t)f * hd + j] - tk[(size_t)f * hd + j]) / uk[f];
    }
    for (int j = 0; j < hd; j++) y[j] = (float)(acc[j] / z);
    free(tk);
    return amax + (float)log(z);
}

void phi_attend_head(float *y, const float *q, const float *k, const float *v, const int *idx,
                     int n_sel, int hd, int n_sub, const phi_maps *p, const float *par_q,
                     const float *par_k, const phi_summary *s) {
    float ye[hd], yr[hd];
    float lze = n_sel > 0 ? exact_part(ye, q, k, v, idx, n_sel, hd) : -INFINITY;
    if (!s || s->n <= n_sub) {   // nothing left to estimate: selection only, renormalised
        for (int j = 0; j < hd; j++) y[j] = n_sel > 0 ? ye[j] : 0.0f;
        return;
    }
    float lzr = completion_part(yr, q, k, v, idx, n_sub, hd, p, par_q, par_k, s);
    float mx = lze > lzr ? lze : lzr;   // (N_E + N^_R) / (Z_E + Z^_R), weights exp(log Z - M*)
    float we = n_sel > 0 ? expf(lze - mx) : 0.0f, wr = expf(lzr - mx);
    for (int j = 0; j < hd; j++) y[j] = (we * (n_sel > 0 ? ye[j] : 0.0f) + wr * yr[j]) / (we + wr);
}
