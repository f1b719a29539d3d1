// tests/test_context.c — run contexts (model/context.h) over one loaded model: two contexts run
// interleaved (prefill A, prefill B, then their decode steps alternating, with different chunk
// sizes: the contexts' own --ubatch) give each sequence the logits it gets alone in a fresh context, bit for bit; a context
// freed midway leaves the other's run untouched; a cache copied into another context
// (fwd_kv_copy) decodes as the original does; and the model is not written by any of it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../policies/policy.h"
#include "../util/check.h"
#include "check.h"

enum { STEPS = 5, VOCAB = 97 };

// A small llama shape with seeded weights (weights/synthetic.h generation), on the CPU.
static model *tiny(backend *bk) {
    synth_shape s = {.name = "ctx-test", .arch = "llama", .n_layer = 3, .d_model = 64, .n_head = 4,
                     .n_kv_head = 2, .head_dim = 16, .d_ff = 96, .vocab = VOCAB, .ctx_len = 256,
                     .rope_theta = 10000, .rms_eps = 1e-5f, .seed = 7, .wtype = GGML_F32};
    char err[256];
    model *m = model_load_synth(&s, bk, err, sizeof err);
    CHECK(m != NULL, "%s", err);
    return m;
}

// One sequence of a run: its cache, position and the logits of each step.
typedef struct {
    context *cx;
    kv_cache *kv;
    int n, tok;
    float logits[STEPS + 1][VOCAB];
} seq;

static int argmax(const float *x) {
    int b = 0;
    for (int i = 1; i < VOCAB; i++) b = x[i] > x[b] ? i : b;
    return b;
}

// The prompt ids (n,) prefilled into a new cache of cx by the plain prefill (policies/
// generate.c prefill_run: in passes of the context's ubatch rows).
static void prefill(seq *q, context *cx, const int *ids, int n) {
    char err[256];
    prefill_info info = {0};
    *q = (seq){.cx = cx, .n = n};
    q->kv = prefill_run(cx, ids, n, STEPS, NULL, NULL, q->logits[0], &info, err, sizeof err);
    CHECK(q->kv != NULL, "%s", err);
    q->tok = argmax(q->logits[0]);
}

// Decode step t (1-based) of q: its greedy token at the next position, through fwd_decode.
static void step(seq *q, int t) {
    int pos = q->n + t - 1;
    fwd_seq s = {q->kv, &q->tok, &pos, 1, NULL, q->logits[t], 0, NULL, 0};
    CHECK(fwd_decode(q->cx, &s, 1) == 0, "decode step %d", t);
    q->tok = argmax(q->logits[t]);
}

static void alone(seq *q, model *m, const int *ids, int n, int ubatch) {
    context *cx = ctx_new(m, &(ctx_params){.ubatch = ubatch});
    prefill(q, cx, ids, n);
    for (int t = 1; t <= STEPS; t++) step(q, t);
    kv_free(q->kv);
    ctx_free(cx);
}

int main(void) {
    backend *bk = backend_cpu_create(1, BK_WEIGHTS_NATIVE);
    model *m = tiny(bk);
    if (!m) return check_summary("test_context");
    int a_ids[9], b_ids[13];
    for (int i = 0; i < 9; i++) a_ids[i] = (i * 31 + 5) % VOCAB;
    for (int i = 0; i < 13; i++) b_ids[i] = (i * 17 + 3) % VOCAB;
    model before = *m;
    static seq ra, rb, a, b, c;
    alone(&ra, m, a_ids, 9, 0);
    alone(&rb, m, b_ids, 13, 4);

    // interleaved: A and B in two contexts at once, B's prefill in passes of 4 rows
    context *ca = ctx_new(m, NULL), *cb = ctx_new(m, &(ctx_params){.ubatch = 4});
    prefill(&a, ca, a_ids, 9);
    prefill(&b, cb, b_ids, 13);
    for (int t = 1; t <= STEPS; t++) step(&a, t), step(&b, t);
    CHECK(memcmp(a.logits, ra.logits, sizeof a.logits) == 0, "A interleaved differs from A alone");
    CHECK(memcmp(b.logits, rb.logits, sizeof b.logits) == 0, "B interleaved differs from B alone");
    CHECK(ca->run && cb->run && ca->run != cb->run, "each context has its own pass buffers");
    kv_free(a.kv), kv_free(b.kv);

    // one context freed midway: the other goes on as alone; a copied cache decodes the same
    prefill(&a, ca, a_ids, 9);
    prefill(&b, cb, b_ids, 13);
    step(&a, 1), step(&b, 1);
    context *cc = ctx_fork(cb);
    char err[256];
    c = b;
    c.cx = cc;
    c.kv = fwd_kv_copy(cc, b.kv, err, sizeof err);
    CHECK(c.kv != NULL, "%s", err);
    kv_free(a.kv);
    ctx_free(ca);
    for (int t = 2; t <= STEPS; t++) step(&b, t), step(&c, t);
    CHECK(memcmp(b.logits, rb.logits, sizeof b.logits) == 0, "B after A's context was freed");
    CHECK(memcmp(c.logits, rb.logits, sizeof c.logits) == 0, "a copied cache in a forked context");
    CHECK(cc->p.ubatch == 4 && cc->m == m, "ctx_fork keeps the model and the parameters");
    kv_free(b.kv), kv_free(c.kv);
    ctx_free(cb), ctx_free(cc);

    CHECK(memcmp(&before, m, sizeof before) == 0, "the model struct was written by a run");
    model_free(m);
    bk->destroy(bk);
    return check_summary("test_context");
}
