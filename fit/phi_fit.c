// fit/phi_fit.c — distillation of the MLP feature maps (specs/topk-phi.md, "Training the
// maps"): the spec's loss on logged queries/keys of one KV group, its gradient by hand-written
// backpropagation through r^_j = LSE_f(log phi_q(q)_f + log phi_k(k_j)_f) - b and the two MLPs
// (batched with sgemm), Adam, and the held-out KL used to report fit quality.
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../attn/score.h"
#include "../util/check.h"
#include "../util/fastexp.h"
#include "phi_fit.h"

#define FAR_BAND (-8.0)

// dW (o, i) += dy (n, o)^T @ x (n, i);  db (o,) += sum_rows dy
static void linear_grad(float *dw, float *db, const float *dy, const float *x, int n, int i, int o) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o, i, n, 1.0f, dy, o, x, i, 1.0f, dw, i);
    for (int r = 0; r < n; r++)
        for (int j = 0; j < o; j++) db[j] += dy[(size_t)r * o + j];
}

// grad (parameter block) += d loss / d par, given dy = d loss / d y (n, f)
static void mlp_backward(const phi_maps *p, float *par, float *grad, const float *x,
                         const phi_mlp_acts *a, const float *dy) {
    int n = a->n, d = p->d_in, e = p->d_emb, h = p->d_hid, f = p->d_phi;
    phi_mlp_view w = phi_mlp_params(p, par), g = phi_mlp_params(p, grad);
    float *dg1 = xmalloc((size_t)n * e * 4), *dz = xmalloc((size_t)n * h * 4);
    float *dd = xmalloc((size_t)n * e * 4);
    linear_grad(g.wo, g.bo, dy, a->g1, n, e, f);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, e, f, 1.0f, dy, f, w.wo, e, 0.0f, dg1, e);
    double dalpha = 0;
    for (size_t i = 0; i < (size_t)n * e; i++) {
        dalpha += (double)dg1[i] * a->dd[i];
        dd[i] = *w.alpha * dg1[i];
    }
    *g.alpha += (float)dalpha;
    linear_grad(g.w2, g.b2, dd, a->a, n, h, e);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, h, e, 1.0f, dd, e, w.w2, h, 0.0f, dz, h);
    for (size_t i = 0; i < (size_t)n * h; i++) {   // gelu'(z) = Phi(z) + z phi(z)
        float z = a->z[i];
        dz[i] *= 0.5f * (1.0f + erff(z * 0.70710678f)) + z * 0.39894228f * expf(-0.5f * z * z);
    }
    linear_grad(g.w1, g.b1, dz, a->g0, n, e, h);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, e, h, 1.0f, dz, h, w.w1, e, 1.0f, dg1, e);
    linear_grad(g.ws, g.bs, dg1, x, n, d, e);   // dg1 now holds d loss / d g0
    free(dg1), free(dz), free(dd);
}

// q . k / sqrt(hd), accumulated in double
static double dot_scaled(const float *q, const float *k, int hd) {
    double dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int c = 0; c < hd; c++) dot += (double)q[c] * k[c];
    return dot / sqrt((double)hd);
}

// log sum_c exp(a_c + b_c) over f features (the student's log kernel); e (may be NULL) =
// softmax_c(a_c + b_c). In float, the exp 8 lanes at a time (exp8_sum: GCC keeps a loop over
// exp_nonpos scalar).
static double lse_sum(const float *a, const float *b, int f, float *e) {
    float mx = -INFINITY, z = 0, t[f];
#pragma omp simd reduction(max : mx)
    for (int c = 0; c < f; c++) mx = a[c] + b[c] > mx ? a[c] + b[c] : mx;
#if defined(__AVX2__)
#pragma omp simd
    for (int c = 0; c < f; c++) t[c] = a[c] + b[c];
    z = exp8_sum(t, t, f, mx);
#else
    for (int c = 0; c < f; c++) {
        t[c] = exp_nonpos(a[c] + b[c] - mx);
        z += t[c];
    }
#endif
    if (e)
        for (int c = 0; c < f; c++) e[c] = t[c] / z;
    return mx + log((double)z);
}

static double huber(double x) { return fabs(x) <= 1 ? 0.5 * x * x : fabs(x) - 0.5; }
static double huber_grad(double x) { return x > 1 ? 1 : x < -1 ? -1 : x; }

// One query: teacher r = s - b, student r^ = t - b (n,). Returns the spec's loss; g (n,) =
// d loss / d r^; *kl = its KL term; *mass = LSE(r^) - LSE(r) (log of estimated / true mass). tau = 1.
static double query_loss(const double *r, const double *rh, int n, double *g, double *kl,
                         double *mass) {
    double mr = -INFINITY, mh = -INFINITY, zr = 0, zh = 0;
    for (int j = 0; j < n; j++) mr = fmax(mr, r[j]), mh = fmax(mh, rh[j]);
    for (int j = 0; j < n; j++) zr += exp(r[j] - mr), zh += exp(rh[j] - mh);
    double lse_r = mr + log(zr), lse_h = mh + log(zh);
    int nb = 0, nf = 0;
    for (int j = 0; j < n; j++) r[j] >= FAR_BAND ? nb++ : nf++;
    double l_kl = 0, l_top = 0, l_fp = 0, xz = lse_h - lse_r;
    double l_z = huber(fmax(xz, 0)), gz = xz > 0 ? huber_grad(xz) : 0;
    for (int j = 0; j < n; j++) {
        double pj = exp(r[j] - lse_r), ph = exp(rh[j] - lse_h);
        l_kl += pj > 0 ? pj * ((r[j] - lse_r) - (rh[j] - lse_h)) : 0;
        double gj = 0.99 * (ph - pj) + 0.01 * 4 * gz * ph;
        if (r[j] >= FAR_BAND) {
            l_top += huber(rh[j] - r[j]) / nb;
            gj += 0.01 * huber_grad(rh[j] - r[j]) / nb;
        } else if (rh[j] + 8 > 0) {
            l_fp += huber(rh[j] + 8) / nf;
            gj += 0.01 * 2 * huber_grad(rh[j] + 8) / nf;
        }
        if (g) g[j] = gj;
    }
    *kl = l_kl;
    *mass = xz;
    return 0.99 * l_kl + 0.01 * (l_top + 2 * l_fp + 4 * l_z);
}

static int support_end(const phi_fit_set *d, const int *sel, int nsel) {   // the largest over sel
    int n = 0;
    for (int i = 0; i < nsel; i++) n = d->end[sel[i]] > n ? d->end[sel[i]] : n;
    return n;
}

double phi_fit_loss(const phi_maps *p, float *theta, const phi_fit_set *d, const int *sel,
                    int nsel, float *grad, double *kl_mean) {
    int hd = d->hd, f = p->d_phi, np = phi_n_par(p), nk = support_end(d, sel, nsel);
    float *par_k = theta + (size_t)d->group * np, *lq = xmalloc((size_t)f * 4);
    phi_mlp_acts ak = phi_mlp_acts_alloc(p, nk), aq = phi_mlp_acts_alloc(p, 1);
    float *dyk = xcalloc((size_t)nk * f, 4), *dyq = xmalloc((size_t)f * 4);
    double *r = xmalloc((size_t)nk * 8), *rh = xmalloc((size_t)nk * 8), *g = xmalloc((size_t)nk * 8);
    float *w = xmalloc((size_t)nk * f * sizeof(float));
    phi_mlp_forward(p, par_k, d->k, hd, &ak);
    double loss = 0, kl_sum = 0;
    for (int s = 0; s < nsel; s++) {
        int i = sel[s], lo = d->lo, n = d->end[i] - lo;
        const float *q = d->q + (size_t)i * hd;
        float *par_q = theta + (size_t)d->head[i] * np;
        phi_mlp_forward(p, par_q, q, hd, &aq);
        memcpy(lq, aq.y, (size_t)f * 4);
        double b = -INFINITY;
        for (int j = 0; j < n; j++) {   // teacher s_j = q . k_j / sqrt(hd); student LSE_f(t_jf)
            const float *kj = d->k + (size_t)(lo + j) * hd, *lk = ak.y + (size_t)(lo + j) * f;
            float *wj = w + (size_t)j * f;
            r[j] = dot_scaled(q, kj, hd);
            b = r[j] > b ? r[j] : b;
            rh[j] = lse_sum(lq, lk, f, wj);   // wj = softmax_f: d r^_j / d t_jf
        }
        for (int j = 0; j < n; j++) r[j] -= b, rh[j] -= b;
        double kl, mass;
        loss += query_loss(r, rh, n, grad ? g : NULL, &kl, &mass) / nsel;
        kl_sum += kl;
        if (!grad) continue;
        memset(dyq, 0, (size_t)f * 4);
        for (int j = 0; j < n; j++)
            for (int c = 0; c < f; c++) {
                float gw = (float)(g[j] * w[(size_t)j * f + c] / nsel);
                dyq[c] += gw;
                dyk[(size_t)(lo + j) * f + c] += gw;
            }
        mlp_backward(p, par_q, grad + (size_t)d->head[i] * np, q, &aq, dyq);
    }
    if (grad) mlp_backward(p, par_k, grad + (size_t)d->group * np, d->k, &ak, dyk);
    if (kl_mean) *kl_mean = kl_sum / nsel;
    phi_mlp_acts_free(&ak), phi_mlp_acts_free(&aq);
    free(lq), free(dyk), free(dyq), free(r), free(rh), free(g), free(w);
    return loss;
}

// LSE over r (n,) except the entries marked in skip (NULL: none)
static double lse_except(const double *r, int n, const char *skip) {
    double mx = -INFINITY, z = 0;
    for (int j = 0; j < n; j++)
        if (!skip || !skip[j]) mx = fmax(mx, r[j]);
    for (int j = 0; j < n; j++)
        if (!skip || !skip[j]) z += exp(r[j] - mx);
    return mx + log(z);
}

// Over queries sel: mean KL(softmax(r) || softmax(r^)) on the whole support, and mean log-mass
// error LSE(r^) - LSE(r) over the support minus each query's top ceil(frac n) keys by r.
static void eval_queries(const phi_maps *p, const float *const *par_q, const float *par_k,
                         const phi_fit_set *d, const int *sel, int nsel, double frac,
                         double *kl_mean, double *bias_mean, double *bias_sd) {
    int hd = d->hd, f = p->d_phi, nk = support_end(d, sel, nsel);
    float *lk = xmalloc((size_t)nk * f * 4), lq[f], *rf = xmalloc((size_t)nk * 4);
    double *r = xmalloc((size_t)nk * 8), *rh = xmalloc((size_t)nk * 8), kl_sum = 0, bias = 0, sq = 0;
    int *top = xmalloc((size_t)nk * sizeof(int));
    char *skip = xmalloc((size_t)nk);
    if (nk > d->lo) phi_log_features_rows(p, par_k, d->k + (size_t)d->lo * hd, nk - d->lo, hd, lk + (size_t)d->lo * f);
    for (int s = 0; s < nsel; s++) {
        int i = sel[s], n = d->end[i] - d->lo;
        const float *q = d->q + (size_t)i * hd;
        phi_log_features(p, par_q[d->head[i]], q, lq);
        double b = -INFINITY, kl, mass;
        for (int j = 0; j < n; j++) {
            const float *kj = d->k + (size_t)(d->lo + j) * hd, *lkj = lk + (size_t)(d->lo + j) * f;
            r[j] = dot_scaled(q, kj, hd);
            b = r[j] > b ? r[j] : b;
            rh[j] = lse_sum(lq, lkj, f, NULL);
        }
        for (int j = 0; j < n; j++) r[j] -= b, rh[j] -= b;
        query_loss(r, rh, n, NULL, &kl, &mass);
        int kk = (int)ceil(frac * n);
        if (kk > 0 && kk < n) {   // the remainder a decode step with top-kk retrieval estimates
            for (int j = 0; j < n; j++) rf[j] = (float)r[j], skip[j] = 0;
            int got = score_topk(rf, n, kk, top);
            for (int j = 0; j < got; j++) skip[top[j]] = 1;
            mass = lse_except(rh, n, skip) - lse_except(r, n, skip);
        }
        kl_sum += kl;
        bias += mass;
        sq += mass * mass;
    }
    if (kl_mean) *kl_mean = kl_sum / nsel;
    if (bias_mean) *bias_mean = bias / nsel;
    if (bias_sd) *bias_sd = sqrt(fmax(sq / nsel - (bias / nsel) * (bias / nsel), 0));
    free(lk), free(rf), free(r), free(rh), free(top), free(skip);
}

double phi_fit_kl(const phi_maps *p, const float *const *par_q, const float *par_k,
                  const phi_fit_set *d, const int *sel, int nsel, double *mass_bias) {
    double kl;
    eval_queries(p, par_q, par_k, d, sel, nsel, 0, &kl, mass_bias, NULL);
    return kl;
}

double phi_fit_remainder_bias(const phi_maps *p, const float *const *par_q, const float *par_k,
                              const phi_fit_set *d, const int *sel, int nsel, double frac,
                              double *spread) {
    double bias;
    eval_queries(p, par_q, par_k, d, sel, nsel, frac, NULL, &bias, spread);
    return bias;
}

void phi_fit_init(const phi_maps *p, float *theta, int group, uint64_t seed) {
    int np = phi_n_par(p), d = p->d_in, e = p->d_emb, h = p->d_hid, f = p->d_phi;
    phi_maps *prf = phi_maps_prf(1, 1, 1, e, f, seed);   // wo starts as random features of g0
    uint64_t state = seed ^ 0xA5A5A5A5ull;
    for (int b = 0; b <= group; b++) {
        float *par = theta + (size_t)b * np;
        phi_mlp_view w = phi_mlp_params(p, par);
        memset(par, 0, (size_t)np * 4);
        for (int i = 0; i < e && i < d; i++) w.ws[(size_t)i * d + i] = 1.0f / sqrtf(sqrtf((float)d));
        for (int i = 0; i < h * e; i++) w.w1[i] = (float)(phi_gauss(&state) / sqrt((double)e));
        for (int i = 0; i < e * h; i++) w.w2[i] = (float)(phi_gauss(&state) / sqrt((double)h));
        memcpy(w.wo, prf->k, (size_t)f * e * 4);
        for (int i = 0; i < f; i++) w.bo[i] = -0.5f * logf((float)f);
    }
    phi_maps_free(prf);
}

void phi_fit_adam(float *theta, const float *grad, float *m, float *v, size_t n, int t, float lr) {
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    double c1 = 1 - pow(b1, t), c2 = 1 - pow(b2, t);
    for (size_t i = 0; i < n; i++) {
        m[i] = (float)(b1 * m[i] + (1 - b1) * grad[i]);
        v[i] = (float)(b2 * v[i] + (1 - b2) * (double)grad[i] * grad[i]);
        theta[i] -= (float)(lr * (m[i] / c1) / (sqrt(v[i] / c2) + eps));
    }
}

static void rotate_rows(float *out, const float *x, int n, int hd, double delta,
                        const float *inv_freq, int neox) {
    int half = hd / 2;
    float c[half], s[half];
    for (int j = 0; j < half; j++) c[j] = (float)cos(delta * inv_freq[j]), s[j] = (float)sin(delta * inv_freq[j]);
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * hd;
        float *oi = out + (size_t)i * hd;
        if (hd % 2) oi[hd - 1] = xi[hd - 1];
        for (int j = 0; j < half; j++) {
            int a = neox ? j : 2 * j, b = neox ? j + half : 2 * j + 1;
            float xa = xi[a], xb = xi[b];
            oi[a] = xa * c[j] - xb * s[j];
            oi[b] = xa * s[j] + xb * c[j];
        }
    }
}

// k_out, q_out = d's keys rotated by dk, its queries by dq (dq > dk: the queries as if dq - dk
// positions farther from the keys; the scores q.k change accordingly).
static void rotate_pair(const phi_fit_set *d, double dk, double dq, float *k_out, float *q_out) {
    rotate_rows(k_out, d->k, d->n_keys, d->hd, dk, d->inv_freq, d->rope_neox);
    rotate_rows(q_out, d->q, d->n_q, d->hd, dq, d->inv_freq, d->rope_neox);
}

void phi_fit_rotate(const phi_fit_set *d, double delta, float *k_out, float *q_out) {
    rotate_pair(d, delta, delta, k_out, q_out);
}

// [D] The shifts the calibration and the gate average over, as fractions of shift_max: keys
// and queries together (the absolute angles of later positions), and queries alone (the same
// keys seen from up to shift_max further away: the relative distances of a long prompt, which
// a fit on -c tokens never shows).
static const double EVAL_SHIFTS[][2] = {{0, 0}, {1 / 3.0, 1 / 3.0}, {2 / 3.0, 2 / 3.0}, {1, 1},
                                        {0, 0.5}, {0, 1}};
#define N_EVAL_SHIFTS ((int)(sizeof EVAL_SHIFTS / sizeof *EVAL_SHIFTS))

double phi_fit_run(const phi_maps *p, float *theta, const phi_fit_set *d, const int *train,
                   int n_train, int steps, int batch, float lr, uint64_t seed,
                   void (*on_step)(void *ctx, int step, double loss), void *ctx) {
    size_t n = (size_t)(d->group + 1) * phi_n_par(p);
    float *g = xmalloc(n * 4), *m = xcalloc(n, 4), *v = xcalloc(n, 4);
    int nb = batch < n_train ? batch : n_train, *pool = xmalloc((size_t)n_train * sizeof(int));
    memcpy(pool, train, (size_t)n_train * sizeof(int));
    uint64_t state = seed;
    double loss = 0;
    int shift = d->shift_max > 0 && d->inv_freq;
    float *kr = shift ? xmalloc((size_t)d->n_keys * d->hd * 4) : NULL;
    float *qr = shift ? xmalloc((size_t)d->n_q * d->hd * 4) : NULL;
    phi_fit_set ds = *d;
    if (shift) ds.k = kr, ds.q = qr;
    for (int t = 1; t <= steps; t++) {
        for (int i = 0; i < nb; i++) {   // minibatch = pool[0..nb) after a partial shuffle
            uint64_t z = (state += 0x9E3779B97F4A7C15ull);
            z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
            int j = i + (int)((z >> 33) % (uint64_t)(n_train - i)), tmp = pool[i];
            pool[i] = pool[j], pool[j] = tmp;
        }
        if (shift) {   // this step's positions: all shifted by delta in [0, shift_max], and every
                       // other step the queries by up to the rest (farther from the keys)
            uint64_t z = (state += 0x9E3779B97F4A7C15ull);
            z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
            uint64_t delta = (z >> 33) % ((uint64_t)d->shift_max + 1);
            z = (state += 0x9E3779B97F4A7C15ull);
            z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
            uint64_t far = (z & 1) ? (z >> 33) % ((uint64_t)d->shift_max - delta + 1) : 0;
            rotate_pair(d, (double)delta, (double)(delta + far), kr, qr);
        }
        memset(g, 0, n * 4);
        loss = phi_fit_loss(p, theta, &ds, pool, nb, g, NULL);
        phi_fit_adam(theta, g, m, v, n, t, lr);
        if (on_step) on_step(ctx, t, loss);
    }
    free(g), free(m), free(v), free(pool), free(kr), free(qr);
    return loss;
}

void phi_fit_calibrate(const phi_maps *p, float *theta, const phi_fit_set *d, const int *sel,
                       int nsel, double frac, double margin) {
    int n_shift = d->shift_max > 0 && d->inv_freq ? N_EVAL_SHIFTS : 1;
    if (n_shift > 1) {   // the mean bias over the positions of EVAL_SHIFTS
        float *kr = xmalloc((size_t)d->n_keys * d->hd * 4), *qr = xmalloc((size_t)d->n_q * d->hd * 4);
        float *sum = xcalloc((size_t)d->group * p->d_phi, 4), *orig = xmalloc((size_t)d->group * p->d_phi * 4);
        int np = phi_n_par(p);
        phi_fit_set ds = *d;
        ds.k = kr, ds.q = qr, ds.shift_max = 0;
        for (int j = 0; j < d->group; j++) memcpy(orig + j * p->d_phi, theta + (size_t)(j + 1) * np - p->d_phi, p->d_phi * 4);
        for (int s = 0; s < n_shift; s++) {   // each pass calibrates the original biases at one shift
            rotate_pair(d, d->shift_max * EVAL_SHIFTS[s][0], d->shift_max * EVAL_SHIFTS[s][1], kr, qr);
            for (int j = 0; j < d->group; j++) memcpy(theta + (size_t)(j + 1) * np - p->d_phi, orig + j * p->d_phi, p->d_phi * 4);
            phi_fit_calibrate(p, theta, &ds, sel, nsel, frac, margin);
            for (int j = 0; j < d->group * p->d_phi; j++) sum[j] += theta[(size_t)(j / p->d_phi + 1) * np - p->d_phi + j % p->d_phi] / n_shift;
        }
        for (int j = 0; j < d->group; j++) memcpy(theta + (size_t)(j + 1) * np - p->d_phi, sum + j * p->d_phi, p->d_phi * 4);
        free(kr), free(qr), free(sum), free(orig);
        return;
    }
    int np = phi_n_par(p), *mine = xmalloc((size_t)nsel * sizeof(int));
    const float *pq[d->group];
    for (int j = 0; j < d->group; j++) pq[j] = theta + (size_t)j * np;
    for (int j = 0; j < d->group; j++) {
        int n = 0;
        for (int i = 0; i < nsel; i++)
            if (d->head[sel[i]] == j) mine[n++] = sel[i];
        double sd = 0, bias = n ? phi_fit_remainder_bias(p, pq, theta + (size_t)d->group * np, d,
                                                         mine, n, frac, &sd) : 0;
        bias += margin * sd;
        float *bo = theta + (size_t)j * np + np - p->d_phi;   // log phi_q + c scales the mass by e^c
        for (int f = 0; f < p->d_phi; f++) bo[f] -= (float)bias;
    }
    free(mine);
}

const float PHI_GATE_DELTAS[PHI_N_GATE] = {1, 0, -1, -2, -3, -4, -6, -8, PHI_GATE_OFF};

void phi_fit_gate(const phi_maps *p, float *theta, const phi_fit_set *d, const float *v, int tail,
                  const int *sel, int nsel, double frac, float *chosen) {
    int hd = d->hd, f = p->d_phi, np = phi_n_par(p), group = d->group;
    int nk = support_end(d, sel, nsel) + tail, n_shift = d->shift_max > 0 && d->inv_freq ? N_EVAL_SHIFTS : 1;
    if (nk > d->n_keys) nk = d->n_keys;
    float *kr = xmalloc((size_t)d->n_keys * hd * 4), *qr = xmalloc((size_t)d->n_q * hd * 4);
    float *lk = xmalloc((size_t)nk * f * 4), lq[f], *sf = xmalloc((size_t)nk * 4);
    double *s = xmalloc((size_t)nk * 8), *err = xcalloc((size_t)group * PHI_N_GATE, 8);
    double ne[hd], nr[hd], nh[hd];
    int *top = xmalloc((size_t)nk * sizeof(int));
    char *exact = xmalloc((size_t)nk);
    for (int sh = 0; sh < n_shift; sh++) {
        if (n_shift > 1)
            rotate_pair(d, d->shift_max * EVAL_SHIFTS[sh][0], d->shift_max * EVAL_SHIFTS[sh][1], kr, qr);
        const float *K = n_shift > 1 ? kr : d->k, *Q = n_shift > 1 ? qr : d->q;
        if (nk > d->lo) phi_log_features_rows(p, theta + (size_t)group * np, K + (size_t)d->lo * hd, nk - d->lo, hd, lk + (size_t)d->lo * f);
        for (int t = 0; t < nsel; t++) {
            int i = sel[t], h = d->head[i], end = d->end[i], last = end + tail < nk ? end + tail : nk;
            int n_mid = end - d->lo, kk = (int)ceil(frac * n_mid);
            const float *q = Q + (size_t)i * hd;
            if (n_mid < 2 || kk >= n_mid) continue;
            phi_log_features(p, theta + (size_t)h * np, q, lq);
            double b = -INFINITY;
            for (int x = 0; x < last; x++) s[x] = dot_scaled(q, K + (size_t)x * hd, hd), b = fmax(b, s[x]);
            for (int x = 0; x < last; x++) exact[x] = x < d->lo || x >= end, sf[x] = (float)s[x];
            int got = score_topk(sf + d->lo, n_mid, kk, top);
            double smin = INFINITY;   // decode's top-K bound: Z_R <= (n_mid - K) e^smin
            for (int j = 0; j < got; j++) exact[d->lo + top[j]] = 1, smin = fmin(smin, s[d->lo + top[j]]);
            double bound = (n_mid - got) * exp(smin - b);
            // exact set E, true remainder R, and the maps' estimate of R (the student kernel
            // summed over R: what the summary minus the retrieved keys gives), all scaled by e^-b
            double ze = 0, zr = 0, zh = 0;
            memset(ne, 0, sizeof ne), memset(nr, 0, sizeof nr), memset(nh, 0, sizeof nh);
            for (int x = 0; x < last; x++) {
                const float *vx = v + (size_t)x * hd;
                double w = exp(s[x] - b);
                if (exact[x]) {
                    ze += w;
                    for (int c = 0; c < hd; c++) ne[c] += w * vx[c];
                    continue;
                }
                double wh = exp(fmin(lse_sum(lq, lk + (size_t)x * f, f, NULL) - b, 600));
                zr += w, zh += wh;
                for (int c = 0; c < hd; c++) nr[c] += w * vx[c], nh[c] += wh * vx[c];
            }
            double yt[hd], norm = 0;
            for (int c = 0; c < hd; c++) yt[c] = (ne[c] + nr[c]) / (ze + zr), norm += yt[c] * yt[c];
            for (int g = 0; g < PHI_N_GATE; g++) {   // estimate e^delta zh, clamped to the bound
                double zg = fmin(exp(PHI_GATE_DELTAS[g]) * zh, bound), m = zh > 0 ? zg / zh : 0, e2 = 0;
                for (int c = 0; c < hd; c++) {
                    double y = (ne[c] + m * nh[c]) / (ze + m * zh) - yt[c];
                    e2 += y * y;
                }
                err[h * PHI_N_GATE + g] += e2 / fmax(norm, 1e-30);
            }
        }
    }
    for (int h = 0; h < group; h++) {
        int best = 0;
        for (int g = 1; g < PHI_N_GATE; g++)
            if (err[h * PHI_N_GATE + g] < err[h * PHI_N_GATE + best]) best = g;
        float *bo = theta + (size_t)h * np + np - f;   // log phi_q + c scales the mass by e^c
        for (int c = 0; c < f; c++) bo[c] += PHI_GATE_DELTAS[best];
        if (chosen) chosen[h] = PHI_GATE_DELTAS[best];
    }
    free(kr), free(qr), free(lk), free(sf), free(s), free(err), free(top), free(exact);
}
