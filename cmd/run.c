// cmd/run.c — `sift` with no subcommand's word: run prompts. Flags -> load the model -> the
// prompts run (jobs/: tokenize -> run the strategy -> print text (stdout) and timing (stderr), or
// one JSON line per prompt (--json)).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../backend/backend.h"
#include "../util/check.h"
#include "cmd.h"
#include "flags.h"

typedef struct {
    const char *model, *device, *batch_dir, *draft_path;
    enum bk_weights weights;   // --weights native|fast|exact|f32 (CPU)
    const char *cache_k, *cache_v;   // --cache-type-k/-v (kvrow.h names; "auto": cli_kv_default)
    int ubatch;                      // --ubatch: rows of one prefill pass (0: one pass)
    int ctx;
    run_opts r;                // what runs: prompts, sampling, strategies, output
    strategy_opts so;
    strategy_run run;          // the draft and end-of-generation test (cli_load), --kept-map
} options;

// --shard K/N: 0 <= K < N
static void parse_shard(const char *v, run_opts *r) {
    char *end;
    long k = strtol(v, &end, 10), n = *end == '/' ? strtol(end + 1, &end, 10) : -1;
    if (*end || n < 1 || n > 1000000 || k < 0 || k >= n)
        cli_usage_error("--shard must be K/N with 0 <= K < N (got '%s')", v);
    r->shard_k = (int)k, r->shard_n = (int)n;
}

// --output / --errors FILE: an existing regular file only with --resume (which reads and rewrites
// it, so never a device, pipe or directory); a device or pipe without --resume is written in place.
static void check_records_file(const char *flag, const char *path, int resume) {
    struct stat st;
    if (!path || stat(path, &st) != 0) return;   // a new file (or one jobs_run reports it cannot open)
    if (S_ISDIR(st.st_mode)) cli_usage_error("%s '%s' is a directory", flag, path);
    char pid[32];
    if (S_ISREG(st.st_mode) && !resume && jobs_output_locked(path, pid, sizeof pid))
        cli_usage_error("%s '%s' is being written by another sift (pid %s, lock '%s.lock'): wait for "
                        "it to end (--wait-lock waits), then --resume continues it", flag, path, pid, path);
    if (S_ISREG(st.st_mode) && !resume)
        cli_usage_error("%s '%s' exists: add --resume to continue it, or remove it", flag, path);
    if (!S_ISREG(st.st_mode) && resume)
        cli_usage_error("%s '%s' is not a regular file (a device or pipe): --resume reads and "
                        "rewrites a file; write to a file, or leave out --resume", flag, path);
}

// The run's options from the one flag table (cmd/flags.c), then the checks between flags.
static void parse_args(int argc, char **argv, options *o) {
    flag_set f;
    flags_parse(&f, SUB_RUN, argc, argv, 1);
    const flag_val *v = f.v;
    *o = (options){.device = cli_device(v[FL_DEVICE].s), .so = f.so, .model = v[FL_MODEL].s,
                   .batch_dir = v[FL_BATCH].s, .draft_path = f.so.draft_path,
                   .weights = cli_weights(v[FL_WEIGHTS].s), .cache_k = v[FL_CACHE_TYPE_K].s,
                      .cache_v = v[FL_CACHE_TYPE_V].s, .ctx = (int)v[FL_CTX].i,
                   .ubatch = (int)v[FL_UBATCH].i};
    run_opts *r = &o->r;
    *r = (run_opts){.so = &o->so, .run = &o->run, .prompt = v[FL_PROMPT].s,
                    .prompts_path = v[FL_PROMPTS].s, .chat = v[FL_CHAT].given || v[FL_SYSTEM].s,
                    .system = v[FL_SYSTEM].s, .n_predict = (int)v[FL_N_PREDICT].i,
                    .sp = {.temp = (float)v[FL_TEMP].f, .top_k = (int)v[FL_TOP_K].i,
                           .top_p = (float)v[FL_TOP_P].f, .min_p = (float)v[FL_MIN_P].f},
                    .seed = v[FL_SEED].i, .reps = (int)v[FL_REPEAT].i, .threads = (int)v[FL_THREADS].i,
                    .parallel = (int)v[FL_PARALLEL].i, .output = v[FL_OUTPUT].s,
                    .resume = v[FL_RESUME].given > 0, .errors = v[FL_ERRORS].s,
                    .retry_failed = v[FL_RETRY].given > 0, .wait_lock = v[FL_WAIT_LOCK].given > 0,
                    .unordered = v[FL_UNORDERED].given > 0, .kept_map = v[FL_KEPT_MAP].s,
                    .prefix_cache = v[FL_PREFIX_CACHE].i == 0 ? -1 : v[FL_PREFIX_CACHE].i == 1, .prefix_min = (int)v[FL_PREFIX_MIN].i,
                    .prompt_cache = v[FL_PROMPT_CACHE].s, .prompt_cache_ro = v[FL_PROMPT_CACHE_RO].given > 0,
                    .weights = v[FL_WEIGHTS].s,
                    .summary = v[FL_SUMMARY].s, .json = v[FL_JSON].given > 0,
                    .format = (int)v[FL_OUTPUT_FORMAT].i == 0 ? RUN_FORMAT_AUTO
                              : v[FL_OUTPUT_FORMAT].i == 1 ? RUN_FORMAT_SIFT : RUN_FORMAT_OPENAI,
                    .quiet = flag_verbosity == 0};
    r->given = (v[FL_TEMP].given ? RUN_GIVEN_TEMP : 0) | (v[FL_TOP_K].given ? RUN_GIVEN_TOP_K : 0) |
               (v[FL_TOP_P].given ? RUN_GIVEN_TOP_P : 0) | (v[FL_MIN_P].given ? RUN_GIVEN_MIN_P : 0) |
               (v[FL_N_PREDICT].given ? RUN_GIVEN_N_PREDICT : 0);
    r->n_strategies = cli_strategies(v[FL_STRATEGY].s, r->strategies);
    for (int i = 0; i < f.n_files; i++) jobs_add_file(r, f.files[i]);
    if (f.n_stops) {   // --stop / -r: the batch runner reads them (a request's own stop replaces them)
        r->stop = xmalloc((size_t)f.n_stops * sizeof *r->stop);
        memcpy(r->stop, f.stops, (size_t)f.n_stops * sizeof *r->stop);
        r->n_stop = f.n_stops;
    }
    if (v[FL_SHARD].s) parse_shard(v[FL_SHARD].s, r);
    if (r->prompt_cache_ro && !r->prompt_cache)
        cli_usage_error("--prompt-cache-ro reads a --prompt-cache FILE: give one");
    if (r->parallel > FWD_MAX_BATCH - MAX_STRATEGIES)
        cli_usage_error("--parallel %d: at most %d in sift run", r->parallel, FWD_MAX_BATCH - MAX_STRATEGIES);
    if (r->n_predict < -1) cli_usage_error("-n %d: use -1 (until end of text) or a positive count", r->n_predict);
    if (v[FL_SEED].i < -1) cli_usage_error("--seed must be -1 (random) or in [0, %u]", UINT32_MAX);
    flags_check_strategy_params(&f, r->strategies, r->n_strategies);
    int sources = (r->prompt != NULL) + (r->n_files > 0) + (o->batch_dir != NULL) + (r->prompts_path != NULL);
    if (sources == 0) cli_usage_error("no prompt: give -p TEXT, -f FILE, --batch DIR or --prompts FILE.jsonl");
    if (r->prompt && sources > 1) cli_usage_error("-p cannot be combined with -f, --batch or --prompts");
    if (r->n_predict == 0) cli_usage_error("-n 0 generates nothing: use -1 or a positive count");
    if (o->draft_path && o->so.draft_layers)
        cli_usage_error("--draft and --draft-layers exclude each other (a draft model, or the main "
                    "model's first layers)");
    if (r->resume && !r->output) cli_usage_error("--resume needs --output FILE (the file to continue)");
    if (r->retry_failed && !r->resume)
        cli_usage_error("--retry-failed reruns the failed requests of a finished job: add --resume");
    if (r->errors && !r->output && !r->json)
        cli_usage_error("--errors FILE holds failed requests' JSON records: add --output FILE or --json");
    if (r->errors && r->output && strcmp(r->errors, r->output) == 0)
        cli_usage_error("--errors and --output name the same file '%s'", r->output);
    check_records_file("--output", r->output, r->resume);
    check_records_file("--errors", r->errors, r->resume);
    if (r->format == RUN_FORMAT_OPENAI) {
        if (r->n_strategies > 1)
            cli_usage_error("--output-format openai writes one response per custom_id: give one "
                            "--strategy (or use --output-format sift for an A/B comparison)");
        r->json = 1;
    }
    o->run.count_selected = r->kept_map != NULL;
    if (r->unordered && !(r->json || r->output))
        cli_usage_error("--unordered orders JSON records: add --json or --output FILE");
    char err[512];
    if (o->batch_dir && jobs_add_batch_dir(r, o->batch_dir, err, sizeof err)) cli_usage_error("%s", err);
    if (r->threads == 0) r->threads = backend_cpu_default_threads(NULL);
    flags_done(&f);
}

// Prefill progress on an interactive stderr: "prefill: layer 12/30".
static void show_layer(void *ctx, int layer, int n_layer, int rows) {
    const context *cx = ctx;
    if (cx->prefill_total)   // a chunked prefill (--ubatch): which rows of the prompt
        fprintf(stderr, "\rprefill: rows %ld-%ld of %ld, layer %d/%d   ", cx->prefill_done + 1,
                cx->prefill_done + rows, cx->prefill_total, layer + 1, n_layer);
    else
        fprintf(stderr, "\rprefill: layer %d/%d (%d row%s)   ", layer + 1, n_layer, rows, plural_s(rows));
    if (layer + 1 == n_layer) fprintf(stderr, "\r%40s\r", "");
}

int cmd_run(int argc, char **argv) {
    options o;
    parse_args(argc, argv, &o);
    if (cli_refuse_synthetic(o.model, "a prompt")) return 2;
    // the files written: a bad path (a missing or unwritable directory) fails now, not after the
    // model load or a long run; nothing is modified until then (an old summary or map stays whole
    // if the run fails)
    char *km_json = o.r.kept_map ? jobs_kept_map_json(o.r.kept_map) : NULL;
    const char *late[5] = {o.r.output, o.r.errors, o.r.summary, o.r.kept_map, km_json};
    int bad_out = cli_check_outputs(late, (const char *[]){"--output", "--errors", "--summary",
                                                           "--kept-map", "--kept-map"}, 5);
    free(km_json);
    if (bad_out) return 2;
    double t0 = now_ms();
    loaded L;
    cli_hw hw = {o.device, o.r.threads, o.weights, o.ctx, GGML_F32, o.cache_k, o.cache_v, o.ubatch};
    int rc = cli_load(&L, o.model, o.draft_path, &hw, o.r.strategies, o.r.n_strategies, &o.so,
                    &o.run);
    if (rc == 0) {
        model *m = L.m;
        const char *dev = L.bk->name;
        double load_ms = now_ms() - t0;
        if (!o.r.quiet && isatty(2) && o.r.parallel == 1) L.cx->on_layer = show_layer, L.cx->on_layer_ctx = L.cx;
        // the model as the user named it (the file), the name it carries inside beside it
        char label[300];
        const char *inside;
        cli_model_label(L.path, m->name, label, sizeof label, &inside);
        if (!o.r.quiet)
            fprintf(stderr, "sift: loaded %s (%s%s%s%s, %d layer%s, %.0fM params, %.2f GiB) in %.0f ms on "
                    "%s%s%s%s\n", label, inside ? "named \"" : "", inside ? inside : "",
                    inside ? "\" inside; " : "", m->cfg.arch, m->cfg.n_layer, plural_s(m->cfg.n_layer),
                    m->n_params / 1e6, m->weight_bytes / 1073741824.0, load_ms, dev,
                    L.bk->info[0] ? " (" : "", L.bk->info, L.bk->info[0] ? ")" : "");
        if (o.ctx > m->cfg.ctx_len && !o.r.quiet)
            fprintf(stderr, "sift: warning: -c %d is beyond the model's trained context %d\n", o.ctx,
                    m->cfg.ctx_len);
        rc = jobs_run(&o.r, L.cx, L.t, dev, m->name ? m->name : cli_base_name(L.path), load_ms,
                         o.ctx > 0 ? o.ctx : m->cfg.ctx_len);
    }
    cli_unload(&L);
    for (int i = 0; i < o.r.n_files; i++) free(o.r.files[i]);
    free(o.r.files);
    free(o.r.stop);
    return rc;
}
