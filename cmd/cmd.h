// cmd/cmd.h — the sift subcommands and what they share. main.c dispatches them: prompts (cmd/run.c:
// `sift` with no subcommand's word), `sift bench` (cmd/bench.c) and the others; cmd/cli.c holds the
// pieces every command needs: flag parsing that exits 2 with one line on bad usage, the strategy
// flags, prompt files, JSON strings, and loading a model + tokenizer (+ draft) onto a backend.
#pragma once
#include <signal.h>
#include <stddef.h>
#include <stdio.h>

#include "../jobs/jobs.h"
#include "../policies/policy.h"
#include "../tok/tok.h"
#include "../model/load.h"
#include "../weights/gguf.h"

#ifndef SIFT_VERSION
#define SIFT_VERSION "unknown"
#endif
#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

// ---- flags (each exits 2 with "sift: error: ... (see sift SUB --help)" on bad input; the table
// and its parser are cmd/flags.h) ----
extern const char *cli_help_name;   // "sift bench": whose --help the errors name
void cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
long long cli_int(const char *flag, const char *s, long long lo, long long hi);
float cli_float(const char *flag, const char *s, double lo, double hi);
// Did you mean: the names of list (separated by '|', ',' or spaces) near word, leading dashes
// ignored: those word is a prefix of or that are a prefix of it (3 characters or more), else those
// fewest edits away (Damerau-Levenshtein, at most about a third of word's length, none for 3
// letters or fewer: 'gpu' is not 'cpu'); up to 3, as
// "did you mean X?" / "did you mean X or Y?" into out (each 'quoted' with quote). "" when none.
const char *cli_suggest(const char *word, const char *list, int quote, char *out, size_t len);
// --strategy NAME[,NAME...] | all -> out (up to MAX_STRATEGIES); the count.
int cli_strategies(const char *v, const strategy **out);
// One line of --help: indent spaces and head, then text from column 26, wrapped at 96 columns
// (on the next line when head reaches past column 26).
void cli_help_line(FILE *out, int indent, const char *head, const char *text);
// --tasks niah,multikey,... | all: eval_task values into out (EVAL_N_TASKS room); the count.
int cli_tasks(const char *v, int *out);
// s ends with suffix, ignoring ASCII case.
int cli_ends_with(const char *s, const char *suffix);
// Checks that each of paths (n; NULL entries skipped; flags[i] names path i in errors: "-o",
// "--plot") can be written later, so that a bad output path fails before a long run, modifying
// nothing (an old file is not truncated: outfile_check): 0, or -1 (error printed).
int cli_check_outputs(const char *const *paths, const char *const *flags, int n);
// Writes file i of paths (n; NULL entries skipped) whole: write(f, i, ctx) into memory, then
// outfile_write (a temporary renamed over a regular file; a device or link written in place).
// 0, or -1 when one could not be written (said on stderr; the others are still written).
int cli_write_outputs(const char *const *paths, const char *const *flags, int n,
                      void (*write)(FILE *f, int i, const void *ctx), const void *ctx);
// The end of a command: stdout flushed and checked (ferror, and close's report through a
// duplicate descriptor; the stream stays usable). A failure is "sift: error: cannot
// write to stdout: ..." and exit code 1 — unless rc is already non-zero (whatever failed said
// so): then nothing more is printed. Returns the exit code.
int cli_finish_stdout(int rc);
// -o FILE of a command that prints its result on stdout (bench, ppl): stdout reopened onto path
// (NULL: stdout stays). 0, or -1 (error printed). Check path first with cli_check_outputs.
int cli_stdout_to(const char *path);
// --haystack FILE (NULL: the built-in filler) into h: 0, or -1 (error printed).
struct eval_haystack;
int cli_load_haystack(const char *path, struct eval_haystack *h);
// --device auto|cpu|cuda: v, or a usage error.
const char *cli_device(const char *v);
// --weights native|fast|exact|f32 (how the CPU backend keeps weights): the mode, or a usage error.
enum bk_weights cli_weights(const char *v);

// Ctrl-C for the commands that stop between prompts and report what was measured (eval,
// sweep): cli_on_sigint sets cli_interrupted and restores the default, so a second Ctrl-C ends
// sift at once.
extern volatile sig_atomic_t cli_interrupted;
void cli_on_sigint(int sig);

// ---- input and output ----
const char *cli_base_name(const char *path);
// The model as the user named it, for messages: the base name of the file or directory given,
// without .gguf ("SmolLM2-135M-Instruct.Q4_1"), into buf; *inside: the name the model carries
// (GGUF general.name) where it says something else, to be shown beside it, or NULL.
const char *cli_model_label(const char *path, const char *internal, char *buf, size_t len,
                            const char **inside);
// The CPUs this process may run on (its affinity mask; else the online CPUs).
int cli_cpu_count(void);
// -t N above cli_cpu_count(): one warning line on stderr naming the count (threads beyond the
// CPUs share them: slower, not faster). flag: how the user wrote it ("-t").
void cli_threads_check(const char *flag, int threads);

// ---- loading (the loader is model/load.h: cmd/ resolves the flags and reports) ----

// The backend for --device auto|cpu|cuda: auto takes the GPU when one is usable and says on
// stderr which it chose; NULL (error printed) when cuda was asked for and cannot be had.
backend *cli_backend(const char *device, int threads, enum bk_weights weights);
// Where and how a model runs: --device, -t (0: all cores), --weights; plan_ctx: the tokens of KV
// cache and activations the memory plan reserves besides the weights (-c; 0: none, each prompt
// checks its own); cache_k/cache_v below; synth_wtype: a synthetic model's weight type (`sift bench --wtype`).
typedef struct {
    const char *device;
    int threads;
    enum bk_weights weights;
    int plan_ctx;
    uint32_t synth_wtype;
    // --cache-type-k/-v: a KV row type (weights/kvrow.h) for K and for V; NULL or "auto": f16
    // on the CPU, the backend's own element elsewhere (cli_kv_default); "native": the backend's
    // own element everywhere. CUDA takes bf16 only.
    const char *cache_k, *cache_v;
    // --ubatch: rows of one prefill pass of a strategy that chunks (ctx_params.ubatch; 0: one
    // pass); the memory plan counts that many rows of activations for it
    int ubatch;
} cli_hw;

// The backend for hw, then model/load.h's load_open of path (-m or $SIFT_MODEL; NULL: the default
// model beside the binary) and draft_path (may be NULL) with the memory plan for hw->plan_ctx
// tokens (activations of min(plan_ctx, hw->ubatch) rows when every strategy of list chunks:
// strategy_prefill_rows) and a run context for each model (L->cx, L->dcx) made with hw's
// --ubatch and cache types; then the strategies' options checked against the model, and run's
// draft context and end-of-generation test filled (run may be NULL). 0, 1 (load failed or does
// not fit) or 2 (bad options); the error is printed.
int cli_load(loaded *L, const char *path, const char *draft_path, const cli_hw *hw,
             const strategy *const *list, int n_list, const strategy_opts *so, strategy_run *run);
// load_weight_bytes (model/load.h) of path (NULL: the default model).
int cli_plan_weight_bytes(const char *path, const char *device, enum bk_weights w, uint32_t wtype,
                          double *bytes, char *err, size_t errlen);
// The KV row type "auto" means on a backend named bk_name whose element is elem_bytes: f16 on
// the CPU (chosen from measured fidelity and speed at depth: bench/RESULTS.md), else the
// backend's own element (CUDA: bf16).
enum kv_type cli_kv_default(const char *bk_name, size_t elem_bytes);
// --cache-type-k/-v values (NULL or "auto": cli_kv_default; "native", from callers only: the
// backend's own element, f32 on the CPU) for a backend named
// bk_name whose element is elem_bytes: the K and V row types. 0, or -1 + one-line err naming the
// flag and the device (CUDA's cache is bf16 only).
int cli_kv_types(const char *cache_k, const char *cache_v, const char *bk_name, size_t elem_bytes,
                 enum kv_type *k, enum kv_type *v, char *err, size_t errlen);
// --wtype NAME (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k): the ggml type, or
// a usage error.
uint32_t cli_wtype(const char *v);
// Backends compiled into this binary, e.g. "cpu, cuda".
#ifdef SIFT_CUDA
#define CLI_BACKENDS "cpu, cuda"
#else
#define CLI_BACKENDS "cpu"
#endif
void cli_unload(loaded *L);
// path (NULL: the default model) names a synthetic model: synthetic:NAME[@SEED]. It has no tokenizer
// (L->t stays NULL), so only `sift bench` runs it.
int cli_is_synthetic(const char *path);
// 2 (error printed, naming cmd) when path is a synthetic model, which has no tokenizer; else 0.
int cli_refuse_synthetic(const char *path, const char *cmd);
// The config of path (GGUF, HF directory or synthetic:NAME) without loading weights; 0 or -1 with
// err. The caller frees c->inv_freq.
int cli_config(const char *path, model_config *c, char *err, size_t errlen);

// ---- subcommands: argv[1] is the command's name (cmd_run: its first flag or file) ----
int cmd_run(int argc, char **argv);    // cmd/run.c: `sift [options]`, prompts
int cmd_bench(int argc, char **argv);
int cmd_eval(int argc, char **argv);   // cmd/evaluate.c
int cmd_sweep(int argc, char **argv);  // cmd/sweep.c
int cmd_ppl(int argc, char **argv);    // cmd/ppl.c
int cmd_fit_phi(int argc, char **argv);   // cmd/fit_phi.c
