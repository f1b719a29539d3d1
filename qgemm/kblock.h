// qgemm/kblock.h — pieces of K-quant blocks that several kernels of this room decode alike (the row
// kernels and the unpacking of qgemm_cpu.c, the VNNI GEMM's weight units in qgemm_vnni.c), on
// AVX2 + F16C: x86-64-v3, the build's floor.
#pragma once
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

// The 6-bit scales and mins of a Q4_K / Q5_K super-block as two 8-byte vectors (dq_k4_scale_min's
// rule on 32-bit words: bytes 0-3 hold sc0-3 and the top bits of sc4-7, 4-7 m0-3 and the top
// bits of m4-7, 8-11 the low nibbles of sc4-7 | m4-7).
static inline void k_scales8(const uint8_t *s, uint64_t *sc, uint64_t *mn) {
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4), memcpy(&w1, s + 4, 4), memcpy(&w2, s + 8, 4);
    uint32_t sc_lo = w0 & 0x3f3f3f3fu, m_lo = w1 & 0x3f3f3f3fu;
    uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 6) & 0x03030303u) << 4;
    uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 6) & 0x03030303u) << 4;
    *sc = sc_lo | (uint64_t)sc_hi << 32;
    *mn = m_lo | (uint64_t)m_hi << 32;
}

// 8 unsigned bytes -> 8 floats
static inline __m256 u8x8_to_ps(uint64_t v) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)v)));
}

// The 6-bit values of elements 32k .. 32k+31 (k = 0..3) of one half (128 elements) of a Q6_K
// super-block, from the half's ql bytes l0 = ql[0..32), l1 = ql[32..64) and qh bytes hb: the low
// nibbles of l0 / l1 (k = 0, 1) or their high nibbles (k = 2, 3), with bits 2k, 2k+1 of hb on top.
static inline __m256i q6k_u32(__m256i l0, __m256i l1, __m256i hb, int k) {
    const __m256i lo4 = _mm256_set1_epi8(0x0F), lo2 = _mm256_set1_epi8(0x03);
    __m256i lo = k % 2 ? l1 : l0;
    if (k >= 2) lo = _mm256_srli_epi16(lo, 4);
    return _mm256_or_si256(_mm256_and_si256(lo, lo4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * k), lo2), 4));
}
