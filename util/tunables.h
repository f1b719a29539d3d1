// util/tunables.h — the developer tunables: `SIFT_*` environment variables that are not user flags
// (A/B switches for benchmarks and tests, overrides of measured thresholds). Read once, here, into
// one struct; no other file calls getenv on a SIFT_ name (user flags with an environment default,
// such as SIFT_MODEL, come through the flag table, cmd/flags.c). docs/environment.md lists them.
#pragma once
#include <stddef.h>

enum tun_way { TUN_WAY_MEASURE, TUN_WAY_TOGETHER, TUN_WAY_ALONE };
enum tun_prefill { TUN_PREFILL_INT8, TUN_PREFILL_TUNE };   // index into TUN_PREFILL_NAMES
enum tun_attn { TUN_ATTN_FA2W, TUN_ATTN_WG };   // SIFT_ATTN_PREFILL's values

typedef struct {
    // ---- CPU (qgemm/, backend/backend_cpu.c, backend/gemm_cpu.c)
    int isa;              // SIFT_ISA scalar|avx2|avx512: the widest product kernels used (-1: the
                          // best the CPU has; values are enum q_isa's)
    int prefill;          // SIFT_PREFILL int8|tune (enum tun_prefill): every quantised product on
                          // the int8 row kernels, or the wide path timed per shape (-1: the rule)
    int strip_prefetch;   // SIFT_STRIP_PREFETCH l1|l2: the Q4_K strips' prefetch level, 1 or 2 (0:
                          // as timed at the first Q4_K matrix; set but empty is refused)
    int strip_rows8;      // SIFT_STRIP_ROWS8 on|off: 1 or 0 (-1: as timed; empty is refused)
    const char *blas_detected;   // SIFT_BLAS_DETECTED: the core OpenBLAS detected before sift
                                 // re-ran itself with OPENBLAS_CORETYPE (backend_cpu.c), or NULL
    // ---- CUDA (backend/*_cuda.cu, attn/*_cuda.cu, model/decode.c)
    int cuda_graphs;      // SIFT_CUDA_GRAPHS=0: decode steps never recorded as graphs (default 1)
    int attn_prefill;     // SIFT_ATTN_PREFILL fa2w|wg (enum tun_attn): wg runs the wgmma prefill
                          // kernel on compute capability 9.0 (the A/B against fa2w, the default)
    int cuda_smem_optin;  // SIFT_CUDA_SMEM_OPTIN: bytes of shared memory a block may opt in to, for
                          // the kernels that choose by it (0: the device's figure)
    int cuda_qgemv_group; // SIFT_CUDA_QGEMV=group: K-quant/Q8_0 decode by the group kernel
    int cuda_qgemm_rows;  // SIFT_CUDA_QGEMM_ROWS: x rows up to which the tile kernel takes a
                          // quantised product (-1: the built-in threshold)
    int cuda_dq_rows;     // SIFT_CUDA_DQ_ROWS: rows per dequantised chunk (0: what fits)
    int cuda_weights_bf16;   // SIFT_CUDA_WEIGHTS=bf16: GGUF weights converted, not kept in blocks
    int cuda_soft_fail;   // SIFT_CUDA_SOFT_FAIL=1: a refused GEMM is a line, not exit 3
    const char *cublaslt; // SIFT_CUBLASLT: the libcublasLt to open first, or NULL
    // ---- batch jobs (jobs/)
    long pack_rows;       // SIFT_PACK_ROWS: rows of a packed prefill pass at most (-1: default;
                          // 0: every prompt prefilled alone)
    int parallel_way;     // SIFT_PARALLEL_WAY measure|together|alone (enum tun_way)
    // ---- command line (cmd/flags.c)
    int parse_only;       // SIFT_PARSE_ONLY=1: stop once the command line parses (exit 0)
} sift_tunables;

extern const char *const TUN_PREFILL_NAMES[];       // NULL-terminated, SIFT_PREFILL's values

// Reads every SIFT_ tunable from the environment into the one struct. 0, or -1 with a one-line
// reason naming the variable and its accepted values (main exits 2 with it).
int tunables_load(char *err, size_t errlen);
// The tunables (loaded on first use when main has not: a tool or a test binary; a bad value then
// ends the process with exit 2 and the reason).
const sift_tunables *tunables(void);
// For test and benchmark binaries that A/B a path in one process (gpu_check): the struct itself.
sift_tunables *tunables_edit(void);
