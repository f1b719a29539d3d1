// tok/text.c — prompt text from files: a whole file read (size-capped), then checked to be text
// the tokenizer takes: no NUL byte (a binary file), valid UTF-8. And generated text: an answer
// collected token by token, and how its tokens agree with a reference's.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../util/check.h"
#include "tok.h"

// Reads a whole file ('-' = stdin). NULL + err on failure.
// Prompts larger than this are refused with their size rather than read blindly: even the
// longest contexts hold a few MB of text.
#define MAX_PROMPT_BYTES ((size_t)256 << 20)

int tok_text_check(const char *text, size_t len, const char *what, char *err, size_t errlen) {
    const char *nul = memchr(text, 0, len);
    if (nul) {
        snprintf(err, errlen, "%s is binary, not text (a NUL byte at offset %ld)", what, (long)(nul - text));
        return -1;
    }
    long bad = tok_utf8_invalid_at(text, len);
    if (bad >= 0) {
        snprintf(err, errlen, "%s is not valid UTF-8 (byte offset %ld, 0x%02x)", what, bad,
                 (unsigned char)text[bad]);
        return -1;
    }
    return 0;
}

char *tok_read_text(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *fp = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    struct stat sb;
    if (!fp) {
        snprintf(err, errlen, "cannot read prompt file '%s': %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fileno(fp), &sb) == 0 && S_ISDIR(sb.st_mode)) {   // fopen opens one; reading it fails
        snprintf(err, errlen, "cannot read prompt file '%s': it is a directory (--batch DIR reads "
                 "the .txt files in one)", path);
        if (fp != stdin) fclose(fp);
        return NULL;
    }
    if (fstat(fileno(fp), &sb) == 0 && S_ISREG(sb.st_mode) && (size_t)sb.st_size > MAX_PROMPT_BYTES) {
        snprintf(err, errlen, "prompt file '%s' is %lld bytes; prompts over %zu MiB are refused",
                 path, (long long)sb.st_size, MAX_PROMPT_BYTES >> 20);
        if (fp != stdin) fclose(fp);
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, fp)) > 0) {
        n += got;
        if (n > MAX_PROMPT_BYTES) break;   // a pipe without a size
        if (cap - n - 1 == 0) buf = xrealloc(buf, cap *= 2);
    }
    if (n > MAX_PROMPT_BYTES) {
        snprintf(err, errlen, "prompt '%s' is over %zu MiB; refused", path, MAX_PROMPT_BYTES >> 20);
        if (fp != stdin) fclose(fp);
        free(buf);
        return NULL;
    }
    int bad = ferror(fp), e = errno;   // fread's errno, before fclose can change it
    if (fp != stdin) fclose(fp);
    if (bad) {
        snprintf(err, errlen, "cannot read prompt file '%s': %s", path, e ? strerror(e) : "read error");
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

int tok_answer_token(void *ctx, int id) {
    tok_answer *a = ctx;
    a->ids = xrealloc(a->ids, (size_t)(a->n_ids + 1) * sizeof(int));
    a->ids[a->n_ids++] = id;
    if (tok_is_eog(a->t, id)) return 1;
    size_t n;
    const char *p = tok_piece(a->t, id, 0, &n);
    a->text = xrealloc(a->text, a->len + n + 1);
    memcpy(a->text + a->len, p, n);
    a->len += n;
    a->text[a->len] = 0;
    return 0;
}

void tok_answer_free(tok_answer *a) {
    free(a->ids);
    free(a->text);
    a->ids = NULL, a->text = NULL, a->n_ids = 0, a->len = 0;
}

double tok_agreement(const int *ref, int n_ref, const int *ids, int n, int *first) {
    int same = 0;
    for (int i = 0; i < n_ref && i < n; i++) same += ref[i] == ids[i];
    *first = n > 0 && n_ref > 0 && ids[0] == ref[0];
    return n_ref ? (double)same / n_ref : 0;
}
