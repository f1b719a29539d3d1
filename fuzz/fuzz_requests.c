// fuzz/fuzz_requests.c — libFuzzer target: the request reader (jobs/request.c: requests_read and
// requests_mark_duplicates) on arbitrary bytes as a --prompts file: sift's JSON Lines fields and
// OpenAI Batch API lines (envelope, body fields honoured, accepted or refused). Every line either
// becomes a request whose fields are inside their documented ranges, or that line's error record
// with a code from the one documented list; no id is run twice. The first byte picks --chat.
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
    if (q->top_p != -1 && (q->top_p <= 0 || q->top_p > 1)) abort();
    if (q->seed < -1 || q->seed > (long long)UINT32_MAX) abort();
    for (int i = 0; i < q->n_turns; i++)
        if (!q->roles[i] || !q->contents[i]) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    FILE *fp = fmemopen((void *)(data + 1), size - 1 ? size - 1 : 1, "r");
    if (!fp) return 0;
    request_list l = {0};
    if (size > 1) requests_read(&l, fp, "fuzz.jsonl", data[0] & 1);
    fclose(fp);
    requests_mark_duplicates(&l, "fuzz.jsonl");
    for (int i = 0; i < l.n; i++) {
        check(&l.r[i]);
        for (int j = 0; j < i; j++)   // ids of the requests that run are unique
            if (!l.r[i].error && !l.r[j].error && !strcmp(l.r[i].id, l.r[j].id)) abort();
    }
    for (int i = 0; i < l.n; i++) req_free(&l.r[i]);
    free(l.r);
    return 0;
}
