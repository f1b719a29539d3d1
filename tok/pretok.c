// tok/pretok.c — pre-tokenizers: split text into the pieces BPE merges within, with the regexes
// each model family's tokenizer uses (PCRE2, UTF + UCP), and strict UTF-8 validation.
//
// A pre-tokenizer is one or more regex stages. Each stage re-splits every piece of the previous
// stage into its matches and the unmatched gaps between them (a gap is a piece too, so pieces
// always cover the text). Each piece is its own subject: a lookahead never sees past its end.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stb/stb_ds.h>
#include <stdio.h>
#include <string.h>

#include "../util/check.h"
#include "tok.h"

// GPT-2's pattern, as Hugging Face's ByteLevel pre-tokenizer and llama.cpp use it.
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
// Llama 3's pattern with (?i:...) spelled out case by case; DIGITS is \p{N}{1,3} or \p{N}.
#define RE_LLAMA3_LIKE(DIGITS)                                                                \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" \
    DIGITS "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

#define MAX_STAGES TOK_PRE_MAX_STAGES

static const struct pre_def {
    const char *name;
    int ignore_merges;                // a whole piece found in the vocabulary skips BPE
    const char *stages[MAX_STAGES];   // NULL-terminated when shorter
} PRE_DEFS[] = {
    // SmolLM2: every digit on its own, then GPT-2.
    {"smollm", 0, {"\\p{N}", RE_GPT2}},
    {"llama3", 1, {RE_LLAMA3_LIKE("\\p{N}{1,3}"), NULL}},
    {"llama-bpe", 1, {RE_LLAMA3_LIKE("\\p{N}{1,3}"), NULL}},
    {"llama-v3", 1, {RE_LLAMA3_LIKE("\\p{N}{1,3}"), NULL}},
    {"qwen2", 0, {RE_LLAMA3_LIKE("\\p{N}"), NULL}},
    {"deepseek-r1-qwen", 0, {RE_LLAMA3_LIKE("\\p{N}"), NULL}},
};
#define PRE_SUPPORTED "smollm, llama3 (llama-bpe), qwen2"

struct tok_pre {
    int ignore_merges;
    int n_stages;
    pcre2_code *stages[TOK_PRE_MAX_STAGES];
};

long tok_utf8_invalid_at(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t n;
        unsigned cp, min;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xE0) == 0xC0) { n = 2; cp = c & 0x1F; min = 0x80; }
        else if ((c & 0xF0) == 0xE0) { n = 3; cp = c & 0x0F; min = 0x800; }
        else if ((c & 0xF8) == 0xF0) { n = 4; cp = c & 0x07; min = 0x10000; }
        else return (long)i;  // stray continuation byte or 0xF8..0xFF
        if (len - i < n) return (long)i;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return (long)i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return (long)i;
        i += n;
    }
    return -1;
}

// Compiles one stage (UTF + UCP); NULL + reason if the pattern does not compile.
static pcre2_code *compile_stage(const char *re_text, char *err, size_t errlen) {
    int code;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)re_text, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &code, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(code, msg, sizeof msg);
        snprintf(err, errlen, "pre-tokenizer regex does not compile at offset %zu: %s", (size_t)at,
                 (char *)msg);
        return NULL;
    }
    // JIT is only a speed-up: without it (unsupported CPU, no executable memory) pcre2_match
    // interprets the same pattern.
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    return re;
}

tok_pre *tok_pre_from_regex(const char *const *stages, int n_stages, int ignore_merges, char *err,
                            size_t errlen) {
    if (n_stages < 1 || n_stages > TOK_PRE_MAX_STAGES) {
        snprintf(err, errlen, "pre-tokenizer of %d regex stages (1 to %d supported)", n_stages,
                 TOK_PRE_MAX_STAGES);
        return NULL;
    }
    tok_pre *p = xcalloc(1, sizeof *p);
    p->ignore_merges = ignore_merges;
    for (; p->n_stages < n_stages; p->n_stages++)
        if (!(p->stages[p->n_stages] = compile_stage(stages[p->n_stages], err, errlen))) {
            tok_pre_free(p);
            return NULL;
        }
    return p;
}

const char *tok_pre_byte_level_regex(void) { return RE_GPT2; }

tok_pre *tok_pre_new(const char *name, char *err, size_t errlen) {
    const struct pre_def *def = NULL;
    for (size_t i = 0; i < sizeof PRE_DEFS / sizeof PRE_DEFS[0]; i++)
        if (strcmp(PRE_DEFS[i].name, name) == 0) def = &PRE_DEFS[i];
    if (!def) {
        snprintf(err, errlen, "unknown pre-tokenizer '%s' (supported: " PRE_SUPPORTED ")", name);
        return NULL;
    }
    int n = 0;
    while (n < MAX_STAGES && def->stages[n]) n++;
    tok_pre *p = tok_pre_from_regex(def->stages, n, def->ignore_merges, err, errlen);
    CHECK_INTERNAL(p, "built-in pre-tokenizer '%s': %s", name, err);
    return p;
}

void tok_pre_free(tok_pre *p) {
    if (!p) return;
    for (int i = 0; i < p->n_stages; i++) pcre2_code_free(p->stages[i]);
    free(p);
}

int tok_pre_ignore_merges(const tok_pre *p) { return p->ignore_merges; }

// Appends to *ends (stb_ds array) the end offsets of the matches of `re` in s[beg, end) and of the
// gaps between them. 0, or -1 with a message when PCRE2 fails (e.g. its match limit).
static int split_stage(const pcre2_code *re, pcre2_match_data *md, const char *s, size_t beg,
                       size_t end, size_t **ends, char *err, size_t errlen) {
    PCRE2_SPTR subject = (PCRE2_SPTR)(s + beg);
    size_t n = end - beg, pos = 0;
    while (pos < n) {
        // NO_UTF_CHECK: the caller validated the whole text once (a check per call is O(n^2)).
        int rc = pcre2_match(re, subject, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NOTEMPTY, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            snprintf(err, errlen, "pre-tokenizer failed at byte %zu: %s", beg + pos, (char *)msg);
            return -1;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[0] > pos) arrput(*ends, beg + ov[0]);  // the gap before this match
        arrput(*ends, beg + ov[1]);
        pos = ov[1];
    }
    if (pos < n) arrput(*ends, end);
    return 0;
}

// The piece ends as an stb_ds array (caller arrfree's), or -1. Text must be valid UTF-8.
static int split_all(const tok_pre *p, const char *text, size_t len, size_t **out, char *err,
                     size_t errlen) {
    size_t *cur = NULL, *next = NULL;
    if (len) arrput(cur, len);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    CHECK_INTERNAL(md, "out of memory");
    int rc = 0;
    for (int s = 0; s < p->n_stages && rc == 0; s++) {
        arrsetlen(next, 0);
        size_t beg = 0;
        for (ptrdiff_t i = 0; i < arrlen(cur) && rc == 0; i++) {
            rc = split_stage(p->stages[s], md, text, beg, cur[i], &next, err, errlen);
            beg = cur[i];
        }
        size_t *t = cur; cur = next; next = t;
    }
    pcre2_match_data_free(md);
    arrfree(next);
    if (rc) { arrfree(cur); return -1; }
    *out = cur;
    return 0;
}

int tok_pre_split(const tok_pre *p, const char *text, size_t len, size_t **ends, char *err,
                  size_t errlen) {
    long bad = tok_utf8_invalid_at(text, len);
    if (bad >= 0) {
        snprintf(err, errlen, "text is not valid UTF-8 (byte offset %ld)", bad);
        return -1;
    }
    size_t *arr = NULL;
    if (split_all(p, text, len, &arr, err, errlen)) return -1;
    int n = (int)arrlen(arr);
    *ends = xmalloc((n ? n : 1) * sizeof **ends);
    if (n) memcpy(*ends, arr, n * sizeof **ends);  // arr is NULL when n == 0
    arrfree(arr);
    return n;
}

// s[0..n) as a JSON string (quoted): escapes quotes, backslash and controls; invalid UTF-8 -> U+FFFD.
void tok_json_str(FILE *out, const char *s, size_t n) {
    fputc('"', out);
    size_t i = 0;
    while (i < n) {
        long bad = tok_utf8_invalid_at(s + i, n - i);
        size_t good = bad < 0 ? n - i : (size_t)bad;
        for (size_t j = i; j < i + good; j++) {
            unsigned char c = (unsigned char)s[j];
            if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
            else if (c == '\n') fputs("\\n", out);
            else if (c == '\t') fputs("\\t", out);
            else if (c == '\r') fputs("\\r", out);
            else if (c < 0x20) fprintf(out, "\\u%04x", c);
            else fputc(c, out);
        }
        i += good;
        if (bad >= 0) {
            fputs("\\ufffd", out);
            i++;
        }
    }
    fputc('"', out);
}
