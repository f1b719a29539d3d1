// weights/gguf.c — GGUF v2/v3 reader. The file is mapped read-only and parsed by a cursor that
// checks every read against the file size; counts are checked against the bytes left BEFORE
// anything sized by them is allocated; tensor shapes, types, offsets and sizes are validated with
// overflow-checked arithmetic. Any problem -> NULL and a one-line "FILE: reason" message.
// Layout: magic "GGUF", u32 version, u64 n_tensors, u64 n_kv, n_kv x {string key, u32 type,
// value}, n_tensors x {string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset}, padding
// to `general.alignment` (default 32), then the data section (offsets are relative to it).
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dequant.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_HEADER_BYTES 24
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
// Smallest possible encodings, used to reject counts the remaining bytes cannot hold:
#define KV_MIN_BYTES 14     // u64 key len + 1 key byte + u32 type + 1 value byte
#define TENSOR_MIN_BYTES 33 // u64 name len + 1 name byte + u32 n_dims + u64 ne0 + u32 type
                            // + u64 offset
#define CORRUPT " (truncated or corrupt file)"

typedef struct {
    const uint8_t *map;
    uint64_t size, pos;
    const char *path;
    char *err;
    size_t errlen;
} reader;

typedef unsigned long long ull; // for printf

static int fail(reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(reader *r, const char *fmt, ...) {
    int n = snprintf(r->err, r->errlen, "%s: ", r->path);
    if (n >= 0 && (size_t)n < r->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err + n, r->errlen - (size_t)n, fmt, ap);
        va_end(ap);
    }
    return -1;
}

// ---- cursor ----

static int need(reader *r, uint64_t n, const char *what) {
    if (n <= r->size - r->pos) return 0;
    uint64_t total;
    if (__builtin_add_overflow(r->pos, n, &total))
        return fail(r, "truncated (%s needs %llu bytes at offset %llu, file has %llu)", what,
                    (ull)n, (ull)r->pos, (ull)r->size);
    return fail(r, "truncated (%s needs %llu bytes, file has %llu)", what, (ull)total,
                (ull)r->size);
}

static int rd_bytes(reader *r, void *out, uint64_t n, const char *what) {
    if (need(r, n, what)) return -1;
    memcpy(out, r->map + r->pos, n);
    r->pos += n;
    return 0;
}

static int rd_u32(reader *r, uint32_t *v, const char *what) { return rd_bytes(r, v, 4, what); }
static int rd_u64(reader *r, uint64_t *v, const char *what) { return rd_bytes(r, v, 8, what); }

static int rd_str(reader *r, gguf_str *s, const char *what) {
    if (rd_u64(r, &s->len, what) || need(r, s->len, what)) return -1;
    s->p = (const char *)r->map + r->pos;
    r->pos += s->len;
    return 0;
}

// A NUL-terminated copy of a name or key; rejects empty names and embedded NULs.
static char *dup_name(reader *r, gguf_str s, const char *what) {
    if (s.len == 0 || memchr(s.p, 0, s.len)) {
        fail(r, "%s is empty or contains a NUL byte", what);
        return NULL;
    }
    char *c = malloc(s.len + 1);
    if (!c) {
        fail(r, "out of memory reading %s (%llu bytes)", what, (ull)s.len);
        return NULL;
    }
    memcpy(c, s.p, s.len);
    c[s.len] = 0;
    return c;
}

static uint64_t remaining(const reader *r) { return r->size - r->pos; }

// ---- metadata values ----

static uint64_t scalar_size(uint32_t t) {
    static const uint8_t sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < sizeof sizes ? sizes[t] : 0;
}

static int is_signed(uint32_t t) {
    return t == GGUF_I8 || t == GGUF_I16 || t == GGUF_I32 || t == GGUF_I64;
}

// Numeric and bool values (little-endian host): unsigned ints and bool -> u, signed -> i,
// floats -> f.
static int rd_scalar(reader *r, gguf_kv *kv, const char *what) {
    uint8_t b[8] = {0};
    if (rd_bytes(r, b, scalar_size(kv->type), what)) return -1;
    int8_t i8;
    int16_t i16;
    int32_t i32;
    float f32;
    switch (kv->type) {
    case GGUF_I8: memcpy(&i8, b, 1), kv->v.i = i8; break;
    case GGUF_I16: memcpy(&i16, b, 2), kv->v.i = i16; break;
    case GGUF_I32: memcpy(&i32, b, 4), kv->v.i = i32; break;
    case GGUF_I64: memcpy(&kv->v.i, b, 8); break;
    case GGUF_F32: memcpy(&f32, b, 4), kv->v.f = f32; break;
    case GGUF_F64: memcpy(&kv->v.f, b, 8); break;
    default: memcpy(&kv->v.u, b, 8); break; // zero-extended by b's initialiser
    }
    return 0;
}

static int rd_str_array(reader *r, gguf_kv *kv, const char *what) {
    uint64_t n = kv->v.arr.n;
    if (n > remaining(r) / 8)
        return fail(r, "key '%s': string array of %llu entries cannot fit in the %llu bytes left"
                    CORRUPT, kv->key, (ull)n, (ull)remaining(r));
    if (n == 0) return 0;
    kv->v.arr.strs = calloc(n, sizeof(gguf_str));
    if (!kv->v.arr.strs) return fail(r, "out of memory for key '%s'", kv->key);
    for (uint64_t i = 0; i < n; i++)
        if (rd_str(r, &kv->v.arr.strs[i], what)) return -1;
    return 0;
}

static int rd_array(reader *r, gguf_kv *kv, const char *what) {
    uint32_t et;
    if (rd_u32(r, &et, what) || rd_u64(r, &kv->v.arr.n, what)) return -1;
    kv->v.arr.type = (enum gguf_vtype)et;
    kv->v.arr.data = r->map + r->pos;
    if (et == GGUF_ARR) return fail(r, "key '%s': arrays of arrays are not supported", kv->key);
    if (et == GGUF_STR) return rd_str_array(r, kv, what);
    uint64_t esize = scalar_size(et), bytes;
    if (esize == 0) return fail(r, "key '%s': unknown array element type %u", kv->key, et);
    if (__builtin_mul_overflow(kv->v.arr.n, esize, &bytes) || bytes > remaining(r))
        return fail(r, "key '%s': array of %llu elements cannot fit in the %llu bytes left" CORRUPT,
                    kv->key, (ull)kv->v.arr.n, (ull)remaining(r));
    r->pos += bytes;
    return 0;
}

static int rd_kv(reader *r, gguf_kv *kv, uint64_t index) {
    char what[96];
    gguf_str key;
    uint32_t type;
    snprintf(what, sizeof what, "key %llu", (ull)index);
    if (rd_str(r, &key, what) || !(kv->key = dup_name(r, key, what))) return -1;
    snprintf(what, sizeof what, "key '%.64s' value", kv->key);
    if (rd_u32(r, &type, what)) return -1;
    kv->type = (enum gguf_vtype)type;
    if (type == GGUF_STR) return rd_str(r, &kv->v.s, what);
    if (type == GGUF_ARR) return rd_array(r, kv, what);
    if (scalar_size(type) == 0)
        return fail(r, "key '%s' has unknown value type %u", kv->key, type);
    return rd_scalar(r, kv, what);
}

// ---- tensor infos ----

static int rd_shape(reader *r, gguf_tensor *t, const char *what) {
    if (rd_u32(r, &t->n_dims, what)) return -1;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return fail(r, "tensor '%s' has %u dims (1..%d allowed)", t->name, t->n_dims,
                    GGUF_MAX_DIMS);
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (rd_u64(r, &t->ne[d], what)) return -1;
        if (t->ne[d] == 0) return fail(r, "tensor '%s' has a zero dimension (ne[%u])", t->name, d);
        if (__builtin_mul_overflow(n, t->ne[d], &n) || n > (uint64_t)INT64_MAX)
            return fail(r, "tensor '%s': element count overflows", t->name);
    }
    return 0;
}

// Type known, ne[0] a whole number of blocks, byte size representable.
static int check_type(reader *r, gguf_tensor *t) {
    uint64_t block = dq_block_elems(t->type);
    if (block == 0) return fail(r, "unsupported tensor type %u for tensor '%s'", t->type, t->name);
    if (t->ne[0] % block)
        return fail(r, "tensor '%s' (%s): row length %llu is not a multiple of the block size %llu",
                    t->name, gguf_type_name(t->type), (ull)t->ne[0], (ull)block);
    uint64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; // checked in rd_shape
    t->nbytes = dq_bytes(t->type, n);
    if (t->nbytes == 0) return fail(r, "tensor '%s': byte size overflows", t->name);
    return 0;
}

static int rd_tensor_info(reader *r, gguf_tensor *t, uint64_t index) {
    char what[96];
    gguf_str name;
    uint32_t type;
    snprintf(what, sizeof what, "tensor %llu name", (ull)index);
    if (rd_str(r, &name, what) || !(t->name = dup_name(r, name, what))) return -1;
    snprintf(what, sizeof what, "tensor '%.64s' info", t->name);
    if (rd_shape(r, t, what) || rd_u32(r, &type, what) || rd_u64(r, &t->offset, what)) return -1;
    t->type = type;
    return check_type(r, t);
}

// Offset aligned and [data_offset + offset, + nbytes) inside the file.
static int place_tensor(reader *r, gguf_file *f, gguf_tensor *t) {
    uint64_t start, end;
    if (t->offset % f->alignment)
        return fail(r, "tensor '%s' offset %llu is not a multiple of the alignment %llu", t->name,
                    (ull)t->offset, (ull)f->alignment);
    if (__builtin_add_overflow(f->data_offset, t->offset, &start) ||
        __builtin_add_overflow(start, t->nbytes, &end))
        return fail(r, "tensor '%s' data offset %llu + %llu bytes overflows: outside the file "
                       "(size %llu)", t->name, (ull)t->offset, (ull)t->nbytes, (ull)r->size);
    if (end > r->size)
        return fail(r, "tensor '%s' data [%llu, %llu) outside the file (size %llu)", t->name,
                    (ull)start, (ull)end, (ull)r->size);
    t->data = r->map + start;
    return 0;
}

// ---- whole-file checks ----

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// Rejects a repeated name among the n structs at `base` (`stride` bytes apart) whose name
// pointer sits `name_at` bytes into each.
static int check_unique(reader *r, const void *base, size_t stride, size_t name_at, uint64_t n,
                        const char *what) {
    if (n < 2) return 0;
    const char **names = malloc(n * sizeof *names);
    if (!names) return fail(r, "out of memory checking %s names", what);
    for (uint64_t i = 0; i < n; i++)
        memcpy(&names[i], (const char *)base + i * stride + name_at, sizeof names[i]);
    qsort(names, n, sizeof *names, cmp_names);
    int rc = 0;
    for (uint64_t i = 1; i < n && rc == 0; i++)
        if (strcmp(names[i - 1], names[i]) == 0) rc = fail(r, "duplicate %s '%s'", what, names[i]);
    free(names);
    return rc;
}

static int rd_alignment(reader *r, gguf_file *f) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!gguf_find_kv(f, "general.alignment")) return 0;
    uint64_t a;
    if (gguf_get_u64(f, "general.alignment", &a))
        return fail(r, "general.alignment is not an unsigned integer");
    if (a == 0 || (a & (a - 1)))
        return fail(r, "general.alignment %llu is not a non-zero power of two", (ull)a);
    f->alignment = a;
    return 0;
}

static int rd_header(reader *r, gguf_file *f) {
    uint32_t version;
    if (r->size >= 4 && memcmp(r->map, GGUF_MAGIC, 4))
        return fail(r, "not a GGUF file (bad magic)");
    if (need(r, GGUF_HEADER_BYTES, "header")) return -1;
    r->pos = 4;
    if (rd_u32(r, &version, "header")) return -1;
    if (version != 2 && version != 3)
        return fail(r, "unsupported GGUF version %u (this reader handles 2 and 3%s)", version,
                    version > 0xffff ? "; big-endian file?" : "");
    f->version = (int)version;
    if (rd_u64(r, &f->n_tensors, "header") || rd_u64(r, &f->n_kv, "header")) return -1;
    if (f->n_kv > remaining(r) / KV_MIN_BYTES)
        return fail(r, "n_kv %llu is impossible: only %llu bytes follow the header" CORRUPT,
                    (ull)f->n_kv, (ull)remaining(r));
    if (f->n_tensors > remaining(r) / TENSOR_MIN_BYTES)
        return fail(r, "n_tensors %llu is impossible: only %llu bytes follow the header" CORRUPT,
                    (ull)f->n_tensors, (ull)remaining(r));
    return 0;
}

static int rd_kvs(reader *r, gguf_file *f) {
    if (f->n_kv && !(f->kv = calloc(f->n_kv, sizeof *f->kv))) return fail(r, "out of memory");
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (rd_kv(r, &f->kv[i], i)) return -1;
    return check_unique(r, f->kv, sizeof *f->kv, offsetof(gguf_kv, key), f->n_kv, "key");
}

static int rd_tensors(reader *r, gguf_file *f) {
    if (f->n_tensors > remaining(r) / TENSOR_MIN_BYTES)
        return fail(r, "n_tensors %llu is impossible: only %llu bytes follow the metadata" CORRUPT,
                    (ull)f->n_tensors, (ull)remaining(r));
    if (f->n_tensors && !(f->tensors = calloc(f->n_tensors, sizeof *f->tensors)))
        return fail(r, "out of memory");
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (rd_tensor_info(r, &f->tensors[i], i)) return -1;
    if (check_unique(r, f->tensors, sizeof *f->tensors, offsetof(gguf_tensor, name), f->n_tensors,
                     "tensor name"))
        return -1;
    uint64_t pad = (f->alignment - r->pos % f->alignment) % f->alignment;
    if (__builtin_add_overflow(r->pos, pad, &f->data_offset))
        return fail(r, "data section offset overflows");
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (place_tensor(r, f, &f->tensors[i])) return -1;
    return 0;
}

static int parse(reader *r, gguf_file *f) {
    return rd_header(r, f) || rd_kvs(r, f) || rd_alignment(r, f) || rd_tensors(r, f) ? -1 : 0;
}

// ---- open / close ----

static const uint8_t *map_file(const char *path, size_t *size, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    void *map = MAP_FAILED;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "cannot open %s: not a regular file", path);
    } else if (st.st_size == 0) {
        snprintf(err, errlen, "%s: truncated (header needs %d bytes, file has 0)", path,
                 GGUF_HEADER_BYTES);
    } else {
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) snprintf(err, errlen, "cannot map %s: %s", path, strerror(errno));
    }
    close(fd);
    if (map == MAP_FAILED) return NULL;
    *size = (size_t)st.st_size;
    return map;
}

gguf_file *gguf_open(const char *path, char *err, size_t errlen) {
    char dummy[1];
    if (!err || errlen == 0) err = dummy, errlen = sizeof dummy;
    err[0] = 0;
    size_t size;
    const uint8_t *map = map_file(path, &size, err, errlen);
    if (!map) return NULL;
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) {
        munmap((void *)map, size);
        snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    f->map = map;
    f->size = size;
    reader r = {map, size, 0, path, err, errlen};
    if (parse(&r, f)) {
        gguf_close(f);
        return NULL;
    }
    return f;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    if (f->kv)
        for (uint64_t i = 0; i < f->n_kv; i++) {
            free(f->kv[i].key);
            if (f->kv[i].type == GGUF_ARR) free(f->kv[i].v.arr.strs);
        }
    if (f->tensors)
        for (uint64_t i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->kv);
    free(f->tensors);
    if (f->map) munmap((void *)f->map, f->size);
    free(f);
}

// ---- lookups ----

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (f->kv[i].key && strcmp(f->kv[i].key, key) == 0) return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].name && strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

static int is_unsigned(enum gguf_vtype t) {
    return t == GGUF_U8 || t == GGUF_U16 || t == GGUF_U32 || t == GGUF_U64;
}

int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return -1;
    if (is_unsigned(kv->type) || kv->type == GGUF_BOOL) {
        *out = kv->v.u;
        return 0;
    }
    if (is_signed(kv->type) && kv->v.i >= 0) {
        *out = (uint64_t)kv->v.i;
        return 0;
    }
    return -1;
}

int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return -1;
    if (is_signed(kv->type)) {
        *out = kv->v.i;
        return 0;
    }
    if (is_unsigned(kv->type) && kv->v.u <= (uint64_t)INT64_MAX) {
        *out = (int64_t)kv->v.u;
        return 0;
    }
    return -1;
}

int gguf_get_f64(const gguf_file *f, const char *key, double *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return -1;
    if (kv->type == GGUF_F32 || kv->type == GGUF_F64) *out = kv->v.f;
    else if (is_signed(kv->type)) *out = (double)kv->v.i;
    else if (is_unsigned(kv->type)) *out = (double)kv->v.u;
    else return -1;
    return 0;
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv || kv->type != GGUF_BOOL) return -1;
    *out = kv->v.u != 0;
    return 0;
}

char *gguf_get_str(const gguf_file *f, const char *key) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv || kv->type != GGUF_STR) return NULL;
    char *s = malloc(kv->v.s.len + 1);
    if (!s) return NULL;
    memcpy(s, kv->v.s.p, kv->v.s.len);
    s[kv->v.s.len] = 0;
    return s;
}

const char *gguf_type_name(uint32_t ggml_type) {
    switch (ggml_type) {
    case GGML_F32: return "F32";
    case GGML_F16: return "F16";
    case GGML_Q4_0: return "Q4_0";
    case GGML_Q4_1: return "Q4_1";
    case GGML_Q5_0: return "Q5_0";
    case GGML_Q5_1: return "Q5_1";
    case GGML_Q8_0: return "Q8_0";
    case GGML_Q2_K: return "Q2_K";
    case GGML_Q3_K: return "Q3_K";
    case GGML_Q4_K: return "Q4_K";
    case GGML_Q5_K: return "Q5_K";
    case GGML_Q6_K: return "Q6_K";
    case GGML_BF16: return "BF16";
    default: return "unknown";
    }
}
