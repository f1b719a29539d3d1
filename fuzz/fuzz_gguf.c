// fuzz/fuzz_gguf.c — libFuzzer target: the GGUF reader on arbitrary bytes. Every accepted file
// must have all its tensors inside the mapping, and every typed getter must be safe to call.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../weights/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    if (fd < 0) fd = memfd_create("gguf", 0);
    if (fd < 0 || ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) abort();
    char path[64], err[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    gguf_file *f = gguf_open(path, err, sizeof err);
    if (!f) return 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        const uint8_t *p = t->data;
        if (p < f->map || p + t->nbytes > f->map + f->size) abort();
    }
    for (uint64_t i = 0; i < f->n_kv; i++) {
        uint64_t u;
        int64_t s;
        double d;
        int b;
        gguf_get_u64(f, f->kv[i].key, &u);
        gguf_get_i64(f, f->kv[i].key, &s);
        gguf_get_f64(f, f->kv[i].key, &d);
        gguf_get_bool(f, f->kv[i].key, &b);
        free(gguf_get_str(f, f->kv[i].key));
    }
    gguf_close(f);
    return 0;
}
