// model/pass.h — inside the forward pass, for forward.c and decode.c only: the run state (the
// buffers every pass of a context works in, planned once for the largest pass asked and freed
// with the context) and one pass over the packed rows of several sequences.
#pragma once
#include "forward.h"

// Backend memory unless noted. rows: the row budget; out_rows: rows of logits.
typedef struct fwd_run_state {
    int rows, out_rows;
    void *x, *xb;            // (rows, max(d, qd)) residual stream, normed rows (fwd_keep_rows swaps)
    void *q, *k, *v, *att;   // (rows, qd), (rows, kvd), (rows, kvd), (rows, qd)
    void *hb, *hb2;          // (rows, d_ff) gate, up
    void *out;               // (out_rows, vocab) logits
    float *host;             // (out_rows, vocab) logits, host
    int *tok, *pos, *pos2;   // (rows,) host: tokens, positions and their spare (fwd_keep_rows)
    // During a one-sequence pass whose hooks keep entries (fwd_hooks.keep_caps): per layer the
    // K and V buffers made for its kept entries before the pass (NULL once used), and the
    // buffers keeps replaced, freed when the pass ends (host arrays, per pass).
    void **keep_k, **keep_v;
    int *keep_cap, keep_layers;
    void **spent;
    int n_spent;
} fwd_run_state;

// B sequences' rows packed in the run state: sequence b's start at row off[b]; view[b] is
// sequence b as its hooks see it (its cache, rows, positions; B = 1: the pass itself, so its
// hooks may drop rows). src, fed, wq, bq: layer l's answers of each sequence's kv_source hook.
typedef struct {
    context *cx;
    model *m;   // cx->m
    fwd_run_state *r;
    fwd_seq *seqs;
    int B, progress, off[FWD_MAX_BATCH];
    fwd_state all, views[FWD_MAX_BATCH], *view[FWD_MAX_BATCH];
    const fwd_hooks *hooks[FWD_MAX_BATCH];
    int src[FWD_MAX_BATCH], fed[FWD_MAX_BATCH];
    const bk_weight *wq[FWD_MAX_BATCH], *bq[FWD_MAX_BATCH];
} fwd_pass;

// cx's run state, grown (never shrunk) to at least rows rows and out_rows rows of logits.
fwd_run_state *fwd_plan(context *cx, int rows, int out_rows);
// p over seqs (B of them) in cx's run state, planned for their rows: tokens and positions packed.
void fwd_pass_begin(fwd_pass *p, context *cx, fwd_seq *seqs, int B);
// The pass: embed -> every layer -> final norm + LM head; r->out holds the logits of each
// sequence's last row that asks for them (every row with all_rows). 0, or -1 (a hook aborted).
int fwd_forward(fwd_pass *p, int all_rows);
// The sequences' logits from r->out to their hosts' buffers.
void fwd_logits_to_host(fwd_pass *p, int all_rows);
// Every sequence's next token drawn on the backend from the logits out (B, vocab) of a pass:
// 0, or -1 (nothing drawn) when a sequence has no sampler or the backend does not take its
// settings. Drawn: fwd_seq.token set, each sampler advanced as a host draw would.
int fwd_device_draw(backend *bk, const void *out, fwd_seq *seqs, int B, int vocab);
// Frees the recorded decode step (decode.c).
void fwd_decode_free(context *cx);
