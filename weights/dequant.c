// weights/dequant.c — ggml block formats -> fp32, bit-exact with ggml's reference
// dequantisation (same fp32 operations in the same order). Block layouts are little-endian:
//   Q4_0 {f16 d; u8 qs[16]}             y = (q - 8) * d
//   Q4_1 {f16 d, m; u8 qs[16]}          y = q * d + m
//   Q5_0 {f16 d; u8 qh[4]; u8 qs[16]}   y = (q - 16) * d      (5th bit of element j: qh bit j)
//   Q5_1 {f16 d, m; u8 qh[4]; qs[16]}   y = q * d + m
//   Q8_0 {f16 d; i8 qs[32]}             y = q * d
//   Q4_K {f16 d, dmin; u8 scales[12]; u8 qs[128]}             y = (d*sc) * q - (dmin*m)
//   Q5_K {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}  y = (d*sc) * q - (dmin*m)
//   Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}        y = (d*sc) * (q - 32)
// In the 32-element formats the low nibble of qs[j] is element j, the high nibble element j+16.
// Exactness does not hinge on FMA contraction: an f16 scale (11 significant bits) times a 6-bit
// scale and a 4/5-bit quant is exact in fp32, so each output is one rounding of the exact value
// whatever the compiler fuses (Q6_K's (d*sc)*q: d*sc is exact, one rounding). Checked
// bit-for-bit for every format by tests/test_dequant.py.
#include "dequant.h"

#include <string.h>

#include "gguf.h"

#define QK 32    // elements per block of the 32-element formats
#define QK_K 256 // elements per K-quant super-block

typedef void (*dq_fn)(const uint8_t *src, float *y, uint64_t n_blocks);

typedef struct {
    uint32_t type;
    uint32_t block_elems, block_bytes;
    dq_fn fn; // NULL: size known (the file can be read) but not convertible
} dq_format;

float dq_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) { // inf / nan (payload kept)
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) { // normal: rebias 15 -> 127
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else { // zero / subnormal: man * 2^-24, exact in fp32
        float f = (float)man * 0x1p-24f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

float dq_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

static float rd_f16(const uint8_t *p) {
    return dq_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

static void dq_f32(const uint8_t *src, float *y, uint64_t n) {
    memcpy(y, src, n * sizeof(float));
}

static void dq_f16(const uint8_t *src, float *y, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) y[i] = rd_f16(src + 2 * i);
}

static void dq_bf16(const uint8_t *src, float *y, uint64_t n) {
    for (uint64_t i = 0; i < n; i++, src += 2)
        y[i] = dq_bf16_to_f32((uint16_t)(src[0] | (src[1] << 8)));
}

static void dq_q8_0(const uint8_t *b, float *y, uint64_t nb) {
    for (uint64_t i = 0; i < nb; i++, b += 34, y += QK) {
        const float d = rd_f16(b);
        const int8_t *qs = (const int8_t *)(b + 2);
        for (int j = 0; j < QK; j++) y[j] = qs[j] * d;
    }
}

static void dq_q4_0(const uint8_t *b, float *y, uint64_t nb) {
    for (uint64_t i = 0; i < nb; i++, b += 18, y += QK) {
        const float d = rd_f16(b);
        const uint8_t *qs = b + 2;
        for (int j = 0; j < QK / 2; j++) {
            y[j] = ((qs[j] & 0xF) - 8) * d;
            y[j + QK / 2] = ((qs[j] >> 4) - 8) * d;
        }
    }
}

static void dq_q4_1(const uint8_t *b, float *y, uint64_t nb) {
    for (uint64_t i = 0; i < nb; i++, b += 20, y += QK) {
        const float d = rd_f16(b), m = rd_f16(b + 2);
        const uint8_t *qs = b + 4;
        for (int j = 0; j < QK / 2; j++) {
            y[j] = (qs[j] & 0xF) * d + m;
            y[j + QK / 2] = (qs[j] >> 4) * d + m;
        }
    }
}

// 5-bit quants: low 4 bits from qs (nibble order as Q4_0), bit 4 of element j is bit j of qh.
static void unpack_q5(const uint8_t *qh4, const uint8_t *qs, int q[QK]) {
    uint32_t qh = (uint32_t)qh4[0] | (uint32_t)qh4[1] << 8 | (uint32_t)qh4[2] << 16 |
                  (uint32_t)qh4[3] << 24;
    for (int j = 0; j < QK / 2; j++) {
        q[j] = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
        q[j + QK / 2] = (qs[j] >> 4) | (((qh >> (j + QK / 2)) & 1) << 4);
    }
}

static void dq_q5_0(const uint8_t *b, float *y, uint64_t nb) {
    int q[QK];
    for (uint64_t i = 0; i < nb; i++, b += 22, y += QK) {
        const float d = rd_f16(b);
        unpack_q5(b + 2, b + 6, q);
        for (int j = 0; j < QK; j++) y[j] = (q[j] - 16) * d;
    }
}

static void dq_q5_1(const uint8_t *b, float *y, uint64_t nb) {
    int q[QK];
    for (uint64_t i = 0; i < nb; i++, b += 24, y += QK) {
        const float d = rd_f16(b), m = rd_f16(b + 2);
        unpack_q5(b + 4, b + 8, q);
        for (int j = 0; j < QK; j++) y[j] = q[j] * d + m;
    }
}

// 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes of Q4_K / Q5_K.
void dq_k4_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Q4_K: 8 sub-blocks of 32; each 64 elements take 32 bytes of qs (low nibbles, then high).
static void dq_q4_k(const uint8_t *b, float *y, uint64_t nb) {
    for (uint64_t i = 0; i < nb; i++, b += 144) {
        const float d = rd_f16(b), dmin = rd_f16(b + 2);
        const uint8_t *scales = b + 4, *qs = b + 16;
        for (int j = 0; j < 8; j++, y += 32) {
            int sc, m;
            dq_k4_scale_min(scales, j, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            const uint8_t *q = qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            for (int l = 0; l < 32; l++) y[l] = d1 * ((q[l] >> shift) & 0xF) - m1;
        }
    }
}

// Q5_K: as Q4_K, plus bit 4 of element l of sub-block j is bit j of qh[l].
static void dq_q5_k(const uint8_t *b, float *y, uint64_t nb) {
    for (uint64_t i = 0; i < nb; i++, b += 176) {
        const float d = rd_f16(b), dmin = rd_f16(b + 2);
        const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + 48;
        for (int j = 0; j < 8; j++, y += 32) {
            int sc, m;
            dq_k4_scale_min(scales, j, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            const uint8_t *q = qs + 32 * (j / 2);
            const int shift = 4 * (j % 2);
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> shift) & 0xF) | (((qh[l] >> j) & 1) << 4);
                y[l] = d1 * v - m1;
            }
        }
    }
}

// Q6_K: two halves of 128; in each, element l + 32*k (k = 0..3) takes its low 4 bits from
// ql[l] (k even) or ql[l+32] (k odd) — low nibble for k < 2, high for k >= 2 — and its top
// 2 bits from qh[l] >> 2k. Scale index: 16-element group.
static void dq_q6_k(const uint8_t *b, float *y, uint64_t nb) {
    for (uint64_t i = 0; i < nb; i++, b += 210) {
        const float d = rd_f16(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        const uint8_t *ql = b, *qh = b + 128;
        for (int half = 0; half < 2; half++, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int k = 0; k < 4; k++) {
                const uint8_t *lo = ql + 32 * (k % 2);
                const int shift = 4 * (k / 2);
                for (int l = 0; l < 32; l++) {
                    int q = (((lo[l] >> shift) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4)) - 32;
                    y[32 * k + l] = d * sc[2 * k + l / 16] * q;
                }
            }
        }
    }
}

static const dq_format formats[] = {
    {GGML_F32, 1, 4, dq_f32},        {GGML_F16, 1, 2, dq_f16},
    {GGML_BF16, 1, 2, dq_bf16},      {GGML_Q4_0, QK, 18, dq_q4_0},
    {GGML_Q4_1, QK, 20, dq_q4_1},    {GGML_Q5_0, QK, 22, dq_q5_0},
    {GGML_Q5_1, QK, 24, dq_q5_1},    {GGML_Q8_0, QK, 34, dq_q8_0},
    {GGML_Q2_K, QK_K, 84, NULL},     {GGML_Q3_K, QK_K, 110, NULL},
    {GGML_Q4_K, QK_K, 144, dq_q4_k}, {GGML_Q5_K, QK_K, 176, dq_q5_k},
    {GGML_Q6_K, QK_K, 210, dq_q6_k},
};

static const dq_format *find_format(uint32_t type) {
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (formats[i].type == type) return &formats[i];
    return NULL;
}

int dq_supported(uint32_t type) {
    const dq_format *f = find_format(type);
    return f && f->fn;
}

uint64_t dq_block_elems(uint32_t type) {
    const dq_format *f = find_format(type);
    return f ? f->block_elems : 0;
}

uint64_t dq_block_bytes(uint32_t type) {
    const dq_format *f = find_format(type);
    return f ? f->block_bytes : 0;
}

uint64_t dq_bytes(uint32_t type, uint64_t n) {
    const dq_format *f = find_format(type);
    uint64_t bytes;
    if (!f || n % f->block_elems) return 0;
    if (__builtin_mul_overflow(n / f->block_elems, (uint64_t)f->block_bytes, &bytes)) return 0;
    return bytes;
}

int dq_to_f32(uint32_t type, const void *src, float *dst, uint64_t n) {
    const dq_format *f = find_format(type);
    if (!f || !f->fn || n % f->block_elems) return -1;
    f->fn(src, dst, n / f->block_elems);
    return 0;
}
