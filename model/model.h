// model/model.h — a Llama-family model in memory: the config (from GGUF metadata, architectures
// `llama` and `qwen2`; from an HF config.json; or a synthetic shape), the weights handed to a
// backend in their file encoding (the CPU keeps quantised blocks, `--weights f32` dequantises;
// CUDA converts to bf16), and the tokenizer-free facts the forward pass needs (RoPE style and
// frequencies, norms, tied embeddings, QKV bias).
#pragma once
#include <stddef.h>
#include "../backend/backend.h"
#include "../weights/gguf.h"
#include "../weights/kvrow.h"
#include "../weights/synthetic.h"

// Limits that reject absurd metadata before anything is allocated from it.
#define MODEL_MAX_LAYERS 512
#define MODEL_MAX_DIM 65536
#define MODEL_MAX_VOCAB 1048576
#define MODEL_MAX_CTX (1 << 22)

typedef struct {
    char arch[16];          // "llama" | "qwen2"
    int n_layer, d_model, n_head, n_kv_head, head_dim, d_ff, vocab, ctx_len;
    float rms_eps;
    enum rope_style rope;
    float *inv_freq;        // [head_dim/2] RoPE inverse frequencies (rope_freqs already applied)
    int qkv_bias;           // qwen2
    int tied;               // output.weight absent: LM head = token embedding
} model_config;

// wq, wk, wv (and their biases) are NULL in an HF checkpoint that lacks them for a layer (see
// model_qkv_missing_from): a pass through that layer needs a policy that supplies them.
typedef struct {
    bk_weight *attn_norm, *wq, *wk, *wv, *bq, *bk, *bv, *wo;   // wq (n_head*hd, d) etc.
    bk_weight *ffn_norm, *w_gate, *w_up, *w_down;              // w_gate (d_ff, d), w_down (d, d_ff)
    // where the backend fuses (weight_fuse): the storage of wq|wk|wv and of w_gate|w_up, one
    // product each; the parts above are views of their rows. NULL: not fused.
    bk_weight *wqkv, *w_gate_up;
} layer_weights;

// A checkpoint tensor the architecture does not use, kept by its file name for a policy.
typedef struct {
    char *name;
    bk_weight *w;
    size_t rows, cols;      // rows 0: a vector of cols elements
} model_extra;

struct hf_dir;

typedef struct model {
    model_config cfg;
    backend *bk;
    bk_weight *tok_embd;    // (vocab, d)
    bk_weight *out_norm;    // (d,)
    bk_weight *lm_head;     // (vocab, d); == tok_embd when tied
    layer_weights *layers;  // [n_layer]
    char *name;             // general.name or file base name
    unsigned long long digest;   // the weights' fingerprint (model/load.c: the file's header and
                                 // bytes sampled through it; a synthetic shape's name, seed and
                                 // type): a --prompt-cache file names the model by it
    size_t n_params;
    double weight_bytes;    // resident bytes of all weights on the backend (model_weight)
    double embd_bytes;      // of which the token embedding
    const struct hf_dir *hf;  // the HF directory it came from (config look-ups), or NULL (GGUF)
    model_extra *extra;       // [n_extra] tensors of an HF checkpoint beyond the architecture's
    int n_extra;
    // A run's state (pass buffers, recorded decode step, KV row types, chunk size, progress)
    // lives in a run context (model/context.h), never here.
    struct model_derived *derived;   // strategies' states derived once from these weights
} model;

// A strategy's state derived once from a model's weights (swiftkv's layer plans, topk+phi's
// fallback maps), found by its owner's kind (the address of a static in the owner's file);
// freed first thing in model_free.
typedef struct model_derived {
    const void *kind;
    void *state;
    void (*free)(void *state);
    struct model_derived *next;
} model_derived;
// The state of this kind kept with m, or NULL.
void *model_derived_get(const model *m, const void *kind);
// Keeps state (of a kind m holds none of yet) with m until model_free, which calls free(state).
void model_derived_put(model *m, const void *kind, void *state, void (*free)(void *state));

// Fuses each layer's q/k/v and gate/up weights where the backend offers weight_fuse (the loaders
// call it last; a model built by hand may too).
void model_fuse(model *m);
// t handed to m's backend (bk->weight), its resident bytes added to m->weight_bytes. NULL when
// out of memory.
bk_weight *model_weight(model *m, bk_tensor t);

// Reads the config from GGUF metadata; 0 or -1 with a one-line reason.
int model_config_from_gguf(const gguf_file *f, model_config *cfg, char *err, size_t errlen);
// Loads config + weights onto the backend. NULL with a one-line reason on failure.
model *model_load_gguf(const gguf_file *f, backend *bk, char *err, size_t errlen);
void model_free(model *m);

// Synthetic models (model_synth.c): shape s's config (NEOX rotation, llama3 RoPE scaling applied
// to inv_freq), and the model with seeded weights made on the backend (weight_synth when it
// offers it, else on the host). NULL with a one-line reason when out of memory.
void model_config_synth(const synth_shape *s, model_config *c);
model *model_load_synth(const synth_shape *s, backend *bk, char *err, size_t errlen);
// model/model_hf.c: config from config.json (LlamaForCausalLM, Qwen2ForCausalLM and their
// variants, rope_scaling llama3) and F32/F16/BF16 safetensors weights; HF rotation = ROPE_NEOX
// on the unpermuted Q/K rows. Keeps h for config look-ups (h must outlive the model).
model *model_load_hf(const struct hf_dir *h, backend *bk, char *err, size_t errlen);
// The config of an HF directory alone (config.json); 0 or -1 + err. The caller frees inv_freq.
int model_config_from_hf(const struct hf_dir *h, model_config *c, char *err, size_t errlen);
// The extra tensor `name` (NULL if absent).
const model_extra *model_find_extra(const model *m, const char *name);
// An HF model's config.json value at key (dotted keys go into objects): the string, or NULL
// (absent, not a string, or a GGUF model); the integer: 0, 1 if absent (or GGUF), -1 if not
// an integer.
const char *model_config_str(const model *m, const char *key);
int model_config_int(const model *m, const char *key, long long *out);
// -1 if every layer has its q/k/v projections, else the first layer without them.
int model_qkv_missing_from(const model *m);
