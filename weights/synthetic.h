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

// ---- named shapes and host-side generation (C linkage, usable from CUDA C++ too) ----
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif

#define SYNTH_PREFIX "synthetic:"   // -m synthetic:NAME[@SEED]

// A published model's shape (the config.json numbers); weights are made up from `seed`.
typedef struct synth_shape {
    const char *name;
    const char *arch;        // "llama" | "qwen2" (QKV bias)
    int n_layer, d_model, n_head, n_kv_head, head_dim, d_ff, vocab, ctx_len;
    int tied;                // LM head = token embedding
    double rope_theta;
    float rms_eps;
    // "llama3" RoPE scaling; factor 0 = none
    float rope_factor, rope_low, rope_high;
    int rope_orig_ctx;
    uint64_t seed;
    uint32_t wtype;          // enum ggml_type of the 2-D weights (GGML_F32 = fp32 values; else
                             // random blocks of that type, `sift bench --wtype`)
} synth_shape;

// Tensor ids: token embedding 0, final norm 1, LM head 2; layer l's tensor k is
// SYNTH_LAYER_BASE * (l + 1) + k, k in the order attn_norm q k v o ffn_norm gate up down bq bk bv.
#define SYNTH_LAYER_BASE 16

// Parses "synthetic:NAME" or "synthetic:NAME@SEED" into out; 0, or -1 with a one-line err that
// lists the known names.
int synth_parse(const char *spec, synth_shape *out, char *err, size_t errlen);
// The known names, comma separated.
const char *synth_names(void);
// dst[i] = offset + scale * synth_uniform(seed, tensor, i) for i < n (OpenMP threads).
void synth_fill(float *dst, size_t n, uint64_t seed, uint64_t tensor, float scale, float offset);
// rows x cols elements of block type `type` (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
// Q6_K) into dst (rows * dq_bytes(type, cols) bytes): every byte from the hash of (seed, tensor,
// byte index), then each block's scale fields set so the values have mean ~0 and standard
// deviation ~std (uniform digits; the formulas are in synthetic.c). Real-shape speed tests only:
// not the fp32 values synth_fill makes. 0, or -1 for a type it does not make.
int synth_blocks(uint32_t type, void *dst, size_t rows, size_t cols, uint64_t seed, uint64_t tensor,
                 float std);
#ifdef __cplusplus
}
#endif
