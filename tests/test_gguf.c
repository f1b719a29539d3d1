// tests/test_gguf.c — GGUF reader: writes small GGUF files (v3 with every metadata type and a
// custom alignment, v2 with the default one), checks they parse to the right values, then checks
// that corrupted variants (bad magic/version, every truncation, absurd counts and lengths, bad
// shapes/types/offsets, duplicates, bad alignment, random byte flips) are rejected with a message.
// Finally opens the default model when it is present.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../weights/dequant.h"
#include "../weights/gguf.h"
#include "check.h"

// ---- a tiny GGUF writer ----

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) exit(2);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u8(buf *b, uint8_t v) { put(b, &v, 1); }
static void put_u16(buf *b, uint16_t v) { put(b, &v, 2); }
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_f32(buf *b, float v) { put(b, &v, 4); }
static void put_f64(buf *b, double v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void put_key(buf *b, const char *key, uint32_t type) {
    put_str(b, key);
    put_u32(b, type);
}
static void pad_to(buf *b, size_t align) {
    while (b->n % align) put_u8(b, 0);
}

// Where interesting fields of the written file sit, for the corruption tests.
typedef struct {
    size_t arch_len, align_val, u8_type, key2, strs_type, strs_count, ints_type, ints_count;
    size_t t_name[3], t_ndims[3], t_ne[3], t_type[3], t_off[3], infos_end, data;
} marks;

typedef struct {
    const char *name;
    uint32_t n_dims, type;
    uint64_t ne[2], nbytes;
} tspec;

static const tspec tensors[3] = {
    {"a.f32", 2, GGML_F32, {4, 2}, 32},
    {"b.q80", 2, GGML_Q8_0, {64, 3}, 6 * 34},
    {"c.q4k", 1, GGML_Q4_K, {256, 1}, 144},
};

static void put_kvs(buf *b, marks *m, uint32_t alignment) {
    put_key(b, "general.architecture", GGUF_STR);
    m->arch_len = b->n;
    put_str(b, "llama");
    if (alignment) {
        put_key(b, "general.alignment", GGUF_U32);
        m->align_val = b->n;
        put_u32(b, alignment);
    }
    m->key2 = b->n;
    put_key(b, "t.u8", GGUF_U8);
    m->u8_type = b->n - 4;
    put_u8(b, 200);
    put_key(b, "t.i8", GGUF_I8), put_u8(b, (uint8_t)-5);
    put_key(b, "t.u16", GGUF_U16), put_u16(b, 60000);
    put_key(b, "t.i16", GGUF_I16), put_u16(b, (uint16_t)-30000);
    put_key(b, "t.u32", GGUF_U32), put_u32(b, 4000000000u);
    put_key(b, "t.i32", GGUF_I32), put_u32(b, (uint32_t)-2000000000);
    put_key(b, "t.f32", GGUF_F32), put_f32(b, 1.5f);
    put_key(b, "t.bool", GGUF_BOOL), put_u8(b, 1);
    put_key(b, "t.u64", GGUF_U64), put_u64(b, (1ull << 40) + 3);
    put_key(b, "t.i64", GGUF_I64), put_u64(b, (uint64_t)-(1ll << 40));
    put_key(b, "t.f64", GGUF_F64), put_f64(b, 3.25);
    put_key(b, "t.strs", GGUF_ARR);
    m->strs_type = b->n;
    put_u32(b, GGUF_STR);
    m->strs_count = b->n;
    put_u64(b, 3), put_str(b, "alpha"), put_str(b, ""), put_str(b, "gamma");
    put_key(b, "t.ints", GGUF_ARR);
    m->ints_type = b->n;
    put_u32(b, GGUF_I32);
    m->ints_count = b->n;
    put_u64(b, 3), put_u32(b, 1), put_u32(b, (uint32_t)-2), put_u32(b, 3);
    put_key(b, "t.name", GGUF_STR), put_str(b, "tiny");
}
#define N_KV_WITH_ALIGN 16

static void put_tensor_data(buf *b, const tspec *t, int index) {
    if (t->type == GGML_F32) {
        for (int i = 0; i < 8; i++) put_f32(b, 0.5f * (float)i);
        return;
    }
    for (uint64_t i = 0; i < t->nbytes; i++) put_u8(b, (uint8_t)(i * 7 + (uint64_t)index));
}

// Valid GGUF: `alignment` 0 means no general.alignment key (default 32). The last tensor's
// data ends exactly at the end of the file, so every shorter prefix is invalid.
static buf build_file(uint32_t version, uint32_t alignment, marks *m) {
    buf b = {0};
    uint64_t align = alignment ? alignment : 32, off = 0;
    put(&b, "GGUF", 4);
    put_u32(&b, version);
    put_u64(&b, 3);
    put_u64(&b, alignment ? N_KV_WITH_ALIGN : N_KV_WITH_ALIGN - 1);
    put_kvs(&b, m, alignment);
    for (int i = 0; i < 3; i++) {
        const tspec *t = &tensors[i];
        m->t_name[i] = b.n + 8;
        put_str(&b, t->name);
        m->t_ndims[i] = b.n;
        put_u32(&b, t->n_dims);
        m->t_ne[i] = b.n;
        for (uint32_t d = 0; d < t->n_dims; d++) put_u64(&b, t->ne[d]);
        m->t_type[i] = b.n;
        put_u32(&b, t->type);
        m->t_off[i] = b.n;
        put_u64(&b, off);
        off = (off + t->nbytes + align - 1) / align * align;
    }
    m->infos_end = b.n;
    pad_to(&b, align);
    m->data = b.n;
    for (int i = 0; i < 3; i++) {
        pad_to(&b, align);
        put_tensor_data(&b, &tensors[i], i);
    }
    return b;
}

// ---- helpers ----

static char tmp_dir[64];

static gguf_file *open_bytes(const uint8_t *p, size_t n, char *err, size_t errlen) {
    char path[128];
    snprintf(path, sizeof path, "%s/case.gguf", tmp_dir);
    unlink(path); // a fresh file: rewriting a truncated one makes ext4 flush it on close
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(p, 1, n, fp) != n || fclose(fp) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    return gguf_open(path, err, errlen);
}

static void expect_fail(const char *what, const uint8_t *p, size_t n, const char *substr) {
    char err[512] = "";
    gguf_file *f = open_bytes(p, n, err, sizeof err);
    CHECK(f == NULL, "%s: accepted a bad file", what);
    CHECK(strstr(err, substr) != NULL, "%s: message '%s' lacks '%s'", what, err, substr);
    CHECK(strchr(err, '\n') == NULL, "%s: message is not one line", what);
    if (getenv("TEST_GGUF_VERBOSE")) printf("  %-28s -> %s\n", what, err);
    gguf_close(f);
}

static void patch_u32(uint8_t *p, size_t at, uint32_t v) { memcpy(p + at, &v, 4); }
static void patch_u64(uint8_t *p, size_t at, uint64_t v) { memcpy(p + at, &v, 8); }

// A patched copy of `b` (u64 when wide, else u32) must be rejected with `substr`.
static void expect_patch_fails(const char *what, const buf *b, size_t at, uint64_t v, int wide,
                               const char *substr) {
    uint8_t *c = malloc(b->n);
    memcpy(c, b->p, b->n);
    if (wide) patch_u64(c, at, v);
    else patch_u32(c, at, (uint32_t)v);
    expect_fail(what, c, b->n, substr);
    free(c);
}

// ---- valid files ----

static void check_metadata(const gguf_file *f) {
    uint64_t u;
    int64_t i;
    double d;
    int flag;
    char *s = gguf_get_str(f, "general.architecture");
    CHECK(s && strcmp(s, "llama") == 0, "arch %s", s ? s : "(null)");
    free(s);
    CHECK(gguf_get_u64(f, "t.u8", &u) == 0 && u == 200, "u8");
    CHECK(gguf_get_i64(f, "t.i8", &i) == 0 && i == -5, "i8");
    CHECK(gguf_get_u64(f, "t.u16", &u) == 0 && u == 60000, "u16");
    CHECK(gguf_get_i64(f, "t.i16", &i) == 0 && i == -30000, "i16");
    CHECK(gguf_get_u64(f, "t.u32", &u) == 0 && u == 4000000000u, "u32");
    CHECK(gguf_get_i64(f, "t.i32", &i) == 0 && i == -2000000000, "i32");
    CHECK(gguf_get_f64(f, "t.f32", &d) == 0 && d == 1.5, "f32");
    CHECK(gguf_get_bool(f, "t.bool", &flag) == 0 && flag == 1, "bool");
    CHECK(gguf_get_u64(f, "t.u64", &u) == 0 && u == (1ull << 40) + 3, "u64");
    CHECK(gguf_get_i64(f, "t.i64", &i) == 0 && i == -(1ll << 40), "i64");
    CHECK(gguf_get_f64(f, "t.f64", &d) == 0 && d == 3.25, "f64");
    CHECK(gguf_get_u64(f, "t.i8", &u) == -1, "negative int read as u64");
    CHECK(gguf_get_i64(f, "t.u8", &i) == 0 && i == 200, "u8 as i64");
    CHECK(gguf_get_bool(f, "t.u8", &flag) == -1, "u8 as bool");
    CHECK(gguf_get_u64(f, "t.bool", &u) == 0 && u == 1, "bool as u64");
    CHECK(gguf_get_f64(f, "t.i8", &d) == 0 && d == -5.0, "i8 as f64");
    CHECK(gguf_get_f64(f, "general.architecture", &d) == -1, "str as f64");
    CHECK(gguf_get_str(f, "t.u8") == NULL, "u8 as str");
    CHECK(gguf_get_u64(f, "no.such.key", &u) == -1, "absent key");
    CHECK(gguf_find_kv(f, "no.such.key") == NULL, "absent key");
}

static void check_arrays(const gguf_file *f) {
    const gguf_kv *kv = gguf_find_kv(f, "t.strs");
    CHECK(kv && kv->type == GGUF_ARR && kv->v.arr.type == GGUF_STR && kv->v.arr.n == 3, "strs");
    if (kv && kv->v.arr.strs) {
        CHECK(kv->v.arr.strs[0].len == 5 && memcmp(kv->v.arr.strs[0].p, "alpha", 5) == 0, "s0");
        CHECK(kv->v.arr.strs[1].len == 0, "s1");
        CHECK(kv->v.arr.strs[2].len == 5 && memcmp(kv->v.arr.strs[2].p, "gamma", 5) == 0, "s2");
    }
    kv = gguf_find_kv(f, "t.ints");
    CHECK(kv && kv->type == GGUF_ARR && kv->v.arr.type == GGUF_I32 && kv->v.arr.n == 3, "ints");
    if (kv && kv->v.arr.n == 3) {
        int32_t v[3];
        memcpy(v, kv->v.arr.data, sizeof v);
        CHECK(v[0] == 1 && v[1] == -2 && v[2] == 3, "ints %d %d %d", v[0], v[1], v[2]);
        CHECK(kv->v.arr.strs == NULL, "numeric array has no strs");
    }
}

static void check_tensors(const gguf_file *f, const buf *b, const marks *m, uint64_t align) {
    CHECK(f->n_tensors == 3, "n_tensors %llu", (unsigned long long)f->n_tensors);
    CHECK(f->alignment == align, "alignment %llu", (unsigned long long)f->alignment);
    CHECK(f->data_offset == m->data, "data_offset %llu", (unsigned long long)f->data_offset);
    for (int i = 0; i < 3 && f->n_tensors == 3; i++) {
        const tspec *s = &tensors[i];
        const gguf_tensor *t = gguf_find_tensor(f, s->name);
        CHECK(t == &f->tensors[i], "find %s", s->name);
        if (!t) continue;
        CHECK(t->type == s->type && t->n_dims == s->n_dims, "%s type/dims", s->name);
        CHECK(t->ne[0] == s->ne[0] && t->ne[1] == (s->n_dims > 1 ? s->ne[1] : 1), "%s ne", s->name);
        CHECK(t->ne[2] == 1 && t->ne[3] == 1, "%s unused dims", s->name);
        CHECK(t->nbytes == s->nbytes, "%s nbytes %llu", s->name, (unsigned long long)t->nbytes);
        CHECK(t->offset % align == 0, "%s offset", s->name);
        CHECK(t->data == f->map + m->data + t->offset, "%s data pointer", s->name);
    }
    const gguf_tensor *a = gguf_find_tensor(f, "a.f32");
    if (a) {
        float v[8];
        memcpy(v, a->data, sizeof v);
        CHECK(v[0] == 0.0f && v[7] == 3.5f, "f32 data %g %g", v[0], v[7]);
    }
    const gguf_tensor *last = &f->tensors[f->n_tensors - 1];
    CHECK((const uint8_t *)last->data + last->nbytes == f->map + b->n, "last tensor ends the file");
    CHECK(gguf_find_tensor(f, "missing") == NULL, "absent tensor");
}

static void test_valid(uint32_t version, uint32_t alignment) {
    marks m;
    buf b = build_file(version, alignment, &m);
    char err[512] = "";
    gguf_file *f = open_bytes(b.p, b.n, err, sizeof err);
    CHECK(f != NULL, "v%u file rejected: %s", version, err);
    if (f) {
        CHECK(f->version == (int)version, "version %d", f->version);
        CHECK(f->n_kv == (alignment ? N_KV_WITH_ALIGN : N_KV_WITH_ALIGN - 1), "n_kv");
        CHECK(f->size == b.n, "size");
        check_metadata(f);
        check_arrays(f);
        check_tensors(f, &b, &m, alignment ? alignment : 32);
        gguf_close(f);
    }
    free(b.p);
}

// ---- corrupted files ----

// Header only: no metadata, no tensors.
static void test_empty_model(void) {
    buf b = {0};
    put(&b, "GGUF", 4), put_u32(&b, 3), put_u64(&b, 0), put_u64(&b, 0);
    char err[512] = "";
    gguf_file *f = open_bytes(b.p, b.n, err, sizeof err);
    CHECK(f && f->n_kv == 0 && f->n_tensors == 0 && f->alignment == 32, "empty model: %s", err);
    if (f) CHECK(!gguf_find_kv(f, "x") && !gguf_find_tensor(f, "x"), "empty lookups");
    gguf_close(f);
    free(b.p);
}

static void test_header_errors(void) {
    marks m;
    buf b = build_file(3, 64, &m);
    expect_patch_fails("wrong magic", &b, 0, 0x46554746, 0, "not a GGUF file (bad magic)");
    expect_patch_fails("version 1", &b, 4, 1, 0, "unsupported GGUF version 1");
    expect_patch_fails("version 4", &b, 4, 4, 0, "unsupported GGUF version 4");
    expect_patch_fails("big-endian version", &b, 4, 3u << 24, 0, "big-endian");
    expect_patch_fails("n_tensors 2^60", &b, 8, 1ull << 60, 1, "n_tensors 1152921504606846976");
    expect_patch_fails("n_kv 2^60", &b, 16, 1ull << 60, 1,
                       "n_kv 1152921504606846976 is impossible");
    expect_patch_fails("n_kv UINT64_MAX", &b, 16, UINT64_MAX, 1, "impossible");
    expect_fail("empty file", b.p, 0, "truncated (header needs 24 bytes, file has 0)");
    expect_fail("cut header", b.p, 10, "truncated (header needs 24 bytes, file has 10)");
    expect_fail("not gguf", (const uint8_t *)"hello world, this is text", 25, "bad magic");
    free(b.p);
}

static void test_kv_errors(void) {
    marks m;
    buf b = build_file(3, 64, &m);
    expect_patch_fails("string len 2^62", &b, m.arch_len, 1ull << 62, 1, "truncated");
    expect_patch_fails("string len max", &b, m.arch_len, UINT64_MAX, 1, "truncated");
    expect_patch_fails("str array 2^61", &b, m.strs_count, 1ull << 61, 1, "string array of");
    expect_patch_fails("int array 2^62", &b, m.ints_count, 1ull << 62, 1,
                       "array of 4611686018427387904");
    expect_patch_fails("array of arrays", &b, m.ints_type, GGUF_ARR, 0, "arrays of arrays");
    expect_patch_fails("bad array type", &b, m.strs_type, 13, 0, "unknown array element type 13");
    expect_patch_fails("bad value type", &b, m.u8_type, 13, 0, "unknown value type 13");
    expect_patch_fails("alignment 48", &b, m.align_val, 48, 0, "general.alignment 48");
    expect_patch_fails("alignment 0", &b, m.align_val, 0, 0, "power of two");
    expect_patch_fails("key len 0", &b, m.key2, 0, 1, "empty");
    // Rename key "t.u8" to "t.i8": a duplicate key.
    uint8_t *c = malloc(b.n);
    memcpy(c, b.p, b.n);
    c[m.key2 + 8 + 2] = 'i';
    expect_fail("duplicate key", c, b.n, "duplicate key 't.i8'");
    free(c);
    free(b.p);
}

static void test_tensor_errors(void) {
    marks m;
    buf b = build_file(3, 64, &m);
    expect_patch_fails("n_dims 5", &b, m.t_ndims[0], 5, 0, "tensor 'a.f32' has 5 dims");
    expect_patch_fails("n_dims 0", &b, m.t_ndims[0], 0, 0, "has 0 dims");
    expect_patch_fails("zero dim", &b, m.t_ne[0] + 8, 0, 1, "zero dimension");
    expect_patch_fails("huge dims", &b, m.t_ne[0], 1ull << 62, 1, "element count overflows");
    expect_patch_fails("unknown type", &b, m.t_type[0], 99, 0,
                       "unsupported tensor type 99 for tensor 'a.f32'");
    expect_patch_fails("row not whole blocks", &b, m.t_ne[1], 48, 1, "not a multiple of the block");
    expect_patch_fails("misaligned offset", &b, m.t_off[1], 64 + 4, 1,
                       "not a multiple of the alignment");
    expect_patch_fails("offset outside", &b, m.t_off[2], 1ull << 20, 1,
                       "tensor 'c.q4k' data [");
    expect_patch_fails("offset overflow", &b, m.t_off[2], UINT64_MAX - 63, 1, "overflows");
    expect_patch_fails("tensors 2^60", &b, 8, 1ull << 60, 1, "impossible");
    uint8_t *c = malloc(b.n);
    memcpy(c, b.p, b.n);
    memcpy(c + m.t_name[1], "a.f32", 5);
    expect_fail("duplicate tensor name", c, b.n, "duplicate tensor name 'a.f32'");
    free(c);
    free(b.p);
}

// Every strict prefix of a valid file must be rejected (the last tensor ends the file).
static void test_truncations(void) {
    marks m;
    buf b = build_file(3, 64, &m);
    int bad = 0;
    for (size_t n = 0; n < b.n; n++) {
        char err[512] = "";
        gguf_file *f = open_bytes(b.p, n, err, sizeof err);
        int ok = !f && (strstr(err, "truncated") || strstr(err, "outside the file"));
        if (!ok && bad++ < 5) CHECK(ok, "prefix %zu: %s", n, f ? "accepted" : err);
        gguf_close(f);
    }
    CHECK(bad == 0, "%d prefixes not rejected as truncated", bad);
    // Inside "gamma", the third string of t.strs; inside the last tensor's offset field.
    expect_fail("cut in kv", b.p, m.strs_count + 8 + 13 + 8 + 8 + 2,
                "truncated (key 't.strs' value needs");
    expect_fail("cut in tensor infos", b.p, m.t_off[2] + 4, "truncated (tensor 'c.q4k' info");
    expect_fail("cut in data", b.p, b.n - 1, "tensor 'c.q4k' data [");
    free(b.p);
}

// Random byte corruptions: never crash; whatever is accepted stays inside the mapping.
static void test_random_flips(void) {
    marks m;
    buf b = build_file(3, 64, &m);
    uint8_t *c = malloc(b.n);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int accepted = 0, bounded = 1;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(c, b.p, b.n);
        for (int k = 0; k < 1 + iter % 4; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)(rng >> 33) % m.data; // header, kv and tensor infos
            c[at] = (uint8_t)(rng >> 17);
        }
        char err[512];
        gguf_file *f = open_bytes(c, b.n, err, sizeof err);
        if (f) {
            accepted++;
            for (uint64_t i = 0; i < f->n_tensors; i++) {
                const gguf_tensor *t = &f->tensors[i];
                uint64_t start = (uint64_t)((const uint8_t *)t->data - f->map);
                bounded &= start <= f->size && t->nbytes <= f->size - start;
            }
        }
        gguf_close(f);
    }
    CHECK(bounded, "an accepted corrupted file has a tensor outside the mapping");
    CHECK(accepted > 0 && accepted < 3000, "accepted %d of 3000 corrupted files", accepted);
    free(c);
    free(b.p);
}

static void test_open_errors(void) {
    char err[512] = "";
    char path[128];
    snprintf(path, sizeof path, "%s/does-not-exist.gguf", tmp_dir);
    CHECK(gguf_open(path, err, sizeof err) == NULL, "missing file");
    CHECK(strstr(err, "cannot open") && strstr(err, "No such file"), "message '%s'", err);
    CHECK(gguf_open(tmp_dir, err, sizeof err) == NULL, "directory");
    CHECK(strstr(err, "not a regular file"), "message '%s'", err);
    CHECK(gguf_open(path, NULL, 0) == NULL, "NULL err buffer");
    char tiny[24];
    CHECK(gguf_open(path, tiny, sizeof tiny) == NULL && strlen(tiny) < sizeof tiny, "short err");
}

static void test_type_names(void) {
    CHECK(strcmp(gguf_type_name(GGML_Q4_1), "Q4_1") == 0, "Q4_1");
    CHECK(strcmp(gguf_type_name(GGML_Q6_K), "Q6_K") == 0, "Q6_K");
    CHECK(strcmp(gguf_type_name(GGML_BF16), "BF16") == 0, "BF16");
    CHECK(strcmp(gguf_type_name(GGML_Q2_K), "Q2_K") == 0, "Q2_K");
    CHECK(strcmp(gguf_type_name(99), "unknown") == 0, "unknown");
    CHECK(dq_bytes(GGML_Q4_K, 512) == 288 && dq_bytes(GGML_Q4_K, 100) == 0, "dq_bytes");
    CHECK(dq_bytes(GGML_F32, UINT64_MAX / 2) == 0, "dq_bytes overflow");
    CHECK(dq_bytes(GGML_Q3_K, 256) == 110 && !dq_supported(GGML_Q3_K), "Q3_K size only");
}

// ---- the default model ----

static void test_real_model(void) {
    const char *path = getenv("SIFT_MODEL");
    if (!path) path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (access(path, R_OK) != 0) {
        printf("test_gguf: %s absent, skipping the real-model checks\n", path);
        return;
    }
    char err[512] = "";
    gguf_file *f = gguf_open(path, err, sizeof err);
    CHECK(f != NULL, "%s", err);
    if (!f) return;
    uint64_t blocks = 0;
    char *arch = gguf_get_str(f, "general.architecture");
    CHECK(f->n_tensors == 272, "n_tensors %llu", (unsigned long long)f->n_tensors);
    CHECK(gguf_get_u64(f, "llama.block_count", &blocks) == 0 && blocks == 30, "block_count");
    CHECK(arch && strcmp(arch, "llama") == 0, "arch %s", arch ? arch : "(null)");
    free(arch);
    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    CHECK(t && t->type == GGML_Q8_0 && t->n_dims == 2 && t->ne[0] == 576 && t->ne[1] == 49152,
          "token_embd.weight");
    t = gguf_find_tensor(f, "blk.0.attn_q.weight");
    CHECK(t && t->type == GGML_Q4_1 && t->ne[0] == 576 && t->ne[1] == 576, "blk.0.attn_q");
    const gguf_kv *tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
    CHECK(tokens && tokens->v.arr.type == GGUF_STR && tokens->v.arr.n == 49152, "tokens");
    gguf_close(f);
}

int main(void) {
    strcpy(tmp_dir, "/tmp/test_gguf.XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 2;
    }
    test_valid(3, 64);
    test_valid(2, 0);
    test_empty_model();
    test_header_errors();
    test_kv_errors();
    test_tensor_errors();
    test_truncations();
    test_random_flips();
    test_open_errors();
    test_type_names();
    test_real_model();
    char path[128];
    snprintf(path, sizeof path, "%s/case.gguf", tmp_dir);
    unlink(path);
    rmdir(tmp_dir);
    return check_summary("test_gguf");
}
