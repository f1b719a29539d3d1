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
    *q = (request){.index = l->n, .n_predict = -2, .temp = -1, .top_p = -1, .top_k = -1, .min_p = -1,
                   .seed = -1, .n_choices = 1};
    l->n++;
    return q;
}

void req_free(request *q) {
    free(q->id), free(q->text), free(q->system), free(q->error);
    for (int i = 0; i < q->n_turns; i++) free(q->roles[i]), free(q->contents[i]);
    for (int i = 0; i < q->n_stop; i++) free(q->stop[i]);
    free(q->roles), free(q->contents), free(q->stop);
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

// The messages array of a request line into q's turns (a leading system message — OpenAI's
// newer name for it, developer, too — sets q->system); NULL or the error text.
static char *parse_messages(request *q, json_t *msgs) {
    if (!json_is_array(msgs)) return fmt("'messages' must be an array of {role, content}");
    size_t n = json_array_size(msgs);
    if (n == 0) return fmt("'messages' is empty");
    q->roles = xcalloc(n, sizeof *q->roles), q->contents = xcalloc(n, sizeof *q->contents);
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(msgs, i), *role = json_object_get(m, "role"),
               *content = json_object_get(m, "content");
        if (json_is_object(m) && json_is_string(role) && json_is_array(content)) {
            q->code = "unsupported_parameter";
            return fmt("messages[%zu]: content as an array of parts is not supported (give a string)", i);
        }
        if (!json_is_object(m) || !json_is_string(role) || !json_is_string(content))
            return fmt("messages[%zu] must be {\"role\": string, \"content\": string}", i);
        const char *r = json_string_value(role);
        int sys = !strcmp(r, "system") || !strcmp(r, "developer");
        if (!sys && strcmp(r, "user") && strcmp(r, "assistant"))
            return fmt("messages[%zu]: role '%s' (expected system, developer, user or assistant)", i, r);
        if (sys) {
            if (i > 0 || q->system) return fmt("messages[%zu]: a system message must come first, once", i);
            q->system = strdup(json_string_value(content));
            continue;
        }
        if (!json_string_value(content)[0]) return fmt("messages[%zu]: the content is empty", i);
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

// 'stop': a string or a list of 1 to JOBS_MAX_STOP strings, none empty.
static char *stop_field(request *q, json_t *v) {
    if (q->n_stop) return fmt("'stop' given twice");
    size_t n = json_is_string(v) ? 1 : json_is_array(v) ? json_array_size(v) : 0;
    if (n < 1 || n > JOBS_MAX_STOP) return fmt("'stop' must be a string or a list of 1 to %d strings", JOBS_MAX_STOP);
    q->stop = xcalloc(n, sizeof *q->stop);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_is_string(v) ? v : json_array_get(v, i);
        if (!json_is_string(x) || json_string_length(x) == 0 || strlen(json_string_value(x)) != json_string_length(x))
            return fmt("'stop' must hold non-empty strings (without NUL)");
        q->stop[q->n_stop++] = strdup(json_string_value(x));
    }
    return NULL;
}

// The fields both request shapes share (sift's top level, a Batch API body): stop and OpenAI's
// penalties. 1 when key is one of them (*e: NULL or the error), 0 otherwise.
static int common_field(request *q, const char *key, json_t *v, char **e) {
    if (!strcmp(key, "stop")) *e = stop_field(q, v);
    else if (!strcmp(key, "frequency_penalty")) *e = num_field(v, key, -2, 2, &q->freq_pen);
    else if (!strcmp(key, "presence_penalty")) *e = num_field(v, key, -2, 2, &q->pres_pen);
    else return 0;
    return 1;
}

// Batch API body fields sift does not implement, each accepted only at the value that changes
// nothing (JSON null, the API's default, is accepted for every field). NULL: none of them.
static const char *unsupported_body_field(const char *key, json_t *v) {
    static const char *const never[] = {"top_logprobs", "tool_choice", "function_call", "suffix",
                                        "stream_options", "audio", "prediction", "reasoning_effort",
                                        "web_search_options", "verbosity", "modalities"};
    static const char *const off_when_false[] = {"logprobs", "stream", "echo"};
    for (size_t i = 0; i < sizeof never / sizeof *never; i++)
        if (!strcmp(key, never[i])) return "";
    for (size_t i = 0; i < sizeof off_when_false / sizeof *off_when_false; i++)
        if (!strcmp(key, off_when_false[i])) return json_is_false(v) ? NULL : " (only false)";
    if (!strcmp(key, "best_of")) return json_is_integer(v) && json_integer_value(v) == 1 ? NULL : " (only 1)";
    if (!strcmp(key, "logit_bias")) return json_is_object(v) && json_object_size(v) == 0 ? NULL : " (only {})";
    if (!strcmp(key, "tools") || !strcmp(key, "functions"))
        return json_is_array(v) && json_array_size(v) == 0 ? NULL : " (only [])";
    if (!strcmp(key, "parallel_tool_calls")) return json_is_boolean(v) ? NULL : "";   // moot without tools
    if (!strcmp(key, "response_format")) {
        json_t *t = json_object_get(v, "type");
        return json_is_object(v) && json_object_size(v) == 1 && json_is_string(t) &&
                       !strcmp(json_string_value(t), "text") ? NULL : " (only {\"type\": \"text\"})";
    }
    return "-";   // not one of them
}

// Body fields that name things sift does not choose and leave the text as it is: accepted, unread.
static int ignored_body_field(const char *key) {
    static const char *const ok[] = {"model", "user", "metadata", "store", "service_tier",
                                     "prompt_cache_key", "safety_identifier"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        if (!strcmp(key, ok[i])) return 1;
    return 0;
}

// A Batch API request's envelope and body: url (/v1/chat/completions or /v1/completions; absent:
// the one the body's prompt field implies), method (POST), the body's fields (every one either
// honoured, accepted because it changes nothing, or refused with its code). NULL or the error.
static char *parse_batch(request *q, json_t *url, json_t *method, json_t *body, json_t **msgs) {
    if (method && !(json_is_string(method) && !strcmp(json_string_value(method), "POST"))) {
        q->code = "unsupported_method";
        return json_is_string(method) ? fmt("method '%s' is not supported (only POST)", json_string_value(method))
                                      : fmt("'method' must be the string \"POST\"");
    }
    if (!body) return fmt("a Batch API request needs a 'body' object");
    if (!json_is_object(body)) return fmt("'body' must be an object");
    if (url) {
        const char *u = json_string_value(url);
        if (!u) return fmt("'url' must be a string");
        if (!strcmp(u, "/v1/completions")) q->completions = 1;
        else if (strcmp(u, "/v1/chat/completions")) {
            q->code = "unsupported_url";
            return fmt("url '%s' is not supported (only /v1/chat/completions and /v1/completions)", u);
        }
    } else q->completions = json_object_get(body, "prompt") && !json_object_get(body, "messages");
    const char *where = q->completions ? "/v1/completions" : "/v1/chat/completions";
    const char *key;
    json_t *v;
    long long ll = 0;
    char *e = NULL;
    json_object_foreach(body, key, v) {
        if (e) break;
        if (json_is_null(v)) continue;   // null: the API's default
        if (common_field(q, key, v, &e)) continue;
        const char *refused = unsupported_body_field(key, v);
        int chat_only = !strcmp(key, "messages") || !strcmp(key, "max_completion_tokens");
        if (refused && strcmp(refused, "-")) {
            q->code = "unsupported_parameter";
            e = fmt("body field '%s' is not supported by sift%s", key, refused);
        } else if (!refused || ignored_body_field(key)) continue;
        else if ((chat_only && q->completions) || (!strcmp(key, "prompt") && !q->completions)) {
            q->code = "unsupported_parameter";
            e = fmt("body field '%s' is not a %s field", key, where);
        } else if (!strcmp(key, "messages")) {
            if (*msgs) e = fmt("'messages' given twice (top level and body)");
            *msgs = v;
        } else if (!strcmp(key, "prompt")) {
            if (!json_is_string(v)) {
                q->code = "unsupported_parameter";
                e = fmt("a /v1/completions prompt that is not a string (a list, token ids) is not supported");
            } else if (q->text) e = fmt("'prompt' given twice (top level and body)");
            else q->text = strdup(json_string_value(v));
        } else if (!strcmp(key, "max_tokens") || !strcmp(key, "max_completion_tokens")) {
            e = int_field(v, key, 1, 1 << 22, &ll);
            q->n_predict = (int)ll;
        } else if (!strcmp(key, "temperature")) e = num_field(v, key, 0, 2, &q->temp);   // OpenAI's range
        else if (!strcmp(key, "top_p")) e = num_field(v, key, 0, 1, &q->top_p);
        else if (!strcmp(key, "seed")) {
            e = int_field(v, key, 0, UINT32_MAX, &ll);
            q->seed = ll;
        } else if (!strcmp(key, "n")) {
            e = int_field(v, key, 1, JOBS_MAX_CHOICES, &ll);
            q->n_choices = (int)ll;
        } else {
            q->code = "unsupported_parameter";
            e = fmt("body field '%s' is not known to sift (it could change the answer)", key);
        }
    }
    if (!e && q->completions && !q->text) e = fmt("no prompt: a /v1/completions body needs 'prompt'");
    return e;
}

// The ids sift invents: "line-N" (N a line number). Refused in input, so that an invented id never
// equals a real one.
static int reserved_id(const char *id) {
    if (strncmp(id, "line-", 5) || !id[5]) return 0;
    return strspn(id + 5, "0123456789") == strlen(id + 5);
}

// One request line: sift's fields, or the OpenAI Batch API request shape. NULL or the error (the
// Batch API code in q->code when not invalid_request).
static char *parse_line(request *q, json_t *o, int chat_flag) {
    if (!json_is_object(o)) return fmt("a request must be a JSON object");
    const char *key;
    json_t *v, *body = NULL, *msgs = NULL, *url = NULL, *method = NULL;
    long long ll = 0;
    char *e = NULL;
    json_object_foreach(o, key, v) {
        if (e) break;
        if (!strcmp(key, "id") || !strcmp(key, "custom_id")) {
            q->openai |= strcmp(key, "custom_id") == 0;
            if (q->id) e = fmt("give 'id' or 'custom_id', not both");
            else if (json_is_string(v)) q->id = strdup(json_string_value(v));
            else if (json_is_integer(v)) q->id = fmt("%lld", (long long)json_integer_value(v));
            else e = fmt("'%s' must be a string or an integer", key);
            if (q->id && reserved_id(q->id)) {
                e = fmt("%s '%s' is reserved: sift names a line that has none (or cannot be read, or "
                        "repeats an earlier id) line-N", key, q->id);
                free(q->id), q->id = NULL;
            }
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
        else if (!strcmp(key, "method")) method = v, q->openai = 1;   // OpenAI's envelope
        else if (!strcmp(key, "url")) url = v, q->openai = 1;
        else if (common_field(q, key, v, &e)) continue;
        else e = fmt("unknown field '%s'", key);
    }
    if (!e && (body || url || method)) e = parse_batch(q, url, method, body, &msgs);
    if (e) return e;
    // an empty prompt is the line's error (not the run's): --resume then keeps its record while
    // the line stays the same (jobs/resume.c)
    if (q->text && !q->text[0]) return fmt("'prompt' is empty");
    if (q->completions) return q->chat = 0, NULL;   // a raw prompt: no chat template
    if (!q->text == !msgs) return fmt(q->text ? "give 'prompt' or 'messages', not both"
                                              : "no prompt: give 'prompt' or 'messages'");
    if (msgs && (e = parse_messages(q, msgs))) return e;
    if (q->text && !q->chat) q->chat = chat_flag;
    return NULL;
}

// A request line longer than this is a bad line (its error record), not parsed into a JSON tree
// several times its size.
#define MAX_LINE (64L << 20)

void requests_read(request_list *l, FILE *fp, const char *path, int chat) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    for (int ln = 1; (got = getline(&line, &cap, fp)) >= 0; ln++) {
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        size_t sp = strspn(line, " \t");
        if (sp == (size_t)got) continue;   // blank lines are not requests
        request *q = req_new(l);
        q->line = ln, q->src = path;
        json_error_t je;
        json_t *o = got > MAX_LINE ? NULL : json_loadb(line, (size_t)got, JSON_REJECT_DUPLICATES, &je);
        char *e = o ? parse_line(q, o, chat)
                    : got > MAX_LINE ? fmt("the line is longer than %ld bytes", MAX_LINE)
                                     : fmt("invalid JSON at column %d: %s", je.column, je.text);
        // the line's vote on the output's shape (--output-format auto), whatever its error: a
        // Batch API request has one of the envelope's fields
        q->parsed = o != NULL;
        q->openai = json_is_object(o) && (json_object_get(o, "custom_id") || json_object_get(o, "body") ||
                                          json_object_get(o, "method") || json_object_get(o, "url"));
        json_decref(o);
        if (!q->id) q->id = fmt("line-%d", ln);
        if (e) {
            q->error = fmt("%s line %d: %s", path, ln, e);
            if (!q->code) q->code = "invalid_request";
            free(e);
        } else q->code = NULL;   // a code set on the way to no error (none is) means nothing
    }
    free(line);
}

// Appends the requests of a JSON Lines file; 0 or -1 + err when the file cannot be read.
static int read_prompts(request_list *l, const char *path, int chat, char *err, size_t errlen) {
    FILE *fp = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!fp) return err_printf(err, errlen, "cannot read --prompts file '%s': %s", path, strerror(errno));
    requests_read(l, fp, path, chat);
    int bad = ferror(fp), e = errno;
    if (fp != stdin) fclose(fp);
    if (bad) return err_printf(err, errlen, "cannot read --prompts file '%s': %s", path, strerror(e));
    return 0;
}

static int by_id(const void *a, const void *b) {
    const request *x = *(const request *const *)a, *y = *(const request *const *)b;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->index > y->index) - (x->index < y->index);
}

// duplicates: the requests sorted by id, then input order; a run of equal ids keeps its first. A later --prompts line with the same id is that line's error record under
// the id "line-N" (no custom_id appears twice in the output, so a reader keyed on it keeps the
// first line's answer; the Batch API refuses such a file whole).
void requests_mark_duplicates(request_list *l, const char *path) {
    request **by = xmalloc((size_t)(l->n ? l->n : 1) * sizeof *by);
    int nb = 0;
    for (int i = 0; i < l->n; i++) by[nb++] = &l->r[i];
    qsort(by, (size_t)nb, sizeof *by, by_id);
    for (int i = 1, first = 0; i < nb; i++) {
        if (strcmp(by[i]->id, by[first]->id) != 0) {
            first = i;
            continue;
        }
        request *q = by[i];
        if (!q->line) {   // a -f file named twice
            if (!q->error) q->code = "invalid_request", q->error = fmt("duplicate prompt '%s'", q->id);
            continue;
        }
        const char *what = q->openai ? "custom_id" : "id";
        if (q->error) {   // already the line's error: it keeps it, under its line's name
            char *e = fmt("%s (and its %s '%s' repeats line %d's)", q->error, what, q->id, by[first]->line);
            free(q->error);
            q->error = e;
        } else {
            q->code = "invalid_request";
            q->error = fmt("%s line %d: duplicate %s '%s' (first at line %d)%s; this line is not run",
                           path, q->line, what, q->id, by[first]->line,
                           q->openai ? ": the Batch API refuses a file that repeats a custom_id" : "");
        }
        free(q->id);
        q->id = fmt("line-%d", q->line);
    }
    free(by);
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
        q->id = strdup(o->prompts_path), q->error = strdup(err), q->code = "invalid_request";
    }
    requests_mark_duplicates(&l, o->prompts_path);
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

// ---- a request's settled values and its digest -------------------------------------------------

// FNV-1a, 64 bits, over fields each framed by a tag and a length (no two requests hash the same
// bytes): the digests' hash. Not a cryptographic one: it tells an edited request from its
// record, not an adversary's.
typedef struct { unsigned long long h; } digest_h;

static void dg_bytes(digest_h *d, char tag, const void *p, size_t n) {
    unsigned char head[9] = {(unsigned char)tag};
    for (int i = 0; i < 8; i++) head[1 + i] = (unsigned char)(n >> (8 * i));
    for (int i = 0; i < 9; i++) d->h = (d->h ^ head[i]) * 1099511628211ULL;
    for (size_t i = 0; i < n; i++) d->h = (d->h ^ ((const unsigned char *)p)[i]) * 1099511628211ULL;
}

static void dg_str(digest_h *d, char tag, const char *s) { dg_bytes(d, tag, s ? s : "", s ? strlen(s) : 0); }

static void dg_num(digest_h *d, char tag, double x) {
    char b[40];
    dg_str(d, tag, (snprintf(b, sizeof b, "%.9g", x), b));
}

static void dg_out(const digest_h *d, char out[17]) { snprintf(out, 17, "%016llx", d->h); }

// A -f file's bytes into d (one it cannot read: its error, so a file that becomes readable counts
// as changed; the run reports the error itself).
static void dg_file(digest_h *d, const char *path) {
    FILE *fp = strcmp(path, "-") ? fopen(path, "rb") : NULL;
    if (!fp) {
        dg_str(d, 'F', strcmp(path, "-") ? strerror(errno) : "stdin");
        return;
    }
    char buf[1 << 16];
    size_t n;
    digest_h c = {1469598103934665603ULL};
    while ((n = fread(buf, 1, sizeof buf, fp)) > 0) dg_bytes(&c, 'b', buf, n);
    fclose(fp);
    dg_bytes(d, 'F', &c.h, sizeof c.h);
}

void request_settle(request *q, const run_opts *o) {
    // OpenAI's defaults for a Batch API request (max_tokens: up to the context; temperature 1,
    // top_p 1, no top-k or min-p), unless the command line gave the value; sift's own otherwise
    int oa = q->openai;
    if (q->n_predict == -2) q->n_predict = oa && !(o->given & RUN_GIVEN_N_PREDICT) ? -1 : o->n_predict;
    if (q->temp < 0) q->temp = oa && !(o->given & RUN_GIVEN_TEMP) ? 1.0f : o->sp.temp;
    if (q->top_p < 0) q->top_p = oa && !(o->given & RUN_GIVEN_TOP_P) ? 1.0f : o->sp.top_p;
    if (q->top_k < 0) q->top_k = oa && !(o->given & RUN_GIVEN_TOP_K) ? 0 : o->sp.top_k;
    if (q->min_p < 0) q->min_p = oa && !(o->given & RUN_GIVEN_MIN_P) ? 0.0f : o->sp.min_p;
    if (q->seed < 0 && o->seed >= 0) q->seed = o->seed;
    if (!q->n_stop && o->n_stop > 0) {   // --stop: for the requests that name none
        q->stop = xcalloc((size_t)o->n_stop, sizeof *q->stop);
        for (int i = 0; i < o->n_stop; i++) q->stop[q->n_stop++] = strdup(o->stop[i]);
    }
    digest_h d = {1469598103934665603ULL};
    if (q->file && !q->text) dg_file(&d, q->file);
    dg_str(&d, 'p', q->text);
    dg_str(&d, 's', q->chat ? (q->system ? q->system : o->system) : NULL);
    for (int i = 0; i < q->n_turns; i++) dg_str(&d, 'r', q->roles[i]), dg_str(&d, 'c', q->contents[i]);
    dg_num(&d, 'C', q->chat), dg_num(&d, 'X', q->completions), dg_num(&d, 'n', q->n_predict);
    dg_num(&d, 't', q->temp), dg_num(&d, 'P', q->top_p), dg_num(&d, 'k', q->top_k), dg_num(&d, 'm', q->min_p);
    if (q->seed >= 0) dg_num(&d, 'S', (double)q->seed);
    else dg_str(&d, 'S', "random");
    for (int i = 0; i < q->n_stop; i++) dg_str(&d, 'z', q->stop[i]);
    dg_num(&d, 'N', q->n_choices), dg_num(&d, 'f', q->freq_pen), dg_num(&d, 'e', q->pres_pen);
    dg_str(&d, 'y', q->strategy ? q->strategy->name : NULL);
    dg_out(&d, q->digest);
}

void options_digest(const run_opts *o, const strategy *s, char out[17]) {
    char *buf = NULL;
    size_t n = 0;
    FILE *mem = open_memstream(&buf, &n);
    CHECK_INTERNAL(mem, "out of memory");
    if (o->so) strategy_settings_json(mem, o->so, s->name);
    fclose(mem);
    digest_h d = {1469598103934665603ULL};
    dg_str(&d, 'y', s->name);
    dg_bytes(&d, 'o', buf, n);
    free(buf);
    dg_out(&d, out);
}
