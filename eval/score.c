// eval/score.c — scoring an answer (RULER's string match: the share of expected strings found in
// the generated text, ignoring case), collecting a greedy answer and its agreement with a
// reference's tokens, and the KL divergence between two next-token distributions.
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "eval.h"
#include "../backend/sample.h"

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

// KL(p || q) of two next-token distributions given as logits (backend/sample_cpu.c).
double eval_kl(const float *lp, const float *lq, int n) { return sample_kl(lp, lq, n); }

int eval_answer_token(void *ctx, int id) {
    eval_answer *a = ctx;
    a->ids = xrealloc(a->ids, (size_t)(a->n_ids + 1) * sizeof(int));
    a->ids[a->n_ids++] = id;
    if (tok_is_eog(a->t, id)) return 1;
    size_t n;
    const char *p = tok_piece(a->t, id, 0, &n);
    a->text = xrealloc(a->text, a->len + n + 1);
    memcpy(a->text + a->len, p, n);
    a->len += n;
    a->text[a->len] = 0;
    return 0;
}

void eval_answer_free(eval_answer *a) {
    free(a->ids);
    free(a->text);
    a->ids = NULL, a->text = NULL, a->n_ids = 0, a->len = 0;
}

double eval_agreement(const int *ref, int n_ref, const int *ids, int n, int *first) {
    int same = 0;
    for (int i = 0; i < n_ref && i < n; i++) same += ref[i] == ids[i];
    *first = n > 0 && n_ref > 0 && ids[0] == ref[0];
    return n_ref ? (double)same / n_ref : 0;
}
