// fuzz/fuzz_resume.c — libFuzzer target: the --resume reader (jobs/resume.c) on arbitrary bytes as
// an earlier run's --output file (seeds: tests/data/resume_seed_*.jsonl, real records). The bytes are read through a FILE* with a small line bound (so
// that over-long lines are exercised), matched against a fixed run (4 requests, one of them a bad
// line; two strategies in sift's shape, one in the Batch API's), and the kept records copied as a
// rewrite would copy them, then read again. Checked: every record lies inside the input on a line
// of its own; the plan either refuses (a file of another run) or keeps at most one record per
// outcome, all listed in the done set; the rewritten bytes read back with no damage, the same
// records, in input order, and a second plan keeps them all.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../jobs/internal.h"

#define MAX_LINE 2048

static strategy full = {.name = "full"}, speed = {.name = "speed"};

// The options digest (jobs/request.c, which reads the strategies' settings from the library this
// target does not link): here the strategy's name alone, so that a record naming another digest is
// a record of other settings (refused) and one naming this one is kept.
void options_digest(const run_opts *o, const strategy *s, char out[17]) {
    (void)o;
    snprintf(out, 17, "%016llx", (unsigned long long)strlen(s->name) * 0x9e3779b97f4a7c15ULL);
}

// Reads n bytes of fd from its start into a new buffer.
static char *slurp(int fd, size_t *n) {
    *n = (size_t)lseek(fd, 0, SEEK_END);
    char *b = malloc(*n + 1);
    if (pread(fd, b, *n, 0) != (ssize_t)*n) abort();
    return b;
}

static void scan_mem(const char *data, size_t size, out_scan *s) {
    static const char empty[1];
    FILE *fp = fmemopen((void *)(size ? data : empty), size ? size : 1, "r");
    if (!fp) abort();
    if (!size) fgetc(fp);   // fmemopen wants a size: an empty file is a read one byte past
    s->quiet = 1;           // the damage reports are noise here
    if (resume_scan(fp, "fuzz", 0, MAX_LINE, s) != 0) abort();
    fclose(fp);
}

static void check_plan(const char *data, size_t size, int shape) {
    request q[4] = {
        {.index = 0, .id = "a", .line = 1},
        {.index = 1, .id = "line-2", .line = 2,   // as in tests/data/resume_seed_*.jsonl
         .error = shape == SHAPE_SIFT ? "r.jsonl line 2: invalid JSON at column 19: unexpected token near end of file"
                                      : "r.jsonl line 2: invalid JSON at column 17: string or '}' expected near end of file"},
        {.index = 2, .id = "b", .line = 3, .strategy = &speed},
        {.index = 3, .id = "line-4", .line = 4, .error = "r.jsonl line 4: duplicate id 'a' (first at line 1); this line is not run"},
    };
    // the digests of the requests that run (tests/data/resume_seed_*.jsonl's records carry them)
    snprintf(q[0].digest, sizeof q[0].digest, "%s", "00000000000000aa");
    snprintf(q[2].digest, sizeof q[2].digest, "%s", "00000000000000bb");
    run_opts o = {.prompts_path = "r.jsonl", .strategies = {&full, &speed}, .n_strategies = 2,
                  .retry_failed = size % 3 == 0};
    out_scan s = {0};
    scan_mem(data, size, &s);
    for (int i = 0; i < s.n; i++) {   // a record is a whole line of the input
        const out_record *r = &s.r[i];
        if (r->off < 0 || r->len < 2 || r->off + r->len > (long long)size || data[r->off + r->len - 1] != '\n')
            abort();
        if (i && r->off < s.r[i - 1].off + s.r[i - 1].len) abort();
    }
    const char *names[1] = {"fuzz"};
    done_set d = {0};
    int action[1] = {0};
    char err[1024];
    int lo = size % 2 ? 0 : 1;   // sometimes a shard without the first request
    int bad = resume_plan(&s, 1, names, shape, q, 4, lo, 4, &o, 0, &d, action, err, sizeof err);
    if (bad) {
        if (!err[0] || d.n) abort();
        scan_free(&s);
        return;
    }
    int kept = 0;
    for (int i = 0; i < s.n; i++) {
        const out_record *r = &s.r[i];
        kept += r->keep;
        // a kept record with a digest answers the request as it is now
        if (r->keep && r->digest && !r->error && strcmp(r->digest, !strcmp(r->id, "a") ? q[0].digest : q[2].digest))
            abort();
    }
    if (kept != d.n || kept > 6) abort();
    for (int i = 1; i < d.n; i++)
        if (strcmp(d.keys[i - 1], d.keys[i]) >= 0) abort();   // sorted, no outcome twice
    // the rewrite's copy, read back: whole records only, the kept ones, in input order
    int in = memfd_create("in", 0), out = memfd_create("out", 0);
    if (in < 0 || out < 0 || (size && write(in, data, size) != (ssize_t)size)) abort();
    if (resume_copy(in, out, &s) != 0) abort();
    size_t n2;
    char *copy = slurp(out, &n2);
    out_scan t = {0};
    scan_mem(copy, n2, &t);
    if (t.n != kept || t.n_dropped || t.torn) abort();
    done_set d2 = {0};
    int action2[1] = {0};
    o.retry_failed = 0;
    if (resume_plan(&t, 1, names, shape, q, 4, lo, 4, &o, 1, &d2, action2, err, sizeof err) != 0) abort();
    if (d2.n != kept || action2[0] != RESUME_KEEP) abort();
    for (int i = 0; i < d.n; i++)
        if (strcmp(d.keys[i], d2.keys[i])) abort();
    done_free(&d), done_free(&d2);
    scan_free(&s), scan_free(&t);
    free(copy);
    close(in), close(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1 << 20)) return 0;
    check_plan((const char *)data, size, SHAPE_SIFT);
    check_plan((const char *)data, size, SHAPE_OPENAI);
    return 0;
}
