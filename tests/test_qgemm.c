// tests/test_qgemm.c — the quantised products (qgemm/qgemm.h) against the fp32 product of the
// dequantised weights (weights/dequant.c, itself checked bit-for-bit against the gguf package by
// test_dequant.py), for every block type, on random blocks, odd row counts and column counts
// with a last odd 32-block, every ISA path this CPU has and both prefill paths.
// The bound is derived, not tuned: the int8 path's only approximation is rounding each activation
// to two 8-bit digits, x_i ~ (q_i + l_i / 256) d_b (d_b = max|x| / 127 of its 32-block; l_i the
// rounded remainder, clamped to +-127), so |x_i - x^_i| <= d_b / 256 and
//   |y - y_ref| <= sum_i |w_i| d_b(i) / 256  +  fp32 summation error,
// the latter bounded by 1e-5 sum_i |w_i x_i| (the kernels add at most a few thousand terms in
// fp32 lanes; n u with u = 6e-8 and n < 200 terms per lane). F16/BF16 and sgemm tiles convert
// the weights exactly, so only the summation term applies to them.
// That worst case is loose (errors of random sign partly cancel), so a second, statistical check
// has the teeth: the rounding errors are independent and uniform on [-d/512, d/512], variance
// (d/256)^2/12, so the mean squared error over all outputs must stay near
// sum_i w_i^2 (d_b(i)/256)^2 / 12 —
// at most 1.5x it. The outputs of one activation row share its rounding errors, so this check
// runs on 64 independent rows (the mean's relative spread is then ~18 %, 1.5x is ~3 sigma); a
// wrong scale or offset anywhere breaks it.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../qgemm/qgemm.h"
#include "../weights/dequant.h"
#include "../weights/gguf.h"
#include "../util/check.h"
#include "check.h"

static uint32_t rng_state = 12345;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 17, rng_state ^= rng_state << 5;
    return rng_state;
}
static float frnd(void) { return (float)(rnd() % 20001) / 10000.0f - 1.0f; }   // [-1, 1]

static void put_f16(uint8_t *p, float v) {   // round to f16 via F16C
    uint16_t h = (uint16_t)_cvtss_sh(v, 0);
    memcpy(p, &h, 2);
}

// One random block of `type` with finite scales (random bytes for everything else).
static void random_block(uint32_t type, uint8_t *b, size_t bytes) {
    for (size_t i = 0; i < bytes; i++) b[i] = (uint8_t)rnd();
    float d = 0.001f + 0.02f * (float)(rnd() % 1000) / 1000.0f;
    switch (type) {
    case GGML_F16: put_f16(b, frnd()); break;
    case GGML_BF16: { float v = frnd(); uint32_t u; memcpy(&u, &v, 4); b[0] = (uint8_t)(u >> 16), b[1] = (uint8_t)(u >> 24); break; }
    case GGML_Q4_0: case GGML_Q5_0: case GGML_Q8_0: put_f16(b, rnd() & 1 ? d : -d); break;
    case GGML_Q4_1: case GGML_Q5_1: put_f16(b, d), put_f16(b + 2, -8 * d * frnd()); break;
    case GGML_Q4_K: case GGML_Q5_K: put_f16(b, d / 8), put_f16(b + 2, d / 4); break;
    case GGML_Q6_K: put_f16(b + 208, d / 16); break;
    }
}

typedef struct { uint32_t type; const char *name; } type_case;
static const type_case TYPES[] = {
    {GGML_F16, "F16"},   {GGML_BF16, "BF16"}, {GGML_Q4_0, "Q4_0"}, {GGML_Q4_1, "Q4_1"},
    {GGML_Q5_0, "Q5_0"}, {GGML_Q5_1, "Q5_1"}, {GGML_Q8_0, "Q8_0"}, {GGML_Q4_K, "Q4_K"},
    {GGML_Q5_K, "Q5_K"}, {GGML_Q6_K, "Q6_K"},
};

// x (n, in) @ W (o, in)^T for one type / ISA / path against the double-precision product of the
// dequantised rows, element by element with the derived bound.
static void check_case(uint32_t type, const char *name, enum q_isa isa, enum q_path path, int n,
                       int in, int o) {
    size_t row_bytes = dq_bytes(type, (uint64_t)in), be = dq_block_elems(type),
           bb = dq_block_bytes(type);
    uint8_t *w = malloc(row_bytes * o);
    for (size_t at = 0; at < row_bytes * o; at += bb) random_block(type, w + at, bb);
    float *wf = malloc(sizeof(float) * in * o), *x = malloc(sizeof(float) * n * in),
          *y = malloc(sizeof(float) * n * o);
    for (int r = 0; r < o; r++) dq_to_f32(type, w + r * row_bytes, wf + (size_t)r * in, in);
    for (int i = 0; i < n * in; i++) x[i] = frnd() * (i % 7 == 0 ? 4.0f : 1.0f);
    for (int i = 0; i < n * o; i++) y[i] = NAN;
    q_scratch sc = {0};
    q_matmul(isa, path, y, x, n, in, type, w, row_bytes, o, &sc);
    q_scratch_free(&sc);
    // AMX: weights and activations each rounded to bf16 (8 significant bits: relative error
    // <= 2^-8 each), products summed in fp32
    int amx = path == Q_PATH_AMX;
    // VNNI8 and the one-digit row kernels: one 8-bit digit per activation (error <= d/2 each,
    // uniform: variance d^2/12)
    int one = path == Q_PATH_VNNI8 || path == Q_PATH_INT8_1;
    int exact_w = !amx && (path == Q_PATH_SGEMM || type == GGML_F16 || type == GGML_BF16);
    // the int8 path's activation block: 32, or 256 where the K-quant kernels take one step per
    // super-block (the same two digits; the bound with that block's step)
    int blk = path == Q_PATH_INT8 || path == Q_PATH_INT8_1 ? q_act_block(isa, type, in) : 32;
    int bad = 0;
    double worst = 0, mean_bound = 0, mean_mag = 0, sq_err = 0, sq_pred = 0;
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * in;
        float dblk[in / 32 + 1];
        for (int b = 0; b * blk < in; b++) {
            float amax = 0;
            for (int k = b * blk; k < b * blk + blk && k < in; k++) amax = fmaxf(amax, fabsf(xi[k]));
            dblk[b] = amax / 127.0f;
        }
        for (int r = 0; r < o; r++) {
            const float *wr = wf + (size_t)r * in;
            double ref = 0, mag = 0, rounding = 0, var = 0, sq = 0;
            for (int k = 0; k < in; k++) {
                ref += (double)wr[k] * xi[k];
                mag += fabs((double)wr[k] * xi[k]);
                sq += (double)wr[k] * xi[k] * wr[k] * xi[k];
                double step = one ? dblk[k / blk] : dblk[k / blk] / 256;
                rounding += fabs((double)wr[k]) * (one ? step / 2 : step);
                var += (double)wr[k] * wr[k] * step * step / 12;
            }
            if (amx) {   // |w^ x^ - w x| <= (2^-7 + 2^-16) |w x|; E err^2 <= sum 2 (2^-8 w x)^2
                rounding = (ldexp(1, -7) + ldexp(1, -16)) * mag;
                var = 2 * ldexp(1, -16) * sq;
            }
            double bound = (exact_w ? 0 : rounding) + 1e-5 * mag;
            double err = fabs((double)y[(size_t)i * o + r] - ref);
            if (!(err <= bound)) bad++;
            sq_err += err * err, sq_pred += exact_w ? 0 : var;
            if (getenv("QGEMM_VERBOSE") && r == 0 && i == n - 1)
                fprintf(stderr, "%s %s n=%d ratio so far %.3f\n", name, q_isa_name(isa), n, sq_err / sq_pred);
            worst = fmax(worst, err / bound);
            mean_bound += bound, mean_mag += mag;
        }
    }
    CHECK(bad == 0, "%s %s path %d n=%d in=%d o=%d: %d of %d outputs beyond the bound "
          "(worst err/bound %.3g)", name, q_isa_name(isa), path, n, in, o, bad, n * o, worst);
    if (!exact_w && n >= 64)
        CHECK(sq_err <= (amx ? 1.0 : 1.5) * sq_pred, "%s %s n=%d: mean squared error %.3g is %.2fx the rounding "
              "variance", name, q_isa_name(isa), n, sq_err / (n * o), sq_err / sq_pred);
    // the bound must say something: far below the products' magnitude (one digit: at most half
    // a step of 1/127 of the block's largest |x| per element, in this x 1/63 of the typical |x|)
    CHECK(mean_bound < (one ? 0.05 : 0.02) * mean_mag, "%s: vacuous bound (%.3g vs magnitude %.3g)", name,
          mean_bound, mean_mag);
    (void)be;
    free(w), free(wf), free(x), free(y);
}

// The activation form on a hand case: x = (i - 16) / 16 * 1.27 in the first block (max |x| =
// 1.27, step 0.01), zeros in the second.
static void test_quantize_row(void) {
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = i < 32 ? (float)(i - 16) / 16.0f * 1.27f : 0.0f;
    int8_t q[128];
    float d[2], a[4];
    q_quantize_row(Q_ISA_SCALAR, x, 64, q, d, a);
    const int8_t *lo = q + 64;
    CHECK_CLOSE(d[0], 0.01f / 256.0f, 1e-7);
    // x[31] = 15/16 * 1.27 = 1.190625 = 119 steps + 0.0625 steps: digits 119, 16. x[24] = 63.5
    // steps: 64 (ties to even), remainder -0.5 step = -128 clamped to -127: the d/256 worst case
    CHECK(q[0] == -127 && q[16] == 0 && q[31] == 119 && lo[31] == 16, "q %d %d %d lo %d", q[0],
          q[16], q[31], lo[31]);
    CHECK(d[1] == 0 && a[2] == 0 && a[3] == 0, "zero block: d %g", d[1]);
    int s0 = 0;
    for (int i = 0; i < 16; i++) s0 += 256 * q[i] + lo[i];
    CHECK_CLOSE(a[0], d[0] * s0, 1e-6);
    for (int i = 0; i < 32; i++)
        CHECK(fabsf((256.0f * q[i] + lo[i]) * d[0] - x[i]) <= 0.01f / 256 + 1e-7f, "x[%d]", i);
}

// Every ISA's activation quantiser gives the scalar one's bytes and scales exactly.
static void test_quantize_isas(enum q_isa best) {
    enum { C = 352 };
    float x[C];
    int8_t q0[2 * C], q1[2 * C];
    float d0[C / 32], d1[C / 32], a0[C / 16], a1[C / 16];
    for (int i = 0; i < C; i++) x[i] = frnd() * (i % 13 == 0 ? 50.0f : 1.0f) * (i >= 64 && i < 96 ? 0 : 1);
    q_quantize_row(Q_ISA_SCALAR, x, C, q0, d0, a0);
    for (int isa = Q_ISA_AVX2; isa <= (int)best; isa++) {
        q_quantize_row((enum q_isa)isa, x, C, q1, d1, a1);
        CHECK(memcmp(q0, q1, sizeof q0) == 0 && memcmp(d0, d1, sizeof d0) == 0 &&
              memcmp(a0, a1, sizeof a0) == 0, "quantiser %s differs from scalar", q_isa_name(isa));
    }
}

// Several products of one x (Q4_K, Q6_K, Q4_1 mixed, odd row counts) give exactly what each
// q_matmul gives alone: the same kernels on the same quantised x, only scheduled together. The
// row kernels' q_matmul_multi (N = 3), or with vnni the VNNI GEMM's (N = 7: 12 x 16 tiles; 20:
// 6 x 32), whose units run on from one matrix into the next.
static void test_multi(enum q_isa isa, int digits, int vnni, int N) {
    const enum q_path path = vnni ? (digits == 1 ? Q_PATH_VNNI8 : Q_PATH_VNNI)
                                  : digits == 1 ? Q_PATH_INT8_1 : Q_PATH_INT8;
    enum { IN = 512 };
    const uint32_t types[3] = {GGML_Q4_K, GGML_Q6_K, GGML_Q4_1};
    const int o[3] = {37, 21, 70};
    uint8_t *w[3];
    size_t rb[3];
    float *x = malloc(sizeof(float) * N * IN), *sep[3], *multi[3];
    for (int i = 0; i < N * IN; i++) x[i] = frnd();
    for (int j = 0; j < 3; j++) {
        rb[j] = dq_bytes(types[j], IN);
        w[j] = malloc(rb[j] * o[j]);
        size_t bb = dq_block_bytes(types[j]);
        for (size_t at = 0; at < rb[j] * o[j]; at += bb) random_block(types[j], w[j] + at, bb);
        sep[j] = malloc(sizeof(float) * N * o[j]);
        multi[j] = malloc(sizeof(float) * N * o[j]);
        q_scratch sc = {0};
        q_matmul(isa, path, sep[j], x, N, IN, types[j], w[j], rb[j], o[j], &sc);
        q_scratch_free(&sc);
    }
    q_scratch sc = {0};
    if (vnni) q_matmul_vnni_multi(3, multi, x, N, IN, types, (const void *const *)w, rb, o, digits, &sc);
    else q_matmul_multi(isa, digits, 3, multi, x, N, IN, types, (const void *const *)w, rb, o, &sc);
    q_scratch_free(&sc);
    for (int j = 0; j < 3; j++) {
        CHECK(memcmp(sep[j], multi[j], sizeof(float) * N * o[j]) == 0, "multi %s%s digits %d rows %d product %d",
              q_isa_name(isa), vnni ? " vnni" : "", digits, N, j);
        free(w[j]), free(sep[j]), free(multi[j]);
    }
    free(x);
}

// A batch of rows gives each row exactly what that row gives alone: the four-row kernels
// (AVX-512: Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) must do each row's arithmetic as the one-row kernel does,
// so that a batched decode step's tokens equal each sequence's alone (9 rows: two groups of four
// and one left over).
static void test_rows_alone(enum q_isa isa, enum q_path path) {
    enum { N = 9, O = 21 };   // (21 rows: a Q4_K strip of 16 and 5 rows alone)
    for (size_t t = 0; t < sizeof TYPES / sizeof *TYPES; t++) {
        uint32_t type = TYPES[t].type;
        int in = dq_block_elems(type) == 256 ? 768 : 352;
        size_t rb = dq_bytes(type, in), bb = dq_block_bytes(type);
        uint8_t *w = malloc(rb * O);
        for (size_t at = 0; at < rb * O; at += bb) random_block(type, w + at, bb);
        float *x = malloc(sizeof(float) * N * in), all[N * O], one[O];
        for (int i = 0; i < N * in; i++) x[i] = frnd();
        q_scratch sc = {0};
        q_matmul(isa, path, all, x, N, in, type, w, rb, O, &sc);
        int same = 1;
        for (int i = 0; i < N; i++) {
            q_matmul(isa, path, one, x + (size_t)i * in, 1, in, type, w, rb, O, &sc);
            same &= memcmp(one, all + (size_t)i * O, sizeof one) == 0;
        }
        q_scratch_free(&sc);
        CHECK(same, "%s %s: a row of a batch differs from the row alone", TYPES[t].name, q_isa_name(isa));
        free(w), free(x);
    }
}

// The VNNI GEMM's two-digit forms agree bit for bit: at most 16 rows take the byte tiles (each
// digit by vpdpbusd), more the int16 tiles (vpdpwssd), and packed prefill lets rows share a pass
// of either count only when both give each row the same products (forward.h: fwd_row_class).
// Rows 0..n of a 20-row call must equal an n-row call's, for n = 16 and 5, every VNNI type.
static void test_vnni_forms(void) {
    enum { N = 20, O = 30 };
    for (size_t t = 0; t < sizeof TYPES / sizeof *TYPES; t++) {
        uint32_t type = TYPES[t].type;
        if (!q_vnni_supported(type)) continue;
        int in = dq_block_elems(type) == 256 ? 768 : 352;
        size_t rb = dq_bytes(type, in), bb = dq_block_bytes(type);
        uint8_t *w = malloc(rb * O);
        for (size_t at = 0; at < rb * O; at += bb) random_block(type, w + at, bb);
        float *x = malloc(sizeof(float) * N * in), all[N * O], few[16 * O];
        for (int i = 0; i < N * in; i++) x[i] = frnd() * (i % 29 == 0 ? 30.0f : 1.0f);
        q_scratch sc = {0};
        q_matmul(Q_ISA_AVX512, Q_PATH_VNNI, all, x, N, in, type, w, rb, O, &sc);
        for (int n = 16; n >= 5; n -= 11) {
            q_matmul(Q_ISA_AVX512, Q_PATH_VNNI, few, x, n, in, type, w, rb, O, &sc);
            CHECK(memcmp(few, all, sizeof(float) * n * O) == 0, "vnni %s: %d rows differ from the same rows in %d",
                  TYPES[t].name, n, N);
        }
        q_scratch_free(&sc);
        free(w), free(x);
    }
}

// The forms of a Q4_K strip (q4k_strip prefetching to L1 or L2; one activation row through
// q4k_rows8's two groups of 8 rows; timed per machine by q_strip_tune) move no arithmetic: 1, 2
// and 4 activation rows (both digit counts) x 37 Q4_K rows (two strips and 5 rows alone) give the
// same bits in every form, and q_strip_tune keeps the form its own times name.
static void test_strip_forms(void) {
    enum { N = 4, O = 37, IN = 768 };
    const size_t rb = dq_bytes(GGML_Q4_K, IN), bb = dq_block_bytes(GGML_Q4_K);
    uint8_t *w = malloc(rb * O);
    for (size_t at = 0; at < rb * O; at += bb) random_block(GGML_Q4_K, w + at, bb);
    float x[N * IN], ref[N * O], got[N * O];
    for (int i = 0; i < N * IN; i++) x[i] = frnd();
    const q_strip_form forms[3] = {{1, 0}, {2, 1}, {1, 1}};
    q_scratch sc = {0};
    for (int digits = 2; digits >= 1; digits--)
        for (int n = 1; n <= N; n *= 2) {
            const enum q_path path = digits == 2 ? Q_PATH_INT8 : Q_PATH_INT8_1;
            q_strip_set((q_strip_form){2, 0});
            q_matmul(Q_ISA_AVX512, path, ref, x, n, IN, GGML_Q4_K, w, rb, O, &sc);
            for (int f = 0; f < 3; f++) {
                q_strip_set(forms[f]);
                q_matmul(Q_ISA_AVX512, path, got, x, n, IN, GGML_Q4_K, w, rb, O, &sc);
                CHECK(memcmp(got, ref, sizeof(float) * n * O) == 0,
                      "q4k strips: level %d rows8 %d differs from level 2 (%d digits, %d rows)", forms[f].level,
                      forms[f].rows8, digits, n);
            }
        }
    q_scratch_free(&sc);
    free(w);
    double ms[3];
    const q_strip_form t = q_strip_tune(ms);
    if (!t.level && host_mem_available() && host_mem_available() / 8 < ((size_t)64 << 20)) {
        CHECK(isnan(ms[0]) && q_strip_get().level == 2, "q_strip_tune without the memory changed the form");
        printf("test_qgemm: q_strip_tune: under 512 MiB available, nothing timed (as documented)\n");
        return;
    }
    int timed = 1;
    for (int k = 0; k < 3; k++) timed &= ms[k] > 0 && isfinite(ms[k]);
    CHECK((t.level == 1 || t.level == 2) && (t.rows8 == 0 || t.rows8 == 1) && timed,
          "q_strip_tune: level %d rows8 %d, %g / %g / %g ms", t.level, t.rows8, ms[0], ms[1], ms[2]);
    const q_strip_form now = q_strip_get();
    CHECK(t.level == (ms[0] < 0.98 * ms[1] ? 1 : 2) && t.rows8 == (ms[2] < 0.98 * fmin(ms[0], ms[1])) &&
              now.level == t.level && now.rows8 == t.rows8,
          "q_strip_tune kept level %d rows8 %d (now %d, %d) from %g / %g / %g ms", t.level, t.rows8, now.level,
          now.rows8, ms[0], ms[1], ms[2]);
    printf("test_qgemm: q_strip_tune: strips L1 %.2f ms, L2 %.2f ms, 8-row groups %.2f ms -> L%d%s\n", ms[0], ms[1],
           ms[2], t.level, t.rows8 ? ", 8-row groups" : "");
    q_strip_set((q_strip_form){2, 0});
}

int main(void) {
    test_quantize_row();
    enum q_isa best = q_isa_pick();
    printf("test_qgemm: ISA paths up to %s\n", q_isa_name(best));
    test_quantize_isas(best);
    for (int isa = Q_ISA_SCALAR; isa <= (int)best; isa++)
        for (int digits = 2; digits >= 1; digits--) {
            test_multi((enum q_isa)isa, digits, 0, 3);
            test_rows_alone((enum q_isa)isa, digits == 1 ? Q_PATH_INT8_1 : Q_PATH_INT8);
            if (isa == Q_ISA_AVX512) test_multi(Q_ISA_AVX512, digits, 1, 7), test_multi(Q_ISA_AVX512, digits, 1, 20);
        }
    for (size_t t = 0; t < sizeof TYPES / sizeof *TYPES; t++) {
        uint32_t type = TYPES[t].type;
        int be = (int)dq_block_elems(type), in_odd = be == 256 ? 768 : 96 + 64 * 3;   // 352: 11 32-blocks
        if (be == 1) in_odd = 352;
        for (int isa = Q_ISA_SCALAR; isa <= (int)best; isa++) {
            check_case(type, TYPES[t].name, (enum q_isa)isa, Q_PATH_INT8, 1, in_odd, 37);
            check_case(type, TYPES[t].name, (enum q_isa)isa, Q_PATH_INT8, 3, be == 256 ? 512 : 256, 19);
            check_case(type, TYPES[t].name, (enum q_isa)isa, Q_PATH_INT8, 64, be == 256 ? 512 : 256, 24);
            if (type == GGML_F16 || type == GGML_BF16) continue;   // no activation digits
            check_case(type, TYPES[t].name, (enum q_isa)isa, Q_PATH_INT8_1, 1, in_odd, 37);
            check_case(type, TYPES[t].name, (enum q_isa)isa, Q_PATH_INT8_1, 64, be == 256 ? 512 : 256, 24);
        }
        check_case(type, TYPES[t].name, best, Q_PATH_SGEMM, 33, in_odd, 70);
        if (q_amx_available()) {   // ragged edges (33 tokens, 70 rows), then whole 32 x 32 blocks
            check_case(type, TYPES[t].name, best, Q_PATH_AMX, 33, in_odd, 70);
            check_case(type, TYPES[t].name, best, Q_PATH_AMX, 64, be == 256 ? 512 : 256, 96);
        }
    }
    if (best == Q_ISA_AVX512) {   // the derived bounds in the strips' other forms too
        test_strip_forms();
        q_strip_set((q_strip_form){1, 0});
        check_case(GGML_Q4_K, "q4_k (strips to L1)", best, Q_PATH_INT8, 1, 768, 37);
        check_case(GGML_Q4_K, "q4_k (strips to L1)", best, Q_PATH_INT8, 3, 512, 19);
        q_strip_set((q_strip_form){2, 1});
        check_case(GGML_Q4_K, "q4_k (8-row groups)", best, Q_PATH_INT8, 1, 768, 37);
        check_case(GGML_Q4_K, "q4_k (8-row groups)", best, Q_PATH_INT8_1, 1, 4096, 35);
        check_case(GGML_Q4_K, "q4_k (8-row groups)", best, Q_PATH_INT8, 3, 512, 19);
        q_strip_set((q_strip_form){2, 0});
    }
    for (size_t t = 0; t < sizeof TYPES / sizeof *TYPES && best == Q_ISA_AVX512; t++) {
        uint32_t type = TYPES[t].type;
        if (!q_vnni_supported(type)) continue;
        int k256 = dq_block_elems(type) == 256;
        // ragged edges (33 tokens: a part-filled token group; 70 rows: a part-filled unit and
        // micro tile), two passes over the columns, whole token groups and units
        for (int path = Q_PATH_VNNI; path <= Q_PATH_VNNI8; path++) {   // two digits, one digit
            check_case(type, TYPES[t].name, best, path, 33, k256 ? 768 : 352, 70);
            check_case(type, TYPES[t].name, best, path, 5, k256 ? 1280 : 1120, 30);
            check_case(type, TYPES[t].name, best, path, 64, k256 ? 512 : 256, 96);
        }
    }
    if (best == Q_ISA_AVX512) test_vnni_forms();
    printf("test_qgemm: VNNI GEMMs (two digits, one digit) %s\n", best == Q_ISA_AVX512 ? "checked" : "not on this CPU: skipped");
    printf("test_qgemm: AMX tiles %s\n", q_amx_available() ? "checked" : "not on this CPU: skipped");
    return check_summary("test_qgemm");
}
