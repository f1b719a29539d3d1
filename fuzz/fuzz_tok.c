// fuzz/fuzz_tok.c — libFuzzer target: the tokenizer (encode with and without special tokens,
// decode of every id produced, UTF-8 validation) and the chat templates on arbitrary bytes.
// The vocabulary comes from $SIFT_FUZZ_MODEL (default: the default model).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tok/tok.h"

static gguf_file *F;   // kept open (and reachable) for the whole run: tokens point into it
static tok *T;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    const char *path = getenv("SIFT_FUZZ_MODEL");
    char err[256];
    F = gguf_open(path ? path : "models/SmolLM2-135M-Instruct.Q4_1.gguf", err, sizeof err);
    T = F ? tok_load_gguf(F, err, sizeof err) : NULL;
    if (!T) {
        fprintf(stderr, "fuzz_tok: %s (set SIFT_FUZZ_MODEL)\n", err);
        exit(1);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *s = (const char *)data;
    long bad = tok_utf8_invalid_at(s, size);
    if (bad >= (long)size) abort();
    for (int special = 0; special < 2; special++) {
        int *ids = NULL;
        char err[256];
        int n = tok_encode(T, s, size, special, &ids, err, sizeof err);
        if (n < 0 && bad < 0) abort();   // valid UTF-8 must always tokenize
        for (int i = 0; i < n; i++) {
            size_t len;
            if (ids[i] < 0 || ids[i] >= tok_n_vocab(T) || !tok_piece(T, ids[i], 1, &len)) abort();
        }
        free(ids);
    }
    if (bad < 0) {
        char *text = malloc(size + 1);
        memcpy(text, data, size);
        text[size] = 0;
        free(tok_chat_apply(TOK_CHAT_CHATML, text, text));
        free(tok_chat_apply(TOK_CHAT_LLAMA3, NULL, text));
        free(text);
    }
    return 0;
}
