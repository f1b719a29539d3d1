// qgemm/qgemm_amx.c — prefill products on Intel AMX tiles (bf16 x bf16 -> fp32), see qgemm.h.
//
//   out (n, o) = x (n, in) @ W (o, in)^T, W in any block type dq_to_f32 reads.
//
// Each thread takes blocks of WB weight rows, dequantises them exactly to fp32 and rounds them to
// bf16 (row-major: an A tile is 16 weight rows x 32 columns, loaded straight from that buffer);
// the activations are rounded to bf16 once per call and packed in the tiles' pair layout (a B tile
// is 16 k-pairs x 16 tokens). One TDPBF16PS multiplies 16 x 32 by 32 x 16 into a 16 x 16 fp32
// tile; 2 x 2 blocks of C tiles (32 weight rows x 32 tokens) run over `in` in passes of KC
// columns, accumulating in fp32, and the block's results are transposed into out. No per-block scale reaches the inner loop: the block scales are inside
// the bf16 weights. Error against the fp32 product of the dequantised weights: the two bf16
// roundings (relative 2^-9 each, per element) and fp32 summation — tests/test_qgemm.c bounds it.
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../util/check.h"
#include "../weights/dequant.h"
#include "../weights/gguf.h"
#include "qgemm.h"

#define WB 64   // weight rows per unit of work (dequantised once, multiplied with every token)

// cpuid: AMX-TILE (leaf 7 edx 24), AMX-BF16 (edx 22), AVX-512 BF16 (leaf 7.1 eax 5) for the
// conversions; the OS saves tile state (XCR0 bits 17, 18) and grants this process its use
// (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16+).
int q_amx_available(void) {
    static int known = -1;
    if (known >= 0) return known;
    unsigned a, b, c, d, a1 = 0, b1, c1, d1;
    known = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 24 & 1) || !(d >> 22 & 1)) return 0;
    if (!__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) || !(a1 >> 5 & 1)) return 0;
    unsigned xlo, xhi;
    __asm__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0x60000) != 0x60000) return 0;
    const long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 0;
    return known = 1;
}

#define AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c,amx-tile,amx-bf16")))

// palette 1: tiles 0-3 the C block, 4-5 A (weights), 6-7 B (tokens); every tile 16 rows x 64 bytes
typedef struct __attribute__((packed, aligned(64))) {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

// A constant in memory: ldtilecfg reads it through a pointer the compiler cannot see into, so a
// local struct's stores could be dropped as dead.
static const tile_config TILES = {.palette = 1,
                                  .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
                                  .rows = {16, 16, 16, 16, 16, 16, 16, 16}};

AMX static void tiles_configure(void) { _tile_loadconfig(&TILES); }

// 16 floats -> 16 bf16, round to nearest even
AMX static inline __m256i bf16x16(const float *f) {
    return (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(f));
}

// Q4_K row -> bf16: per 32-element sub-block y = (d sc) q - dmin m in fp32 (as dq_to_f32), then
// rounded; 32 elements per step.
AMX static void q4_k_row_bf16(const uint8_t *b, int cols, uint16_t *dst) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    for (int i = 0; i < cols; i += 256, b += 144) {
        uint16_t h[2];
        memcpy(h, b, 4);
        const float d = _cvtsh_ss(h[0]), dmin = _cvtsh_ss(h[1]);
        for (int j = 0; j < 8; j++, dst += 32) {
            int sc, m;
            dq_k4_scale_min(b + 4, j, &sc, &m);
            const __m512 d1 = _mm512_set1_ps(d * (float)sc), m1 = _mm512_set1_ps(dmin * (float)m);
            __m256i q = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (j / 2)));
            q = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(q, 4) : q, lo4);
            __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(q)));
            __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(q, 1)));
            __m512 y0 = _mm512_sub_ps(_mm512_mul_ps(d1, f0), m1), y1 = _mm512_sub_ps(_mm512_mul_ps(d1, f1), m1);
            _mm512_storeu_si512(dst, (__m512i)_mm512_cvtne2ps_pbh(y1, y0));
        }
    }
}

// Q6_K row -> bf16: y = (d sc) (q - 32) per 16 elements, q's low 4 bits from ql, high 2 from qh
// (in each half of 128: element 32k + l takes ql[l + 32 (k % 2)] >> 4 (k / 2) and qh[l] >> 2k).
AMX static void q6_k_row_bf16(const uint8_t *b, int cols, uint16_t *dst) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F), lo2 = _mm256_set1_epi8(0x03);
    const __m512i off = _mm512_set1_epi32(32);
    for (int i = 0; i < cols; i += 256, b += 210) {
        uint16_t h;
        memcpy(&h, b + 208, 2);
        const float d = _cvtsh_ss(h);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int half = 0; half < 2; half++) {
            const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
            __m256i hv = _mm256_loadu_si256((const __m256i *)qh);
            for (int k = 0; k < 4; k++, dst += 32) {
                __m256i l = _mm256_loadu_si256((const __m256i *)(ql + 32 * (k % 2)));
                l = _mm256_and_si256(k / 2 ? _mm256_srli_epi16(l, 4) : l, lo4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hv, 2 * k), lo2);
                __m256i q = _mm256_or_si256(l, _mm256_slli_epi16(hi, 4));
                int g = 8 * half + 2 * k;   // the 16-element groups of elements 32k .. 32k + 31
                __m512 f0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(q)), off));
                __m512 f1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(q, 1)), off));
                __m512 y0 = _mm512_mul_ps(_mm512_set1_ps(d * (float)sc[g]), f0);
                __m512 y1 = _mm512_mul_ps(_mm512_set1_ps(d * (float)sc[g + 1]), f1);
                _mm512_storeu_si512(dst, (__m512i)_mm512_cvtne2ps_pbh(y1, y0));
            }
        }
    }
}

// One weight row (cols elements of `type`) -> bf16; f: cols floats of scratch.
AMX static void row_to_bf16(uint32_t type, const uint8_t *row, int cols, float *f, uint16_t *dst) {
    if (type == GGML_Q4_K || type == GGML_Q6_K) {
        (type == GGML_Q4_K ? q4_k_row_bf16 : q6_k_row_bf16)(row, cols, dst);
        return;
    }
    dq_to_f32(type, row, f, (uint64_t)cols);
    for (int k = 0; k < cols; k += 16) _mm256_storeu_si256((__m256i *)(dst + k), bf16x16(f + k));
}

// 16 x 16 dwords: dst row c (stride ds) = src column c (src rows at stride ss)
AMX static inline void transpose16(const uint32_t *src, size_t ss, uint32_t *dst, size_t ds) {
    __m512i r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(src + i * ss);
    for (int i = 0; i < 8; i++) {   // per 128-bit lane: pairs of rows interleaved
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {   // r[4i + j], lane L: rows 4i..4i+3 of column 4L + j
        r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int j = 0; j < 4; j++) {   // a 4 x 4 transpose of 128-bit lanes
        __m512i a = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88), b = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xdd);
        __m512i c = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88), d = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xdd);
        _mm512_storeu_si512(dst + j * ds, _mm512_shuffle_i32x4(a, c, 0x88));
        _mm512_storeu_si512(dst + (4 + j) * ds, _mm512_shuffle_i32x4(b, d, 0x88));
        _mm512_storeu_si512(dst + (8 + j) * ds, _mm512_shuffle_i32x4(a, c, 0xdd));
        _mm512_storeu_si512(dst + (12 + j) * ds, _mm512_shuffle_i32x4(b, d, 0xdd));
    }
}

// x (n, in) -> xb: per block of 16 tokens, in/2 rows of 16 (token) x 2 (k, k+1) bf16; tokens past
// n are zero. rows: 16 in bf16 of scratch per thread.
AMX static void pack_tokens(uint32_t *xb, const float *x, int n, int in, int nb, uint16_t *rows) {
#pragma omp parallel for
    for (int tb = 0; tb < nb; tb++) {
        uint32_t *blk = xb + (size_t)tb * (in / 2) * 16;
        uint16_t *row = rows + (size_t)omp_get_thread_num() * 16 * in;
        for (int t = 0; t < 16; t++) {
            int i = tb * 16 + t;
            if (i < n)
                for (int k = 0; k < in; k += 16)
                    _mm256_storeu_si256((__m256i *)(row + (size_t)t * in + k), bf16x16(x + (size_t)i * in + k));
            else
                memset(row + (size_t)t * in, 0, (size_t)in * 2);
        }
        for (int kp = 0; kp < in / 2; kp += 16)
            transpose16((const uint32_t *)row + kp, (size_t)in / 2, blk + (size_t)kp * 16, 16);
    }
}

// C block (32 weight rows x 32 tokens, fp32, at c with row stride ldc floats) += A (32 weight
// rows at a, row stride in) x B (token blocks b0, b1) over columns [k0, k1); first: C starts at 0.
AMX static inline void block_2x2(const uint16_t *a, const uint32_t *b0, const uint32_t *b1, int in,
                                 int k0, int k1, float *c, size_t ldc, int first) {
    const size_t sc = ldc * 4, sa = (size_t)in * 2;
    if (first) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    } else {
        _tile_loadd(0, c, sc);
        _tile_loadd(1, c + 16, sc);
        _tile_loadd(2, c + 16 * ldc, sc);
        _tile_loadd(3, c + 16 * ldc + 16, sc);
    }
    for (int k = k0; k < k1; k += 32) {
        _tile_loadd(4, a + k, sa);
        _tile_loadd(5, a + 16 * (size_t)in + k, sa);
        _tile_loadd(6, b0 + (size_t)k / 2 * 16, 64);
        _tile_loadd(7, b1 + (size_t)k / 2 * 16, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, sc);
    _tile_stored(1, c + 16, sc);
    _tile_stored(2, c + 16 * ldc, sc);
    _tile_stored(3, c + 16 * ldc + 16, sc);
}

// Columns per pass over a weight block's tokens: the pass's slice of the packed tokens (KC x
// tokens x 2 bytes) stays in L2 and each 32-row slice of weights (32 KiB) in L1, instead of every
// 2 x 2 block streaming all of `in` of both from further out; the fp32 C blocks are reloaded per
// pass (1 KiB per tile per KC / 32 products of 16 x 16 x 32).
#define KC 512

AMX void q_matmul_amx(float *out, const float *x, int n, int in, uint32_t type, const void *w,
                      size_t row_bytes, int o, q_scratch *sc) {
    CHECK_INTERNAL(in % 32 == 0 && dq_supported(type), "q_matmul_amx: type %u, %d columns", type, in);
    int nb = (n + 31) / 32 * 2;   // token blocks of 16, an even count
    size_t np = (size_t)nb * 16;  // tokens, padded
    size_t xb_bytes = np * in * 2;
    int nt = omp_get_max_threads();
    size_t wb_bytes = (size_t)WB * in * 2, f_bytes = (size_t)in * 4, acc_bytes = WB * np * 4;
    size_t per = wb_bytes + f_bytes + acc_bytes, rows_bytes = (size_t)nt * 16 * in * 2;
    uint8_t *buf = q_scratch_get(sc, xb_bytes + (size_t)nt * per + rows_bytes + 64);
    uint32_t *xb = (uint32_t *)(((uintptr_t)buf + 63) & ~(uintptr_t)63);
    pack_tokens(xb, x, n, in, nb, (uint16_t *)((uint8_t *)xb + xb_bytes + (size_t)nt * per));
    uint8_t *per_thread = (uint8_t *)xb + xb_bytes;
    int n_wblk = (o + WB - 1) / WB;
#pragma omp parallel
    {
        uint8_t *mine = per_thread + (size_t)omp_get_thread_num() * per;
        uint16_t *wb = (uint16_t *)mine;
        float *f = (float *)(mine + wb_bytes), *acc = f + in;   // acc (WB, np): weight row major
        tiles_configure();
#pragma omp for schedule(static)
        for (int blk = 0; blk < n_wblk; blk++) {
            int r0 = blk * WB, nr = o - r0 < WB ? o - r0 : WB;
            for (int r = 0; r < WB; r++) {
                uint16_t *dst = wb + (size_t)r * in;
                if (r >= nr) {
                    memset(dst, 0, (size_t)in * 2);
                    continue;
                }
                row_to_bf16(type, (const uint8_t *)w + (size_t)(r0 + r) * row_bytes, in, f, dst);
            }
            for (int k0 = 0; k0 < in; k0 += KC) {
                int k1 = in - k0 < KC ? in : k0 + KC;
                for (int m = 0; m < nr; m += 32)
                    for (int tb = 0; tb < nb; tb += 2)
                        block_2x2(wb + (size_t)m * in, xb + (size_t)tb * (in / 2) * 16,
                                  xb + (size_t)(tb + 1) * (in / 2) * 16, in, k0, k1,
                                  acc + (size_t)m * np + (size_t)tb * 16, np, k0 == 0);
            }
            // acc[feature][token] -> out[token][feature], 16 x 16 at a time
            for (int m = 0; m < nr; m += 16)
                for (int t0 = 0; t0 < n; t0 += 16) {
                    const float *src = acc + (size_t)m * np + t0;
                    float *dst = out + (size_t)t0 * o + r0 + m;
                    int tmax = n - t0 < 16 ? n - t0 : 16, mmax = nr - m < 16 ? nr - m : 16;
                    if (tmax == 16 && mmax == 16)
                        transpose16((const uint32_t *)src, np, (uint32_t *)dst, (size_t)o);
                    else
                        for (int t = 0; t < tmax; t++)
                            for (int j = 0; j < mmax; j++) dst[(size_t)t * o + j] = src[(size_t)j * np + t];
                }
        }
        _tile_release();
    }
}

// The tiles' peak on all threads: four independent TDPBF16PS (16 x 16 x 32 each) per step on
// tiles that never leave the unit (no loads), timed over `steps`. TFLOP/s.
AMX double q_amx_peak_tflops(int steps) {
    double t0 = omp_get_wtime();
    int nt = 1;
#pragma omp parallel
    {
#pragma omp single
        nt = omp_get_num_threads();
        tiles_configure();
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        _tile_zero(4);
        _tile_zero(5);
        _tile_zero(6);
        _tile_zero(7);
        for (int i = 0; i < steps; i++) {
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        _tile_release();
    }
    return 2.0 * 16 * 16 * 32 * 4 * (double)steps * nt / (omp_get_wtime() - t0) / 1e12;
}
