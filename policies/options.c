// policies/options.c — every strategy parameter's one home: the flag table (flag, field of
// strategy_opts, type, range, default, who reads it, help line) and what is made from it:
// parsing a flag's value, the defaults, and the settings echoed as JSON.
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"
#include "policy.h"

#define OFF(f) offsetof(strategy_opts, f)
static const opt_def OPTS[] = {
    {"--speed-depth", "K", OPT_INT, OFF(speed_depth), 1, 4096, NULL, 0, "ceil(0.875 L)", "speed",
     "layers that see the prompt"},
    {"--anchor", "bos|none", OPT_CHOICE, OFF(anchor), 0, 0, "bos=1|none=0", 1, NULL, "speed",
     "keep the first prompt token in upper layers"},
    {"--tsp-layer", "N", OPT_INT, OFF(tsp_layer), 0, 4096, NULL, -1, "L/2-1", "fastkv",
     "token-selective propagation after layer N"},
    {"--tsp-rate", "R", OPT_FLOAT, OFF(tsp_rate), 1e-6, 1, NULL, 0.2, NULL, "fastkv",
     "share of rows propagated, (0,1]"},
    {"--kv-rate", "R", OPT_FLOAT, OFF(kv_rate), 1e-6, 1, NULL, 0.1, NULL,
     "fastkv, snapkv, streamingllm", "KV kept per layer, (0,1]"},
    {"--window", "W", OPT_INT, OFF(window), 1, 1 << 20, NULL, 8, NULL, "fastkv, snapkv",
     "observation window, always kept"},
    {"--pool-kernel", "K", OPT_ODD, OFF(pool_kernel), 1, 1025, NULL, 7, NULL, "fastkv, snapkv",
     "window-score pooling kernel, odd"},
    {"--pool", "max|avg", OPT_CHOICE, OFF(pool), 0, 0, "max=0|avg=1", 0, NULL, "fastkv, snapkv",
     "window-score pooling: max (padding ignored) or avg (zero padding, / kernel)"},
    {"--kv-len", "N", OPT_INT, OFF(kv_len), 0, 1 << 30, NULL, 0, NULL, "fastkv, snapkv",
     "KV kept per layer and KV head, a fixed count > --window; 0 = --kv-rate"},
    {"--tsp-len", "N", OPT_INT, OFF(tsp_len), 0, 1 << 30, NULL, 0, NULL, "fastkv",
     "rows propagated past the TSP layer, a fixed count > --window; 0 = --tsp-rate"},
    {"--keep", "P", OPT_FLOAT, OFF(keep), 1e-6, 1, NULL, 0.3, NULL, "specprefill",
     "share of prompt chunks kept, (0,1]"},
    {"--lookahead", "N", OPT_INT, OFF(lookahead), 1, 1024, NULL, 8, NULL, "specprefill",
     "draft query rows incl. the last prompt token"},
    {"--chunk", "C", OPT_INT, OFF(chunk), 1, 1 << 20, NULL, 32, NULL, "specprefill",
     "chunk size in tokens"},
    {"--spec-pool", "K", OPT_ODD, OFF(spec_pool), 1, 1025, NULL, 13, NULL, "specprefill",
     "average-pool kernel, odd"},
    {"--draft", "MODEL", OPT_PATH, OFF(draft_path), 0, 0, NULL, 0, "none", "specprefill",
     "draft model with the same vocabulary"},
    {"--draft-layers", "N", OPT_INT, OFF(draft_layers), 1, 4096, NULL, 0, "ceil(L/2) without --draft",
     "specprefill", "self-draft from the main model's first N layers"},
    {"--keep-last", "on|off", OPT_CHOICE, OFF(keep_last), 0, 0, "on=1|off=0", 1, NULL,
     "specprefill", "always keep the last chunk; off: the top chunks alone (the authors' code)"},
    {"--swiftkv-layers", "l", OPT_INT, OFF(swiftkv_layers), 1, 4096, NULL, 0,
     "L/2, or a checkpoint's own", "swiftkv", "layers the whole prompt runs"},
    {"--swiftkv-group", "G", OPT_INT, OFF(swiftkv_group), 1, 4096, NULL, 0, "1", "swiftkv",
     "layers sharing one KV cache, divides L-l"},
    {"--swiftkv-norm", "own|shared", OPT_CHOICE, OFF(swiftkv_fold), 0, 0, "own=1|shared=0", -1,
     "shared", "swiftkv", "training-free init: each layer's input norm folded into its K/V "
     "(own), or layer l's norm (shared); without a distilled checkpoint EXPERIMENTAL "
     "(bench/EVAL.md)"},
    {"--sink", "N", OPT_INT, OFF(sink), 0, 1 << 20, NULL, 4, NULL, "topk+phi, topk",
     "anchors read exactly at decode: the first N prompt tokens"},
    {"--tail", "N", OPT_INT, OFF(tail), 0, 1 << 20, NULL, 16, NULL, "topk+phi, topk",
     "anchors read exactly at decode: the last N prompt tokens"},
    {"--topk", "K", OPT_INT, OFF(topk), 0, 1 << 22, NULL, -1, "from --budget", "topk+phi, topk",
     "entries retrieved per query head; 0 = sink + tail only"},
    {"--budget", "F", OPT_FLOAT, OFF(budget), 1e-6, 1, NULL, 0.02, NULL, "topk+phi, topk",
     "exact reads as a share of the prompt, phi cache included; the K it leaves is raised to "
     "min(16, mid tokens) when lower (a short prompt), and the note says so"},
    {"--phi", "FILE", OPT_PATH, OFF(phi_path), 0, 0, NULL, 0, "random features", "topk+phi",
     "fitted maps (sift fit-phi)"},
    {"--selector", "exact|pages", OPT_CHOICE, OFF(selector), 0, 0, "exact=0|pages=1", 0, NULL,
     "topk+phi, topk", "how decode finds the top K: exact scores every mid key; pages reads "
     "per-page key bounds and scores only the best pages' keys"},
    {"--page-size", "P", OPT_INT, OFF(page_size), 1, 4096, NULL, 16, NULL, "topk+phi, topk",
     "keys per page of bounds (--selector pages)"},
    {"--pages", "N", OPT_INT, OFF(pages), 1, 1 << 24, NULL, -1, "max(2048, 8 K) keys' worth",
     "topk+phi, topk", "pages scored exactly per KV head (--selector pages); raised to "
     "ceil(K / P) + 1"},
    {"--selector-recall", "on|off", OPT_CHOICE, OFF(selector_recall), 0, 0, "on=1|off=0", 0, NULL,
     "topk+phi, topk", "also run the exact selector each step and report the recall of its "
     "top K (slower: the steps leave the graph)"},
};
#define N_OPTS (int)(sizeof OPTS / sizeof *OPTS)

const opt_def *strategy_opts_table(int *n) {
    *n = N_OPTS;
    return OPTS;
}

const opt_def *strategy_opt_find(const char *flag) {
    for (int i = 0; i < N_OPTS; i++)
        if (strcmp(OPTS[i].flag, flag) == 0) return &OPTS[i];
    return NULL;
}

// The value of choice `name` in "a=1|b=0"; 0 or -1 when it is not one.
static int choice_value(const char *choices, const char *name, int *value) {
    size_t n = strlen(name);
    for (const char *p = choices; *p;) {
        const char *eq = strchr(p, '='), *bar = strchr(p, '|');
        if ((size_t)(eq - p) == n && strncmp(p, name, n) == 0) {
            *value = atoi(eq + 1);
            return 0;
        }
        if (!bar) break;
        p = bar + 1;
    }
    return -1;
}

int strategy_opt_set(strategy_opts *o, const opt_def *d, const char *v, char *err, size_t errlen) {
    char *field = (char *)o + d->offset, *end;
    if (d->type == OPT_PATH) {
        *(const char **)field = v;
        return 0;
    }
    if (d->type == OPT_CHOICE) {
        if (choice_value(d->choices, v, (int *)field) == 0) return 0;
        char names[128];   // "a=1|b=0" -> "a or b"
        size_t j = 0;
        for (const char *p = d->choices; *p && j + 5 < sizeof names; p++)
            if (*p == '|') j += (size_t)snprintf(names + j, sizeof names - j, " or ");
            else if (*p == '=') p += strcspn(p, "|") - 1;
            else names[j++] = *p;
        names[j] = 0;
        return err_printf(err, errlen, "%s must be %s, not '%s'", d->flag, names, v);
    }
    errno = 0;
    double x = d->type == OPT_FLOAT ? strtod(v, &end) : (double)strtoll(v, &end, 10);
    if (errno || end == v || *end || !isfinite(x))
        return err_printf(err, errlen, "invalid %s '%s' for %s", d->type == OPT_FLOAT ? "number"
                          : "integer", v, d->flag);
    if (x < d->lo || x > d->hi)
        return err_printf(err, errlen, "%s %s is out of range [%g, %g]", d->flag, v, d->lo, d->hi);
    if (d->type == OPT_ODD && (long long)x % 2 == 0)
        return err_printf(err, errlen, "%s %s must be odd (a window centred on each token)", d->flag, v);
    if (d->type == OPT_FLOAT) *(float *)field = (float)x;
    else *(int *)field = (int)x;
    return 0;
}

int strategy_opt_used_by(const opt_def *d, const char *name) {
    const strategy *s = strategy_find(name);
    if (s && s->decode_part)
        return strategy_opt_used_by(d, s->prefill_part->name) || strategy_opt_used_by(d, s->decode_part->name);
    size_t n = strlen(name);
    for (const char *p = d->used_by; p && *p;) {
        size_t k = strcspn(p, ",");
        if (k == n && strncmp(p, name, n) == 0) return 1;
        p += k;
        while (*p == ',' || *p == ' ') p++;
    }
    return 0;
}

// The name of choice `value` in "a=1|b=0" into buf; 0, or -1 when no name has that value.
static int choice_name(const char *choices, int value, char *buf, size_t len) {
    for (const char *p = choices; *p;) {
        const char *eq = strchr(p, '='), *bar = strchr(p, '|');
        if (atoi(eq + 1) == value) {
            snprintf(buf, len, "%.*s", (int)(eq - p), p);
            return 0;
        }
        if (!bar) break;
        p = bar + 1;
    }
    return -1;
}

// d's value in o into buf, as JSON (json: a number, a string or null) or as text: a choice by
// its name ("max", not 0); a count outside the flag's range (a strategy's "decided per prompt",
// topk -1; or "not used", draft_layers with --draft) null / "unset (its --help default)"; a
// path or null / "none".
static void opt_value(const strategy_opts *o, const opt_def *d, int json, char *buf, size_t len) {
    const char *field = (const char *)o + d->offset;
    if (d->type == OPT_PATH) {
        const char *s = *(const char *const *)field;
        if (!s) snprintf(buf, len, "%s", json ? "null" : "none");
        else {   // a path: quotes and backslashes escaped, control bytes dropped
            size_t j = 0;
            if (json) buf[j++] = '"';
            for (; *s && j + 3 < len; s++) {
                if (json && (*s == '"' || *s == '\\')) buf[j++] = '\\';
                if ((unsigned char)*s >= 0x20) buf[j++] = *s;
            }
            if (json) buf[j++] = '"';
            buf[j] = 0;
        }
    } else if (d->type == OPT_FLOAT) snprintf(buf, len, "%.6g", *(const float *)field);
    else if (d->type == OPT_CHOICE) {
        char name[64];
        int v = *(const int *)field;
        if (choice_name(d->choices, v, name, sizeof name) != 0) snprintf(buf, len, "%d", v);
        else snprintf(buf, len, json ? "\"%s\"" : "%s", name);
    } else {
        int v = *(const int *)field;
        if (v < d->lo || v > d->hi) {
            if (json) snprintf(buf, len, "null");
            else snprintf(buf, len, "unset%s%s%s", d->def_text ? " (" : "", d->def_text ? d->def_text : "",
                          d->def_text ? ")" : "");
        }
        else snprintf(buf, len, "%d", v);
    }
}

strategy_opts strategy_opts_default(void) {
    strategy_opts o = {0};
    for (int i = 0; i < N_OPTS; i++) {
        char *field = (char *)&o + OPTS[i].offset;
        if (OPTS[i].type == OPT_FLOAT) *(float *)field = (float)OPTS[i].def;
        else if (OPTS[i].type != OPT_PATH) *(int *)field = (int)OPTS[i].def;
    }
    return o;
}

strategy_opts strategy_opts_resolved(const strategy *s, const model *m, const strategy_run *run,
                                     const strategy_opts *so) {
    strategy_opts o = *so;
    if (!m) return o;
    const strategy *parts[2] = {s->decode_part ? s->prefill_part : s, s->decode_part};
    for (int i = 0; i < 2; i++)
        if (parts[i] && parts[i]->resolve) parts[i]->resolve(m, run, &o);
    return o;
}

// The parameters strategy_name reads, "key": value pairs (json) or "key value" (text), each key
// its flag's name with '_' for '-'.
static void settings_write(FILE *out, const strategy_opts *so, const char *strategy_name, int json) {
    int n, first = 1;
    const opt_def *t = strategy_opts_table(&n);
    if (json) fputc('{', out);
    for (int i = 0; i < n; i++) {
        if (!strategy_opt_used_by(&t[i], strategy_name)) continue;
        char v[600], key[40];
        opt_value(so, &t[i], json, v, sizeof v);
        size_t k = 0;
        for (const char *p = t[i].flag + 2; *p && k + 1 < sizeof key; p++) key[k++] = *p == '-' ? '_' : *p;
        key[k] = 0;
        if (json) fprintf(out, "%s\"%s\":%s", first ? "" : ",", key, v);
        else fprintf(out, "%s%s %s", first ? "" : ", ", key, v);
        first = 0;
    }
    if (json) fputc('}', out);
}

void strategy_settings_json(FILE *out, const strategy_opts *so, const char *strategy_name) {
    settings_write(out, so, strategy_name, 1);
}

int strategy_settings_text(FILE *out, const strategy_opts *so, const char *strategy_name) {
    int n, any = 0;
    const opt_def *t = strategy_opts_table(&n);
    for (int i = 0; i < n && !any; i++) any = strategy_opt_used_by(&t[i], strategy_name);
    if (any) settings_write(out, so, strategy_name, 0);
    return any;
}
