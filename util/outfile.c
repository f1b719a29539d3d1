// util/outfile.c — see outfile.h.
#include "outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static int fail(const char *path, const char *what, int e, char *err, size_t errlen) {
    return err_printf(err, errlen, "cannot write %s '%s': %s", what, path, strerror(e));
}

int outfile_write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return errno;
        if (w == 0) return EIO;   // no progress and no error: not to be looped on
        p += w, n -= (size_t)w;
    }
    return 0;
}

// The directory part of path ("." when it has none), malloc'd.
static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    char *d = xmalloc((size_t)(slash - path) + 1);
    memcpy(d, path, (size_t)(slash - path));
    d[slash - path] = 0;
    return d;
}

// 0666 less this process's umask: what open(O_CREAT, 0666) would have given a new file.
static mode_t new_file_mode(void) {
    mode_t m = umask(0);
    umask(m);
    return 0666 & ~m;
}

// st is the file open on descriptor fd.
static int same_file(const struct stat *st, int fd) {
    struct stat o;
    return fstat(fd, &o) == 0 && o.st_dev == st->st_dev && o.st_ino == st->st_ino;
}

// In place: a device, a FIFO, or whatever a symlink reaches. Opened only now that buf is whole;
// a regular file reached through a link is truncated then, and fsynced after the write. The file
// of this process's stdout or stderr (/dev/stdout, /dev/stderr, a link to where stdout goes) is
// written through that descriptor, after what stdout holds: in order, and not over it.
static int write_in_place(const char *path, const char *buf, size_t n, const char *what, char *err,
                          size_t errlen) {
    int fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC | O_CREAT, 0666);   // O_CREAT: a dangling link
    if (fd < 0) return fail(path, what, errno, err, errlen);
    struct stat st;
    int e = fstat(fd, &st) ? errno : 0, reg = !e && S_ISREG(st.st_mode);
    int via = e ? -1 : same_file(&st, 1) ? 1 : same_file(&st, 2) ? 2 : -1;
    if (via >= 0) {
        close(fd);   // opened for writing and nothing written: nothing for close to report
        e = via == 1 && fflush(stdout) != 0 ? errno : outfile_write_all(via, buf, n);
        return e ? fail(path, what, e, err, errlen) : 0;
    }
    if (!e && reg && ftruncate(fd, 0) != 0) e = errno;
    if (!e) e = outfile_write_all(fd, buf, n);
    if (!e && reg && fsync(fd) != 0) e = errno;   // devices and pipes have nothing to sync
    if (close(fd) != 0 && !e) e = errno;
    return e ? fail(path, what, e, err, errlen) : 0;
}

int outfile_write(const char *path, const void *buf, size_t n, const char *what, char *err,
                  size_t errlen) {
    struct stat old;
    int exists = lstat(path, &old) == 0;
    if (!exists && errno != ENOENT) return fail(path, what, errno, err, errlen);
    if (exists && !S_ISREG(old.st_mode)) {
        if (S_ISDIR(old.st_mode)) return fail(path, what, EISDIR, err, errlen);
        return write_in_place(path, buf, n, what, err, errlen);
    }
    size_t len = strlen(path);
    char *tmp = xmalloc(len + sizeof ".tmp-XXXXXX");
    memcpy(tmp, path, len);
    memcpy(tmp + len, ".tmp-XXXXXX", sizeof ".tmp-XXXXXX");
    int fd = mkstemp(tmp);   // O_EXCL: a name no other writer holds
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return fail(path, what, e, err, errlen);
    }
    int e = fchmod(fd, exists ? old.st_mode & 07777 : new_file_mode()) ? errno : 0;
    if (!e && exists && (old.st_uid != geteuid() || old.st_gid != getegid()))
        if (fchown(fd, old.st_uid, old.st_gid)) {}   // best effort: only root may give a file away
    if (!e) e = outfile_write_all(fd, buf, n);
    if (!e && fsync(fd) != 0) e = errno;   // the content on disk before the name points at it
    if (close(fd) != 0 && !e) e = errno;
    if (!e && rename(tmp, path) != 0) e = errno;
    if (e) {
        unlink(tmp);
        free(tmp);
        return fail(path, what, e, err, errlen);
    }
    free(tmp);
    // the rename itself made durable; best effort (some file systems cannot sync a directory, and
    // the new content is in place either way)
    if (outfile_sync_dir(path)) {}
    return 0;
}

int outfile_sync_dir(const char *path) {
    char *dir = dir_of(path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = fd < 0 ? -1 : fsync(fd);
    if (fd >= 0) {
        int e = errno;
        close(fd);
        errno = e;
    }
    free(dir);
    return rc;
}

int outfile_check(const char *path, const char *what, char *err, size_t errlen) {
    struct stat st;
    int exists = lstat(path, &st) == 0;
    if (!exists && errno != ENOENT) return fail(path, what, errno, err, errlen);
    if (!exists || S_ISREG(st.st_mode)) {   // a temporary is made in the directory and renamed
        char *dir = dir_of(path);
        struct stat ds;
        int e = stat(dir, &ds) ? errno : !S_ISDIR(ds.st_mode) ? ENOTDIR :
                access(dir, W_OK | X_OK) ? errno : 0;
        // the message names the directory: "No such file or directory" alone reads as the file
        if (e) err_printf(err, errlen, "cannot write %s '%s': directory '%s': %s", what, path, dir,
                          strerror(e));
        free(dir);
        return e ? -1 : 0;
    }
    if (S_ISDIR(st.st_mode)) return fail(path, what, EISDIR, err, errlen);
    if (stat(path, &st) != 0) {   // a dangling symlink: its target is created when written
        if (errno == ENOENT) return 0;
        return fail(path, what, errno, err, errlen);
    }
    if (S_ISFIFO(st.st_mode)) return 0;   // opening it would wait for a reader
    int fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return fail(path, what, errno, err, errlen);
    close(fd);
    return 0;
}

FILE *outbuf_open(outbuf *b) {
    *b = (outbuf){0};
    b->f = open_memstream(&b->buf, &b->n);
    CHECK_INTERNAL(b->f, "open_memstream: out of memory");
    return b->f;
}

int outbuf_write(outbuf *b, const char *path, const char *what, char *err, size_t errlen) {
    int bad = ferror(b->f);
    if (fclose(b->f) != 0) bad = 1;
    int rc = bad ? fail(path, what, ENOMEM, err, errlen)   // a memory stream fails only for memory
                 : outfile_write(path, b->buf, b->n, what, err, errlen);
    free(b->buf);
    *b = (outbuf){0};
    return rc;
}
