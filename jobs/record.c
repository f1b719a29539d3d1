// jobs/record.c — what a run writes: one record per (request, strategy), written whole, in sift's
// shape (text, strategy, settings, timings, agreement with full) or the OpenAI Batch API's output
// object (id, custom_id, response {status_code, request_id, body: chat.completion or
// text_completion}, error); the
// timing lines and the A/B tables; the summary (stderr, --summary FILE), never among the records.
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../util/outfile.h"
#include "internal.h"

#ifndef SIFT_VERSION
#define SIFT_VERSION "unknown"
#endif

void compare_with_full(unit *u, int n, int n_layer) {
    const unit *full = NULL;
    for (int i = 0; i < n; i++)
        if (strcmp(u[i].s->name, "full") == 0 && u[i].rc == 0) full = &u[i];
    for (int i = 0; i < n; i++) {
        const run_stats *st = &u[i].g.st;
        u[i].rows_pct = st->prompt_n ? 100.0 * st->rows_done / ((double)st->prompt_n * n_layer) : 0;
        u[i].first_agree = -1;
        u[i].greedy_agree = -1;
        if (!full || u[i].rc || full->ans.n_ids == 0) continue;
        u[i].greedy_agree = 100.0 * tok_agreement(full->ans.ids, full->ans.n_ids, u[i].ans.ids,
                                                  u[i].ans.n_ids, &u[i].first_agree);
    }
}

// The record's opening: id, index, and where the request came from.
static void json_head(FILE *f, const request *q) {
    fprintf(f, "{\"id\":");
    tok_json_str(f, q->id, strlen(q->id));
    fprintf(f, ",\"index\":%d", q->index);
    if (q->file) {
        fprintf(f, ",\"file\":");
        tok_json_str(f, q->file, strlen(q->file));
    }
    if (q->line) fprintf(f, ",\"line\":%d", q->line);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// The median of x[0..n) (sorted in place; n >= 1), and the spread (max - min) / median in %.
static double median_spread(double *x, int n, double *spread) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    double med = n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
    *spread = med > 0 ? 100.0 * (x[n - 1] - x[0]) / med : 0;
    return med;
}

// The TTFT (prompt_ms) and TPOT (ms per decode step) of every repetition of strategy s among
// all[0..n) that succeeded, in repetition order, into ttft and tpot (n each at most); their counts.
static void rep_times(const unit *all, int n, const strategy *s, double *ttft, int *k, double *tpot, int *kd) {
    *k = *kd = 0;
    for (int j = 0; j < n; j++) {
        const unit *v = &all[j];
        if (v->s != s || v->rc || v->interrupted) continue;
        ttft[(*k)++] = v->g.st.prompt_ms;
        if (v->g.st.decode_runs) tpot[(*kd)++] = v->g.st.decode_ms / v->g.st.decode_runs;
    }
}

// --repeat N: "repetitions": every run's TTFT and TPOT (ms) and their medians and spreads (the A/B
// table's columns), beside the repetition-0 record's own timings.
static void json_reps(FILE *f, const unit *u) {
    double *t = xmalloc((size_t)u->n_reps_units * 2 * sizeof *t), *d = t + u->n_reps_units;
    int k, kd;
    rep_times(u->reps, u->n_reps_units, u->s, t, &k, d, &kd);
    fprintf(f, ",\"repetitions\":{\"runs\":%d,\"prompt_ms\":[", k);
    for (int i = 0; i < k; i++) fprintf(f, "%s%.6f", i ? "," : "", t[i]);
    fprintf(f, "],\"predicted_per_token_ms\":[");
    for (int i = 0; i < kd; i++) fprintf(f, "%s%.6f", i ? "," : "", d[i]);
    double sp_t = 0, sp_d = 0, m_t = k ? median_spread(t, k, &sp_t) : 0, m_d = kd ? median_spread(d, kd, &sp_d) : 0;
    if (k) fprintf(f, "],\"prompt_ms_median\":%.6f,\"prompt_ms_spread_pct\":%.3f", m_t, sp_t);
    else fprintf(f, "],\"prompt_ms_median\":null,\"prompt_ms_spread_pct\":null");
    if (kd) fprintf(f, ",\"predicted_per_token_ms_median\":%.6f,\"predicted_per_token_ms_spread_pct\":%.3f}", m_d, sp_d);
    else fprintf(f, ",\"predicted_per_token_ms_median\":null,\"predicted_per_token_ms_spread_pct\":null}");
    free(t);
}

// sift's record of u: the text, the strategy and its settings, timings, agreement with full.
static void json_unit(FILE *f, const runner *R, const unit *u) {
    const run_stats *st = &u->g.st;
    char opts[17];
    options_digest(R->o, u->s, opts);
    json_head(f, u->rq);
    if (u->rc) {
        fprintf(f, ",\"strategy\":\"%s\",\"request_digest\":\"%s\",\"options_digest\":\"%s\","
                "\"error\":", u->s->name, u->rq->digest, opts);
        tok_json_str(f, u->err, strlen(u->err));
        fprintf(f, "}\n");
        return;
    }
    fprintf(f, ",\"text\":");
    tok_json_str(f, u->ans.text ? u->ans.text : "", u->ans.len);
    // stop: why the answer ended (interrupted: a signal stopped it; --resume runs it again);
    // finish_reason: the same in OpenAI's words
    const char *stop = u->interrupted ? "interrupted" : u->hit_eog ? "eos" : u->hit_stop ? "stop_string" : "limit";
    fprintf(f, ",\"stop\":\"%s\",\"finish_reason\":\"%s\",\"strategy\":\"%s\",\"request_digest\":\"%s\","
            "\"options_digest\":\"%s\",\"device\":\"%s\",\"model\":", stop,
            u->interrupted ? "interrupted" : u->hit_eog || u->hit_stop ? "stop" : "length", u->s->name,
            u->rq->digest, opts, R->dev);
    tok_json_str(f, R->model_name, strlen(R->model_name));
    fprintf(f, ",\"note\":");
    tok_json_str(f, st->note, strlen(st->note));
    fprintf(f, ",\"label\":");
    if (st->label[0]) tok_json_str(f, st->label, strlen(st->label));
    else fprintf(f, "null");
    fprintf(f, ",\"settings\":");   // the values that ran (tsp_layer -1: the layer it resolved to)
    strategy_opts so = strategy_opts_resolved(u->s, R->m, R->o->run, R->o->so);
    strategy_settings_json(f, &so, u->s->name);
    fprintf(f, ",\"seed\":%llu,\"kv_bytes\":%zu,\"load_ms\":%.3f,\"rows_processed\":%ld,"
            "\"draft_rows\":%ld,\"rows_pct_of_full\":%.3f,", u->seed, st->kv_bytes, R->load_ms,
            st->rows_done, st->draft_rows, u->rows_pct);
    if (st->decode_runs) fprintf(f, "\"kv_read_per_step\":%.0f,", st->kv_read_per_step);
    else fprintf(f, "\"kv_read_per_step\":null,");
    if (st->decode_runs && st->selector_recall >= 0) fprintf(f, "\"selector_recall\":%.4f,", st->selector_recall);
    else fprintf(f, "\"selector_recall\":null,");
    if (u->first_agree < 0) fprintf(f, "\"first_token_agree\":null,\"greedy_agree_pct\":null,");
    else fprintf(f, "\"first_token_agree\":%s,\"greedy_agree_pct\":%.2f,", u->first_agree ? "true" : "false", u->greedy_agree);
    fprintf(f, "\"prefill_shared\":%d,\"prefix_tokens\":%d,\"prefix\":%s,\"device_counters\":",
            st->prefill_shared, st->prefix_n, !st->prefix_n ? "null" : st->prefix_compressed
            ? "\"compressed, query-agnostic\"" : "\"exact\"");
    run_stats_counters_json(f, st);
    fprintf(f, ",");
    fprintf(f, "\"timings\":{\"prompt_n\":%d,\"prompt_ms\":%.3f,\"prompt_per_token_ms\":%.4f,"
            "\"prompt_per_second\":%.3f,\"predicted_n\":%d,\"predicted_ms\":%.3f,"
            "\"predicted_per_token_ms\":%.4f,\"predicted_per_second\":%.3f}",
            st->prompt_n, st->prompt_ms, per_token(st->prompt_n, st->prompt_ms),
            per_second(st->prompt_n, st->prompt_ms), st->predicted_n, st->decode_ms,
            per_token(st->decode_runs, st->decode_ms), per_second(st->decode_runs, st->decode_ms));
    if (u->reps) json_reps(f, u);
    fprintf(f, "}\n");
}

// FNV-1a of s: the Batch API record's ids are derived from custom_id, so that a rerun, a resumed
// run and a sharded run write the same ids.
static unsigned long long id_hash(const char *s, unsigned long long salt) {
    unsigned long long h = 1469598103934665603ULL ^ salt;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

// The Batch API's output object for request q: {id, custom_id, response, error}. u NULL or failed
// (or, n > 1, any of its choices u[0..n)): response null and error {code, message}; else response
// {status_code 200, request_id, body}: a chat.completion (/v1/chat/completions) or a
// text_completion (/v1/completions) with a choice per answer (its text, index, finish_reason:
// stop at end-of-generation or a stop string, length at the token limit) and the token usage
// (the prompt once, every choice's sampled tokens).
static void openai_record(FILE *f, const runner *R, const request *q, const unit *u, const char *code,
                          const char *message) {
    int nc = u && q->n_choices > 1 ? q->n_choices : 1;
    char cancelled[200];
    for (int k = 0; k < nc && !message; k++)
        if (u[k].rc) code = u[k].code, message = u[k].err;
    for (int k = 0; k < nc && !message && u; k++)
        if (u[k].interrupted) {   // the Batch API's word for a request a cancelled batch left undone
            snprintf(cancelled, sizeof cancelled, "interrupted by a signal after %d generated token%s: "
                     "--resume runs it again", u[k].ans.n_ids, plural_s(u[k].ans.n_ids));
            code = "batch_cancelled", message = cancelled;
        }
    if (message && !code) code = "invalid_request";
    unsigned long long h = id_hash(q->id, 0);
    fprintf(f, "{\"id\":\"batch_req_%016llx\",\"custom_id\":", h);
    tok_json_str(f, q->id, strlen(q->id));
    // sift's own key (docs/batch.md: the Batch API's readers ignore it): the strategy and the digests
    // --resume compares (a request line's own error has none: its message is its digest)
    char sift[120] = "";
    if (u) {
        char opts[17];
        options_digest(R->o, u->s, opts);
        snprintf(sift, sizeof sift, ",\"sift\":{\"strategy\":\"%s\",\"request_digest\":\"%s\","
                 "\"options_digest\":\"%s\"}", u->s->name, q->digest, opts);
    }
    if (message) {
        fprintf(f, ",\"response\":null,\"error\":{\"code\":\"%s\",\"message\":", code);
        tok_json_str(f, message, strlen(message));
        fprintf(f, "}%s}\n", sift);
        return;
    }
    const run_stats *st = &u->g.st;
    int completion = 0;   // every sampled token, the end-of-generation one included
    for (int k = 0; k < nc; k++) completion += u[k].ans.n_ids;
    fprintf(f, ",\"response\":{\"status_code\":200,\"request_id\":\"req_%016llx\",\"body\":{"
            "\"id\":\"%s-%016llx\",\"object\":\"%s\",\"created\":%lld,\"model\":",
            id_hash(q->id, 1), q->completions ? "cmpl" : "chatcmpl", id_hash(q->id, 2),
            q->completions ? "text_completion" : "chat.completion", (long long)time(NULL));
    tok_json_str(f, R->model_name, strlen(R->model_name));
    fprintf(f, ",\"choices\":[");
    for (int k = 0; k < nc; k++) {
        const unit *c = &u[k];
        const char *text = c->ans.text ? c->ans.text : "";
        if (q->completions) {
            fprintf(f, "%s{\"text\":", k ? "," : "");
            tok_json_str(f, text, c->ans.len);
            fprintf(f, ",\"index\":%d,\"logprobs\":null", k);
        } else {
            fprintf(f, "%s{\"index\":%d,\"message\":{\"role\":\"assistant\",\"content\":", k ? "," : "", k);
            tok_json_str(f, text, c->ans.len);
            fprintf(f, ",\"refusal\":null},\"logprobs\":null");
        }
        fprintf(f, ",\"finish_reason\":\"%s\"}", c->hit_eog || c->hit_stop ? "stop" : "length");
    }
    fprintf(f, "],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d},"
            "\"system_fingerprint\":\"sift-%s-%s\"}},\"error\":null%s}\n",
            st->prompt_n, completion, st->prompt_n + completion, SIFT_VERSION, u->s->name, sift);
}

// Writes the record buf[0..n) to s in one write and flushes it (stdout) or, at most once a second,
// fsyncs it (a file; the rest at the end of the run: docs/batch.md says what a power cut can cost). A
// failed write ends the run with exit 1, naming the file and the reason, after cutting a regular
// file back to the end of its last whole record: what was written stays whole.
static void write_whole(rec_sink *s, const char *buf, size_t n) {
    int bad = 0, e = 0;
    jobs_writing = 1;   // a second Ctrl-C waits for this record to be whole
    if (s->f) bad = fwrite(buf, 1, n, s->f) != n || fflush(s->f) != 0;
    e = errno;
    if (!s->f && (e = outfile_write_all(s->fd, buf, n)) != 0) bad = 1;
    jobs_writing = 0;
    if (!bad) jobs_exit_if_asked();
    if (!bad && s->regular && now_ms() - s->last_sync >= 1000) {
        bad = fdatasync(s->fd) != 0, e = errno;
        s->last_sync = now_ms();
    }
    if (bad) {
        if (s->regular && ftruncate(s->fd, s->end) != 0)
            fprintf(stderr, "sift: error: cannot cut %s back to its last whole record: %s\n", s->name,
                    strerror(errno));
        fprintf(stderr, "sift: error: cannot write %s: %s\n", s->name, strerror(e));
        exit(1);
    }
    s->end += (long long)n;
}

// A failed request's record goes to --errors when given.
static rec_sink *sink_of(const runner *R, int failed) { return failed && R->errs ? R->errs : R->out; }

void record_unit(runner *R, const unit *u) {
    char *buf = NULL;
    size_t n = 0;
    FILE *mem = open_memstream(&buf, &n);
    if (R->openai) openai_record(mem, R, u->rq, u, u->code, u->rc ? u->err : NULL);
    else json_unit(mem, R, u);
    fclose(mem);
    write_whole(sink_of(R, u->rc != 0), buf, n);
    free(buf);
}

void record_error(runner *R, const request *q) {
    char *buf = NULL;
    size_t n = 0;
    FILE *mem = open_memstream(&buf, &n);
    if (R->openai) openai_record(mem, R, q, NULL, q->code, q->error);
    else {
        json_head(mem, q);
        fprintf(mem, ",\"error\":");
        tok_json_str(mem, q->error, strlen(q->error));
        fprintf(mem, "}\n");
    }
    fclose(mem);
    write_whole(sink_of(R, 1), buf, n);
    free(buf);
}

int write_summary(runner *R, int slots, int interrupted) {
    const run_opts *o = R->o;
    double wall = (now_ms() - R->t0) / 1e3;
    double pp = per_second((int)R->prompt_tok, R->prefill_ms), tg = per_second((int)R->decode_tok, R->decode_ms);
    int failed = R->n_failed + R->n_failed_before, done = R->n_done - R->n_stopped;
    if (!o->quiet && (R->n_req > 1 || slots > 1))
        fprintf(stderr, "sift: %d prompt%s (%d failed) in %.2f s, parallel %d: prefill %ld token%s at "
                "%.1f tok/s, decode %ld token%s at %.1f tok/s (aggregate)%s\n", done,
                plural_s(done), R->n_failed, wall, slots, R->prompt_tok, plural_s(R->prompt_tok),
                pp, R->decode_tok, plural_s(R->decode_tok), tg, interrupted ? "; interrupted" : "");
    if (!o->quiet && R->prefix_built)
        fprintf(stderr, "sift: prefix cache: %d shared prefix%s (%ld tokens) prefilled once in %.2f s, "
                "%ld prompt tokens copied instead of prefilled (peak %.1f MiB held)\n", R->prefix_built,
                R->prefix_built == 1 ? "" : "es", R->prefix_tok, R->prefix_ms / 1e3, R->prefix_reused_tok,
                R->prefix_peak / 1048576.0);
    if (R->n_failed_before)   // even with -q: an exit 1 with nothing run says why
        fprintf(stderr, "sift: %d failure%s recorded by an earlier run (kept; --retry-failed reruns "
                "them): the job is not clean\n", R->n_failed_before, plural_s(R->n_failed_before));
    if (!o->summary) return 0;
    char *buf = NULL;
    size_t n = 0;
    FILE *mem = open_memstream(&buf, &n);
    // failed: every failure on file (this run's and those an earlier run recorded), as the exit
    // code counts them; done: this run's requests answered whole; stopped: written as interrupted
    fprintf(mem, "{\"prompts\":%d,\"done\":%d,\"failed\":%d,\"failed_before\":%d,\"left\":%d,"
            "\"done_before\":%d,\"stopped\":%d,"
            "\"interrupted\":%s,\"wall_s\":%.3f,\"prompt_tokens\":%ld,\"prefill_ms\":%.3f,"
            "\"prefill_per_second\":%.3f,\"decode_tokens\":%ld,\"decode_ms\":%.3f,"
            "\"decode_per_second\":%.3f,\"generated_tokens\":%ld,\"parallel\":%d,\"device\":\"%s\","
            "\"model\":", R->n_req + R->n_skipped, done, failed, R->n_failed_before, R->n_req - done,
            R->n_skipped, R->n_stopped, interrupted ? "true" : "false", wall, R->prompt_tok, R->prefill_ms, pp,
            R->decode_tok, R->decode_ms, tg, R->gen_tok, slots, R->dev);
    tok_json_str(mem, R->model_name, strlen(R->model_name));
    fprintf(mem, ",\"format\":\"%s\",\"output\":", R->openai ? "openai" : "sift");
    if (o->output) tok_json_str(mem, o->output, strlen(o->output));
    else fprintf(mem, "null");
    // --prefix-cache: what was shared (null: off); its prefills' time is in wall_s, not prefill_ms
    if (R->prefix_on)
        fprintf(mem, ",\"prefix_cache\":{\"prefixes\":%d,\"prefix_tokens\":%ld,\"prefill_ms\":%.3f,"
                "\"reused_tokens\":%ld,\"peak_bytes\":%zu}", R->prefix_built, R->prefix_tok,
                R->prefix_ms, R->prefix_reused_tok, R->prefix_peak);
    else fprintf(mem, ",\"prefix_cache\":null");
    if (o->prompt_cache) {   // --prompt-cache: what was loaded from it and saved to it
        fprintf(mem, ",\"prompt_cache\":{\"path\":");
        tok_json_str(mem, o->prompt_cache, strlen(o->prompt_cache));
        fprintf(mem, ",\"file_tokens\":%d,\"loaded_tokens\":%ld,\"load_ms\":%.3f,\"saved_tokens\":%d}",
                R->pc_valid ? R->pc_view.n_tok : 0, R->pc_loaded_tok, R->pc_load_ms, R->pc_saved_tok);
    } else fprintf(mem, ",\"prompt_cache\":null");
    if (o->shard_n > 0) fprintf(mem, ",\"shard\":[%d,%d]}\n", o->shard_k, o->shard_n);
    else fprintf(mem, ",\"shard\":null}\n");
    fclose(mem);
    // written whole (util/outfile.c: a unique temporary renamed over a regular FILE; a device,
    // FIFO or symlink written in place)
    char err[4400];
    int rc = outfile_write(o->summary, buf, n, "--summary", err, sizeof err);
    if (rc) fprintf(stderr, "sift: error: %s\n", err);
    free(buf);
    return rc;
}

void print_timing(const runner *R, const unit *u) {
    const run_stats *st = &u->g.st;
    // the lines below keep llama.cpp's shape word for word ("1 tokens" included): scripts that
    // read llama.cpp's timings read these
    fprintf(stderr, "\nsift: strategy %s, device %s (%d thread%s), KV cache %.2f MiB\n", u->s->name,
            R->dev, R->o->threads, plural_s(R->o->threads), st->kv_bytes / 1048576.0);
    // the parameters as they ran ("tsp_layer 14, ..."); none for full
    strategy_opts so = strategy_opts_resolved(u->s, R->m, R->o->run, R->o->so);
    char *set = NULL;
    size_t set_n = 0;
    FILE *mem = open_memstream(&set, &set_n);
    int any = strategy_settings_text(mem, &so, u->s->name);
    if (fclose(mem) == 0 && any) fprintf(stderr, "sift: %s settings: %s\n", u->s->name, set);
    free(set);
    if (st->note[0]) fprintf(stderr, "sift: %s: %s\n", u->s->name, st->note);
    fprintf(stderr, "      load time = %10.2f ms\n", R->load_ms);
    fprintf(stderr, "prompt eval time = %10.2f ms / %5d tokens (%8.2f ms per token, %8.2f tokens per second)\n",
            st->prompt_ms, st->prompt_n, per_token(st->prompt_n, st->prompt_ms), per_second(st->prompt_n, st->prompt_ms));
    fprintf(stderr, "       eval time = %10.2f ms / %5d runs   (%8.2f ms per token, %8.2f tokens per second)\n",
            st->decode_ms, st->decode_runs, per_token(st->decode_runs, st->decode_ms), per_second(st->decode_runs, st->decode_ms));
    fprintf(stderr, "      total time = %10.2f ms / %5d tokens\n", st->prompt_ms + st->decode_ms,
            st->prompt_n + st->predicted_n);
}

// The successful full unit among u[0..n), or NULL.
static const unit *full_of(const unit *u, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(u[i].s->name, "full") == 0 && u[i].rc == 0 && u[i].rep == 0) return &u[i];
    return NULL;
}

// s[0..n) into a table cell: a newline or '|' as a space, and never cut inside a character.
static void cell_text(const char *s, size_t n) {
    while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80) n--;   // s[n]: a character's start (or the end)
    for (size_t i = 0; i < n; i++) putchar(s[i] == '\n' || s[i] == '\r' || s[i] == '|' ? ' ' : s[i]);
}

#define CELL_BYTES 60

// The answer column: full's (or, without full, each) answer's first 60 bytes; another strategy's
// "= full" when its text is full's, else from where it first differs: "word W: ...CONTEXT
// >>DIFFERENT<<", so that answers differing only at their end do not look the same.
static void print_answer_cell(const unit *u, const unit *full) {
    const char *t = u->ans.text ? u->ans.text : "";
    size_t n = u->ans.len;
    if (!full || full == u || u->rc) {
        while (n > 0 && (*t == '\n' || *t == ' ')) t++, n--;
        cell_text(t, n < CELL_BYTES ? n : CELL_BYTES);
        return;
    }
    const char *f = full->ans.text ? full->ans.text : "";
    size_t d = 0;
    while (d < n && d < full->ans.len && t[d] == f[d]) d++;
    if (d == n && d == full->ans.len) {
        printf("= full");
        return;
    }
    while (d > 0 && t[d - 1] != ' ' && t[d - 1] != '\n') d--;   // the differing word's start
    int word = 1;   // the differing word's number: the words before it, plus one
    for (size_t i = 0; i < d; i++)
        word += t[i] != ' ' && t[i] != '\n' && (i == 0 || t[i - 1] == ' ' || t[i - 1] == '\n');
    size_t c = d;
    for (int w = 0; w < 3 && c > 0; w++) {   // up to three words before it
        c--;
        while (c > 0 && t[c - 1] != ' ' && t[c - 1] != '\n') c--;
    }
    printf("word %d: %s", word, c > 0 ? "..." : "");
    cell_text(t + c, d - c);
    if (d == n) {   // this answer ends where full's goes on
        printf(">>(ends; full goes on)<<");
        return;
    }
    printf(">>");
    size_t rest = n - d < 40 ? n - d : 40;
    cell_text(t + d, rest);
    printf("%s<<", d + rest < n ? "..." : "");
}

// A table row's end: 1st token = full, greedy agree %, the answer cell.
static void print_row_end(const unit *u, const unit *full) {
    printf("%s | ", u->first_agree < 0 ? "-" : u->first_agree ? "yes" : "no");
    if (u->greedy_agree < 0) printf("- | ");
    else printf("%.1f | ", u->greedy_agree);
    print_answer_cell(u, full);
    printf(" |\n");
}

void print_table(const unit *u, int n) {
    const unit *full = full_of(u, n);
    printf("\n| strategy | rows %% of full | KV MiB | KV read/step MiB | TTFT ms | prefill tok/s | TPOT ms "
           "| decode tok/s | 1st token = full | greedy agree %% | answer (others: where it differs from full) |\n"
           "|---|---:|---:|---:|---:|---:|---:|---:|:---:|---:|---|\n");
    for (int i = 0; i < n; i++) {
        const run_stats *st = &u[i].g.st;
        if (u[i].rc) {
            printf("| %s | error: %s ||||||||||\n", u[i].s->name, u[i].err);
            continue;
        }
        printf("| %s%s%s%s | %.1f | %.2f | ", u[i].s->name, st->label[0] ? " (" : "", st->label,
               st->label[0] ? ")" : "", u[i].rows_pct, st->kv_bytes / 1048576.0);
        if (st->decode_runs) printf("%.2f | ", st->kv_read_per_step / 1048576.0);
        else printf("- | ");
        printf("%.1f | %.1f | %.2f | %.2f | ", st->prompt_ms, per_second(st->prompt_n, st->prompt_ms),
               per_token(st->decode_runs, st->decode_ms), per_second(st->decode_runs, st->decode_ms));
        print_row_end(&u[i], full);
    }
    fflush(stdout);
}

// The A/B table of a repeated run (--repeat): every column of print_table's, per strategy (its
// repetition-0 unit for everything but the timings), with the median TTFT and TPOT over the
// repetitions that succeeded (the rates from those medians) and their spread beside them.
void print_table_reps(const unit *u, int n) {
    printf("\n| strategy | runs | rows %% of full | KV MiB | KV read/step MiB | TTFT ms (median) "
           "| TTFT spread %% | prefill tok/s | TPOT ms (median) | TPOT spread %% | decode tok/s "
           "| 1st token = full | greedy agree %% | answer (others: where it differs from full) |\n"
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---:|---|\n");
    double *ttft = xmalloc((size_t)n * sizeof *ttft), *tpot = xmalloc((size_t)n * sizeof *tpot);
    const unit *full = full_of(u, n);
    for (int i = 0; i < n; i++) {
        if (u[i].rep != 0) continue;
        int k = 0, kd = 0;
        rep_times(u, n, u[i].s, ttft, &k, tpot, &kd);
        if (u[i].rc || k == 0) {
            printf("| %s | 0 | error: %s ||||||||||||\n", u[i].s->name, u[i].err);
            continue;
        }
        const run_stats *st = &u[i].g.st;
        double sp_ttft, sp_tpot = 0, m_ttft = median_spread(ttft, k, &sp_ttft);
        double m_tpot = kd ? median_spread(tpot, kd, &sp_tpot) : NAN;
        printf("| %s%s%s%s | %d | %.1f | %.2f | ", u[i].s->name, st->label[0] ? " (" : "", st->label,
               st->label[0] ? ")" : "", k, u[i].rows_pct, st->kv_bytes / 1048576.0);
        if (st->decode_runs) printf("%.2f | ", st->kv_read_per_step / 1048576.0);
        else printf("- | ");
        printf("%.1f | %.1f | %.1f | ", m_ttft, sp_ttft, per_second(st->prompt_n, m_ttft));
        if (kd) printf("%.2f | %.1f | %.2f | ", m_tpot, sp_tpot, 1000.0 / m_tpot);
        else printf("- | - | - | ");
        print_row_end(&u[i], full);
    }
    free(ttft);
    free(tpot);
    fflush(stdout);
}

cpu_sample cpu_now(void) {
    cpu_sample c = {0, 0, 0, now_ms() / 1e3};
    if (host_cpu_seconds(&c.busy, &c.steal, &c.self) != 0) c.wall = 0;   // unknown: no note
    return c;
}

// Under an A/B table: how busy the rest of the machine was since the last table (or the start):
// other processes' CPU time and the hypervisor's stolen time, in cores. Timings taken beside a
// busy process are not an idle machine's; the note says so, so a reader knows what to distrust.
void machine_note(runner *R) {
    cpu_sample now = cpu_now(), *was = &R->cpu_mark;
    double wall = now.wall - was->wall;
    if (was->wall > 0 && now.wall > 0 && wall > 0.05) {
        double other = (now.busy - was->busy - (now.self - was->self)) / wall;
        double steal = (now.steal - was->steal) / wall;
        other = other < 0 ? 0 : other;
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        fprintf(stderr, "\nmachine: other processes used %.2f of %ld CPU%s and %.2f were stolen during these runs%s\n",
               other, ncpu, plural_s(ncpu), steal,
               other + steal > 0.25 ? " — busy: these timings are not an idle machine's" : " (idle)");
    }
    R->cpu_mark = cpu_now();
}

