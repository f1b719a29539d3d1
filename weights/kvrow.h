// weights/kvrow.h — how a KV cache stores one row (head_dim elements): fp32, bf16, f16 or q8_0
// (GGUF's Q8_0 blocks: per 32 elements an fp16 scale d = max|x|/127 and 32 int8, 34 bytes).
// The cache (kv/, backend/kv_cpu.c) encodes on append; the CPU attention kernels (attn/) decode
// one row (decode steps) or one tile of rows (prefill) at a time into scratch that stays in L1/L2,
// never an fp32 copy of the cache.
#pragma once
#include <stddef.h>
#include <stdint.h>

enum kv_type { KV_F32 = 0, KV_BF16 = 1, KV_F16 = 2, KV_Q8_0 = 3 };
#define KV_N_TYPES 4

// "f32" | "bf16" | "f16" | "q8_0"
const char *kv_type_name(enum kv_type t);
// The type named s (case-insensitive), or -1.
int kv_type_parse(const char *s);
// Bytes of one stored row of hd elements; rows of q8_0 are padded to a multiple of 4 bytes (a
// row of a cache then stays a whole number of fp32 units, which the backend's row copies move).
// 0 when hd does not fit the type (q8_0: hd a multiple of 32; all: hd > 0).
size_t kv_row_bytes(enum kv_type t, int hd);
// dst (one row) = src (hd,) in type t: bf16/f16 round to nearest even (f16: overflow to inf,
// subnormals kept), q8_0: d = max|x|/127 rounded to f16, q = round(x / d).
void kv_row_encode(enum kv_type t, void *dst, const float *src, int hd);
// dst (hd,) = the fp32 values of one stored row
void kv_row_decode(enum kv_type t, float *dst, const void *src, int hd);
// n consecutive rows (row stride kv_row_bytes) decoded to dst (n, hd)
void kv_rows_decode(enum kv_type t, float *dst, const void *src, int n, int hd);
// The conversions themselves (round to nearest even), for the tests' independent checks.
uint16_t kv_f32_to_bf16(float x);
uint16_t kv_f32_to_f16(float x);
