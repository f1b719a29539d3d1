// util/check.h — checked wrappers: on failure print file:line, what failed and a hint, then exit
// with a non-zero code. For internal failures only (out of memory, broken invariants); bad user
// input is reported by the caller as a one-line error instead.
#pragma once
#include <stddef.h>

#define xmalloc(n) check_malloc((n), __FILE__, __LINE__)
#define xcalloc(n, s) check_calloc((n), (s), __FILE__, __LINE__)
#define xrealloc(p, n) check_realloc((p), (n), __FILE__, __LINE__)
#define CHECK_INTERNAL(cond, ...) \
    do { if (!(cond)) check_fail(__FILE__, __LINE__, __VA_ARGS__); } while (0)

// Writes a one-line message for bad input into err (errlen bytes); returns -1.
// Bytes of host memory available now (/proc/meminfo MemAvailable); 0 when unknown.
size_t host_mem_available(void);
// CPU seconds since boot, over all CPUs (/proc/stat: user + nice + system + irq + softirq into
// *busy, the hypervisor's stolen time into *steal), and this process's own (getrusage) into
// *self. 0, or -1 when /proc/stat cannot be read.
int host_cpu_seconds(double *busy, double *steal, double *self);

// Rates for timing lines: n per second over ms (0 when ms is 0), and ms per item (0 when n is 0).
static inline double per_second(int n, double ms) { return ms > 0 ? n * 1e3 / ms : 0; }
static inline double per_token(int n, double ms) { return n > 0 ? ms / n : 0; }
// The plural ending of a count's noun: "%d token%s", n, plural_s(n) reads "1 token", "2 tokens".
static inline const char *plural_s(long long n) { return n == 1 ? "" : "s"; }

int err_printf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

void *check_malloc(size_t n, const char *file, int line);
void *check_calloc(size_t n, size_t size, const char *file, int line);
void *check_realloc(void *p, size_t n, const char *file, int line);
void check_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));   // attribute, not _Noreturn: C++ includes it
