// jobs/internal.h — what the files of jobs/ share: a request (one input line or file), a
// unit (one request run by one strategy), a job (a request and its units), the runner (the run's
// state and totals), and the functions each file gives the others.
#pragma once
#include <signal.h>
#include <stdio.h>

#include "../policies/prompt_cache.h"
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
    int top_k;              // < 0: the run's --top-k
    float min_p;            // < 0: the run's --min-p
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
    int parsed;             // --prompts: the line is JSON (a line that is not is no vote on the format)
    int announced;          // its "N prompt tokens" line is out (once per prompt, not per strategy
                            // or repetition)
    int prefix_group;       // its shared prefix (jobs/prefix.c): group + 1; 0: none
    char digest[17];        // the request as normalised (request_settle): its records carry it, and
                            // --resume reruns a request whose record holds another
} request;

// The Batch API error codes sift writes (docs/batch.md lists them): a line that cannot be read or holds a
// bad value; a field, URL or method sift does not implement; a prompt too long for the context;
// a failure while running; a request a signal stopped in flight (--resume runs it again).
#define JOBS_ERROR_CODES "invalid_request", "unsupported_parameter", "unsupported_url", \
                         "unsupported_method", "context_length_exceeded", "server_error", \
                         "batch_cancelled"
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

// Where records go: stdout (f), or --output / --errors (fd). A record is one write; on a failed
// write the file is cut back to `end`, the end of its last whole record.
typedef struct rec_sink {
    FILE *f;                 // stdout, or NULL
    int fd;                  // the file, or -1
    const char *name;        // for messages: "--output 'x'", "stdout"
    long long end;           // bytes of whole records (a regular file)
    int regular;             // a regular file (else a device or pipe: written in place)
    double last_sync;        // when it was last fsync'ed (ms)
} rec_sink;

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
    int rep;                 // which repetition (--repeat): only repetition 0 writes text and records
    int first_agree;         // first token equals full's (-1: full not run)
    double greedy_agree;     // % of full's generated tokens matched at the same step (-1: n/a)
    keptmap *km;             // --kept-map: what it kept (captured after prefill and decode)
    int packed;              // its prefill waits for (or ran in) a pass shared with other prompts
                             // (gen_open, gen_prefill_packed; jobs/run.c)
    int interrupted;         // a signal stopped it: 1 in flight (its record says so, --resume reruns
                             // it), 2 before it started (no record: --resume runs it)
    size_t shown;            // bytes of its text on stdout (streamed)
    const struct unit *reps; // --repeat: its job's units (the other repetitions' timings), or NULL
    int n_reps_units;
    int prefix_counted;      // its use of its request's shared prefix is counted (prefix_put)
} unit;

// Signals (jobs/run.c): how many arrived, and whether a record is being written (a second signal
// then waits for it to be whole: jobs_exit_if_asked after the write).
extern volatile sig_atomic_t jobs_signals, jobs_writing;
void jobs_exit_if_asked(void);

// CPU time of the whole machine (all CPUs, seconds: busy and stolen) and of this process, at wall
// time `wall` (0: unknown).
typedef struct { double busy, steal, self, wall; } cpu_sample;

typedef struct runner {
    const run_opts *o;
    context *cx;   // the run every request is a sequence of
    model *m;      // cx->m
    const tok *t;
    const char *dev, *model_name;
    double load_ms;
    int n_ctx;
    rec_sink *out, *errs;    // records (stdout, or --output), failed ones (--errors; else out)
    int openai;              // records in the OpenAI Batch API's shape
    int n_skipped;           // requests of this shard an earlier run wrote (--resume)
    keptmap **km;            // --kept-map: the runs written so far
    int n_km;
    // totals for progress and the summary
    int n_req, n_done, n_failed;
    int n_failed_before;     // error records an earlier run wrote that --resume keeps (the job's
                             // exit code and summary count them: the file's truth)
    int n_stopped;           // requests written as interrupted (a signal)
    long prompt_tok, gen_tok, decode_tok;   // decode_tok: tokens of the shared decode steps
    double prefill_ms, decode_ms, t0, last_progress;   // prefill_ms: packed passes' wall time
                                                       // + the other prompts' TTFT
    int pack_rows;           // rows of a packed prefill pass at most (0: each prompt alone)
    cpu_sample cpu_mark;     // the machine's CPU time at the last A/B table (or the start)
    // --prefix-cache (jobs/prefix.c): on for this run; the groups planned; what was built and is
    // held now (bytes), its peak, and the prefixes' prefill time (not in any request's TTFT)
    int prefix_on;
    struct prefix_group *prefix_group;
    int n_prefix_group, prefix_built;
    long prefix_tok, prefix_reused_tok;
    size_t prefix_bytes, prefix_peak;
    double prefix_ms;
    // --prompt-cache: the file read and checked (pc_valid), its prefix loaded for the length
    // last taken, what was loaded and saved
    unsigned char *pc_buf;
    size_t pc_len;
    struct pcache_view pc_view;
    int pc_valid, pc_saved, pc_failed, pc_saved_tok;
    kv_prefix *pc_prefix;
    long pc_loaded_tok;
    double pc_load_ms;
} runner;

// A request of this run and its sequences (one per strategy).
typedef struct job {
    request *rq;
    unit *u;
    int n_units, n_left;     // units, and those not done
    int written;
} job;

// ---- jobs/run.c ----
// q's prompt tokens: its text (a file read now), in the chat template when asked. n, or -1 + err.
int jobs_prompt_ids(const runner *R, request *q, int **ids, char *err, size_t errlen);

// ---- jobs/prefix.c (--prefix-cache) ----
// Plans the shared prefixes of the jobs' requests (R->prefix_on): each request's group (its
// prefix_group), said on stderr.
void prefix_plan(runner *R, job *jobs, int n_jobs);
// The shared prefix unit u (its tokens u->ids) may copy, built now by its group's first user;
// NULL: none (not a user, no group, tokens not as planned, or it could not be kept).
const kv_prefix *prefix_take(runner *R, unit *u);
// u's use of its prefix is over (copied, or it failed first): the prefix freed after its last.
void prefix_put(runner *R, unit *u);
void prefix_plan_free(runner *R);
// --prompt-cache: the file read and checked against this run (absent: made later). 0, or -1 +
// err (unreadable, damaged, or made by another model, row type, backend, weights or --ubatch).
int prefix_file_open(runner *R, char *err, size_t errlen);
// After u's prefill: the run's first plain prefill saved to the file (its longest cut), unless
// the file holds it already or is read-only.
void prefix_file_save(runner *R, unit *u);

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
// q's values that the run's flags or OpenAI's defaults decide (n_predict, temp, top_p, top_k,
// min_p, seed, stop; a Batch API request takes OpenAI's defaults where the command line gave
// none), then q->digest: the hash of the request as it runs (its prompt, a -f file's bytes,
// system, messages, sampling, stop strings, n, penalties, its own strategy).
void request_settle(request *q, const run_opts *o);
// The hash of strategy s and its settings in this run (o->so): a record's options_digest.
void options_digest(const run_opts *o, const strategy *s, char out[17]);
void req_free(request *q);

// ---- jobs/resume.c (--resume, and the lock of an output) ----
// The key of a (request, strategy) outcome in a done_set; strategy NULL: the request as a whole
// (the Batch API's shape). error_key: the outcome of request q that cannot run (its error record).
char *unit_key(const char *id, const char *strategy);
char *error_key(const request *q);
int done_has(const done_set *d, const char *key);
void done_free(done_set *d);

enum { SHAPE_NONE, SHAPE_SIFT, SHAPE_OPENAI };           // a record's shape
enum { RESUME_KEEP, RESUME_TRUNCATE, RESUME_REWRITE };   // what a records file needs

// A record of an earlier run's output.
typedef struct out_record {
    char *id, *strategy;     // id / custom_id; sift's shape: its strategy (NULL: a bad line's error)
    char *error;             // an error record's message, or NULL (an answer)
    int shape;               // SHAPE_SIFT or SHAPE_OPENAI
    int line_error;          // may be a request line's error (sift: no strategy; Batch API: a code
                             // other than a run's failure, context_length_exceeded or server_error)
    char *digest, *options;  // request_digest, options_digest (NULL: a record of an older sift)
    int interrupted;         // a signal stopped it (sift: stop "interrupted"; Batch: batch_cancelled)
    int line;                // 1-based
    long long off, len;      // its bytes in the file, the newline included
    int file;                // 0 --output, 1 --errors
    long long order;         // its place in input order (resume_plan)
    int keep;                // kept (resume_plan)
} out_record;

// The records of one file, and what was wrong in it.
typedef struct out_scan {
    out_record *r;
    int n, cap;
    int exists;
    int quiet;               // no report on stderr (the fuzz target)
    int n_dropped, n_reported, n_retried;   // lines dropped (each reported), failures rerun
    int n_changed, n_interrupted;           // records of requests changed since, or interrupted
    int n_failed_kept;                      // kept records that are errors
    int torn;                // the last line has no newline (a write cut short)
    long long good_end;      // the end of the last line with a newline
    long long size;          // bytes read
} out_scan;

// Reads fp's lines (at most max_line bytes each; a longer line is skipped, not held) into s;
// each line that is no record is reported on stderr (name, line, byte offset) and counted.
// 0, or -1 on a read error (errno).
int resume_scan(FILE *fp, const char *name, int file, size_t max_line, out_scan *s);
// The same for the file at path (none there: no records). 0, or -1 + err.
int resume_read(const char *path, int file, size_t max_line, out_scan *s, char *err, size_t errlen);
void scan_free(out_scan *s);
// Matches the records of sc[0..n_sc) (--output, then --errors) to this run's outcomes (all
// requests, this shard [lo, hi), o's strategies, records of `shape`): keeps the first record of
// each outcome, drops (and reports) records of the other shape, second records, error records that
// are no longer their request's outcome (its line changed; final: only damage is dropped) and,
// with --retry-failed, failures; adds the kept outcomes to done (when not NULL); sets action[f].
// -1 + err (naming the file and the request file) when a file holds records of another run:
// only the other shape, a request of no shard of this input, another shard's, another strategy's.
int resume_plan(out_scan *sc, int n_sc, const char *const *names, int shape, const request *all, int n_all,
                int lo, int hi, const run_opts *o, int final, done_set *done, int *action, char *err,
                size_t errlen);
// Carries out action on path: cuts the torn last line off, or writes the kept records of s in
// input order into a new file beside it (mkstemp, fsync) renamed over it (the directory fsync'ed).
int resume_rewrite(const char *path, const out_scan *s, int action, char *err, size_t errlen);
// The kept records of s, in input order, from in (the file s was read from) to out. 0, or -1 (errno).
int resume_copy(int in, int out, const out_scan *s);
// Removes the temporaries of a rewrite that was killed midway (.NAME.XXXXXX beside path).
void resume_clean_temps(const char *path);

// The lock of an output file: FILE.lock beside it, flock'ed for the whole run and holding the
// pid; the kernel drops it when the process ends (kill -9 included). Taken: 0; held by another
// sift: -1 + err naming its pid, or (wait) waits for it. Released (the file removed) at exit.
typedef struct out_lock {
    char *path;
    int fd;
} out_lock;
int out_lock_take(out_lock *l, const char *target, int wait, int quiet, char *err, size_t errlen);
void out_lock_release(out_lock *l);

// ---- jobs/record.c ----
// How each unit compares with `full` on the same request.
void compare_with_full(unit *u, int n, int n_layer);
void print_timing(const runner *R, const unit *u);
// u's record (R->format's shape), or the error record of a request that could not run.
void record_unit(runner *R, const unit *u);
void record_error(runner *R, const request *q);
// The A/B table after the texts: one row per strategy (--repeat: medians and spreads).
void print_table(const unit *u, int n);
void print_table_reps(const unit *u, int n);
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
