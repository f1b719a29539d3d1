// eval/plot.c — the SVG figures: `sift eval --plot`: two panels side by side, accuracy vs context
// and TTFT vs context, one coloured line per strategy (contexts evenly spaced in the order given,
// a single context in the middle), a shared legend underneath; `sift sweep --plot`: fidelity
// against speedup, one dot per setting, the Pareto frontier ringed and connected (a frontier of
// one point: ringed, and the title says so), each dot labelled, a legend for every kind of mark.
//
// Readability rules both figures keep (tests/test_plots.py measures them in a browser):
// - no two texts overlap: text widths are estimated from above (per character, for a wide sans
//   font) and sweep labels are placed where they clear every placed label and point; a label that
//   fits nowhere becomes a number at its point, with the label in a key beside the plot;
// - every point lies inside its plot frame: the axes span the data with padding inside the frame
//   (the sweep's: half a tick step beyond each end, so no dot or ring sits on the frame's edge);
// - no point hides another: sweep settings drawn at the same spot (e.g. two settings raised to
//   the same floor, which run identically) are one point named after all of them, with a note;
//   eval strategies at the same value of one context are drawn side by side, with a note.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "eval.h"

static const char *const COLORS[] = {"#222222", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                     "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"};
#define N_COLORS (int)(sizeof COLORS / sizeof *COLORS)

// ---- shared: text extents, boxes, escapes, axis ranges ----

// An upper estimate of the width of s at font size `size` in a sans-serif font (per-character
// classes sized for DejaVu Sans, the widest common default): placement decisions need widths
// before any browser has laid the text out, and an overestimate only leaves more room.
static double text_w(const char *s, double size) {
    double w = 0;
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if ((*c & 0xC0) == 0x80) continue;   // a UTF-8 continuation byte
        if (*c >= 0x80) w += 1.0;
        else if (strchr(" iljtfrI.,:;'|!()[]-", *c)) w += 0.45;
        else if (strchr("mwMW=+~<>%@#&", *c)) w += 1.0;
        else if (*c >= 'A' && *c <= 'Z') w += 0.8;
        else w += 0.66;
    }
    return w * size;
}
// A text's box reaches this far above and below its baseline (font ascent and descent, rounded up).
#define ASCENT 0.95
#define DESCENT 0.27

typedef struct { double x0, y0, x1, y1; } box;

static int overlaps(box a, box b) { return a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1; }
static int inside(box a, box frame) {
    return a.x0 >= frame.x0 && a.x1 <= frame.x1 && a.y0 >= frame.y0 && a.y1 <= frame.y1;
}

// A malloc'd formatted string.
static char *afmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *afmt(const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    char *s = NULL;
    int n = vasprintf(&s, f, ap);
    va_end(ap);
    CHECK_INTERNAL(n >= 0, "out of memory formatting a plot text");
    return s;
}

static void xml_text(FILE *f, const char *s) {
    for (; *s; s++)
        if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else if (*s == '&') fputs("&amp;", f);
        else if (*s == '"') fputs("&quot;", f);
        else fputc(*s, f);
}

// A text element whose top-left corner is (x, y) (the baseline follows from ASCENT). Point labels
// (class "label...") get a white halo, so that a leader line passing under one leaves it readable.
static void text_at(FILE *f, double x, double y, double size, const char *cls, const char *fill,
                    const char *s) {
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%g\" class=\"%s\"%s%s%s%s>", x, y + ASCENT * size,
            size, cls, fill ? " fill=\"" : "", fill ? fill : "", fill ? "\"" : "",
            strncmp(cls, "label", 5) == 0 ? " stroke=\"white\" stroke-width=\"3\" paint-order=\"stroke\"" : "");
    xml_text(f, s);
    fputs("</text>\n", f);
}

// A "nice" step (1, 2 or 5 x 10^k) at or above v.
static double nice_step(double v) {
    if (!(v > 0)) return 1;
    double p = pow(10, floor(log10(v))), steps[] = {1, 2, 5, 10};
    for (int i = 0; i < 4; i++)
        if (steps[i] * p >= v * (1 - 1e-9)) return steps[i] * p;
    return 10 * p;
}

// An axis over the values [lo, hi]: bounds on multiples of a nice step, about four steps; a
// single value gets a range around it; unit: the values lie in [0, 1] (shares), which the
// bounds then keep to.
typedef struct { double lo, hi, step; } axis;

static axis fit_axis(double lo, double hi, int unit) {
    axis a;
    if (!(lo <= hi)) lo = 0, hi = 1;   // no values
    if (hi - lo < 1e-9 * (fabs(hi) + 1)) {
        double d = unit ? 0.1 : fabs(lo) > 0 ? fabs(lo) * 0.1 : 0.5;
        lo -= d, hi += d;
    }
    a.step = nice_step((hi - lo) / 4);
    a.lo = floor(lo / a.step + 1e-9) * a.step;
    a.hi = ceil(hi / a.step - 1e-9) * a.step;
    if (unit) {
        if (a.lo < 0) a.lo = 0;
        if (a.hi > 1) a.hi = 1;
    }
    return a;
}

// A tick value as text: as many decimals as the step needs.
static void tick_text(char *buf, size_t n, double v, double step) {
    int dec = 0;   // the fewest decimals that write the step exactly (0.25: 2)
    while (dec < 6 && fabs(step * pow(10, dec) - round(step * pow(10, dec))) > 1e-6) dec++;
    if (fabs(v) < step * 1e-6) v = 0;
    snprintf(buf, n, "%.*f", dec, v);
}

// ---- sift eval: accuracy and TTFT against context ----

enum { PANEL_W_MIN = 440, PANEL_H = 300, LEFT = 70, TOP = 40, GAP = 90, PAD = 14, PT_R = 4, DODGE = 10 };

// Mean of one field over (strategy, ctx) records; NaN when there are none.
static double cell_mean(const eval_report *r, const char *strategy, int ctx, int ttft) {
    double sum = 0;
    int n = 0;
    for (int i = 0; i < r->n_recs; i++)
        if (strcmp(r->recs[i].strategy, strategy) == 0 && r->recs[i].ctx == ctx) {
            sum += ttft ? r->recs[i].ttft_ms : r->recs[i].score;
            n++;
        }
    return n ? sum / n : NAN;
}

// A list of note lines (malloc'd strings) printed under a figure.
typedef struct { char **line; int n; } notes;

static void note_add(notes *ns, char *s) {
    ns->line = xrealloc(ns->line, (size_t)(ns->n + 1) * sizeof *ns->line);
    ns->line[ns->n++] = s;
}
// The notes drawn: at most MAX_NOTES lines, the last saying how many more there were.
enum { MAX_NOTES = 8 };
static void draw_notes(FILE *f, const notes *ns, double x, double y, const char *more) {
    for (int i = 0; i < ns->n && i < MAX_NOTES; i++) {
        char *extra = NULL;
        if (i == MAX_NOTES - 1 && ns->n > MAX_NOTES) extra = afmt("... and %d more %s", ns->n - i, more);
        text_at(f, x, y + 18 * i, 12, "note", "#444", extra ? extra : ns->line[i]);
        free(extra);
    }
}
static int notes_h(const notes *ns) { return 18 * (ns->n < MAX_NOTES ? ns->n : MAX_NOTES); }

static void notes_free(notes *ns) {
    for (int i = 0; i < ns->n; i++) free(ns->line[i]);
    free(ns->line);
}

// Context c's x in a panel at x0: the contexts' centres evenly spread, one context in the middle.
static double ctx_x(const eval_report *r, int x0, int pw, int c) { return x0 + pw * (c + 0.5) / r->n_ctxs; }

// The panel's points: px, py (n_strategies, n_ctxs), NaN where a strategy has no record; where
// strategies' points at a context would overlap they are moved apart sideways (DODGE pixels
// between neighbours, in strategy order) and a note (into ns, when given) names them with their
// values. Returns the most points moved apart at one spot (the panel is made wide enough).
static int panel_points(const eval_report *r, int x0, int pw, int ttft, double ymax, double *px,
                        double *py, notes *ns) {
    int S = r->n_strategies, widest = 1;
    int *ord = xmalloc((size_t)(S ? S : 1) * sizeof *ord);
    for (int c = 0; c < r->n_ctxs; c++) {
        int k = 0;
        for (int s = 0; s < S; s++) {
            double v = cell_mean(r, r->strategies[s], r->ctxs[c], ttft);
            px[s * r->n_ctxs + c] = isnan(v) ? NAN : ctx_x(r, x0, pw, c);
            py[s * r->n_ctxs + c] = isnan(v) ? NAN : TOP + PAD + (PANEL_H - 2 * PAD) * (1 - v / ymax);
            if (!isnan(v)) ord[k++] = s;
        }
        // by y (then strategy order): runs of points closer than a marker's width are one cluster
        for (int i = 1; i < k; i++)
            for (int j = i; j > 0 && py[ord[j] * r->n_ctxs + c] < py[ord[j - 1] * r->n_ctxs + c]; j--) {
                int t = ord[j];
                ord[j] = ord[j - 1], ord[j - 1] = t;
            }
        for (int i = 0; i < k;) {
            int j = i + 1;
            while (j < k && py[ord[j] * r->n_ctxs + c] - py[ord[j - 1] * r->n_ctxs + c] < 2 * PT_R + 1) j++;
            if (j - i > widest) widest = j - i;
            if (j - i > 1) {
                // strategy order within the cluster, so the sideways order matches the legend
                for (int a = i + 1; a < j; a++)
                    for (int b = a; b > i && ord[b] < ord[b - 1]; b--) {
                        int t = ord[b];
                        ord[b] = ord[b - 1], ord[b - 1] = t;
                    }
                for (int a = i; a < j; a++) px[ord[a] * r->n_ctxs + c] += DODGE * (a - i - (j - i - 1) / 2.0);
                if (ns) {
                    char *buf = NULL;
                    size_t len = 0;
                    FILE *m = open_memstream(&buf, &len);
                    fprintf(m, "%s at context %d: ", ttft ? "TTFT" : "accuracy", r->ctxs[c]);
                    for (int a = i; a < j; a++)
                        fprintf(m, "%s%s %.4g", a > i ? ", " : "", r->strategies[ord[a]],
                                cell_mean(r, r->strategies[ord[a]], r->ctxs[c], ttft));
                    fputs(" (drawn side by side)", m);
                    fclose(m);
                    note_add(ns, buf);
                }
            }
            i = j;
        }
    }
    free(ord);
    return widest;
}

// A panel's y axis from 0: accuracy to 1 in quarters; TTFT to the first multiple of a nice step
// (about a quarter of the largest) at or above the largest.
static double panel_ymax(const eval_report *r, int ttft, double *step) {
    if (!ttft) return *step = 0.25, 1;
    double ymax = 0;
    for (int s = 0; s < r->n_strategies; s++)
        for (int c = 0; c < r->n_ctxs; c++) {
            double v = cell_mean(r, r->strategies[s], r->ctxs[c], 1);
            if (v > ymax) ymax = v;
        }
    *step = nice_step(ymax / 4);
    return ymax > 0 ? ceil(ymax / *step - 1e-9) * *step : (*step = 0.25, 1);
}

static void panel(FILE *f, const eval_report *r, int x0, int pw, int ttft, notes *ns) {
    double step, ymax = panel_ymax(r, ttft, &step);
    char buf[64];
    const char *title = ttft ? "time to first token (ms) vs context" : "accuracy vs context";
    text_at(f, x0 + pw / 2.0 - text_w(title, 15) / 2, TOP - 12 - (ASCENT + DESCENT) * 15, 15,
            "title", NULL, title);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\" "
               "class=\"plot-area\"/>\n", x0, TOP, pw, PANEL_H);
    for (int k = 0; k * step <= ymax * (1 + 1e-9); k++) {   // y grid and labels
        double y = TOP + PAD + (PANEL_H - 2 * PAD) * (1 - k * step / ymax);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#eee\"/>\n", x0, y,
                x0 + pw, y);
        tick_text(buf, sizeof buf, k * step, step);
        text_at(f, x0 - 6 - text_w(buf, 12), y - (ASCENT + DESCENT) * 6, 12, "tick", NULL, buf);
    }
    for (int c = 0; c < r->n_ctxs; c++) {
        snprintf(buf, sizeof buf, "%d", r->ctxs[c]);
        // contexts closer than their labels are wide: every other label (the rest stay in the data)
        double room = (double)pw / r->n_ctxs;
        int every = (int)ceil((text_w(buf, 12) + 6) / room);
        if (every < 1) every = 1;
        if (c % every) continue;
        text_at(f, ctx_x(r, x0, pw, c) - text_w(buf, 12) / 2, TOP + PANEL_H + 6, 12, "tick", NULL, buf);
    }
    text_at(f, x0 + pw / 2.0 - text_w("context (tokens)", 12) / 2, TOP + PANEL_H + 24, 12,
            "axis-label", NULL, "context (tokens)");
    int S = r->n_strategies, C = r->n_ctxs;
    double *px = xmalloc((size_t)(S * C + 1) * sizeof *px), *py = xmalloc((size_t)(S * C + 1) * sizeof *py);
    panel_points(r, x0, pw, ttft, ymax, px, py, ns);
    for (int s = 0; s < S; s++) {
        const char *col = COLORS[s % N_COLORS];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col);
        for (int c = 0; c < C; c++)
            if (!isnan(py[s * C + c])) fprintf(f, "%.1f,%.1f ", px[s * C + c], py[s * C + c]);
        fputs("\"/>\n", f);
        for (int c = 0; c < C; c++)
            if (!isnan(py[s * C + c])) {
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%d\" fill=\"%s\" stroke=\"white\" "
                           "stroke-width=\"1\" class=\"point\" data-strategy=\"",
                        px[s * C + c], py[s * C + c], PT_R, col);
                xml_text(f, r->strategies[s]);
                fprintf(f, "\" data-ctx=\"%d\"/>\n", r->ctxs[c]);
            }
    }
    free(px), free(py);
}

void eval_write_svg(FILE *f, const eval_report *r) {
    // each panel wide enough that the most points moved apart at one context fit its slot
    int widest = 1;
    double *tx = xmalloc((size_t)(r->n_strategies * r->n_ctxs + 1) * sizeof *tx);
    double *ty = xmalloc((size_t)(r->n_strategies * r->n_ctxs + 1) * sizeof *ty);
    for (int ttft = 0; ttft < 2; ttft++) {
        double step;
        int m = panel_points(r, 0, PANEL_W_MIN, ttft, panel_ymax(r, ttft, &step), tx, ty, NULL);
        if (m > widest) widest = m;
    }
    free(tx), free(ty);
    int pw = PANEL_W_MIN;
    if (r->n_ctxs * (widest * DODGE + 8) > pw) pw = r->n_ctxs * (widest * DODGE + 8);
    int w = LEFT + 2 * pw + GAP + 20;
    // the legend: entries left to right at their estimated widths, wrapping to more rows
    double lx = LEFT, ly = TOP + PANEL_H + 52;
    double *ex = xmalloc((size_t)(r->n_strategies + 1) * sizeof *ex), *ey = xmalloc((size_t)(r->n_strategies + 1) * sizeof *ey);
    for (int s = 0; s < r->n_strategies; s++) {
        double ew = 30 + text_w(r->strategies[s], 13) + 24;
        if (lx > LEFT && lx + ew > w - 10) lx = LEFT, ly += 22;
        ex[s] = lx, ey[s] = ly, lx += ew;
    }
    // the notes come from the panels: drawn into memory first, the height known after
    notes ns = {0};
    char *body = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&body, &len);
    panel(m, r, LEFT, pw, 0, &ns);
    panel(m, r, LEFT + pw + GAP, pw, 1, &ns);
    fclose(m);
    double ny = ly + 30;
    int h = (int)ceil(ny + notes_h(&ns) + 10);
    for (int i = 0; i < ns.n; i++) w = (int)fmax(w, ceil(LEFT + text_w(ns.line[i], 12) + 10));
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", w, h, w, h);
    fwrite(body, 1, len, f);
    free(body);
    for (int s = 0; s < r->n_strategies; s++) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"/>\n",
                ex[s], ey[s], ex[s] + 24, ey[s], COLORS[s % N_COLORS]);
        text_at(f, ex[s] + 30, ey[s] - (ASCENT + DESCENT) * 13 / 2, 13, "legend", NULL, r->strategies[s]);
    }
    draw_notes(f, &ns, LEFT, ny, "spots where strategies coincide, drawn side by side");
    notes_free(&ns);
    free(ex), free(ey);
    fputs("</svg>\n", f);
}

// ---- sift sweep: fidelity against speedup ----

enum { SC_W = 640, SC_H = 420, SC_LEFT = 80, SC_TOP = 40, SC_R = 5, RING = 8, LABEL_PT = 11 };
#define FRONTIER_RED "#d62728"
#define LEADER_GREY "#888"

// The span an axis draws: its ticks' range and half a step beyond each end, so that a point at
// either end (an agreement of 1, the fastest setting) lies inside the frame, not on its edge.
static double sc_lo(axis a) { return a.lo - a.step / 2; }
static double sc_x(axis a, double v) { return SC_LEFT + SC_W * (v - sc_lo(a)) / (a.hi - a.lo + a.step); }
static double sc_y(axis a, double v) { return SC_TOP + SC_H * (1 - (v - sc_lo(a)) / (a.hi - a.lo + a.step)); }

// idx (k,) sorted by the x of their points (insertion sort: tens of points)
static void sort_by_x(const double *x, int *idx, int k) {
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && x[idx[j]] < x[idx[j - 1]]; j--) {
            int t = idx[j];
            idx[j] = idx[j - 1], idx[j - 1] = t;
        }
}

// A label's box beside the point (px, py) at distance d in direction (dx, dy) (each -1, 0 or 1;
// diagonals pulled in so the corner is at about distance d).
static box label_box(double px, double py, double d, int dx, int dy, double w, double h) {
    double e = dx && dy ? d * 0.75 : d;
    box b;
    b.x0 = dx > 0 ? px + e : dx < 0 ? px - e - w : px - w / 2;
    b.y0 = dy > 0 ? py + e : dy < 0 ? py - e - h : py - h / 2;
    b.x1 = b.x0 + w, b.y1 = b.y0 + h;
    return b;
}

// Finds a place for a w x h text near (px, py) inside frame, clear of the boxes in taken (n):
// the eight directions at the nearest distance first, then farther out (a leader line then
// joins it to its point). 1 + *out, or 0 when no place is free.
static int place(double px, double py, double w, double h, box frame, const box *taken, int n,
                 box *out, int *far) {
    static const int DIR[8][2] = {{1, 0}, {-1, 0}, {0, -1}, {0, 1}, {1, -1}, {1, 1}, {-1, -1}, {-1, 1}};
    static const double DIST[] = {RING + 3, 22, 36, 52, 70, 90};
    for (int d = 0; d < (int)(sizeof DIST / sizeof *DIST); d++)
        for (int k = 0; k < 8; k++) {
            box b = label_box(px, py, DIST[d], DIR[k][0], DIR[k][1], w, h);
            if (!inside(b, frame)) continue;
            int ok = 1;
            box m = {b.x0 - 1, b.y0 - 1, b.x1 + 1, b.y1 + 1};   // a pixel of air around each label
            for (int i = 0; i < n && ok; i++) ok = !overlaps(m, taken[i]);
            if (ok) {
                *out = b, *far = d > 0;
                return 1;
            }
        }
    return 0;
}

// The point of box b nearest to (px, py): where a leader line from the point meets the label.
static void nearest_on(box b, double px, double py, double *x, double *y) {
    *x = px < b.x0 ? b.x0 : px > b.x1 ? b.x1 : px;
    *y = py < b.y0 ? b.y0 : py > b.y1 ? b.y1 : py;
}

// The legend under the sweep plot: what each mark means. A dot per colour (its strategy: the
// first word of the label of the first point drawn in it), the frontier's ring, the frontier's
// line (drawn when it joins two points or more) and the leader line (when a label sits apart).
enum { MARK_DOT, MARK_RING, MARK_LINE, MARK_LEADER };
static const char *const MARK_NAME[] = {"dot", "ring", "line", "leader"};
typedef struct { int mark; const char *colour; char *text; double x, y; } legend_entry;
enum { LEGEND_PT = 12, LEGEND_ROW = 22, SWATCH = 24 };

// The entries (at most n + 3) into e; their count.
static int scatter_legend(legend_entry *e, const char *const *labels, const int *group,
                          char *const *text, int n, int n_frontier, int leaders) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!text[i]) continue;
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = text[j] && group[j] == group[i];
        if (!seen)
            e[k++] = (legend_entry){MARK_DOT, COLORS[group[i] % N_COLORS],
                                    afmt("%.*s", (int)strcspn(labels[i], " "), labels[i]), 0, 0};
    }
    if (n_frontier)
        e[k++] = (legend_entry){MARK_RING, FRONTIER_RED,
                                afmt("ringed: on the Pareto frontier (no other setting is as good on "
                                     "both axes and better on one)"), 0, 0};
    if (n_frontier > 1)
        e[k++] = (legend_entry){MARK_LINE, FRONTIER_RED, afmt("the frontier, joined left to right"), 0, 0};
    if (leaders)
        e[k++] = (legend_entry){MARK_LEADER, LEADER_GREY, afmt("joins a label set apart to its point"), 0, 0};
    return k;
}
static double legend_entry_w(const legend_entry *e) { return SWATCH + text_w(e->text, LEGEND_PT) + 20; }

// Places the entries from (SC_LEFT, y): the dots left to right in rows that wrap before width w,
// then each frontier or leader mark on a row of its own; the y of the last row.
static double legend_layout(legend_entry *e, int k, int w, double y) {
    double x = SC_LEFT;
    for (int i = 0; i < k; i++) {
        if (x > SC_LEFT && (e[i].mark != MARK_DOT || x + legend_entry_w(&e[i]) > w - 10))
            x = SC_LEFT, y += LEGEND_ROW;
        e[i].x = x, e[i].y = y, x += legend_entry_w(&e[i]);
    }
    return y;
}

static void legend_draw(FILE *f, const legend_entry *e, int k) {
    for (int i = 0; i < k; i++) {
        double cx = e[i].x + SWATCH / 2.0 - 2, y = e[i].y;
        fprintf(f, "<g class=\"legend-entry\" data-mark=\"%s\">\n", MARK_NAME[e[i].mark]);
        if (e[i].mark == MARK_DOT)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%d\" fill=\"%s\" stroke=\"white\" "
                       "class=\"legend-mark\"/>\n", cx, y, SC_R, e[i].colour);
        else if (e[i].mark == MARK_RING)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%d\" fill=\"none\" stroke=\"%s\" "
                       "stroke-width=\"2\" class=\"legend-mark\"/>\n", cx, y, RING, e[i].colour);
        else
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                       "stroke-width=\"%s\" class=\"legend-mark\"/>\n", cx - 9, y, cx + 9, y, e[i].colour,
                    e[i].mark == MARK_LINE ? "2" : "0.8");
        text_at(f, e[i].x + SWATCH, y - (ASCENT + DESCENT) * LEGEND_PT / 2, LEGEND_PT, "legend", NULL, e[i].text);
        fputs("</g>\n", f);
    }
}

// A sweep plot laid out: each point's place (px, py; NaN: a NaN or infinite value, not drawn),
// the first point at its spot (rep: the one drawn, ringed when a frontier point is there), a drawn
// point's label (text: every setting at its spot) and where it goes (lb; far: a leader joins it;
// num: its number in the key, negative when not even that fits; key: its line there), the
// frontier's m drawn points left to right (idx), whether any label is set apart (leaders).
typedef struct {
    int n, *rep, *ring, *far, *num, n_key, *idx, m, leaders;
    axis ax, ay;
    double *px, *py;
    char **text, **key;
    box *lb;
    notes ns;
} scatter;

// The axes over the drawable points and each point's place; one drawn point per spot (a point
// within a marker's radius of an earlier one joins it), labelled with every setting there and,
// when they are several, a note.
static void scatter_spots(scatter *s, const pareto_point *p, const char *const *labels, const int *on) {
    int n = s->n;
    double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
    for (int i = 0; i < n; i++) {
        if (isnan(p[i].x) || isnan(p[i].y) || isinf(p[i].x) || isinf(p[i].y)) continue;
        xlo = fmin(xlo, p[i].x), xhi = fmax(xhi, p[i].x);
        ylo = fmin(ylo, p[i].y), yhi = fmax(yhi, p[i].y);
    }
    s->ax = fit_axis(xlo, xhi, 0), s->ay = fit_axis(ylo, yhi, ylo >= 0 && yhi <= 1);
    double *px = s->px = xmalloc((size_t)(n + 1) * sizeof *px), *py = s->py = xmalloc((size_t)(n + 1) * sizeof *py);
    for (int i = 0; i < n; i++) {
        int ok = !(isnan(p[i].x) || isnan(p[i].y) || isinf(p[i].x) || isinf(p[i].y));
        px[i] = ok ? sc_x(s->ax, p[i].x) : NAN;
        py[i] = ok ? sc_y(s->ay, p[i].y) : NAN;
    }
    int *rep = s->rep = xmalloc((size_t)(n + 1) * sizeof *rep), *ring = s->ring = xcalloc((size_t)n + 1, sizeof *ring);
    for (int i = 0; i < n; i++) {
        rep[i] = i;
        if (isnan(px[i])) continue;
        for (int j = 0; j < i && rep[i] == i; j++)
            if (rep[j] == j && !isnan(px[j]) && fabs(px[i] - px[j]) < SC_R && fabs(py[i] - py[j]) < SC_R) rep[i] = j;
        if (on[i]) ring[rep[i]] = 1;
    }
    s->text = xcalloc((size_t)n + 1, sizeof *s->text);
    for (int i = 0; i < n; i++) {
        if (rep[i] != i || isnan(px[i])) continue;
        char *buf = NULL, *note = NULL;
        size_t len = 0, nlen = 0;
        FILE *m = open_memstream(&buf, &len), *nm = open_memstream(&note, &nlen);
        int members = 0, same = 1;
        for (int j = i; j < n; j++)
            if (rep[j] == i) {
                fprintf(m, "%s%s", members ? " = " : "", labels[j]);
                fprintf(nm, "%s%s (%.4g, %.4g)", members ? "; " : "", labels[j], p[j].x, p[j].y);
                same &= p[j].x == p[i].x && p[j].y == p[i].y;
                members++;
            }
        fclose(m), fclose(nm);
        s->text[i] = buf;
        if (members > 1)
            note_add(&s->ns, afmt("one point for %d settings %s: %s", members,
                                  same ? "that measured the same (they ran identically)" :
                                         "closer than the plot can separate", note));
        free(note);
    }
}

// The labels, the frontier's first, then in input order: each placed clear of every point and of
// the labels before it, else a number at the point and the label in the key (with the point's
// values when not even the number fits); then the frontier's drawn points, left to right.
static void scatter_place(scatter *s, const pareto_point *p) {
    int n = s->n, *ring = s->ring;
    char **text = s->text;
    double *px = s->px, *py = s->py;
    box frame = {SC_LEFT, SC_TOP, SC_LEFT + SC_W, SC_TOP + SC_H};
    int *order = xmalloc((size_t)(n + 1) * sizeof *order), k = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++)
            if (text[i] && (ring[i] ? 0 : 1) == pass) order[k++] = i;
    box *taken = xmalloc((size_t)(2 * n + 1) * sizeof *taken);
    int n_taken = 0;
    for (int i = 0; i < n; i++)
        if (text[i]) {
            double r = ring[i] ? RING + 1.5 : SC_R + 1;
            taken[n_taken++] = (box){px[i] - r, py[i] - r, px[i] + r, py[i] + r};
        }
    box *lb = s->lb = xmalloc((size_t)(n + 1) * sizeof *lb);
    int *far = s->far = xcalloc((size_t)n + 1, sizeof *far), *num = s->num = xcalloc((size_t)n + 1, sizeof *num);
    double lh = (ASCENT + DESCENT) * LABEL_PT;
    for (int o = 0; o < k; o++) {
        int i = order[o];
        if (place(px[i], py[i], text_w(text[i], LABEL_PT), lh, frame, taken, n_taken, &lb[i], &far[i])) {
            taken[n_taken++] = lb[i];
            continue;
        }
        num[i] = ++s->n_key;   // the key's number, placed like a label
        char nb[16];
        snprintf(nb, sizeof nb, "%d", num[i]);
        if (place(px[i], py[i], text_w(nb, LABEL_PT), lh, frame, taken, n_taken, &lb[i], &far[i]))
            taken[n_taken++] = lb[i];
        else
            num[i] = -num[i];   // not even a number fits: the key gives the point's values
    }
    free(order), free(taken);
    s->key = xcalloc((size_t)n + 1, sizeof *s->key), s->idx = xmalloc((size_t)(n + 1) * sizeof *s->idx);
    for (int i = 0; i < n; i++) {
        if (num[i])
            s->key[i] = num[i] > 0 ? afmt("%d  %s", num[i], text[i])
                                   : afmt("%d  %s (%.4g, %.4g)", -num[i], text[i], p[i].x, p[i].y);
        if (text[i] && ring[i]) s->idx[s->m++] = i;
        s->leaders |= text[i] && num[i] >= 0 && far[i];
    }
    sort_by_x(px, s->idx, s->m);
}

// The frame, the grid and ticks of both axes, and the axes' names.
static void scatter_axes(FILE *f, axis ax, axis ay, const char *x_label, const char *y_label) {
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\" "
               "class=\"plot-area\"/>\n", SC_LEFT, SC_TOP, SC_W, SC_H);
    char buf[64];
    for (int t = (int)ceil(ax.lo / ax.step - 1e-9); t * ax.step <= ax.hi + 1e-9 * ax.step; t++) {
        double x = sc_x(ax, t * ax.step);
        tick_text(buf, sizeof buf, t * ax.step, ax.step);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#eee\"/>\n", x, SC_TOP, x, SC_TOP + SC_H);
        text_at(f, x - text_w(buf, 12) / 2, SC_TOP + SC_H + 6, 12, "tick", NULL, buf);
    }
    for (int t = (int)ceil(ay.lo / ay.step - 1e-9); t * ay.step <= ay.hi + 1e-9 * ay.step; t++) {
        double y = sc_y(ay, t * ay.step);
        tick_text(buf, sizeof buf, t * ay.step, ay.step);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#eee\"/>\n", SC_LEFT, y, SC_LEFT + SC_W, y);
        text_at(f, SC_LEFT - 6 - text_w(buf, 12), y - (ASCENT + DESCENT) * 6, 12, "tick", NULL, buf);
    }
    text_at(f, SC_LEFT + SC_W / 2.0 - text_w(x_label, 13) / 2, SC_TOP + SC_H + 26, 13, "axis-label", NULL, x_label);
    fprintf(f, "<text x=\"20\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\" class=\"axis-label\" "
               "transform=\"rotate(-90 20 %d)\">", SC_TOP + SC_H / 2, SC_TOP + SC_H / 2);
    xml_text(f, y_label);
    fputs("</text>\n", f);
}

// The frontier's line (two points or more), then the points, then the labels (on top), the key.
static void scatter_marks(FILE *f, const scatter *s, const int *group) {
    const double *px = s->px, *py = s->py;
    if (s->m > 1) {
        fputs("<polyline fill=\"none\" stroke=\"" FRONTIER_RED "\" stroke-width=\"2\" class=\"frontier-line\" points=\"", f);
        for (int i = 0; i < s->m; i++) fprintf(f, "%s%.1f,%.1f", i ? " " : "", px[s->idx[i]], py[s->idx[i]]);
        fputs("\"/>\n", f);
    }
    for (int i = 0; i < s->n; i++) {
        if (!s->text[i]) continue;
        if (s->ring[i])
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%d\" fill=\"none\" stroke=\"" FRONTIER_RED "\" "
                       "stroke-width=\"2\" class=\"frontier\"/>\n", px[i], py[i], RING);
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%d\" fill=\"%s\" stroke=\"white\" "
                   "class=\"point\" data-label=\"", px[i], py[i], SC_R, COLORS[group[i] % N_COLORS]);
        xml_text(f, s->text[i]);
        fputs("\"/>\n", f);
    }
    char buf[64];
    for (int i = 0; i < s->n; i++) {
        if (!s->text[i] || s->num[i] < 0) continue;
        if (s->far[i]) {
            double x, y;
            nearest_on(s->lb[i], px[i], py[i], &x, &y);
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"" LEADER_GREY "\" "
                       "stroke-width=\"0.8\" class=\"leader\"/>\n", px[i], py[i], x, y);
        }
        snprintf(buf, sizeof buf, "%d", s->num[i]);
        text_at(f, s->lb[i].x0, s->lb[i].y0, LABEL_PT, s->num[i] ? "label number" : "label", NULL,
                s->num[i] ? buf : s->text[i]);
    }
    if (s->n_key) {
        double kx = SC_LEFT + SC_W + 20;
        text_at(f, kx, SC_TOP, 12, "key", NULL, "key (numbered points)");
        int row = 0;
        for (int i = 0; i < s->n; i++)
            if (s->key[i]) text_at(f, kx, SC_TOP + 22 + 16 * row++, LABEL_PT, "key", NULL, s->key[i]);
    }
}

void eval_write_scatter_svg(FILE *f, const char *x_label, const char *y_label,
                            const pareto_point *p, const char *const *labels, const int *group,
                            const int *on, int n) {
    scatter s = {.n = n};
    scatter_spots(&s, p, labels, on);
    scatter_place(&s, p);
    // the key beside the plot, the legend and the notes under it set the figure's size (the
    // notes wide enough to read in full)
    double key_w = s.n_key ? text_w("key (numbered points)", 12) + 10 : 0;
    for (int i = 0; i < n; i++)
        if (s.key[i]) key_w = fmax(key_w, text_w(s.key[i], LABEL_PT) + 10);
    legend_entry *leg = xmalloc((size_t)(n + 3) * sizeof *leg);
    int n_leg = scatter_legend(leg, labels, group, s.text, n, s.m, s.leaders);
    int w = (int)ceil(SC_LEFT + SC_W + 30 + key_w);
    for (int i = 0; i < s.ns.n; i++) w = (int)fmax(w, ceil(SC_LEFT + text_w(s.ns.line[i], 12) + 10));
    for (int i = 0; i < n_leg; i++) w = (int)fmax(w, ceil(SC_LEFT + legend_entry_w(&leg[i]) + 10));
    // the title centred over the plot, or from the left edge when it is wider; it says whether
    // the frontier is a line or a single point
    char *title = afmt("%s vs %s%s", y_label, x_label,
                       s.m > 1 ? " (Pareto frontier connected)" : s.m ? " (Pareto frontier: one point, ringed)" : "");
    double title_x = fmax(6, SC_LEFT + SC_W / 2.0 - text_w(title, 15) / 2);
    w = (int)fmax(w, ceil(title_x + text_w(title, 15) + 6));
    double notes_y = (n_leg ? legend_layout(leg, n_leg, w, SC_TOP + SC_H + 58) : SC_TOP + SC_H + 36) + LEGEND_ROW;
    int h = (int)ceil(notes_y + notes_h(&s.ns) + 10);
    if (s.n_key) h = (int)fmax(h, SC_TOP + 24 + 16 * s.n_key + 10);
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", w, h, w, h);
    text_at(f, title_x, SC_TOP - 12 - (ASCENT + DESCENT) * 15, 15, "title", NULL, title);
    free(title);
    scatter_axes(f, s.ax, s.ay, x_label, y_label);
    scatter_marks(f, &s, group);
    legend_draw(f, leg, n_leg);
    draw_notes(f, &s.ns, SC_LEFT, notes_y, "points drawn for several settings (each named in its label)");
    for (int i = 0; i < n_leg; i++) free(leg[i].text);
    free(leg);
    for (int i = 0; i < n; i++) free(s.text[i]), free(s.key[i]);
    free(s.key), free(s.text), free(s.lb), free(s.far), free(s.num), free(s.idx);
    free(s.rep), free(s.ring), free(s.px), free(s.py);
    notes_free(&s.ns);
    fputs("</svg>\n", f);
}
