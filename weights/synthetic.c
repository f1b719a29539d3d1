// weights/synthetic.c — the named synthetic shapes (published config.json values) and filling a
// host buffer with a synthetic tensor (see synthetic.h).
#include "synthetic.h"

#include "dequant.h"
#include "gguf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// name, arch, layers, d, heads, kv heads, head dim, d_ff, vocab, ctx, tied, theta, eps,
// llama3 scaling (factor, low, high, original ctx), default seed, weight type (fp32 values).
static const synth_shape SHAPES[] = {
    // HuggingFaceTB/SmolLM2-135M: llama, NEOX rotation here (no GGUF row permutation involved).
    {"smollm2-135m", "llama", 30, 576, 9, 3, 64, 1536, 49152, 8192, 1, 100000, 1e-5f, 0, 0, 0, 0, 135, GGML_F32},
    // meta-llama/Llama-3.2-1B
    {"llama-3.2-1b", "llama", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 1, 500000, 1e-5f, 32, 1, 4, 8192, 1, GGML_F32},
    // meta-llama/Llama-3.2-3B
    {"llama-3.2-3b", "llama", 28, 3072, 24, 8, 128, 8192, 128256, 131072, 1, 500000, 1e-5f, 32, 1, 4, 8192, 3, GGML_F32},
    // meta-llama/Llama-3.1-8B
    {"llama-3.1-8b", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 131072, 0, 500000, 1e-5f, 8, 1, 4, 8192, 8, GGML_F32},
    // meta-llama/Llama-3.1-70B
    {"llama-3.1-70b", "llama", 80, 8192, 64, 8, 128, 28672, 128256, 131072, 0, 500000, 1e-5f, 8, 1, 4, 8192, 70, GGML_F32},
    // Qwen/Qwen2.5-7B: QKV bias, untied, max_position_embeddings 131072
    {"qwen2.5-7b", "qwen2", 28, 3584, 28, 4, 128, 18944, 152064, 131072, 0, 1000000, 1e-6f, 0, 0, 0, 0, 7, GGML_F32},
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

// float -> IEEE half, round to nearest (normal range; the scales here are 1e-6 .. 1)
static uint16_t to_f16(float v) {
    uint32_t b;
    memcpy(&b, &v, 4);
    uint32_t sign = (b >> 16) & 0x8000, exp = (b >> 23) & 0xff, man = b & 0x7fffff;
    int e = (int)exp - 127 + 15;
    if (e <= 0) {   // an f16 subnormal: m * 2^-24, m = (1.man * 2^(exp - 127)) * 2^24 rounded to even
        int shift = 126 - (int)exp;
        if (shift > 24) return (uint16_t)sign;
        uint32_t full = man | 0x800000u, m = full >> shift, rest = full & ((1u << shift) - 1);
        uint32_t halfway = 1u << (shift - 1);
        if (rest > halfway || (rest == halfway && (m & 1))) m++;
        return (uint16_t)(sign | m);   // m may round up to 0x400, the smallest normal: still right
    }
    if (e >= 31) return (uint16_t)(sign | 0x7bff);
    uint32_t h = sign | (uint32_t)e << 10 | man >> 13;
    if ((man & 0x1fff) > 0x1000 || ((man & 0x1fff) == 0x1000 && (h & 1))) h++;
    return (uint16_t)h;
}

static void put16(uint8_t *p, uint16_t h) { p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8); }

// Standard deviations of the block values per unit scale with uniform random digits:
//   Q4_0 (q-8)*d: 4.61 d; Q5_0 (q-16)*d: 9.23 d; Q4_1/Q5_1 the same with m = -7.5 d / -15.5 d;
//   Q8_0 q*d: 73.9 d; Q4_K d*sc*q - dmin*m (sc, m uniform 0..63, dmin = 7.5 d): 263 d;
//   Q5_K (dmin = 15.5 d): 523 d; Q6_K d*sc*(q-32), sc uniform int8: 1369 d.
int synth_blocks(uint32_t type, void *dst, size_t rows, size_t cols, uint64_t seed, uint64_t tensor,
                 float std) {
    uint64_t be = dq_block_elems(type), bb = dq_block_bytes(type);
    if (!be || !dq_supported(type) || type == GGML_F32 || cols % be) return -1;
    size_t nblocks = rows * (cols / be);
    uint8_t *out = dst;
    uint64_t key = synth_mix(seed ^ (tensor * 0xd1b54a32d192ed03ULL) ^ 0x5eedb10c5ULL);
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < nblocks; k++) {
        uint8_t *b = out + k * bb;
        for (uint64_t j = 0; j < bb; j += 8) {
            uint64_t h = synth_mix(key + k * 64 + j / 8);
            for (uint64_t t = 0; t < 8 && j + t < bb; t++) b[j + t] = (uint8_t)(h >> (8 * t));
        }
        float u = synth_uniform(seed, tensor, k);
        switch (type) {
        case GGML_F16: put16(b, to_f16(std * 1.7320508f * u)); break;
        case GGML_BF16: {
            float v = std * 1.7320508f * u;
            uint32_t x;
            memcpy(&x, &v, 4);
            put16(b, (uint16_t)(x >> 16));
            break;
        }
        case GGML_Q4_0: put16(b, to_f16(std / 4.61f)); break;
        case GGML_Q5_0: put16(b, to_f16(std / 9.23f)); break;
        case GGML_Q8_0: put16(b, to_f16(std / 73.9f)); break;
        case GGML_Q4_1: put16(b, to_f16(std / 4.61f)), put16(b + 2, to_f16(-7.5f * std / 4.61f)); break;
        case GGML_Q5_1: put16(b, to_f16(std / 9.23f)), put16(b + 2, to_f16(-15.5f * std / 9.23f)); break;
        case GGML_Q4_K: put16(b, to_f16(std / 263)), put16(b + 2, to_f16(7.5f * std / 263)); break;
        case GGML_Q5_K: put16(b, to_f16(std / 523)), put16(b + 2, to_f16(15.5f * std / 523)); break;
        case GGML_Q6_K: put16(b + 208, to_f16(std / 1369)); break;
        }
    }
    return 0;
}
