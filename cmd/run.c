// cmd/run.c — running prompts: the requests of a run (-p, -f, --batch DIR, --prompts FILE.jsonl),
// this process's shard of them, minus what --resume finds already done, through up to
// --parallel sequences at a time (continuous batching: each decode step is one forward pass over
// every sequence in flight, policies' gen_step; a finished sequence's slot takes the next request
// at once). Results: text blocks, or one JSON record per (request, strategy) written whole and
// flushed, in input order (--unordered: as they finish); progress and a summary on stderr (and a
// last summary record in JSON). Ctrl-C: finish the sequences in flight, then stop (again: drop
// them); SIGTERM drops them at once. Either way the output holds only whole records.
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../util/check.h"
#include "cmd.h"

// ---- requests -----------------------------------------------------------------------------

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
} request;

typedef struct {
    request *r;
    int n, cap;
} request_list;

static request *req_new(request_list *l) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->r = xrealloc(l->r, (size_t)l->cap * sizeof *l->r);
    }
    request *q = &l->r[l->n];
    *q = (request){.index = l->n, .n_predict = -2, .temp = -1, .top_p = -1, .seed = -1};
    l->n++;
    return q;
}

static void req_free(request *q) {
    free(q->id), free(q->text), free(q->system), free(q->error);
    for (int i = 0; i < q->n_turns; i++) free(q->roles[i]), free(q->contents[i]);
    free(q->roles), free(q->contents);
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    char *s = NULL;
    if (vasprintf(&s, f, ap) < 0) s = NULL;
    va_end(ap);
    CHECK_INTERNAL(s, "out of memory");
    return s;
}

// The messages array of a request line into q's turns (a leading system message sets q->system);
// NULL or the error text.
static char *parse_messages(request *q, json_t *msgs) {
    if (!json_is_array(msgs)) return fmt("'messages' must be an array of {role, content}");
    size_t n = json_array_size(msgs);
    if (n == 0) return fmt("'messages' is empty");
    q->roles = xcalloc(n, sizeof *q->roles), q->contents = xcalloc(n, sizeof *q->contents);
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(msgs, i), *role = json_object_get(m, "role"),
               *content = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(role) || !json_is_string(content))
            return fmt("messages[%zu] must be {\"role\": string, \"content\": string}", i);
        const char *r = json_string_value(role);
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant"))
            return fmt("messages[%zu]: role '%s' (expected system, user or assistant)", i, r);
        if (strcmp(r, "system") == 0) {
            if (i > 0 || q->system) return fmt("messages[%zu]: a system message must come first, once", i);
            q->system = strdup(json_string_value(content));
            continue;
        }
        q->roles[q->n_turns] = strdup(r);
        q->contents[q->n_turns++] = strdup(json_string_value(content));
    }
    if (q->n_turns == 0) return fmt("'messages' has no user message");
    q->chat = 1;
    return NULL;
}

static char *int_field(json_t *v, const char *name, long long lo, long long hi, long long *out) {
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return fmt("'%s' must be an integer in [%lld, %lld]", name, lo, hi);
    *out = json_integer_value(v);
    return NULL;
}

static char *num_field(json_t *v, const char *name, double lo, double hi, float *out) {
    if (!json_is_number(v) || json_number_value(v) < lo || json_number_value(v) > hi)
        return fmt("'%s' must be a number in [%g, %g]", name, lo, hi);
    *out = (float)json_number_value(v);
    return NULL;
}

// One request line: sift's fields, or the OpenAI Batch API request shape. NULL or the error.
static char *parse_line(request *q, json_t *o, int chat_flag) {
    if (!json_is_object(o)) return fmt("a request must be a JSON object");
    const char *key;
    json_t *v, *body = NULL, *msgs = NULL;
    long long ll = 0;
    char *e = NULL;
    json_object_foreach(o, key, v) {
        if (e) break;
        if (!strcmp(key, "id") || !strcmp(key, "custom_id")) {
            if (json_is_string(v)) q->id = strdup(json_string_value(v));
            else if (json_is_integer(v)) q->id = fmt("%lld", (long long)json_integer_value(v));
            else e = fmt("'%s' must be a string or an integer", key);
        } else if (!strcmp(key, "prompt")) {
            if (!json_is_string(v)) e = fmt("'prompt' must be a string");
            else q->text = strdup(json_string_value(v));
        } else if (!strcmp(key, "messages")) msgs = v;
        else if (!strcmp(key, "system")) {
            if (!json_is_string(v)) e = fmt("'system' must be a string");
            else q->system = strdup(json_string_value(v)), q->chat = 1;
        } else if (!strcmp(key, "n_predict")) {
            if (!(e = int_field(v, key, -1, 1 << 22, &ll)) && ll == 0) e = fmt("'n_predict' 0 generates nothing");
            q->n_predict = (int)ll;
        } else if (!strcmp(key, "temp")) e = num_field(v, key, 0, 100, &q->temp);
        else if (!strcmp(key, "seed")) {
            e = int_field(v, key, 0, UINT32_MAX, &ll);
            q->seed = ll;
        } else if (!strcmp(key, "strategy")) {
            if (!json_is_string(v) || !(q->strategy = strategy_find(json_string_value(v))))
                e = json_is_string(v) && strategy_refusal(json_string_value(v))
                        ? fmt("'strategy' %s", strategy_refusal(json_string_value(v)))
                        : fmt("'strategy' must name one of: %s (or PREFILL+DECODE)", strategy_names());
        } else if (!strcmp(key, "body")) body = v;
        else if (!strcmp(key, "method") || !strcmp(key, "url")) continue;   // OpenAI's envelope
        else e = fmt("unknown field '%s'", key);
    }
    if (!e && body) {   // OpenAI Batch API: body.messages, max_tokens, temperature, top_p, seed
        if (!json_is_object(body)) return fmt("'body' must be an object");
        json_object_foreach(body, key, v) {
            if (e) break;
            if (!strcmp(key, "messages")) {
                if (msgs) e = fmt("'messages' given twice (top level and body)");
                msgs = v;
            } else if (!strcmp(key, "max_tokens") || !strcmp(key, "max_completion_tokens")) {
                e = int_field(v, key, 1, 1 << 22, &ll);
                q->n_predict = (int)ll;
            } else if (!strcmp(key, "temperature")) e = num_field(v, key, 0, 100, &q->temp);
            else if (!strcmp(key, "top_p")) e = num_field(v, key, 1e-6, 1, &q->top_p);
            else if (!strcmp(key, "seed")) {
                e = int_field(v, key, 0, UINT32_MAX, &ll);
                q->seed = ll;
            }   // other body fields (model, ...) name things sift does not choose: ignored
        }
    }
    if (e) return e;
    if (!q->text == !msgs) return fmt(q->text ? "give 'prompt' or 'messages', not both"
                                              : "no prompt: give 'prompt' or 'messages'");
    if (msgs && (e = parse_messages(q, msgs))) return e;
    if (q->text && !q->chat) q->chat = chat_flag;
    return NULL;
}

// Appends the requests of a JSON Lines file (bad lines become error records); 0 or -1 + err
// when the file cannot be read.
static int read_prompts(request_list *l, const char *path, int chat, char *err, size_t errlen) {
    FILE *fp = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!fp) return err_printf(err, errlen, "cannot read --prompts file '%s': %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    for (int ln = 1; (got = getline(&line, &cap, fp)) >= 0; ln++) {
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        size_t sp = strspn(line, " \t");
        if (line[sp] == 0) continue;   // blank lines are not requests
        request *q = req_new(l);
        q->line = ln, q->src = path;
        json_error_t je;
        json_t *o = json_loadb(line, (size_t)got, JSON_REJECT_DUPLICATES, &je);
        char *e = o ? parse_line(q, o, chat) : fmt("invalid JSON at column %d: %s", je.column, je.text);
        json_decref(o);
        if (!q->id) q->id = fmt("line-%d", ln);
        if (e) {
            q->error = fmt("%s line %d: %s", path, ln, e);
            free(e);
        }
    }
    free(line);
    if (fp != stdin) fclose(fp);
    return 0;
}

static int by_id(const void *a, const void *b) {
    const request *x = *(const request *const *)a, *y = *(const request *const *)b;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->index > y->index) - (x->index < y->index);
}

// Every request of the run, in input order; duplicate ids become error records.
static request_list collect(const run_opts *o) {
    request_list l = {0};
    char err[512];
    if (o->prompt) {
        request *q = req_new(&l);
        q->id = strdup("prompt"), q->text = strdup(o->prompt), q->chat = o->chat;
    }
    for (int i = 0; i < o->n_files; i++) {
        request *q = req_new(&l);
        q->id = strdup(o->files[i]), q->file = o->files[i], q->chat = o->chat;
    }
    if (o->prompts_path && read_prompts(&l, o->prompts_path, o->chat, err, sizeof err)) {
        request *q = req_new(&l);
        q->id = strdup(o->prompts_path), q->error = strdup(err);
    }
    // duplicates: the requests (not already errors) sorted by id, then input order; a run of
    // equal ids keeps its first
    request **by = xmalloc((size_t)(l.n ? l.n : 1) * sizeof *by);
    int nb = 0;
    for (int i = 0; i < l.n; i++)
        if (!l.r[i].error) by[nb++] = &l.r[i];
    qsort(by, (size_t)nb, sizeof *by, by_id);
    for (int i = 1, first = 0; i < nb; i++) {
        if (strcmp(by[i]->id, by[first]->id) != 0) {
            first = i;
            continue;
        }
        by[i]->error = by[i]->line ? fmt("%s line %d: duplicate id '%s' (first at line %d)",
                                         o->prompts_path, by[i]->line, by[i]->id, by[first]->line)
                                   : fmt("duplicate prompt '%s'", by[i]->id);
    }
    free(by);
    return l;
}

void run_add_file(run_opts *o, const char *path) {
    o->files = xrealloc(o->files, (size_t)(o->n_files + 1) * sizeof *o->files);
    o->files[o->n_files++] = strdup(path);
}

static int by_path(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

void run_add_batch_dir(run_opts *o, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) cli_usage_error("cannot open --batch directory '%s': %s", dir, strerror(errno));
    int first = o->n_files;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".txt") != 0) continue;
        char *path = xmalloc(strlen(dir) + n + 2);
        sprintf(path, "%s/%s", dir, e->d_name);
        run_add_file(o, path);
        free(path);
    }
    closedir(d);
    if (o->n_files == first) cli_usage_error("no .txt files in --batch directory '%s'", dir);
    qsort(o->files + first, (size_t)(o->n_files - first), sizeof *o->files, by_path);
}

// ---- resume: what an earlier run already wrote ----------------------------------------------

typedef struct {
    char **keys;   // "id\tstrategy" (error records: "id\t"), sorted
    int n;
} done_set;

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static char *unit_key(const char *id, const char *strategy) {
    return fmt("%s\t%s", id, strategy ? strategy : "");
}

static int done_has(const done_set *d, const char *key) {
    return d->n && bsearch(&key, d->keys, (size_t)d->n, sizeof *d->keys, cmp_str) != NULL;
}

// The records of an earlier run's --output file; a last line cut short (a kill during its write)
// is removed from the file. 0, or -1 + err.
static int read_done(done_set *d, const char *path, int quiet, char *err, size_t errlen) {
    FILE *fp = fopen(path, "r+");
    if (!fp) return errno == ENOENT ? 0 : err_printf(err, errlen, "cannot open --output '%s': %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    long good = 0;
    int cap_keys = 0;
    while ((got = getline(&line, &cap, fp)) >= 0) {
        if (got == 0 || line[got - 1] != '\n') break;   // no newline: cut short
        json_t *o = json_loadb(line, (size_t)got, 0, NULL);
        json_t *id = json_object_get(o, "id"), *s = json_object_get(o, "strategy");
        if (!o) break;   // damaged: everything from here is dropped
        if (json_is_string(id)) {
            if (d->n == cap_keys) d->keys = xrealloc(d->keys, (size_t)(cap_keys = cap_keys ? 2 * cap_keys : 256) * sizeof *d->keys);
            // a run of a strategy (its text or its error): "id\tstrategy"; a request that could
            // not run at all (a bad line): "id\t"
            d->keys[d->n++] = unit_key(json_string_value(id), json_is_string(s) ? json_string_value(s) : NULL);
        }
        json_decref(o);
        good = ftell(fp);
    }
    fseek(fp, 0, SEEK_END);
    long end = ftell(fp);
    if (end > good) {
        if (ftruncate(fileno(fp), good) != 0) {
            free(line);
            fclose(fp);
            return err_printf(err, errlen, "cannot truncate --output '%s': %s", path, strerror(errno));
        }
        if (!quiet)
            fprintf(stderr, "sift: --resume: dropped %ld bytes of an incomplete last record in %s\n",
                    end - good, path);
    }
    free(line);
    fclose(fp);
    if (d->n) qsort(d->keys, (size_t)d->n, sizeof *d->keys, cmp_str);
    return 0;
}

// ---- one (request, strategy) sequence --------------------------------------------------------

typedef struct {
    char *buf;
    size_t len, cap;
} strbuf;

static void sb_put(strbuf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->buf = xrealloc(b->buf, b->cap);
    }
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = 0;
}

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
    const tok *t;
    strbuf text;
    int *out, n_out;         // every sampled token, end-of-generation included
    int stream, hit_eog;
    double rows_pct;         // prompt rows processed over layers, % of full's n * L
    int rep;                 // which repetition (-r): only repetition 0 writes text and records
    int first_agree;         // first token equals full's (-1: full not run)
    double greedy_agree;     // % of full's generated tokens matched at the same step (-1: n/a)
} unit;

static int on_token(void *ctx, int id) {
    unit *u = ctx;
    u->out = xrealloc(u->out, (size_t)(u->n_out + 1) * sizeof(int));
    u->out[u->n_out++] = id;
    if (tok_is_eog(u->t, id)) {
        u->hit_eog = 1;
        return 1;
    }
    size_t n;
    const char *p = tok_piece(u->t, id, 0, &n);
    sb_put(&u->text, p, n);
    if (u->stream) {
        fwrite(p, 1, n, stdout);
        fflush(stdout);
    }
    return 0;
}

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
    // totals for progress and the summary
    int n_req, n_done, n_failed;
    long prompt_tok, gen_tok, decode_tok;   // decode_tok: tokens of the shared decode steps
    double prefill_ms, decode_ms, t0, last_progress;
    cpu_sample cpu_mark;     // the machine's CPU time at the last A/B table (or the start)
} runner;

// The request's prompt tokens: its text (read from its file now), in the chat template when
// asked. n, or -1 with err.
static int prompt_ids(const runner *R, request *q, int **ids, char *err, size_t errlen) {
    size_t len = 0;
    const char *what = q->file ? "prompt file" : "prompt";
    if (q->file && !q->text) {
        q->text = cli_read_all(q->file, &len, err, errlen);
        if (!q->text) return -1;
        char name[300];
        snprintf(name, sizeof name, "%s '%s'", what, q->id);
        if (cli_text_check(q->text, len, name, err, errlen)) return -1;
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
    int *body = NULL;
    int n = tok_encode(R->t, text, strlen(text), 1, &body, err, errlen);
    if (text != q->text) free(text);
    if (n < 0) return -1;
    int bos = tok_add_bos(R->t) && tok_bos(R->t) >= 0;
    *ids = xmalloc((size_t)(n + bos + 1) * sizeof(int));
    if (bos) (*ids)[0] = tok_bos(R->t);
    memcpy(*ids + bos, body, (size_t)n * sizeof(int));
    free(body);
    return n + bos;
}

int run_read_prompts(const run_opts *o, const tok *t, run_prompt **out, char *err, size_t errlen) {
    request_list all = collect(o);
    runner R = {.o = o, .t = t};
    run_prompt *p = xcalloc((size_t)(all.n ? all.n : 1), sizeof *p);
    int n = 0, bad = 0;
    for (int i = 0; i < all.n && !bad; i++) {
        request *q = &all.r[i];
        if (q->error) bad = err_printf(err, errlen, "%s", q->error);
        else if ((p[n].n_ids = prompt_ids(&R, q, &p[n].ids, err, errlen)) < 0) bad = -1;
        else p[n++].id = strdup(q->id);
    }
    for (int i = 0; i < all.n; i++) req_free(&all.r[i]);
    free(all.r);
    if (bad) {
        run_prompts_free(p, n);
        return -1;
    }
    *out = p;
    return n;
}

void run_prompts_free(run_prompt *p, int n) {
    for (int i = 0; i < n; i++) free(p[i].id), free(p[i].ids);
    free(p);
}

// u could not run: done, with its error naming the --prompts line it came from. -1.
static int unit_failed(unit *u) {
    if (u->rq->line) {
        char e[sizeof u->err];
        snprintf(e, sizeof e, "%.200s line %d: %.290s", u->rq->src, u->rq->line, u->err);
        memcpy(u->err, e, sizeof e);
    }
    u->state = 2;
    return u->rc = -1;
}

// Tokenizes and prefills u (its first token sampled); 0, or -1 (u->err set, u done).
static int unit_start(runner *R, unit *u, int stream) {
    const run_opts *o = R->o;
    request *q = u->rq;
    u->t = R->t;
    u->n_ids = prompt_ids(R, q, &u->ids, u->err, sizeof u->err);
    int want = q->n_predict != -2 ? q->n_predict : o->n_predict;
    u->n_gen = want < 0 ? R->n_ctx - u->n_ids : want;
    if (u->n_ids >= 0 && (u->n_gen < 1 || (long)u->n_ids + u->n_gen > R->n_ctx)) {
        snprintf(u->err, sizeof u->err,
                 "prompt '%s' has %d tokens; with %d to generate that exceeds the context size %d "
                 "(raise -c or lower -n)", q->id, u->n_ids, want < 0 ? 1 : u->n_gen, R->n_ctx);
        u->n_ids = -1;
    }
    if (u->n_ids < 0) return unit_failed(u);
    sample_params sp = o->sp;
    if (q->temp >= 0) sp.temp = q->temp;
    if (q->top_p >= 0) sp.top_p = q->top_p;
    if (q->seed < 0 && o->seed >= 0) q->seed = o->seed;
    if (q->seed < 0)   // one random seed per request: an A/B run's strategies sample alike
        q->seed = (long long)(((unsigned long long)(now_ms() * 1000) + (unsigned)q->index * 7919u) & 0xffffffffULL);
    u->seed = (unsigned long long)q->seed;
    sp.seed = u->seed;
    sampler_init(&u->smp, &sp, R->m->cfg.vocab);
    if (!o->quiet && R->o->parallel == 1)
        fprintf(stderr, "sift: %s: %d prompt tokens, up to %d new (seed %llu)\n", q->id, u->n_ids,
                u->n_gen, u->seed);
    u->stream = stream;
    u->state = 1;
    if (gen_begin(&u->g, u->s, R->m, o->so, u->ids, u->n_ids, u->n_gen, &u->smp, on_token, u, NULL,
                  u->err, sizeof u->err)) {
        sampler_free(&u->smp);
        return unit_failed(u);
    }
    return 0;
}

static void unit_finish(unit *u) {
    if (u->state == 1) {
        gen_end(&u->g);
        sampler_free(&u->smp);
    }
    u->state = 2;
}

static void unit_free(unit *u) {
    free(u->ids), free(u->text.buf), free(u->out);
}

// ---- output -----------------------------------------------------------------------------------

// How each unit compares with `full` on the same request.
static void compare_with_full(unit *u, int n, int n_layer) {
    const unit *full = NULL;
    for (int i = 0; i < n; i++)
        if (strcmp(u[i].s->name, "full") == 0 && u[i].rc == 0) full = &u[i];
    for (int i = 0; i < n; i++) {
        const run_stats *st = &u[i].g.st;
        u[i].rows_pct = st->prompt_n ? 100.0 * st->rows_done / ((double)st->prompt_n * n_layer) : 0;
        u[i].first_agree = -1;
        u[i].greedy_agree = -1;
        if (!full || u[i].rc || full->n_out == 0) continue;
        int same = 0;
        for (int t = 0; t < full->n_out && t < u[i].n_out; t++) same += full->out[t] == u[i].out[t];
        u[i].first_agree = u[i].n_out > 0 && u[i].out[0] == full->out[0];
        u[i].greedy_agree = 100.0 * same / full->n_out;
    }
}

static void print_timing(const runner *R, const unit *u) {
    const run_stats *st = &u->g.st;
    fprintf(stderr, "\nsift: strategy %s, device %s (%d threads), KV cache %.2f MiB\n", u->s->name,
            R->dev, R->o->threads, st->kv_bytes / 1048576.0);
    if (st->note[0]) fprintf(stderr, "sift: %s: %s\n", u->s->name, st->note);
    fprintf(stderr, "      load time = %10.2f ms\n", R->load_ms);
    fprintf(stderr, "prompt eval time = %10.2f ms / %5d tokens (%8.2f ms per token, %8.2f tokens per second)\n",
            st->prompt_ms, st->prompt_n, cli_per_tok(st->prompt_n, st->prompt_ms), cli_per_sec(st->prompt_n, st->prompt_ms));
    fprintf(stderr, "       eval time = %10.2f ms / %5d runs   (%8.2f ms per token, %8.2f tokens per second)\n",
            st->decode_ms, st->decode_runs, cli_per_tok(st->decode_runs, st->decode_ms), cli_per_sec(st->decode_runs, st->decode_ms));
    fprintf(stderr, "      total time = %10.2f ms / %5d tokens\n", st->prompt_ms + st->decode_ms,
            st->prompt_n + st->predicted_n);
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

static void json_unit(FILE *f, const runner *R, const unit *u) {
    const run_stats *st = &u->g.st;
    json_head(f, u->rq);
    if (u->rc) {
        fprintf(f, ",\"strategy\":\"%s\",\"error\":", u->s->name);
        tok_json_str(f, u->err, strlen(u->err));
        fprintf(f, "}\n");
        return;
    }
    fprintf(f, ",\"text\":");
    tok_json_str(f, u->text.buf ? u->text.buf : "", u->text.len);
    fprintf(f, ",\"stop\":\"%s\",\"strategy\":\"%s\",\"device\":\"%s\",\"model\":",
            u->hit_eog ? "eos" : "limit", u->s->name, R->dev);
    tok_json_str(f, R->model_name, strlen(R->model_name));
    fprintf(f, ",\"note\":");
    tok_json_str(f, st->note, strlen(st->note));
    fprintf(f, ",\"label\":");
    if (st->label[0]) tok_json_str(f, st->label, strlen(st->label));
    else fprintf(f, "null");
    fprintf(f, ",\"settings\":");
    cli_strategy_settings_json(f, R->o->so, u->s->name);
    fprintf(f, ",\"seed\":%llu,\"kv_bytes\":%zu,\"load_ms\":%.3f,\"rows_processed\":%ld,"
            "\"draft_rows\":%ld,\"rows_pct_of_full\":%.3f,", u->seed, st->kv_bytes, R->load_ms,
            st->rows_done, st->draft_rows, u->rows_pct);
    if (st->decode_runs) fprintf(f, "\"kv_read_per_step\":%.0f,", st->kv_read_per_step);
    else fprintf(f, "\"kv_read_per_step\":null,");
    if (u->first_agree < 0) fprintf(f, "\"first_token_agree\":null,\"greedy_agree_pct\":null,");
    else fprintf(f, "\"first_token_agree\":%s,\"greedy_agree_pct\":%.2f,", u->first_agree ? "true" : "false", u->greedy_agree);
    fprintf(f, "\"timings\":{\"prompt_n\":%d,\"prompt_ms\":%.3f,\"prompt_per_token_ms\":%.4f,"
            "\"prompt_per_second\":%.3f,\"predicted_n\":%d,\"predicted_ms\":%.3f,"
            "\"predicted_per_token_ms\":%.4f,\"predicted_per_second\":%.3f}}\n",
            st->prompt_n, st->prompt_ms, cli_per_tok(st->prompt_n, st->prompt_ms),
            cli_per_sec(st->prompt_n, st->prompt_ms), st->predicted_n, st->decode_ms,
            cli_per_tok(st->decode_runs, st->decode_ms), cli_per_sec(st->decode_runs, st->decode_ms));
}

// Writes buf[0..n) to f in one call and flushes: a record is never split between writes.
static void write_whole(FILE *f, const char *buf, size_t n) {
    if (fwrite(buf, 1, n, f) != n || fflush(f) != 0) {
        fprintf(stderr, "sift: error: cannot write the results: %s\n", strerror(errno));
        exit(1);
    }
}

// The A/B table after the texts: one row per strategy.
static void print_table(const unit *u, int n) {
    printf("\n| strategy | rows %% of full | KV MiB | KV read/step MiB | TTFT ms | prefill tok/s | TPOT ms "
           "| decode tok/s | 1st token = full | greedy agree %% | first line |\n"
           "|---|---:|---:|---:|---:|---:|---:|---:|:---:|---:|---|\n");
    for (int i = 0; i < n; i++) {
        const run_stats *st = &u[i].g.st;
        if (u[i].rc) {
            printf("| %s | error: %s ||||||||||\n", u[i].s->name, u[i].err);
            continue;
        }
        const char *text = u[i].text.buf ? u[i].text.buf : "";
        while (*text == '\n' || *text == ' ') text++;
        int line = (int)strcspn(text, "\n|");
        if (line > 60) line = 60;
        printf("| %s%s%s%s | %.1f | %.2f | ", u[i].s->name, st->label[0] ? " (" : "", st->label,
               st->label[0] ? ")" : "", u[i].rows_pct, st->kv_bytes / 1048576.0);
        if (st->decode_runs) printf("%.2f | ", st->kv_read_per_step / 1048576.0);
        else printf("- | ");
        printf("%.1f | %.1f | %.2f | %.2f | %s | ", st->prompt_ms, cli_per_sec(st->prompt_n, st->prompt_ms),
               cli_per_tok(st->decode_runs, st->decode_ms), cli_per_sec(st->decode_runs, st->decode_ms),
               u[i].first_agree < 0 ? "-" : u[i].first_agree ? "yes" : "no");
        if (u[i].greedy_agree < 0) printf("- | ");
        else printf("%.1f | ", u[i].greedy_agree);
        printf("%.*s |\n", line, text);
    }
    fflush(stdout);
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

// The A/B table of a repeated run (-r): per strategy (its repetition-0 unit for everything but
// the timings) the median TTFT and TPOT over the repetitions that succeeded, with their spread.
static void print_table_reps(const unit *u, int n, int reps) {
    printf("\n| strategy | runs | rows %% of full | KV MiB | TTFT ms (median) | TTFT spread %% "
           "| prefill tok/s | TPOT ms (median) | TPOT spread %% | decode tok/s | 1st token = full "
           "| greedy agree %% | first line |\n"
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---:|---|\n");
    double *ttft = xmalloc((size_t)reps * sizeof *ttft), *tpot = xmalloc((size_t)reps * sizeof *tpot);
    for (int i = 0; i < n; i++) {
        if (u[i].rep != 0) continue;
        int k = 0, kd = 0;
        for (int j = 0; j < n; j++) {
            const run_stats *st = &u[j].g.st;
            if (u[j].s != u[i].s || u[j].rc) continue;
            ttft[k++] = st->prompt_ms;
            if (st->decode_runs) tpot[kd++] = st->decode_ms / st->decode_runs;
        }
        if (u[i].rc || k == 0) {
            printf("| %s | 0 | error: %s |||||||||||\n", u[i].s->name, u[i].err);
            continue;
        }
        const run_stats *st = &u[i].g.st;
        double sp_ttft, sp_tpot = 0, m_ttft = median_spread(ttft, k, &sp_ttft);
        double m_tpot = kd ? median_spread(tpot, kd, &sp_tpot) : NAN;
        const char *text = u[i].text.buf ? u[i].text.buf : "";
        while (*text == '\n' || *text == ' ') text++;
        int line = (int)strcspn(text, "\n|");
        if (line > 60) line = 60;
        printf("| %s%s%s%s | %d | %.1f | %.2f | %.1f | %.1f | %.1f | ", u[i].s->name,
               st->label[0] ? " (" : "", st->label, st->label[0] ? ")" : "", k, u[i].rows_pct,
               st->kv_bytes / 1048576.0, m_ttft, sp_ttft, cli_per_sec(st->prompt_n, m_ttft));
        if (kd) printf("%.2f | %.1f | %.2f | ", m_tpot, sp_tpot, 1000.0 / m_tpot);
        else printf("- | - | - | ");
        printf("%s | ", u[i].first_agree < 0 ? "-" : u[i].first_agree ? "yes" : "no");
        if (u[i].greedy_agree < 0) printf("- | ");
        else printf("%.1f | ", u[i].greedy_agree);
        printf("%.*s |\n", line, text);
    }
    free(ttft);
    free(tpot);
    fflush(stdout);
}

static cpu_sample cpu_now(void) {
    cpu_sample c = {0, 0, 0, now_ms() / 1e3};
    if (host_cpu_seconds(&c.busy, &c.steal, &c.self) != 0) c.wall = 0;   // unknown: no note
    return c;
}

// Under an A/B table: how busy the rest of the machine was since the last table (or the start):
// other processes' CPU time and the hypervisor's stolen time, in cores. Timings taken beside a
// busy process are not an idle machine's; the note says so, so a reader knows what to distrust.
static void machine_note(runner *R) {
    cpu_sample now = cpu_now(), *was = &R->cpu_mark;
    double wall = now.wall - was->wall;
    if (was->wall > 0 && now.wall > 0 && wall > 0.05) {
        double other = (now.busy - was->busy - (now.self - was->self)) / wall;
        double steal = (now.steal - was->steal) / wall;
        other = other < 0 ? 0 : other;
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        printf("\nmachine: other processes used %.2f of %ld CPUs and %.2f were stolen during these runs%s\n",
               other, ncpu, steal,
               other + steal > 0.25 ? " — busy: these timings are not an idle machine's" : " (idle)");
        fflush(stdout);
    }
    R->cpu_mark = cpu_now();
}

// Untimed: the first strategy on 32 tokens, 2 steps (first-touch allocations, thread start-up,
// caches), before an A/B comparison, so that the first strategy is not the one that pays for them.
static int warm_token(void *ctx, int id) {
    (void)ctx, (void)id;
    return 0;
}

static void warm_up(const run_opts *o, model *m) {
    int ids[32];
    for (int i = 0; i < 32; i++) ids[i] = (100 + 7 * i) % m->cfg.vocab;
    sampler smp;
    sampler_init(&smp, &(sample_params){.temp = 0, .seed = 1}, m->cfg.vocab);
    run_stats st;
    char err[512];
    (void)run_generate(o->strategies[0], m, o->so, ids, 32, 2, &smp, warm_token, NULL, &st, err,
                       sizeof err);
    sampler_free(&smp);
}

// ---- the run ----------------------------------------------------------------------------------

// A request of this run and its sequences (one per strategy).
typedef struct job {
    request *rq;
    unit *u;
    int n_units, n_left;     // units, and those not done
    int written;
} job;

static volatile sig_atomic_t stop_signal, n_signals;

static void on_signal(int sig) {
    if (!stop_signal) stop_signal = sig;
    n_signals++;
    if (sig == SIGTERM) n_signals = 2;   // SIGTERM: drop what is in flight at once
}

// Outputs job J (all its units done).
static void emit_job(runner *R, job *J) {
    const run_opts *o = R->o;
    compare_with_full(J->u, J->n_units, R->m->cfg.n_layer);
    int json = o->json || o->output;
    for (int i = 0; i < J->n_units; i++) {
        unit *u = &J->u[i];
        if (u->rep > 0) {   // a repetition: its timings go into the table only
            R->prompt_tok += u->g.st.prompt_n;
            R->prefill_ms += u->g.st.prompt_ms;
            R->gen_tok += u->rc ? 0 : u->g.st.predicted_n;
            continue;
        }
        if (u->rc) {
            R->n_failed++;
            fprintf(stderr, "sift: error: %s%s%s\n", J->n_units > 1 ? u->s->name : "",
                    J->n_units > 1 ? ": " : "", u->err);
        }
        if (json) {
            char *buf = NULL;
            size_t n = 0;
            FILE *mem = open_memstream(&buf, &n);
            json_unit(mem, R, u);
            fclose(mem);
            write_whole(R->out, buf, n);
            free(buf);
        } else if (!u->stream && !u->rc) {   // text mode, not streamed: the whole block now
            if (J->n_units > 1 || R->n_req > 1)
                printf("==> %s%s%s%s <==\n", J->rq->id, J->n_units > 1 ? " [" : "",
                       J->n_units > 1 ? u->s->name : "", J->n_units > 1 ? "]" : "");
            printf("%s\n", u->text.buf ? u->text.buf : "");
            fflush(stdout);
        }
        if (!u->rc && !o->quiet && o->parallel == 1) print_timing(R, u);
        R->prompt_tok += u->g.st.prompt_n;
        R->prefill_ms += u->g.st.prompt_ms;
        R->gen_tok += u->rc ? 0 : u->g.st.predicted_n;
    }
    if (J->n_units > 1 && !json) {
        if (o->reps > 1) print_table_reps(J->u, J->n_units, o->reps);
        else print_table(J->u, J->n_units);
        machine_note(R);
    }
    R->n_done++;
    J->written = 1;
    for (int i = 0; i < J->n_units; i++) {   // written: only the figures above are kept
        unit_free(&J->u[i]);
        J->u[i].ids = NULL, J->u[i].text = (strbuf){0}, J->u[i].out = NULL;
    }
}

// An error record for a request that cannot run (a bad --prompts line, a duplicate id).
static void emit_error(runner *R, job *J) {
    R->n_failed++;
    R->n_done++;
    J->written = 1;
    fprintf(stderr, "sift: error: %s\n", J->rq->error);
    if (!(R->o->json || R->o->output)) return;
    char *buf = NULL;
    size_t n = 0;
    FILE *mem = open_memstream(&buf, &n);
    json_head(mem, J->rq);
    fprintf(mem, ",\"error\":");
    tok_json_str(mem, J->rq->error, strlen(J->rq->error));
    fprintf(mem, "}\n");
    fclose(mem);
    write_whole(R->out, buf, n);
    free(buf);
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

int run_prompts(const run_opts *o, model *m, const tok *t, const char *dev, const char *model_name,
                double load_ms, int n_ctx) {
    char err[512];
    request_list all = collect(o);
    // this process's shard: a contiguous slice, so shard outputs concatenate in input order
    int lo = 0, hi = all.n;
    if (o->shard_n > 0) {
        lo = (int)((long)all.n * o->shard_k / o->shard_n);
        hi = (int)((long)all.n * (o->shard_k + 1) / o->shard_n);
    }
    done_set done = {0};
    if (o->output && o->resume && read_done(&done, o->output, o->quiet, err, sizeof err)) {
        fprintf(stderr, "sift: error: %s\n", err);
        return 1;
    }
    runner R = {.o = o, .m = m, .t = t, .dev = dev, .model_name = model_name, .load_ms = load_ms,
                .n_ctx = n_ctx, .out = stdout, .t0 = now_ms()};
    if (o->output) {
        R.out = fopen(o->output, o->resume ? "a" : "w");
        if (!R.out) {
            fprintf(stderr, "sift: error: cannot write --output '%s': %s\n", o->output, strerror(errno));
            return 1;
        }
    }
    // the jobs: requests of the shard not done before, each with one unit per strategy
    job *jobs = xcalloc((size_t)(hi - lo + 1), sizeof *jobs);
    int n_jobs = 0, skipped = 0;
    for (int i = lo; i < hi; i++) {
        request *q = &all.r[i];
        job *J = &jobs[n_jobs];
        *J = (job){.rq = q};
        int ns = q->strategy ? 1 : o->n_strategies;
        if (q->error) {
            char *k = unit_key(q->id, NULL);
            int had = done_has(&done, k);
            free(k);
            if (had) skipped++;
            else n_jobs++;
            continue;
        }
        int reps = o->reps > 1 ? o->reps : 1;
        J->u = xcalloc((size_t)ns * reps, sizeof *J->u);
        for (int r = 0; r < reps; r++)   // repetition r starts at strategy r: rotating order
            for (int s = 0; s < ns; s++) {
                const strategy *st = q->strategy ? q->strategy : o->strategies[(s + r) % ns];
                char *k = unit_key(q->id, st->name);
                if (!done_has(&done, k))
                    J->u[J->n_units++] = (unit){.rq = q, .s = st, .job = n_jobs, .rep = r};
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
    R.n_req = n_jobs;
    if (!o->quiet && (skipped || o->shard_n > 0))
        fprintf(stderr, "sift: %d requests%s%s: %d to run, %d done before (--resume)\n", hi - lo,
                o->shard_n > 0 ? " in this shard" : "", "", n_jobs, skipped);

    struct sigaction sa = {0}, old_int, old_term;
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;   // a write to a slow pipe resumes instead of failing
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    int ab = 0;   // an A/B comparison: several strategies (or repetitions) on a prompt
    for (int j = 0; j < n_jobs; j++) ab |= jobs[j].n_units > 1;
    if (ab && !stop_signal) warm_up(o, m);
    R.cpu_mark = cpu_now();
    int slots = o->parallel > 0 ? o->parallel : 1, json = o->json || o->output;
    unit **active = xmalloc((size_t)(slots + MAX_STRATEGIES * 100) * sizeof *active);
    int n_active = 0, next_job = 0, next_write = 0, announced = 0;
    for (;;) {
        if (stop_signal && !announced && !o->quiet) {
            fprintf(stderr, "\nsift: interrupted: %s %d sequences in flight, no new prompts%s\n",
                    n_signals > 1 ? "dropping" : "finishing", n_active,
                    n_signals > 1 ? "" : " (Ctrl-C again to drop them)");
            announced = 1;
        }
        if (n_signals > 1) break;
        // admit: fill the free slots with the next units in input order (prefill each)
        while (!stop_signal && n_active < slots && next_job < n_jobs) {
            job *J = &jobs[next_job];
            if (J->rq->error) {
                next_job++;
                continue;
            }
            int k = 0;
            while (k < J->n_units && J->u[k].state != 0) k++;
            if (k == J->n_units) {
                next_job++;
                continue;
            }
            unit *u = &J->u[k];
            int stream = !json && slots == 1 && u->rep == 0;   // repetitions run silently
            if (stream && (J->n_units > 1 || R.n_req > 1)) {
                if (J->n_units > 1 && R.n_req > 1) printf("==> %s [%s] <==\n", J->rq->id, u->s->name);
                else printf("==> %s <==\n", J->n_units > 1 ? u->s->name : J->rq->id);
                fflush(stdout);
            }
            unit_start(&R, u, stream);
            if (u->state == 1 && !u->g.done) active[n_active++] = u;
            else {   // failed, or done with its first token: written before anything else starts
                unit_finish(u);
                if (stream && !u->rc) printf("\n");
                J->n_left--;
                break;
            }
        }
        // one decode step over every sequence in flight
        if (n_active > 0) {
            double t0 = now_ms();
            gen_seq *gs[FWD_MAX_BATCH];
            for (int i = 0; i < n_active; i++) gs[i] = &active[i]->g;
            gen_step(gs, n_active);
            R.decode_ms += now_ms() - t0;
            R.decode_tok += n_active;
            for (int i = 0; i < n_active;) {
                unit *u = active[i];
                if (!u->g.done) {
                    i++;
                    continue;
                }
                unit_finish(u);
                if (u->stream) printf("\n");
                jobs[u->job].n_left--;
                active[i] = active[--n_active];
            }
        }
        // write what is complete: in input order (the scan stops at the first job not done), or
        // with --unordered anything done (only jobs admitted so far can be)
        int lim = o->unordered && next_job + 1 < n_jobs ? next_job + 1 : n_jobs;
        for (int j = next_write; j < lim; j++) {
            job *J = &jobs[j];
            if (J->written) {
                if (j == next_write) next_write++;
                continue;
            }
            if (J->rq->error) emit_error(&R, J);
            else if (J->n_left == 0) emit_job(&R, J);
            else if (!o->unordered) break;
            if (J->written && j == next_write) next_write++;
        }
        progress(&R, n_active, 0);
        if (n_active == 0 && (next_job >= n_jobs || stop_signal)) break;
    }
    for (int i = 0; i < n_active; i++) unit_finish(active[i]);   // dropped: rerun on --resume
    // in input order, a job held back by an unfinished earlier one is written now if complete
    for (int j = 0; j < n_jobs; j++)
        if (!jobs[j].written && !jobs[j].rq->error && jobs[j].n_left == 0) emit_job(&R, &jobs[j]);
        else if (!jobs[j].written && jobs[j].rq->error && !stop_signal) emit_error(&R, &jobs[j]);
    progress(&R, 0, 1);
    double wall = (now_ms() - R.t0) / 1e3;
    double pp = cli_per_sec((int)R.prompt_tok, R.prefill_ms), tg = cli_per_sec((int)R.decode_tok, R.decode_ms);
    if (!o->quiet && (R.n_req > 1 || slots > 1))
        fprintf(stderr, "sift: %d prompts (%d failed) in %.2f s, parallel %d: prefill %ld tokens at "
                "%.1f tok/s, decode %ld tokens at %.1f tok/s (aggregate)%s\n", R.n_done, R.n_failed,
                wall, slots, R.prompt_tok, pp, R.decode_tok, tg, stop_signal ? "; interrupted" : "");
    if (json && (R.n_req > 1 || slots > 1)) {
        char *buf = NULL;
        size_t n = 0;
        FILE *mem = open_memstream(&buf, &n);
        fprintf(mem, "{\"summary\":{\"prompts\":%d,\"failed\":%d,\"left\":%d,\"interrupted\":%s,"
                "\"wall_s\":%.3f,\"prompt_tokens\":%ld,\"prefill_ms\":%.3f,\"prefill_per_second\":%.3f,"
                "\"decode_tokens\":%ld,\"decode_ms\":%.3f,\"decode_per_second\":%.3f,"
                "\"generated_tokens\":%ld,\"parallel\":%d,\"device\":\"%s\"}}\n",
                R.n_done, R.n_failed, R.n_req - R.n_done, stop_signal ? "true" : "false", wall,
                R.prompt_tok, R.prefill_ms, pp, R.decode_tok, R.decode_ms, tg, R.gen_tok, slots, dev);
        fclose(mem);
        write_whole(R.out, buf, n);
        free(buf);
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    if (R.out != stdout) fclose(R.out);
    for (int j = 0; j < n_jobs; j++) {
        for (int k = 0; k < jobs[j].n_units; k++) unit_free(&jobs[j].u[k]);
        free(jobs[j].u);
    }
    free(jobs), free(active);
    for (int i = 0; i < all.n; i++) req_free(&all.r[i]);
    free(all.r);
    for (int i = 0; i < done.n; i++) free(done.keys[i]);
    free(done.keys);
    if (stop_signal) return 128 + stop_signal;
    return R.n_failed ? 1 : 0;
}
