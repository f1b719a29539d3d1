// fuzz/fuzz_safetensors.c — libFuzzer target: the safetensors reader on arbitrary bytes. Every
// accepted file must have each tensor's data inside the buffer, of exactly the size its dtype and
// shape give, and be findable by name.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../weights/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    st_file *f = st_open_mem(data, size, "fuzz", err, sizeof err);
    if (!f) {
        if (!memchr(err, 0, sizeof err)) abort();
        return 0;
    }
    for (size_t i = 0; i < f->n_tensors; i++) {
        const st_tensor *t = &f->tensors[i];
        const uint8_t *p = t->data;
        if (p < data || t->nbytes > size || p - data > (ptrdiff_t)(size - t->nbytes)) abort();
        if (t->n_elems && t->nbytes % t->n_elems) abort();
        if (st_find(f, t->name) == NULL) abort();
    }
    st_close(f);
    return 0;
}
