// weights/dequant.h — ggml block formats -> fp32. Supports F32, F16, BF16, Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1, Q4_K, Q5_K, Q6_K. Each row of a tensor is a whole number of blocks.
#pragma once
#include <stddef.h>
#include <stdint.h>

int dq_supported(uint32_t type);               // 1 if dq_to_f32 handles it
uint64_t dq_block_elems(uint32_t type);        // elements per block (1 for F32/F16/BF16), 0 unknown
uint64_t dq_block_bytes(uint32_t type);        // bytes per block, 0 unknown
// Bytes of n elements (n must be a multiple of the block size); 0 when not representable.
uint64_t dq_bytes(uint32_t type, uint64_t n);
// Dequantise n elements (multiple of block size) of `type` from src into dst. Returns 0 or -1.
int dq_to_f32(uint32_t type, const void *src, float *dst, uint64_t n);
float dq_f16_to_f32(uint16_t h);
// The 6-bit scale and min of sub-block j (0..7) from the 12 packed scale bytes of a Q4_K / Q5_K
// super-block.
void dq_k4_scale_min(const uint8_t *scales, int j, int *sc, int *m);
float dq_bf16_to_f32(uint16_t h);
