// attn/attn.h — attention kernels. CPU versions here (attn_cpu.c); CUDA twins beside them.
#pragma once
#include "../weights/kvrow.h"

// Causal attention by position (fp32 arithmetic, CPU).
// q (n, heads, hd) at qpos (n,); K, V (n_kv_head, cap) rows of types kt and vt (weights/kvrow.h;
// kv_row_bytes each) with kpos (n_kv_head, cap), len used. Key j of KV head g is visible to query
// i iff kpos[g][j] <= qpos[i]; head h reads KV head h / (heads / n_kv_head).
// out (n, heads, hd) = softmax(q.k / sqrt(hd)) @ v over visible keys. Both f32: the reference;
// otherwise the results are those on the decoded cache (a prefill decodes ATTN_KT keys at a time
// into a tile and multiplies it by sgemm; a decode step converts rows in registers, or decodes one
// row at a time and takes every query of the group against it).
void attn_causal_cpu(float *out, const float *q, const int *qpos, int n, int heads, const void *k,
                     enum kv_type kt, const void *v, enum kv_type vt, const int *kpos, int len,
                     int cap, int n_kv_head, int hd);

// Attention probabilities (fp32, CPU), for token scoring.
// probs (n, heads, m) = softmax_j(q_i,h . k_g,j / sqrt(hd)) over the first m keys of KV head
// g = h / (heads / n_kv_head), restricted to keys visible to query i (kpos <= qpos[i]);
// invisible keys get probability 0. K (n_kv_head, cap) rows of type kt, kpos (n_kv_head, cap).
void attn_probs_cpu(float *probs, const float *q, const int *qpos, int n, int heads, const void *k,
                    enum kv_type kt, const int *kpos, int m, int cap, int n_kv_head, int hd);

// Raw scores (fp32, CPU), for topk's decode selector (the CPU twin of score_dots_cuda):
// s (nq, lds) columns [0, n) = q_i . k_j for nq query rows (row i at q + i * ld) against n stored
// key rows k of type kt (kv_row_bytes each), converted in registers where the CPU can (hd a
// multiple of 8). Each score's arithmetic is the same whatever n and wherever the row lies.
void attn_scores_cpu(float *s, int lds, const float *q, int nq, int ld, const void *k,
                     enum kv_type kt, int n, int hd);
// Page bounds (attn/pages.h; the CPU twin of score_page_bounds_cuda): ub (n_pages,) = per page
// of b ((n_pages, 2) rows lo, hi of type bt) the largest over the nq query rows of
// sum_c max(q_c lo_c, q_c hi_c) — the bound of the best key of the page for any of them.
void attn_page_bounds_cpu(float *ub, const float *q, int nq, int ld, const void *b, enum kv_type bt,
                          int n_pages, int hd);
