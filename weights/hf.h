// weights/hf.h — a Hugging Face model directory: config.json (parsed with jansson), the weights
// in model.safetensors or in shards listed by model.safetensors.index.json (every shard opened and
// validated; every tensor of the index found in its shard), and typed look-ups into config.json.
// The tokenizer files (tokenizer.json, tokenizer_config.json) are read by tok/.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "safetensors.h"

typedef struct hf_dir {
    char *path;   // the directory
    void *config; // json_t * of config.json
    st_file **shards;
    int n_shards;
} hf_dir;

// 1 if path is a directory (a candidate HF model).
int hf_is_dir(const char *path);
// Open and validate. NULL + one-line reason on failure (missing config or shard, bad JSON,
// malformed safetensors, an index entry whose tensor is not in its shard).
hf_dir *hf_open(const char *path, char *err, size_t errlen);
void hf_close(hf_dir *h);
const st_tensor *hf_find_tensor(const hf_dir *h, const char *name); // NULL if absent

// config.json look-ups by key; a dotted key ("rope_scaling.factor") goes into objects.
// 0 on success; 1 if absent or null (out untouched); -1 if present with another type.
int hf_cfg_int(const hf_dir *h, const char *key, long long *out);
int hf_cfg_num(const hf_dir *h, const char *key, double *out);
int hf_cfg_bool(const hf_dir *h, const char *key, int *out);
// The string value (valid while h is open), or NULL if absent or not a string.
const char *hf_cfg_str(const hf_dir *h, const char *key);
// architectures[0], or NULL.
const char *hf_cfg_arch(const hf_dir *h);
// The layer family of architectures[0]: "llama" (LlamaForCausalLM and the SwiftKV checkpoints'
// LlamaSwiftKVForCausalLM, whose extra tensors sit beside a plain Llama), "qwen2"
// (Qwen2ForCausalLM), or NULL for anything else.
const char *hf_arch_family(const hf_dir *h);

// A whole small file of the directory ("tokenizer.json"), NUL-terminated, malloc'd; NULL if it
// cannot be read (err set) — or if absent and !required (err empty).
char *hf_read_file(const char *dir, const char *name, int required, size_t *len, char *err,
                   size_t errlen);
typedef struct json_t json_t;   // jansson's (C11 allows the repeated typedef)
// Parses dir/name as a JSON object. NULL + err (absent and !required: NULL, err empty).
json_t *hf_read_json(const char *dir, const char *name, int required, char *err, size_t errlen);
