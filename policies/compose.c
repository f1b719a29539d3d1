// policies/compose.c — composed strategies PREFILL+DECODE ("fastkv+topk", "specprefill+topk+phi"):
// a prefill strategy builds the cache, then a decode strategy reads it. No published system
// combines them; sift's one forward pass makes it a matter of handing over one cache.
//
// The hand-over: a prefill part that changes nothing (`full`) leaves the prompt to the decode
// strategy's own prefill (the prompt but its last token, which is the first query; a prompt too
// short for its regions runs full, with its note), so full+Y is Y, bit for bit. A prefill part
// that changes the prefill keeps the whole prompt (its observation window, deep token or
// lookahead are built around the last tokens) and gives the first token; the decode strategy
// then reads, from the first generated token on, whatever that prefill kept (per layer and per
// KV head; attach takes each layer's entries as they are). So X+topk with a top-K that covers
// every kept entry decodes as X alone.
// Decode hooks the prefill part needs itself (swiftkv's shared K/V source) run together with the
// decode strategy's (pair_hooks); two parts both replacing attention would be refused.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "compose.h"

// Two sets of decode hooks run as one: each callback calls a's then b's.
typedef struct {
    fwd_hooks a, b;
    void (*a_report)(void *, char *, size_t), (*b_report)(void *, char *, size_t);
    double (*b_read)(void *);
    double (*b_recall)(void *);
} hook_pair;

static int pair_after_attention(void *ctx, fwd_state *s, int l, const void *q) {
    hook_pair *p = ctx;
    if (p->a.after_attention && p->a.after_attention(p->a.ctx, s, l, q)) return -1;
    return p->b.after_attention ? p->b.after_attention(p->b.ctx, s, l, q) : 0;
}

static int pair_after_layer(void *ctx, fwd_state *s, int l) {
    hook_pair *p = ctx;
    int ra = p->a.after_layer ? p->a.after_layer(p->a.ctx, s, l) : 0;
    if (ra < 0) return ra;
    int rb = p->b.after_layer ? p->b.after_layer(p->b.ctx, s, l) : 0;
    return rb < 0 ? rb : ra > rb ? ra : rb;
}

static int pair_kv_source(void *ctx, int l, int *kv_layer, const bk_weight **wq, const bk_weight **bq) {
    hook_pair *p = ctx;
    if (p->a.kv_source && p->a.kv_source(p->a.ctx, l, kv_layer, wq, bq)) return 1;
    return p->b.kv_source ? p->b.kv_source(p->b.ctx, l, kv_layer, wq, bq) : 0;
}

static int pair_attention(void *ctx, fwd_state *s, int l, const void *q, void *out) {
    hook_pair *p = ctx;
    return p->a.attention ? p->a.attention(p->a.ctx, s, l, q, out) : p->b.attention(p->b.ctx, s, l, q, out);
}

static void pair_report(void *ctx, char *buf, size_t len) {
    hook_pair *p = ctx;
    buf[0] = 0;
    if (p->a_report) p->a_report(p->a.ctx, buf, len);
    size_t used = strlen(buf);
    if (used && used + 2 < len) used += (size_t)snprintf(buf + used, len - used, "; ");
    if (p->b_report) p->b_report(p->b.ctx, buf + used, len - used);
}

static double pair_read(void *ctx) {
    hook_pair *p = ctx;
    return p->b_read(p->b.ctx);
}

static double pair_recall(void *ctx) {
    hook_pair *p = ctx;
    return p->b_recall(p->b.ctx);
}

// Whether h's decode work may be recorded as a graph: it says so, or it does nothing.
static int recordable(const fwd_hooks *h) {
    return h->recordable || (!h->after_attention && !h->after_layer && !h->kv_source && !h->attention);
}

// info->decode (etc.) := a's hooks then b's (the decode strategy's, with its read accounting).
static void pair_hooks(prefill_info *info, const prefill_info *a) {
    hook_pair *p = xcalloc(1, sizeof *p);
    *p = (hook_pair){a->decode, info->decode, a->decode_report, info->decode_report,
                     info->decode_read_bytes, info->decode_recall};
    info->decode = (fwd_hooks){.ctx = p};
    if (p->a.after_attention || p->b.after_attention) info->decode.after_attention = pair_after_attention;
    if (p->a.after_layer || p->b.after_layer) info->decode.after_layer = pair_after_layer;
    if (p->a.kv_source || p->b.kv_source) info->decode.kv_source = pair_kv_source;
    if (p->a.attention || p->b.attention) info->decode.attention = pair_attention;
    info->decode.recordable = recordable(&p->a) && recordable(&p->b);
    info->decode_free = free;
    info->decode_report = pair_report;
    info->decode_read_bytes = p->b_read ? pair_read : NULL;
    info->decode_recall = p->b_recall ? pair_recall : NULL;
}

kv_cache *compose_prefill(const strategy *pre, const strategy *dec, context *cx, const int *ids,
                          int n, int n_gen, const strategy_opts *o, const strategy_run *run,
                          float *logits, prefill_info *info, char *err, size_t errlen) {
    if (pre->phase == PHASE_NONE)   // full+Y: Y alone
        return dec->prefill(cx, ids, n, n_gen, o, run, logits, info, err, errlen);
    kv_cache *kv = pre->prefill(cx, ids, n, n_gen, o, run, logits, info, err, errlen);
    if (!kv) return NULL;
    prefill_info mine = *info;   // the prefill part's own decode hooks, if any
    info->decode = (fwd_hooks){0};
    info->decode_report = NULL, info->decode_read_bytes = NULL, info->decode_recall = NULL;
    if (dec->attach(cx, kv, n, o, run, info, err, errlen) != 0) {
        kv_free(kv);
        return NULL;
    }
    if (mine.decode.after_attention || mine.decode.after_layer || mine.decode.kv_source ||
        mine.decode.attention) {
        CHECK_INTERNAL(!(mine.decode.attention && info->decode.attention),
                       "%s and %s both replace decode attention", pre->name, dec->name);
        pair_hooks(info, &mine);
    }
    return kv;
}

int compose_check(const strategy *pre, const strategy *dec, const model *m, const strategy_opts *o,
                  char *err, size_t errlen) {
    if (pre->check && pre->check(m, o, err, errlen) != 0) return -1;
    return dec->check ? dec->check(m, o, err, errlen) : 0;
}
