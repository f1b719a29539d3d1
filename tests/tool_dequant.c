// tests/tool_dequant.c — dequantise a raw buffer of ggml blocks to fp32, for
// tests/test_dequant.py: `tool_dequant TYPE_ID IN.bin OUT.f32`. The element count follows from
// the input size, which must be a whole number of blocks.
#include <stdio.h>
#include <stdlib.h>

#include "../weights/dequant.h"

static unsigned char *read_all(const char *path, long *size) {
    FILE *f = fopen(path, "rb");
    if (!f || fseek(f, 0, SEEK_END) || (*size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
        perror(path);
        exit(1);
    }
    unsigned char *p = malloc(*size ? (size_t)*size : 1);
    if (!p || fread(p, 1, (size_t)*size, f) != (size_t)*size) {
        fprintf(stderr, "cannot read %s\n", path);
        exit(1);
    }
    fclose(f);
    return p;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s TYPE_ID IN.bin OUT.f32\n", argv[0]);
        return 2;
    }
    uint32_t type = (uint32_t)strtoul(argv[1], NULL, 10);
    uint64_t bb = dq_block_bytes(type);
    if (!dq_supported(type)) {
        fprintf(stderr, "tool_dequant: type %u is not supported\n", type);
        return 1;
    }
    long size;
    unsigned char *in = read_all(argv[2], &size);
    if ((uint64_t)size % bb) {
        fprintf(stderr, "tool_dequant: %ld bytes is not a whole number of %llu-byte blocks\n", size,
                (unsigned long long)bb);
        return 1;
    }
    uint64_t n = (uint64_t)size / bb * dq_block_elems(type);
    float *out = malloc(n ? n * sizeof(float) : 1);
    FILE *f = fopen(argv[3], "wb");
    if (!out || !f || dq_to_f32(type, in, out, n) || fwrite(out, sizeof(float), n, f) != n ||
        fclose(f)) {
        fprintf(stderr, "tool_dequant: failed to dequantise or write %s\n", argv[3]);
        return 1;
    }
    free(in);
    free(out);
    return 0;
}
