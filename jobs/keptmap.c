// jobs/keptmap.c — `--kept-map FILE.html`: what each strategy kept of each prompt, drawn. Per
// (prompt, strategy): a grid of cache layers x prompt tokens, read from the KV cache after
// prefill (each entry remembers its position per KV head: a cell is how many KV heads hold that
// token's keys and values) and, for decode strategies that select keys (topk, topk+phi), how
// often decode read each key exactly (over steps and KV heads). One self-contained page (the
// data inline, a script that draws it; no network) and the same data as JSON beside it.
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../util/outfile.h"
#include "internal.h"

struct keptmap {
    char *strategy, *label, *note, *text;
    int index, seq;            // the request's position in the input; the order kept
    char *id;
    int n_layer, n_kv_head, n_prompt;
    int *ids;                  // (n_prompt,) the prompt's tokens
    long *kept;                // (n_layer, n_prompt): KV heads holding the position
    long *selected;            // (n_layer, n_prompt) decode's exact reads, or NULL
    long *selected_of;         // (n_layer,) what each count is out of (steps x KV heads)
    int first_agree;           // -1: no full to compare with
    double greedy_agree;
};

void km_capture_prefill(unit *u) {
    const kv_cache *kv = u->g.kv;
    keptmap *k = xcalloc(1, sizeof *k);
    k->n_layer = kv->n_layer, k->n_prompt = u->n_ids;
    k->n_kv_head = kv->n_layer ? kv->layers[0].n_kv_head : 0;
    k->ids = xmalloc((size_t)(u->n_ids ? u->n_ids : 1) * sizeof(int));
    memcpy(k->ids, u->ids, (size_t)u->n_ids * sizeof(int));
    k->kept = xcalloc((size_t)k->n_layer * k->n_prompt + 1, sizeof *k->kept);
    for (int l = 0; l < kv->n_layer; l++) {
        const kv_layer *y = &kv->layers[l];
        for (int g = 0; g < y->n_kv_head; g++)
            for (int e = 0; e < y->len; e++) {
                int pos = y->pos[(size_t)g * y->cap + e];
                if (pos >= 0 && pos < k->n_prompt) k->kept[(size_t)l * k->n_prompt + pos]++;
            }
    }
    u->km = k;
}

void km_capture_decode(unit *u) {
    keptmap *k = u->km;
    if (!k || !u->g.info.decode_selected || !u->g.kv) return;
    k->selected = xcalloc((size_t)k->n_layer * k->n_prompt + 1, sizeof *k->selected);
    k->selected_of = xcalloc((size_t)k->n_layer, sizeof *k->selected_of);
    for (int l = 0; l < k->n_layer; l++)
        k->selected_of[l] = u->g.info.decode_selected(u->g.info.decode.ctx, l, &u->g.kv->layers[l],
                                                      k->selected + (size_t)l * k->n_prompt, k->n_prompt);
}

void km_keep(runner *R, unit *u) {
    keptmap *k = u->km;
    if (!k) return;
    u->km = NULL;
    const run_stats *st = &u->g.st;
    k->strategy = strdup(u->s->name);
    k->label = strdup(st->label);
    k->note = strdup(st->note);
    k->text = strdup(u->ans.text ? u->ans.text : "");
    k->id = strdup(u->rq->id);
    k->index = u->rq->index, k->seq = R->n_km;
    k->first_agree = u->first_agree, k->greedy_agree = u->greedy_agree;
    R->km = xrealloc(R->km, (size_t)(R->n_km + 1) * sizeof *R->km);
    R->km[R->n_km++] = k;
}

void km_free(keptmap *k) {
    if (!k) return;
    free(k->strategy), free(k->label), free(k->note), free(k->text), free(k->id);
    free(k->ids), free(k->kept), free(k->selected), free(k->selected_of);
    free(k);
}

// A JSON string inside an HTML <script> element: "</" must not end it early.
static void json_str(FILE *f, const char *s, size_t n, int in_html) {
    if (!in_html) {
        tok_json_str(f, s, n);
        return;
    }
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    tok_json_str(mem, s, n);
    fclose(mem);
    for (size_t i = 0; i < len; i++) {
        if (buf[i] == '<') fputs("\\u003c", f);
        else fputc(buf[i], f);
    }
    free(buf);
}

// g (rows, cols) as a JSON array of rows.
static void write_grid(FILE *f, const long *g, int rows, int cols) {
    fputc('[', f);
    for (int r = 0; r < rows; r++) {
        fprintf(f, "%s[", r ? "," : "");
        for (int c = 0; c < cols; c++) fprintf(f, c ? ",%ld" : "%ld", g[(size_t)r * cols + c]);
        fputc(']', f);
    }
    fputc(']', f);
}

static int by_index(const void *a, const void *b) {
    const keptmap *x = *(keptmap *const *)a, *y = *(keptmap *const *)b;
    if (x->index != y->index) return (x->index > y->index) - (x->index < y->index);
    return (x->seq > y->seq) - (x->seq < y->seq);
}

// The data: {"model", "prompts": [{"id", "tokens": [piece, ...], "strategies": [{"strategy",
// "label", "note", "text", "first_token_agree", "greedy_agree_pct", "cache_layers", "kv_heads",
// "kept": [[KV heads holding token i, ...] per cache layer], "selected": [[exact reads of
// token i's key] per cache layer] or null, "selected_of": [steps x KV heads per cache layer] or
// null}]}]}, prompts in input order.
static void write_data(FILE *f, runner *R, int in_html) {
    qsort(R->km, (size_t)R->n_km, sizeof *R->km, by_index);
    fprintf(f, "{\"format\":\"sift-kept-map/1\",\"model\":");
    json_str(f, R->model_name, strlen(R->model_name), in_html);
    fprintf(f, ",\"prompts\":[");
    for (int i = 0; i < R->n_km;) {
        const keptmap *p = R->km[i];
        fprintf(f, "%s{\"id\":", i ? "," : "");
        json_str(f, p->id, strlen(p->id), in_html);
        fprintf(f, ",\"tokens\":[");
        for (int t = 0; t < p->n_prompt; t++) {
            size_t n;
            const char *piece = tok_piece(R->t, p->ids[t], 1, &n);
            if (t) fputc(',', f);
            json_str(f, piece, n, in_html);
        }
        fprintf(f, "],\"strategies\":[");
        int j = i;
        for (; j < R->n_km && R->km[j]->index == p->index; j++) {
            const keptmap *k = R->km[j];
            fprintf(f, "%s{\"strategy\":", j > i ? "," : "");
            json_str(f, k->strategy, strlen(k->strategy), in_html);
            fprintf(f, ",\"label\":");
            json_str(f, k->label, strlen(k->label), in_html);
            fprintf(f, ",\"note\":");
            json_str(f, k->note, strlen(k->note), in_html);
            fprintf(f, ",\"text\":");
            json_str(f, k->text, strlen(k->text), in_html);
            if (k->first_agree < 0) fprintf(f, ",\"first_token_agree\":null,\"greedy_agree_pct\":null");
            else fprintf(f, ",\"first_token_agree\":%s,\"greedy_agree_pct\":%.2f",
                         k->first_agree ? "true" : "false", k->greedy_agree);
            fprintf(f, ",\"cache_layers\":%d,\"kv_heads\":%d,\"kept\":", k->n_layer, k->n_kv_head);
            write_grid(f, k->kept, k->n_layer, k->n_prompt);
            fprintf(f, ",\"selected\":");
            if (!k->selected) fprintf(f, "null,\"selected_of\":null");
            else {
                write_grid(f, k->selected, k->n_layer, k->n_prompt);
                fprintf(f, ",\"selected_of\":[");
                for (int l = 0; l < k->n_layer; l++) fprintf(f, l ? ",%ld" : "%ld", k->selected_of[l]);
                fputc(']', f);
            }
            fputc('}', f);
        }
        fprintf(f, "]}");
        i = j;
    }
    fprintf(f, "]}\n");
}

// The page: styles, the data, and a script that draws one grid per (prompt, strategy) on a
// canvas (a cell's shade: the share of KV heads that kept the token, or for decode selection the
// share of steps x KV heads that read its key), counts the cells it drew as kept, and lays the
// prompt's tokens out under each grid shaded by their mean over layers (hover: the layer values).
static const char PAGE_HEAD[] =
    "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
    "<title>sift: what each strategy kept</title>\n<style>\n"
    "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}\n"
    "h2{margin-top:2em;border-bottom:1px solid #ccc}\n"
    ".strategy{margin:1.2em 0}\n.meta{color:#555}\n"
    ".grid{display:block;border:1px solid #999;image-rendering:pixelated;max-width:100%}\n"
    ".scroll{overflow-x:auto}\n"
    ".tokens{font:12px/1.7 ui-monospace,monospace;white-space:pre-wrap;word-break:break-all;"
    "max-height:16em;overflow-y:auto;border:1px solid #ddd;padding:.4em}\n"
    ".tokens span{border-radius:2px}\n.answer{background:#f4f4f4;padding:.3em .5em}\n"
    "#errors{color:#b00}\n</style></head><body>\n"
    "<h1>What each strategy kept</h1>\n"
    "<p class=\"meta\">Rows: cache layers (0 at the top); columns: prompt tokens. Prefill "
    "strategies: the share of KV heads that kept the token's keys and values (white: dropped "
    "by every head). Decode selection (topk, topk+phi): how often decode read the key exactly, "
    "as a share of steps x KV heads. Written by sift --kept-map.</p>\n"
    "<div id=\"errors\"></div><div id=\"root\"></div>\n"
    "<script type=\"application/json\" id=\"data\">";

static const char PAGE_TAIL[] =
    "</script>\n<script>\n"
    "'use strict';\n"
    "window.addEventListener('error', e => {\n"
    "  document.getElementById('errors').textContent += 'error: ' + e.message + '\\n';\n"
    "});\n"
    "const D = JSON.parse(document.getElementById('data').textContent);\n"
    "const root = document.getElementById('root');\n"
    "function el(tag, cls, text) {\n"
    "  const e = document.createElement(tag);\n"
    "  if (cls) e.className = cls;\n"
    "  if (text !== undefined) e.textContent = text;\n"
    "  return e;\n"
    "}\n"
    "// a cell's value in [0, 1]: decode selection when counted, else the KV heads that kept it\n"
    "function value(s, l, t) {\n"
    "  if (s.selected) return s.selected_of[l] > 0 ? s.selected[l][t] / s.selected_of[l] : 0;\n"
    "  return s.kv_heads > 0 ? s.kept[l][t] / s.kv_heads : 0;\n"
    "}\n"
    "document.querySelector('h1').textContent += ' \\u2014 ' + D.model;\n"
    "D.prompts.forEach((p, pi) => {\n"
    "  const sec = el('section');\n"
    "  sec.appendChild(el('h2', '', 'prompt ' + p.id + ' (' + p.tokens.length + ' tokens)'));\n"
    "  p.strategies.forEach(s => {\n"
    "    const n = p.tokens.length, L = s.cache_layers;\n"
    "    const cw = Math.max(1, Math.min(8, Math.floor(1600 / Math.max(n, 1))));\n"
    "    const ch = Math.max(2, Math.min(10, Math.floor(240 / Math.max(L, 1))));\n"
    "    const box = el('div', 'strategy');\n"
    "    box.appendChild(el('h3', '', s.strategy + (s.label ? ' (' + s.label + ')' : '')));\n"
    "    const agree = s.greedy_agree_pct === null ? 'no full run to compare with' :\n"
    "      'first token = full: ' + (s.first_token_agree ? 'yes' : 'no') +\n"
    "      ', greedy agreement with full: ' + s.greedy_agree_pct.toFixed(1) + ' %';\n"
    "    box.appendChild(el('p', 'meta', agree + (s.note ? ' \\u2014 ' + s.note : '')));\n"
    "    const ans = el('p', 'answer');\n"
    "    ans.appendChild(el('b', '', 'answer: '));\n"
    "    ans.appendChild(document.createTextNode(s.text));\n"
    "    box.appendChild(ans);\n"
    "    const canvas = el('canvas', 'grid');\n"
    "    canvas.width = n * cw; canvas.height = L * ch;\n"
    "    const g = canvas.getContext('2d');\n"
    "    g.fillStyle = '#ffffff'; g.fillRect(0, 0, canvas.width, canvas.height);\n"
    "    let drawn = 0;\n"
    "    const mean = new Float64Array(n);\n"
    "    for (let l = 0; l < L; l++)\n"
    "      for (let t = 0; t < n; t++) {\n"
    "        const v = value(s, l, t);\n"
    "        mean[t] += v / L;\n"
    "        if (v <= 0) continue;\n"
    "        g.fillStyle = 'rgba(31,94,180,' + (0.15 + 0.85 * v).toFixed(3) + ')';\n"
    "        g.fillRect(t * cw, l * ch, cw, ch);\n"
    "        drawn++;\n"
    "      }\n"
    "    const wrap = el('div', 'scroll'); wrap.appendChild(canvas); box.appendChild(wrap);\n"
    "    const count = el('p', 'meta');\n"
    "    const c = el('span', 'drawn', String(drawn));\n"
    "    c.dataset.prompt = p.id; c.dataset.strategy = s.strategy;\n"
    "    count.appendChild(document.createTextNode((s.selected ? 'cells decode read: ' :\n"
    "      'cells kept: ')));\n"
    "    count.appendChild(c);\n"
    "    count.appendChild(document.createTextNode(' of ' + (n * L) + ' (' + L +\n"
    "      ' cache layers x ' + n + ' tokens)'));\n"
    "    box.appendChild(count);\n"
    "    const toks = el('div', 'tokens');\n"
    "    p.tokens.forEach((tok, t) => {\n"
    "      const span = el('span', '', tok);\n"
    "      const a = mean[t];\n"
    "      span.style.background = a > 0 ? 'rgba(31,94,180,' + (0.08 + 0.6 * a).toFixed(3) + ')' : 'transparent';\n"
    "      span.title = 'token ' + t + ': ' + (100 * a).toFixed(1) + ' % over layers';\n"
    "      toks.appendChild(span);\n"
    "    });\n"
    "    box.appendChild(toks);\n"
    "    sec.appendChild(box);\n"
    "  });\n"
    "  root.appendChild(sec);\n"
    "});\n"
    "document.body.dataset.ready = '1';\n"
    "</script>\n</body></html>\n";

// FILE.json beside FILE.html (FILE.json appended when the name does not end in .html).
char *jobs_kept_map_json(const char *html) {
    struct stat st;
    if (stat(html, &st) == 0 && !S_ISREG(st.st_mode)) return NULL;   // a device or pipe: no "beside"
    size_t n = strlen(html);
    if (n > 5 && strcmp(html + n - 5, ".html") == 0) return fmt("%.*s.json", (int)(n - 5), html);
    return fmt("%s.json", html);
}

// Built in memory, then written whole (util/outfile.c).
static int write_file(runner *R, const char *path, int html) {
    outbuf b;
    FILE *f = outbuf_open(&b);
    if (html) fputs(PAGE_HEAD, f);
    write_data(f, R, html);
    if (html) fputs(PAGE_TAIL, f);
    char err[4400];
    if (outbuf_write(&b, path, "--kept-map", err, sizeof err)) {
        fprintf(stderr, "sift: error: %s\n", err);
        return -1;
    }
    return 0;
}

int km_write(runner *R, const char *path) {
    char *json = jobs_kept_map_json(path);
    int rc = write_file(R, path, 1) || (json && write_file(R, json, 0)) ? -1 : 0;
    if (!rc && !R->o->quiet)
        fprintf(stderr, "sift: kept map of %d runs written to %s (data: %s)\n", R->n_km, path,
                json ? json : "inside the page only: FILE is not a regular file");
    free(json);
    for (int i = 0; i < R->n_km; i++) km_free(R->km[i]);
    free(R->km);
    R->km = NULL, R->n_km = 0;
    return rc;
}
