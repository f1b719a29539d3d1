// weights/synthetic.c — the named synthetic shapes (published config.json values) and filling a
// host buffer with a synthetic tensor (see synthetic.h).
#include "synthetic.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// name, arch, layers, d, heads, kv heads, head dim, d_ff, vocab, ctx, tied, theta, eps,
// llama3 scaling (factor, low, high, original ctx), default seed.
static const synth_shape SHAPES[] = {
    // HuggingFaceTB/SmolLM2-135M: llama, NEOX rotation here (no GGUF row permutation involved).
    {"smollm2-135m", "llama", 30, 576, 9, 3, 64, 1536, 49152, 8192, 1, 100000, 1e-5f, 0, 0, 0, 0, 135},
    // meta-llama/Llama-3.2-1B
    {"llama-3.2-1b", "llama", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 1, 500000, 1e-5f, 32, 1, 4, 8192, 1},
    // meta-llama/Llama-3.2-3B
    {"llama-3.2-3b", "llama", 28, 3072, 24, 8, 128, 8192, 128256, 131072, 1, 500000, 1e-5f, 32, 1, 4, 8192, 3},
    // meta-llama/Llama-3.1-8B
    {"llama-3.1-8b", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 131072, 0, 500000, 1e-5f, 8, 1, 4, 8192, 8},
    // Qwen/Qwen2.5-7B: QKV bias, untied, max_position_embeddings 131072
    {"qwen2.5-7b", "qwen2", 28, 3584, 28, 4, 128, 18944, 152064, 131072, 0, 1000000, 1e-6f, 0, 0, 0, 0, 7},
};
#define N_SHAPES (sizeof SHAPES / sizeof *SHAPES)

const char *synth_names(void) {
    static char names[256];
    if (!names[0])
        for (size_t i = 0; i < N_SHAPES; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "",
                     SHAPES[i].name);
    return names;
}

int synth_parse(const char *spec, synth_shape *out, char *err, size_t errlen) {
    size_t plen = strlen(SYNTH_PREFIX);
    if (strncmp(spec, SYNTH_PREFIX, plen) != 0) {
        snprintf(err, errlen, "'%s' is not a synthetic model name (synthetic:NAME[@SEED])", spec);
        return -1;
    }
    const char *name = spec + plen, *at = strchr(name, '@');
    size_t nlen = at ? (size_t)(at - name) : strlen(name);
    for (size_t i = 0; i < N_SHAPES; i++) {
        if (strlen(SHAPES[i].name) != nlen || strncmp(SHAPES[i].name, name, nlen) != 0) continue;
        *out = SHAPES[i];
        if (!at) return 0;
        char *end;
        errno = 0;
        unsigned long long seed = strtoull(at + 1, &end, 10);
        if (errno || end == at + 1 || *end || at[1] == '-') {
            snprintf(err, errlen, "synthetic seed '%s' is not a non-negative integer", at + 1);
            return -1;
        }
        out->seed = seed;
        return 0;
    }
    snprintf(err, errlen, "unknown synthetic model '%.*s' (known: %s; synthetic:NAME[@SEED])",
             (int)nlen, name, synth_names());
    return -1;
}

void synth_fill(float *dst, size_t n, uint64_t seed, uint64_t tensor, float scale, float offset) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] = offset + scale * synth_uniform(seed, tensor, i);
}
