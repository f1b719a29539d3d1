// util/outfile.h — files sift produces whole (--summary, --kept-map, eval/sweep reports and plots,
// fit-phi maps and their progress file), written so that a reader never sees half of one and a
// failure never passes silently.
//
// A regular target, or a path that does not exist yet, is written to a unique temporary beside it
// (mkstemp: PATH.tmp-XXXXXX, so two writers never share a name), with every write, the fsync and
// the close checked, then renamed over PATH (and the directory fsynced): PATH holds the old
// content or the new, never a mix. The temporary takes the old file's mode (a new file: 0666 less
// the umask) and, best effort, its owner.
// Any other target — a device, a FIFO, /dev/stdout, a symlink (to anything: the link is never
// replaced by a regular file) — is written in place: opened O_WRONLY, never unlinked or renamed
// over; when what it reaches is a regular file, that file is truncated only now that the whole
// content is ready, then written and fsynced. A failure there can leave that file partly written.
// The file this process's stdout or stderr is open on (/dev/stdout, a link to /proc/self/fd/1) is
// written through that descriptor, after what stdout holds: after the text, never over it.
//
// Errors: "cannot write WHAT 'PATH': <strerror>" in err (WHAT names the file to the user: the flag,
// e.g. "--summary"); the temporary is removed and an old target left as it was.
#pragma once
#include <stdio.h>

// Writes buf (n bytes) as the whole content of path. 0, or -1 with err.
int outfile_write(const char *path, const void *buf, size_t n, const char *what, char *err,
                  size_t errlen);

// All n bytes of p to fd, short writes and EINTR retried: 0, or the errno (EIO when a write makes
// no progress). The records file's writer and --resume's rewrite use it too.
int outfile_write_all(int fd, const void *p, size_t n);
// fsyncs the directory that holds path ("." when it names none), so that a rename there is
// durable: 0, or -1 with errno.
int outfile_sync_dir(const char *path);

// Whether path can be written later, modifying nothing (for a check before a long run): a regular
// or absent target needs a writable directory; a symlink, device or FIFO must exist and open for
// writing (opened O_WRONLY without O_TRUNC/O_CREAT and closed; a FIFO is not opened: that would
// wait for a reader). 0, or -1 with err.
int outfile_check(const char *path, const char *what, char *err, size_t errlen);

// Content built with stdio: outbuf_open gives a memory stream, outbuf_write closes it and writes
// what it holds with outfile_write (a stream that failed is an error), then frees it.
typedef struct {
    FILE *f;
    char *buf;
    size_t n;
} outbuf;
FILE *outbuf_open(outbuf *b);
int outbuf_write(outbuf *b, const char *path, const char *what, char *err, size_t errlen);
