// model/context.c — run contexts (context.h).
#include "context.h"
#include "pass.h"

#include <stdlib.h>

#include "../util/check.h"

void ctx_kv_types(const ctx_params *p, const backend *bk, enum kv_type *k, enum kv_type *v) {
    *k = p->kv_typed ? p->kv_k : kv_native_type(bk->elem_bytes);
    *v = p->kv_typed ? p->kv_v : kv_native_type(bk->elem_bytes);
}

context *ctx_new(model *m, const ctx_params *p) {
    context *cx = xcalloc(1, sizeof *cx);
    cx->m = m;
    if (p) cx->p = *p;
    return cx;
}

context *ctx_fork(const context *cx) {
    context *c = ctx_new(cx->m, &cx->p);
    c->on_layer = cx->on_layer, c->on_layer_ctx = cx->on_layer_ctx;
    return c;
}

void ctx_free(context *cx) {
    if (!cx) return;
    fwd_free(cx);
    free(cx);
}
