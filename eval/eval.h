// eval/eval.h — the long-context task suite behind `sift eval`: haystacks (built-in filler or a
// user's text cut into sentences), deterministic task generators in RULER's shapes (niah,
// multikey, multivalue, vt, cwe) fitted to a token budget, string-match scoring, the KL of two
// logit vectors, and the reports (table, JSON, CSV, SVG plot) over the measured records.
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "../tok/tok.h"
#include "pareto.h"

// splitmix64: the generator behind every random choice of the suite (same seed, same prompt).
uint64_t eval_rand(uint64_t *state);

// ---- haystack ----
// A list of sentences; sentence i of a haystack of n is sents[i % n] (a user's text repeats when
// the context needs more of it). Without sents, sentence i is built-in filler made from
// (seed, i): short plain sentences with no digits.
typedef struct eval_haystack {
    char **sents;
    int n;
} eval_haystack;

// Splits text into whole sentences (ending in . ! or ? before white space or the end).
// 0, or -1 + err (invalid UTF-8, no sentence).
int eval_haystack_from_text(eval_haystack *h, const char *text, size_t len, char *err,
                            size_t errlen);
void eval_haystack_free(eval_haystack *h);
// Sentence i (malloc'd) for the prompt seeded with seed.
char *eval_haystack_sentence(const eval_haystack *h, uint64_t seed, long i);

// ---- tasks ----
typedef enum { EVAL_NIAH, EVAL_MULTIKEY, EVAL_MULTIVALUE, EVAL_VT, EVAL_CWE, EVAL_N_TASKS } eval_task;

#define EVAL_MAX_ANSWERS 8

const char *eval_task_name(eval_task t);
int eval_task_find(const char *name);      // -1 if unknown
int eval_task_n_gen(eval_task t);          // tokens generated for the answer
const char *eval_task_names(void);         // "niah, multikey, ..." for help and errors

typedef struct eval_prompt {
    char *text;                   // the whole prompt (chat template and answer prefix applied)
    int *ids, n_ids;              // its tokens, BOS included when the model adds one
    char answers[EVAL_MAX_ANSWERS][32];
    int n_answers;
    double depth;                 // niah, multikey: depth of the asked needle in [0,1]; else -1
    int n_context;                // the tokens before the question (those the prompt shares with
                                  // its text cut before the question: `eval --query-agnostic`)
} eval_prompt;

// What fixes a prompt: task, token budget, the user's seed, sample index and count (niah and
// multikey spread the asked needle's depth over the samples: (sample + 0.5) / n_samples).
typedef struct eval_spec {
    eval_task task;
    int ctx;             // prompt tokens + the task's n_gen stay within ctx
    uint64_t seed;
    int sample, n_samples;
    int chat;            // wrap in the model's chat template
} eval_spec;

// Builds the prompt of spec: the largest number of haystack sentences (cwe: list entries) whose
// prompt still fits ctx. 0, or + err: -2 (ctx too small for the task: --n-prompt's fault) or -1
// (tokenizer failure).
int eval_make_prompt(const tok *t, const eval_haystack *h, const eval_spec *spec, eval_prompt *p,
                     char *err, size_t errlen);
void eval_prompt_free(eval_prompt *p);

// ---- scoring ----
// RULER's string match: the fraction of answers found (case-insensitively) in text.
double eval_score(const char answers[][32], int n_answers, const char *text);
// KL(p || q) in nats of the softmax distributions of logits p and q (n,).
double eval_kl(const float *p, const float *q, int n);

// ---- records and reports ----
// One strategy's run on one prompt.
typedef struct eval_record {
    const char *strategy;
    eval_task task;
    int ctx, sample, prompt_tokens;
    uint64_t seed;
    double depth;
    char expected[EVAL_MAX_ANSWERS * 33];   // answers joined by '|'
    char *answer;                           // generated text (owned)
    double score;
    int first_agree;                        // first token equals full's
    double greedy_agree;                    // share of full's tokens matched at the same step
    double kl;                              // KL(full || this) of the first token, nats
    double ttft_ms, tpot_ms;
    double kv_mib;
    char note[200];
} eval_record;

typedef struct eval_report {
    const char *model;
    uint64_t seed;
    int samples;
    const char *const *strategies;          // in run order, "full" first
    int n_strategies;
    const int *tasks;                       // eval_task values
    int n_tasks;
    const int *ctxs;
    int n_ctxs;
    const eval_record *recs;
    int n_recs;
    int complete;                           // 0: interrupted
    int query_agnostic;                     // --query-agnostic: the context compressed without
                                            // the question (prefill strategies that compress)
} eval_report;

// Markdown tables: per strategy x task x ctx cells, then the per-strategy summary and the cells
// where a strategy falls under 95% of full's accuracy.
void eval_print_tables(FILE *out, const eval_report *r);
// A table cell: v in fmt ("%.3f"), or "-" for NaN (a ratio against a zero reference, no value).
void eval_table_num(FILE *out, const char *fmt, double v);
void eval_write_json(FILE *out, const eval_report *r);
void eval_write_csv(FILE *out, const eval_report *r);
// Accuracy vs context and TTFT vs context, one line per strategy, as an SVG document into f (the
// caller writes the file whole: cli_write_outputs).
void eval_write_svg(FILE *f, const eval_report *r);
// `sift sweep --plot`: a scatter of points p (n,) (x right, y up), coloured by group[i], each
// labelled; the points with on[i] set (the Pareto frontier) ringed and, two or more, connected
// in x order; a legend names each colour by the first word of its first point's label (the
// strategy: labels[i] starts with it) and says what the ring and lines are; an SVG document into f.
void eval_write_scatter_svg(FILE *f, const char *x_label, const char *y_label,
                            const pareto_point *p, const char *const *labels, const int *group,
                            const int *on, int n);
