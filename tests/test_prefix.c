// tests/test_prefix.c — a shared prefix (policies/policy.h: kv_prefix, prefix_build; prefill_run
// with context.prefix) answers bit for bit as the prompt's own whole prefill, on quantised
// weights whose products take the CPU's int8 row kernels for few rows and its wide GEMM for
// many: the first token's logits and those of the decode steps after it, in one pass and
// along a chunk grid (--ubatch), with the prefix ending 128 rows past a chunk boundary (its last
// chunk and the rest each shorter than the chunk they lie in: context.rows_as). Where a prefix
// ends (prefix_cut) against hand-computed cases; a prefix the prompt does not start with,
// or one as long as the prompt, is not taken.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../policies/policy.h"
#include "../util/check.h"
#include "check.h"

enum { STEPS = 4, VOCAB = 97, N = 438 };

static model *tiny(backend *bk) {
    synth_shape s = {.name = "prefix-test", .arch = "llama", .n_layer = 2, .d_model = 64, .n_head = 4,
                     .n_kv_head = 2, .head_dim = 16, .d_ff = 96, .vocab = VOCAB, .ctx_len = 512,
                     .rope_theta = 10000, .rms_eps = 1e-5f, .seed = 11, .wtype = GGML_Q8_0};
    char err[256];
    model *m = model_load_synth(&s, bk, err, sizeof err);
    CHECK(m != NULL, "%s", err);
    return m;
}

// The caches' row types of the contexts below (zero: the backend's own, f32 on the CPU; the
// run's default f16 is set in main).
static ctx_params base;

static context *context_of(model *m, int ubatch) {
    ctx_params p = base;
    p.ubatch = ubatch;
    return ctx_new(m, &p);
}

static int argmax(const float *x) {
    int b = 0;
    for (int i = 1; i < VOCAB; i++) b = x[i] > x[b] ? i : b;
    return b;
}

// ids (n,) prefilled in a fresh context with chunks of ubatch rows (with prefix pf: it copied),
// then STEPS greedy decode steps: every step's logits into out (STEPS + 1, VOCAB). The tokens
// taken from the prefix returned.
static int generate(model *m, int ubatch, const int *ids, int n, const kv_prefix *pf,
                    float out[][VOCAB]) {
    context *cx = context_of(m, ubatch);
    char err[256];
    prefill_info info = {0};
    cx->prefix = pf;
    kv_cache *kv = prefill_run(cx, ids, n, STEPS, NULL, NULL, out[0], &info, err, sizeof err);
    CHECK(kv != NULL, "%s", err);
    CHECK(cx->prefix == NULL, "the prefill cleared the context's prefix");
    int tok = argmax(out[0]);
    for (int t = 1; t <= STEPS; t++) {
        int pos = n + t - 1;
        fwd_seq s = {kv, &tok, &pos, 1, NULL, out[t], 0, NULL, 0};
        CHECK(fwd_decode(cx, &s, 1) == 0, "decode step %d", t);
        tok = argmax(out[t]);
    }
    kv_free(kv);
    ctx_free(cx);
    return info.prefix_n;
}

static void same_as_whole(model *m, int ubatch, const int *ids, int P) {
    static float whole[STEPS + 1][VOCAB], reused[STEPS + 1][VOCAB];
    generate(m, ubatch, ids, N, NULL, whole);
    context *pcx = context_of(m, ubatch);   // the job's context
    char err[256];
    kv_prefix *pf = prefix_build(pcx, ids, P, N - 1, err, sizeof err);
    CHECK(pf != NULL && pf->n == P && pf->kv->layers[0].len == P, "prefix built: %s", err);
    int got = generate(m, ubatch, ids, N, pf, reused);
    CHECK(got == P, "ubatch %d: %d tokens taken from the prefix, want %d", ubatch, got, P);
    for (int t = 0; t <= STEPS; t++)
        CHECK(memcmp(whole[t], reused[t], sizeof whole[t]) == 0,
              "ubatch %d, prefix %d: step %d's logits differ from the whole prefill's (first at %d: %g vs %g)",
              ubatch, P, t, 0, whole[t][0], reused[t][0]);
    // the prefix was not written by its use: a second request answers alike
    generate(m, ubatch, ids, N, pf, reused);
    CHECK(memcmp(whole[STEPS], reused[STEPS], sizeof whole[STEPS]) == 0, "a second use of the prefix differs");
    prefix_free(pf);
    ctx_free(pcx);
}

int main(void) {
    // where a prefix ends: at most the shortest prefill less PREFIX_REST (16) rows, cut to a
    // multiple of 128 past the chunk boundary at or below that
    CHECK(prefix_cut(400, 438, 0) == 384, "one pass: %d", prefix_cut(400, 438, 0));
    CHECK(prefix_cut(430, 438, 300) == 300, "chunks of 300: %d", prefix_cut(430, 438, 300));
    CHECK(prefix_cut(438, 460, 300) == 428, "128 past 300: %d", prefix_cut(438, 460, 300));
    CHECK(prefix_cut(8000, 7990, 2048) == 7936, "a short prompt: %d", prefix_cut(8000, 7990, 2048));
    CHECK(prefix_cut(8200, 8300, 2048) == 8192, "on the grid: %d", prefix_cut(8200, 8300, 2048));
    CHECK(prefix_cut(127, 200, 0) == 0, "too short: %d", prefix_cut(127, 200, 0));
    CHECK(prefix_cut(5, 10, 0) == 0, "nothing left to share: %d", prefix_cut(5, 10, 0));

    backend *bk = backend_cpu_create(1, BK_WEIGHTS_NATIVE);
    model *m = tiny(bk);
    if (!m) return check_summary("test_prefix");
    int ids[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 37 + 11) % VOCAB;
    base = (ctx_params){.kv_typed = 1, .kv_k = KV_F16, .kv_v = KV_F16};   // the CPU's default
    // one pass of 438 rows (the wide GEMM) against a prefix of 401 and a rest of 37 rows, and a
    // rest of 16 (below every wide path's threshold, its attention blocks not the whole's)
    // one pass of 438 rows (the wide GEMM) against a prefix of 384 and a rest of 54 rows
    same_as_whole(m, 0, ids, prefix_cut(N, N, 0));
    // chunks of 300: the prefix's last chunk [300, 428) and the rest [428, 438) each shorter than
    // their chunk [300, 438); the rest's 10 rows take the int8 row kernels here unless they take
    // the chunk's path (context.rows_as: without it this fails); a prefix on the grid
    same_as_whole(m, 300, ids, 428);
    same_as_whole(m, 300, ids, 300);
    // an fp32 cache (attention's sgemm over the rows in place)
    base = (ctx_params){.kv_typed = 1, .kv_k = KV_F32, .kv_v = KV_F32};
    same_as_whole(m, 0, ids, 384);
    same_as_whole(m, 300, ids, 428);
    base = (ctx_params){.kv_typed = 1, .kv_k = KV_F16, .kv_v = KV_F16};

    // not taken: a prompt that does not start with the prefix, and a prefix as long as the prompt
    char err[256];
    context *pcx = context_of(m, 0);
    kv_prefix *pf = prefix_build(pcx, ids, 256, N, err, sizeof err);
    CHECK(pf != NULL, "%s", err);
    static float out[STEPS + 1][VOCAB];
    int other[N];
    memcpy(other, ids, sizeof ids);
    other[100] = (other[100] + 1) % VOCAB;
    CHECK(generate(m, 0, other, N, pf, out) == 0, "a prefix the prompt does not start with was taken");
    CHECK(generate(m, 0, ids, 256, pf, out) == 0, "a prefix as long as the prompt was taken");
    prefix_free(pf);
    ctx_free(pcx);
    model_free(m);
    bk->destroy(bk);
    return check_summary("test_prefix");
}
