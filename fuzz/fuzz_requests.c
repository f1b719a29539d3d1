// fuzz/fuzz_requests.c — libFuzzer target: the request reader (jobs/request.c: requests_read and
// requests_mark_duplicates) on arbitrary bytes as a --prompts file: sift's JSON Lines fields and
// OpenAI Batch API lines (envelope, body fields honoured, accepted or refused). Every line either
// becomes a request whose fields are inside their documented ranges, or that line's error record
// with a code from the one documented list; no id appears twice (a repeated one becomes its line's
// "line-N"), and only sift names an id line-N. Changed lines: the same bytes with one byte changed
// (picked by the input) are read again, and every line whose bytes did not change settles
// (request_settle) to the same digest, while lines that settle to one digest hold the same
// prompt. The first byte picks --chat.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../jobs/internal.h"

static const char *const codes[] = {JOBS_ERROR_CODES};

static int known_code(const char *c) {
    for (size_t i = 0; c && i < sizeof codes / sizeof *codes; i++)
        if (!strcmp(c, codes[i])) return 1;
    return 0;
}

static void check(const request *q) {
    if (!q->id || q->line < 1 || !q->src) abort();
    if (q->error) {
        if (!known_code(q->code) || !strstr(q->error, "line")) abort();
        return;
    }
    if (q->code) abort();
    if (!q->text && q->n_turns < 1) abort();
    if (q->completions && (q->chat || !q->text || q->n_turns)) abort();
    if (q->n_choices < 1 || q->n_choices > JOBS_MAX_CHOICES) abort();
    if (q->n_stop < 0 || q->n_stop > JOBS_MAX_STOP) abort();
    for (int i = 0; i < q->n_stop; i++)
        if (!q->stop[i] || !q->stop[i][0]) abort();
    if (q->freq_pen < -2 || q->freq_pen > 2 || q->pres_pen < -2 || q->pres_pen > 2) abort();
    if (q->n_predict != -2 && (q->n_predict == 0 || q->n_predict < -1)) abort();
    if (q->temp != -1 && (q->temp < 0 || q->temp > 100)) abort();
    if (q->top_p != -1 && (q->top_p < 0 || q->top_p > 1)) abort();
    if (q->openai && q->temp > 2) abort();   // OpenAI's range
    if (q->seed < -1 || q->seed > (long long)UINT32_MAX) abort();
    for (int i = 0; i < q->n_turns; i++)
        if (!q->roles[i] || !q->contents[i]) abort();
}

static request_list read_all(const uint8_t *data, size_t size) {
    request_list l = {0};
    FILE *fp = fmemopen((void *)(data + 1), size - 1 ? size - 1 : 1, "r");
    if (!fp) abort();
    if (size > 1) requests_read(&l, fp, "fuzz.jsonl", data[0] & 1);
    fclose(fp);
    requests_mark_duplicates(&l, "fuzz.jsonl");
    run_opts o = {.n_predict = 128, .sp = {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f},
                  .seed = -1};
    for (int i = 0; i < l.n; i++)
        if (!l.r[i].error) request_settle(&l.r[i], &o);
    return l;
}

static void list_free(request_list *l) {
    for (int i = 0; i < l->n; i++) req_free(&l->r[i]);
    free(l->r);
}

// The bytes of 1-based line ln of data[1..size) (as requests_read counts lines), or NULL.
static const char *line_at(const uint8_t *data, size_t size, int ln, size_t *n) {
    const char *p = (const char *)data + 1, *end = (const char *)data + size;
    for (int k = 1; p < end; k++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (k == ln) return *n = len, p;
        if (!nl) break;
        p = nl + 1;
    }
    return NULL;
}

static int reserved(const char *id) {
    return !strncmp(id, "line-", 5) && id[5] && strspn(id + 5, "0123456789") == strlen(id + 5);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    request_list l = read_all(data, size);
    for (int i = 0; i < l.n; i++) {
        const request *q = &l.r[i];
        check(q);
        char own[32];
        snprintf(own, sizeof own, "line-%d", q->line);
        if (reserved(q->id) && strcmp(q->id, own)) abort();   // line-N is its own line's only
        for (int j = 0; j < i; j++)   // no id twice among all the records
            if (!strcmp(q->id, l.r[j].id)) abort();
    }
    // one byte changed (where and to what: from the input), then read again
    if (size > 2) {
        uint8_t *b = malloc(size);
        memcpy(b, data, size);
        size_t at = 1 + (size_t)data[size - 1] * 131 % (size - 1);
        b[at] ^= (uint8_t)(data[size / 2] | 1);
        request_list m = read_all(b, size);
        for (int i = 0; i < l.n; i++)
            for (int j = 0; j < m.n; j++) {
                const request *x = &l.r[i], *y = &m.r[j];
                if (x->error || y->error) continue;
                size_t nx, ny;
                const char *lx = line_at(data, size, x->line, &nx), *ly = line_at(b, size, y->line, &ny);
                int same_line = x->line == y->line && lx && ly && nx == ny && !memcmp(lx, ly, nx);
                if (same_line && strcmp(x->digest, y->digest)) abort();   // unchanged: the same digest
                if (!strcmp(x->digest, y->digest) && (!x->text != !y->text || (x->text && strcmp(x->text, y->text))))
                    abort();   // one digest, two prompts
            }
        list_free(&m);
        free(b);
    }
    list_free(&l);
    return 0;
}
