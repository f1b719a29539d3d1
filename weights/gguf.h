// weights/gguf.h — GGUF v2/v3 reader: mmap the file, validate every header field, offset and size
// against the file size (overflow-safe), and expose metadata key/values and tensor descriptors.
// All pointers returned point into the mapping and live until gguf_close().
#pragma once
#include <stddef.h>
#include <stdint.h>

enum gguf_vtype {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5,
    GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STR = 8, GGUF_ARR = 9, GGUF_U64 = 10, GGUF_I64 = 11,
    GGUF_F64 = 12,
};

// ggml tensor types this project knows by name (dequant.h says which it can convert).
enum ggml_type {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7,
    GGML_Q8_0 = 8, GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12, GGML_Q5_K = 13,
    GGML_Q6_K = 14, GGML_BF16 = 30,
};

typedef struct { const char *p; uint64_t len; } gguf_str;   // not NUL-terminated

typedef struct {
    char *key;                 // NUL-terminated copy
    enum gguf_vtype type;
    union {
        uint64_t u;            // unsigned ints and bool
        int64_t i;             // signed ints
        double f;              // f32/f64
        gguf_str s;            // GGUF_STR
        struct {
            enum gguf_vtype type;  // element type (GGUF_ARR of arrays is rejected)
            uint64_t n;
            const void *data;      // raw little-endian elements (numeric arrays)
            gguf_str *strs;        // string arrays: n entries (NULL otherwise)
        } arr;
    } v;
} gguf_kv;

typedef struct {
    char *name;                // NUL-terminated copy
    uint32_t n_dims;
    uint64_t ne[4];            // ggml order: ne[0] is contiguous; unused dims are 1
    uint32_t type;             // enum ggml_type
    uint64_t offset;           // relative to the data section
    uint64_t nbytes;
    const void *data;          // into the mapping
} gguf_tensor;

typedef struct gguf_file {
    int version;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_offset;      // absolute file offset of the data section
    const uint8_t *map;
    size_t size;
} gguf_file;

// Open and validate. On failure returns NULL and writes a one-line reason into err.
gguf_file *gguf_open(const char *path, char *err, size_t errlen);
void gguf_close(gguf_file *f);

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);          // NULL if absent
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name); // NULL if absent

// Typed getters: 0 on success, -1 if absent or not convertible (ints of any width that fit,
// f32/f64 for floats, get_f64 also takes ints; bool accepted by get_u64/get_bool).
int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out);
int gguf_get_i64(const gguf_file *f, const char *key, int64_t *out);
int gguf_get_f64(const gguf_file *f, const char *key, double *out);
int gguf_get_bool(const gguf_file *f, const char *key, int *out);
// Returns a malloc'd NUL-terminated copy (caller frees) or NULL.
char *gguf_get_str(const gguf_file *f, const char *key);

const char *gguf_type_name(uint32_t ggml_type); // "Q4_1", ... or "unknown"
