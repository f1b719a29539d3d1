// model/load.h — the one loader every subcommand uses: a model file's format dispatched (GGUF
// file, Hugging Face directory, synthetic:NAME[@SEED]), the memory plan made before any weight
// is allocated, the weights put on a backend with the tokenizer (and an optional --draft with
// the same vocabulary), and a run context over each model. cmd/ parses the flags into a
// load_req and reports what comes back; nothing here prints.
#pragma once
#include <stdint.h>

#include "../tok/tok.h"
#include "../weights/gguf.h"
#include "context.h"

// What to load and how a run over it is planned.
typedef struct load_req {
    const char *path;         // GGUF file, HF directory or synthetic:NAME[@SEED] (resolved)
    const char *draft_path;   // --draft (GGUF, same vocabulary), or NULL
    backend *bk;              // where the weights go (the caller made it and destroys it)
    uint32_t synth_wtype;     // a synthetic model's weight type (`sift bench --wtype`)
    // The memory plan: besides the weights, the KV cache of plan_ctx tokens (0: none, each
    // prompt checks its own) in rows of the context's types and the activations of a prefill
    // pass of plan_rows rows; chunk_rows > 0 when every strategy asked for can run in chunks
    // (the refusal then names --ubatch chunk_rows as a way out).
    int plan_ctx;
    long plan_rows, chunk_rows;
    ctx_params cp;            // the contexts made over the model and the draft
} load_req;

// What a load opened; load_close frees it all but the backend.
typedef struct loaded {
    char *path;
    gguf_file *f, *df;
    struct hf_dir *hf;        // when path is a Hugging Face directory (f is then NULL)
    tok *t, *dt;              // tokenizers (t NULL for a synthetic model)
    backend *bk;
    model *m, *draft;
    context *cx, *dcx;        // a run context over m and over draft (NULL without one)
    char note[512];           // a synthetic model's line (seed, type, params, bytes), or ""
} loaded;

// Loads r into L. 0; -1 + err when the load fails or does not fit (the plan's numbers and
// what would fit); -2 + err when the request cannot work with this model (a --draft for a
// synthetic model, a KV row type its head_dim does not take).
int load_open(loaded *L, const load_req *r, char *err, size_t errlen);
void load_close(loaded *L);
// The config of the model at path alone (no weights). 0 or -1 + err; the caller frees inv_freq.
int load_config(const char *path, model_config *c, char *err, size_t errlen);
// The resident weight bytes of path (synthetic: as wtype blocks) on device "cuda" (as a GPU
// would keep them, no GPU needed: backend_cuda_plan) or else on the CPU backend in mode w,
// without loading: what the memory plan counts. 0 or -1 + err.
int load_weight_bytes(const char *path, const char *device, enum bk_weights w, uint32_t wtype,
                      double *bytes, char *err, size_t errlen);
