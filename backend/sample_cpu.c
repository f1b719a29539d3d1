// backend/sample_cpu.c — see sample.h. Candidates are ordered only when a filter needs the order:
// with top-k on, only the k best are found (one pass, a heap of k) and sorted, so a default draw
// over a 128K vocabulary costs a pass over the logits, not a sort of them; with top-k off the
// whole vocabulary is ordered by a radix sort of 64-bit keys (linear, not qsort's n log n
// comparisons through a function pointer), into the same order.
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"

void sampler_init(sampler *s, const sample_params *p, int n_vocab) {
    s->p = *p;
    s->state = p->seed * 6364136223846793005ULL + 1442695040888963407ULL;
    s->cand = xmalloc((size_t)n_vocab * sizeof *s->cand);
    s->keys = NULL;   // sort_all's, on its first use
    s->n_vocab = n_vocab;
    s->counts = NULL, s->pen = NULL;
    if (sample_penalised(p)) {
        s->counts = xcalloc((size_t)n_vocab, sizeof *s->counts);
        s->pen = xmalloc((size_t)n_vocab * sizeof *s->pen);
    }
}

void sampler_free(sampler *s) {
    free(s->cand), free(s->keys), free(s->counts), free(s->pen);
    s->cand = NULL, s->keys = NULL, s->counts = NULL, s->pen = NULL;
}

float sample_uniform(sampler *s) { return (sample_pcg32(&s->state) >> 8) * (1.0f / 16777216.0f); }

void sample_skip(sampler *s) {
    CHECK_INTERNAL(!s->counts, "a penalised sampler's token was drawn elsewhere");
    if (s->p.temp > 0) sample_uniform(s);   // greedy draws take no number
}

int sample_argmax(const float *logits, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

static int by_logit_desc(const void *a, const void *b) {
    const struct sample_cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id;
}

// a ranks before b in by_logit_desc's order (higher logit; equal logits: lower id)
static int ranks_before(struct sample_cand a, struct sample_cand b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// h (k,) a heap whose root ranks last; restores it below index i
static void sift_down(struct sample_cand *h, int k, int i) {
    for (;;) {
        int worst = i, l = 2 * i + 1, r = l + 1;
        if (l < k && ranks_before(h[worst], h[l])) worst = l;
        if (r < k && ranks_before(h[worst], h[r])) worst = r;
        if (worst == i) return;
        struct sample_cand t = h[i];
        h[i] = h[worst], h[worst] = t, i = worst;
    }
}

// s->cand[0 .. k) = the k best of logits (n,) in by_logit_desc's order: the same k candidates, in
// the same order, as sorting all n would leave first.
static void best_k(sampler *s, const float *logits, int n, int k) {
    struct sample_cand *h = s->cand;
    for (int i = 0; i < k; i++) h[i] = (struct sample_cand){logits[i], i};
    for (int i = k / 2 - 1; i >= 0; i--) sift_down(h, k, i);
    for (int i = k; i < n; i++) {
        struct sample_cand c = {logits[i], i};
        if (ranks_before(c, h[0])) h[0] = c, sift_down(h, k, 0);
    }
    qsort(h, (size_t)k, sizeof *h, by_logit_desc);
}

// A key per candidate, smaller for the one by_logit_desc puts first: the logit's bits made
// order-preserving and inverted (larger logit, smaller key; -0 as +0, as == compares them) above
// the id (equal logits: lower id first).
static uint64_t rank_key(float logit, int id) {
    uint32_t u;
    memcpy(&u, &logit, 4);
    if ((u << 1) == 0) u = 0;
    u = u & 0x80000000u ? ~u : u | 0x80000000u;   // ascending with the logit
    return (uint64_t)~u << 32 | (uint32_t)id;
}

// s->cand[0 .. n) = all of logits (n,) in by_logit_desc's order: an LSD radix sort of rank_key by
// 16-bit digits (4 stable passes; a pass whose digit is the same for every key is skipped).
static void sort_all(sampler *s, const float *logits, int n) {
    if (!s->keys) s->keys = xmalloc(((size_t)s->n_vocab * 2 + (1 << 15)) * sizeof *s->keys);
    uint64_t *a = s->keys, *b = s->keys + n;
    uint32_t *count = (uint32_t *)(s->keys + 2 * (size_t)s->n_vocab);   // (1 << 16,)
    for (int i = 0; i < n; i++) a[i] = rank_key(logits[i], i);
    for (int shift = 0; shift < 64; shift += 16) {
        memset(count, 0, sizeof *count << 16);
        for (int i = 0; i < n; i++) count[(a[i] >> shift) & 0xffff]++;
        if (count[(a[0] >> shift) & 0xffff] == (uint32_t)n) continue;   // one digit: order kept
        uint32_t at = 0;
        for (int d = 0; d < 1 << 16; d++) {
            uint32_t c = count[d];
            count[d] = at, at += c;
        }
        for (int i = 0; i < n; i++) b[count[(a[i] >> shift) & 0xffff]++] = a[i];
        uint64_t *t = a;
        a = b, b = t;
    }
    for (int i = 0; i < n; i++) {
        int id = (int)(uint32_t)a[i];
        s->cand[i] = (struct sample_cand){logits[id], id};
    }
}

static int draw(sampler *s, const float *logits);

int sample_next(sampler *s, const float *logits) {
    if (!s->counts) return draw(s, logits);
    // OpenAI's formula: logit[j] - c[j] * frequency - (c[j] > 0) * presence
    for (int j = 0; j < s->n_vocab; j++) {
        int c = s->counts[j];
        s->pen[j] = c ? logits[j] - (float)c * s->p.freq_pen - s->p.pres_pen : logits[j];
    }
    int t = draw(s, s->pen);
    s->counts[t]++;
    return t;
}

static int draw(sampler *s, const float *logits) {
    const sample_params *p = &s->p;
    int n = s->n_vocab;
    if (p->temp <= 0) return sample_argmax(logits, n);
    if (p->top_k > 0 && p->top_k < n) {
        best_k(s, logits, n, p->top_k);
        n = p->top_k;
    } else
        sort_all(s, logits, n);
    // probabilities at temperature 1 for the filters, as llama.cpp's chain does
    double mx = s->cand[0].logit, sum = 0;
    for (int i = 0; i < n; i++) sum += exp(s->cand[i].logit - mx);
    if (p->top_p < 1.0f) {
        double cum = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += exp(s->cand[i].logit - mx) / sum;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    if (p->min_p > 0) {
        double floor_logit = mx + log(p->min_p);   // p_i >= min_p * p_max
        int keep = 1;
        while (keep < n && s->cand[keep].logit >= floor_logit) keep++;
        n = keep;
    }
    // temperature, softmax over survivors, draw
    double z = 0;
    for (int i = 0; i < n; i++) z += exp((s->cand[i].logit - mx) / p->temp);
    double r = sample_uniform(s) * z, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += exp((s->cand[i].logit - mx) / p->temp);
        if (r < acc) return s->cand[i].id;
    }
    return s->cand[n - 1].id;
}

// log-sum-exp of x (n,)
static double log_sum_exp(const float *x, int n) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) s += exp(x[i] - mx);
    return mx + log(s);
}

// KL(p || q) = sum_i p_i (log p_i - log q_i), p_i = softmax(lp)_i, q_i = softmax(lq)_i
double sample_kl(const float *lp, const float *lq, int n) {
    double zp = log_sum_exp(lp, n), zq = log_sum_exp(lq, n), kl = 0;
    for (int i = 0; i < n; i++) {
        double log_p = lp[i] - zp, log_q = lq[i] - zq;
        kl += exp(log_p) * (log_p - log_q);
    }
    return kl > 0 ? kl : 0;   // rounding can leave -1e-12 for equal inputs
}
