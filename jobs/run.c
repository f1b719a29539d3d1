// jobs/run.c — running a run's requests: this process's shard of them, minus what --resume finds
// already done, through up to --parallel sequences at a time (continuous batching: each decode
// step is one forward pass over every sequence in flight, policies' gen_step; a finished
// sequence's slot takes the next request at once). Results: text blocks, or one record per
// (request, strategy) written whole and flushed (jobs/record.c), in input order (--unordered: as
// they finish); progress and a summary on stderr (and --summary FILE). Ctrl-C or SIGTERM: the
// sequences in flight stop after the step under way, what they made is printed or recorded as
// interrupted (--resume runs them again), and the exit code is 128 + the signal; a second signal
// exits at once, after the record being written (if any) is whole.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../util/tunables.h"
#include "internal.h"
#include "tune.h"

// Rows of one packed prefill pass at most (SIFT_PACK_ROWS overrides; 0: every prompt alone):
// several queued prompts' whole prefills share a pass up to this many rows (a longer prompt runs
// alone), so that the sequences in flight wait at most about one such pass for their next decode step.
#define PACK_ROWS 2048

// Text written to stdout so far is out: a failed write or flush (a full disk, a closed pipe) ends
// the run with exit 1 and the reason, never a silent exit 0.
static void stdout_check(void) {
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "sift: error: cannot write to stdout: %s\n", strerror(errno));
        exit(1);
    }
}

// ---- one (request, strategy) sequence --------------------------------------------------------

// Whether u's answer, len bytes before its last token, now holds one of the request's stop
// strings: then the answer is cut where the first one begins (the stop text and what follows
// are not part of it) and u->hit_stop set.
static int stop_cut(unit *u, size_t len) {
    const request *q = u->rq;
    const char *text = u->ans.text;
    size_t cut = (size_t)-1;
    for (int i = 0; i < q->n_stop && text; i++) {
        size_t n = strlen(q->stop[i]), from = len >= n ? len - n + 1 : 0;   // new matches only
        const char *at = memmem(text + from, u->ans.len - from, q->stop[i], n);
        if (at && (size_t)(at - text) < cut) cut = (size_t)(at - text);
    }
    if (cut == (size_t)-1) return 0;
    u->ans.len = cut;
    u->ans.text[cut] = 0;
    return u->hit_stop = 1;
}

// Bytes at the end of s[0..n) that begin a UTF-8 character not yet complete (0 to 3): held back
// from stdout until the next token completes it (a byte that can never begin one is not held).
static size_t utf8_held(const char *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char c = (unsigned char)s[n - k];
        if ((c & 0xc0) == 0x80) continue;   // a continuation byte: look further back
        size_t want = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 1;
        return want > k ? k : 0;
    }
    return 0;
}

static int on_token(void *ctx, int id) {
    unit *u = ctx;
    size_t len = u->ans.len;
    if (tok_answer_token(&u->ans, id)) return u->hit_eog = 1;
    if (stop_cut(u, len)) return 1;
    if (u->stream) {   // what completes a character is out now; a character's first bytes wait
        size_t end = u->ans.len - utf8_held(u->ans.text, u->ans.len);
        if (end > u->shown) {
            fwrite(u->ans.text + u->shown, 1, end - u->shown, stdout);
            stdout_check();
            u->shown = end;
        }
    }
    return 0;
}

int jobs_prompt_ids(const runner *R, request *q, int **ids, char *err, size_t errlen) {
    size_t len = 0;
    const char *what = q->file ? "prompt file" : "prompt";
    if (q->file && !q->text) {
        q->text = tok_read_text(q->file, &len, err, errlen);
        if (!q->text) return -1;
        char name[300];
        snprintf(name, sizeof name, "%s '%s'", what, q->id);
        if (tok_text_check(q->text, len, name, err, errlen)) return -1;
    }
    if (q->text) len = strlen(q->text);
    if (q->text && len == 0) return err_printf(err, errlen, "%s '%s' is empty", what, q->id);
    for (int i = 0; i < q->n_turns; i++)
        if (!q->contents[i][0]) return err_printf(err, errlen, "prompt '%s': message %d is empty", q->id, i + 1);
    const char *check[2] = {q->text, q->system};
    for (int i = 0; i < 2; i++) {
        long bad = check[i] ? tok_utf8_invalid_at(check[i], strlen(check[i])) : -1;
        if (bad >= 0)
            return err_printf(err, errlen, "%s '%s' is not valid UTF-8 (byte offset %ld, 0x%02x)",
                              what, q->id, bad, (unsigned char)check[i][bad]);
    }
    char *text = q->text;
    if (q->chat) {
        const char *sys = q->system ? q->system : R->o->system ? R->o->system : tok_chat_default_system(R->t);
        const char *role = "user";
        text = q->n_turns ? tok_chat_apply_turns(tok_chat_kind(R->t), sys, (const char *const *)q->roles,
                                                 (const char *const *)q->contents, q->n_turns)
                          : tok_chat_apply_turns(tok_chat_kind(R->t), sys, &role,
                                                 (const char *const *)&q->text, 1);
        if (!text)
            return err_printf(err, errlen, "prompt '%s': the model has no chat template sift knows "
                              "(ChatML, Llama-3)", q->id);
    }
    int n = tok_encode_prompt(R->t, text, strlen(text), 1, ids, err, errlen);
    if (text != q->text) free(text);
    return n;
}

int jobs_read_prompts(const run_opts *o, const tok *t, run_prompt **out, char *err, size_t errlen) {
    request_list all = jobs_collect(o);
    runner R = {.o = o, .t = t};
    run_prompt *p = xcalloc((size_t)(all.n ? all.n : 1), sizeof *p);
    int n = 0, bad = 0;
    for (int i = 0; i < all.n && !bad; i++) {
        request *q = &all.r[i];
        if (q->error) bad = err_printf(err, errlen, "%s", q->error);
        else if ((p[n].n_ids = jobs_prompt_ids(&R, q, &p[n].ids, err, errlen)) < 0) bad = -1;
        else p[n++].id = strdup(q->id);
    }
    for (int i = 0; i < all.n; i++) req_free(&all.r[i]);
    free(all.r);
    if (bad) {
        jobs_prompts_free(p, n);
        return -1;
    }
    *out = p;
    return n;
}

void jobs_prompts_free(run_prompt *p, int n) {
    for (int i = 0; i < n; i++) free(p[i].id), free(p[i].ids);
    free(p);
}

// u could not run: done, with its error naming the --prompts line it came from and its Batch
// API error code. -1.
static int unit_failed(unit *u, const char *code) {
    u->code = code;
    if (u->rq->line) {
        char e[sizeof u->err];
        snprintf(e, sizeof e, "%.200s line %d: %.290s", u->rq->src, u->rq->line, u->err);
        memcpy(u->err, e, sizeof e);
    }
    u->state = 2;
    return u->rc = -1;
}

// Choice k's seed: choice 0 the request's own (its answer is the n = 1 answer); a later one a
// stream of its own, derived from it (splitmix64 of seed + k * golden ratio).
static unsigned long long choice_seed(unsigned long long seed, int k) {
    if (k == 0) return seed;
    unsigned long long z = seed + (unsigned long long)k * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// A later choice of an n > 1 request (its sampler ready): a copy of choice 0's prefill (the last
// choice takes choice 0's copy over), then its own first token. Choice 0 failed: the same error.
static int choice_start(unit *u) {
    unit *first = u - u->choice;
    if (first->rc || !first->proto) {
        CHECK_INTERNAL(first->rc, "choice %d of '%s' starts before choice 0", u->choice, u->rq->id);
        sampler_free(&u->smp);
        memcpy(u->err, first->err, sizeof u->err);
        u->code = first->code;
        u->state = 2;
        return u->rc = -1;
    }
    if (u->choice == u->rq->n_choices - 1) {
        u->g = *first->proto;
        free(first->proto);
        first->proto = NULL;
    } else if (gen_fork(&u->g, first->proto, u->s->name, u->err, sizeof u->err)) {
        sampler_free(&u->smp);
        return unit_failed(u, "server_error");
    }
    gen_first(&u->g, &u->smp, on_token, u);
    return 0;
}

// Tokenizes and prefills u (its first token sampled); 0, or -1 (u->err set, u done). A later
// choice of an n > 1 request copies choice 0's prefill instead (choice_start). With packing on
// (R->pack_rows), a plain prefill (gen_packs) of a one-answer request with no kept map is only
// opened (u->packed): the loop runs it in a pass shared with other queued prompts.
static int unit_begin(runner *R, unit *u, int stream) {
    const run_opts *o = R->o;
    request *q = u->rq;
    u->ans.t = R->t;
    u->n_ids = jobs_prompt_ids(R, q, &u->ids, u->err, sizeof u->err);
    int want = q->n_predict;   // settled (request_settle): -1 up to the context
    u->n_gen = want < 0 ? R->n_ctx - u->n_ids : want;
    if (u->n_ids >= 0 && (u->n_gen < 1 || (long)u->n_ids + u->n_gen > R->n_ctx)) {
        snprintf(u->err, sizeof u->err,
                 "prompt '%s' has %d token%s; with %d to generate that exceeds the context size %d "
                 "(raise -c or lower -n)", q->id, u->n_ids, plural_s(u->n_ids), want < 0 ? 1 : u->n_gen,
                 R->n_ctx);
        return unit_failed(u, "context_length_exceeded");
    }
    if (u->n_ids < 0) return unit_failed(u, "invalid_request");
    sample_params sp = o->sp;   // the request's settled values (request_settle)
    sp.temp = q->temp, sp.top_p = q->top_p, sp.top_k = q->top_k, sp.min_p = q->min_p;
    sp.freq_pen = q->freq_pen, sp.pres_pen = q->pres_pen;
    if (q->seed < 0)   // one random seed per request: an A/B run's strategies sample alike
        q->seed = (long long)(((unsigned long long)(now_ms() * 1000) + (unsigned)q->index * 7919u) & 0xffffffffULL);
    u->seed = choice_seed((unsigned long long)q->seed, u->choice);
    sp.seed = u->seed;
    sampler_init(&u->smp, &sp, R->m->cfg.vocab);
    // once per prompt: every strategy and repetition of it has the same tokens, budget and seed
    if (!o->quiet && R->o->parallel == 1 && u->choice == 0 && !q->announced)
        fprintf(stderr, "sift: %s: %d prompt token%s%s, up to %d new (seed %llu)\n", q->id, u->n_ids,
                plural_s(u->n_ids), q->prefix_group ? " (starting with a shared prefix)" : "",
                u->n_gen, u->seed);
    q->announced = 1;
    u->stream = stream;
    u->state = 1;
    if (u->choice > 0) return choice_start(u);
    // a shared prefix (--prefix-cache): copied, its rest prefilled alone (not packed)
    strategy_run run = o->run ? *o->run : (strategy_run){0};
    run.prefix = prefix_take(R, u);
    if (!run.prefix && R->pack_rows > 0 && q->n_choices == 1 && !o->kept_map && !stream && gen_packs(u->s)) {
        if (gen_open(&u->g, u->s, R->cx, u->ids, u->n_ids, u->n_gen, &u->smp, on_token, u, u->err,
                     sizeof u->err)) {
            sampler_free(&u->smp);
            return unit_failed(u, "server_error");
        }
        u->packed = 1;
        return 0;
    }
    if (gen_begin(&u->g, u->s, R->cx, o->so, &run, u->ids, u->n_ids, u->n_gen, &u->smp, on_token, u, NULL,
                  u->err, sizeof u->err)) {
        sampler_free(&u->smp);
        return unit_failed(u, "server_error");
    }
    R->prefix_reused_tok += u->g.st.prefix_n;
    prefix_file_save(R, u);   // --prompt-cache: the run's first plain prefill, before any step
    if (q->n_choices > 1) {   // the later choices copy this prefill (before any decode step)
        u->proto = xmalloc(sizeof *u->proto);
        int rc = gen_fork(u->proto, &u->g, u->s->name, u->err, sizeof u->err);
        if (rc) {   // -2: the strategy's decode state cannot be copied (n > 1 refused)
            free(u->proto);
            u->proto = NULL;
            gen_end(&u->g);
            sampler_free(&u->smp);
            return unit_failed(u, rc == -2 ? "unsupported_parameter" : "server_error");
        }
    }
    if (o->kept_map && u->rep == 0) km_capture_prefill(u);
    return 0;
}

// unit_begin, and u's use of a shared prefix counted whatever became of it.
static int unit_start(runner *R, unit *u, int stream) {
    int rc = unit_begin(R, u, stream);
    prefix_put(R, u);
    return rc;
}

// u is done (or stopped): its cache freed; an answer that ends inside a character (the token
// limit fell there) ends before it, so that neither stdout nor a record ends mid-character.
static void unit_finish(unit *u) {
    if (u->state == 1 && u->ans.text) {
        u->ans.len -= utf8_held(u->ans.text, u->ans.len);
        u->ans.text[u->ans.len] = 0;
        if (u->stream && u->ans.len > u->shown) fwrite(u->ans.text + u->shown, 1, u->ans.len - u->shown, stdout);
        u->shown = u->ans.len;
    }
    if (u->state == 1) {
        km_capture_decode(u);
        gen_end(&u->g);
        sampler_free(&u->smp);
    }
    u->state = 2;
}

// u is done: finished (unit_finish), its streamed text's line ended, one fewer left in its job.
static void unit_done(job *jobs, unit *u) {
    unit_finish(u);
    if (u->stream && !u->rc) printf("\n");
    jobs[u->job].n_left--;
}

static void unit_free(unit *u) {
    if (u->proto) {   // choice 0's copy that no later choice took (the run was stopped)
        gen_end(u->proto);
        free(u->proto);
        u->proto = NULL;
    }
    free(u->ids);
    tok_answer_free(&u->ans);
    km_free(u->km);
    u->km = NULL;
}

static volatile sig_atomic_t stop_signal;
volatile sig_atomic_t jobs_signals, jobs_writing;

// SIGINT, SIGTERM: the first stops the run after the step under way (jobs_run); a second exits at
// once (128 + the first signal), or, while a record is being written, as soon as it is whole
// (jobs/record.c's write_whole).
static void on_signal(int sig) {
    if (!stop_signal) stop_signal = sig;
    if (++jobs_signals > 1 && !jobs_writing) _exit(128 + stop_signal);
}

void jobs_exit_if_asked(void) {
    if (jobs_signals > 1) _exit(128 + stop_signal);
}

// A signal: the sequences in flight stop where they are (their text so far kept, their records
// marked interrupted), and so do the units of their jobs that had not started (no record: a later
// --resume runs them); jobs not begun are left for --resume.
static void interrupt_in_flight(runner *R, job *jobs, int n_jobs, unit **active, int n_active,
                                unit **pend, int n_pend) {
    int n = n_active + n_pend;
    for (int k = 0; k < n; k++) {
        unit *u = k < n_active ? active[k] : pend[k - n_active];
        u->interrupted = 1;
        unit_done(jobs, u);
    }
    for (int j = 0; j < n_jobs; j++) {
        job *J = &jobs[j];
        if (J->rq->error || J->written || J->n_left == J->n_units) continue;   // not begun
        for (int i = 0; i < J->n_units; i++)
            if (J->u[i].state == 0) J->u[i].state = 2, J->u[i].interrupted = 2, J->n_left--;
    }
    if (!R->o->quiet)
        fprintf(stderr, "\nsift: interrupted (%s): %d sequence%s stopped in flight%s; --resume runs "
                "what is not done (again: exit at once)\n", stop_signal == SIGTERM ? "SIGTERM" : "SIGINT",
                n, plural_s(n), n && (R->o->json || R->o->output) ? ", recorded as interrupted" : "");
    stdout_check();
}

// Outputs job J (all its units done).
static void emit_job(runner *R, job *J) {
    const run_opts *o = R->o;
    compare_with_full(J->u, J->n_units, R->m->cfg.n_layer);
    int json = o->json || o->output;
    for (int i = 0; i < J->n_units; i++) {
        unit *u = &J->u[i];
        if (u->interrupted == 2) continue;   // a signal came before it started: no record
        if (u->rep > 0) {   // a repetition: its timings go into the table only
            R->prompt_tok += u->g.st.prompt_n;
            R->prefill_ms += u->g.st.prompt_ms;
            R->gen_tok += u->rc ? 0 : u->g.st.predicted_n;
            continue;
        }
        // n > 1: one record holds every choice (choice 0's, the others following it in J->u);
        // the request failed, once, when any of them did
        int nc = J->rq->n_choices > 1 ? J->rq->n_choices : 1;
        const unit *bad = NULL;
        for (int k = 0; k < nc && u->choice == 0 && !bad; k++)
            if (u[k].rc) bad = &u[k];
        if (bad) {
            R->n_failed++;
            fprintf(stderr, "sift: error: %s%s%s\n", J->n_units > nc ? u->s->name : "",
                    J->n_units > nc ? ": " : "", bad->err);
        }
        if (!u->rc && !u->interrupted) km_keep(R, u);
        if (o->reps > 1) u->reps = J->u, u->n_reps_units = J->n_units;   // medians in its record
        if (json && u->choice == 0) record_unit(R, u);
        else if (!json && !u->stream && !u->rc) {   // text mode, not streamed: the whole block now
            char label[64];
            if (nc > 1) snprintf(label, sizeof label, "choice %d", u->choice);
            else snprintf(label, sizeof label, "%s", u->s->name);
            if (J->n_units > 1 || R->n_req > 1)
                printf("==> %s%s%s%s <==\n", J->rq->id, J->n_units > 1 ? " [" : "",
                       J->n_units > 1 ? label : "", J->n_units > 1 ? "]" : "");
            printf("%s\n", u->ans.text ? u->ans.text : "");
            stdout_check();
        }
        if (!u->rc && !o->quiet && o->parallel == 1) print_timing(R, u);
        R->prompt_tok += u->g.st.prompt_n;
        if (!u->packed) R->prefill_ms += u->g.st.prompt_ms;   // a packed one's pass is counted
        R->gen_tok += u->rc ? 0 : u->g.st.predicted_n;
    }
    if (J->n_units > 1 && J->rq->n_choices == 1 && !json) {
        if (o->reps > 1) print_table_reps(J->u, J->n_units);
        else print_table(J->u, J->n_units);
        machine_note(R);
        stdout_check();
    }
    R->n_done++;
    for (int i = 0; i < J->n_units; i++)
        if (J->u[i].interrupted) {
            R->n_stopped++;
            break;
        }
    J->written = 1;
    for (int i = 0; i < J->n_units; i++) {   // written: only the figures above are kept
        unit_free(&J->u[i]);
        J->u[i].ids = NULL;
    }
}

// An error record for a request that cannot run (a bad --prompts line, a duplicate id).
static void emit_error(runner *R, job *J) {
    R->n_failed++;
    R->n_done++;
    J->written = 1;
    fprintf(stderr, "sift: error: %s\n", J->rq->error);
    if (R->o->json || R->o->output) record_error(R, J->rq);
}

static void progress(runner *R, int in_flight, int final) {
    double now = now_ms(), el = (now - R->t0) / 1e3;
    if (R->o->quiet || R->n_req < 2) return;
    int tty = isatty(2);
    if (!final && now - R->last_progress < (tty ? 250 : 10000)) return;
    R->last_progress = now;
    double rate = el > 0 ? R->n_done / el : 0, eta = rate > 0 ? (R->n_req - R->n_done) / rate : 0;
    fprintf(stderr, "%ssift: %d/%d prompts done (%d failed, %d in flight), %.1f s, "
            "%.1f generated tok/s, ETA %.0f s%s", tty ? "\r" : "", R->n_done, R->n_req,
            R->n_failed, in_flight, el, el > 0 ? R->gen_tok / el : 0, eta, tty && !final ? "   " : "\n");
}

// ---- the records files: locked, read and rewritten (--resume), written, synced -----------------

// A line no record sift writes can reach: 64 MiB, or 1 KiB per context token when that is more
// (a token's text escaped as JSON is a few bytes; a record holds at most n_ctx of them).
static size_t max_record(int n_ctx) {
    size_t cap = (size_t)64 << 20, per = (size_t)(n_ctx > 0 ? n_ctx : 0) << 10;
    return per > cap ? per : cap;
}

typedef struct outputs {
    const char *path[2];     // --output, --errors (NULL: not given); a symlink: the file it names
    char *real[2];           // that file's path (malloc'd), when the path given is a symlink
    char name[2][300];       // "--output 'x'"
    rec_sink sink[2];
    out_lock lock[2];
} outputs;

// Locks --output and --errors (regular files; a device or pipe is the user's to share), reads and
// repairs what an earlier run wrote (--resume: the done outcomes into done), and opens them: a
// new file is created (one there is refused: cmd/run.c checked; O_EXCL settles a race), a device or
// pipe is written in place (never truncated, unlinked or renamed), a resumed file is appended to.
// 0, or -1 (the error printed).
static int outputs_open(outputs *w, const run_opts *o, const request_list *all, int lo, int hi, int shape,
                        int n_ctx, done_set *done, int *failed_before) {
    char err[1024];
    const char *flag[2] = {"--output", "--errors"};
    int regular[2] = {1, 1};
    for (int f = 0; f < 2; f++) w->sink[f] = (rec_sink){.fd = -1}, w->lock[f] = (out_lock){NULL, -1};
    for (int f = 0; f < 2; f++) {
        if (!w->path[f]) continue;
        snprintf(w->name[f], sizeof w->name[f], "%s '%.270s'", flag[f], w->path[f]);
        struct stat st;
        // a symlink is followed: its file is locked, rewritten and renamed over, never the link
        if (lstat(w->path[f], &st) == 0 && S_ISLNK(st.st_mode) && (w->real[f] = realpath(w->path[f], NULL)))
            w->path[f] = w->real[f];
        regular[f] = stat(w->path[f], &st) != 0 || S_ISREG(st.st_mode);
        if (regular[f] && out_lock_take(&w->lock[f], w->path[f], o->wait_lock, o->quiet, err, sizeof err)) {
            fprintf(stderr, "sift: error: %s: %s\n", flag[f], err);
            return -1;
        }
    }
    if (o->resume) {
        out_scan sc[2] = {{0}, {0}};
        const char *names[2] = {w->path[0], w->path[1] ? w->path[1] : "-"};
        int action[2] = {0, 0}, rc = 0;
        for (int f = 0; f < 2 && !rc; f++)
            if (w->path[f]) {
                resume_clean_temps(w->path[f]);
                rc = resume_read(w->path[f], f, max_record(n_ctx), &sc[f], err, sizeof err);
            }
        if (!rc) rc = resume_plan(sc, 2, names, shape, all->r, all->n, lo, hi, o, 0, done, action, err, sizeof err);
        *failed_before = rc ? 0 : sc[0].n_failed_kept + sc[1].n_failed_kept;
        for (int f = 0; f < 2 && !rc; f++) {
            if (action[f] == RESUME_KEEP) continue;
            rc = resume_rewrite(w->path[f], &sc[f], action[f], err, sizeof err);
            int kept = 0;
            for (int i = 0; i < sc[f].n; i++) kept += sc[f].r[i].keep;
            if (!rc && !o->quiet)
                fprintf(stderr, "sift: --resume: %s '%s': %d record%s kept, %d line%s dropped (%s)\n",
                        action[f] == RESUME_REWRITE ? "rewrote" : "cut the last line of", w->path[f], kept,
                        plural_s(kept), sc[f].n_dropped, plural_s(sc[f].n_dropped), action[f] == RESUME_REWRITE ? "one per request, in input order"
                                                                     : "a write cut short");
        }
        scan_free(&sc[0]), scan_free(&sc[1]);
        if (rc) {
            fprintf(stderr, "sift: error: --resume: %s\n", err);
            return -1;
        }
    }
    for (int f = 0; f < 2; f++) {
        if (!w->path[f]) continue;
        rec_sink *s = &w->sink[f];
        int flags = o->resume ? O_CREAT | O_APPEND : regular[f] ? O_CREAT | O_EXCL : 0;
        s->fd = open(w->path[f], O_WRONLY | O_CLOEXEC | flags, 0666);
        s->name = w->name[f], s->regular = regular[f], s->last_sync = now_ms();
        if (s->fd < 0) {
            fprintf(stderr, "sift: error: cannot write %s: %s\n", s->name, strerror(errno));
            return -1;
        }
        struct stat st;
        if (fstat(s->fd, &st) == 0) s->regular = S_ISREG(st.st_mode);
        if (s->regular) s->end = lseek(s->fd, 0, SEEK_END);
    }
    return 0;
}

// The end of the run: each file fsync'ed and closed (checked); a resumed run that completed leaves
// its files in input order (rewritten once when the appended records follow later ones; not with
// --unordered); the locks released. 0, or -1 (the error printed).
static int outputs_close(outputs *w, const run_opts *o, const request_list *all, int lo, int hi, int shape,
                         int n_ctx, int completed) {
    char err[1024];
    int rc = 0;
    for (int f = 0; f < 2; f++) {
        rec_sink *s = &w->sink[f];
        if (s->fd < 0) continue;
        if ((s->regular && fsync(s->fd) != 0) | (close(s->fd) != 0)) {
            fprintf(stderr, "sift: error: cannot write %s: %s\n", s->name, strerror(errno));
            rc = -1;
        }
        s->fd = -1;
    }
    if (!rc && o->resume && completed && !o->unordered) {
        out_scan sc[2] = {{0}, {0}};
        const char *names[2] = {w->path[0], w->path[1] ? w->path[1] : "-"};
        int action[2] = {0, 0};
        for (int f = 0; f < 2 && !rc; f++)
            if (w->path[f] && w->sink[f].regular)
                rc = resume_read(w->path[f], f, max_record(n_ctx), &sc[f], err, sizeof err);
        if (!rc) rc = resume_plan(sc, 2, names, shape, all->r, all->n, lo, hi, o, 1, NULL, action, err, sizeof err);
        for (int f = 0; f < 2 && !rc; f++)
            if (action[f] != RESUME_KEEP) rc = resume_rewrite(w->path[f], &sc[f], action[f], err, sizeof err);
        scan_free(&sc[0]), scan_free(&sc[1]);
        if (rc) fprintf(stderr, "sift: error: %s\n", err);
    }
    for (int f = 0; f < 2; f++) {
        if (w->lock[f].path) out_lock_release(&w->lock[f]);
        free(w->real[f]);
        w->real[f] = NULL;
    }
    return rc;
}

// One jobs_run: what run_setup builds, run_schedule works through and run_finish reports and frees.
typedef struct {
    runner R;
    par_tune tune;          // each pass shared or one sequence at a time, as measured (jobs/tune.h)
    request_list all;       // every request of the run, in input order
    int lo, hi, shape;      // this process's shard of them [lo, hi); the records' shape
    done_set done;          // the outcomes an earlier run wrote (--resume)
    outputs w;
    rec_sink out_stdout;
    job *jobs;              // the shard's requests not done before
    int n_jobs, slots, json;
    unit **active, **pend;  // the sequences in flight; opened, not yet prefilled (a packed pass)
    int n_active, n_pend, next_job, next_write;   // the next job to admit, and to write
    struct sigaction old_int, old_term, old_xfsz;
} run_state;

// The shard (a contiguous slice, so shard outputs concatenate in input order), the records'
// shape, each request's settled values, and n > 1 refused where it cannot be answered.
static void run_requests(run_state *S) {
    const run_opts *o = S->R.o;
    request_list *all = &S->all;
    *all = jobs_collect(o);
    S->lo = 0, S->hi = all->n;
    if (o->shard_n > 0) {
        S->lo = (int)((long)all->n * o->shard_k / o->shard_n);
        S->hi = (int)((long)all->n * (o->shard_k + 1) / o->shard_n);
    }
    S->R.t0 = now_ms();
    // the records' shape, one per job: --output-format, else the Batch API's when every --prompts
    // line that is JSON is a Batch API request (a line that is not becomes an error record in that
    // shape) and one strategy runs (the Batch API has one response per custom_id)
    int n_batch = 0, n_other = 0;
    for (int i = 0; i < all->n; i++)
        if (!all->r[i].line || all->r[i].parsed) {
            n_batch += all->r[i].openai;
            n_other += !all->r[i].openai;
        }
    S->R.openai = o->format == RUN_FORMAT_OPENAI ||
                  (o->format == RUN_FORMAT_AUTO && n_batch > 0 && n_other == 0 && o->n_strategies == 1);
    S->shape = S->R.openai ? SHAPE_OPENAI : SHAPE_SIFT;
    for (int i = 0; i < all->n; i++)   // the run's flags or OpenAI's defaults, and the digest
        if (!all->r[i].error) request_settle(&all->r[i], o);
    // n > 1: one record holds every choice, so only the Batch API's shape with one strategy and
    // no --repeat answers it, and the choices copy one prefill's cache, so not a strategy with decode
    // state (topk, topk+phi, X+topk); elsewhere it is the line's error, decided before --resume
    // reads which are done (gen_fork still refuses any other state it cannot copy, at run time)
    for (int i = 0; i < all->n; i++) {
        request *q = &all->r[i];
        int ns = q->strategy ? 1 : o->n_strategies;
        const strategy *s = q->strategy ? q->strategy : o->strategies[0];
        int decode_state = s->phase == PHASE_DECODE || (s->decode_part && s->decode_part->phase == PHASE_DECODE);
        if (q->error || q->n_choices <= 1) continue;
        if (!(S->R.openai && ns == 1 && o->reps <= 1)) {
            q->code = "unsupported_parameter";
            q->error = fmt("%s line %d: n > 1 is answered only in the Batch API's output shape, "
                           "one strategy, no --repeat (one record holds every choice)", q->src, q->line);
        } else if (decode_state) {
            q->code = "unsupported_parameter";
            q->error = fmt("%s line %d: strategy '%s' keeps per-sequence decode state that cannot "
                           "be copied: several choices (n > 1) need a strategy whose decode reads "
                           "only its cache (full, or a prefill strategy)", q->src, q->line, s->name);
        }
    }
}

// The jobs: requests of the shard not done before, each with one unit per strategy (and
// repetition, and choice); said on stderr with --resume or --shard.
static void run_jobs(run_state *S) {
    const run_opts *o = S->R.o;
    int lo = S->lo, hi = S->hi, n_jobs = 0, skipped = 0;
    job *jobs = S->jobs = xcalloc((size_t)(hi - lo + 1), sizeof *jobs);
    for (int i = lo; i < hi; i++) {
        request *q = &S->all.r[i];
        job *J = &jobs[n_jobs];
        *J = (job){.rq = q};
        int ns = q->strategy ? 1 : o->n_strategies, reps = o->reps > 1 ? o->reps : 1;
        if (q->error) {
            char *k = error_key(q);
            int had = done_has(&S->done, k);
            free(k);
            if (had) skipped++;
            else n_jobs++;
            continue;
        }
        J->u = xcalloc((size_t)ns * reps * q->n_choices, sizeof *J->u);
        for (int r = 0; r < reps; r++)   // repetition r starts at strategy r: rotating order
            for (int s = 0; s < ns; s++) {
                const strategy *st = q->strategy ? q->strategy : o->strategies[(s + r) % ns];
                char *k = unit_key(q->id, S->R.openai ? NULL : st->name);
                if (!done_has(&S->done, k))   // n > 1: choice 0, then the choices that copy it
                    for (int c = 0; c < q->n_choices; c++)
                        J->u[J->n_units++] = (unit){.rq = q, .s = st, .job = n_jobs, .rep = r, .choice = c};
                free(k);
            }
        if (J->n_units == 0) {
            free(J->u);
            skipped++;
            continue;
        }
        J->n_left = J->n_units;
        n_jobs++;
    }
    S->n_jobs = S->R.n_req = n_jobs, S->R.n_skipped = skipped;
    if (!o->quiet && o->resume)
        fprintf(stderr, "sift: %d request%s%s: %d to run, %d done before (--resume)\n", hi - lo,
                plural_s(hi - lo), o->shard_n > 0 ? " in this shard" : "", n_jobs, skipped);
    else if (!o->quiet && o->shard_n > 0)
        fprintf(stderr, "sift: %d request%s in this shard (--shard %d/%d)\n", hi - lo, plural_s(hi - lo),
                o->shard_k, o->shard_n);
}

// Everything before the first step: the requests, the records files (opened, --resume read), the
// jobs, the signals caught, an A/B comparison's warm-up, the slots. 0, or 1 (a records file
// failed: the error printed).
static int run_setup(run_state *S) {
    const run_opts *o = S->R.o;
    tune_init(&S->tune, S->R.m, o->parallel, o->quiet);
    run_requests(S);
    if (outputs_open(&S->w, o, &S->all, S->lo, S->hi, S->shape, S->R.n_ctx, &S->done, &S->R.n_failed_before)) {
        outputs_close(&S->w, o, &S->all, S->lo, S->hi, S->shape, S->R.n_ctx, 0);
        return 1;
    }
    S->R.out = o->output ? &S->w.sink[0] : &S->out_stdout;
    S->R.errs = o->errors ? &S->w.sink[1] : NULL;
    run_jobs(S);
    // --prefix-cache: auto shares except in an A/B comparison (each strategy's TTFT its own)
    S->R.prefix_on = o->prefix_cache > 0 || (o->prefix_cache < 0 && o->n_strategies <= 1 && o->reps <= 1);
    prefix_plan(&S->R, S->jobs, S->n_jobs);
    char why[700];
    if (prefix_file_open(&S->R, why, sizeof why) != 0) {
        fprintf(stderr, "sift: error: %s\n", why);
        outputs_close(&S->w, o, &S->all, S->lo, S->hi, S->shape, S->R.n_ctx, 0);
        return 1;
    }

    struct sigaction sa = {0}, ign = {0};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;   // a write to a slow pipe resumes instead of failing
    sigaction(SIGINT, &sa, &S->old_int);
    sigaction(SIGTERM, &sa, &S->old_term);
    ign.sa_handler = SIG_IGN;   // past a file size limit (ulimit -f) a write fails (EFBIG): reported
    sigaction(SIGXFSZ, &ign, &S->old_xfsz);

    int ab = 0;   // an A/B comparison: several strategies (or repetitions) on a prompt
    for (int j = 0; j < S->n_jobs; j++) ab |= S->jobs[j].n_units > 1;
    // untimed, before an A/B comparison, so that the first strategy is not the one that pays
    char err[512];
    if (ab && !stop_signal) (void)run_warm_up(o->strategies[0], S->R.cx, o->so, o->run, 32, err, sizeof err);
    S->R.cpu_mark = cpu_now();
    S->slots = o->parallel > 0 ? o->parallel : 1, S->json = o->json || o->output;
    // packed prefill: with --parallel, not in an A/B comparison of strategies or repetitions
    // (each strategy's TTFT its own; a request's n > 1 choices are no comparison)
    long pack_rows = tunables()->pack_rows < 0 ? PACK_ROWS : tunables()->pack_rows;
    S->R.pack_rows = S->slots > 1 && o->n_strategies <= 1 && o->reps <= 1 ? (int)pack_rows : 0;
    S->active = xmalloc((size_t)(S->slots + MAX_STRATEGIES * 100) * sizeof *S->active);
    S->pend = xmalloc((size_t)(S->slots + MAX_STRATEGIES * 100) * sizeof *S->pend);
    return 0;
}

// Admits: fills the free slots with the next units in input order (prefill each, or open it for
// a packed pass).
static void run_admit(run_state *S) {
    while (!stop_signal && S->n_active + S->n_pend < S->slots && S->next_job < S->n_jobs) {
        job *J = &S->jobs[S->next_job];
        int k = 0;   // its first unit not started (an error record's job has none)
        while (k < J->n_units && J->u[k].state != 0) k++;
        if (k == J->n_units) {
            S->next_job++;
            continue;
        }
        unit *u = &J->u[k];
        // repetitions run silently; a text with stop strings or several choices is printed
        // whole when done (a stop string is cut from it)
        int stream = !S->json && S->slots == 1 && u->rep == 0 && !J->rq->n_stop && J->rq->n_choices == 1;
        if (stream && (J->n_units > 1 || S->R.n_req > 1)) {
            if (J->n_units > 1 && S->R.n_req > 1) printf("==> %s [%s] <==\n", J->rq->id, u->s->name);
            else printf("==> %s <==\n", J->n_units > 1 ? u->s->name : J->rq->id);
            stdout_check();
        }
        unit_start(&S->R, u, stream);
        if (u->state == 1 && u->packed) S->pend[S->n_pend++] = u;
        else if (u->state == 1 && !u->g.done) S->active[S->n_active++] = u;
        else {   // failed, or done with its first token: written before anything else starts
            unit_done(S->jobs, u);
            break;
        }
    }
}

// One pass prefilling the first opened prompt and those that can share its pass (up to
// pack_rows rows: the decode steps of the sequences in flight wait one pass at most).
static void run_prefill(run_state *S) {
    double t0 = now_ms();
    gen_seq *gs[FWD_MAX_BATCH];
    int k = S->n_pend < FWD_MAX_BATCH ? S->n_pend : FWD_MAX_BATCH;
    for (int i = 0; i < k; i++) gs[i] = &S->pend[i]->g;
    tune_prefill(&S->tune, gs, k, S->R.pack_rows);
    S->R.prefill_ms += now_ms() - t0;
    for (int i = 0; i < S->n_pend;) {
        unit *u = S->pend[i];
        if (!u->g.fed) {
            i++;
            continue;
        }
        memmove(S->pend + i, S->pend + i + 1, (size_t)(S->n_pend - i - 1) * sizeof *S->pend);   // keep order
        S->n_pend--;
        if (!u->g.done) S->active[S->n_active++] = u;
        else unit_done(S->jobs, u);   // done with its first token
    }
}

// One decode step over every sequence in flight.
static void run_decode(run_state *S) {
    double t0 = now_ms();
    gen_seq *gs[FWD_MAX_BATCH];
    for (int i = 0; i < S->n_active; i++) gs[i] = &S->active[i]->g;
    tune_step(&S->tune, gs, S->n_active);
    S->R.decode_ms += now_ms() - t0;
    S->R.decode_tok += S->n_active;
    for (int i = 0; i < S->n_active;) {
        unit *u = S->active[i];
        if (!u->g.done) {
            i++;
            continue;
        }
        unit_done(S->jobs, u);
        S->active[i] = S->active[--S->n_active];
    }
}

// Writes what is complete: in input order (the scan stops at the first job not done), or with
// --unordered anything done (only jobs admitted so far can be).
static void run_write(run_state *S) {
    int lim = S->R.o->unordered && S->next_job + 1 < S->n_jobs ? S->next_job + 1 : S->n_jobs;
    for (int j = S->next_write; j < lim; j++) {
        job *J = &S->jobs[j];
        if (J->written) {
            if (j == S->next_write) S->next_write++;
            continue;
        }
        if (J->rq->error) emit_error(&S->R, J);
        else if (J->n_left == 0) emit_job(&S->R, J);
        else if (!S->R.o->unordered) break;
        if (J->written && j == S->next_write) S->next_write++;
    }
}

// The scheduler: admit, prefill, one decode step, write, until every job is done or a signal
// stops the run (what is in flight is then written as interrupted).
static void run_schedule(run_state *S) {
    for (;;) {
        if (stop_signal) {
            interrupt_in_flight(&S->R, S->jobs, S->n_jobs, S->active, S->n_active, S->pend, S->n_pend);
            S->n_active = S->n_pend = 0;
            break;
        }
        run_admit(S);
        if (S->n_pend > 0) run_prefill(S);
        if (S->n_active > 0) run_decode(S);
        run_write(S);
        progress(&S->R, S->n_active + S->n_pend, 0);
        if (S->n_active == 0 && S->n_pend == 0 && (S->next_job >= S->n_jobs || stop_signal)) break;
    }
}

// The end: what is left written, the records files closed, the summary and kept map written, the
// signals restored. The exit code: 128 + a signal that stopped the run, else 1 when a request or
// a write failed.
static int run_finish(run_state *S) {
    runner *R = &S->R;
    const run_opts *o = R->o;
    // in input order, a job held back by an unfinished earlier one is written now if complete
    for (int j = 0; j < S->n_jobs; j++) {
        job *J = &S->jobs[j];
        if (!J->written && !J->rq->error && J->n_left == 0) emit_job(R, J);
        else if (!J->written && J->rq->error && !stop_signal) emit_error(R, J);
    }
    if (!S->json) stdout_check();
    int out_failed = outputs_close(&S->w, o, &S->all, S->lo, S->hi, S->shape, R->n_ctx, !stop_signal) != 0;
    progress(R, 0, 1);
    int summary_failed = write_summary(R, S->slots, stop_signal != 0) != 0;
    int km_failed = o->kept_map && km_write(R, o->kept_map) != 0;
    sigaction(SIGINT, &S->old_int, NULL);
    sigaction(SIGTERM, &S->old_term, NULL);
    sigaction(SIGXFSZ, &S->old_xfsz, NULL);
    if (stop_signal) return 128 + stop_signal;
    // the job's truth: a failure an earlier run recorded (and --resume kept) fails it too
    return R->n_failed || R->n_failed_before || km_failed || summary_failed || out_failed ||
           R->pc_failed ? 1 : 0;
}

int jobs_run(const run_opts *o, context *cx, const tok *t, const char *dev, const char *model_name,
             double load_ms, int n_ctx) {
    run_state S = {.R = {.o = o, .cx = cx, .m = cx->m, .t = t, .dev = dev, .model_name = model_name,
                         .load_ms = load_ms, .n_ctx = n_ctx}, .w = {.path = {o->output, o->errors}},
                   .out_stdout = {.f = stdout, .fd = -1, .name = "stdout"}};
    int rc = run_setup(&S);
    if (rc == 0) {
        run_schedule(&S);
        rc = run_finish(&S);
    }
    for (int j = 0; j < S.n_jobs; j++) {
        for (int k = 0; k < S.jobs[j].n_units; k++) unit_free(&S.jobs[j].u[k]);
        free(S.jobs[j].u);
    }
    prefix_plan_free(&S.R);
    free(S.jobs), free(S.active), free(S.pend);
    for (int i = 0; i < S.all.n; i++) req_free(&S.all.r[i]);
    free(S.all.r);
    done_free(&S.done);
    return rc;
}
