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
    fwd_kv_pos_sync(u->g.cx->m, u->g.kv);   // a keep on the device leaves them there
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
    fwd_kv_pos_sync(u->g.cx->m, u->g.kv);
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

// The page: styles, the data, and a script that draws one grid per (prompt, strategy) on
// canvases (a cell's shade: the share of KV heads that kept the token, in blue, or for decode
// selection the share of steps x KV heads that read its key, in orange) with its axes (cache
// layer down the left, prompt token along the bottom, tick numbers spaced so they never touch)
// and a legend for the shade from 0 to 1; counts the cells it drew; lays the prompt's tokens out
// under each grid shaded by their mean over layers (hover: the layer values). Every grid fits the
// window's width: cells 2 to 8 px wide, a longer prompt wrapped into bands of tokens (each band
// every layer), laid out again when the window's width changes.
static const char PAGE_HEAD[] =
    "<!doctype html>\n"
    "<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
    "<title>sift: what each strategy kept</title>\n"
    "<style>\n"
    "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}\n"
    "h2{margin-top:2em;border-bottom:1px solid #ccc}\n"
    ".strategy{margin:1.2em 0}\n"
    ".meta{color:#555}\n"
    ".fig{display:flex;align-items:flex-start;margin-bottom:6px}\n"
    ".grid{display:block;outline:1px solid #999;image-rendering:pixelated}\n"
    ".plot{margin:0 8px}\n"
    ".axis-label{font-size:12px;color:#444;text-align:center}\n"
    ".axis-label.y{writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap;margin-right:2px}\n"
    ".ticks{position:relative;font-size:11px;line-height:1;color:#444}\n"
    ".ticks .tick{position:absolute;white-space:nowrap}\n"
    ".ticks.y{width:2.6em}\n"
    ".ticks.y .tick{right:0;transform:translateY(-50%)}\n"
    ".ticks.x{height:15px}\n"
    ".ticks.x .tick{top:3px;transform:translateX(-50%)}\n"
    ".legend{display:flex;align-items:flex-start;flex-wrap:wrap;gap:.3em .8em;font-size:12px;color:#444;margin:.3em 0}\n"
    ".legend-bar{position:relative;height:28px;width:160px;margin:0 .5em}\n"
    ".legend-bar canvas{display:block;outline:1px solid #999}\n"
    ".legend-bar .tick{position:absolute;top:15px;transform:translateX(-50%);font-size:11px;line-height:1}\n"
    ".tokens{font:12px/1.7 ui-monospace,monospace;white-space:pre-wrap;word-break:break-all;max-height:16em;overflow-y:auto;border:1px solid #ddd;padding:.4em}\n"
    ".tokens span{border-radius:2px}\n"
    ".answer{background:#f4f4f4;padding:.3em .5em}\n"
    "#errors{color:#b00}\n"
    "</style></head><body>\n"
    "<h1>What each strategy kept</h1>\n"
    "<p class=\"meta\">Each grid: rows are cache layers (0 at the top, numbered on the left), columns are prompt tokens (numbered below). Prefill strategies (blue): the share of KV heads that kept the token's keys and values (white: dropped by every head). Decode selection (topk, topk+phi; orange): how often decode read the key exactly, as a share of steps x KV heads. The legend under each grid gives the scale. A prompt too long for the window's width wraps into rows of tokens, each a grid of every layer, its token numbers going on from the row above. Written by sift --kept-map.</p>\n"
    "<div id=\"errors\"></div><div id=\"root\"></div>\n"
    "<script type=\"application/json\" id=\"data\">";

static const char PAGE_TAIL[] =
    "</script>\n"
    "<script>\n"
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
    "// the shade of a value above 0 (0 stays white): blue for kept, orange for decode's reads\n"
    "function shade(read, v) {\n"
    "  return (read ? 'rgba(214,96,16,' : 'rgba(31,94,180,') + (0.15 + 0.85 * v).toFixed(3) + ')';\n"
    "}\n"
    "// a tick step (1, 2 or 5 x 10^k) leaving at least px pixels between ticks of cells size wide\n"
    "function tickStep(size, px) {\n"
    "  for (let p = 1; ; p *= 10)\n"
    "    for (const m of [1, 2, 5]) if (m * p * size >= px) return m * p;\n"
    "}\n"
    "// tick labels along one side of a grid of cells from..to-1: at the centres of the cells\n"
    "// numbered by multiples of step\n"
    "function ticks(cls, from, to, size, step) {\n"
    "  const t = el('div', 'ticks ' + cls);\n"
    "  for (let i = Math.ceil(from / step) * step; i < to; i += step) {\n"
    "    const s = el('span', 'tick', String(i));\n"
    "    if (cls === 'x') s.style.left = ((i - from) * size + size / 2) + 'px';\n"
    "    else s.style.top = ((i - from) * size + size / 2) + 'px';\n"
    "    t.appendChild(s);\n"
    "  }\n"
    "  return t;\n"
    "}\n"
    "// what the shade means, 0 to 1, drawn with the grid's own colours\n"
    "function legend(read) {\n"
    "  const box = el('div', 'legend');\n"
    "  box.appendChild(el('span', 'legend-title', read ?\n"
    "    'shade: share of decode steps x KV heads that read the key exactly' :\n"
    "    'shade: share of KV heads that kept the token\\u2019s keys and values'));\n"
    "  const bar = el('div', 'legend-bar');\n"
    "  const c = el('canvas');\n"
    "  c.width = 160; c.height = 12;\n"
    "  const g = c.getContext('2d');\n"
    "  g.fillStyle = '#ffffff'; g.fillRect(0, 0, 160, 12);\n"
    "  for (let x = 1; x < 160; x++) { g.fillStyle = shade(read, x / 159); g.fillRect(x, 0, 1, 12); }\n"
    "  bar.appendChild(c);\n"
    "  const lab = el('div', 'legend-ticks');\n"
    "  [['0', 0], ['0.5', 80], ['1', 160]].forEach(([s, x]) => {\n"
    "    const t = el('span', 'tick', s); t.style.left = x + 'px'; lab.appendChild(t);\n"
    "  });\n"
    "  bar.appendChild(lab);\n"
    "  box.appendChild(bar);\n"
    "  box.appendChild(el('span', 'legend-note', '(white: 0, ' + (read ? 'never read' : 'dropped by every head') + ')'));\n"
    "  return box;\n"
    "}\n"
    "// the cells and bands of an n-token grid of L layers in avail pixels: cells 2 to 8 px wide; a\n"
    "// prompt wider than that at 2 px wraps into bands of per tokens (as even as a multiple of the\n"
    "// tick step allows, so the bands' columns line up), each band a grid of every layer, the\n"
    "// rows lower so that all bands together stay about as tall as one\n"
    "function layout(n, L, avail) {\n"
    "  const cw = Math.max(2, Math.min(8, Math.floor(avail / Math.max(n, 1))));\n"
    "  const step = tickStep(cw, 8 * String(n).length + 12);\n"
    "  let most = Math.max(1, Math.floor(avail / cw));\n"
    "  if (most >= step) most -= most % step;\n"
    "  const fewest = Math.max(1, Math.ceil(n / most));\n"
    "  const per = fewest === 1 ? Math.max(n, 1) : Math.min(most, Math.ceil(n / fewest / step) * step);\n"
    "  const bands = Math.max(1, Math.ceil(n / per)), rows = Math.max(1, L) * bands;\n"
    "  const ch = Math.max(2, Math.min(18, Math.floor((bands > 1 ? 480 : 240) / rows)));\n"
    "  return {cw, ch, step, per, bands};\n"
    "}\n"
    "// one band: tokens [t0, t1) of every layer, with its axes (layer numbers down the left, token\n"
    "// numbers along the bottom at the multiples of step); xtitle: the token axis's title under it\n"
    "function band(s, t0, t1, L, lay, xtitle) {\n"
    "  const {cw, ch, step} = lay;\n"
    "  const canvas = el('canvas', 'grid');\n"
    "  canvas.width = (t1 - t0) * cw; canvas.height = L * ch;\n"
    "  canvas.dataset.first = t0; canvas.dataset.count = t1 - t0; canvas.dataset.rows = L;\n"
    "  const g = canvas.getContext('2d');\n"
    "  g.fillStyle = '#ffffff'; g.fillRect(0, 0, canvas.width, canvas.height);\n"
    "  let drawn = 0;\n"
    "  for (let l = 0; l < L; l++)\n"
    "    for (let t = t0; t < t1; t++) {\n"
    "      const v = value(s, l, t);\n"
    "      if (v <= 0) continue;\n"
    "      g.fillStyle = shade(!!s.selected, v);\n"
    "      g.fillRect((t - t0) * cw, l * ch, cw, ch);\n"
    "      drawn++;\n"
    "    }\n"
    "  const fig = el('div', 'fig');\n"
    "  const ylab = el('div', 'axis-label y', 'cache layer');\n"
    "  ylab.style.minHeight = canvas.height + 'px';\n"
    "  fig.appendChild(ylab);\n"
    "  const yt = ticks('y', 0, L, ch, tickStep(ch, 14));\n"
    "  yt.style.height = canvas.height + 'px';\n"
    "  fig.appendChild(yt);\n"
    "  const inner = el('div', 'plot');\n"
    "  inner.style.width = canvas.width + 'px';\n"
    "  inner.appendChild(canvas);\n"
    "  inner.appendChild(ticks('x', t0, t1, cw, step));\n"
    "  if (xtitle) inner.appendChild(el('div', 'axis-label x', 'prompt token'));\n"
    "  fig.appendChild(inner);\n"
    "  return {fig, drawn};\n"
    "}\n"
    "// the page's width for a grid: the root's, less the layer axis beside each band\n"
    "const Y_AXIS = 80;\n"
    "let drawnFor = -1;\n"
    "function draw() {\n"
    "  drawnFor = root.clientWidth;\n"
    "  const avail = Math.max(100, drawnFor - Y_AXIS);\n"
    "  root.textContent = '';\n"
    "  D.prompts.forEach(p => {\n"
    "    const sec = el('section');\n"
    "    sec.appendChild(el('h2', '', 'prompt ' + p.id + ' (' + p.tokens.length + ' tokens)'));\n"
    "    p.strategies.forEach(s => {\n"
    "      const n = p.tokens.length, L = s.cache_layers;\n"
    "      const box = el('div', 'strategy');\n"
    "      box.dataset.strategy = s.strategy;\n"
    "      box.appendChild(el('h3', '', s.strategy + (s.label ? ' (' + s.label + ')' : '')));\n"
    "      const agree = s.greedy_agree_pct === null ? 'no full run to compare with' :\n"
    "        'first token = full: ' + (s.first_token_agree ? 'yes' : 'no') +\n"
    "        ', greedy agreement with full: ' + s.greedy_agree_pct.toFixed(1) + ' %';\n"
    "      box.appendChild(el('p', 'meta', agree + (s.note ? ' \\u2014 ' + s.note : '')));\n"
    "      const ans = el('p', 'answer');\n"
    "      ans.appendChild(el('b', '', 'answer: '));\n"
    "      ans.appendChild(document.createTextNode(s.text));\n"
    "      box.appendChild(ans);\n"
    "      const lay = layout(n, L, avail);\n"
    "      let drawn = 0;\n"
    "      for (let i = 0; i < lay.bands; i++) {\n"
    "        const t0 = i * lay.per, b = band(s, t0, Math.min(n, t0 + lay.per), L, lay, i === lay.bands - 1);\n"
    "        drawn += b.drawn;\n"
    "        box.appendChild(b.fig);\n"
    "      }\n"
    "      box.appendChild(legend(!!s.selected));\n"
    "      const count = el('p', 'meta');\n"
    "      count.appendChild(document.createTextNode((s.selected ? 'cells decode read: ' :\n"
    "        'cells kept: ')));\n"
    "      const c = el('span', 'drawn', String(drawn));\n"
    "      c.dataset.prompt = p.id; c.dataset.strategy = s.strategy;\n"
    "      count.appendChild(c);\n"
    "      count.appendChild(document.createTextNode(' of ' + (n * L) + ' (' + L +\n"
    "        ' cache layers x ' + n + ' tokens' + (lay.bands > 1 ? '; the tokens wrapped into ' +\n"
    "        lay.bands + ' rows of up to ' + lay.per : '') + ')'));\n"
    "      box.appendChild(count);\n"
    "      const toks = el('div', 'tokens');\n"
    "      p.tokens.forEach((tok, t) => {\n"
    "        let a = 0;\n"
    "        for (let l = 0; l < L; l++) a += value(s, l, t) / L;\n"
    "        const span = el('span', '', tok);\n"
    "        span.style.background = a > 0 ? (s.selected ? 'rgba(214,96,16,' : 'rgba(31,94,180,') +\n"
    "          (0.08 + 0.6 * a).toFixed(3) + ')' : 'transparent';\n"
    "        span.title = 'token ' + t + ': ' + (100 * a).toFixed(1) + ' % over layers';\n"
    "        toks.appendChild(span);\n"
    "      });\n"
    "      box.appendChild(toks);\n"
    "      sec.appendChild(box);\n"
    "    });\n"
    "    root.appendChild(sec);\n"
    "  });\n"
    "}\n"
    "document.querySelector('h1').textContent += ' \\u2014 ' + D.model;\n"
    "draw();\n"
    "// a window of another width lays the grids out again\n"
    "window.addEventListener('resize', () => { if (root.clientWidth !== drawnFor) draw(); });\n"
    "document.body.dataset.ready = '1';\n"
    "</script>\n"
    "</body></html>\n";

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
