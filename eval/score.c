// eval/score.c — scoring an answer (RULER's string match: the share of expected strings found in
// the generated text, ignoring case) and the KL divergence between two next-token distributions.
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"

// 1 if needle occurs in hay, ignoring ASCII case.
static int contains_nocase(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    if (n == 0) return 1;
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == tolower((unsigned char)needle[i]))
            i++;
        if (i == n) return 1;
    }
    return 0;
}

double eval_score(const char answers[][32], int n_answers, const char *text) {
    if (n_answers == 0) return 0;
    int found = 0;
    for (int i = 0; i < n_answers; i++) found += contains_nocase(text, answers[i]);
    return (double)found / n_answers;
}

// log-sum-exp of x (n,)
static double log_sum_exp(const float *x, int n) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) s += exp(x[i] - mx);
    return mx + log(s);
}

// KL(p || q) = sum_i p_i (log p_i - log q_i), p_i = softmax(lp)_i, q_i = softmax(lq)_i
double eval_kl(const float *lp, const float *lq, int n) {
    double zp = log_sum_exp(lp, n), zq = log_sum_exp(lq, n), kl = 0;
    for (int i = 0; i < n; i++) {
        double log_p = lp[i] - zp, log_q = lq[i] - zq;
        kl += exp(log_p) * (log_p - log_q);
    }
    return kl > 0 ? kl : 0;   // rounding can leave -1e-12 for equal inputs
}
