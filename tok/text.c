// tok/text.c — prompt text from files: a whole file read (size-capped), then checked to be text
// the tokenizer takes: no NUL byte (a binary file), valid UTF-8.
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
    int bad = ferror(fp);
    if (fp != stdin) fclose(fp);
    if (bad) {
        snprintf(err, errlen, "cannot read prompt file '%s': read error", path);
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}
