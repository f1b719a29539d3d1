// cmd/flags.h — sift's one flag table: every flag of every subcommand is one row (the
// subcommands it applies to, its type, range, default, environment variable, help), after the
// model of llama.cpp's common/arg.cpp. Every subcommand parses its argv with flags_parse, which
// validates types and ranges and answers --help; --help, the bash, zsh and fish completions, the man
// page and docs/usage.md's flag table are printed from the same rows (sift --help-markdown, --completion
// bash|zsh|fish, --man, --list-flags). The strategy parameters are rows too: policies/options.c keeps
// them (which strategy reads which, the settings echo), and the table takes them in as rows.
#pragma once
#include <stdio.h>

#include "../policies/policy.h"

// The subcommands, as bits of a row's set.
enum {
    SUB_RUN = 1, SUB_BENCH = 2, SUB_EVAL = 4, SUB_SWEEP = 8, SUB_PPL = 16, SUB_FIT = 32,
    SUB_ALL = 63, SUB_STRATS = SUB_RUN | SUB_BENCH | SUB_EVAL | SUB_SWEEP,
};
#define FLAG_N_SUBS 6

// Every flag a subcommand reads, by what it means.
typedef enum {
    FL_MODEL, FL_PROMPT, FL_FILE, FL_BATCH, FL_PROMPTS, FL_CHAT, FL_SYSTEM,
    FL_N_PREDICT, FL_CTX, FL_N_PROMPT, FL_TEMP, FL_TOP_K, FL_TOP_P, FL_MIN_P, FL_SEED, FL_STOP,
    FL_STRATEGY, FL_REPEAT, FL_DEVICE, FL_THREADS, FL_WEIGHTS, FL_WTYPE, FL_CACHE_TYPE_K, FL_CACHE_TYPE_V, FL_PARALLEL, FL_UBATCH,
    FL_TASKS, FL_SAMPLES, FL_HAYSTACK, FL_DUMP, FL_QUERY_AGNOSTIC, FL_GRID, FL_FIDELITY, FL_SPEED, FL_MIN_AGREE,
    FL_CHUNKS, FL_DATA, FL_STEPS, FL_QUERIES, FL_FIT_BATCH, FL_LR, FL_D_PHI, FL_CALIBRATE,
    FL_MARGIN, FL_POSITIONS, FL_CHECK, FL_RECAL, FL_VERIFY,
    FL_OUTPUT, FL_FORMAT, FL_BENCH_PREFIX, FL_CSV, FL_PLOT, FL_RESUME, FL_ERRORS, FL_RETRY, FL_WAIT_LOCK,
    FL_SHARD, FL_UNORDERED, FL_PREFIX_CACHE, FL_PREFIX_MIN, FL_PROMPT_CACHE, FL_PROMPT_CACHE_RO, FL_KEPT_MAP, FL_SUMMARY, FL_JSON, FL_OUTPUT_FORMAT, FL_DRY_RUN,
    FL_ELEM_BYTES, FL_RATES, FL_QUIET, FL_VERBOSE, FL_HELP, FL_VERSION,
    FL_COUNT,
    FL_STRAT_OPT = 1000,   // a strategy parameter row (its opt_def says which)
} flag_id;

typedef enum {
    FT_SWITCH,   // no value (given twice: counted, -v -v)
    FT_STR,      // text
    FT_PATH,     // a file or directory
    FT_INT,      // an integer in [lo, hi]; a comma list of them in the subcommands of list_subs
    FT_FLOAT,    // a number in [lo, hi]
    FT_ENUM,     // one of choices "a|b|c" (the index in i)
    FT_NAMES,    // a comma list of names the subcommand knows (strategies, tasks)
    FT_STRAT,    // a strategy parameter: policies/options.c parses it into strategy_opts
} flag_type;

typedef struct flag_row {
    flag_id id;
    unsigned subs;           // the subcommands that take it
    const char *s, *l;       // "-n", "--n-predict" (s may be NULL)
    const char *alias;       // llama.cpp's or another accepted name ("--n-gen"), or NULL
    const char *metavar;     // "N" (NULL for a switch)
    flag_type type;
    double lo, hi;           // FT_INT, FT_FLOAT
    const char *choices;     // FT_ENUM: "auto|cpu|cuda"
    const char *def;         // the default, "128" or per subcommand "128|sweep=16" (NULL: none)
    const char *env;         // the environment variable the default comes from, or NULL
    const char *help;
    unsigned list_subs;      // FT_INT: where a comma list is taken
    unsigned short_subs;     // where s is taken (0: all of subs)
    const char *section;     // starts a --help section
    const opt_def *opt;      // FT_STRAT
} flag_row;

#define FLAG_MAX_LIST 16

// One flag's value after parsing (its default when not given).
typedef struct flag_val {
    int given;                    // times given on the command line
    const char *s;                // the text (as given, or the default's); NULL: none
    long long i;                  // FT_INT (the first of a list), FT_ENUM's index, a switch's count
    double f;                     // FT_FLOAT
    int list[FLAG_MAX_LIST], n;   // FT_INT: the values (n of them)
} flag_val;

typedef struct flag_set {
    int sub;                      // SUB_*
    const char *name;             // "bench" ("" for run)
    flag_val v[FL_COUNT];
    strategy_opts so;             // the strategy parameters (defaults, then what was given)
    struct { const opt_def *d; const char *v; } sp[64];   // the strategy parameters given, in order
    int n_sp;
    const char *files[256];       // every -f, in order
    int n_files;
    const char *stops[64];        // every --stop / -r STR, in order
    int n_stops;
    struct { const char *as, *row, *v; } trace[64];   // the flags with a value, as read (-vv)
    int n_trace;
} flag_set;

// The verbosity every subcommand reads: 0 (-q: errors and results only), 1 (default: progress and
// timings), 2 (-v: plus notes and every flag's value as parsed), 3 (-vv: plus how each flag given
// was read: the table row it matched).
extern int flag_verbosity;

// Parses argv[first..] for subcommand sub (SUB_*): "--flag value" or "--flag=value", every value
// typed and range-checked, --help printed (exit 0), a bad command line one line naming the
// subcommand's help, with a did-you-mean where a name or value is near one the table knows (exit
// 2). With SIFT_PARSE_ONLY=1 in the environment the caller's flags_done ends the process (exit 0)
// once its own checks pass: the commands of bench/gpu.sh are checked that way without a model
// and without their files.
void flags_parse(flag_set *f, int sub, int argc, char **argv, int first);
// End of a subcommand's own checks: exit 0 under SIFT_PARSE_ONLY=1; else the input files given
// (-f, --prompts, --haystack, --data; '-' is stdin) must be readable files (a usage error, exit 2).
void flags_done(const flag_set *f);
// sift help [SUBCOMMAND] (argv[1] is "help"): the subcommand's --help (exit 0); an unknown one is a
// usage error with a did-you-mean.
void flags_help_command(int argc, char **argv) __attribute__((noreturn));
// Warns (one line each) about the strategy parameters given that none of the n strategies reads.
void flags_check_strategy_params(const flag_set *f, const strategy *const *list, int n);

// sift --help-markdown | --list-flags | --completion bash|zsh|fish | --man (as sift's first argument)
// print the table in those forms: flags_parse answers them for SUB_RUN.
// The help of subcommand sub (its usage, prose and the table's rows for it) on out.
void flags_help(FILE *out, int sub);
