// jobs/resume.c — what an earlier run already wrote (--resume), and the lock that keeps a second
// writer off an output. The records of --output (and --errors) are read as a stream with a bound
// per line; each record is matched to a request of this run; a line that is no record (not JSON,
// not a record of either shape, cut short, longer than any record sift writes), a record of the
// other shape, a second record of one request and an error record that is no longer its
// request's outcome are reported by line and byte offset and dropped (their requests run again),
// and every other record is kept. A file that must change is rewritten whole: its kept records
// in input order into a unique temporary file beside it, fsync'ed, renamed over it, and the
// directory fsync'ed, so that a crash at any point leaves either the old file or the new one.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../util/outfile.h"
#include "internal.h"

// ---- keys and the done set ------------------------------------------------------------------

static char *joined(const char *a, const char *sep, const char *b) {
    size_t na = strlen(a), ns = strlen(sep), nb = strlen(b);
    char *s = xmalloc(na + ns + nb + 1);
    memcpy(s, a, na), memcpy(s + na, sep, ns), memcpy(s + na + ns, b, nb + 1);
    return s;
}

char *unit_key(const char *id, const char *strategy) { return joined(id, "\t", strategy ? strategy : ""); }

char *error_key(const request *q) {
    char n[32];
    snprintf(n, sizeof n, "%d", q->index);
    return joined("", "\x01", n);   // no id holds a control byte before its tab: never a unit key
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int done_has(const done_set *d, const char *key) {
    return d->n && bsearch(&key, d->keys, (size_t)d->n, sizeof *d->keys, cmp_str) != NULL;
}

void done_free(done_set *d) {
    for (int i = 0; i < d->n; i++) free(d->keys[i]);
    free(d->keys);
    *d = (done_set){0};
}

static void done_add(done_set *d, char *key, int *cap) {
    if (d->n == *cap) d->keys = xrealloc(d->keys, (size_t)(*cap = *cap ? 2 * *cap : 256) * sizeof *d->keys);
    d->keys[d->n++] = key;
}

// ---- reading: lines with a bound, records of either shape -------------------------------------

typedef struct {
    FILE *fp;
    char blk[1 << 16];
    size_t pos, end;
} line_reader;

// The next line of L: its length in the file (newline included; 0 at the end, -1 on a read
// error); at most max bytes of it are kept in *buf (*kept), the rest is skipped unread into
// memory; *nl says whether it ends in a newline.
static long long next_line(line_reader *L, char **buf, size_t *cap, size_t max, size_t *kept, int *nl) {
    long long total = 0;
    *kept = 0, *nl = 0;
    for (;;) {
        if (L->pos == L->end) {
            L->pos = 0, L->end = fread(L->blk, 1, sizeof L->blk, L->fp);
            if (L->end == 0) return ferror(L->fp) ? -1 : total;
        }
        char *p = L->blk + L->pos, *e = memchr(p, '\n', L->end - L->pos);
        size_t n = e ? (size_t)(e - p) + 1 : L->end - L->pos;
        if (*kept < max) {
            size_t take = n < max - *kept ? n : max - *kept;
            if (*kept + take + 1 > *cap) {
                *cap = *kept + take + 1 > 2 * *cap ? *kept + take + 1 : 2 * *cap;
                if (*cap > max + 1) *cap = max + 1;
                *buf = xrealloc(*buf, *cap);
            }
            memcpy(*buf + *kept, p, take);
            *kept += take;
        }
        L->pos += n, total += (long long)n;
        if (e) return *nl = 1, total;
    }
}

#define MAX_REPORTS 20

// Reports (at most MAX_REPORTS a file) and counts a line dropped from file `name`; then: what
// becomes of its request ("its request runs again", or "the first record is kept").
static void dropped(out_scan *s, const char *name, int line, long long off, const char *what, const char *then) {
    s->n_dropped++;
    if (s->quiet) return;
    if (s->n_reported++ < MAX_REPORTS)
        fprintf(stderr, "sift: --resume: %s line %d (byte offset %lld): %s; dropped, %s\n", name, line,
                off, what, then);
    else if (s->n_reported == MAX_REPORTS + 1)
        fprintf(stderr, "sift: --resume: %s: more dropped lines (not shown)\n", name);
}

static void damage(out_scan *s, const char *name, int line, long long off, const char *what) {
    dropped(s, name, line, off, what, "its request runs again");
}

// The digests (and, in the Batch API's shape, the strategy) of object o into r: each absent, or a
// string (a record of an older sift has none). 0, or -1.
static int record_digests(json_t *o, out_record *r) {
    json_t *d = json_object_get(o, "request_digest"), *op = json_object_get(o, "options_digest");
    if ((d && !json_is_string(d)) || (op && !json_is_string(op))) return -1;
    if (d) r->digest = strdup(json_string_value(d));
    if (op) r->options = strdup(json_string_value(op));
    if (r->shape == SHAPE_OPENAI) {
        json_t *s = json_object_get(o, "strategy");
        if (s && !json_is_string(s)) return -1;
        if (s) r->strategy = strdup(json_string_value(s));
    }
    return 0;
}

// A record's fields, or -1: sift's shape (id and index; strategy and error when it has them) or
// the Batch API's (custom_id, response and error; one of them null).
static int parse_record(json_t *o, out_record *r) {
    json_t *cid = json_object_get(o, "custom_id"), *id = json_object_get(o, "id");
    if (!json_is_object(o)) return -1;
    if (cid) {
        json_t *resp = json_object_get(o, "response"), *err = json_object_get(o, "error");
        if (!json_is_string(cid) || !resp || !err || json_object_get(o, "index")) return -1;
        if (json_is_null(resp) == json_is_null(err) || !(json_is_null(resp) || json_is_object(resp)))
            return -1;
        r->shape = SHAPE_OPENAI;
        r->id = strdup(json_string_value(cid));
        json_t *own = json_object_get(o, "sift");   // sift's key: strategy and digests
        if (own && !json_is_object(own)) return -1;
        if (own && record_digests(own, r)) return -1;
        if (json_is_object(err)) {
            json_t *code = json_object_get(err, "code"), *msg = json_object_get(err, "message");
            if (!json_is_string(code) || !json_is_string(msg)) return -1;
            r->error = strdup(json_string_value(msg));
            // a run's failure (jobs/run.c's unit_failed) is an outcome; any other code may be a
            // request line's error, which is its outcome only while the line is the same (an
            // unknown code is at worst run again, never kept wrongly); batch_cancelled: a
            // request a signal stopped, run again
            const char *c = json_string_value(code);
            r->interrupted = strcmp(c, "batch_cancelled") == 0;
            r->line_error = !r->interrupted && strcmp(c, "context_length_exceeded") != 0 &&
                            strcmp(c, "server_error") != 0;
        }
        return 0;
    }
    json_t *index = json_object_get(o, "index"), *s = json_object_get(o, "strategy"),
           *err = json_object_get(o, "error"), *text = json_object_get(o, "text");
    if (!json_is_string(id) || !json_is_integer(index) || (s && !json_is_string(s))) return -1;
    if (!err == !text || (err && !json_is_string(err)) || (text && !json_is_string(text))) return -1;
    if (text && !s) return -1;   // an answer names the strategy that gave it
    r->shape = SHAPE_SIFT;
    r->id = strdup(json_string_value(id));
    r->strategy = s ? strdup(json_string_value(s)) : NULL;
    if (err) r->error = strdup(json_string_value(err)), r->line_error = !s;
    json_t *stop = json_object_get(o, "stop");
    r->interrupted = json_is_string(stop) && !strcmp(json_string_value(stop), "interrupted");
    return record_digests(o, r);
}

int resume_scan(FILE *fp, const char *name, int file, size_t max_line, out_scan *s) {
    line_reader *L = xmalloc(sizeof *L);
    L->fp = fp, L->pos = L->end = 0;
    char *buf = NULL, what[200];
    size_t cap = 0, kept;
    int nl, rc = 0;
    long long len, off = 0;
    for (int ln = 1; (len = next_line(L, &buf, &cap, max_line, &kept, &nl)) != 0; ln++, off += len) {
        if (len < 0) {
            rc = -1;
            break;
        }
        if (!nl) {   // the last line, without its newline: a write cut short
            s->torn = 1;
            snprintf(what, sizeof what, "an incomplete last record (%lld bytes, no newline)", len);
            damage(s, name, ln, off, what);
            break;
        }
        s->good_end = off + len;
        if (kept < (size_t)len) {
            snprintf(what, sizeof what, "%lld bytes: longer than any record sift writes", len);
            damage(s, name, ln, off, what);
            continue;
        }
        if (len == 1) {   // readers of JSON Lines expect a record on every line
            damage(s, name, ln, off, "an empty line");
            continue;
        }
        json_error_t je;
        json_t *o = json_loadb(buf, kept, JSON_REJECT_DUPLICATES, &je);
        out_record r = {.line = ln, .off = off, .len = len, .file = file};
        if (!o) {
            snprintf(what, sizeof what, "not JSON (column %d: %.120s)", je.column, je.text);
            damage(s, name, ln, off, what);
            continue;
        }
        int bad = parse_record(o, &r);
        json_decref(o);
        if (bad) {
            free(r.id), free(r.strategy), free(r.error), free(r.digest), free(r.options);
            damage(s, name, ln, off, "not a record of sift's shape or the Batch API's");
            continue;
        }
        if (s->n == s->cap) s->r = xrealloc(s->r, (size_t)(s->cap = s->cap ? 2 * s->cap : 256) * sizeof *s->r);
        s->r[s->n++] = r;
    }
    s->size = off + (len > 0 ? len : 0);
    free(buf);
    free(L);
    return rc;
}

int resume_read(const char *path, int file, size_t max_line, out_scan *s, char *err, size_t errlen) {
    FILE *fp = fopen(path, "r");
    if (!fp) return errno == ENOENT ? 0 : err_printf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
    s->exists = 1;
    int rc = resume_scan(fp, path, file, max_line, s);
    int e = errno;
    fclose(fp);
    return rc ? err_printf(err, errlen, "cannot read '%s': %s", path, strerror(e)) : 0;
}

void scan_free(out_scan *s) {
    for (int i = 0; i < s->n; i++)
        free(s->r[i].id), free(s->r[i].strategy), free(s->r[i].error), free(s->r[i].digest), free(s->r[i].options);
    free(s->r);
    *s = (out_scan){0};
}

// ---- matching records to this run's requests --------------------------------------------------

typedef struct {
    char *key;          // the record key: "id\tstrategy" (sift), "id\t" (Batch API; a bad line)
    const request *q;
    int line_error;     // q could not run: its record is its error
    int in_shard;
    long long order;    // the record's place in input order
    int taken;
    const strategy *s;  // the strategy of the outcome (NULL: q's error)
} run_entry;

static int cmp_entry(const void *a, const void *b) {
    const run_entry *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : x->line_error - y->line_error;
}

// The first entry of e[0..n) whose key starts with prefix (sorted by key), or n.
static int lower(const run_entry *e, int n, const char *prefix) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (strcmp(e[mid].key, prefix) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// The outcomes this run writes: one per (request, strategy) in sift's shape, one per request in
// the Batch API's, one per request that cannot run.
static run_entry *entries(const request *all, int n_all, int lo, int hi, const run_opts *o, int shape, int *n) {
    int cap = n_all * (shape == SHAPE_OPENAI ? 1 : (o->n_strategies > 1 ? o->n_strategies : 1)) + 1;
    run_entry *e = xcalloc((size_t)cap, sizeof *e);
    *n = 0;
    for (int i = 0; i < n_all; i++) {
        const request *q = &all[i];
        int in = i >= lo && i < hi;
        long long base = (long long)q->index * (MAX_STRATEGIES + 1);
        if (q->error || shape == SHAPE_OPENAI) {
            const strategy *s = q->error ? NULL : q->strategy ? q->strategy : o->strategies[0];
            e[(*n)++] = (run_entry){unit_key(q->id, NULL), q, q->error != NULL, in, base, 0, s};
            continue;
        }
        int ns = q->strategy ? 1 : o->n_strategies;
        for (int k = 0; k < ns; k++) {
            const strategy *s = q->strategy ? q->strategy : o->strategies[k];
            e[(*n)++] = (run_entry){unit_key(q->id, s->name), q, 0, in, base + k, 0, s};
        }
    }
    qsort(e, (size_t)*n, sizeof *e, cmp_entry);
    return e;
}

static int by_order(const void *a, const void *b) {
    const out_record *x = *(const out_record *const *)a, *y = *(const out_record *const *)b;
    if (x->order != y->order) return x->order < y->order ? -1 : 1;
    return (x->off > y->off) - (x->off < y->off);
}

static const char *shape_name(int shape) { return shape == SHAPE_OPENAI ? "the Batch API's" : "sift's"; }

// Record r answers outcome m, but by another strategy (the Batch API's shape: sift's key names
// it) or with other settings than this run's: a file of another run, refused (-1 + err) in both
// shapes; else 0.
static int other_run(const out_record *r, const run_entry *m, const char *name, const char *from,
                     const run_opts *o, char *err, size_t errlen) {
    if (r->strategy && strcmp(r->strategy, m->s->name) != 0)
        return err_printf(err, errlen, "'%s' line %d holds a record of '%s' by strategy '%s', but "
                          "this run of %s runs '%s' for it: resume with the same --strategy, or write "
                          "to a new file", name, r->line, r->id, r->strategy, from, m->s->name);
    char mine[17];
    if (!r->options || (options_digest(o, m->s, mine), strcmp(mine, r->options) == 0)) return 0;
    return err_printf(err, errlen, "'%s' line %d holds a record of '%s' by '%s' with other settings "
                      "(options digest %s; this run's %s): resume with the same strategy "
                      "parameters, or write to a new file", name, r->line, r->id, m->s->name,
                      r->options, mine);
}

int resume_plan(out_scan *sc, int n_sc, const char *const *names, int shape, const request *all, int n_all,
                int lo, int hi, const run_opts *o, int final, done_set *done, int *action, char *err,
                size_t errlen) {
    const char *src = o->prompts_path ? o->prompts_path : NULL;
    char from[600];
    if (src) snprintf(from, sizeof from, "--prompts '%.500s'", src);
    else snprintf(from, sizeof from, "this run's prompts");
    // the shape: a file holding records of the other shape only was written by another kind of run
    int n_shape[3] = {0};
    for (int f = 0; f < n_sc; f++)
        for (int i = 0; i < sc[f].n; i++) n_shape[sc[f].r[i].shape]++;
    int other = shape == SHAPE_OPENAI ? SHAPE_SIFT : SHAPE_OPENAI;
    if (n_shape[shape] == 0 && n_shape[other] > 0) {
        int f = sc[0].n ? 0 : 1;
        return err_printf(err, errlen, "'%s' holds records in %s shape, but this run of %s writes %s "
                          "(--output-format): resume it with the run that wrote it, or write to a "
                          "new file", names[f], shape_name(other), from, shape_name(shape));
    }
    int n = 0, cap_done = 0, rc = 0;
    run_entry *e = entries(all, n_all, lo, hi, o, shape, &n);
    char what[700];
    for (int f = 0; f < n_sc && !rc; f++) {
        out_scan *s = &sc[f];
        for (int i = 0; i < s->n && !rc; i++) {
            out_record *r = &s->r[i];
            if (r->shape != shape) {
                snprintf(what, sizeof what, "a record in %s shape among %s", shape_name(r->shape),
                         shape_name(shape));
                damage(s, names[f], r->line, r->off, what);
                continue;
            }
            char *key = unit_key(r->id, shape == SHAPE_SIFT ? r->strategy : NULL), *id = unit_key(r->id, NULL);
            int k0 = lower(e, n, key), any = 0, any_in = 0, any_valid = 0;
            for (int k = lower(e, n, id); k < n && strncmp(e[k].key, id, strlen(id)) == 0; k++)
                if (e[k].in_shard) any_in = 1, any_valid |= !e[k].line_error;
                else any = 1;
            any |= any_in;
            run_entry *m = NULL;
            if (r->line_error)   // the error of a request line: the outcome while the line is the same
                for (int k = k0; k < n && !m && strcmp(e[k].key, key) == 0; k++)
                    if (e[k].line_error && strcmp(e[k].q->error, r->error) == 0) m = &e[k];
            if (!m && (!r->line_error || final))   // an answer, or the failure of a run
                for (int k = k0; k < n && !m && strcmp(e[k].key, key) == 0; k++)
                    if (!e[k].line_error) m = &e[k];
            free(key), free(id);
            if ((any && !any_in) || (m && !m->in_shard)) {
                rc = err_printf(err, errlen, "'%s' line %d holds a record of '%s', a request of %s "
                                "outside this shard (--shard %d/%d): resume each shard with its own file",
                                names[f], r->line, r->id, from, o->shard_k, o->shard_n);
                break;
            }
            if (!m && !any && !r->line_error) {
                rc = err_printf(err, errlen, "'%s' line %d holds a record of '%s', which is not a "
                                "request of %s: resume with the request file that wrote it, or write "
                                "to a new file", names[f], r->line, r->id, from);
                break;
            }
            if (!m && any_valid && shape == SHAPE_SIFT && !r->line_error) {
                rc = err_printf(err, errlen, "'%s' line %d holds a record of '%s' by strategy '%s', "
                                "which this run does not run for it (%s): resume with the same "
                                "--strategy", names[f], r->line, r->id, r->strategy, from);
                break;
            }
            if (!m) {   // its request's line changed (fixed, or now broken): it runs again
                snprintf(what, sizeof what, "the %s of '%.200s' is no longer that request's outcome "
                         "(its line in %.300s changed)", r->error ? "error" : "answer", r->id, from);
                damage(s, names[f], r->line, r->off, what);
                continue;
            }
            if (!m->line_error && (rc = other_run(r, m, names[f], from, o, err, errlen))) break;
            if (m->taken) {
                snprintf(what, sizeof what, "a second record of '%.200s'", r->id);
                dropped(s, names[f], r->line, r->off, what, "the first one is kept");
                continue;
            }
            if (r->interrupted) {   // stopped by a signal in flight: it runs again
                s->n_dropped++, s->n_interrupted++;
                continue;
            }
            if (r->digest && strcmp(r->digest, m->q->digest) != 0) {   // the request changed since
                s->n_dropped++, s->n_changed++;
                continue;
            }
            if (r->error && o->retry_failed && !final) {   // --retry-failed: failures run again
                s->n_dropped++;
                s->n_retried++;
                continue;
            }
            m->taken = 1, r->keep = 1, r->order = m->order;
            s->n_failed_kept += r->error != NULL;
            if (done) done_add(done, m->line_error ? error_key(m->q) : strdup(m->key), &cap_done);
        }
    }
    for (int k = 0; k < n; k++) free(e[k].key);
    free(e);
    if (rc) {   // refused: nothing is done
        if (done) done_free(done);
        return rc;
    }
    if (done && done->n) qsort(done->keys, (size_t)done->n, sizeof *done->keys, cmp_str);
    // what each file needs: nothing, a cut-short tail removed, or a rewrite
    for (int f = 0; f < n_sc; f++) {
        out_scan *s = &sc[f];
        long long last = -1;
        int unordered = 0;
        for (int i = 0; i < s->n; i++)
            if (s->r[i].keep) unordered |= s->r[i].order < last, last = s->r[i].order;
        action[f] = RESUME_KEEP;
        if (s->n_dropped > (s->torn ? 1 : 0) || (unordered && !o->unordered)) action[f] = RESUME_REWRITE;
        else if (s->torn) action[f] = RESUME_TRUNCATE;
        if (s->n_retried && !o->quiet)
            fprintf(stderr, "sift: --resume --retry-failed: %s: %d failed requests run again\n", names[f],
                    s->n_retried);
        if (s->n_changed && !o->quiet && !final)
            fprintf(stderr, "sift: --resume: %s: %d record%s of requests that changed since (in %s, or "
                    "their settings): %s again\n", names[f], s->n_changed, plural_s(s->n_changed), from,
                    s->n_changed == 1 ? "it runs" : "they run");
        if (s->n_interrupted && !o->quiet && !final)
            fprintf(stderr, "sift: --resume: %s: %d request%s a signal stopped in flight: run again\n",
                    names[f], s->n_interrupted, plural_s(s->n_interrupted));
    }
    return 0;
}

// ---- rewriting -------------------------------------------------------------------------------

int resume_copy(int in, int out, const out_scan *s) {
    const out_record **keep = xmalloc((size_t)(s->n ? s->n : 1) * sizeof *keep);
    int nk = 0, rc = 0, e;
    for (int i = 0; i < s->n; i++)
        if (s->r[i].keep) keep[nk++] = &s->r[i];
    qsort(keep, (size_t)nk, sizeof *keep, by_order);
    char *buf = NULL;
    size_t cap = 0;
    for (int i = 0; i < nk && !rc; i++) {
        size_t len = (size_t)keep[i]->len;
        if (len > cap) buf = xrealloc(buf, cap = len);
        ssize_t got = pread(in, buf, len, keep[i]->off);
        if (got != (ssize_t)len) {
            if (got >= 0) errno = EIO;
            rc = -1;
        } else if ((e = outfile_write_all(out, buf, len)) != 0) errno = e, rc = -1;
    }
    free(buf), free(keep);
    return rc;
}

// Removes what a rewrite killed midway left beside path (.NAME.XXXXXX): under the lock, no other
// sift is writing one.
void resume_clean_temps(const char *path) {
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
    DIR *d = opendir(dir);
    size_t nb = strlen(base);
    for (struct dirent *e; d && (e = readdir(d));) {
        const char *n = e->d_name;
        if (n[0] != '.' || strncmp(n + 1, base, nb) || n[1 + nb] != '.' || strlen(n + 2 + nb) != 6) continue;
        char *p = joined(dir, "/", n);
        unlink(p);
        free(p);
    }
    if (d) closedir(d);
    free(dir);
}

int resume_rewrite(const char *path, const out_scan *s, int action, char *err, size_t errlen) {
    if (action == RESUME_KEEP) return 0;
    if (action == RESUME_TRUNCATE) {
        int fd = open(path, O_WRONLY);
        if (fd < 0 || ftruncate(fd, s->good_end) != 0 || fsync(fd) != 0) {
            int e = errno;
            if (fd >= 0) close(fd);
            return err_printf(err, errlen, "cannot truncate '%s': %s", path, strerror(e));
        }
        close(fd);
        return 0;
    }
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path) + 1 : 0;
    char *tmp = xmalloc(strlen(path) + 16);
    snprintf(tmp, strlen(path) + 16, "%.*s.%s.XXXXXX", (int)dl, path, path + dl);
    int in = open(path, O_RDONLY), out = in < 0 ? -1 : mkstemp(tmp), made = out >= 0, rc = 0, e = 0;
    struct stat st;
    if (in < 0 || out < 0 || fstat(in, &st) != 0 || fchmod(out, st.st_mode & 07777) != 0) rc = -1;
    if (!rc) rc = resume_copy(in, out, s);
    if (!rc && fsync(out) != 0) rc = -1;
    if (out >= 0 && close(out) != 0 && !rc) rc = -1;
    if (!rc && rename(tmp, path) == 0) {
        made = 0;
        if (outfile_sync_dir(path) != 0) rc = -1;   // renamed: only its durability is in doubt
    } else rc = -1;
    e = errno;
    if (made) unlink(tmp);   // the temporary is never left behind
    if (in >= 0) close(in);
    if (rc) err_printf(err, errlen, "cannot rewrite '%s' (through '%s'): %s", path, tmp, strerror(e));
    free(tmp);
    return rc;
}

// ---- the lock: FILE.lock beside the output, flock'ed for the whole run -------------------------

static out_lock *held[4];

static void release_at_exit(void) {
    for (int i = 0; i < 4; i++)
        if (held[i]) out_lock_release(held[i]);
}

int out_lock_take(out_lock *l, const char *target, int wait, int quiet, char *err, size_t errlen) {
    static int registered;
    *l = (out_lock){joined(target, "", ".lock"), -1};
    for (int waited = 0;;) {
        int fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) return err_printf(err, errlen, "cannot open the lock '%s': %s", l->path, strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int fe = errno;   // before pread can change it
            char pid[32] = "?";
            ssize_t got = pread(fd, pid, sizeof pid - 1, 0);
            pid[got > 0 ? got : 1] = 0;
            pid[strcspn(pid, "\n")] = 0;
            if (fe != EWOULDBLOCK && fe != EINTR) {
                close(fd);
                return err_printf(err, errlen, "cannot lock '%s': %s", l->path, strerror(fe));
            }
            if (!wait) {
                close(fd);
                return err_printf(err, errlen, "'%s' is being written by another sift (pid %s, lock "
                                  "'%s'): wait for it to end, or add --wait-lock", target, pid, l->path);
            }
            if (!waited++)   // even with -q: a job that does nothing says why
                fprintf(stderr, "sift: waiting for '%s': another sift (pid %s) writes it (--wait-lock)\n",
                        target, pid);
            if (flock(fd, LOCK_EX) != 0) {
                close(fd);
                if (errno == EINTR) continue;
                return err_printf(err, errlen, "cannot lock '%s': %s", l->path, strerror(errno));
            }
        }
        // the lock is ours if the path still names the file we locked (a holder that ended
        // removed it: then lock the new one)
        struct stat a, b;
        if (fstat(fd, &a) != 0 || stat(l->path, &b) != 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino) {
            close(fd);
            continue;
        }
        char pid[32];
        int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
        if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
            int e = errno;
            close(fd);
            return err_printf(err, errlen, "cannot write the lock '%s': %s", l->path, strerror(e));
        }
        l->fd = fd;
        if (waited && !quiet) fprintf(stderr, "sift: '%s' is free: continuing\n", target);
        break;
    }
    for (int i = 0; i < 4; i++)
        if (!held[i]) {
            held[i] = l;
            break;
        }
    if (!registered++) atexit(release_at_exit);
    return 0;
}

int jobs_output_locked(const char *target, char *pid, size_t n) {
    char *path = joined(target, "", ".lock");
    int fd = open(path, O_RDONLY | O_CLOEXEC), held = 0;
    free(path);
    if (fd < 0) return 0;
    if (flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
        held = 1;
        ssize_t got = pread(fd, pid, n - 1, 0);
        pid[got > 0 ? got : 0] = 0;
        pid[strcspn(pid, "\n")] = 0;
        if (!pid[0]) snprintf(pid, n, "?");
    }
    close(fd);   // a shared lock taken here is dropped at once
    return held;
}

void out_lock_release(out_lock *l) {
    for (int i = 0; i < 4; i++)
        if (held[i] == l) held[i] = NULL;
    if (l->fd >= 0) {
        unlink(l->path);   // still locked: whoever waits on this file finds it gone and retries
        close(l->fd);
    }
    free(l->path);
    *l = (out_lock){NULL, -1};
}
