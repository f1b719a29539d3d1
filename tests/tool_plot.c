// tests/tool_plot.c — feeds eval/plot.c crafted data for tests/test_plots.py (crowded points,
// identical settings, one context) without running a model; the SVG goes to stdout.
// usage: tool_plot < SPEC
//   SPEC for `sift sweep --plot`:      SPEC for `sift eval --plot`:
//     scatter                            eval
//     X Y GROUP ON LABEL...              strategies NAME...
//     ...                                ctxs N...
//                                        rec STRATEGY CTX SCORE TTFT_MS
//                                        ...
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../eval/eval.h"

enum { MAX = 256 };

static char *dup_word(const char *s) {
    char *d = strdup(s);
    if (!d) exit(1);
    return d;
}

int main(void) {
    char line[1024], kind[32] = "";
    if (!fgets(line, sizeof line, stdin) || sscanf(line, "%31s", kind) != 1) {
        fprintf(stderr, "tool_plot: empty spec\n");
        return 2;
    }
    if (strcmp(kind, "scatter") == 0) {
        static pareto_point p[MAX];
        static char *labels[MAX];
        static int group[MAX], on[MAX];
        int n = 0, used;
        while (n < MAX && fgets(line, sizeof line, stdin)) {
            line[strcspn(line, "\n")] = 0;
            if (sscanf(line, "%lf %lf %d %d %n", &p[n].x, &p[n].y, &group[n], &on[n], &used) < 4) continue;
            labels[n++] = dup_word(line + used);
        }
        eval_write_scatter_svg(stdout, "speedup over full (end to end)", "greedy agreement with full", p,
                               (const char *const *)labels, group, on, n);
        for (int i = 0; i < n; i++) free(labels[i]);
        return 0;
    }
    if (strcmp(kind, "eval") != 0) {
        fprintf(stderr, "tool_plot: unknown kind '%s'\n", kind);
        return 2;
    }
    static const char *strategies[MAX];
    static int ctxs[MAX];
    static eval_record recs[MAX];
    eval_report r = {.model = "crafted", .samples = 1, .strategies = strategies, .ctxs = ctxs,
                     .recs = recs, .complete = 1};
    while (fgets(line, sizeof line, stdin)) {
        char *save = NULL, *w = strtok_r(line, " \t\n", &save);
        if (!w) continue;
        if (strcmp(w, "strategies") == 0)
            while ((w = strtok_r(NULL, " \t\n", &save)) && r.n_strategies < MAX) strategies[r.n_strategies++] = dup_word(w);
        else if (strcmp(w, "ctxs") == 0)
            while ((w = strtok_r(NULL, " \t\n", &save)) && r.n_ctxs < MAX) ctxs[r.n_ctxs++] = atoi(w);
        else if (strcmp(w, "rec") == 0 && r.n_recs < MAX) {
            eval_record *e = &recs[r.n_recs++];
            char *s = strtok_r(NULL, " \t\n", &save), *c = strtok_r(NULL, " \t\n", &save),
                 *sc = strtok_r(NULL, " \t\n", &save), *t = strtok_r(NULL, " \t\n", &save);
            if (!s || !c || !sc || !t) {
                fprintf(stderr, "tool_plot: rec needs STRATEGY CTX SCORE TTFT_MS\n");
                return 2;
            }
            e->strategy = dup_word(s), e->ctx = atoi(c), e->score = atof(sc), e->ttft_ms = atof(t);
        }
    }
    eval_write_svg(stdout, &r);
    for (int i = 0; i < r.n_strategies; i++) free((char *)strategies[i]);
    for (int i = 0; i < r.n_recs; i++) free((char *)recs[i].strategy);
    return 0;
}
