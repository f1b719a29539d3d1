// tests/tool_tokenize.c — drives tok/ for tests/test_tokenizer.py.
//   tool_tokenize MODEL.gguf [--special] [--roundtrip]
//   tool_tokenize MODEL.gguf --info
// MODEL may also be a Hugging Face directory (its tokenizer.json).
// Input (stdin, binary-safe): a sequence of records, each a u32 little-endian byte count followed
// by that many bytes of text. Output (stdout), one per record, in order:
//   default      one line: the token ids, space-separated (an empty line for no tokens), or
//                "ERROR <message>" if tok_encode failed
//   --roundtrip  one record (u32 LE count + bytes): the concatenated pieces of the record's tokens
//                (tok_piece with show_special), i.e. decode(encode(text)); a failed encode gives
//                the count 0xFFFFFFFF and no bytes
// --special turns on special-token parsing. --info ignores stdin and prints key=value lines about
// the tokenizer (n_vocab, bos, eos, add_bos, pre, chat, default_system, eog ids).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tok/tok.h"
#include "../weights/hf.h"

// Reads one record into *buf (grown as needed). 1 on success, 0 at a clean end of input.
static int read_record(char **buf, size_t *cap, uint32_t *len) {
    unsigned char hdr[4];
    size_t got = fread(hdr, 1, 4, stdin);
    if (got == 0) return 0;
    if (got != 4) { fprintf(stderr, "tool_tokenize: truncated record header\n"); exit(1); }
    *len = hdr[0] | hdr[1] << 8 | hdr[2] << 16 | (uint32_t)hdr[3] << 24;
    if ((size_t)*len + 1 > *cap) {
        *cap = (size_t)*len + 1;
        *buf = realloc(*buf, *cap);
        if (!*buf) { fprintf(stderr, "tool_tokenize: out of memory\n"); exit(1); }
    }
    if (fread(*buf, 1, *len, stdin) != *len) {
        fprintf(stderr, "tool_tokenize: truncated record\n");
        exit(1);
    }
    (*buf)[*len] = 0;
    return 1;
}

static void write_record(const char *p, uint32_t len) {
    unsigned char hdr[4] = {len & 255, len >> 8 & 255, len >> 16 & 255, len >> 24};
    fwrite(hdr, 1, 4, stdout);
    fwrite(p, 1, len, stdout);
}

static void print_info(const tok *t) {
    static const char *chat[] = {"none", "chatml", "llama3"};
    const char *sys = tok_chat_default_system(t);
    printf("n_vocab=%d\nbos=%d\neos=%d\nadd_bos=%d\npre=%s\nchat=%s\n", tok_n_vocab(t), tok_bos(t),
           tok_eos(t), tok_add_bos(t), tok_pre_name(t), chat[tok_chat_kind(t)]);
    printf("default_system=%s\neog=", sys ? sys : "");
    for (int id = 0, first = 1; id < tok_n_vocab(t); id++)
        if (tok_is_eog(t, id)) { printf(first ? "%d" : " %d", id); first = 0; }
    printf("\n");
}

static void print_ids(const int *ids, int n, const char *err) {
    if (n < 0) { printf("ERROR %s\n", err); return; }
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
}

static void roundtrip(const tok *t, const int *ids, int n) {
    if (n < 0) { fwrite("\xff\xff\xff\xff", 1, 4, stdout); return; }
    size_t total = 0, len;
    for (int i = 0; i < n; i++) { tok_piece(t, ids[i], 1, &len); total += len; }
    char *out = malloc(total + 1), *o = out;
    for (int i = 0; i < n; i++) {
        const char *p = tok_piece(t, ids[i], 1, &len);
        memcpy(o, p, len);
        o += len;
    }
    write_record(out, (uint32_t)total);
    free(out);
}

int main(int argc, char **argv) {
    int special = 0, rt = 0, info = 0, bad = argc < 2;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--special")) special = 1;
        else if (!strcmp(argv[i], "--roundtrip")) rt = 1;
        else if (!strcmp(argv[i], "--info")) info = 1;
        else bad = 1;
    }
    if (bad) {
        fprintf(stderr, "usage: tool_tokenize MODEL.gguf [--special] [--roundtrip] | --info\n");
        return 2;
    }
    char err[512];
    tok *t;
    if (hf_is_dir(argv[1])) {
        t = tok_load_hf(argv[1], err, sizeof err);
    } else {
        gguf_file *f = gguf_open(argv[1], err, sizeof err);
        if (!f) { fprintf(stderr, "tool_tokenize: %s\n", err); return 1; }
        t = tok_load_gguf(f, err, sizeof err);
        gguf_close(f);
    }
    if (!t) { fprintf(stderr, "tool_tokenize: %s\n", err); return 1; }
    if (info) print_info(t);
    char *buf = NULL;
    size_t cap = 0;
    uint32_t len;
    while (!info && read_record(&buf, &cap, &len)) {
        int *ids = NULL;
        int n = tok_encode(t, buf, len, special, &ids, err, sizeof err);
        if (rt) roundtrip(t, ids, n);
        else print_ids(ids, n, err);
        free(ids);
    }
    free(buf);
    tok_free(t);
    return 0;
}
