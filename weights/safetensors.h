// weights/safetensors.h — safetensors reader: mmap the file, parse the JSON header (jansson),
// validate the header length and every tensor's dtype, shape and data offsets against the file
// (overflow-safe), and expose tensor descriptors pointing into the mapping.
// Layout: u64 little-endian header length N, N bytes of JSON {"NAME": {"dtype": "BF16",
// "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}, then the data section
// (offsets are relative to its start, byte 8 + N).
#pragma once
#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8

typedef struct {
    char *name;         // NUL-terminated copy
    char dtype[12];     // as written: "F32", "F16", "BF16", "I64", ...
    uint32_t ggml_type; // enum ggml_type for F32/F16/BF16, UINT32_MAX for other dtypes
    int n_dims;
    uint64_t shape[ST_MAX_DIMS]; // row-major (shape[n_dims-1] is contiguous)
    uint64_t n_elems, nbytes;
    const void *data; // into the mapping
} st_tensor;

typedef struct st_file {
    char *path;
    st_tensor *tensors;
    size_t n_tensors;
    const uint8_t *map;
    size_t size;
    int mapped; // 1: map is an mmap of the file (unmapped by st_close)
} st_file;

// Open and validate. NULL + one-line "PATH: reason" in err on failure.
st_file *st_open(const char *path, char *err, size_t errlen);
// The same checks on bytes in memory (not copied; must outlive the result). For tests/fuzzing.
st_file *st_open_mem(const void *data, size_t size, const char *name, char *err, size_t errlen);
void st_close(st_file *f);
const st_tensor *st_find(const st_file *f, const char *name); // NULL if absent
