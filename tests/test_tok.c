// tests/test_tok.c — tok/ without a model: UTF-8 validation, the three pre-tokenizers on
// hand-worked cases, chat template text, and finding a template's default system prompt.
// (Encoding against llama.cpp and Hugging Face is tests/test_tokenizer.py.)
#include <stdlib.h>
#include <string.h>

#include "../tok/tok.h"
#include "check.h"

#define UTF8(lit, want) CHECK(tok_utf8_invalid_at(lit, sizeof lit - 1) == (want), "%s", #lit)

static void test_utf8(void) {
    UTF8("", -1);
    UTF8("plain ascii", -1);
    UTF8("h\xC3\xA9llo \xE6\x9D\xB1\xE4\xBA\xAC \xF0\x9F\x98\x80", -1);  // é 東京 😀
    UTF8("a\0b", -1);                       // NUL is a valid character
    UTF8("\xEF\xBF\xBF", -1);               // U+FFFF (a noncharacter, still valid)
    UTF8("\xF4\x8F\xBF\xBF", -1);           // U+10FFFF, the last code point
    UTF8("\xC0\x80", 0);                    // overlong NUL
    UTF8("\xC1\xBF", 0);                    // overlong 2-byte
    UTF8("ab\xE0\x80\x80", 2);              // overlong 3-byte
    UTF8("abc\xF0\x8F\xBF\xBF", 3);         // overlong 4-byte
    UTF8("\xED\xA0\x80", 0);                // U+D800, a surrogate
    UTF8("x\xED\xBF\xBF", 1);               // U+DFFF
    UTF8("\xF4\x90\x80\x80", 0);            // U+110000
    UTF8("\xF5\x80\x80\x80", 0);            // lead byte past U+10FFFF
    UTF8("\xF8\x88\x80\x80\x80", 0);        // 5-byte form
    UTF8("\xFF", 0);
    UTF8("ok\x80", 2);                      // stray continuation byte
    UTF8("abc\xE2\x82", 3);                 // truncated at the end
    UTF8("\xC3", 0);
    UTF8("\xE2\x82x\xAC", 0);               // continuation missing mid-text
    UTF8("\xC3\xA9\xC3\xA9\xC3", 4);        // offset counts bytes, not characters
}

// Splits text with pre-tokenizer `name` and checks the pieces against want (NULL-terminated).
static void check_split(const char *name, const char *text, const char *const *want) {
    char err[256];
    tok_pre *p = tok_pre_new(name, err, sizeof err);
    CHECK(p != NULL, "%s: %s", name, err);
    if (!p) return;
    size_t *ends = NULL, len = strlen(text), beg = 0;
    int n = tok_pre_split(p, text, len, &ends, err, sizeof err);
    int n_want = 0;
    while (want[n_want]) n_want++;
    CHECK(n == n_want, "%s on \"%s\": %d pieces, want %d", name, text, n, n_want);
    for (int i = 0; i < n && i < n_want; i++) {
        size_t piece = ends[i] - beg;
        CHECK(piece == strlen(want[i]) && memcmp(text + beg, want[i], piece) == 0,
              "%s on \"%s\": piece %d is \"%.*s\", want \"%s\"", name, text, i, (int)piece,
              text + beg, want[i]);
        beg = ends[i];
    }
    CHECK(n <= 0 || ends[n - 1] == len, "%s: pieces do not cover the text", name);
    free(ends);
    tok_pre_free(p);
}

#define SPLIT(name, text, ...) check_split(name, text, (const char *const[]){__VA_ARGS__, NULL})

static void test_pretokenizers(void) {
    // smollm: every digit alone first, then GPT-2's pattern within each stretch. " 's" is not a
    // contraction (the space comes first): " '" is a punctuation run, then "s".
    SPLIT("smollm", "Hello world123 's", "Hello", " world", "1", "2", "3", " '", "s");
    SPLIT("smollm", "I'm 12345 ok\n\n  x", "I", "'m", " ", "1", "2", "3", "4", "5", " ok",
          "\n\n ", " x");
    SPLIT("smollm", "WE'LL $5", "WE", "'", "LL", " $", "5");  // GPT-2 contractions are lowercase
    SPLIT("smollm", "a  b\t\tc", "a", " ", " b", "\t", "\t", "c");
    // llama3: numbers in runs of up to 3, contractions in any case, one non-letter may lead a
    // word, newlines gathered with the whitespace before them.
    SPLIT("llama3", "Hello world123 's", "Hello", " world", "123", " '", "s");
    SPLIT("llama3", "I'm 12345 ok\n\n  x", "I", "'m", " ", "123", "45", " ok", "\n\n", " ",
          " x");
    SPLIT("llama-bpe", "WE'LL $hello", "WE", "'LL", " $", "hello");
    SPLIT("llama3", "$hello...\n\nok", "$hello", "...\n\n", "ok");
    // qwen2: llama3's pattern with single digits.
    SPLIT("qwen2", "Hello world123 's", "Hello", " world", "1", "2", "3", " '", "s");
    SPLIT("qwen2", "I'm 12345 ok\n\n  x", "I", "'m", " ", "1", "2", "3", "4", "5", " ok", "\n\n",
          " ", " x");
    SPLIT("qwen2", "東京 2024年", "東京", " ", "2", "0", "2", "4", "年");

    char err[256];
    size_t *ends = NULL;
    tok_pre *p = tok_pre_new("smollm", err, sizeof err);
    CHECK(tok_pre_split(p, "", 0, &ends, err, sizeof err) == 0, "empty text has no pieces");
    free(ends);
    CHECK(tok_pre_split(p, "ab\xC3", 3, &ends, err, sizeof err) == -1, "invalid UTF-8 refused");
    CHECK(strstr(err, "byte offset 2") != NULL, "%s", err);
    CHECK(tok_pre_ignore_merges(p) == 0, "smollm merges every piece");
    tok_pre_free(p);
    p = tok_pre_new("llama3", err, sizeof err);
    CHECK(p && tok_pre_ignore_merges(p) == 1, "llama3 ignores merges for whole-vocab pieces");
    tok_pre_free(p);
    CHECK(tok_pre_new("gpt-4o", err, sizeof err) == NULL, "unknown pre-tokenizer refused");
    CHECK(strstr(err, "'gpt-4o'") && strstr(err, "smollm"), "%s", err);
}

static void check_chat(enum tok_chat kind, const char *system, const char *user, const char *want) {
    char *got = tok_chat_apply(kind, system, user);
    CHECK(got && strcmp(got, want) == 0, "got \"%s\"", got ? got : "(null)");
    free(got);
}

// SmolLM2-135M-Instruct's tokenizer.chat_template (real newlines inside the string literals).
static const char SMOLLM2_TEMPLATE[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

// A Qwen2.5-style template: escaped "\n", and a first "<|im_start|>system" that is an expression.
static const char QWEN_TEMPLATE[] =
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] }}{%- endif %}{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}";

static const char LLAMA3_TEMPLATE[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{{ content }}{% endfor %}";

static void test_chat(void) {
    CHECK(tok_chat_detect(SMOLLM2_TEMPLATE) == TOK_CHAT_CHATML, "SmolLM2 is ChatML");
    CHECK(tok_chat_detect(QWEN_TEMPLATE) == TOK_CHAT_CHATML, "Qwen is ChatML");
    CHECK(tok_chat_detect(LLAMA3_TEMPLATE) == TOK_CHAT_LLAMA3, "Llama 3");
    CHECK(tok_chat_detect("{{ messages }}") == TOK_CHAT_NONE, "unknown template");
    CHECK(tok_chat_detect(NULL) == TOK_CHAT_NONE, "no template");

    char *sys = tok_chat_find_default_system(SMOLLM2_TEMPLATE);
    CHECK(sys && !strcmp(sys, "You are a helpful AI assistant named SmolLM, trained by "
                              "Hugging Face"), "%s", sys ? sys : "(null)");
    free(sys);
    sys = tok_chat_find_default_system(QWEN_TEMPLATE);
    CHECK(sys && !strcmp(sys, "You are Qwen, created by Alibaba Cloud. You are a helpful "
                              "assistant."), "%s", sys ? sys : "(null)");
    free(sys);
    CHECK(tok_chat_find_default_system(LLAMA3_TEMPLATE) == NULL, "no literal system prompt");
    CHECK(tok_chat_find_default_system(NULL) == NULL, "no template");

    check_chat(TOK_CHAT_CHATML, NULL, "hi",
               "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    check_chat(TOK_CHAT_CHATML, "Be brief.", " two\nlines ",
               "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n two\nlines "
               "<|im_end|>\n<|im_start|>assistant\n");
    check_chat(TOK_CHAT_LLAMA3, NULL, "hi",
               "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n");
    check_chat(TOK_CHAT_LLAMA3, "  Be brief.\n", "\thi there \n",  // contents trimmed
               "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nhi there<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n");
    CHECK(tok_chat_apply(TOK_CHAT_NONE, NULL, "hi") == NULL, "no template, no text");
}

int main(void) {
    test_utf8();
    test_pretokenizers();
    test_chat();
    return check_summary("test_tok");
}
