// tok/chat.c — built-in chat templates. sift does not run Jinja: it recognises the two template
// families by their marker tokens and writes what those templates write for one (system, user)
// turn followed by the assistant prefix.
//   ChatML:  <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n
//            <|im_start|>assistant\n
//   Llama-3: <|start_header_id|>system<|end_header_id|>\n\n{system}<|eot_id|> (same for user)
//            <|start_header_id|>assistant<|end_header_id|>\n\n   (contents trimmed, as its
//            template's `| trim` does; <|begin_of_text|> is the BOS token, added by the caller)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "tok.h"

enum tok_chat tok_chat_detect(const char *tmpl) {
    if (!tmpl) return TOK_CHAT_NONE;
    if (strstr(tmpl, "<|im_start|>")) return TOK_CHAT_CHATML;
    if (strstr(tmpl, "<|start_header_id|>")) return TOK_CHAT_LLAMA3;
    return TOK_CHAT_NONE;
}

// A ChatML template that gives a default system prompt writes it as one string literal:
// '<|im_start|>system\n' + TEXT + '<|im_end|>', the newline either real or the escape "\n".
// Finds the first such literal whose TEXT has no quote or brace (i.e. is not an expression) and
// returns TEXT with its escapes undone.
char *tok_chat_find_default_system(const char *tmpl) {
    static const char marker[] = "<|im_start|>system";
    for (const char *p = tmpl ? strstr(tmpl, marker) : NULL; p; p = strstr(p + 1, marker)) {
        const char *s = p + strlen(marker);
        if (*s == '\n') s += 1;
        else if (s[0] == '\\' && s[1] == 'n') s += 2;
        else continue;
        const char *e = strstr(s, "<|im_end|>");
        if (!e || e == s || strcspn(s, "'\"{}") < (size_t)(e - s)) continue;
        char *out = xmalloc(e - s + 1), *o = out;
        for (const char *c = s; c < e; c++) {
            if (c[0] == '\\' && c + 1 < e) {
                c++;
                *o++ = *c == 'n' ? '\n' : *c == 't' ? '\t' : *c;
            } else {
                *o++ = *c;
            }
        }
        *o = 0;
        return out;
    }
    return NULL;
}

// s without leading and trailing ASCII whitespace, as (pointer, length).
static const char *trim(const char *s, int *len) {
    const char *ws = " \t\n\v\f\r";
    s += strspn(s, ws);
    size_t n = strlen(s);
    while (n && strchr(ws, s[n - 1])) n--;
    *len = (int)n;
    return s;
}

// One turn in the template of kind, appended at o (room checked by the caller).
static char *turn(enum tok_chat kind, char *o, const char *role, const char *content) {
    if (kind == TOK_CHAT_CHATML) return o + sprintf(o, "<|im_start|>%s\n%s<|im_end|>\n", role, content);
    int len;
    const char *s = trim(content, &len);
    return o + sprintf(o, "<|start_header_id|>%s<|end_header_id|>\n\n%.*s<|eot_id|>", role, len, s);
}

char *tok_chat_apply_turns(enum tok_chat kind, const char *system, const char *const *roles,
                           const char *const *contents, int n) {
    if (kind != TOK_CHAT_CHATML && kind != TOK_CHAT_LLAMA3) return NULL;
    size_t need = (system ? strlen(system) : 0) + 128;
    for (int i = 0; i < n; i++) need += strlen(roles[i]) + strlen(contents[i]) + 96;
    char *out = xmalloc(need), *o = out;
    if (system) o = turn(kind, o, "system", system);
    for (int i = 0; i < n; i++) o = turn(kind, o, roles[i], contents[i]);
    if (kind == TOK_CHAT_CHATML) sprintf(o, "<|im_start|>assistant\n");
    else sprintf(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return out;
}

char *tok_chat_apply(enum tok_chat kind, const char *system, const char *user) {
    const char *role = "user";
    return tok_chat_apply_turns(kind, system, &role, &user, 1);
}
