// jobs/request.c — the requests of a run: -p, -f files, --batch DIR, and --prompts JSON Lines in
// sift's fields or the OpenAI Batch API request shape (a bad line becomes that line's error
// record; duplicate ids too). What an earlier run's --output holds (--resume): jobs/resume.c.
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

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

void req_free(request *q) {
    free(q->id), free(q->text), free(q->system), free(q->error);
    for (int i = 0; i < q->n_turns; i++) free(q->roles[i]), free(q->contents[i]);
    free(q->roles), free(q->contents);
}

char *fmt(const char *f, ...) {
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
            q->openai |= strcmp(key, "custom_id") == 0;
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
        } else if (!strcmp(key, "body")) body = v, q->openai = 1;
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
        // the line's vote on the output's shape (--output-format auto), whatever its error: a
        // Batch API request has one of the envelope's fields
        q->parsed = o != NULL;
        q->openai = json_is_object(o) && (json_object_get(o, "custom_id") || json_object_get(o, "body") ||
                                          json_object_get(o, "method") || json_object_get(o, "url"));
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
request_list jobs_collect(const run_opts *o) {
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

void jobs_add_file(run_opts *o, const char *path) {
    o->files = xrealloc(o->files, (size_t)(o->n_files + 1) * sizeof *o->files);
    o->files[o->n_files++] = strdup(path);
}

static int by_path(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int jobs_add_batch_dir(run_opts *o, const char *dir, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    if (!d) return err_printf(err, errlen, "cannot open --batch directory '%s': %s", dir, strerror(errno));
    int first = o->n_files;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".txt") != 0) continue;
        char *path = fmt("%s/%s", dir, e->d_name);
        jobs_add_file(o, path);
        free(path);
    }
    closedir(d);
    if (o->n_files == first) return err_printf(err, errlen, "no .txt files in --batch directory '%s'", dir);
    qsort(o->files + first, (size_t)(o->n_files - first), sizeof *o->files, by_path);
    return 0;
}
