// tests/test_kvcache.c — KV cache row types (weights/kvrow.h) and the CPU readers of typed caches.
//   conversions: f32 -> f16 against the CPU's own F16C instruction (round to nearest even) on
//     every exponent, subnormals and overflow included; f32 -> bf16 against the nearer of the two
//     bf16 neighbours found in double (ties to the even one); hand-made ties.
//   q8_0 rows: GGUF's layout read byte by byte (per 32 elements an f16 scale, then 32 int8), the
//     scale max|x|/127 to f16 rounding, every element within d/2.
//   append / keep round trips on the CPU backend, byte counts by hand.
//   the softmax's exp: exp8_nonpos lane for lane bit-identical to exp_nonpos, and exp_nonpos
//     within 1e-6 relative of double exp on [-87, 0] (the eps_p below relies on it), 0 below.
//   attention (decode and prefill, GQA, masks), attn_probs and attn_select of each type against a
//     float64 attention of the unrounded inputs, within a bound derived below from the types'
//     rounding, with planted faults (q8_0 scales shifted by one block; keys stored as f16 but
//     read as bf16) that the same check must catch.
//
// The bound. Stored keys are k' = k + e_k, values v' = v + e_v, with per element
//   bf16: |e| <= 2^-8 |x|    (8 significant bits, round to nearest: half of the spacing 2^-7 at 1)
//   f16:  |e| <= 2^-11 |x| + 2^-25   (11 significant bits; below 2^-14 subnormals, absolute
//         spacing 2^-24, half of it 2^-25; these inputs stay far below the overflow at 65520)
//   q8_0: |e| <= d/2, d the block's stored scale <= (max|x|/127)(1 + 2^-11) + 2^-25 (the scale
//         itself rounded to f16)
// A score s_j = q.k_j / sqrt(hd) moves by at most delta_j = sum_c |q_c| e_k[j][c] / sqrt(hd); add
// the float arithmetic of the dot product, gamma_j = (hd + 2) 2^-24 sum_c |q_c| (|k_c| + e_k) /
// sqrt(hd). With D = max_j (delta_j + gamma_j) over the visible keys, softmax moves each
// probability by a factor within [e^-2D, e^2D] (p'_j = p_j e^d_j / sum_i p_i e^d_i), so
// |p'_j - p_j| <= p_j (e^2D - 1); float exp (exp_nonpos: < 1.3e-7 relative, plus roundings) and
// the float normalisation over m terms add a relative eps_p = 1e-6 + (m + 2) 2^-24 per
// probability. The output o_c = sum_j p_j v_jc then moves by at most
//   (e^2D (1 + eps_p)^2 - 1 + (m + 2) 2^-24) sum_j p_j (|v_jc| + e_v[j][c]) + sum_j p_j e_v[j][c]
// (the last factor's (m + 2) 2^-24: the float sum of m products). p_j: the float64 reference's.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../attn/attn.h"
#include "../backend/backend.h"
#include "../kv/kv.h"
#include "../weights/dequant.h"
#include "../util/fastexp.h"
#include "../weights/kvrow.h"
#include "check.h"

static uint32_t rng = 12345;
static uint32_t next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 17, rng ^= rng << 5;
    return rng;
}
static double unif(void) { return (next_u32() >> 8) / 16777216.0 * 2 - 1; }   // [-1, 1)

static float from_bits(uint32_t b) {
    float f;
    memcpy(&f, &b, 4);
    return f;
}

// ---- conversions ----

// the bf16 nearest to x by distance in double; ties to the even bf16 (NaN, inf: skipped)
static uint16_t bf16_nearest(float x) {
    uint32_t b;
    memcpy(&b, &x, 4);
    uint32_t lo = b & 0xffff0000u, hi = lo + 0x10000u;   // the two neighbours (same sign)
    double dl = fabs((double)x - from_bits(lo)), dh = fabs((double)from_bits(hi) - x);
    if (dl < dh) return (uint16_t)(lo >> 16);
    if (dh < dl) return (uint16_t)(hi >> 16);
    return (uint16_t)(((lo >> 16) & 1) ? hi >> 16 : lo >> 16);
}

static void test_conversions(void) {
    int bad16 = 0, badbf = 0;
    for (int i = 0; i < 2000000; i++) {
        // every exponent: random bit patterns, finite only
        uint32_t b = next_u32();
        float x = from_bits(b);
        if (!isfinite(x)) continue;
        uint16_t hw = (uint16_t)_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        if (kv_f32_to_f16(x) != hw && bad16++ < 5)
            fprintf(stderr, "f16 of %a: %04x, F16C %04x\n", x, kv_f32_to_f16(x), hw);
        if (fabsf(x) < 3e38f && kv_f32_to_bf16(x) != bf16_nearest(x) && badbf++ < 5)
            fprintf(stderr, "bf16 of %a: %04x, nearest %04x\n", x, kv_f32_to_bf16(x), bf16_nearest(x));
    }
    CHECK(bad16 == 0, "%d f16 conversions differ from F16C", bad16);
    CHECK(badbf == 0, "%d bf16 conversions are not the nearest", badbf);
    // hand-made: ties go to the even neighbour, overflow, subnormals
    CHECK(kv_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80, "bf16 tie down to 1");
    CHECK(kv_f32_to_bf16(1.0f + 3 * 0x1p-8f) == 0x3f82, "bf16 tie up to 1 + 2^-6");
    CHECK(kv_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00, "f16 tie down to 1");
    CHECK(kv_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02, "f16 tie up to 1 + 2^-9");
    CHECK(kv_f32_to_f16(65519.0f) == 0x7bff && kv_f32_to_f16(65520.0f) == 0x7c00, "f16 overflow");
    CHECK(kv_f32_to_f16(0x1p-24f) == 0x0001 && kv_f32_to_f16(0x1p-25f) == 0x0000 &&
          kv_f32_to_f16(3 * 0x1p-25f) == 0x0002, "f16 subnormals (ties to even)");
    // the row encoder (F16C 8 at a time, then the scalar tail) gives kv_f32_to_f16's bits
    {
        float x[67];
        uint16_t h[67];
        int bad = 0;
        for (int rep = 0; rep < 20000; rep++) {
            for (int i = 0; i < 67; i++) do x[i] = from_bits(next_u32()); while (!isfinite(x[i]));
            kv_row_encode(KV_F16, h, x, 67);
            for (int i = 0; i < 67; i++) bad += h[i] != kv_f32_to_f16(x[i]);
        }
        CHECK(bad == 0, "%d f16 row elements differ from kv_f32_to_f16", bad);
    }
    // the decoders invert the encoders on representable values
    float row[64], back[64];
    uint16_t enc[64];
    for (int i = 0; i < 64; i++) row[i] = dq_f16_to_f32((uint16_t)(next_u32() & 0x7bff));
    kv_row_encode(KV_F16, enc, row, 64);
    kv_row_decode(KV_F16, back, enc, 64);
    CHECK(memcmp(row, back, sizeof row) == 0, "f16 row round trip");
    for (int i = 0; i < 64; i++) row[i] = dq_bf16_to_f32((uint16_t)(next_u32() & 0x7f7f));
    kv_row_encode(KV_BF16, enc, row, 64);
    kv_row_decode(KV_BF16, back, enc, 64);
    CHECK(memcmp(row, back, sizeof row) == 0, "bf16 row round trip");
}

// the per-element bound on |stored - x| (the derivation at the top) for the row x (hd,)
static void elem_bounds(enum kv_type t, const float *x, int hd, double *e) {
    for (int c = 0; c < hd; c++) {
        switch (t) {
        case KV_F32: e[c] = 0; break;
        case KV_BF16: e[c] = 0x1p-8 * fabs(x[c]); break;
        case KV_F16: e[c] = 0x1p-11 * fabs(x[c]) + 0x1p-25; break;
        case KV_Q8_0: {
            int b0 = c / 32 * 32;
            double amax = 0;
            for (int i = b0; i < b0 + 32; i++) amax = fmax(amax, fabs(x[i]));
            e[c] = ((amax / 127) * (1 + 0x1p-11) + 0x1p-25) / 2;
            break;
        }
        }
    }
}

static void test_q8_layout(void) {
    const int hd = 96;   // three blocks; rows padded to 4 bytes: 3 * 34 = 102 -> 104
    CHECK(kv_row_bytes(KV_Q8_0, hd) == 104 && kv_row_bytes(KV_Q8_0, 64) == 68 &&
          kv_row_bytes(KV_Q8_0, 48) == 0 && kv_row_bytes(KV_BF16, 64) == 128 &&
          kv_row_bytes(KV_F16, 3) == 8 && kv_row_bytes(KV_F32, 64) == 256, "row bytes");
    float x[96], y[96];
    double e[96];
    for (int c = 0; c < hd; c++) x[c] = (float)(unif() * (1 + 5 * (c / 32)));   // blocks differ
    x[40] = 0;   // a zero inside a block
    uint8_t row[104];
    kv_row_encode(KV_Q8_0, row, x, hd);
    kv_row_decode(KV_Q8_0, y, row, hd);
    elem_bounds(KV_Q8_0, x, hd, e);
    int bad = 0;
    for (int b = 0; b < 3; b++) {
        const uint8_t *p = row + 34 * b;   // GGUF Q8_0: f16 d, then 32 int8
        float d = dq_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
        double amax = 0;
        for (int i = 0; i < 32; i++) amax = fmax(amax, fabs(x[32 * b + i]));
        CHECK(fabs(d - amax / 127) <= 0x1p-11 * amax / 127, "block %d scale %g vs %g", b, d, amax / 127);
        for (int i = 0; i < 32; i++) {
            float v = d * (float)(int8_t)p[2 + i];
            bad += v != y[32 * b + i] || fabs(v - x[32 * b + i]) > d / 2 ||
                   fabs(v - x[32 * b + i]) > e[32 * b + i];
        }
    }
    CHECK(bad == 0, "%d q8_0 elements off the layout or beyond d/2", bad);
    CHECK(y[40] == 0, "zero stays zero");
}

// ---- the cache through the CPU backend ----

static void *bk_alloc(void *ctx, size_t n) { backend *b = ctx; return b->alloc(b, n); }
static void bk_free(void *ctx, void *p) { backend *b = ctx; b->free(b, p); }

// a one-layer cache of types kt, vt holding K, V (hkv, len, hd) at positions pos (len,), appended
// in two batches
static kv_cache *make_cache(backend *bk, enum kv_type kt, enum kv_type vt, const float *K,
                            const float *V, const int *pos, int len, int cap, int hkv, int hd) {
    char err[256];
    kv_cache *kv = kv_create_typed(1, hkv, hd, &cap, bk->elem_bytes, kt, vt, bk_alloc, bk_free, bk,
                                   err, sizeof err);
    CHECK(kv != NULL, "%s", err);
    float *kin = malloc(sizeof(float) * len * hkv * hd), *vin = malloc(sizeof(float) * len * hkv * hd);
    for (int i = 0; i < len; i++)   // (n, hkv, hd), as the forward pass appends
        for (int g = 0; g < hkv; g++) {
            memcpy(kin + ((size_t)i * hkv + g) * hd, K + ((size_t)g * len + i) * hd, sizeof(float) * hd);
            memcpy(vin + ((size_t)i * hkv + g) * hd, V + ((size_t)g * len + i) * hd, sizeof(float) * hd);
        }
    int a = len / 3;
    bk->kv_append(bk, &kv->layers[0], kin, vin, pos, a);
    bk->kv_append(bk, &kv->layers[0], kin + (size_t)a * hkv * hd, vin + (size_t)a * hkv * hd, pos + a,
                  len - a);
    free(kin);
    free(vin);
    return kv;
}

static void test_append_keep(backend *bk) {
    const int hkv = 2, hd = 64, len = 11, cap = 13;
    for (int kt = 0; kt < KV_N_TYPES; kt++) {
        int vt = (kt + 1) % KV_N_TYPES;   // K and V of different types
        float *K = malloc(sizeof(float) * hkv * len * hd), *V = malloc(sizeof(float) * hkv * len * hd);
        int pos[11];
        for (int i = 0; i < len; i++) pos[i] = 100 + 3 * i;
        for (int i = 0; i < hkv * len * hd; i++) K[i] = (float)(unif() * 4), V[i] = (float)unif();
        kv_cache *kv = make_cache(bk, kt, vt, K, V, pos, len, cap, hkv, hd);
        kv_layer *L = &kv->layers[0];
        size_t kr = kv_row_bytes(kt, hd), vr = kv_row_bytes(vt, hd);
        CHECK(L->len == len && L->k_row == kr && L->v_row == vr, "layer %d/%d", kt, vt);
        CHECK(kv_bytes(kv) == (size_t)hkv * cap * (kr + vr), "kv_bytes %zu", kv_bytes(kv));
        CHECK(kv_bytes_for(1, hkv, hd, &cap, kt, vt) == (size_t)hkv * cap * (kr + vr + sizeof(int)),
              "kv_bytes_for");
        // every stored row decodes to within the type's bound of what was appended
        int bad = 0;
        float y[64];
        double e[64];
        for (int g = 0; g < hkv; g++)
            for (int i = 0; i < len; i++) {
                const float *k = K + ((size_t)g * len + i) * hd, *v = V + ((size_t)g * len + i) * hd;
                kv_row_decode(kt, y, (char *)L->k + ((size_t)g * cap + i) * kr, hd);
                elem_bounds(kt, k, hd, e);
                for (int c = 0; c < hd; c++) bad += fabs(y[c] - k[c]) > e[c];
                kv_row_decode(vt, y, (char *)L->v + ((size_t)g * cap + i) * vr, hd);
                elem_bounds(vt, v, hd, e);
                for (int c = 0; c < hd; c++) bad += fabs(y[c] - v[c]) > e[c];
                bad += L->pos[g * cap + i] != pos[i];
            }
        CHECK(bad == 0, "types %d/%d: %d stored elements beyond the bound", kt, vt, bad);
        // keep: per head other entries; the rows move as stored, byte for byte
        char *k0 = malloc((size_t)hkv * cap * kr), *v0 = malloc((size_t)hkv * cap * vr);
        memcpy(k0, L->k, (size_t)hkv * cap * kr);
        memcpy(v0, L->v, (size_t)hkv * cap * vr);
        int idx[2 * 4] = {0, 3, 4, 10, 1, 2, 7, 9}, new_cap = 6;
        bk->kv_keep(bk, L, idx, 4, new_cap);
        bad = 0;
        for (int g = 0; g < hkv; g++)
            for (int j = 0; j < 4; j++) {
                int s = idx[g * 4 + j];
                bad += memcmp((char *)L->k + ((size_t)g * new_cap + j) * kr, k0 + ((size_t)g * cap + s) * kr, kr) != 0;
                bad += memcmp((char *)L->v + ((size_t)g * new_cap + j) * vr, v0 + ((size_t)g * cap + s) * vr, vr) != 0;
                bad += L->pos[g * new_cap + j] != pos[s];
            }
        CHECK(bad == 0 && L->len == 4 && L->cap == new_cap, "keep %d/%d: %d rows moved wrong", kt, vt, bad);
        CHECK(kv_bytes(kv) == (size_t)hkv * new_cap * (kr + vr), "kv_bytes after keep");
        free(k0), free(v0), free(K), free(V);
        kv_free(kv);
    }
    // by hand: 2 KV heads, head_dim 64, capacities 10 and 4, K q8_0 (68 bytes) and V bf16 (128)
    int caps[2] = {10, 4};
    CHECK(kv_bytes_for(2, 2, 64, caps, KV_Q8_0, KV_BF16) == 2 * 14 * (68 + 128 + 4), "by hand");
    CHECK(kv_bytes_for(2, 2, 64, caps, KV_F32, KV_F32) == 2 * 14 * (256 + 256 + 4), "by hand f32");
    char err[200];
    CHECK(kv_create_typed(1, 1, 48, caps, 4, KV_Q8_0, KV_F32, bk_alloc, bk_free, bk, err, sizeof err) == NULL &&
          strstr(err, "multiple of 32"), "q8_0 refuses head_dim 48: %s", err);
}

// float64 attention of the unrounded K, V (hkv, len, hd): out (n, heads, hd) and probabilities
// p (n, heads, len); the bound of each output element (top of file) in bnd (n, heads, hd)
static void ref_and_bound(const float *q, const int *qpos, int n, int heads, const float *K,
                          const float *V, const int *kpos, int len, int hkv, int hd, enum kv_type kt,
                          enum kv_type vt, double *out, double *p, double *bnd, double *pbnd) {
    int group = heads / hkv;
    double scale = 1 / sqrt(hd), *ek = malloc(sizeof(double) * len * hd),
           *ev = malloc(sizeof(double) * len * hd), *s = malloc(sizeof(double) * len);
    for (int g = 0; g < hkv; g++) {
        for (int j = 0; j < len; j++) {
            elem_bounds(kt, K + ((size_t)g * len + j) * hd, hd, ek + (size_t)j * hd);
            elem_bounds(vt, V + ((size_t)g * len + j) * hd, hd, ev + (size_t)j * hd);
        }
        for (int h = g * group; h < (g + 1) * group; h++)
            for (int i = 0; i < n; i++) {
                const float *qi = q + ((size_t)i * heads + h) * hd;
                double mx = -INFINITY, sum = 0, D = 0;
                int m = 0;
                for (int j = 0; j < len; j++) {
                    s[j] = -INFINITY;
                    if (kpos[j] > qpos[i]) continue;
                    const float *kj = K + ((size_t)g * len + j) * hd;
                    double d = 0, dl = 0, ga = 0;
                    for (int c = 0; c < hd; c++) {
                        d += (double)qi[c] * kj[c];
                        dl += fabs(qi[c]) * ek[(size_t)j * hd + c];
                        ga += fabs(qi[c]) * (fabs(kj[c]) + ek[(size_t)j * hd + c]);
                    }
                    s[j] = d * scale;
                    D = fmax(D, (dl + (hd + 2) * 0x1p-24 * ga) * scale);
                    mx = fmax(mx, s[j]);
                    m = j + 1;
                }
                double *pi = p + ((size_t)i * heads + h) * len;
                for (int j = 0; j < len; j++) sum += s[j] == -INFINITY ? 0 : exp(s[j] - mx);
                for (int j = 0; j < len; j++) pi[j] = s[j] == -INFINITY ? 0 : exp(s[j] - mx) / sum;
                double eps_p = 1e-6 + (m + 2) * 0x1p-24;
                double f = exp(2 * D) * (1 + eps_p) * (1 + eps_p) - 1;
                pbnd[(size_t)i * heads + h] = f;
                for (int c = 0; c < hd; c++) {
                    double o = 0, a = 0, b = 0;
                    for (int j = 0; j < len; j++) {
                        const double vj = V[((size_t)g * len + j) * hd + c], e = ev[(size_t)j * hd + c];
                        o += pi[j] * vj;
                        a += pi[j] * (fabs(vj) + e);
                        b += pi[j] * e;
                    }
                    size_t at = ((size_t)i * heads + h) * hd + c;
                    out[at] = o;
                    bnd[at] = (f + (m + 2) * 0x1p-24) * a + b;
                }
            }
    }
    free(ek), free(ev), free(s);
}

enum plant { PLANT_NONE, PLANT_Q8_SCALE_SHIFT, PLANT_F16_AS_BF16 };
static int case_hd = 64;   // head_dim of attn_case (a multiple of 8: the x86 decode kernel)

// attention of n queries over len cached entries of types kt/vt against the float64 reference;
// returns the elements (outputs and probabilities) beyond their bounds. plant: a fault put into
// the cache (or its reading) first.
static long attn_case(backend *bk, enum kv_type kt, enum kv_type vt, int n, int len, enum plant plant,
                      double *worst) {
    const int heads = 6, hkv = 2, hd = case_hd;
    int group = heads / hkv;
    float *K = malloc(sizeof(float) * hkv * len * hd), *V = malloc(sizeof(float) * hkv * len * hd);
    float *q = malloc(sizeof(float) * n * heads * hd), *out = malloc(sizeof(float) * n * heads * hd);
    float *probs = malloc(sizeof(float) * n * heads * len);
    double *ref = malloc(sizeof(double) * n * heads * hd), *bnd = malloc(sizeof(double) * n * heads * hd);
    double *p = malloc(sizeof(double) * n * heads * len), *pbnd = malloc(sizeof(double) * n * heads);
    int *kpos = malloc(sizeof(int) * len), *qpos = malloc(sizeof(int) * n);
    for (int j = 0; j < len; j++) kpos[j] = 2 * j;   // positions with gaps
    for (int i = 0; i < n; i++) qpos[i] = n == 1 ? 2 * len : 2 * (len - n) + 2 * i + (i & 1);
    // keys and values whose 32-element blocks differ in size (as real K/V channels do), so a
    // scale read from the wrong block is visible
    for (int g = 0; g < hkv; g++)
        for (int j = 0; j < len; j++)
            for (int c = 0; c < hd; c++) {
                size_t at = ((size_t)g * len + j) * hd + c;
                K[at] = (float)(unif() * (c < 32 ? 1.0 : 6.0));
                V[at] = (float)(unif() * (c < 32 ? 3.0 : 0.5));
            }
    for (int i = 0; i < n * heads * hd; i++) q[i] = (float)unif();
    kv_cache *kv = make_cache(bk, kt, vt, K, V, kpos, len, len, hkv, hd);
    kv_layer *L = &kv->layers[0];
    if (plant == PLANT_Q8_SCALE_SHIFT)   // each row's block 0 takes block 1's scale
        for (int r = 0; r < hkv * len; r++) {
            uint8_t *row = (uint8_t *)L->k + (size_t)r * L->k_row;
            memcpy(row, row + 34, 2);
        }
    if (plant == PLANT_F16_AS_BF16) L->k_type = KV_BF16;   // f16 bytes read as bf16
    ref_and_bound(q, qpos, n, heads, K, V, kpos, len, hkv, hd, kt, vt, ref, p, bnd, pbnd);
    bk->attention(bk, out, q, qpos, n, heads, L);
    bk->attn_probs(bk, probs, q, qpos, n, heads, L, len);
    long bad = 0;
    for (int i = 0; i < n * heads * hd; i++) {
        double err = fabs(out[i] - ref[i]);
        bad += !(err <= bnd[i]);
        if (worst) *worst = fmax(*worst, err / bnd[i]);
    }
    for (int r = 0; r < n * heads; r++)
        for (int j = 0; j < len; j++) {
            size_t at = (size_t)r * len + j;
            bad += !(fabs(probs[at] - p[at]) <= p[at] * pbnd[r] + 1e-30);
        }
    // attn_select (no completion) of a decode row over a selection: the readers of typed rows
    // there must give what the fp32 kernel gives on the rows as decoded
    if (n == 1 && plant == PLANT_NONE) {
        int n_sel = len / 3, *sel = malloc(sizeof(int) * heads * n_sel);
        for (int h = 0; h < heads; h++)
            for (int j = 0; j < n_sel; j++) sel[h * n_sel + j] = (j * 3 + h) % len;
        float *o2 = malloc(sizeof(float) * heads * hd), *o3 = malloc(sizeof(float) * heads * hd);
        bk->attn_select(bk, o2, q, heads, L, sel, n_sel, 0, NULL);
        // the same selection in float64 on the unrounded K, V, within the bound's form
        long sbad = 0;
        for (int h = 0; h < heads; h++) {
            int g = h / group;
            double s[512], mx = -INFINITY, sum = 0, D = 0, ek[64], ev[64];
            for (int j = 0; j < n_sel; j++) {
                const float *kj = K + ((size_t)g * len + sel[h * n_sel + j]) * hd;
                elem_bounds(kt, kj, hd, ek);
                double d = 0, dl = 0, ga = 0;
                for (int c = 0; c < hd; c++) {
                    d += (double)q[h * hd + c] * kj[c];
                    dl += fabs(q[h * hd + c]) * ek[c];
                    ga += fabs(q[h * hd + c]) * (fabs(kj[c]) + ek[c]);
                }
                s[j] = d / sqrt(hd);
                D = fmax(D, (dl + (hd + 2) * 0x1p-24 * ga) / sqrt(hd));
                mx = fmax(mx, s[j]);
            }
            for (int j = 0; j < n_sel; j++) sum += exp(s[j] - mx);
            double f = exp(2 * D) * (1 + 1e-6 + (n_sel + 2) * 0x1p-24) * (1 + 1e-6 + (n_sel + 2) * 0x1p-24) - 1;
            for (int c = 0; c < hd; c++) {
                double o = 0, a = 0, b = 0;
                for (int j = 0; j < n_sel; j++) {
                    const float *vj = V + ((size_t)g * len + sel[h * n_sel + j]) * hd;
                    elem_bounds(vt, vj, hd, ev);
                    double pj = exp(s[j] - mx) / sum;
                    o += pj * vj[c], a += pj * (fabs(vj[c]) + ev[c]), b += pj * ev[c];
                }
                sbad += !(fabs(o2[h * hd + c] - o) <= (f + (n_sel + 2) * 0x1p-24) * a + b);
            }
        }
        CHECK(sbad == 0, "attn_select %s/%s: %ld outputs beyond the bound", kv_type_name(kt),
              kv_type_name(vt), sbad);
        free(sel), free(o2), free(o3);
    }
    kv_free(kv);
    free(K), free(V), free(q), free(out), free(probs), free(ref), free(bnd), free(p), free(pbnd);
    free(kpos), free(qpos);
    return bad;
}

static void test_attention(backend *bk) {
    // decode (one row, GQA groups read each key once), a short prefill (loops) and a prefill of
    // 150 rows over 300 keys (sgemm over tiles of 64 keys, masks by position)
    const int shapes[3][2] = {{1, 200}, {5, 40}, {150, 300}};
    for (int kt = 0; kt < KV_N_TYPES; kt++)
        for (int vt = 0; vt < KV_N_TYPES; vt++) {
            if (kt != vt && !(kt == KV_Q8_0 && vt == KV_F16) && !(kt == KV_F16 && vt == KV_Q8_0))
                continue;   // each type alone, and one mixed pair each way
            for (int s = 0; s < 3; s++) {
                double worst = 0;
                long bad = attn_case(bk, kt, vt, shapes[s][0], shapes[s][1], PLANT_NONE, &worst);
                CHECK(bad == 0, "%s/%s n %d len %d: %ld elements beyond the bound (worst %.3g of it)",
                      kv_type_name(kt), kv_type_name(vt), shapes[s][0], shapes[s][1], bad, worst);
                if (s == 2) printf("  K %-4s V %-4s: worst error %.3f of the derived bound\n",
                                   kv_type_name(kt), kv_type_name(vt), worst);
            }
        }
    // head_dim 36 (not a multiple of 8): the portable decode loop, bf16 and f16
    case_hd = 36;
    for (int t = KV_BF16; t <= KV_F16; t++)
        for (int s = 0; s < 2; s++) {
            long bad = attn_case(bk, t, t, shapes[s][0], shapes[s][1], PLANT_NONE, NULL);
            CHECK(bad == 0, "hd 36 %s n %d: %ld elements beyond the bound", kv_type_name(t),
                  shapes[s][0], bad);
        }
    // head_dim 40 (eight columns past the x86 kernel's 16-column steps) and odd key counts (the
    // scores' last key alone): decode and a short prefill
    case_hd = 40;
    for (int t = KV_BF16; t <= KV_F16; t++)
        for (int s = 0; s < 3; s++) {   // (n 7 and 6: query groups of 4 + 3 and 4 + 2 rows)
            long bad = attn_case(bk, t, t, (int[]){1, 7, 6}[s], (int[]){77, 41, 30}[s], PLANT_NONE, NULL);
            CHECK(bad == 0, "hd 40 %s n %d: %ld elements beyond the bound", kv_type_name(t), (int[]){1, 7, 6}[s], bad);
        }
    case_hd = 64;
    // planted faults: the same check fails
    for (int s = 0; s < 3; s += 2) {
        long bad = attn_case(bk, KV_Q8_0, KV_Q8_0, (int[]){1, 0, 150}[s], (int[]){200, 0, 300}[s],
                             PLANT_Q8_SCALE_SHIFT, NULL);
        CHECK(bad > 0, "planted: q8_0 scales shifted by one block were not caught");
        bad = attn_case(bk, KV_F16, KV_F16, (int[]){1, 0, 150}[s], (int[]){200, 0, 300}[s],
                        PLANT_F16_AS_BF16, NULL);
        CHECK(bad > 0, "planted: f16 keys read as bf16 were not caught");
    }
}

// ---- the softmax's exp ----


static void test_exp(void) {
    enum { N = 1 << 20 };
    static float x[N + 16];
    int k = 0;
    const float special[] = {-INFINITY, NAN, -1000.0f, -87.0f, -86.99999f, -0.0f, 0.0f, -1e-30f, -1e-7f,
                             -0.34657359f, -0.6931472f, -1.0f, -20.0f, -86.5f, -87.00001f, -88.0f};
    for (int i = 0; i < 16; i++) x[k++] = special[i];
    for (int i = 0; i < N; i++) x[k++] = (float)(-100.0 * i / N);   // (includes whole multiples of ln 2's neighbours)
    long diff = 0, far = 0;
    double worst = 0;
    for (int i = 0; i + 8 <= k; i += 8) {
        float v[8];
#if defined(__AVX2__)
        _mm256_storeu_ps(v, exp8_nonpos(_mm256_loadu_ps(x + i)));
#else
        for (int l = 0; l < 8; l++) v[l] = exp_nonpos(x[i + l]);
#endif
        for (int l = 0; l < 8; l++) {
            const float e = exp_nonpos(x[i + l]);
            uint32_t a, b;
            memcpy(&a, &v[l], 4), memcpy(&b, &e, 4);
            diff += a != b;
            const double ref = x[i + l] > -87.0f ? exp((double)x[i + l]) : 0.0, rel = ref > 0 ? fabs(e - ref) / ref : fabs(e);
            if (rel > worst) worst = rel;
            far += !(rel <= 1e-6);
        }
    }
    CHECK(diff == 0, "exp8_nonpos differs from exp_nonpos in %ld of %d lanes", diff, k);
    CHECK(far == 0, "exp_nonpos: %ld values beyond 1e-6 relative of exp (worst %.3g)", far, worst);
}

int main(void) {
    backend *bk = backend_cpu_create(2, BK_WEIGHTS_F32);
    test_exp();
    test_conversions();
    test_q8_layout();
    test_append_keep(bk);
    test_attention(bk);
    bk->destroy(bk);
    return check_summary("test_kvcache");
}
