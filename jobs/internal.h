// jobs/internal.h — what the three files of jobs/ share: a request (one input line or file), a
// unit (one request run by one strategy), a job (a request and its units), the runner (the run's
// state and totals), and the functions each file gives the others.
#pragma once
#include <stdio.h>

#include "../util/check.h"
#include "jobs.h"

typedef struct request {
    int index;              // position in the whole input (before sharding)
    char *id;               // --prompts: id / custom_id (else "line-N"); -f: the path; -p: "prompt"
    const char *file;       // -f / --batch: the path (read when the request starts)
    const char *src;        // --prompts: the file's path
    int line;               // --prompts: 1-based line; 0 otherwise
    char *text;             // the prompt text (NULL: read `file`, or `turns` hold it)
    char *system;           // system text, or NULL
    int n_turns;            // messages: roles and contents (chat template)
    char **roles, **contents;
    int chat;               // wrap in the chat template
    int n_predict;          // -2: the run's -n
    float temp;             // < 0: the run's --temp
    float top_p;            // < 0: the run's --top-p
    long long seed;         // -1: the run's -s
    const strategy *strategy;   // NULL: the run's --strategy list
    char *error;            // set: this request is an error record, not a run
    const char *code;       // error's Batch API code (one of JOBS_ERROR_CODES; NULL: invalid_request)
    int openai;             // --prompts: the line is an OpenAI Batch API request (has 'body')
    int completions;        // url /v1/completions: a raw prompt, a text_completion answer
    char **stop;            // stop strings (at most 4): the answer ends before the first one
    int n_stop;
    int n_choices;          // answers to the prompt (OpenAI's n), sharing one prefill
    float freq_pen, pres_pen;   // OpenAI's frequency_penalty, presence_penalty (0: off)
} request;

// The Batch API error codes sift writes (README lists them): a line that cannot be read or holds a
// bad value; a field, URL or method sift does not implement; a prompt too long for the context;
// a failure while running.
#define JOBS_ERROR_CODES "invalid_request", "unsupported_parameter", "unsupported_url", \
                         "unsupported_method", "context_length_exceeded", "server_error"
#define JOBS_MAX_CHOICES 128   // OpenAI's limit on n
#define JOBS_MAX_STOP 4        // and on stop strings

typedef struct {
    request *r;
    int n, cap;
} request_list;

typedef struct {
    char **keys;   // "id\tstrategy" (error records: "id\t"), sorted
    int n;
} done_set;

typedef struct keptmap keptmap;   // jobs/keptmap.c

typedef struct unit {
    request *rq;
    int job;                 // its job's index
    const strategy *s;
    int state;               // 0 waiting, 1 running, 2 done
    int rc;                  // 0, or -1 with err
    char err[512];
    int *ids, n_ids;         // the prompt's tokens
    int n_gen;
    unsigned long long seed;
    gen_seq g;
    sampler smp;
    tok_answer ans;          // every sampled token (end-of-generation included) and the text
    int stream, hit_eog;
    const char *code;        // a failure's Batch API error code (invalid_request, ...)
    int choice;              // which of the request's n answers (0: the one that prefills; the
                             // others follow it in their job's units and copy its prefill)
    gen_seq *proto;          // choice 0 of n > 1: its sequence right after prefill, which the
                             // later choices copy (the last takes it over); else NULL
    int hit_stop;            // the answer ended at a stop string (cut before it)
    double rows_pct;         // prompt rows processed over layers, % of full's n * L
    int rep;                 // which repetition (-r): only repetition 0 writes text and records
    int first_agree;         // first token equals full's (-1: full not run)
    double greedy_agree;     // % of full's generated tokens matched at the same step (-1: n/a)
    keptmap *km;             // --kept-map: what it kept (captured after prefill and decode)
} unit;

// CPU time of the whole machine (all CPUs, seconds: busy and stolen) and of this process, at wall
// time `wall` (0: unknown).
typedef struct { double busy, steal, self, wall; } cpu_sample;

typedef struct runner {
    const run_opts *o;
    model *m;
    const tok *t;
    const char *dev, *model_name;
    double load_ms;
    int n_ctx;
    FILE *out;               // records (stdout, or --output)
    int openai;              // records in the OpenAI Batch API's shape
    int n_skipped;           // requests of this shard an earlier run wrote (--resume)
    keptmap **km;            // --kept-map: the runs written so far
    int n_km;
    // totals for progress and the summary
    int n_req, n_done, n_failed;
    long prompt_tok, gen_tok, decode_tok;   // decode_tok: tokens of the shared decode steps
    double prefill_ms, decode_ms, t0, last_progress;
    cpu_sample cpu_mark;     // the machine's CPU time at the last A/B table (or the start)
} runner;

// A request of this run and its sequences (one per strategy).
typedef struct job {
    request *rq;
    unit *u;
    int n_units, n_left;     // units, and those not done
    int written;
} job;

// ---- jobs/request.c ----
// A formatted string (malloc'd; out of memory is an internal failure).
char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
// Appends the requests of JSON Lines read from fp (named path in errors; sift's fields or the
// Batch API's request shape; a bad line becomes that line's error record with its code), then
// marks repeated ids as errors. Untrusted input: never fails (fuzz/fuzz_requests.c).
void requests_read(request_list *l, FILE *fp, const char *path, int chat);
void requests_mark_duplicates(request_list *l, const char *path);
// Every request of the run, in input order; duplicate ids become error records.
request_list jobs_collect(const run_opts *o);
void req_free(request *q);
// The key of a (request, strategy) record in a done_set; strategy NULL: the request as a whole.
char *unit_key(const char *id, const char *strategy);
int done_has(const done_set *d, const char *key);
// The records of an earlier run's --output file (either shape); a last line cut short (a kill
// during its write) is removed from the file. 0, or -1 + err.
int read_done(done_set *d, const char *path, int quiet, char *err, size_t errlen);
void done_free(done_set *d);

// ---- jobs/record.c ----
// How each unit compares with `full` on the same request.
void compare_with_full(unit *u, int n, int n_layer);
void print_timing(const runner *R, const unit *u);
// u's record (R->format's shape), or the error record of a request that could not run.
void record_unit(runner *R, const unit *u);
void record_error(runner *R, const request *q);
// The A/B table after the texts: one row per strategy (-r: medians and spreads).
void print_table(const unit *u, int n);
void print_table_reps(const unit *u, int n, int reps);
cpu_sample cpu_now(void);
void machine_note(runner *R);
// The run's summary: a line on stderr (unless -q), and the JSON object into --summary FILE.
// 0, or -1 when FILE could not be written (error printed).
int write_summary(runner *R, int slots, int interrupted);

// ---- jobs/keptmap.c (--kept-map) ----
// After u's prefill: which prompt tokens each cache layer holds, per KV head.
void km_capture_prefill(unit *u);
// Before u's cache is freed: how often decode read each prompt key (topk, topk+phi).
void km_capture_decode(unit *u);
// u is written: its map moves to R's list, with its answer and its agreement with full.
void km_keep(runner *R, unit *u);
void km_free(keptmap *k);
// The page (path) and its data (path's .json): 0, or -1 (error printed).
int km_write(runner *R, const char *path);
