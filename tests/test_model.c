// tests/test_model.c — unit tests of the forward-pass pieces against hand-computed cases and
// naive float64 references: causal attention by position (prefill blocks, decode, GQA, masks),
// RoPE (NORM on permuted rows == NEOX on HF rows), sampling filters, KV byte accounting.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../attn/attn.h"
#include "../attn/phi.h"
#include "../fit/phi_fit.h"
#include "../backend/backend.h"
#include "../backend/sample.h"
#include "../kv/kv.h"
#include "check.h"

static double frand(unsigned *s) {
    *s = *s * 1103515245u + 12345u;
    return ((*s >> 8) & 0xffff) / 65536.0 * 2 - 1;
}

// naive float64 attention by position, same layout as attn_causal_cpu
static void attn_ref(double *out, const float *q, const int *qpos, int n, int heads, const float *k,
                     const float *v, const int *kpos, int len, int cap, int hkv, int hd) {
    int group = heads / hkv;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++) {
            int g = h / group;
            double mx = -INFINITY, w[512], sum = 0;
            for (int j = 0; j < len; j++) {
                w[j] = -INFINITY;
                if (kpos[g * cap + j] > qpos[i]) continue;
                double d = 0;
                for (int c = 0; c < hd; c++)
                    d += (double)q[((size_t)i * heads + h) * hd + c] * k[((size_t)g * cap + j) * hd + c];
                w[j] = d / sqrt(hd);
                if (w[j] > mx) mx = w[j];
            }
            for (int j = 0; j < len; j++) sum += w[j] == -INFINITY ? 0 : exp(w[j] - mx);
            for (int c = 0; c < hd; c++) {
                double o = 0;
                for (int j = 0; j < len; j++)
                    if (w[j] != -INFINITY) o += exp(w[j] - mx) / sum * v[((size_t)g * cap + j) * hd + c];
                out[((size_t)i * heads + h) * hd + c] = o;
            }
        }
}

static void test_attention_hand(void) {
    // one head, hd 4 (scale 1/2): scores 0 and ln 3 -> weights 1/4, 3/4; values 4, 8 -> 7
    float q[4] = {1, 0, 0, 0}, k[8] = {0, 0, 0, 0, 2 * logf(3), 0, 0, 0};
    float v[8] = {4, 4, 4, 4, 8, 8, 8, 8}, out[4];
    int qpos[1] = {5}, kpos[2] = {0, 3};
    attn_causal_cpu(out, q, qpos, 1, 1, k, KV_F32, v, KV_F32, kpos, 2, 2, 1, 4);
    for (int c = 0; c < 4; c++) CHECK_CLOSE(out[c], 7.0, 1e-6);
    // the second key in the future of the query: only the first is visible -> 4
    qpos[0] = 2;
    attn_causal_cpu(out, q, qpos, 1, 1, k, KV_F32, v, KV_F32, kpos, 2, 2, 1, 4);
    CHECK_CLOSE(out[0], 4.0, 1e-6);
}

// n queries at scattered positions against len keys (cap > len), GQA 6 heads / 2 KV heads
static void test_attention_random(int n, int len) {
    int heads = 6, hkv = 2, hd = 16, cap = len + 3;
    unsigned s = 42u + n;
    float *q = malloc(sizeof(float) * n * heads * hd), *k = malloc(sizeof(float) * hkv * cap * hd);
    float *v = malloc(sizeof(float) * hkv * cap * hd), *out = malloc(sizeof(float) * n * heads * hd);
    double *ref = malloc(sizeof(double) * n * heads * hd);
    int *qpos = malloc(sizeof(int) * n), *kpos = malloc(sizeof(int) * hkv * cap);
    for (int i = 0; i < n * heads * hd; i++) q[i] = (float)frand(&s) * 2;
    for (int i = 0; i < hkv * cap * hd; i++) k[i] = (float)frand(&s) * 2, v[i] = (float)frand(&s);
    // keys: head 0 keeps positions 0,2,4,...; head 1 keeps 0,3,6,... (per-head selections)
    for (int g = 0; g < hkv; g++)
        for (int j = 0; j < cap; j++) kpos[g * cap + j] = j * (g + 2);
    for (int i = 0; i < n; i++) qpos[i] = (int)((i + 1) * (2.0 * len / n)) + (i % 3);
    attn_causal_cpu(out, q, qpos, n, heads, k, KV_F32, v, KV_F32, kpos, len, cap, hkv, hd);
    attn_ref(ref, q, qpos, n, heads, k, v, kpos, len, cap, hkv, hd);
    double worst = 0;
    for (int i = 0; i < n * heads * hd; i++) worst = fmax(worst, fabs(out[i] - ref[i]));
    CHECK(worst < 1e-5, "n=%d len=%d max abs err %.3g", n, len, worst);
    free(q), free(k), free(v), free(out), free(ref), free(qpos), free(kpos);
}

// RoPE: GGUF llama rows are permuted so that pairs (j, j+hd/2) sit at (2j, 2j+1); rotating the
// permuted vector with NORM must equal rotating the original with NEOX, then permuting.
static void test_rope(void) {
    backend *b = backend_cpu_create(1, BK_WEIGHTS_NATIVE);
    float x[2] = {1, 0}, inv1[1] = {1};
    int pos1[1] = {1};
    b->rope(b, x, pos1, 1, 1, 2, inv1, ROPE_NORM);
    CHECK_CLOSE(x[0], cos(1.0), 1e-6);
    CHECK_CLOSE(x[1], sin(1.0), 1e-6);

    enum { HD = 8, HEADS = 2 };
    float inv[HD / 2], orig[HEADS * HD], perm[HEADS * HD];
    unsigned s = 7;
    for (int j = 0; j < HD / 2; j++) inv[j] = powf(10000.0f, -2.0f * j / HD);
    for (int i = 0; i < HEADS * HD; i++) orig[i] = (float)frand(&s);
    for (int h = 0; h < HEADS; h++)
        for (int j = 0; j < HD / 2; j++) {
            perm[h * HD + 2 * j] = orig[h * HD + j];
            perm[h * HD + 2 * j + 1] = orig[h * HD + j + HD / 2];
        }
    int pos[1] = {37};
    b->rope(b, orig, pos, 1, HEADS, HD, inv, ROPE_NEOX);
    b->rope(b, perm, pos, 1, HEADS, HD, inv, ROPE_NORM);
    for (int h = 0; h < HEADS; h++)
        for (int j = 0; j < HD / 2; j++) {
            CHECK_CLOSE(perm[h * HD + 2 * j], orig[h * HD + j], 1e-6);
            CHECK_CLOSE(perm[h * HD + 2 * j + 1], orig[h * HD + j + HD / 2], 1e-6);
        }
    // the backend keeps the last call's angles (a pass's layers reuse them): the same positions
    // with other frequencies, or other positions, must rotate by their own angles (hand-made)
    float y[4] = {1, 0, 1, 0}, f2[2] = {0.5f, 0.25f};
    int pos2[2] = {3, 3};
    b->rope(b, y, pos2, 2, 1, 2, inv1, ROPE_NORM);   // angle 3 per row
    CHECK_CLOSE(y[0], cos(3.0), 1e-6); CHECK_CLOSE(y[3], sin(3.0), 1e-6);
    inv1[0] = 0.5f;   // the same address, another frequency: angle 1.5
    y[0] = 1, y[1] = 0, y[2] = 1, y[3] = 0;
    b->rope(b, y, pos2, 2, 1, 2, inv1, ROPE_NORM);
    CHECK_CLOSE(y[0], cos(1.5), 1e-6); CHECK_CLOSE(y[3], sin(1.5), 1e-6);
    pos2[1] = 4;   // another position in the second row: angle 2
    y[0] = 1, y[1] = 0, y[2] = 1, y[3] = 0;
    b->rope(b, y, pos2, 2, 1, 2, inv1, ROPE_NORM);
    CHECK_CLOSE(y[1], sin(1.5), 1e-6); CHECK_CLOSE(y[2], cos(2.0), 1e-6);
    float z[4] = {1, 0, 0, 1};   // a head of 4 (half 2): angles 4 * 0.5 and 4 * 0.25
    b->rope(b, z, pos2 + 1, 1, 1, 4, f2, ROPE_NORM);
    CHECK_CLOSE(z[0], cos(2.0), 1e-6); CHECK_CLOSE(z[1], sin(2.0), 1e-6);
    CHECK_CLOSE(z[2], -sin(1.0), 1e-6); CHECK_CLOSE(z[3], cos(1.0), 1e-6);
    b->destroy(b);
}

// SwiGLU against float64 silu(g) * u over the whole float range a gate may take (the AVX-512
// version's exp is clamped to [-87, 80]: no NaN, no subnormal, relative error ~1e-6 where the
// value is not negligible); a length that is not a multiple of 16 (the scalar tail).
static void test_swiglu(void) {
    backend *b = backend_cpu_create(1, BK_WEIGHTS_NATIVE);
    enum { N = 16 * 40 + 5 };
    float g[N], u[N], out[N];
    unsigned s = 11;
    for (int i = 0; i < N; i++) {
        g[i] = i < 40 ? -200.0f + 10.0f * i : (float)(frand(&s) * (i % 3 ? 10 : 120));
        u[i] = (float)frand(&s) * 3;
    }
    g[41] = -88.5f, g[42] = 88.9f, g[43] = -1e30f, g[44] = 1e30f, g[45] = 0;
    b->swiglu(b, out, g, u, N);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        double ref = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        double err = fabs(out[i] - ref), tol = 2e-6 * fabs(ref) + 1e-30 * fabs(u[i]) + 1e-30;
        if (!(err <= tol) && !(fabs(g[i]) > 1e29 && fabs(out[i] - ref) <= 1e-6 * fabs(ref) + 1e-30)) {
            if (bad++ < 5) fprintf(stderr, "swiglu g=%g u=%g: %g vs %g\n", g[i], u[i], out[i], ref);
        }
    }
    CHECK(bad == 0, "swiglu: %d of %d outputs off", bad, N);
    b->destroy(b);
}

// fit-phi's position augmentation: rotating post-RoPE vectors (positions p) by delta equals RoPE
// at p + delta (the backend's rope on the pre-RoPE vectors), for both pair layouts, and keeps
// every q . k.
static void test_phi_rotate(void) {
    backend *b = backend_cpu_create(1, BK_WEIGHTS_NATIVE);
    enum { HD = 16, N = 5 };
    float inv[HD / 2], pre[N * HD], at_p[N * HD], at_pd[N * HD], rot[N * HD], qrot[N * HD];
    unsigned s = 11;
    for (int j = 0; j < HD / 2; j++) inv[j] = powf(10000.0f, -2.0f * j / HD);
    for (int style = ROPE_NORM; style <= ROPE_NEOX; style++) {
        int pos[N], posd[N], head[N] = {0}, end[N] = {N, N, N, N, N}, delta = 1234;
        for (int i = 0; i < N * HD; i++) pre[i] = (float)frand(&s);
        for (int i = 0; i < N; i++) pos[i] = 3 + 17 * i, posd[i] = pos[i] + delta;
        memcpy(at_p, pre, sizeof pre);
        memcpy(at_pd, pre, sizeof pre);
        b->rope(b, at_p, pos, N, 1, HD, inv, (enum rope_style)style);
        b->rope(b, at_pd, posd, N, 1, HD, inv, (enum rope_style)style);
        phi_fit_set d = {HD, 1, 0, N, N, at_p, at_p, head, end, inv, style == ROPE_NEOX, delta};
        phi_fit_rotate(&d, delta, rot, qrot);
        for (int i = 0; i < N * HD; i++) CHECK_CLOSE(rot[i], at_pd[i], 2e-4);
        for (int i = 0; i < N; i++)
            for (int j = 0; j < N; j++) {
                double a = 0, c = 0;
                for (int x = 0; x < HD; x++)
                    a += (double)at_p[i * HD + x] * at_p[j * HD + x], c += (double)qrot[i * HD + x] * rot[j * HD + x];
                CHECK_CLOSE(c, a, 1e-5);
            }
    }
    b->destroy(b);
}

// draws n samples; counts[id]
static void draw(const sample_params *p, const float *logits, int vocab, int n, int *counts) {
    sampler s;
    sampler_init(&s, p, vocab);
    memset(counts, 0, sizeof(int) * vocab);
    for (int i = 0; i < n; i++) counts[sample_next(&s, logits)]++;
    sampler_free(&s);
}

static void test_sampling(void) {
    // probabilities .5 .3 .2 (+ one impossible token)
    float lg[4] = {logf(.5f), logf(.3f), logf(.2f), -INFINITY};
    int c[4], n = 20000;
    draw(&(sample_params){.temp = 0}, lg, 4, 10, c);
    CHECK(c[0] == 10, "greedy picks the argmax");
    draw(&(sample_params){.temp = 1, .top_k = 1, .top_p = 1}, lg, 4, 100, c);
    CHECK(c[0] == 100, "top-k 1 is greedy");
    draw(&(sample_params){.temp = 1, .top_p = 0.5f}, lg, 4, 100, c);
    CHECK(c[0] == 100, "top-p .5 keeps only the first (cum .5)");
    draw(&(sample_params){.temp = 1, .top_p = 0.75f}, lg, 4, n, c);
    CHECK(c[2] == 0 && fabs(c[0] / (double)n - 0.625) < 0.02, "top-p .75 (cum .5, .8) -> 5/8, 3/8: %d %d %d", c[0], c[1], c[2]);
    draw(&(sample_params){.temp = 1, .top_p = 1, .min_p = 0.5f}, lg, 4, n, c);
    CHECK(c[2] == 0 && fabs(c[1] / (double)n - 0.375) < 0.02, "min-p .5 keeps p >= .25: %d %d %d", c[0], c[1], c[2]);
    draw(&(sample_params){.temp = 1, .top_p = 1}, lg, 4, n, c);
    CHECK(fabs(c[2] / (double)n - 0.2) < 0.02 && c[3] == 0, "plain sampling: %d %d %d", c[0], c[1], c[2]);
    // temperature 0.5 squares the odds: .25:.09:.04 -> .658 .237 .105
    draw(&(sample_params){.temp = 0.5f, .top_p = 1}, lg, 4, n, c);
    CHECK(fabs(c[0] / (double)n - 0.25 / 0.38) < 0.02, "temp .5: %d", c[0]);
    // same seed, same draws; another seed, other draws
    sampler a, b2, d;
    float flat[64];
    for (int i = 0; i < 64; i++) flat[i] = 0;
    sample_params p = {.temp = 1, .top_p = 1, .seed = 5}, q = p;
    q.seed = 6;
    sampler_init(&a, &p, 64), sampler_init(&b2, &p, 64), sampler_init(&d, &q, 64);
    int same = 1, diff = 0;
    for (int i = 0; i < 50; i++) {
        int x = sample_next(&a, flat), y = sample_next(&b2, flat), z = sample_next(&d, flat);
        same &= x == y;
        diff += x != z;
    }
    CHECK(same && diff > 0, "seeded reproducibility");
    sampler_free(&a), sampler_free(&b2), sampler_free(&d);
}

// The filters re-implemented from sample.h's words over a full sort of the vocabulary (the
// order: higher logit first, equal logits by lower id), drawing with the uniform u.
static int ref_cmp(const void *a, const void *b) {
    const float *x = a, *y = b;   // (logit, id) pairs
    if (x[0] != y[0]) return x[0] < y[0] ? 1 : -1;
    return (int)x[1] - (int)y[1];
}
// ref_ids (may be NULL) receives the full order's first top_k ids.
static int ref_draw(const sample_params *p, const float *logits, int n, float u, int *ref_ids) {
    float(*c)[2] = malloc(sizeof(float[2]) * n);
    for (int i = 0; i < n; i++) c[i][0] = logits[i], c[i][1] = (float)i;
    qsort(c, n, sizeof *c, ref_cmp);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    for (int i = 0; i < n && ref_ids; i++) ref_ids[i] = (int)c[i][1];
    double mx = c[0][0], sum = 0, cum = 0;
    for (int i = 0; i < n; i++) sum += exp(c[i][0] - mx);
    for (int i = 0; i < n && p->top_p < 1.0f; i++)
        if ((cum += exp(c[i][0] - mx) / sum) >= p->top_p) n = i + 1;
    int keep = 1;
    while (p->min_p > 0 && keep < n && c[keep][0] >= mx + log(p->min_p)) keep++;
    if (p->min_p > 0) n = keep;
    double z = 0, acc = 0;
    for (int i = 0; i < n; i++) z += exp((c[i][0] - mx) / p->temp);
    int t = (int)c[n - 1][1];
    for (int i = 0; i < n; i++)
        if (u * z < (acc += exp((c[i][0] - mx) / p->temp))) {
            t = (int)c[i][1];
            break;
        }
    free(c);
    return t;
}

// top-k finds its k candidates without sorting the vocabulary, and top-k off orders it by a radix
// sort: every draw equals qsort's full sort's, on logits with many ties (ids decide among equal
// logits, -0 and +0 among them), for k below, at and above the vocab.
static void test_sampling_top_k(void) {
    enum { V = 3000 };
    static float lg[V];
    uint64_t st = 99;
    static int ids[V];
    int ks[] = {1, 2, 40, 41, 1000, V - 1, V, V + 5}, bad = 0, draws = 0, bad_sets = 0;
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < V; i++)   // ties; every third round rising, so the heap keeps evicting
            lg[i] = (float)(sample_pcg32(&st) % 200) / 16.0f + (round % 3 == 2 ? i / 64.0f : 0);
        if (round % 2) lg[round * 7] = 40;   // one clear favourite in half the rounds
        if (round % 5 == 4)   // negative logits, and zeros of both signs (equal: ids decide)
            for (int i = 0; i < V; i++) lg[i] = i % 97 == 0 ? (i % 2 ? -0.0f : 0.0f) : -lg[i];
        for (size_t j = 0; j < sizeof ks / sizeof *ks; j++) {
            sample_params p = {.temp = 0.8f, .top_k = ks[j], .top_p = round % 3 ? 0.95f : 1,
                               .min_p = round % 4 ? 0.05f : 0, .seed = (uint64_t)round};
            sampler s;
            sampler_init(&s, &p, V);
            for (int d = 0; d < 5; d++, draws++) {
                uint64_t copy = s.state;
                float u = (sample_pcg32(&copy) >> 8) * (1.0f / 16777216.0f);
                int want = ref_draw(&p, lg, V, u, ids), got = sample_next(&s, lg);
                bad += got != want;
                // the candidates the filters saw: the full order's first k, in that order
                for (int i = 0; i < (ks[j] < V ? ks[j] : V); i++) bad_sets += s.cand[i].id != ids[i];
            }
            sampler_free(&s);
        }
    }
    CHECK(bad == 0, "top-k draws against a full sort: %d of %d differ", bad, draws);
    CHECK(bad_sets == 0, "top-k candidates against a full sort's first k: %d differ", bad_sets);
}

// OpenAI's penalties, by hand: logit[j] - c[j] * frequency - (c[j] > 0) * presence, c[j] the
// draws of j so far, applied before the choice (greedy included).
static void test_penalties(void) {
    sampler s;
    // frequency .3, presence .2 on 2.0 1.9 1.0 0.5 (greedy): draw 1: 0; then token 0 is at
    // 2.0-.3-.2 = 1.5 < 1.9: 1; 1.5 > 1.9-.5 = 1.4: 0; 2.0-.6-.2 = 1.2 < 1.4: 1;
    // 1.2 > 1.9-.6-.2 = 1.1: 0; 2.0-.9-.2 = 0.9 < 1.1: 1; 0.9, 0.8 < 1.0: 2
    float a[4] = {2.0f, 1.9f, 1.0f, 0.5f};
    int want_a[7] = {0, 1, 0, 1, 0, 1, 2};
    sampler_init(&s, &(sample_params){.temp = 0, .freq_pen = 0.3f, .pres_pen = 0.2f}, 4);
    for (int i = 0; i < 7; i++) {
        int t = sample_next(&s, a);
        CHECK(t == want_a[i], "frequency+presence draw %d: %d, expected %d", i, t, want_a[i]);
    }
    sampler_free(&s);
    // presence alone does not grow: 1.0 0.9 0.0 with presence .5: 0, then 0.5 < 0.9: 1, then
    // 0.5 > 0.4: 0, and 0 again (its penalty stays .5)
    float b[3] = {1.0f, 0.9f, 0.0f};
    int want_b[4] = {0, 1, 0, 0};
    sampler_init(&s, &(sample_params){.temp = 0, .pres_pen = 0.5f}, 3);
    for (int i = 0; i < 4; i++) CHECK(sample_next(&s, b) == want_b[i], "presence draw %d", i);
    sampler_free(&s);
    // a negative frequency penalty favours repeats: 1.0 1.2 with -0.5: 1, 1, 1 (0 never wins)
    float c[2] = {1.0f, 1.2f};
    sampler_init(&s, &(sample_params){.temp = 0, .freq_pen = -0.5f}, 2);
    for (int i = 0; i < 3; i++) CHECK(sample_next(&s, c) == 1, "negative frequency draw %d", i);
    sampler_free(&s);
    // at a temperature: two equal logits, presence 30: the second draw is the other token
    // (probability 1 - 1/(1 + e^-30)), for every seed
    float d[2] = {0, 0};
    for (int seed = 1; seed <= 20; seed++) {
        sampler_init(&s, &(sample_params){.temp = 1, .top_p = 1, .seed = (uint64_t)seed, .pres_pen = 30}, 2);
        int x = sample_next(&s, d), y = sample_next(&s, d);
        CHECK(x != y, "seed %d: presence 30 at temperature 1 drew %d twice", seed, x);
        sampler_free(&s);
    }
    CHECK(!sample_penalised(&(sample_params){.temp = 1}) &&
          sample_penalised(&(sample_params){.pres_pen = -0.1f}), "sample_penalised");
}

static void *heap_alloc(void *ctx, size_t n) { (void)ctx; return malloc(n * sizeof(float)); }
static void heap_free(void *ctx, void *p) { (void)ctx; free(p); }

static void test_kv_bytes(void) {
    int caps[3] = {10, 4, 0};
    char err[128];
    kv_cache *kv = kv_create(3, 2, 8, caps, 4, heap_alloc, heap_free, NULL, err, sizeof err);
    CHECK(kv != NULL, "%s", err);
    CHECK(kv_bytes(kv) == (size_t)2 * 2 * 8 * 4 * (10 + 4 + 0), "bytes %zu", kv_bytes(kv));
    kv->layers[0].len = 7;
    kv->layers[1].len = 4;
    CHECK(kv_entries(kv) == 11, "entries");
    kv_free(kv);
}

int main(void) {
    test_attention_hand();
    test_attention_random(1, 40);     // decode path
    test_attention_random(7, 30);     // one prefill block
    test_attention_random(300, 200);  // several blocks, masks by scattered positions
    test_rope();
    test_swiglu();
    test_phi_rotate();
    test_sampling();
    test_sampling_top_k();
    test_penalties();
    test_kv_bytes();
    return check_summary("test_model");
}
