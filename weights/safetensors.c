// weights/safetensors.c — safetensors reader (see safetensors.h). The header length is checked
// against the file before the JSON is parsed; each tensor's dtype must be known, its shape must
// multiply out (overflow-checked) to exactly data_offsets[1] - data_offsets[0] bytes, and both
// offsets must lie inside the data section. Any problem -> NULL and "PATH: reason".
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../util/check.h"
#include "gguf.h"

// A header larger than this is refused rather than parsed (real ones are well under 10 MB).
#define ST_MAX_HEADER ((uint64_t)100 << 20)

typedef unsigned long long ull;

static const struct {
    const char *name;
    uint32_t bytes, ggml;
} DTYPES[] = {
    {"F32", 4, GGML_F32},    {"F16", 2, GGML_F16},       {"BF16", 2, GGML_BF16},
    {"F64", 8, UINT32_MAX},  {"I64", 8, UINT32_MAX},     {"I32", 4, UINT32_MAX},
    {"I16", 2, UINT32_MAX},  {"I8", 1, UINT32_MAX},      {"U8", 1, UINT32_MAX},
    {"BOOL", 1, UINT32_MAX}, {"F8_E4M3", 1, UINT32_MAX}, {"F8_E5M2", 1, UINT32_MAX},
};

static int fail(char *err, size_t errlen, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, const char *path, const char *fmt, ...) {
    int n = snprintf(err, errlen, "%s: ", path);
    if (n >= 0 && (size_t)n < errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

// A non-negative JSON integer, or -1.
static int json_u64(const json_t *j, uint64_t *out) {
    if (!json_is_integer(j) || json_integer_value(j) < 0) return -1;
    *out = (uint64_t)json_integer_value(j);
    return 0;
}

// Fills t from one header entry; data_size = bytes after the header.
static int parse_tensor(st_file *f, st_tensor *t, const char *name, const json_t *e,
                        const uint8_t *data, uint64_t data_size, char *err, size_t errlen) {
    const char *p = f->path;
    t->name = strdup(name);
    CHECK_INTERNAL(t->name, "out of memory");
    const json_t *dt = json_object_get(e, "dtype"), *shape = json_object_get(e, "shape"),
                 *offs = json_object_get(e, "data_offsets");
    if (!json_is_object(e) || !json_is_string(dt) || !json_is_array(shape) ||
        !json_is_array(offs) || json_array_size(offs) != 2)
        return fail(err, errlen, p, "tensor '%s' needs dtype, shape and data_offsets [begin, end]",
                    name);
    uint32_t esize = 0;
    for (size_t i = 0; i < sizeof DTYPES / sizeof *DTYPES; i++)
        if (strcmp(json_string_value(dt), DTYPES[i].name) == 0) {
            esize = DTYPES[i].bytes;
            t->ggml_type = DTYPES[i].ggml;
            snprintf(t->dtype, sizeof t->dtype, "%s", DTYPES[i].name);
        }
    if (!esize)
        return fail(err, errlen, p, "tensor '%s' has unknown dtype '%.20s'", name,
                    json_string_value(dt));
    if (json_array_size(shape) > ST_MAX_DIMS)
        return fail(err, errlen, p, "tensor '%s' has %zu dimensions (at most %d)", name,
                    json_array_size(shape), ST_MAX_DIMS);
    t->n_dims = (int)json_array_size(shape);
    uint64_t n = 1;
    for (int d = 0; d < t->n_dims; d++)
        if (json_u64(json_array_get(shape, d), &t->shape[d]) ||
            __builtin_mul_overflow(n, t->shape[d], &n))
            return fail(err, errlen, p, "tensor '%s' has a bad or overflowing shape", name);
    uint64_t beg, end;
    if (json_u64(json_array_get(offs, 0), &beg) || json_u64(json_array_get(offs, 1), &end) ||
        beg > end)
        return fail(err, errlen, p, "tensor '%s' has bad data_offsets", name);
    if (end > data_size)
        return fail(err, errlen, p,
                    "tensor '%s' data [%llu, %llu) is past the end of the data "
                    "(%llu bytes; truncated file?)",
                    name, (ull)beg, (ull)end, (ull)data_size);
    uint64_t bytes;
    if (__builtin_mul_overflow(n, (uint64_t)esize, &bytes) || bytes != end - beg)
        return fail(err, errlen, p,
                    "tensor '%s': %s of %llu elements does not fit its %llu data "
                    "bytes",
                    name, t->dtype, (ull)n, (ull)(end - beg));
    t->n_elems = n;
    t->nbytes = bytes;
    t->data = data + beg;
    return 0;
}

static int parse_header(st_file *f, char *err, size_t errlen) {
    uint64_t hlen;
    if (f->size < 8)
        return fail(err, errlen, f->path, "truncated (%zu bytes, no header length)", f->size);
    memcpy(&hlen, f->map, 8);
    if (hlen > f->size - 8 || hlen > ST_MAX_HEADER)
        return fail(err, errlen, f->path,
                    "header length %llu does not fit the file of %zu bytes "
                    "(truncated or not safetensors)",
                    (ull)hlen, f->size);
    json_error_t je;
    json_t *root = json_loadb((const char *)f->map + 8, hlen, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        return fail(err, errlen, f->path, "header is not a JSON object (%s)",
                    root ? "other JSON" : je.text);
    }
    f->tensors = xcalloc(json_object_size(root) + 1, sizeof *f->tensors);
    const uint8_t *data = f->map + 8 + hlen;
    uint64_t data_size = f->size - 8 - hlen;
    const char *key;
    json_t *val;
    int rc = 0;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        rc = parse_tensor(f, &f->tensors[f->n_tensors++], key, val, data, data_size, err, errlen);
        if (rc) break;
    }
    json_decref(root);
    return rc;
}

st_file *st_open_mem(const void *data, size_t size, const char *name, char *err, size_t errlen) {
    st_file *f = xcalloc(1, sizeof *f);
    f->path = strdup(name);
    CHECK_INTERNAL(f->path, "out of memory");
    f->map = data;
    f->size = size;
    if (parse_header(f, err, errlen) != 0) {
        st_close(f);
        return NULL;
    }
    return f;
}

st_file *st_open(const char *path, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        fail(err, errlen, path, "cannot open: %s", strerror(errno));
        if (fd >= 0) close(fd);
        return NULL;
    }
    if (!S_ISREG(sb.st_mode) || sb.st_size == 0) {
        close(fd);
        fail(err, errlen, path, "not a regular non-empty file");
        return NULL;
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        fail(err, errlen, path, "cannot map: %s", strerror(errno));
        return NULL;
    }
    st_file *f = st_open_mem(map, (size_t)sb.st_size, path, err, errlen);
    if (!f)
        munmap(map, (size_t)sb.st_size);
    else
        f->mapped = 1;
    return f;
}

void st_close(st_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n_tensors; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    if (f->mapped) munmap((void *)f->map, f->size);
    free(f->path);
    free(f);
}

const st_tensor *st_find(const st_file *f, const char *name) {
    for (size_t i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}
