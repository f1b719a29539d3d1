// model/cost.h — what a forward pass costs by formula, from the config alone: parameter count,
// prefill FLOPs, bytes a decode step reads, memory a prefill needs. `sift bench` turns these into
// MFU / MBU and refuses up front what would not fit; `sift bench --dry-run` prints them.
#pragma once
#include <stddef.h>

#include "model.h"

// Parameters: embedding (+ untied LM head) + final norm + per layer two norms, Q K V O, gate up
// down (+ QKV biases). Equals model->n_params after loading.
double cost_n_params(const model_config *c);

// Model FLOPs of a full prefill of n tokens (matmul multiply-adds count 2):
//   n_layer * [ n * 2 * (d*qd + 2*d*kvd + qd*d + 3*d*d_ff)          projections and MLP
//             + 2*2*n_head*head_dim * n*(n+1)/2 ]                   QK^T and PV, causal pairs
//   + 2 * d * vocab                                                 LM head, last row only
// (qd = n_head*head_dim, kvd = n_kv_head*head_dim). Not counted: the embedding gather, norms,
// RoPE, softmax, SwiGLU and bias adds (O(n*d) each).
double cost_prefill_flops(const model_config *c, long n);

// FLOPs of one row through one layer's projections and MLP, 2 * (d*qd + 2*d*kvd + qd*d + 3*d*d_ff):
// the per-row part of the above, without the attention term that grows with the context.
double cost_layer_row_flops(const model_config *c);

// Weight bytes one decode step reads: every weight once at elem bytes each, except the token
// embedding when untied (only one row of it is gathered); tied, it is read whole as the LM head.
double cost_decode_weight_bytes(const model_config *c, size_t elem);

// Bytes of one token's K and V over all layers.
double cost_kv_token_bytes(const model_config *c, size_t elem);
// The same for K rows of type k and V rows of type v as the cache stores them (kv_row_bytes:
// q8_0's block scales and row padding included); 0 when head_dim does not fit a type.
double cost_kv_token_bytes_typed(const model_config *c, enum kv_type k, enum kv_type v);

// Memory a full prefill of n tokens with room for n_gen more needs besides the weights: the KV
// cache (n + n_gen tokens) plus the activations forward.c holds for n rows (residual and normed
// rows, each max(d, qd) wide, Q, K, V, attention output, gate, up) and the logits.
double cost_prefill_mem_bytes(const model_config *c, long n, long n_gen, size_t elem);
// The same with kv_tok bytes per token of KV cache (cost_kv_token_bytes_typed) and the
// activations of `rows` rows instead of n: a chunked prefill (--ubatch U) holds one chunk's,
// rows = min(n, U), while its KV cache still grows to n + n_gen tokens.
double cost_prefill_mem_bytes_rows(const model_config *c, long n, long n_gen, long rows,
                                   size_t elem, double kv_tok);

// ---- a run's cost by kind of work, and its time at given rates ----
// What one prefill and the decode steps after it do, in four kinds of work that run at four
// different rates on any backend: products of many rows (GEMMs), prefill attention, steps of one
// token inside the prefill (a draft's lookahead: bandwidth-bound), and a decode step's reads.
// A strategy states its work (policies/strategy.h cost_prefill, cost_decode); `sift bench
// --dry-run` turns it into predicted TTFT and TPOT.
typedef struct cost_work {
    double gemm_flops;     // prefill: projections, MLP, LM head, feature maps (a draft's too)
    double attn_flops;     // prefill: attention's QK^T and PV (and a strategy's scoring of them)
    double step_bytes;     // prefill: weight bytes read by one-token steps (specprefill's
                           // lookahead), at the decode weight rate
    double step_kv_bytes;  // prefill: the KV those steps read, at the decode KV rate
    double kv_entries;     // after prefill: the cache entries a decode step's attention reads,
                           // summed over the query layers (one KV head's count)
    double weight_bytes;   // a decode step: weights read
    double kv_bytes;       // a decode step: KV (and strategy state) read, at mid-decode depth
} cost_work;

// The shape a cost is stated for: the model (and a separate draft), the prompt and decode
// lengths, and the bytes of what a step reads.
typedef struct cost_shape {
    const model_config *c;
    const model_config *draft;     // specprefill --draft, or NULL (a self-draft)
    long n, n_gen;                 // prompt tokens; tokens decoded
    double weight_bytes;           // weights one decode step of c reads (cost_decode_weight_bytes)
    double draft_weight_bytes;     // the same for draft (0 without one)
    double k_row, v_row;           // bytes of one cached K row and one V row (one KV head)
} cost_shape;

// Rates: FLOP/s of GEMMs and of prefill attention; read B/s of weights in a decode step and of
// its attention's KV reads.
typedef struct cost_rates {
    double gemm, attn, weight_bw, kv_bw;
} cost_rates;

// FLOPs of one layer's attention over `pairs` query-key pairs: QK^T and PV, 2 * 2 * qd each.
double cost_attn_flops(const model_config *c, double pairs);
// Causal query-key pairs of n rows attending to each other: n (n + 1) / 2.
double cost_causal_pairs(double n);
// FLOPs of the LM head on one row: 2 d vocab.
double cost_lm_head_flops(const model_config *c);
// Adds to w's prefill `layers` layers of c, each with `rows` rows through the projections and
// MLP and attention over `pairs` query-key pairs.
void cost_add_layers(const model_config *c, cost_work *w, double layers, double rows, double pairs);
// full's prefill of sh->n tokens: every row through every layer, the LM head on the last row,
// and a cache of n entries per layer; equals cost_prefill_flops in gemm + attn.
void cost_full_prefill(const cost_shape *sh, cost_work *w);
// A decode step that reads every cached entry: w->weight_bytes of weights and the K and V rows
// of w->kv_entries + n_gen / 2 entries per layer (mid-decode depth) over every KV head.
void cost_dense_decode(const cost_shape *sh, cost_work *w);
// FLOPs of the K and V projections of one row in one layer: 2 * 2 d kvd.
double cost_kv_proj_flops(const model_config *c);
// Predicted time to first token and per output token, in seconds.
double cost_ttft(const cost_work *w, const cost_rates *r);
double cost_tpot(const cost_work *w, const cost_rates *r);
