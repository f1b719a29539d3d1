// backend/sample.h — token sampling: repetition penalties on the logits (OpenAI's frequency and
// presence penalties), then greedy (temp <= 0), else top-k -> top-p -> min-p -> temperature ->
// draw, with a seeded generator (same seed, same tokens).
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define SAMPLE_FN __host__ __device__ static inline
#else
#define SAMPLE_FN static inline
#endif

// PCG32 (O'Neill): 64-bit LCG state, xorshift-rotate output; *state advances. The host's sampler
// and the device's (backend/sample_cuda.cu) draw with this one function.
SAMPLE_FN uint32_t sample_pcg32(uint64_t *state) {
    uint64_t old = *state;
    *state = old * 6364136223846793005ULL + 1442695040888963407ULL;
    uint32_t xs = (uint32_t)(((old >> 18u) ^ old) >> 27u), rot = (uint32_t)(old >> 59u);
    return (xs >> rot) | (xs << ((-rot) & 31));
}

typedef struct {
    float temp;     // <= 0: greedy
    int top_k;      // <= 0: off
    float top_p;    // >= 1: off
    float min_p;    // <= 0: off
    uint64_t seed;
    // OpenAI's penalties (0: off): before anything else, logit[j] -= c[j] * freq_pen +
    // (c[j] > 0) * pres_pen, c[j] = how often this sampler has drawn token j so far. The device
    // sampler does not take them (the host draws such rows).
    float freq_pen, pres_pen;
} sample_params;

typedef struct {
    sample_params p;
    uint64_t state;  // PCG32 state
    struct sample_cand { float logit; int id; } *cand;
    uint64_t *keys;  // the radix sort's keys, their copy and its counts (top-k off; NULL until used)
    int n_vocab;
    int *counts;     // penalties on: draws per token so far (else NULL)
    float *pen;      // penalties on: the penalised row
} sampler;

void sampler_init(sampler *s, const sample_params *p, int n_vocab);
void sampler_free(sampler *s);
int sample_argmax(const float *logits, int n);
// The next token from logits (n_vocab,); with penalties, counted as drawn.
int sample_next(sampler *s, const float *logits);
// Whether s applies penalties (then only sample_next may draw for it).
static inline int sample_penalised(const sample_params *p) { return p->freq_pen != 0 || p->pres_pen != 0; }
// Uniform float in [0, 1) from the sampler's generator.
float sample_uniform(sampler *s);
// Advances the generator as one sample_next draw does: for a token drawn elsewhere from its state
// (the device's twin of sample_next, sample_cuda.cu; never for a penalised sampler).
void sample_skip(sampler *s);
// KL(softmax(lp) || softmax(lq)) of two logit rows (n,), in double (>= 0).
double sample_kl(const float *lp, const float *lq, int n);
