// tok/tok.c — byte-level BPE (GPT-2 style) from GGUF tokenizer metadata: loading the vocabulary
// and merges, special-token matching, the merge loop, and decoding token pieces.
//
// Byte-level BPE: every input byte is first written as one printable code point (GPT-2's
// bytes_to_unicode map), so the vocabulary and the merges are plain strings of those code points.
// Encoding = split out special tokens -> pre-tokenize each stretch between them -> per piece,
// start from one token per byte and repeatedly merge the adjacent pair of lowest merge rank.

// stb_ds spells GNU typeof as `typeof`, which -std=c11 only knows as __typeof__.
#define typeof __typeof__
#include <stb/stb_ds.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "tok.h"

enum { TT_NORMAL = TOK_NORMAL, TT_UNKNOWN = TOK_UNKNOWN, TT_CONTROL = TOK_CONTROL, TT_USER = TOK_USER,
       TT_UNUSED = TOK_UNUSED, TT_BYTE = TOK_BYTE };

typedef struct { int rank, id; } merge_val;           // merging a pair gives token `id`
typedef struct { uint64_t key; merge_val value; } merge_entry;  // key: left id << 32 | right id
typedef struct { char *key; int value; } text_entry;  // token text -> id
typedef struct { uint32_t len; int id; } special;

struct tok {
    int n_vocab;
    char *text_arena;        // the GGUF token texts, NUL-terminated
    size_t *text_off;
    uint32_t *text_len;
    char *piece_arena;       // decoded bytes of every token
    size_t *piece_off;
    uint32_t *piece_len;
    uint8_t *type;           // TT_*
    text_entry *by_text;     // stb_ds string hash
    merge_entry *merges;     // stb_ds hash
    int byte_id[256];        // token of each single byte, -1 if the vocabulary has none
    special *specials;       // stb_ds array: control + user-defined tokens, longest text first
    uint8_t special_first[256];  // 1 if some special token text starts with this byte
    int bos, eos, eot, add_bos;
    int *eog;                // stb_ds array of end-of-generation ids
    char *pre_name;
    tok_pre *pre;
    enum tok_chat chat;
    char *default_system;
};

// ---- GPT-2's byte <-> code point map --------------------------------------------------------

// Printable bytes stand for themselves; the other 68 take code points 256, 257, ... in order.
static int byte_to_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    int n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) n++;
    return 256 + n;
}

static int put_utf8(char *out, unsigned cp) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;  // the map only yields code points < 0x800
}

// Decodes one UTF-8 code point at s (valid or not); returns its length, cp = -1 if invalid.
static int get_utf8(const unsigned char *s, size_t n, int *cp) {
    int len = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : 4;
    if ((size_t)len > n || tok_utf8_invalid_at((const char *)s, len) >= 0) { *cp = -1; return 1; }
    int c = len == 1 ? s[0] : s[0] & (0x7F >> len);
    for (int k = 1; k < len; k++) c = (c << 6) | (s[k] & 0x3F);
    *cp = c;
    return len;
}

// ---- loading -------------------------------------------------------------------------------

// Read-only look-ups. stb_ds' plain get macros write their result into the table's header,
// which would make concurrent tok_encode calls race; the _ts forms keep it on the stack.
static int lookup(const tok *t, const char *text) {
    ptrdiff_t i;
    stbds_hmget_key_ts(t->by_text, sizeof *t->by_text, (void *)text, sizeof t->by_text->key, &i,
                       STBDS_HM_STRING);
    return i < 0 ? -1 : t->by_text[i].value;
}

static const merge_val *find_merge(const tok *t, int a, int b) {
    merge_entry *m = t->merges;
    ptrdiff_t i = -1;
    if (m) hmgeti_ts(m, (uint64_t)a << 32 | (uint32_t)b, i);
    return i < 0 ? NULL : &m[i].value;
}

static const char *text_of(const tok *t, int id) { return t->text_arena + t->text_off[id]; }

// ---- building from a tok_source -------------------------------------------------------------

static int build_vocab(tok *t, const tok_source *src, char *err, size_t errlen) {
    if (src->n_vocab <= 0) return err_printf(err, errlen, "the vocabulary is empty");
    int n = t->n_vocab = src->n_vocab;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (src->texts[i].len > 0xFFFFFFFFu) return err_printf(err, errlen, "token text too long");
        total += src->texts[i].len + 1;
    }
    t->text_arena = xmalloc(total);
    t->text_off = xmalloc(n * sizeof *t->text_off);
    t->text_len = xmalloc(n * sizeof *t->text_len);
    t->type = xmalloc(n);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        tok_str s = src->texts[i];
        if (s.len) memcpy(t->text_arena + off, s.p, s.len);
        t->text_arena[off + s.len] = 0;
        t->text_off[i] = off;
        t->text_len[i] = (uint32_t)s.len;
        // Keys point into text_arena (no copy); of duplicate texts the last id wins.
        if (!memchr(t->text_arena + off, 0, s.len)) shput(t->by_text, t->text_arena + off, i);
        off += s.len + 1;
        int ty = src->types ? src->types[i] : TOK_NORMAL;
        t->type[i] = ty >= TOK_NORMAL && ty <= TOK_BYTE ? (uint8_t)ty : TOK_NORMAL;
    }
    return 0;
}

// Byte tokens. A vocabulary may lack some (SmolLM2 has none for 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D,
// nor for bytes that never occur in UTF-8): such a byte stays a symbol that takes part in no merge
// and produces no token, as in llama.cpp (Hugging Face drops it too, but before merging).
static void load_byte_ids(tok *t) {
    for (int b = 0; b < 256; b++) {
        char s[3] = {0};
        put_utf8(s, (unsigned)byte_to_cp(b));
        t->byte_id[b] = lookup(t, s);
    }
}

// Merge strings "A B" -> (id A, id B) -> rank, id of AB. A merge whose parts or result are not in
// the vocabulary can never apply and is skipped; of duplicates the first (lowest rank) counts.
static void build_merges(tok *t, const tok_source *src) {
    char *buf = NULL;  // stb_ds array: "A\0B\0" then "AB\0"
    for (long r = 0; r < src->n_merges && r < 0x7FFFFFFF; r++) {
        tok_str m = src->merges[r];
        const char *sp = m.len > 1 ? memchr(m.p + 1, ' ', m.len - 1) : NULL;
        if (!sp || memchr(m.p, 0, m.len)) continue;
        size_t la = (size_t)(sp - m.p), lb = m.len - la - 1;
        arrsetlen(buf, 2 * m.len + 2);
        memcpy(buf, m.p, la); buf[la] = 0;
        memcpy(buf + la + 1, sp + 1, lb); buf[la + 1 + lb] = 0;
        memcpy(buf + m.len + 1, m.p, la); memcpy(buf + m.len + 1 + la, sp + 1, lb);
        buf[m.len + 1 + la + lb] = 0;
        int a = lookup(t, buf), b = lookup(t, buf + la + 1), ab = lookup(t, buf + m.len + 1);
        if (a < 0 || b < 0 || ab < 0) continue;
        if (!find_merge(t, a, b))
            hmput(t->merges, (uint64_t)a << 32 | (uint32_t)b, ((merge_val){(int)r, ab}));
    }
    arrfree(buf);
}

// What a token decodes to: byte tokens "<0xAB>" their byte, normal tokens their text mapped back
// through bytes_to_unicode (a code point outside the map is kept as is), others their text.
static void load_pieces(tok *t) {
    int cp_to_byte[324];
    memset(cp_to_byte, -1, sizeof cp_to_byte);
    for (int b = 0; b < 256; b++) cp_to_byte[byte_to_cp(b)] = b;
    size_t total = 0;
    for (int i = 0; i < t->n_vocab; i++) total += t->text_len[i];
    t->piece_arena = xmalloc(total + 1);
    t->piece_off = xmalloc(t->n_vocab * sizeof *t->piece_off);
    t->piece_len = xmalloc(t->n_vocab * sizeof *t->piece_len);
    size_t off = 0;
    for (int i = 0; i < t->n_vocab; i++) {
        const unsigned char *s = (const unsigned char *)text_of(t, i);
        size_t n = t->text_len[i], o = off;
        unsigned byte;
        if (t->type[i] == TT_BYTE && n == 6 && sscanf((const char *)s, "<0x%2X>", &byte) == 1) {
            t->piece_arena[o++] = (char)byte;
        } else if (t->type[i] == TT_NORMAL || t->type[i] == TT_UNUSED) {
            for (size_t k = 0; k < n;) {
                int cp, len = get_utf8(s + k, n - k, &cp);
                if (cp >= 0 && cp < 324 && cp_to_byte[cp] >= 0) {
                    t->piece_arena[o++] = (char)cp_to_byte[cp];
                } else {
                    memcpy(t->piece_arena + o, s + k, len);
                    o += len;
                }
                k += len;
            }
        } else {
            memcpy(t->piece_arena + o, s, n);
            o += n;
        }
        t->piece_off[i] = off;
        t->piece_len[i] = (uint32_t)(o - off);
        off = o;
    }
}

static int by_len_desc(const void *pa, const void *pb) {
    const special *a = pa, *b = pb;
    return a->len != b->len ? (a->len < b->len) - (a->len > b->len) : a->id - b->id;
}

// Control and user-defined tokens with non-empty valid UTF-8 text (so that splitting text at them
// keeps every stretch valid UTF-8), longest first; and the end-of-generation set.
static void load_specials(tok *t, const tok_source *src) {
    static const char *eog_texts[] = {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>",
                                      "<|endoftext|>", "<|end_of_text|>"};
    for (int i = 0; i < t->n_vocab; i++) {
        if (t->type[i] != TT_CONTROL && t->type[i] != TT_USER) continue;
        const char *s = text_of(t, i);
        if (t->text_len[i] && tok_utf8_invalid_at(s, t->text_len[i]) < 0) {
            arrput(t->specials, ((special){t->text_len[i], i}));
            t->special_first[(unsigned char)s[0]] = 1;
        }
        for (size_t k = 0; k < sizeof eog_texts / sizeof *eog_texts; k++)
            if (t->type[i] == TT_CONTROL && strcmp(s, eog_texts[k]) == 0) arrput(t->eog, i);
    }
    if (arrlen(t->specials) > 1)   // none: the array is NULL, which qsort may not take
        qsort(t->specials, arrlen(t->specials), sizeof *t->specials, by_len_desc);
    if (t->eos >= 0) arrput(t->eog, t->eos);
    if (t->eot >= 0) arrput(t->eog, t->eot);
    for (int i = 0; i < src->n_eog; i++)
        if (src->eog[i] >= 0 && src->eog[i] < t->n_vocab) arrput(t->eog, src->eog[i]);
}

tok *tok_build(tok_source *src, char *err, size_t errlen) {
    tok *t = xcalloc(1, sizeof *t);
    t->pre = src->pre;
    t->pre_name = src->pre_name;
    src->pre = NULL;
    src->pre_name = NULL;
    t->bos = src->bos;
    t->eos = src->eos;
    t->eot = src->eot;
    t->add_bos = src->add_bos;
    int rc = t->pre ? build_vocab(t, src, err, errlen) : err_printf(err, errlen, "no pre-tokenizer");
    int ids[] = {t->bos, t->eos, t->eot};
    for (int i = 0; i < 3 && rc == 0; i++)
        if (ids[i] < -1 || ids[i] >= t->n_vocab)
            rc = err_printf(err, errlen, "special token id %d is outside the vocabulary of %d", ids[i],
                            t->n_vocab);
    if (!rc && t->add_bos && t->bos < 0)
        rc = err_printf(err, errlen, "the tokenizer adds a BOS token but has none");
    if (rc) {
        tok_free(t);
        return NULL;
    }
    load_byte_ids(t);
    build_merges(t, src);
    t->chat = tok_chat_detect(src->chat_template);
    t->default_system =
        t->chat == TOK_CHAT_CHATML ? tok_chat_find_default_system(src->chat_template) : NULL;
    load_pieces(t);
    load_specials(t, src);
    return t;
}

// ---- from GGUF metadata ---------------------------------------------------------------------

// Integer element i of a numeric GGUF array; 0 on success.
static int arr_int(const gguf_kv *kv, uint64_t i, int64_t *out) {
    const uint8_t *p = kv->v.arr.data;
    switch (kv->v.arr.type) {
    case GGUF_I8: *out = ((const int8_t *)p)[i]; return 0;
    case GGUF_U8: *out = p[i]; return 0;
    case GGUF_I16: { int16_t v; memcpy(&v, p + 2 * i, 2); *out = v; return 0; }
    case GGUF_U16: { uint16_t v; memcpy(&v, p + 2 * i, 2); *out = v; return 0; }
    case GGUF_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); *out = v; return 0; }
    case GGUF_U32: { uint32_t v; memcpy(&v, p + 4 * i, 4); *out = v; return 0; }
    default: return -1;
    }
}

static const gguf_kv *find_str_array(const gguf_file *f, const char *key) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    return kv && kv->type == GGUF_ARR && kv->v.arr.type == GGUF_STR ? kv : NULL;
}

// The GGUF string array as tok_strs (malloc'd).
static tok_str *gguf_strs(const gguf_kv *kv) {
    tok_str *s = xmalloc((kv->v.arr.n ? kv->v.arr.n : 1) * sizeof *s);
    for (uint64_t i = 0; i < kv->v.arr.n; i++) s[i] = (tok_str){kv->v.arr.strs[i].p, kv->v.arr.strs[i].len};
    return s;
}

static int gguf_vocab(const gguf_file *f, tok_source *src, char *err, size_t errlen) {
    const gguf_kv *tokens = find_str_array(f, "tokenizer.ggml.tokens");
    if (!tokens) return err_printf(err, errlen, "GGUF has no tokenizer.ggml.tokens string array");
    if (tokens->v.arr.n == 0 || tokens->v.arr.n > 0x7FFFFFFF)
        return err_printf(err, errlen, "tokenizer.ggml.tokens has a bad token count");
    int n = src->n_vocab = (int)tokens->v.arr.n;
    src->texts = gguf_strs(tokens);
    const gguf_kv *types = gguf_find_kv(f, "tokenizer.ggml.token_type");
    if (types && (types->type != GGUF_ARR || types->v.arr.n != (uint64_t)n))
        return err_printf(err, errlen, "tokenizer.ggml.token_type is not an array of one type per token");
    uint8_t *ty = xmalloc(n);
    src->types = ty;
    for (int i = 0; i < n; i++) {
        int64_t v = TT_NORMAL;
        if (types && arr_int(types, i, &v))
            return err_printf(err, errlen, "tokenizer.ggml.token_type is not an integer array");
        ty[i] = v >= TT_NORMAL && v <= TT_BYTE ? (uint8_t)v : TT_NORMAL;
    }
    const gguf_kv *merges = find_str_array(f, "tokenizer.ggml.merges");
    if (!merges) return err_printf(err, errlen, "GGUF has no tokenizer.ggml.merges string array");
    src->merges = gguf_strs(merges);
    src->n_merges = (long)(merges->v.arr.n < 0x7FFFFFFF ? merges->v.arr.n : 0x7FFFFFFF);
    return 0;
}

// Optional token id key: -1 if absent; error if present but out of range.
static int load_id(const gguf_file *f, const char *key, int n_vocab, int *out, char *err,
                   size_t errlen) {
    int64_t v;
    *out = -1;
    if (!gguf_find_kv(f, key)) return 0;
    if (gguf_get_i64(f, key, &v) || v < 0 || v >= n_vocab)
        return err_printf(err, errlen, "%s is not a token id of this vocabulary", key);
    *out = (int)v;
    return 0;
}

static int gguf_config(const gguf_file *f, tok_source *src, char *err, size_t errlen) {
    char *model = gguf_get_str(f, "tokenizer.ggml.model");
    if (!model) return err_printf(err, errlen, "GGUF has no tokenizer.ggml.model (no tokenizer)");
    int ok = strcmp(model, "gpt2") == 0;
    if (!ok)
        err_printf(err, errlen, "unsupported tokenizer model '%s' (only byte-level BPE 'gpt2')", model);
    free(model);
    if (!ok) return -1;
    src->pre_name = gguf_get_str(f, "tokenizer.ggml.pre");
    if (!src->pre_name)
        return err_printf(err, errlen, "GGUF has no tokenizer.ggml.pre: the pre-tokenizer is unknown "
                                 "(supported: smollm, llama3 (llama-bpe), qwen2)");
    src->pre = tok_pre_new(src->pre_name, err, errlen);
    if (!src->pre) return -1;
    if (gguf_find_kv(f, "tokenizer.ggml.add_bos_token") &&
        gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &src->add_bos))
        return err_printf(err, errlen, "tokenizer.ggml.add_bos_token is not a bool");
    return 0;
}

tok *tok_load_gguf(const gguf_file *f, char *err, size_t errlen) {
    tok_source src = {.bos = -1, .eos = -1, .eot = -1};
    int rc = gguf_config(f, &src, err, errlen);
    if (!rc) rc = gguf_vocab(f, &src, err, errlen);
    if (!rc) rc = load_id(f, "tokenizer.ggml.bos_token_id", src.n_vocab, &src.bos, err, errlen);
    if (!rc) rc = load_id(f, "tokenizer.ggml.eos_token_id", src.n_vocab, &src.eos, err, errlen);
    if (!rc) rc = load_id(f, "tokenizer.ggml.eot_token_id", src.n_vocab, &src.eot, err, errlen);
    char *tmpl = rc ? NULL : gguf_get_str(f, "tokenizer.chat_template");
    src.chat_template = tmpl;
    tok *t = rc ? NULL : tok_build(&src, err, errlen);
    free(tmpl);
    free((void *)src.texts);
    free((void *)src.types);
    free((void *)src.merges);
    tok_pre_free(src.pre);
    free(src.pre_name);
    return t;
}

void tok_free(tok *t) {
    if (!t) return;
    free(t->text_arena); free(t->text_off); free(t->text_len); free(t->type);
    free(t->piece_arena); free(t->piece_off); free(t->piece_len);
    shfree(t->by_text);
    hmfree(t->merges);
    arrfree(t->specials);
    arrfree(t->eog);
    free(t->pre_name);
    tok_pre_free(t->pre);
    free(t->default_system);
    free(t);
}

int tok_n_vocab(const tok *t) { return t->n_vocab; }
int tok_bos(const tok *t) { return t->bos; }
int tok_eos(const tok *t) { return t->eos; }
int tok_add_bos(const tok *t) { return t->add_bos; }
const char *tok_pre_name(const tok *t) { return t->pre_name; }
enum tok_chat tok_chat_kind(const tok *t) { return t->chat; }
const char *tok_chat_default_system(const tok *t) { return t->default_system; }

int tok_is_eog(const tok *t, int id) {
    for (ptrdiff_t i = 0; i < arrlen(t->eog); i++)
        if (t->eog[i] == id) return 1;
    return 0;
}

const char *tok_piece(const tok *t, int id, int show_special, size_t *len) {
    if (id < 0 || id >= t->n_vocab) { *len = 0; return ""; }   // e.g. padded embedding rows
    int hidden = (t->type[id] == TT_CONTROL || t->type[id] == TT_UNKNOWN) && !show_special;
    *len = hidden ? 0 : t->piece_len[id];
    return t->piece_arena + t->piece_off[id];
}

// ---- the merge loop ------------------------------------------------------------------------

// A candidate merge of symbol `left` with the symbol after it, valid while they are still
// neighbours holding the ids it was made from (every merge changes its left symbol's id, unlinks
// its right symbol and clears that symbol's next).
typedef struct { int rank, left, right, left_id, right_id, merged_id; } cand;

typedef struct {
    int *id, *prev, *next;  // stb_ds arrays, one symbol per byte of the piece at the start
    cand *heap;             // stb_ds array, min-heap by (rank, left)
    char *scratch;          // stb_ds array: the piece in byte-level text (ignore_merges lookup)
} bpe_work;

static int cand_less(const cand *a, const cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

static void heap_push(bpe_work *w, cand c) {
    arrput(w->heap, c);
    for (ptrdiff_t i = arrlen(w->heap) - 1; i > 0;) {
        ptrdiff_t parent = (i - 1) / 2;
        if (!cand_less(&w->heap[i], &w->heap[parent])) break;
        cand tmp = w->heap[i]; w->heap[i] = w->heap[parent]; w->heap[parent] = tmp;
        i = parent;
    }
}

static cand heap_pop(bpe_work *w) {
    cand top = w->heap[0];
    w->heap[0] = arrpop(w->heap);
    ptrdiff_t n = arrlen(w->heap);
    for (ptrdiff_t i = 0;;) {
        ptrdiff_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && cand_less(&w->heap[l], &w->heap[m])) m = l;
        if (r < n && cand_less(&w->heap[r], &w->heap[m])) m = r;
        if (m == i) break;
        cand tmp = w->heap[i]; w->heap[i] = w->heap[m]; w->heap[m] = tmp;
        i = m;
    }
    return top;
}

static void try_pair(const tok *t, bpe_work *w, int left) {
    if (left < 0 || w->next[left] < 0) return;
    int right = w->next[left];
    if (w->id[left] < 0 || w->id[right] < 0) return;  // a byte without a token never merges
    const merge_val *m = find_merge(t, w->id[left], w->id[right]);
    if (m) heap_push(w, (cand){m->rank, left, right, w->id[left], w->id[right], m->id});
}

// Appends the tokens of one pre-token piece s[0, n) to *out.
static void bpe_piece(const tok *t, bpe_work *w, const unsigned char *s, int n, int **out) {
    if (tok_pre_ignore_merges(t->pre)) {
        arrsetlen(w->scratch, 0);
        for (int i = 0; i < n; i++) {
            char u[2];
            int k = put_utf8(u, (unsigned)byte_to_cp(s[i]));
            for (int j = 0; j < k; j++) arrput(w->scratch, u[j]);
        }
        arrput(w->scratch, 0);
        int id = lookup(t, w->scratch);
        if (id >= 0) { arrput(*out, id); return; }
    }
    arrsetlen(w->id, n); arrsetlen(w->prev, n); arrsetlen(w->next, n);
    arrsetlen(w->heap, 0);
    for (int i = 0; i < n; i++) {
        w->id[i] = t->byte_id[s[i]];
        w->prev[i] = i - 1;
        w->next[i] = i + 1 < n ? i + 1 : -1;
    }
    for (int i = 0; i + 1 < n; i++) try_pair(t, w, i);
    while (arrlen(w->heap)) {
        cand c = heap_pop(w);
        if (w->id[c.left] != c.left_id || w->next[c.left] != c.right ||
            w->id[c.right] != c.right_id)
            continue;  // stale
        w->id[c.left] = c.merged_id;
        w->next[c.left] = w->next[c.right];
        if (w->next[c.left] >= 0) w->prev[w->next[c.left]] = c.left;
        w->next[c.right] = -1;  // unlinked: every candidate starting at it is now stale
        try_pair(t, w, w->prev[c.left]);
        try_pair(t, w, c.left);
    }
    for (int i = 0; i >= 0; i = w->next[i])
        if (w->id[i] >= 0) arrput(*out, w->id[i]);
}

// Pre-tokenizes and merges text[0, len) (valid UTF-8, no special tokens) onto *out.
static int encode_plain(const tok *t, bpe_work *w, const char *text, size_t len, int **out,
                        char *err, size_t errlen) {
    size_t *ends = NULL;
    int n = len ? tok_pre_split(t->pre, text, len, &ends, err, errlen) : 0;
    if (n < 0) return -1;
    size_t beg = 0;
    for (int i = 0; i < n; i++) {
        bpe_piece(t, w, (const unsigned char *)text + beg, (int)(ends[i] - beg), out);
        beg = ends[i];
    }
    free(ends);
    return 0;
}

// The special token that starts at s (longest first), or -1.
static int match_special(const tok *t, const char *s, size_t n, int parse_special) {
    if (!t->special_first[(unsigned char)s[0]]) return -1;
    for (ptrdiff_t i = 0; i < arrlen(t->specials); i++) {
        int id = t->specials[i].id;
        uint32_t len = t->specials[i].len;
        if (t->type[id] == TT_CONTROL && !parse_special) continue;
        if (len <= n && memcmp(s, text_of(t, id), len) == 0) return id;
    }
    return -1;
}

int tok_encode(const tok *t, const char *text, size_t len, int parse_special, int **ids,
               char *err, size_t errlen) {
    long bad = tok_utf8_invalid_at(text, len);
    if (bad >= 0) {
        snprintf(err, errlen, "text is not valid UTF-8 (byte offset %ld)", bad);
        return -1;
    }
    if (len > 0x7FFFFFFF) {
        snprintf(err, errlen, "text too long to tokenize (%zu bytes)", len);
        return -1;
    }
    bpe_work w = {0};
    int *out = NULL, rc = 0;
    size_t from = 0;  // start of the stretch not yet encoded
    for (size_t pos = 0; pos < len && rc == 0;) {
        int id = match_special(t, text + pos, len - pos, parse_special);
        if (id < 0) { pos++; continue; }
        rc = encode_plain(t, &w, text + from, pos - from, &out, err, errlen);
        arrput(out, id);
        pos += t->text_len[id];
        from = pos;
    }
    if (rc == 0) rc = encode_plain(t, &w, text + from, len - from, &out, err, errlen);
    arrfree(w.id); arrfree(w.prev); arrfree(w.next); arrfree(w.heap); arrfree(w.scratch);
    int n = (int)arrlen(out);
    if (rc == 0) {
        *ids = xmalloc((n ? n : 1) * sizeof **ids);
        if (n) memcpy(*ids, out, n * sizeof **ids);  // out is NULL when n == 0
    }
    arrfree(out);
    return rc ? -1 : n;
}

int tok_encode_prompt(const tok *t, const char *text, size_t len, int parse_special, int **ids,
                      char *err, size_t errlen) {
    int *body = NULL, n = tok_encode(t, text, len, parse_special, &body, err, errlen);
    if (n < 0) return -1;
    int bos = tok_add_bos(t) && tok_bos(t) >= 0;
    *ids = xmalloc((size_t)(n + bos + 1) * sizeof(int));
    if (bos) (*ids)[0] = tok_bos(t);
    memcpy(*ids + bos, body, (size_t)n * sizeof(int));
    free(body);
    return n + bos;
}
