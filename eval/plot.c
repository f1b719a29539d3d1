// eval/plot.c — the SVG figures: `sift eval --plot`: two panels side by side, accuracy vs context
// and TTFT vs context, one coloured line per strategy (contexts evenly spaced, in the order
// given), a shared legend underneath; `sift sweep --plot`: fidelity against speedup, one dot per
// setting, the Pareto frontier connected and ringed.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "eval.h"

enum { PANEL_W = 440, PANEL_H = 300, LEFT = 70, TOP = 40, GAP = 90, LEGEND_H = 60 };

static const char *const COLORS[] = {"#222222", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                     "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"};
#define N_COLORS (int)(sizeof COLORS / sizeof *COLORS)

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

// A "nice" axis top (1, 2 or 5 x 10^k) at or above v.
static double nice_top(double v) {
    if (!(v > 0)) return 1;
    double p = pow(10, floor(log10(v))), steps[] = {1, 2, 5, 10};
    for (int i = 0; i < 4; i++)
        if (steps[i] * p >= v) return steps[i] * p;
    return 10 * p;
}

static void panel(FILE *f, const eval_report *r, int x0, int ttft) {
    double ymax = 1;
    if (ttft) {
        ymax = 0;
        for (int s = 0; s < r->n_strategies; s++)
            for (int c = 0; c < r->n_ctxs; c++) {
                double v = cell_mean(r, r->strategies[s], r->ctxs[c], 1);
                if (v > ymax) ymax = v;
            }
        ymax = nice_top(ymax);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"15\">%s</text>\n",
            x0 + PANEL_W / 2, TOP - 15, ttft ? "time to first token (ms) vs context" : "accuracy vs context");
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>\n",
            x0, TOP, PANEL_W, PANEL_H);
    for (int k = 0; k <= 4; k++) {   // y grid and labels
        int y = TOP + PANEL_H - k * PANEL_H / 4;
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#eee\"/>\n", x0, y,
                x0 + PANEL_W, y);
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"12\">%g</text>\n",
                x0 - 6, y + 4, ymax * k / 4);
    }
    double dx = r->n_ctxs > 1 ? (PANEL_W - 60.0) / (r->n_ctxs - 1) : 0;
    for (int c = 0; c < r->n_ctxs; c++)
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\">%d</text>\n",
                x0 + 30 + c * dx, TOP + PANEL_H + 18, r->ctxs[c]);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\">context (tokens)</text>\n",
            x0 + PANEL_W / 2, TOP + PANEL_H + 36);
    for (int s = 0; s < r->n_strategies; s++) {
        const char *col = COLORS[s % N_COLORS];
        // earlier strategies (full first) drawn wider, so a line on top of another stays visible
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" points=\"", col,
                2 + 1.5 * (r->n_strategies - 1 - s));
        for (int c = 0; c < r->n_ctxs; c++) {
            double v = cell_mean(r, r->strategies[s], r->ctxs[c], ttft);
            if (!isnan(v)) fprintf(f, "%.1f,%.1f ", x0 + 30 + c * dx, TOP + PANEL_H * (1 - v / ymax));
        }
        fputs("\"/>\n", f);
        for (int c = 0; c < r->n_ctxs; c++) {
            double v = cell_mean(r, r->strategies[s], r->ctxs[c], ttft);
            if (!isnan(v))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"%s\"/>\n",
                        x0 + 30 + c * dx, TOP + PANEL_H * (1 - v / ymax),
                        3 + 1.5 * (r->n_strategies - 1 - s), col);
        }
    }
}

void eval_write_svg(FILE *f, const eval_report *r) {
    int w = LEFT + 2 * PANEL_W + GAP + 20, h = TOP + PANEL_H + 50 + LEGEND_H;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", w, h, w, h);
    panel(f, r, LEFT, 0);
    panel(f, r, LEFT + PANEL_W + GAP, 1);
    int ly = TOP + PANEL_H + 62;
    for (int s = 0; s < r->n_strategies; s++) {
        int lx = LEFT + (s % 6) * 150, row = ly + (s / 6) * 20;
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"/>"
                   "<text x=\"%d\" y=\"%d\" font-size=\"13\">%s</text>\n",
                lx, row, lx + 24, row, COLORS[s % N_COLORS], lx + 30, row + 4, r->strategies[s]);
    }
    fputs("</svg>\n", f);
}

// ---- sift sweep: fidelity against speedup ----

enum { SC_W = 640, SC_H = 420, SC_LEFT = 70, SC_TOP = 40 };

// idx (k,) sorted by the x of their points (insertion sort: tens of points)
static void sort_by_x(const pareto_point *p, int *idx, int k) {
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && p[idx[j]].x < p[idx[j - 1]].x; j--) {
            int t = idx[j];
            idx[j] = idx[j - 1], idx[j - 1] = t;
        }
}

void eval_write_scatter_svg(FILE *f, const char *x_label, const char *y_label,
                            const pareto_point *p, const char *const *labels, const int *group,
                            const int *on, int n) {
    double xmax = 0, ymax = 0;
    for (int i = 0; i < n; i++) {
        if (p[i].x > xmax) xmax = p[i].x;
        if (p[i].y > ymax) ymax = p[i].y;
    }
    xmax = nice_top(xmax * 1.05), ymax = ymax <= 1 ? 1 : nice_top(ymax);
    int w = SC_LEFT + SC_W + 40, h = SC_TOP + SC_H + 60;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", w, h, w, h);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"15\">%s vs %s "
               "(Pareto frontier connected)</text>\n", SC_LEFT + SC_W / 2, SC_TOP - 15, y_label, x_label);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#999\"/>\n",
            SC_LEFT, SC_TOP, SC_W, SC_H);
    for (int k = 0; k <= 4; k++) {   // grid and tick labels on both axes
        int y = SC_TOP + SC_H - k * SC_H / 4, x = SC_LEFT + k * SC_W / 4;
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#eee\"/>"
                   "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"12\">%g</text>\n",
                SC_LEFT, y, SC_LEFT + SC_W, y, SC_LEFT - 6, y + 4, ymax * k / 4);
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#eee\"/>"
                   "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"12\">%g</text>\n",
                x, SC_TOP, x, SC_TOP + SC_H, x, SC_TOP + SC_H + 18, xmax * k / 4);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\">%s</text>\n"
               "<text x=\"18\" y=\"%d\" text-anchor=\"middle\" font-size=\"13\" "
               "transform=\"rotate(-90 18 %d)\">%s</text>\n",
            SC_LEFT + SC_W / 2, SC_TOP + SC_H + 40, x_label, SC_TOP + SC_H / 2, SC_TOP + SC_H / 2, y_label);
#define SC_X(v) (SC_LEFT + SC_W * (v) / xmax)
#define SC_Y(v) (SC_TOP + SC_H * (1 - (v) / ymax))
    int *idx = xmalloc((size_t)(n ? n : 1) * sizeof *idx), k = 0;
    for (int i = 0; i < n; i++)
        if (on[i]) idx[k++] = i;
    sort_by_x(p, idx, k);
    fputs("<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" points=\"", f);
    for (int i = 0; i < k; i++) fprintf(f, "%.1f,%.1f ", SC_X(p[idx[i]].x), SC_Y(p[idx[i]].y));
    fputs("\"/>\n", f);
    for (int i = 0; i < n; i++) {
        if (isnan(p[i].x) || isnan(p[i].y)) continue;
        double x = SC_X(p[i].x), y = SC_Y(p[i].y);
        if (on[i])
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"8\" fill=\"none\" stroke=\"#d62728\" "
                       "stroke-width=\"2\" class=\"frontier\"/>\n", x, y);
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4.5\" fill=\"%s\"/>\n<text x=\"%.1f\" y=\"%.1f\" "
                   "font-size=\"11\">", x, y, COLORS[group[i] % N_COLORS], x + 9, y - 6);
        for (const char *c = labels[i]; *c; c++)   // XML escapes
            if (*c == '<') fputs("&lt;", f);
            else if (*c == '>') fputs("&gt;", f);
            else if (*c == '&') fputs("&amp;", f);
            else fputc(*c, f);
        fputs("</text>\n", f);
    }
#undef SC_X
#undef SC_Y
    free(idx);
    fputs("</svg>\n", f);
}
