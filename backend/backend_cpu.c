// backend/backend_cpu.c — the CPU backend: fp32 activations; weights in their file encoding with
// 8-bit-activation products (qgemm/), or fp32 (--weights f32: sgemm / sgemv, the reference every
// other path is checked against). OpenMP threads. This file makes the backend (thread count,
// BLAS kernels) and fills the op table; the ops live in mem_cpu.c, gemm_cpu.c, ops_cpu.c and
// kv_cpu.c (backend_cpu.h), attention in attn/attn_cpu.c.
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>
#include <stdio.h>

#include "backend_cpu.h"

static void cpu_destroy(backend *b) {
    q_scratch_free(&impl(b)->scratch);
    free(impl(b)->rope.pos), free(impl(b)->rope.inv_freq), free(impl(b)->rope.cs);
    free(impl(b)->sel_rows);
    free(b->impl);
    free(b);
}

// Physical cores this process may run on: distinct (package, core) pairs of the CPUs in its
// affinity mask (sysfs topology); 0 when unknown. Two hyperthreads of one core share its vector
// units and caches, so a second thread per core only adds barrier waits to these kernels.
static int physical_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    long seen[CPU_SETSIZE];
    int n = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &set)) continue;
        long id[2] = {-1, -1};
        const char *field[2] = {"physical_package_id", "core_id"};
        for (int f = 0; f < 2; f++) {
            char path[128];
            snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/%s", cpu, field[f]);
            FILE *fp = fopen(path, "r");
            if (!fp || fscanf(fp, "%ld", &id[f]) != 1) id[f] = -1;
            if (fp) fclose(fp);
        }
        if (id[0] < 0 || id[1] < 0) return 0;
        long key = id[0] << 20 | id[1];
        int dup = 0;
        for (int i = 0; i < n && !dup; i++) dup = seen[i] == key;
        if (!dup) seen[n++] = key;
    }
    return n;
}

// CPUs' worth of time other processes (and the hypervisor: steal) took over the next `ms`
// milliseconds: the machine's busy time from /proc/stat less this process's own; -1 unknown.
static double others_busy(int ms) {
    double busy[2], steal[2], self[2];
    if (host_cpu_seconds(&busy[0], &steal[0], &self[0]) != 0) return -1;
    usleep((useconds_t)ms * 1000);
    if (host_cpu_seconds(&busy[1], &steal[1], &self[1]) != 0) return -1;
    double other = (busy[1] - busy[0] + steal[1] - steal[0] - (self[1] - self[0])) / (ms / 1e3);
    return other < 0 ? 0 : other;
}

// The default thread count: OMP_NUM_THREADS, else the physical cores less those other processes
// keep busy (sampled once per process over 50 ms; *busy: that count). OpenMP threads that share a
// core with a busy process make every barrier wait for a time slice: with one busy process on
// the 2-core dev machine, 2 threads gave a 3-strategy A/B run TPOTs of 4.3x the idle ones with
// 544-831 % spread, 1 thread 1.6x with <= 9 % (bench/RESULTS.md).
int backend_cpu_default_threads(int *busy) {
    static int threads = -1, others = 0;
    if (threads < 0) {
        const char *env = getenv("OMP_NUM_THREADS");
        threads = env && *env ? atoi(env) : 0;
        if (threads <= 0) {
            int cores = physical_cores();
            if (cores <= 0) cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
            double other = cores > 1 ? others_busy(50) : 0;
            others = other > 0 ? (int)(other + 0.5) : 0;
            others = others > cores - 1 ? cores - 1 : others;
            threads = cores - others;
        }
        if (threads <= 0) threads = 1;
    }
    if (busy) *busy = others;
    return threads;
}

static int core_has_avx2(const char *name) {
    static const char *const good[] = {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        if (strcmp(name, good[i]) == 0) return 1;
    return 0;
}

void backend_cpu_blas_init(char **argv) {
    const char *core = openblas_get_corename();
    if (getenv("OPENBLAS_CORETYPE") || !core || core_has_avx2(core)) return;
    __builtin_cpu_init();
    const char *want = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                               __builtin_cpu_supports("avx512cd")
                           ? "SkylakeX"
                       : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "Haswell"
                                                                                          : NULL;
    if (!want) return;
    setenv("OPENBLAS_CORETYPE", want, 1);
    setenv("SIFT_BLAS_DETECTED", core, 1);
    fflush(NULL);
    execv("/proc/self/exe", argv);   // returns only on failure: go on with the slow kernels
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("SIFT_BLAS_DETECTED");
}

const char *backend_cpu_blas_core(void) {
    static char s[96];
    const char *was = tunables()->blas_detected, *core = openblas_get_corename();
    if (was) snprintf(s, sizeof s, "%s (OpenBLAS detected %s)", core, was);
    else snprintf(s, sizeof s, "%s", core);
    return s;
}

backend *backend_cpu_create(int n_threads, enum bk_weights weights) {
    int busy = 0, auto_threads = backend_cpu_default_threads(&busy);
    if (n_threads <= 0) n_threads = auto_threads;
    if (n_threads != auto_threads) busy = 0;   // the user chose
    if (n_threads > 0) omp_set_num_threads(n_threads);
    backend *b = xcalloc(1, sizeof *b);
    cpu_impl *c = xcalloc(1, sizeof *c);
    c->mode = weights;
    c->isa = q_isa_pick();
    c->amx = c->isa == Q_ISA_AVX512 && q_amx_available();
    c->prefill = weights == BK_WEIGHTS_EXACT ? TUN_PREFILL_INT8 : tunables()->prefill;
    c->strip = (q_strip_form){tunables()->strip_prefetch, tunables()->strip_rows8};
    c->strip_ms[0] = c->strip_ms[1] = c->strip_ms[2] = NAN;
    if (c->strip.level && c->strip.rows8 >= 0) q_strip_set(c->strip);
    // --weights fast: one activation digit in decode's row kernels too (llama.cpp's precision)
    c->rows = weights == BK_WEIGHTS_FAST ? Q_PATH_INT8_1 : Q_PATH_INT8;
    *b = (backend){
        .name = "cpu", .impl = c, .elem_bytes = sizeof(float), .destroy = cpu_destroy,
        .alloc = cpu_alloc, .free = cpu_free, .to_host = cpu_to_host,
        .weight = cpu_weight, .weight_bytes = cpu_weight_bytes, .weight_free = cpu_weight_free,
        .vector_to_host = cpu_vector_to_host,
        .report = cpu_report, .matmul_multi = cpu_matmul_multi,
        .embed = cpu_embed, .rmsnorm = cpu_rmsnorm, .matmul = cpu_matmul, .rope = cpu_rope,
        .row_class = cpu_row_class,
        .swiglu = cpu_swiglu, .add = cpu_add, .gather_rows = cpu_gather_rows,
        .kv_append = cpu_kv_append, .attention = cpu_attention,
        .attention_multi = cpu_attention_multi, .attn_probs = cpu_attn_probs,
        .kv_keep = cpu_kv_keep, .mem_available = cpu_mem_available,
        .window_scores = cpu_window_scores, .score_group_sum = cpu_score_group_sum,
        .score_fold_max = cpu_score_fold_max,
        .score_select = cpu_score_select, .kv_keep_at = cpu_kv_keep_at,
        .ints_to_host = cpu_ints_to_host, .ints_from_host = cpu_ints_from_host,
        .weight_synth = cpu_weight_synth, .ceilings = cpu_ceilings, .attn_select = cpu_attn_select,
        .phi_summarize = cpu_phi_summarize, .attn_topk_step = cpu_attn_topk_step,
        .kv_pages_build = cpu_kv_pages_build,
    };
    int used = 0;
    if (busy)
        used = snprintf(b->info, sizeof b->info, "%d thread%s: %d core%s busy with other processes, ",
                        n_threads, n_threads > 1 ? "s" : "", busy, busy > 1 ? "s" : "");
    used += snprintf(b->info + used, sizeof b->info - used, "BLAS %s, ", backend_cpu_blas_core());
    if (weights == BK_WEIGHTS_F32)
        snprintf(b->info + used, sizeof b->info - used, "fp32 weights, sgemm");
    else
        snprintf(b->info + used, sizeof b->info - used, "native weights, %s products, prefill path %s",
                 q_isa_name(c->isa), weights == BK_WEIGHTS_EXACT ? "int8 two-digit (--weights exact)"
                                     : c->prefill == TUN_PREFILL_INT8 ? "int8 (SIFT_PREFILL)"
                                     : c->prefill == TUN_PREFILL_TUNE ? "timed per shape (SIFT_PREFILL)"
                                     : c->amx                    ? "amx bf16 tiles from 16 rows"
                                     : c->isa == Q_ISA_AVX512 && weights == BK_WEIGHTS_FAST
                                         ? "vnni one-digit gemm from 16 rows (--weights fast)"
                                     : c->isa == Q_ISA_AVX512    ? "vnni two-digit gemm from 16 rows (Q4_K from 32)"
                                                                 : "sgemm tiles from 64 rows");
    return b;
}
