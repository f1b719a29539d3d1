// tests/test_outfile.c — util/outfile.c: files written whole. A new or regular target is replaced
// by a renamed temporary (content, mode kept or 0666 less the umask, no temporary left, a
// leftover PATH.tmp untouched); a symlink stays a symlink and its target gets the content; a
// device (a private node, major 1 minor 7: writes fail with ENOSPC) is written in place and stays a
// device; a directory is refused; outfile_check modifies nothing. Runs in a fresh directory under
// $TMPDIR (or /tmp); the node is made only when mknod is allowed (root).
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "../util/outfile.h"
#include "check.h"

static char dir[4096];

static const char *at(const char *name) {
    static char buf[4][4200];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

// The whole content of path (NUL-terminated; at most 4095 bytes), or "" when it cannot be read.
static const char *slurp(const char *path) {
    static char buf[4096];
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    return buf;
}

static void put(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    fputs(s, f);
    fclose(f);
}

// Entries of dir whose name starts with prefix.
static int count_prefix(const char *prefix) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/test_outfile.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
    umask(022);
    char err[8192];

    // a new file: the content, mode 0666 & ~022, nothing else in the directory
    CHECK(outfile_write(at("new.json"), "{\"a\":1}\n", 8, "--summary", err, sizeof err) == 0, "%s", err);
    CHECK(strcmp(slurp(at("new.json")), "{\"a\":1}\n") == 0, "%s", slurp(at("new.json")));
    struct stat st;
    CHECK(stat(at("new.json"), &st) == 0 && (st.st_mode & 07777) == 0644, "mode %o", st.st_mode & 07777);
    CHECK(count_prefix("new.json") == 1, "a temporary was left");

    // an existing file with mode 0640 and a leftover old-style new.json.tmp: replaced, mode kept,
    // the leftover untouched (no fixed temporary name)
    chmod(at("new.json"), 0640);
    put(at("new.json.tmp"), "leftover");
    CHECK(outfile_write(at("new.json"), "second", 6, "--summary", err, sizeof err) == 0, "%s", err);
    CHECK(strcmp(slurp(at("new.json")), "second") == 0, "%s", slurp(at("new.json")));
    CHECK(stat(at("new.json"), &st) == 0 && (st.st_mode & 07777) == 0640, "mode %o", st.st_mode & 07777);
    CHECK(strcmp(slurp(at("new.json.tmp")), "leftover") == 0, "the leftover changed");
    CHECK(count_prefix("new.json") == 2, "a temporary was left");   // new.json, new.json.tmp

    // outbuf: stdio into memory, then written whole
    outbuf b;
    fprintf(outbuf_open(&b), "%d,%s\n", 42, "x");
    CHECK(outbuf_write(&b, at("b.csv"), "--csv", err, sizeof err) == 0, "%s", err);
    CHECK(strcmp(slurp(at("b.csv")), "42,x\n") == 0, "%s", slurp(at("b.csv")));

    // a symlink to a longer regular file: still a link, the target holds exactly the new content
    put(at("target.json"), "an old and much longer content");
    CHECK(symlink("target.json", at("link.json")) == 0, "symlink: %s", strerror(errno));
    CHECK(outfile_write(at("link.json"), "short", 5, "--summary", err, sizeof err) == 0, "%s", err);
    CHECK(lstat(at("link.json"), &st) == 0 && S_ISLNK(st.st_mode), "the link was replaced");
    CHECK(strcmp(slurp(at("target.json")), "short") == 0, "%s", slurp(at("target.json")));

    // a directory: refused, left alone
    mkdir(at("adir"), 0755);
    CHECK(outfile_write(at("adir"), "x", 1, "--plot", err, sizeof err) == -1, "a directory was written");
    CHECK(strstr(err, "cannot write --plot '") && strstr(err, "Is a directory"), "%s", err);
    CHECK(stat(at("adir"), &st) == 0 && S_ISDIR(st.st_mode), "the directory went");

    // a missing directory: the error names the flag, the path and the errno text
    CHECK(outfile_write(at("no/x.json"), "x", 1, "-o", err, sizeof err) == -1, "written into nothing");
    CHECK(strstr(err, "cannot write -o '") && strstr(err, "no/x.json': No such file or directory"), "%s", err);

    // outfile_check: fine for a new name and an existing file, which it leaves as it was; a
    // missing directory fails
    put(at("keep.json"), "keep me");
    CHECK(outfile_check(at("keep.json"), "--summary", err, sizeof err) == 0, "%s", err);
    CHECK(strcmp(slurp(at("keep.json")), "keep me") == 0, "the check modified the file");
    CHECK(outfile_check(at("fresh.json"), "--summary", err, sizeof err) == 0, "%s", err);
    CHECK(access(at("fresh.json"), F_OK) != 0, "the check created the file");
    CHECK(outfile_check(at("no/x.json"), "--summary", err, sizeof err) == -1, "a missing directory passed");

    // a private full device: ENOSPC named, the node still the same device, the link to it a link
    if (mknod(at("full"), S_IFCHR | 0600, makedev(1, 7)) == 0) {
        CHECK(outfile_check(at("full"), "--summary", err, sizeof err) == 0, "%s", err);
        CHECK(outfile_write(at("full"), "data", 4, "--summary", err, sizeof err) == -1, "no error");
        CHECK(strstr(err, "full': No space left on device"), "%s", err);
        CHECK(lstat(at("full"), &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 7),
              "the node was replaced");
        CHECK(symlink("full", at("tofull")) == 0, "symlink: %s", strerror(errno));
        CHECK(outfile_write(at("tofull"), "data", 4, "--kept-map", err, sizeof err) == -1, "no error");
        CHECK(strstr(err, "cannot write --kept-map '") && strstr(err, "No space left on device"), "%s", err);
        CHECK(lstat(at("tofull"), &st) == 0 && S_ISLNK(st.st_mode), "the link was replaced");
        CHECK(count_prefix("full") == 1 && count_prefix("tofull") == 1, "a temporary was left");
        unlink(at("full")), unlink(at("tofull"));
    } else {
        printf("test_outfile: mknod refused (%s): the device cases are skipped\n", strerror(errno));
    }

    const char *names[] = {"new.json", "new.json.tmp", "b.csv", "target.json", "link.json", "keep.json"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) unlink(at(names[i]));
    rmdir(at("adir"));
    CHECK(rmdir(dir) == 0, "the directory holds something more: %s", strerror(errno));
    return check_summary("test_outfile");
}
