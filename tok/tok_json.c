// tok/tok_json.c — a tokenizer from a Hugging Face directory: tokenizer.json gives the BPE
// vocabulary, merges and added tokens and its pre_tokenizer, which becomes regex stages for
// pretok.c (Split regex -> as written, Digits -> \p{N} or \p{N}+, ByteLevel with use_regex ->
// GPT-2's pattern); tokenizer_config.json gives bos/eos, add_bos_token and the chat template;
// generation_config.json more end-of-generation ids. Only byte-level BPE is accepted; a
// sentencepiece-style BPE (byte_fallback) or another normalizer than NFC is refused. NFC itself
// is not applied (as llama.cpp does not): text that is not already NFC may tokenize differently.
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "../weights/hf.h"
#include "tok.h"

#define MAX_ID 0x1000000 // ids at or above this are refused as absurd

typedef struct {
    const char *dir;
    json_t *tokj, *cfg, *gen; // tokenizer.json, tokenizer_config.json, generation_config.json
    tok_source src;
    tok_str *texts;
    uint8_t *types;
    tok_str *merges;
    char **merge_bufs; // merges given as [a, b] pairs, joined "a b"
    int *eog;
} hf_tok;

static int bad(const hf_tok *h, char *err, size_t errlen, const char *what) {
    return err_printf(err, errlen, "%s/tokenizer.json: %s", h->dir, what);
}

// Vocabulary ids and added tokens -> texts and types, n_vocab = largest id + 1.
static int read_vocab(hf_tok *h, char *err, size_t errlen) {
    json_t *model = json_object_get(h->tokj, "model"), *vocab = json_object_get(model, "vocab"),
           *added = json_object_get(h->tokj, "added_tokens");
    const char *key;
    json_t *v;
    long n = 0;
    if (!json_is_object(vocab)) return bad(h, err, errlen, "model.vocab is not an object");
    if (added && !json_is_array(added)) return bad(h, err, errlen, "added_tokens is not an array");
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= MAX_ID)
            return bad(h, err, errlen, "a model.vocab id is not an integer in [0, 2^24)");
        if (json_integer_value(v) >= n) n = (long)json_integer_value(v) + 1;
    }
    size_t i;
    json_array_foreach(added, i, v) {
        json_t *id = json_object_get(v, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= MAX_ID || !json_is_string(json_object_get(v, "content")))
            return bad(h, err, errlen, "an added token lacks an id in [0, 2^24) or its content");
        if (json_integer_value(id) >= n) n = (long)json_integer_value(id) + 1;
    }
    if (n == 0) return bad(h, err, errlen, "the vocabulary is empty");
    h->texts = xcalloc((size_t)n, sizeof *h->texts);
    h->types = xmalloc((size_t)n);
    memset(h->types, TOK_UNUSED, (size_t)n);
    json_object_foreach(vocab, key, v) {
        long id = (long)json_integer_value(v);
        h->texts[id] = (tok_str){key, strlen(key)};
        h->types[id] = TOK_NORMAL;
    }
    json_array_foreach(added, i, v) {
        long id = (long)json_integer_value(json_object_get(v, "id"));
        const json_t *c = json_object_get(v, "content");
        h->texts[id] = (tok_str){json_string_value(c), json_string_length(c)};
        h->types[id] = json_is_true(json_object_get(v, "special")) ? TOK_CONTROL : TOK_USER;
    }
    h->src.n_vocab = (int)n;
    h->src.texts = h->texts;
    h->src.types = h->types;
    return 0;
}

// merges: ["a b", ...] or [["a", "b"], ...]
static int read_merges(hf_tok *h, char *err, size_t errlen) {
    json_t *merges = json_object_get(json_object_get(h->tokj, "model"), "merges");
    if (!json_is_array(merges)) return bad(h, err, errlen, "model.merges is not an array");
    size_t n = json_array_size(merges), i;
    json_t *m;
    h->merges = xcalloc(n ? n : 1, sizeof *h->merges);
    h->merge_bufs = xcalloc(n ? n : 1, sizeof *h->merge_bufs);
    h->src.n_merges = (long)n;
    json_array_foreach(merges, i, m) {
        if (json_is_string(m)) {
            h->merges[i] = (tok_str){json_string_value(m), json_string_length(m)};
            continue;
        }
        json_t *a = json_array_get(m, 0), *b = json_array_get(m, 1);
        if (!json_is_array(m) || json_array_size(m) != 2 || !json_is_string(a) ||
            !json_is_string(b))
            return bad(h, err, errlen, "a merge is neither \"a b\" nor [\"a\", \"b\"]");
        size_t la = json_string_length(a), lb = json_string_length(b);
        char *s = h->merge_bufs[i] = xmalloc(la + lb + 2);
        memcpy(s, json_string_value(a), la);
        s[la] = ' ';
        memcpy(s + la + 1, json_string_value(b), lb);
        s[la + lb + 1] = 0;
        h->merges[i] = (tok_str){s, la + lb + 1};
    }
    h->src.merges = h->merges;
    return 0;
}

// One pre_tokenizer entry -> regex stages appended to re[*n]; *byte_level set by ByteLevel.
static int pre_stage(const hf_tok *h, const json_t *p, const char **re, int *n, int *byte_level,
                     char *err, size_t errlen) {
    const char *type = json_string_value(json_object_get(p, "type"));
    char what[160];
    if (!type) return bad(h, err, errlen, "a pre_tokenizer has no type");
    if (*n >= TOK_PRE_MAX_STAGES) return bad(h, err, errlen, "too many pre_tokenizer stages");
    if (strcmp(type, "Split") == 0) {
        const char *rx = json_string_value(json_object_get(json_object_get(p, "pattern"), "Regex"));
        const char *beh = json_string_value(json_object_get(p, "behavior"));
        if (!rx || !beh || strcmp(beh, "Isolated") != 0 ||
            json_is_true(json_object_get(p, "invert")))
            return bad(h, err, errlen,
                       "only Split pre_tokenizers with a Regex pattern, behavior "
                       "Isolated and no invert are supported");
        re[(*n)++] = rx;
    } else if (strcmp(type, "Digits") == 0) {
        re[(*n)++] = json_is_true(json_object_get(p, "individual_digits")) ? "\\p{N}" : "\\p{N}+";
    } else if (strcmp(type, "ByteLevel") == 0) {
        if (json_is_true(json_object_get(p, "add_prefix_space")))
            return bad(h, err, errlen, "ByteLevel with add_prefix_space is not supported");
        if (!json_is_false(json_object_get(p, "use_regex")))
            re[(*n)++] = tok_pre_byte_level_regex();
        *byte_level = 1;
    } else {
        snprintf(what, sizeof what,
                 "pre_tokenizer type '%.40s' is not supported (Sequence, Split, "
                 "Digits, ByteLevel)",
                 type);
        return bad(h, err, errlen, what);
    }
    return 0;
}

static int read_pre(hf_tok *h, char *err, size_t errlen) {
    json_t *model = json_object_get(h->tokj, "model"),
           *pre = json_object_get(h->tokj, "pre_tokenizer");
    json_t *norm = json_object_get(h->tokj, "normalizer");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (mtype && strcmp(mtype, "BPE") != 0) return bad(h, err, errlen, "model.type is not BPE");
    if (json_is_true(json_object_get(model, "byte_fallback")))
        return bad(h, err, errlen,
                   "byte_fallback BPE (sentencepiece style) is not supported; "
                   "byte-level BPE is");
    const char *ntype = json_string_value(json_object_get(norm, "type"));
    if (norm && !json_is_null(norm) && (!ntype || strcmp(ntype, "NFC") != 0))
        return bad(h, err, errlen, "a normalizer other than NFC is not supported");
    const char *re[TOK_PRE_MAX_STAGES];
    int n = 0, byte_level = 0, rc = 0;
    const char *ptype = json_string_value(json_object_get(pre, "type"));
    if (ptype && strcmp(ptype, "Sequence") == 0) {
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(pre, "pretokenizers"), i, p) if (!rc) rc =
            pre_stage(h, p, re, &n, &byte_level, err, errlen);
    } else if (ptype) {
        rc = pre_stage(h, pre, re, &n, &byte_level, err, errlen);
    }
    if (rc) return -1;
    if (!byte_level || n == 0)
        return bad(h, err, errlen,
                   "no ByteLevel pre_tokenizer with a splitting regex: not a "
                   "byte-level BPE tokenizer");
    h->src.pre = tok_pre_from_regex(re, n, json_is_true(json_object_get(model, "ignore_merges")),
                                    err, errlen);
    h->src.pre_name = strdup("tokenizer.json");
    return h->src.pre ? 0 : -1;
}

// The id of the token whose text is s, or -1.
static int id_of(const hf_tok *h, const char *s) {
    size_t n = s ? strlen(s) : 0;
    for (int i = s ? 0 : h->src.n_vocab; i < h->src.n_vocab; i++)
        if (h->texts[i].len == n && memcmp(h->texts[i].p, s, n) == 0) return i;
    return -1;
}

// tokenizer_config.json's "bos_token"/"eos_token": a string or {"content": ...}.
static const char *cfg_token(const hf_tok *h, const char *key) {
    json_t *v = json_object_get(h->cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_string_value(v);
}

// Without add_bos_token: a TemplateProcessing post-processor (also inside a Sequence) whose
// single-sequence template starts with a special token adds that token as BOS.
static int template_bos(const hf_tok *h, const json_t *pp) {
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (type && strcmp(type, "Sequence") == 0) {
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(pp, "processors"), i, p) {
            int id = template_bos(h, p);
            if (id >= 0) return id;
        }
        return -1;
    }
    if (!type || strcmp(type, "TemplateProcessing") != 0) return -1;
    json_t *first = json_array_get(json_object_get(pp, "single"), 0);
    return id_of(h,
                 json_string_value(json_object_get(json_object_get(first, "SpecialToken"), "id")));
}

static void read_specials(hf_tok *h) {
    h->src.bos = id_of(h, cfg_token(h, "bos_token"));
    h->src.eos = id_of(h, cfg_token(h, "eos_token"));
    h->src.eot = -1;
    json_t *add = json_object_get(h->cfg, "add_bos_token");
    if (json_is_boolean(add)) {
        h->src.add_bos = json_is_true(add);
    } else {
        int id = template_bos(h, json_object_get(h->tokj, "post_processor"));
        h->src.add_bos = id >= 0;
        if (id >= 0) h->src.bos = id;
    }
    json_t *ids = json_object_get(h->gen, "eos_token_id");
    size_t n = json_is_array(ids) ? json_array_size(ids) : json_is_integer(ids), i;
    h->eog = xcalloc(n ? n : 1, sizeof *h->eog);
    for (i = 0; i < n; i++) {
        json_t *v = json_is_array(ids) ? json_array_get(ids, i) : ids;
        h->eog[h->src.n_eog++] = json_is_integer(v) ? (int)json_integer_value(v) : -1;
    }
    h->src.eog = h->eog;
    json_t *tmpl = json_object_get(h->cfg, "chat_template");
    if (json_is_array(tmpl)) { // [{"name": "default", "template": ...}, ...]
        size_t k;
        json_t *e, *pick = NULL;
        json_array_foreach(tmpl, k, e) {
            const char *name = json_string_value(json_object_get(e, "name"));
            if (!pick || (name && strcmp(name, "default") == 0)) pick = e;
        }
        tmpl = json_object_get(pick, "template");
    }
    h->src.chat_template = json_string_value(tmpl);
}

static void hf_tok_free(hf_tok *h) {
    json_decref(h->tokj);
    json_decref(h->cfg);
    json_decref(h->gen);
    free(h->texts);
    free(h->types);
    for (long i = 0; h->merge_bufs && i < h->src.n_merges; i++)
        free(h->merge_bufs[i]);
    free(h->merge_bufs);
    free(h->merges);
    free(h->eog);
    tok_pre_free(h->src.pre);
    free(h->src.pre_name);
}

tok *tok_load_hf(const char *dir, char *err, size_t errlen) {
    hf_tok h = {.dir = dir};
    tok *t = NULL;
    h.tokj = hf_read_json(dir, "tokenizer.json", 1, err, errlen);
    if (h.tokj) h.cfg = hf_read_json(dir, "tokenizer_config.json", 0, err, errlen);
    if (h.tokj && !h.cfg && !err[0]) h.cfg = json_object();
    if (h.cfg) h.gen = hf_read_json(dir, "generation_config.json", 0, err, errlen);
    if (h.cfg && !h.gen && !err[0]) h.gen = json_object();
    if (h.gen && read_vocab(&h, err, errlen) == 0 && read_merges(&h, err, errlen) == 0 &&
        read_pre(&h, err, errlen) == 0) {
        read_specials(&h);
        t = tok_build(&h.src, err, errlen);
    }
    hf_tok_free(&h);
    return t;
}
