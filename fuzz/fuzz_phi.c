// fuzz/fuzz_phi.c — libFuzzer target: the .phi reader (attn/phi_file.c) on arbitrary bytes. An
// accepted file must describe exactly its length (parameters, then the optional verdict record
// of printable text), and its maps must evaluate on every head.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../attn/phi.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256];
    phi_maps *p = phi_maps_parse(data, size, "fuzz", err, sizeof err);
    if (!p) return 0;
    size_t vlen = strlen(p->verdict);
    if (48 + 4 * (size_t)p->n_layer * (p->n_head + p->n_kv_head) * phi_n_par(p) + (vlen ? 4 + vlen : 0) != size)
        abort();
    for (size_t i = 0; i < vlen; i++)
        if (p->verdict[i] < 0x20 || p->verdict[i] > 0x7e) abort();
    float *x = calloc((size_t)p->d_in, sizeof(float)), *out = malloc((size_t)p->d_phi * sizeof(float));
    for (int l = 0; l < p->n_layer; l++) {
        for (int h = 0; h < p->n_head; h++) phi_log_features(p, phi_par_q(p, l, h), x, out);
        for (int g = 0; g < p->n_kv_head; g++) phi_log_features(p, phi_par_k(p, l, g), x, out);
    }
    free(x);
    free(out);
    phi_maps_free(p);
    return 0;
}
