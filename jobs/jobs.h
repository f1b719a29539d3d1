// jobs/jobs.h — batch jobs: the requests of a run (-p, -f, --batch DIR, --prompts FILE.jsonl in
// sift's shape or the OpenAI Batch API's), this process's shard of them less what --resume finds
// done, run through up to --parallel sequences at a time (continuous batching), written as
// records (sift's shape or the Batch API's output objects) with a summary beside them.
// jobs/request.c reads requests (and settles their values and digests), jobs/resume.c what an
// earlier run wrote (--resume) and locks an
// output, jobs/record.c writes records, tables and the summary, jobs/run.c schedules the
// sequences, jobs/keptmap.c draws what each strategy kept.
#pragma once
#include <stddef.h>

#include "../policies/policy.h"
#include "../tok/tok.h"

#define MAX_STRATEGIES 16

// The records' shape: sift's own (timings, settings, agreement), or the OpenAI Batch API's output
// objects; auto: the Batch API's when the --prompts lines are Batch API requests.
enum run_format { RUN_FORMAT_AUTO, RUN_FORMAT_SIFT, RUN_FORMAT_OPENAI };

enum { RUN_GIVEN_TEMP = 1, RUN_GIVEN_TOP_K = 2, RUN_GIVEN_TOP_P = 4, RUN_GIVEN_MIN_P = 8,
       RUN_GIVEN_N_PREDICT = 16 };

typedef struct run_opts {
    const char *prompt, *system;   // -p, --system
    char **files;                  // -f (repeatable), then --batch DIR's .txt files
    int n_files;
    const char *prompts_path;      // --prompts FILE.jsonl ('-' = stdin)
    const char *output;            // --output FILE (JSON records), or NULL: stdout
    const char *errors;            // --errors FILE: the failed requests' records (else with the rest)
    const char *summary;           // --summary FILE: the run's summary as one JSON object
    const char *kept_map;          // --kept-map FILE.html: what each strategy kept, drawn
    enum run_format format;        // --output-format auto|sift|openai
    int resume, unordered;         // --resume, --unordered
    int retry_failed, wait_lock;   // --retry-failed (with --resume), --wait-lock
    int shard_k, shard_n;          // --shard K/N (0-based K; n 0: no sharding)
    int parallel;                  // --parallel N: sequences in flight
    int prefix_cache;              // --prefix-cache: -1 auto (on but in an A/B comparison), 1 on, 0 off
    int prefix_min;                // --prefix-min N: the fewest tokens a shared prefix has
    const char *prompt_cache;      // --prompt-cache FILE (a plain prefill on disk), or NULL
    int prompt_cache_ro;           // --prompt-cache-ro: read it, never write it
    const char *weights;           // --weights as given (a prompt cache names it)
    int reps;                      // --repeat N: each strategy N times per prompt, in rotating order
    int n_predict, chat, json, quiet, threads;
    long long seed;
    sample_params sp;
    unsigned given;                // RUN_GIVEN_* bits: the flags of sp and -n given on the command
                                   // line (else a Batch API request takes OpenAI's defaults)
    const char **stop;             // --stop / -r STR (repeatable): the answer ends before the first
    int n_stop;                    // (a request's own 'stop' replaces them)
    const strategy *strategies[MAX_STRATEGIES];   // --strategy a,b,c (A/B comparison)
    int n_strategies;
    strategy_opts *so;
    const strategy_run *run;
} run_opts;

// Adds path to o's -f files; adds every DIR/*.txt (in name order) of --batch DIR: 0, or -1 + err
// (cannot be opened, or holds no .txt file).
void jobs_add_file(run_opts *o, const char *path);
int jobs_add_batch_dir(run_opts *o, const char *dir, char *err, size_t errlen);

// One prompt of o, tokenized as a run tokenizes it (its file read, the chat template applied).
typedef struct run_prompt {
    char *id;      // as in the JSON records: the -f path, the --prompts id or "line-N", "prompt"
    int *ids, n_ids;
} run_prompt;
// Every prompt of o (-p, -f, --batch's files, --prompts FILE.jsonl) in input order; a request's
// own fields besides its prompt (n_predict, temp, strategy, ...) are not read. The count, or -1
// + err naming the first that cannot be read or tokenized.
int jobs_read_prompts(const run_opts *o, const tok *t, run_prompt **out, char *err, size_t errlen);
void jobs_prompts_free(run_prompt *p, int n);

// --kept-map FILE's data file: FILE.json (FILE less .html, or FILE with .json appended), malloc'd;
// NULL when FILE is a device or pipe (there is no "beside" it: the data stays inside the page).
char *jobs_kept_map_json(const char *path);

// Whether another sift holds the lock of output file target (FILE.lock, jobs/resume.c): 1 with
// its pid in pid[0..n), else 0.
int jobs_output_locked(const char *target, char *pid, size_t n);

// Runs every request of o (this shard, less what --resume finds done) as sequences of run
// context cx over the loaded model;
// the exit code: 0, 1 (a request failed), or 128 + the signal that interrupted the run.
int jobs_run(const run_opts *o, context *cx, const tok *t, const char *dev, const char *model_name,
             double load_ms, int n_ctx);
