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
