// util/check.c — see check.h.
#include "check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

_Noreturn void check_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "sift: internal error at %s:%d: ", file, line);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(3);
}

int err_printf(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen) vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static void *checked(void *p, size_t n, const char *file, int line) {
    if (!p && n)
        check_fail(file, line, "out of memory allocating %zu bytes (try a shorter prompt or -c)", n);
    return p;
}

void *check_malloc(size_t n, const char *file, int line) { return checked(malloc(n), n, file, line); }
void *check_calloc(size_t n, size_t s, const char *file, int line) {
    return checked(calloc(n, s), n * s, file, line);
}
void *check_realloc(void *p, size_t n, const char *file, int line) {
    return checked(realloc(p, n), n, file, line);
}

int host_cpu_seconds(double *busy, double *steal, double *self) {
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    int ok = f && fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                         &v[3], &v[4], &v[5], &v[6], &v[7]) == 8;
    if (f) fclose(f);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double hz = (double)sysconf(_SC_CLK_TCK);
    *busy = (double)(v[0] + v[1] + v[2] + v[5] + v[6]) / hz;
    *steal = (double)v[7] / hz;
    *self = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
            ru.ru_stime.tv_usec / 1e6;
    return ok ? 0 : -1;
}

size_t host_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    if (f) fclose(f);
    return (size_t)kib * 1024;
}
