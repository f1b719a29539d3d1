// fuzz/fuzz_pcache.c — libFuzzer target: the --prompt-cache reader (policies/prompt_cache.c) on
// arbitrary bytes. An accepted file must describe exactly its length (header, names, tokens,
// every layer's rows, the checksum), its tokens must lie below the vocabulary given, and every
// token and row it points at must be readable.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../policies/prompt_cache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512];
    pcache_view v;
    if (pcache_parse(data, size, "fuzz", 50000, &v, err, sizeof err) != 0) {
        if (!err[0] || strchr(err, '\n')) abort();   // a refusal is one line
        return 0;
    }
    const pcache_meta *m = &v.meta;
    size_t names = strlen(m->model) + strlen(m->backend) + strlen(m->weights);
    size_t rows = (size_t)m->n_layer * m->n_kv_head * (size_t)v.n_tok * (v.k_row + v.v_row);
    if (60 + names + 4 * (size_t)v.n_tok + rows + 8 != size) abort();   // 60: magic, fields, digest
    unsigned sum = 0;
    for (int i = 0; i < v.n_tok; i++) {
        int t = pcache_token(&v, i);
        if (t < 0 || t >= 50000) abort();
        sum += (unsigned)t;
    }
    for (size_t i = 0; i < rows; i++) sum += v.rows[i];
    return (int)(sum & 0);
}
