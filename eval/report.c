// eval/report.c — what `sift eval` prints and writes: the per-cell table (strategy x task x ctx),
// the per-strategy summary against full, the cells under 95% of full's accuracy, and the same
// numbers as JSON (schema "sift-eval/1") and CSV (one row per prompt and strategy).
#include <math.h>
#include <string.h>

#include "../tok/tok.h"
#include "eval.h"

// Means over the records matching (strategy, task, ctx); task / ctx < 0 match all.
typedef struct {
    int n;
    double acc, first, greedy, kl, ttft, tpot, kv;
} agg;

static agg aggregate(const eval_report *r, const char *strategy, int task, int ctx) {
    agg a = {0};
    for (int i = 0; i < r->n_recs; i++) {
        const eval_record *x = &r->recs[i];
        if (strcmp(x->strategy, strategy) || (task >= 0 && (int)x->task != task) ||
            (ctx >= 0 && x->ctx != ctx))
            continue;
        a.n++;
        a.acc += x->score, a.first += x->first_agree, a.greedy += x->greedy_agree;
        a.kl += x->kl, a.ttft += x->ttft_ms, a.tpot += x->tpot_ms, a.kv += x->kv_mib;
    }
    if (a.n) {
        a.acc /= a.n, a.first /= a.n, a.greedy /= a.n, a.kl /= a.n;
        a.ttft /= a.n, a.tpot /= a.n, a.kv /= a.n;
    }
    return a;
}

static double ratio(double a, double b) { return b > 0 ? a / b : NAN; }

void eval_table_num(FILE *out, const char *fmt, double v) {
    if (isnan(v)) fputs("-", out);
    else fprintf(out, fmt, v);
}

void eval_print_tables(FILE *out, const eval_report *r) {
    fprintf(out, "\n| strategy | task | ctx | prompts | accuracy | 1st token = full | greedy agree "
                 "| KL(full‖s) | TTFT ms | TPOT ms | KV MiB |\n"
                 "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int s = 0; s < r->n_strategies; s++)
        for (int t = 0; t < r->n_tasks; t++)
            for (int c = 0; c < r->n_ctxs; c++) {
                agg a = aggregate(r, r->strategies[s], r->tasks[t], r->ctxs[c]);
                if (a.n == 0) continue;
                fprintf(out, "| %s | %s | %d | %d | %.3f | %.3f | %.3f | %.4f | %.1f | %.2f | %.2f |\n",
                        r->strategies[s], eval_task_name(r->tasks[t]), r->ctxs[c], a.n, a.acc,
                        a.first, a.greedy, a.kl, a.ttft, a.tpot, a.kv);
            }
    agg full = aggregate(r, "full", -1, -1);
    fprintf(out, "\n| strategy | prompts | accuracy | accuracy / full | 1st token = full "
                 "| greedy agree | KL(full‖s) | prefill speedup | KV reduction |\n"
                 "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int s = 0; s < r->n_strategies; s++) {
        agg a = aggregate(r, r->strategies[s], -1, -1);
        if (a.n == 0) continue;
        fprintf(out, "| %s | %d | %.3f | ", r->strategies[s], a.n, a.acc);
        eval_table_num(out, "%.3f", ratio(a.acc, full.acc));
        fprintf(out, " | %.3f | %.3f | %.4f | ", a.first, a.greedy, a.kl);
        eval_table_num(out, "%.2fx", ratio(full.ttft, a.ttft));
        fputs(" | ", out);
        eval_table_num(out, "%.2fx", ratio(full.kv, a.kv));
        fputs(" |\n", out);
    }
    int header = 0;
    for (int s = 1; s < r->n_strategies; s++)
        for (int t = 0; t < r->n_tasks; t++)
            for (int c = 0; c < r->n_ctxs; c++) {
                agg a = aggregate(r, r->strategies[s], r->tasks[t], r->ctxs[c]);
                agg f = aggregate(r, "full", r->tasks[t], r->ctxs[c]);
                if (a.n == 0 || !(a.acc < 0.95 * f.acc)) continue;
                if (!header++) fprintf(out, "\nunder 95%% of full's accuracy:\n");
                fprintf(out, "- %s on %s at %d: %.3f vs full %.3f\n", r->strategies[s],
                        eval_task_name(r->tasks[t]), r->ctxs[c], a.acc, f.acc);
            }
    if (!r->complete) fprintf(out, "\n(interrupted: partial results)\n");
    fflush(out);
}

// ---- JSON ----

// s as a JSON string (cmd/cli.c: control characters escaped, invalid UTF-8 bytes as U+FFFD).
static void json_str(FILE *out, const char *s) { tok_json_str(out, s, strlen(s)); }

static void json_num(FILE *out, const char *fmt, double v) {
    if (isnan(v) || isinf(v)) fputs("null", out);
    else fprintf(out, fmt, v);
}

static void json_agg(FILE *out, const agg *a) {
    fprintf(out, "\"prompts\":%d,\"accuracy\":%.4f,\"first_token_agree\":%.4f,"
                 "\"greedy_agree\":%.4f,\"kl\":%.6f,\"ttft_ms\":%.3f,\"tpot_ms\":%.3f,\"kv_mib\":%.3f",
            a->n, a->acc, a->first, a->greedy, a->kl, a->ttft, a->tpot, a->kv);
}

static void json_record(FILE *out, const eval_record *x) {
    fprintf(out, "{\"strategy\":\"%s\",\"task\":\"%s\",\"ctx\":%d,\"sample\":%d,\"seed\":%llu,"
                 "\"depth\":", x->strategy, eval_task_name(x->task), x->ctx, x->sample,
            (unsigned long long)x->seed);
    json_num(out, "%.4f", x->depth < 0 ? NAN : x->depth);
    fprintf(out, ",\"prompt_tokens\":%d,\"expected\":[", x->prompt_tokens);
    char exp[sizeof x->expected];
    memcpy(exp, x->expected, sizeof exp);
    int first = 1;
    for (char *save = NULL, *t = strtok_r(exp, "|", &save); t; t = strtok_r(NULL, "|", &save)) {
        fputs(first ? "" : ",", out);
        json_str(out, t);
        first = 0;
    }
    fputs("],\"answer\":", out);
    json_str(out, x->answer);
    fprintf(out, ",\"score\":%.4f,\"first_token_agree\":%s,\"greedy_agree\":%.4f,\"kl\":%.6f,"
                 "\"ttft_ms\":%.3f,\"tpot_ms\":%.3f,\"kv_mib\":%.3f,\"note\":",
            x->score, x->first_agree ? "true" : "false", x->greedy_agree, x->kl, x->ttft_ms,
            x->tpot_ms, x->kv_mib);
    json_str(out, x->note);
    fputc('}', out);
}

void eval_write_json(FILE *out, const eval_report *r) {
    fputs("{\"schema\":\"sift-eval/1\",\"model\":", out);
    json_str(out, r->model);
    fprintf(out, ",\"seed\":%llu,\"samples\":%d,\"complete\":%s,\"query_agnostic\":%s,\"strategies\":[",
            (unsigned long long)r->seed, r->samples, r->complete ? "true" : "false",
            r->query_agnostic ? "true" : "false");
    for (int s = 0; s < r->n_strategies; s++) fprintf(out, "%s\"%s\"", s ? "," : "", r->strategies[s]);
    fputs("],\"tasks\":[", out);
    for (int t = 0; t < r->n_tasks; t++) fprintf(out, "%s\"%s\"", t ? "," : "", eval_task_name(r->tasks[t]));
    fputs("],\"ctx\":[", out);
    for (int c = 0; c < r->n_ctxs; c++) fprintf(out, "%s%d", c ? "," : "", r->ctxs[c]);
    fputs("],\n\"summary\":[", out);
    agg full = aggregate(r, "full", -1, -1);
    for (int s = 0; s < r->n_strategies; s++) {
        agg a = aggregate(r, r->strategies[s], -1, -1);
        fprintf(out, "%s\n{\"strategy\":\"%s\",", s ? "," : "", r->strategies[s]);
        json_agg(out, &a);
        fputs(",\"accuracy_vs_full\":", out);
        json_num(out, "%.4f", ratio(a.acc, full.acc));
        fputs(",\"prefill_speedup\":", out);
        json_num(out, "%.4f", ratio(full.ttft, a.ttft));
        fputs(",\"kv_reduction\":", out);
        json_num(out, "%.4f", ratio(full.kv, a.kv));
        fputc('}', out);
    }
    fputs("],\n\"cells\":[", out);
    int first = 1;
    for (int s = 0; s < r->n_strategies; s++)
        for (int t = 0; t < r->n_tasks; t++)
            for (int c = 0; c < r->n_ctxs; c++) {
                agg a = aggregate(r, r->strategies[s], r->tasks[t], r->ctxs[c]);
                if (a.n == 0) continue;
                fprintf(out, "%s\n{\"strategy\":\"%s\",\"task\":\"%s\",\"ctx\":%d,", first ? "" : ",",
                        r->strategies[s], eval_task_name(r->tasks[t]), r->ctxs[c]);
                json_agg(out, &a);
                fputc('}', out);
                first = 0;
            }
    fputs("],\n\"records\":[", out);
    for (int i = 0; i < r->n_recs; i++) {
        fputs(i ? ",\n" : "\n", out);
        json_record(out, &r->recs[i]);
    }
    fputs("]}\n", out);
}

// ---- CSV ----

static void csv_str(FILE *out, const char *s) {
    fputc('"', out);
    for (; *s; s++) {
        if (*s == '"') fputc('"', out);
        fputc(*s, out);
    }
    fputc('"', out);
}

void eval_write_csv(FILE *out, const eval_report *r) {
    fputs("strategy,task,ctx,sample,seed,depth,prompt_tokens,expected,answer,score,"
          "first_token_agree,greedy_agree,kl,ttft_ms,tpot_ms,kv_mib,note\n", out);
    for (int i = 0; i < r->n_recs; i++) {
        const eval_record *x = &r->recs[i];
        fprintf(out, "%s,%s,%d,%d,%llu,", x->strategy, eval_task_name(x->task), x->ctx, x->sample,
                (unsigned long long)x->seed);
        if (x->depth >= 0) fprintf(out, "%.4f", x->depth);
        fprintf(out, ",%d,", x->prompt_tokens);
        csv_str(out, x->expected);
        fputc(',', out);
        csv_str(out, x->answer);
        fprintf(out, ",%.4f,%d,%.4f,%.6f,%.3f,%.3f,%.3f,", x->score, x->first_agree,
                x->greedy_agree, x->kl, x->ttft_ms, x->tpot_ms, x->kv_mib);
        csv_str(out, x->note);
        fputc('\n', out);
    }
}
