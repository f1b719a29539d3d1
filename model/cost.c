// model/cost.c — costs of a forward pass by formula (see cost.h).
#include "cost.h"

static double q_dim(const model_config *c) { return (double)c->n_head * c->head_dim; }
static double kv_dim(const model_config *c) { return (double)c->n_kv_head * c->head_dim; }

double cost_n_params(const model_config *c) {
    double d = c->d_model, f = c->d_ff, q = q_dim(c), kv = kv_dim(c);
    double layer = 2 * d + d * q + 2 * d * kv + q * d + 3 * d * f + (c->qkv_bias ? q + 2 * kv : 0);
    return (double)c->vocab * d * (c->tied ? 1 : 2) + d + c->n_layer * layer;
}

double cost_layer_row_flops(const model_config *c) {
    double d = c->d_model, f = c->d_ff, q = q_dim(c), kv = kv_dim(c);
    return 2 * (d * q + 2 * d * kv + q * d + 3 * d * f);
}

double cost_prefill_flops(const model_config *c, long n) {
    double N = (double)n, linear = N * cost_layer_row_flops(c);
    double attention = 2.0 * 2.0 * c->n_head * c->head_dim * (N * (N + 1) / 2);
    return c->n_layer * (linear + attention) + 2 * c->d_model * (double)c->vocab;
}

double cost_decode_weight_bytes(const model_config *c, size_t elem) {
    double embd = c->tied ? 0 : (double)c->vocab * c->d_model;
    return (cost_n_params(c) - embd) * (double)elem;
}

double cost_kv_token_bytes(const model_config *c, size_t elem) {
    return (double)c->n_layer * 2 * kv_dim(c) * (double)elem;
}

double cost_kv_token_bytes_typed(const model_config *c, enum kv_type k, enum kv_type v) {
    return (double)c->n_layer * c->n_kv_head *
           (double)(kv_row_bytes(k, c->head_dim) + kv_row_bytes(v, c->head_dim));
}

double cost_prefill_mem_bytes_rows(const model_config *c, long n, long n_gen, long rows,
                                   size_t elem, double kv_tok) {
    double d = c->d_model, q = q_dim(c), kv = kv_dim(c);
    double per_row = 2 * (d > q ? d : q) + q + 2 * kv + q + 2.0 * c->d_ff;
    return (double)(n + n_gen) * kv_tok + ((double)rows * per_row + c->vocab) * (double)elem;
}

double cost_prefill_mem_bytes(const model_config *c, long n, long n_gen, size_t elem) {
    return cost_prefill_mem_bytes_rows(c, n, n_gen, n, elem, cost_kv_token_bytes(c, elem));
}

double cost_attn_flops(const model_config *c, double pairs) { return 4.0 * q_dim(c) * pairs; }

double cost_causal_pairs(double n) { return n * (n + 1) / 2; }

double cost_lm_head_flops(const model_config *c) { return 2.0 * c->d_model * c->vocab; }

void cost_add_layers(const model_config *c, cost_work *w, double layers, double rows, double pairs) {
    w->gemm_flops += layers * rows * cost_layer_row_flops(c);
    w->attn_flops += layers * cost_attn_flops(c, pairs);
}

void cost_full_prefill(const cost_shape *sh, cost_work *w) {
    const model_config *c = sh->c;
    double n = (double)sh->n;
    *w = (cost_work){.gemm_flops = cost_lm_head_flops(c), .kv_entries = c->n_layer * n};
    cost_add_layers(c, w, c->n_layer, n, cost_causal_pairs(n));
}

void cost_dense_decode(const cost_shape *sh, cost_work *w) {
    const model_config *c = sh->c;
    w->weight_bytes = sh->weight_bytes;
    w->kv_bytes = (w->kv_entries + c->n_layer * sh->n_gen / 2.0) * c->n_kv_head * (sh->k_row + sh->v_row);
}

double cost_kv_proj_flops(const model_config *c) { return 4.0 * c->d_model * kv_dim(c); }

double cost_ttft(const cost_work *w, const cost_rates *r) {
    return w->gemm_flops / r->gemm + w->attn_flops / r->attn + w->step_bytes / r->weight_bw +
           w->step_kv_bytes / r->kv_bw;
}

double cost_tpot(const cost_work *w, const cost_rates *r) {
    return w->weight_bytes / r->weight_bw + w->kv_bytes / r->kv_bw;
}
