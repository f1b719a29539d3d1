// qgemm/qgemm.h — matrix products on weights kept in their GGUF block encoding (CPU backend).
// Activations are quantised per row in blocks of 32 to two 8-bit digits: with the block's step
// d = max|x| / 127, q = round(x / d) and l = round((x - q d) 256 / d) (clamped to +-127), so
// x ~ (256 q + l) d / 256 within d / 256 — 16-bit precision carried by int8 arithmetic. Each
// weight row is unpacked to unsigned 8-bit values u with an fp32 scale s and offset m per
// 16-element group, w = s*u + m, which represents every supported block type exactly (Q4_0:
// u = q, m = -8s; Q8_0: u = q + 128, m = -128s; Q6_K: m = -32s; K-quants: s = d*sc,
// m = -dmin*min). The products u*q and u*l are summed in int32 (AVX-512 VNNI vpdpbusd twice,
// combined as 256 hi + lo, exact; AVX2 vpmaddwd on the 16-bit digits; or scalar), then fp32:
//   y = sum_g s_g (d_g / 256) sum_{i in g} u_i (256 q_i + l_i) + sum_g m_g a_g
// with a_g = (d_g / 256) sum_{i in g} (256 q_i + l_i). The only error against the fp32 product of
// the dequantised weights is the activations' rounding: |y - y_f32| <= sum_i |w_i| d_blk(i) / 256
// (plus fp32 summation error), the bound tests/test_qgemm.c checks. Why two digits, not one as
// llama.cpp's Q8 activations: bench/RESULTS.md (one digit moved perplexity and flipped greedy
// answers of the default model; the second costs little at decode, which reads weights).
// The most used types (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) have fused kernels that read the blocks
// directly, AVX-512 (vpdpbusd) and AVX2 (the digits joined into int16, vpmaddwd); the others
// unpack a row to (u, s, m) first. On AVX-512, Q4_K and Q6_K take one activation step per
// 256-block instead of 32 (q_act_block): the same two digits, so their sub-block scales apply in
// int32 (vpmaddubsw, vpdpwssd) and the fp32 fix-up runs once per super-block, not per 4 products
// (bench/RESULTS.md: 8.5 % less CPU per decoded token on the 1B shape); the bound above then
// holds with that block's d. Q4_K's rows go 16 at a time there (q4k_strip): the strip's blocks
// are transposed on the fly so that each vector lane holds one weight row, one vpdpbusd per digit
// adds 4 products to each of the 16 rows, and a sub-block's sums meet their scale once per
// sub-block instead of once per 64 products (bench/RESULTS.md: faster at one activation row, and
// most for batched decode). The integers are the same; the fp32 sums run in another order, the
// same for every row count, so a row's result never depends on the batch it is in.
// F16/BF16 rows are converted to fp32 on the fly (F16C / shifts) and dotted with fp32 activations.
// Prefill-sized products (many rows) may instead dequantise tiles of weight rows to fp32 and
// call sgemm (exact weights), on a CPU with AMX multiply bf16 tiles (qgemm_amx.c), or on AVX-512
// VNNI multiply the activations' digits by the 8-bit weights in a register-tiled GEMM
// (qgemm_vnni.c: two digits, or one for --weights fast); q_matmul takes the path the caller names.
#pragma once
#include <stddef.h>
#include <stdint.h>

enum q_isa { Q_ISA_SCALAR = 0, Q_ISA_AVX2 = 1, Q_ISA_AVX512 = 2 };
// INT8: the row kernels on two-digit activations; INT8_1: the same kernels on the high digit
// alone (one 8-bit digit per element: llama.cpp's precision); SGEMM, AMX, VNNI, VNNI8: below.
enum q_path { Q_PATH_INT8 = 0, Q_PATH_SGEMM = 1, Q_PATH_AMX = 2, Q_PATH_VNNI = 3, Q_PATH_VNNI8 = 4,
              Q_PATH_INT8_1 = 5 };

// The best ISA this CPU runs (cpuid: AVX-512 F/BW/VL/DQ + VNNI, else AVX2 + FMA + F16C, else
// scalar), lowered by the developer tunable SIFT_ISA=scalar|avx2|avx512 (util/tunables.h; never
// raised beyond what the CPU has).
enum q_isa q_isa_pick(void);
const char *q_isa_name(enum q_isa isa);   // "scalar" | "avx2" | "avx512-vnni"
// 1 when `type` (enum ggml_type) has a product here: F32 is sgemm's, not this module's.
int q_type_supported(uint32_t type);

// A scratch arena a caller keeps across calls (grown as needed, freed with q_scratch_free).
typedef struct { void *p; size_t n; } q_scratch;
void q_scratch_free(q_scratch *s);
void *q_scratch_get(q_scratch *s, size_t n);   // at least n bytes (contents not kept)

// out (n, o) = x (n, in) @ W (o, in)^T, W = o rows of `type`, each `row_bytes` long (rows of
// whole blocks). All OpenMP threads. path: Q_PATH_INT8 (int8 / fp16 dot products),
// Q_PATH_SGEMM (tiles dequantised to fp32, cblas_sgemm) or Q_PATH_AMX (only where
// q_amx_available()).
// (qgemm/qgemm.c; a path this CPU or type lacks — VNNI without AVX-512 or on F16/BF16 — takes
// the sgemm tiles)
void q_matmul(enum q_isa isa, enum q_path path, float *out, const float *x, int n, int in,
              uint32_t type, const void *w, size_t row_bytes, int o, q_scratch *scratch);
// The int8 / fp16 row kernels (path Q_PATH_INT8 or Q_PATH_INT8_1) or the sgemm tiles
// (Q_PATH_SGEMM), which q_matmul dispatches to: qgemm_cpu.c's drivers, the kernels per ISA in
// qgemm_scalar.c, qgemm_avx2.c, qgemm_avx512.c and qgemm_strip.c (qgemm/internal.h).
void q_matmul_cpu(enum q_isa isa, enum q_path path, float *out, const float *x, int n, int in,
                  uint32_t type, const void *w, size_t row_bytes, int o, q_scratch *scratch);

// k <= Q_MULTI_MAX int8 products sharing x: out[j] (n, o[j]) = x (n, in) @ W_j (o[j], in)^T, W_j
// of type[j], on `digits` (2, or 1: Q_PATH_INT8_1's) activation digits. With fused kernels for
// every type: x quantised once and all rows in one parallel region (decode's Q/K/V and gate/up:
// fewer barriers); else k q_matmul calls.
#define Q_MULTI_MAX 4
void q_matmul_multi(enum q_isa isa, int digits, int k, float *const *out, const float *x, int n, int in,
                    const uint32_t *type, const void *const *w, const size_t *row_bytes,
                    const int *o, q_scratch *scratch);

// The activations' block on the int8 path for a type (the elements one step d covers): 32, or 256
// for Q4_K and Q6_K on AVX-512 (their kernels apply the sub-block scales in int32 and convert
// once per super-block; the same two digits, |x - x^| <= d / 256 with the 256-block's d).
int q_act_block(enum q_isa isa, uint32_t type, int in);
// 1 when the int8 row kernels take `type`'s weight rows 16 at a time on this ISA (q4k_strip: Q4_K
// on AVX-512), which beats the two-digit VNNI GEMM below 32 rows (backend/gemm_cpu.c's rule).
int q_rows_strip(enum q_isa isa, uint32_t type);
// How those 16-row blocks run; every form gives the same bits. level: where q4k_strip prefetches
// its next strip's blocks, 2 (L2, prefetcht1) or 1 (L1, prefetcht0). rows8: 1 when one activation
// row (decode) meets a block as two groups of 8 rows, each row read along its blocks (q4k_rows8),
// 0 when it goes through the strip too. Which streams faster from DRAM depends on the core
// (bench/RESULTS.md: L2 about twice L1 on AMD Zen 4, L1 1.1x L2 on Zen 5; the 8-row groups
// 1.05-1.2x the strips at the 8B shape on Zen 5), so the CPU backend times the forms once per
// process (q_strip_tune) unless the developer tunables SIFT_STRIP_PREFETCH=l1|l2 and
// SIFT_STRIP_ROWS8=on|off set them (util/tunables.h; the backend applies them by q_strip_set).
// q_strip_tune: the best time in ms of each form over one pass of a Q4_K matrix of 64 MiB or 8x
// the last-level cache, up to 256 MiB (at 2x, a 32 MiB L3 still held enough of it to favour the
// strips), one activation row -> ms[0] (strips, L1), ms[1] (strips,
// L2), ms[2] (8-row groups); keeps L1 only when it is at least 2 % faster than L2 (L2 is what the
// kernel was first measured with), the 8-row groups only when 2 % faster than the better strip,
// and returns the form kept; later calls return the first one's times and form (and set it
// again); without AVX-512, or when the matrix would take more than an eighth of the memory
// available (64 MiB at least): {0, -1}, nothing timed or changed (ms NaN).
typedef struct {
    int level, rows8;
} q_strip_form;
q_strip_form q_strip_get(void);
q_strip_form q_strip_set(q_strip_form f);   // (returns f)
q_strip_form q_strip_tune(double ms[3]);

// The activations' two-digit form, exposed for the tests: row x (cols,) -> q (2 cols,): the high
// digits, then the low ones; d (cols/32,) = max |x| / 127 / 256 of each 32-block (the unit of
// 256 q + l); a (cols/16,) = d * sum of (256 q + l) over each 16-group.
// isa Q_ISA_AVX512 runs a vector version with the same fp32 operations (bit-identical output).
void q_quantize_row(enum q_isa isa, const float *x, int cols, int8_t *q, float *d, float *a);

// One row of `cols` elements of a block type -> u (cols,) unsigned 8-bit, s and m (cols/16,):
// w = s u + m per 16-group, exact for every type q_type_supported names except F16/BF16.
void q_unpack_row(uint32_t type, const void *row, int cols, uint8_t *u, float *s, float *m);

// Intel AMX (qgemm/qgemm_amx.c): 1 when this CPU has AMX-TILE, AMX-BF16 and AVX-512 BF16 and the
// OS let this process use the tiles (asked once). q_matmul_amx: out = x @ W^T with W dequantised
// to bf16 tiles, x rounded to bf16, fp32 accumulation; for prefill-sized n (it dequantises all of
// W per call). Only when q_amx_available().
int q_amx_available(void);
double q_amx_peak_tflops(int steps);   // the tiles' bf16 peak on all threads (no memory traffic)
void q_matmul_amx(float *out, const float *x, int n, int in, uint32_t type, const void *w,
                  size_t row_bytes, int o, q_scratch *scratch);

// AVX-512 VNNI GEMM (qgemm/qgemm_vnni.c): out = x @ W^T, the weights' 8-bit form exact, int32
// accumulation per scale group; for prefill-sized n. digits 2: the activations' two digits
// (q_quantize_row) as int16, vpdpwssd — the int8 path's precision; digits 1: one 8-bit digit per
// element and 32-block (|error| <= d/2 each, d = max|x_blk| / 127: llama.cpp's Q8_0), vpdpbusd,
// twice the products per instruction. Only where q_isa_pick gives Q_ISA_AVX512 and
// q_vnni_supported(type) (the block types; not F16/BF16).
int q_vnni_supported(uint32_t type);
double q_vnni_peak_tops(int digits, int steps);   // the instruction's peak on all threads
void q_matmul_vnni(float *out, const float *x, int n, int in, uint32_t type, const void *w,
                   size_t row_bytes, int o, int digits, q_scratch *scratch);
// k <= Q_MULTI_MAX products sharing x, as q_matmul_multi: x quantised once, one parallel region.
void q_matmul_vnni_multi(int k, float *const *out, const float *x, int n, int in,
                         const uint32_t *type, const void *const *w, const size_t *row_bytes,
                         const int *o, int digits, q_scratch *scratch);
