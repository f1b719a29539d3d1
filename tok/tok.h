// tok/tok.h — byte-level BPE tokenizer (GPT-2 style) built from GGUF tokenizer metadata or a
// Hugging Face tokenizer.json (+ tokenizer_config.json, generation_config.json; tok_json.c),
// pre-tokenizers `smollm`, `llama-bpe`/`llama3`, `qwen2` (PCRE2, UTF + UCP), special tokens,
// decoding, UTF-8 validation, and built-in chat templates (ChatML, Llama-3); prompt files, a
// prompt's ids with BOS, and generated answers with their agreement with a reference's tokens.
#pragma once
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include "../weights/gguf.h"

typedef struct tok tok;

enum tok_chat { TOK_CHAT_NONE = 0, TOK_CHAT_CHATML, TOK_CHAT_LLAMA3 };

// Token types (GGUF's numbering).
enum tok_type { TOK_NORMAL = 1, TOK_UNKNOWN, TOK_CONTROL, TOK_USER, TOK_UNUSED, TOK_BYTE };
typedef struct { const char *p; size_t len; } tok_str;   // not NUL-terminated
typedef struct tok_pre tok_pre;

// A tokenizer's parts as a file format gives them, for tok_build.
typedef struct tok_source {
    int n_vocab;
    const tok_str *texts;          // [n_vocab] token texts (byte-level code points)
    const uint8_t *types;          // [n_vocab] enum tok_type, or NULL (all normal)
    const tok_str *merges;         // [n_merges] "A B", rank = index
    long n_merges;
    int bos, eos, eot, add_bos;    // ids, -1 if none
    const int *eog;                // [n_eog] more end-of-generation ids
    int n_eog;
    char *pre_name;                // malloc'd; tok_build takes it and pre (NULLs them)
    tok_pre *pre;
    const char *chat_template;     // the template text (only its family is used), or NULL
} tok_source;

// Builds a tokenizer from src. NULL + one-line reason on failure.
tok *tok_build(tok_source *src, char *err, size_t errlen);
// From a Hugging Face model directory: tokenizer.json (model BPE, byte-level, its
// pre_tokenizer as regex stages, added tokens), tokenizer_config.json (bos/eos, add_bos_token,
// chat_template), generation_config.json (eos ids). NULL + one-line reason on failure.
tok *tok_load_hf(const char *dir, char *err, size_t errlen);

// Build from tokenizer.ggml.* keys. NULL + one-line reason in err on failure
// (missing keys, tokenizer.ggml.model other than "gpt2", unknown pre-tokenizer, ...).
tok *tok_load_gguf(const gguf_file *f, char *err, size_t errlen);
void tok_free(tok *t);

int tok_n_vocab(const tok *t);
int tok_bos(const tok *t);           // -1 if none
int tok_eos(const tok *t);           // -1 if none
int tok_add_bos(const tok *t);       // 1 if a BOS should be prepended to a prompt
int tok_is_eog(const tok *t, int id); // end of generation: EOS, EOT, <|im_end|>, <|eot_id|>, ...
const char *tok_pre_name(const tok *t); // tokenizer.ggml.pre as the file names it
enum tok_chat tok_chat_kind(const tok *t); // from tokenizer.chat_template, NONE if unrecognised

// Encode UTF-8 text (invalid UTF-8 is an error). parse_special: text like "<|im_start|>" that
// names a control token becomes that token; user-defined tokens are always matched (as llama.cpp
// and Hugging Face do); longest match first. Does NOT add BOS. Returns the count, writes a
// malloc'd array to *ids; -1 on failure (message in err).
int tok_encode(const tok *t, const char *text, size_t len, int parse_special, int **ids,
               char *err, size_t errlen);
// tok_encode, then the model's BOS first when it adds one (tok_add_bos); *ids has room for one
// more token. The count, or -1 (err).
int tok_encode_prompt(const tok *t, const char *text, size_t len, int parse_special, int **ids,
                      char *err, size_t errlen);
// The bytes of one token (control tokens decode to their text only if show_special).
// Returns a pointer valid for the tokenizer's lifetime and its length in *len ("", 0 for an id
// out of range: models may pad their embedding beyond the tokenizer's vocabulary).
const char *tok_piece(const tok *t, int id, int show_special, size_t *len);

// Offset of the first invalid UTF-8 byte in s[0..len), or -1 if valid.
long tok_utf8_invalid_at(const char *s, size_t len);
// A whole prompt file ('-' = stdin), NUL-terminated (tok/text.c); NULL + err (too big,
// unreadable).
char *tok_read_text(const char *path, size_t *len, char *err, size_t errlen);
// Text read from a file, checked: 0, or -1 with "WHAT is binary, not text (a NUL byte at offset
// N)" or "WHAT is not valid UTF-8 (byte offset N, 0xXX)" in err.
int tok_text_check(const char *text, size_t len, const char *what, char *err, size_t errlen);
// A generated answer as it arrives (tok/text.c): every token (an end-of-generation one included,
// which ends it) and the text of the others. tok_answer_token(ctx: the answer, id) takes the
// next token: 1 when it ends the answer, else 0 (a run_token_fn).
typedef struct tok_answer {
    const tok *t;
    int *ids, n_ids;
    char *text;   // NULL until a piece arrives
    size_t len;
} tok_answer;
int tok_answer_token(void *ctx, int id);
void tok_answer_free(tok_answer *a);
// How tokens ids (n,) follow the reference's ref (n_ref,): *first = both start with the same
// token; the share of ref's tokens matched at the same position (0 when ref is empty).
double tok_agreement(const int *ref, int n_ref, const int *ids, int n, int *first);
// s[0..n) as a quoted JSON string: quotes, backslash and controls escaped, each invalid UTF-8
// byte as U+FFFD (tok/pretok.c, beside the UTF-8 check it uses).
void tok_json_str(FILE *out, const char *s, size_t n);

// The system prompt the model's chat template inserts when the conversation has none (SmolLM2:
// "You are a helpful AI assistant named SmolLM, trained by Hugging Face"), or NULL. Pass it as
// tok_chat_apply's `system` when the user gives none, to reproduce the template exactly.
const char *tok_chat_default_system(const tok *t);

// Wrap a user message (and optional system text, may be NULL) in the chat template of `kind`,
// ending with the assistant prefix. Returns malloc'd text or NULL if kind is NONE.
char *tok_chat_apply(enum tok_chat kind, const char *system, const char *user);
// The same for a conversation: turns (roles[i], contents[i]), roles "user" or "assistant" (or
// "system"), after the optional system text; ends with the assistant's header. NULL if kind is
// none.
char *tok_chat_apply_turns(enum tok_chat kind, const char *system, const char *const *roles,
                           const char *const *contents, int n);

// Template text -> kind: ChatML (contains "<|im_start|>"), Llama-3 ("<|start_header_id|>").
enum tok_chat tok_chat_detect(const char *tmpl);
// The default system prompt a ChatML template text writes as a literal (see above); malloc'd or
// NULL.
char *tok_chat_find_default_system(const char *tmpl);

// The pre-tokenizer alone: splits text into the pieces BPE merges within. Names: "smollm",
// "llama3" = "llama-bpe" = "llama-v3", "qwen2" = "deepseek-r1-qwen". NULL + reason if unknown.
tok_pre *tok_pre_new(const char *name, char *err, size_t errlen);
// A pre-tokenizer from up to TOK_PRE_MAX_STAGES regex stages (tokenizer.json's Split patterns,
// compiled by PCRE2 as written).
// NULL + reason if a regex does not compile.
#define TOK_PRE_MAX_STAGES 4
tok_pre *tok_pre_from_regex(const char *const *stages, int n_stages, int ignore_merges, char *err,
                            size_t errlen);
void tok_pre_free(tok_pre *p);
// GPT-2's splitting pattern (Hugging Face's ByteLevel pre-tokenizer with use_regex).
const char *tok_pre_byte_level_regex(void);
int tok_pre_ignore_merges(const tok_pre *p); // 1: a whole piece found in the vocabulary skips BPE
// Writes a malloc'd array of piece end offsets to *ends (pieces are contiguous and cover the
// text) and returns the count; -1 with a message on invalid UTF-8 or a regex failure.
int tok_pre_split(const tok_pre *p, const char *text, size_t len, size_t **ends, char *err,
                  size_t errlen);
