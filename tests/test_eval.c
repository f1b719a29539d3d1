// tests/test_eval.c — the eval suite's pieces with hand-written answers: string-match scoring
// (RULER's share of expected strings, case-insensitive), KL of two logit vectors against values
// computed by hand, splitting a user's haystack into whole sentences, the built-in filler
// (deterministic, digit-free) and task lookup.
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../eval/eval.h"
#include "check.h"

static void test_score(void) {
    const char one[][32] = {"8584525"};
    CHECK(eval_score(one, 1, " 8584525.") == 1, "exact answer");
    CHECK(eval_score(one, 1, "The code is 858452") == 0, "one digit short");
    CHECK(eval_score(one, 1, "") == 0, "empty answer");
    const char four[][32] = {"1111111", "2222222", "3333333", "4444444"};
    CHECK(eval_score(four, 4, "1. 1111111\n2. 3333333\n3. 1111111") == 0.5, "two of four");
    CHECK(eval_score(four, 4, "4444444 3333333 2222222 1111111") == 1, "order does not matter");
    const char names[][32] = {"QWERT", "ASDFG", "ZXCVB"};
    CHECK(fabs(eval_score(names, 3, "variables qwert and Zxcvb") - 2.0 / 3) < 1e-12,
          "case-insensitive");
}

static void test_kl(void) {
    float a[3] = {0, 0, 0}, b[3] = {5, -1, 2};
    CHECK(eval_kl(b, b, 3) == 0, "KL(p||p) = 0");
    // p = (1/2, 1/2), q = softmax(0, log 3) = (1/4, 3/4):
    // KL = 1/2 ln(2) + 1/2 ln(2/3) = 1/2 ln(4/3)
    float p[2] = {1, 1}, q[2] = {0, (float)log(3.0)};
    CHECK_CLOSE(eval_kl(p, q, 2), 0.5 * log(4.0 / 3), 1e-6);
    // uniform p over 3, q = softmax(b): KL = -ln 3 - mean(log q)
    double z = log(exp(5.0) + exp(-1.0) + exp(2.0));
    double want = -log(3.0) - ((5 - z) + (-1 - z) + (2 - z)) / 3;
    CHECK_CLOSE(eval_kl(a, b, 3), want, 1e-6);
    // shifting all logits changes nothing
    float b2[3] = {105, 99, 102};
    CHECK_CLOSE(eval_kl(a, b2, 3), want, 1e-5);
}

static void test_haystack_split(void) {
    eval_haystack h;
    char err[200];
    const char *text = "  First one. Second\nline here!Third? no end";
    CHECK(eval_haystack_from_text(&h, text, strlen(text), err, sizeof err) == 0, "%s", err);
    // "here!Third" has no space after '!': not a sentence end; the tail has no end mark
    CHECK(h.n == 2, "%d sentences", h.n);
    if (h.n == 2) {
        CHECK(strcmp(h.sents[0], "First one.") == 0, "'%s'", h.sents[0]);
        CHECK(strcmp(h.sents[1], "Second line here!Third?") == 0, "'%s'", h.sents[1]);
        char *s = eval_haystack_sentence(&h, 7, 3);   // 3 % 2 = 1: the text repeats
        CHECK(strcmp(s, h.sents[1]) == 0, "'%s'", s);
        free(s);
    }
    eval_haystack_free(&h);
    CHECK(eval_haystack_from_text(&h, "no sentence", 11, err, sizeof err) == -1, "no sentence");
    CHECK(strstr(err, "no whole sentence") != NULL, "%s", err);
    CHECK(eval_haystack_from_text(&h, "bad \xff byte.", 11, err, sizeof err) == -1, "bad UTF-8");
    CHECK(strstr(err, "UTF-8") != NULL, "%s", err);
}

static void test_filler(void) {
    for (long i = 0; i < 200; i++) {
        char *a = eval_haystack_sentence(NULL, 42, i), *b = eval_haystack_sentence(NULL, 42, i);
        CHECK(strcmp(a, b) == 0, "sentence %ld not deterministic", i);
        size_t n = strlen(a);
        CHECK(n > 10 && a[n - 1] == '.' && isupper((unsigned char)a[0]), "'%s'", a);
        for (size_t k = 0; k < n; k++) CHECK(!isdigit((unsigned char)a[k]), "digit in '%s'", a);
        free(a);
        free(b);
    }
    char *x = eval_haystack_sentence(NULL, 1, 5), *y = eval_haystack_sentence(NULL, 2, 5);
    char *z = eval_haystack_sentence(NULL, 1, 6);
    CHECK(strcmp(x, y) != 0 || strcmp(x, z) != 0, "seed and index both ignored");
    free(x);
    free(y);
    free(z);
}

static void test_tasks(void) {
    CHECK(eval_task_find("niah") == EVAL_NIAH, "niah");
    CHECK(eval_task_find("cwe") == EVAL_CWE, "cwe");
    CHECK(eval_task_find("qa") == -1, "unknown task");
    for (int t = 0; t < EVAL_N_TASKS; t++) {
        CHECK(strstr(eval_task_names(), eval_task_name(t)) != NULL, "task %s not in the names",
              eval_task_name(t));
        CHECK(eval_task_n_gen(t) > 0 && eval_task_n_gen(t) <= 64, "n_gen %d", eval_task_n_gen(t));
    }
}

int main(void) {
    test_score();
    test_kl();
    test_haystack_split();
    test_filler();
    test_tasks();
    return check_summary("test_eval");
}
