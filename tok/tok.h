// tok/tok.h — byte-level BPE tokenizer (GPT-2 style) built from GGUF tokenizer metadata,
// pre-tokenizers `smollm`, `llama-bpe`/`llama3`, `qwen2` (PCRE2, UTF + UCP), special tokens,
// decoding, UTF-8 validation, and built-in chat templates (ChatML, Llama-3).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "../weights/gguf.h"

typedef struct tok tok;

enum tok_chat { TOK_CHAT_NONE = 0, TOK_CHAT_CHATML, TOK_CHAT_LLAMA3 };

// Build from tokenizer.ggml.* keys. NULL + one-line reason in err on failure
// (missing keys, tokenizer.ggml.model other than "gpt2", unknown pre-tokenizer, ...).
tok *tok_load_gguf(const gguf_file *f, char *err, size_t errlen);
void tok_free(tok *t);

int tok_n_vocab(const tok *t);
int tok_bos(const tok *t);           // -1 if none
int tok_eos(const tok *t);           // -1 if none
int tok_add_bos(const tok *t);       // 1 if a BOS should be prepended to a prompt
int tok_is_eog(const tok *t, int id); // end of generation: EOS, EOT, <|im_end|>, <|eot_id|>, ...
const char *tok_pre_name(const tok *t);
enum tok_chat tok_chat_kind(const tok *t); // from tokenizer.chat_template, NONE if unrecognised

// Encode UTF-8 text. parse_special: text like "<|im_start|>" that names a control/user-defined
// token becomes that token. Does NOT add BOS. Returns the count, writes a malloc'd array to *ids;
// -1 on failure (message in err).
int tok_encode(const tok *t, const char *text, size_t len, int parse_special, int **ids,
               char *err, size_t errlen);
// The bytes of one token (control tokens decode to their text only if show_special).
// Returns a pointer valid for the tokenizer's lifetime and its length in *len.
const char *tok_piece(const tok *t, int id, int show_special, size_t *len);

// Offset of the first invalid UTF-8 byte in s[0..len), or -1 if valid.
long tok_utf8_invalid_at(const char *s, size_t len);

// Wrap a user message (and optional system text, may be NULL) in the chat template of `kind`,
// ending with the assistant prefix. Returns malloc'd text or NULL if kind is NONE.
char *tok_chat_apply(enum tok_chat kind, const char *system, const char *user);
