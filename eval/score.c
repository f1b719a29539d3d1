// eval/score.c — scoring an answer (RULER's string match: the share of expected strings found in
// the generated text, ignoring case) and the KL divergence between two next-token distributions.
// (A greedy answer and its agreement with a reference's tokens: tok_answer, tok/text.c.)
#include <ctype.h>
#include <string.h>

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
