// util/tunables.c — the one place SIFT_ tunables are read from the environment (tunables.h).
#include "tunables.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

const char *const TUN_PREFILL_NAMES[] = {"int8", "tune", NULL};
static const char *const ATTN_NAMES[] = {"fa2w", "wg", NULL};   // index = enum tun_attn
static const char *const ISA_NAMES[] = {"scalar", "avx2", "avx512", NULL};
static const char *const WAY_NAMES[] = {"measure", "together", "alone", NULL};
static const char *const PREFETCH_NAMES[] = {"", "l1", "l2", NULL};   // index = level
static const char *const ONOFF_NAMES[] = {"off", "on", NULL};

static sift_tunables T;
static int loaded;

// $name's value; NULL when unset or empty, but for the variables whose empty value was always
// refused (the strip forms, the batch runner's two), where it is a value like any other.
static const char *value(const char *name) {
    static const char *const strict[] = {"SIFT_STRIP_PREFETCH", "SIFT_STRIP_ROWS8", "SIFT_PACK_ROWS",
                                         "SIFT_PARALLEL_WAY"};
    const char *e = getenv(name);
    for (size_t i = 0; e && !*e && i < sizeof strict / sizeof *strict; i++)
        if (strcmp(name, strict[i]) == 0) return e;
    return e && *e ? e : NULL;
}

// $name's index among names (NULL-terminated; "" never matches), *out left as it is when unset
// (or empty: value); -1 + err naming the accepted values when it is none of them.
static int choice(const char *name, const char *const *names, int *out, char *err, size_t n) {
    const char *e = value(name);
    if (!e) return 0;
    for (int i = 0; names[i]; i++)
        if (*names[i] && strcmp(e, names[i]) == 0) return *out = i, 0;
    char list[160] = "";
    for (int i = 0; names[i]; i++)
        if (*names[i]) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", *list ? ", " : "", names[i]);
    return err_printf(err, n, "%s='%.64s' is not one of %s", name, e, list);
}

// $name as an integer in [lo, hi] into *out (left as it is when unset); -1 + err otherwise.
static int integer(const char *name, long lo, long hi, long *out, char *err, size_t n) {
    const char *e = value(name);
    if (!e) return 0;
    char *end;
    errno = 0;
    long v = strtol(e, &end, 10);
    if (errno || end == e || *end || v < lo || v > hi)
        return err_printf(err, n, "%s='%.64s' is not a whole number from %ld to %ld", name, e, lo, hi);
    *out = v;
    return 0;
}

// $name == "1" (or "0" for a switch that is on by default): 1 or 0; anything else an error.
static int flag01(const char *name, int *out, char *err, size_t n) {
    const char *e = getenv(name);
    if (!e || !*e) return 0;
    if (strcmp(e, "0") && strcmp(e, "1")) return err_printf(err, n, "%s='%.64s' is not 0 or 1", name, e);
    *out = e[0] == '1';
    return 0;
}

int tunables_load(char *err, size_t n) {
    sift_tunables t = {.isa = -1, .prefill = -1, .strip_rows8 = -1, .cuda_graphs = 1,
                       .cuda_qgemm_rows = -1, .pack_rows = -1, .parallel_way = TUN_WAY_MEASURE};
    long rows = -1, dq = 0, optin = 0;
    int group = 0, bf16 = 0;
    const char *e;
    if (choice("SIFT_ISA", ISA_NAMES, &t.isa, err, n) || choice("SIFT_PREFILL", TUN_PREFILL_NAMES, &t.prefill, err, n) ||
        choice("SIFT_STRIP_PREFETCH", PREFETCH_NAMES, &t.strip_prefetch, err, n) ||
        choice("SIFT_STRIP_ROWS8", ONOFF_NAMES, &t.strip_rows8, err, n) ||
        flag01("SIFT_CUDA_GRAPHS", &t.cuda_graphs, err, n) ||
        choice("SIFT_ATTN_PREFILL", ATTN_NAMES, &t.attn_prefill, err, n) ||
        integer("SIFT_CUDA_SMEM_OPTIN", 0, 1 << 20, &optin, err, n) ||
        integer("SIFT_CUDA_QGEMM_ROWS", 0, 1 << 20, &rows, err, n) ||
        integer("SIFT_CUDA_DQ_ROWS", 0, 1 << 20, &dq, err, n) ||
        flag01("SIFT_CUDA_SOFT_FAIL", &t.cuda_soft_fail, err, n) ||
        integer("SIFT_PACK_ROWS", 0, 1 << 20, &t.pack_rows, err, n) ||
        choice("SIFT_PARALLEL_WAY", WAY_NAMES, &t.parallel_way, err, n) ||
        flag01("SIFT_PARSE_ONLY", &t.parse_only, err, n))
        return -1;
    static const char *const QGEMV[] = {"chunk", "group", NULL}, *const WEIGHTS[] = {"blocks", "bf16", NULL};
    if (choice("SIFT_CUDA_QGEMV", QGEMV, &group, err, n) || choice("SIFT_CUDA_WEIGHTS", WEIGHTS, &bf16, err, n))
        return -1;
    t.cuda_qgemm_rows = (int)rows, t.cuda_dq_rows = (int)dq, t.cuda_smem_optin = (int)optin;
    t.cuda_qgemv_group = group, t.cuda_weights_bf16 = bf16;
    t.cublaslt = (e = getenv("SIFT_CUBLASLT")) && *e ? e : NULL;
    t.blas_detected = (e = getenv("SIFT_BLAS_DETECTED")) && *e ? e : NULL;
    T = t;
    loaded = 1;
    return 0;
}

const sift_tunables *tunables(void) { return tunables_edit(); }

sift_tunables *tunables_edit(void) {
    if (!loaded) {
        char err[256];
        if (tunables_load(err, sizeof err)) {
            fprintf(stderr, "sift: error: %s\n", err);
            exit(2);
        }
    }
    return &T;
}
