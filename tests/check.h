// tests/check.h — the tiny assertion layer of the C unit tests. Each test binary ends with
// check_summary(), which prints "N passed, N failed" and returns the exit code.
#pragma once
#include <math.h>
#include <stdio.h>

static int check_n_pass, check_n_fail;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (cond) {                                                            \
            check_n_pass++;                                                    \
        } else {                                                               \
            check_n_fail++;                                                    \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
        }                                                                      \
    } while (0)

// |a - b| <= tol * max(1, |b|)
#define CHECK_CLOSE(a, b, tol)                                                 \
    CHECK(fabs((double)(a) - (double)(b)) <= (tol) * fmax(1.0, fabs((double)(b))), \
          "%.9g vs %.9g", (double)(a), (double)(b))

static inline int check_summary(const char *name) {
    printf("%s: %d passed, %d failed\n", name, check_n_pass, check_n_fail);
    return check_n_fail ? 1 : 0;
}
