// policies/prompt_cache.h — the --prompt-cache file: a prompt's plain prefill on disk (its first
// n tokens and their K and V rows in every layer, as the cache stores them), which a later run
// whose prompt starts with those tokens loads as a shared prefix (policy.h: kv_prefix) and
// prefills only the rest, bit for bit as its own whole prefill would (the same model, row types,
// backend, weights mode and chunk grid: the file names each and a run with another is refused).
//
// Layout, little-endian: "SIFTKVC\0"; u32 version; u32 n_layer, n_kv_head, head_dim, k_type,
// v_type, ubatch, n_tok, model_len, backend_len, weights_len; u64 model digest; the model's name,
// the backend's name and the weights mode (bytes, no NUL); n_tok u32 tokens; per layer, every KV
// head's n_tok K rows then every KV head's n_tok V rows (kv_row_bytes each); u64 FNV-1a of every
// byte before it. Written whole (util/outfile.c).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "policy.h"

#define PCACHE_VERSION 1

// What a file was made by (and what a run needs it to be made by).
typedef struct pcache_meta {
    uint64_t digest;            // model.digest
    int n_layer, n_kv_head, head_dim;
    int k_type, v_type;         // enum kv_type
    int ubatch;                 // the chunk grid of its prefill (context.p.ubatch)
    char model[128];            // its name (messages only)
    char backend[16];           // "cpu" | "cuda"
    char weights[16];           // --weights as given ("native", ...)
} pcache_meta;

// A parsed file: its fields, and where its tokens and rows lie in the bytes it was parsed from.
typedef struct pcache_view {
    pcache_meta meta;
    int version, n_tok;
    const unsigned char *tokens;   // n_tok u32
    const unsigned char *rows;     // the layers' rows
    size_t k_row, v_row;           // bytes of one row
} pcache_view;

// The file in buf (len bytes, named path in messages) checked whole: magic, version, every size
// against the length, the row types, the checksum, every token below vocab (0: unchecked). 0, or
// -1 + a one-line err naming what is wrong. Untrusted input (fuzz/fuzz_pcache.c).
int pcache_parse(const void *buf, size_t len, const char *path, int vocab, pcache_view *v, char *err,
                 size_t errlen);
// Every token of v below vocab: 0, or -1 + err.
int pcache_check_tokens(const pcache_view *v, int vocab, const char *path, char *err, size_t errlen);
// 0 when v was made as want says, else -1 + err naming the first difference ("made by model X,
// this run's is Y").
int pcache_match(const pcache_view *v, const pcache_meta *want, const char *path, char *err,
                 size_t errlen);
// The meta of a run in cx whose weights mode is `weights`.
pcache_meta pcache_meta_of(const context *cx, const char *weights);
// The first n entries of kv (made in cx by a plain prefill of ids) written to path whole. 0, or
// -1 + err.
int pcache_save(const char *path, const pcache_meta *meta, const context *cx, kv_cache *kv,
                const int *ids, int n, char *err, size_t errlen);
// The view's first n tokens (n <= v->n_tok) as a shared prefix in cx. NULL + err.
kv_prefix *pcache_prefix(context *cx, const pcache_view *v, int n, char *err, size_t errlen);
// The view's token i.
int pcache_token(const pcache_view *v, int i);
