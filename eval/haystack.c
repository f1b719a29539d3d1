// eval/haystack.c — the text the needles hide in: a user's file split into whole sentences, or
// built-in filler sentences made from four word lists (seeded; no digits, so a number in the
// prompt is always a needle's).
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "eval.h"

uint64_t eval_rand(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static const char *const SUBJECTS[] = {
    "The old ferryman", "A tired baker", "The village choir", "My neighbour",
    "The quiet librarian", "A young shepherd", "The night watchman", "Her younger brother",
    "The travelling tailor", "A curious fox", "The harbour master", "An elderly painter",
    "The school gardener", "A patient fisherman", "The market clerk", "The mountain guide"};
static const char *const VERBS[] = {
    "repainted", "carried", "mended", "watched", "described", "forgot", "cleaned", "borrowed",
    "sketched", "counted", "polished", "measured", "admired", "hid", "sorted", "returned"};
static const char *const OBJECTS[] = {
    "the wooden fence", "a basket of pears", "the broken lantern", "an old map",
    "the copper kettle", "a pile of letters", "the garden gate", "a faded blanket",
    "the church bell", "a box of buttons", "the narrow bridge", "a jar of honey",
    "the blue rowing boat", "a bundle of reeds", "the kitchen clock", "a stack of firewood"};
static const char *const TAILS[] = {
    "before the first frost", "while the rain kept falling", "on a slow Sunday afternoon",
    "after the market closed", "without telling anyone", "as the bells rang for noon",
    "under a grey autumn sky", "long after dark", "with great care", "in the cool morning air",
    "near the edge of the forest", "during the long winter", "beside the frozen pond",
    "at the end of the harvest", "for no particular reason", "just as the tide turned"};

#define PICK(list, r) list[(r) % (sizeof list / sizeof *list)]

char *eval_haystack_sentence(const eval_haystack *h, uint64_t seed, long i) {
    if (h && h->n > 0) return strdup(h->sents[i % h->n]);
    uint64_t st = seed ^ ((uint64_t)i * 0xd1342543de82ef95ULL);
    uint64_t r = eval_rand(&st);
    const char *parts[4] = {PICK(SUBJECTS, r), PICK(VERBS, r >> 8), PICK(OBJECTS, r >> 16),
                            PICK(TAILS, r >> 24)};
    size_t n = 8;
    for (int k = 0; k < 4; k++) n += strlen(parts[k]);
    char *s = xmalloc(n);
    snprintf(s, n, "%s %s %s %s.", parts[0], parts[1], parts[2], parts[3]);
    return s;
}

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static void add_sentence(eval_haystack *h, const char *s, size_t n) {
    char *c = xmalloc(n + 1);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) c[m++] = is_space(s[i]) ? ' ' : s[i];   // one line each
    c[m] = 0;
    h->sents = xrealloc(h->sents, (size_t)(h->n + 1) * sizeof *h->sents);
    h->sents[h->n++] = c;
}

int eval_haystack_from_text(eval_haystack *h, const char *text, size_t len, char *err,
                            size_t errlen) {
    *h = (eval_haystack){0};
    long bad = tok_utf8_invalid_at(text, len);
    if (bad >= 0) return err_printf(err, errlen, "not valid UTF-8 (byte offset %ld)", bad);
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
        int end = (text[i] == '.' || text[i] == '!' || text[i] == '?') &&
                  (i + 1 == len || is_space(text[i + 1]));
        if (!end) continue;
        while (start < i && is_space(text[start])) start++;
        add_sentence(h, text + start, i + 1 - start);
        start = i + 1;
    }
    if (h->n == 0)
        return err_printf(err, errlen, "no whole sentence (text ending in . ! or ?) in %zu bytes",
                          len);
    return 0;
}

void eval_haystack_free(eval_haystack *h) {
    for (int i = 0; i < h->n; i++) free(h->sents[i]);
    free(h->sents);
    *h = (eval_haystack){0};
}
