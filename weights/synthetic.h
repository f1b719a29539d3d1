// weights/synthetic.h — seeded synthetic weights at named real-model shapes (`-m synthetic:NAME`),
// for measuring speed at real scale where no weight file can be brought. Element i of tensor t is
// a pure function of (seed, t, i), computed identically on the host (C) and on a GPU (CUDA), so a
// GPU backend can generate its weights in place and still match the CPU backend bit for bit.
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define SYNTH_FN __host__ __device__ static inline
#else
#define SYNTH_FN static inline
#endif

// splitmix64 finaliser: a well-mixed 64-bit hash of x.
SYNTH_FN uint64_t synth_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

// Uniform in [-1, 1) with 24-bit resolution: exact in fp32, the same on every device.
SYNTH_FN float synth_uniform(uint64_t seed, uint64_t tensor, uint64_t i) {
    uint64_t h = synth_mix(synth_mix(seed ^ (tensor * 0xd1b54a32d192ed03ULL)) + i);
    return (float)(h >> 40) * (1.0f / 8388608.0f) - 1.0f;
}
