// simt/cublaslt.cpp — cuBLASLt for the SIMT emulation build (simt/include/cublasLt.h):
// the descriptor, layout and preference objects, a heuristic that offers one algorithm when the
// problem is one the emulator can run, and cublasLtMatmul as a CPU reference GEMM,
//     D = epilogue(alpha * op(A) @ op(B) + beta * C (+ bias)),
// column-major, fp32 accumulation over k = 0..K-1 in that order, one rounding to D's type.
// Inputs are checked as the real library checks them (inconsistent shapes: INVALID_VALUE; what
// it cannot run: NOT_SUPPORTED), and, beyond it, every pointer is checked against the emulated
// device's allocations and against the alignment promised to the heuristic, so that a call that
// would fault or misbehave on a GPU fails here with one line on stderr saying why.
// The GEMM runs on the stream (simt::stream_enqueue), so a graph capture records it; it reads
// its operands when it runs, as a kernel would. No OpenMP here: the binary links gcc's libgomp
// (OpenBLAS), which clang's libomp must not meet; big problems use a few std::threads instead.
#include <stdarg.h>
#include <stdio.h>

#include <atomic>
#include <thread>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>

#include "runtime.h"

// The products and sums below are the reference numerics: never fused into FMAs, whatever the
// build flags (for bf16 inputs it would not matter, their products being exact in fp32).
#pragma clang fp contract(off)

#define LT_MAGIC 0x73696d744c74756cull // "simtLtul": an algorithm this file handed out
#define ALIGN_DEFAULT 256u             // the real default of MIN_ALIGNMENT_*_BYTES

struct simt_lt_handle {
    uint64_t magic;
};

struct simt_lt_desc {
    int32_t compute, scale, pointer_mode, transa, transb, transc, fill;
    uint32_t epilogue;
    const void *bias;
    int64_t bias_batch_stride;
    int32_t bias_type; // -1: D's type
};

struct simt_lt_layout {
    uint32_t type;
    int32_t order;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t batch_stride;
};

struct simt_lt_pref {
    uint32_t search_mode;
    uint64_t max_workspace;
    uint32_t reduction_mask;
    uint32_t align[4]; // A, B, C, D
    float max_waves;
    uint64_t impl_mask;
};

// ---- messages and small helpers -----------------------------------------------------------------

// A refusal that is a bug in the caller (or a problem the emulator cannot run, found only at
// cublasLtMatmul): the real library says nothing, but here the reason is worth one line.
static cublasStatus_t refuse(cublasStatus_t s, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static cublasStatus_t refuse(cublasStatus_t s, const char *fn, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "simt: cuBLASLt: %s: %s (%s)\n", fn, msg, cublasLtGetStatusName(s));
    return s;
}

// Bytes per element, 0 for a type the emulator knows nothing of.
static size_t elem_size(int32_t t) {
    switch (t) {
    case CUDA_R_8I:
    case CUDA_R_8U:
    case CUDA_R_8F_E4M3:
    case CUDA_R_8F_E5M2:
        return 1;
    case CUDA_R_16F:
    case CUDA_R_16BF:
        return 2;
    case CUDA_R_32F:
    case CUDA_R_32I:
        return 4;
    case CUDA_R_64F:
    case CUDA_C_32F:
        return 8;
    default:
        return 0;
    }
}

static const char *type_name(int32_t t) {
    switch (t) {
    case CUDA_R_32F:
        return "CUDA_R_32F";
    case CUDA_R_64F:
        return "CUDA_R_64F";
    case CUDA_R_16F:
        return "CUDA_R_16F";
    case CUDA_R_16BF:
        return "CUDA_R_16BF";
    case CUDA_R_8I:
        return "CUDA_R_8I";
    case CUDA_R_32I:
        return "CUDA_R_32I";
    default:
        return "another type";
    }
}

// Element (rows x cols, column-major, leading dimension ld) extent in elements: what a kernel
// touches from the first element to the last; 0 for an empty matrix.
static uint64_t span_elems(const simt_lt_layout *l) {
    if (!l->rows || !l->cols) return 0;
    return (l->cols - 1) * (uint64_t)l->ld + l->rows;
}

// ---- status, handle -----------------------------------------------------------------------------

extern "C" size_t cublasLtGetVersion(void) {
    return 130000;
} // cuBLAS 13.0.0, as CUDA 13's

extern "C" const char *cublasLtGetStatusName(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
        return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

// The real library describes the status in words; the emulator names it, which is what a log
// line about a refused call needs.
extern "C" const char *cublasLtGetStatusString(cublasStatus_t s) {
    return cublasLtGetStatusName(s);
}

extern "C" cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    if (!h) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtCreate", "NULL handle pointer");
    *h = new simt_lt_handle{LT_MAGIC};
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->magic = 0;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

// ---- attributes ---------------------------------------------------------------------------------

// Where an attribute lives: its storage and size, or NULL when the object has no such field.
struct field {
    void *p;
    size_t size;
};
#define FIELD(attr, member)                                                                        \
    case attr:                                                                                     \
        return field {                                                                             \
            &o->member, sizeof o->member                                                           \
        }

static field desc_field(simt_lt_desc *o, int attr) {
    switch (attr) {
        FIELD(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, compute);
        FIELD(CUBLASLT_MATMUL_DESC_SCALE_TYPE, scale);
        FIELD(CUBLASLT_MATMUL_DESC_POINTER_MODE, pointer_mode);
        FIELD(CUBLASLT_MATMUL_DESC_TRANSA, transa);
        FIELD(CUBLASLT_MATMUL_DESC_TRANSB, transb);
        FIELD(CUBLASLT_MATMUL_DESC_TRANSC, transc);
        FIELD(CUBLASLT_MATMUL_DESC_FILL_MODE, fill);
        FIELD(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
        FIELD(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
        FIELD(CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, bias_batch_stride);
        FIELD(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
    }
    return field{NULL, 0};
}

static field layout_field(simt_lt_layout *o, int attr) {
    switch (attr) {
        FIELD(CUBLASLT_MATRIX_LAYOUT_TYPE, type);
        FIELD(CUBLASLT_MATRIX_LAYOUT_ORDER, order);
        FIELD(CUBLASLT_MATRIX_LAYOUT_ROWS, rows);
        FIELD(CUBLASLT_MATRIX_LAYOUT_COLS, cols);
        FIELD(CUBLASLT_MATRIX_LAYOUT_LD, ld);
        FIELD(CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, batch);
        FIELD(CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, batch_stride);
    }
    return field{NULL, 0};
}

static field pref_field(simt_lt_pref *o, int attr) {
    switch (attr) {
        FIELD(CUBLASLT_MATMUL_PREF_SEARCH_MODE, search_mode);
        FIELD(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, max_workspace);
        FIELD(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, reduction_mask);
        FIELD(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]);
        FIELD(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]);
        FIELD(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]);
        FIELD(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[3]);
        FIELD(CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT, max_waves);
        FIELD(CUBLASLT_MATMUL_PREF_IMPL_MASK, impl_mask);
    }
    return field{NULL, 0};
}
#undef FIELD

// SetAttribute: the value's size must be the attribute's (as the real library demands). An
// attribute the real library has but the emulator does not model (`known`) is refused as not
// supported: ignoring it would run a different operation than the caller asked for.
static cublasStatus_t attr_set(const char *fn, const void *obj, field f, int attr, bool known,
                               const void *buf, size_t size) {
    if (!obj) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL descriptor");
    if (!f.p)
        return known ? refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "attribute %d is not emulated", attr)
                     : refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "no attribute %d", attr);
    if (!buf || size != f.size)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "attribute %d takes %zu bytes, got %zu%s",
                      attr, f.size, size, buf ? "" : " at NULL");
    memcpy(f.p, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

// GetAttribute: size 0 with sizeWritten asks for the size; otherwise buf must hold exactly it.
static cublasStatus_t attr_get(const char *fn, const void *obj, field f, int attr, bool known,
                               void *buf, size_t size, size_t *written) {
    if (!obj) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL descriptor");
    if (!f.p)
        return known ? refuse(CUBLAS_STATUS_NOT_SUPPORTED, fn, "attribute %d is not emulated", attr)
                     : refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "no attribute %d", attr);
    if (written) *written = f.size;
    if (size == 0 && written) return CUBLAS_STATUS_SUCCESS;
    if (!buf || size != f.size)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "attribute %d is %zu bytes, buffer %zu%s",
                      attr, f.size, size, buf ? "" : " at NULL");
    memcpy(buf, f.p, size);
    return CUBLAS_STATUS_SUCCESS;
}

// The real enumerators of each kind (cublasLt.h), for "not emulated" versus "no such attribute".
static bool desc_attr_known(int a) {
    return a >= 0 && a <= 26 && a != 9 && a != 16;
}
static bool layout_attr_known(int a) {
    return a >= 0 && a <= 7;
}
static bool pref_attr_known(int a) {
    return a >= 0 && a <= 12 && a != 2 && a != 4;
}

// ---- matmul descriptor --------------------------------------------------------------------------

extern "C" cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t ct,
                                                   cudaDataType_t st) {
    if (!d) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescCreate", "NULL desc");
    *d = new simt_lt_desc{
        (int32_t)ct, (int32_t)st,           CUBLASLT_POINTER_MODE_HOST, CUBLAS_OP_N, CUBLAS_OP_N,
        CUBLAS_OP_N, CUBLAS_FILL_MODE_FULL, CUBLASLT_EPILOGUE_DEFAULT,  NULL,        0,
        -1};
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d,
                                                         cublasLtMatmulDescAttributes_t a,
                                                         const void *buf, size_t size) {
    return attr_set("cublasLtMatmulDescSetAttribute", d, d ? desc_field(d, a) : field{NULL, 0}, a,
                    desc_attr_known(a), buf, size);
}

extern "C" cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t d,
                                                         cublasLtMatmulDescAttributes_t a,
                                                         void *buf, size_t size, size_t *written) {
    return attr_get("cublasLtMatmulDescGetAttribute", d, d ? desc_field(d, a) : field{NULL, 0}, a,
                    desc_attr_known(a), buf, size, written);
}

// ---- matrix layout ------------------------------------------------------------------------------

extern "C" cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType_t t,
                                                     uint64_t rows, uint64_t cols, int64_t ld) {
    const char *fn = "cublasLtMatrixLayoutCreate";
    if (!l) return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL layout");
    // Column-major (the default order): a column's rows must fit between two columns' starts.
    if (ld < 0 || (uint64_t)ld < rows)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "ld %lld < rows %llu", (long long)ld,
                      (unsigned long long)rows);
    *l = new simt_lt_layout{(uint32_t)t, CUBLASLT_ORDER_COL, rows, cols, ld, 1, 0};
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                           cublasLtMatrixLayoutAttribute_t a,
                                                           const void *buf, size_t size) {
    return attr_set("cublasLtMatrixLayoutSetAttribute", l, l ? layout_field(l, a) : field{NULL, 0},
                    a, layout_attr_known(a), buf, size);
}

extern "C" cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t l,
                                                           cublasLtMatrixLayoutAttribute_t a,
                                                           void *buf, size_t size,
                                                           size_t *written) {
    return attr_get("cublasLtMatrixLayoutGetAttribute", l, l ? layout_field(l, a) : field{NULL, 0},
                    a, layout_attr_known(a), buf, size, written);
}

// ---- preference ---------------------------------------------------------------------------------

extern "C" cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    if (!p) return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceCreate", "NULL");
    *p = new simt_lt_pref{CUBLASLT_SEARCH_BEST_FIT,
                          0,
                          0xffffffffu,
                          {ALIGN_DEFAULT, ALIGN_DEFAULT, ALIGN_DEFAULT, ALIGN_DEFAULT},
                          0.0f,
                          ~(uint64_t)0};
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t
cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                     cublasLtMatmulPreferenceAttributes_t a, const void *buf,
                                     size_t size) {
    return attr_set("cublasLtMatmulPreferenceSetAttribute", p,
                    p ? pref_field(p, a) : field{NULL, 0}, a, pref_attr_known(a), buf, size);
}

extern "C" cublasStatus_t
cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t p,
                                     cublasLtMatmulPreferenceAttributes_t a, void *buf, size_t size,
                                     size_t *written) {
    return attr_get("cublasLtMatmulPreferenceGetAttribute", p,
                    p ? pref_field(p, a) : field{NULL, 0}, a, pref_attr_known(a), buf, size,
                    written);
}

// ---- the problem a descriptor and four layouts describe -----------------------------------------

enum { ACT_NONE, ACT_RELU, ACT_GELU };

struct problem {
    uint64_t m, n, k;
    int32_t ta, tb, tc, td, tbias; // tbias: -1 when there is no bias
    bool transa, transb;
    int act;
};

// An identity of what an algorithm was chosen for (types, compute and scale types): an
// algorithm is a kernel for one such combination, so cublasLtMatmul refuses it for another.
static uint64_t signature(const simt_lt_desc *d, const problem &p) {
    return (uint64_t)(uint8_t)d->compute | (uint64_t)(uint8_t)d->scale << 8 |
           (uint64_t)(uint8_t)p.ta << 16 | (uint64_t)(uint8_t)p.tb << 24 |
           (uint64_t)(uint8_t)p.tc << 32 | (uint64_t)(uint8_t)p.td << 40;
}

// Validates what the heuristic and the matmul share. INVALID_VALUE (the call is wrong) always
// comes with a line on stderr; NOT_SUPPORTED (the emulator, like a GPU without a kernel for it,
// cannot run it) only when `loud`: from the heuristic it is an ordinary answer.
static cublasStatus_t check_problem(const char *fn, bool loud, const simt_lt_desc *d,
                                    const simt_lt_layout *const l[4], problem *p) {
    static const char *const names[4] = {"A", "B", "C", "D"};
    cublasStatus_t ns = CUBLAS_STATUS_NOT_SUPPORTED;
#define UNSUPPORTED(...) return loud ? refuse(ns, fn, __VA_ARGS__) : ns
    if (d->compute != CUBLAS_COMPUTE_32F)
        UNSUPPORTED("compute type %d (only CUBLAS_COMPUTE_32F is emulated)", d->compute);
    if (d->scale != CUDA_R_32F)
        UNSUPPORTED("scale type %s (only CUDA_R_32F is emulated)", type_name(d->scale));
    if (d->pointer_mode != CUBLASLT_POINTER_MODE_HOST)
        UNSUPPORTED("pointer mode %d (only CUBLASLT_POINTER_MODE_HOST is emulated)",
                    d->pointer_mode);
    int32_t ops[2] = {d->transa, d->transb};
    for (int i = 0; i < 2; i++)
        if (ops[i] != CUBLAS_OP_N && ops[i] != CUBLAS_OP_T && ops[i] != CUBLAS_OP_C)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "trans%c %d is no cublasOperation_t",
                          "AB"[i], ops[i]);
    if (d->transc != CUBLAS_OP_N) UNSUPPORTED("transC must be CUBLAS_OP_N");
    if (d->fill != CUBLAS_FILL_MODE_FULL) UNSUPPORTED("fill mode must be CUBLAS_FILL_MODE_FULL");
    for (int i = 0; i < 4; i++) {
        const simt_lt_layout *x = l[i];
        if (x->order != CUBLASLT_ORDER_COL)
            UNSUPPORTED("%s's order %d (only CUBLASLT_ORDER_COL is emulated)", names[i], x->order);
        if (x->batch < 1)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "%s's batch count %d", names[i],
                          x->batch);
        if (x->batch != 1)
            UNSUPPORTED("%s's batch count %d (batches not emulated)", names[i], x->batch);
        if (x->ld < 0 || (uint64_t)x->ld < x->rows)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "%s's ld %lld < rows %llu", names[i],
                          (long long)x->ld, (unsigned long long)x->rows);
        // Keeps every byte count below (elements x 8 bytes, indices in int64) from overflowing.
        if (x->rows >> 40 || x->cols >> 40 || (uint64_t)x->ld >> 40 ||
            span_elems(x) > ((uint64_t)1 << 59))
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "%s (%llu x %llu, ld %lld) too large",
                          names[i], (unsigned long long)x->rows, (unsigned long long)x->cols,
                          (long long)x->ld);
    }
    p->transa = d->transa != CUBLAS_OP_N;
    p->transb = d->transb != CUBLAS_OP_N;
    uint64_t m = p->transa ? l[0]->cols : l[0]->rows, k = p->transa ? l[0]->rows : l[0]->cols;
    uint64_t kb = p->transb ? l[1]->cols : l[1]->rows, n = p->transb ? l[1]->rows : l[1]->cols;
    if (k != kb || l[2]->rows != m || l[2]->cols != n || l[3]->rows != m || l[3]->cols != n)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn,
                      "shapes disagree: op(A) %llu x %llu, "
                      "op(B) %llu x %llu, C %llu x %llu, D %llu x %llu",
                      (unsigned long long)m, (unsigned long long)k, (unsigned long long)kb,
                      (unsigned long long)n, (unsigned long long)l[2]->rows,
                      (unsigned long long)l[2]->cols, (unsigned long long)l[3]->rows,
                      (unsigned long long)l[3]->cols);
    p->m = m, p->n = n, p->k = k;
    p->ta = (int32_t)l[0]->type, p->tb = (int32_t)l[1]->type;
    p->tc = (int32_t)l[2]->type, p->td = (int32_t)l[3]->type;
    // The real library's combinations for CUBLAS_COMPUTE_32F with CUDA_R_32F scale, less fp16:
    // A and B of one type; C of D's; fp32 in -> fp32 out, bf16 in -> bf16 or fp32 out.
    bool in_ok = p->ta == p->tb && (p->ta == CUDA_R_16BF || p->ta == CUDA_R_32F);
    bool out_ok = p->tc == p->td && (p->td == CUDA_R_32F || p->ta == CUDA_R_16BF) &&
                  (p->td == CUDA_R_16BF || p->td == CUDA_R_32F);
    if (!in_ok || !out_ok)
        UNSUPPORTED("types A %s, B %s, C %s, D %s (emulated: A = B = CUDA_R_16BF or "
                    "CUDA_R_32F, C = D = CUDA_R_16BF (bf16 inputs only) or CUDA_R_32F)",
                    type_name(p->ta), type_name(p->tb), type_name(p->tc), type_name(p->td));
    bool bias = false;
    switch (d->epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT:
        p->act = ACT_NONE;
        break;
    case CUBLASLT_EPILOGUE_RELU:
        p->act = ACT_RELU;
        break;
    case CUBLASLT_EPILOGUE_GELU:
        p->act = ACT_GELU;
        break;
    case CUBLASLT_EPILOGUE_BIAS:
        p->act = ACT_NONE, bias = true;
        break;
    case CUBLASLT_EPILOGUE_RELU_BIAS:
        p->act = ACT_RELU, bias = true;
        break;
    case CUBLASLT_EPILOGUE_GELU_BIAS:
        p->act = ACT_GELU, bias = true;
        break;
    default:
        UNSUPPORTED("epilogue %u (emulated: DEFAULT, RELU, BIAS, RELU_BIAS, GELU, "
                    "GELU_BIAS)",
                    d->epilogue);
    }
    p->tbias = -1;
    if (bias) {
        // The bias vector is of D's type (the documented rule; its exceptions are int8 and fp8).
        p->tbias = d->bias_type == -1 ? p->td : d->bias_type;
        if (p->tbias != p->td)
            UNSUPPORTED("bias type %s with D %s (the bias must be of D's type)",
                        type_name(p->tbias), type_name(p->td));
    }
#undef UNSUPPORTED
    return CUBLAS_STATUS_SUCCESS;
}

// ---- heuristic ----------------------------------------------------------------------------------

extern "C" cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
    cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl, cublasLtMatmulPreference_t pref,
    int requested, cublasLtMatmulHeuristicResult_t results[], int *returned) {
    const char *fn = "cublasLtMatmulAlgoGetHeuristic";
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!d || !a || !b || !c || !dl || !pref || !results || !returned || requested <= 0)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "a NULL argument or requestedAlgoCount %d",
                      requested);
    *returned = 0;
    const simt_lt_layout *l[4] = {a, b, c, dl};
    problem p;
    if (cublasStatus_t s = check_problem(fn, false, d, l, &p)) return s;
    // A promised alignment below one element, or not a power of two, leaves no kernel that
    // could take such pointers. The emulator needs no workspace, so any maximum will do.
    for (int i = 0; i < 4; i++) {
        uint32_t al = pref->align[i];
        if (al < elem_size((int32_t)l[i]->type) || (al & (al - 1)))
            return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    memset(&results[0], 0, sizeof results[0]);
    uint64_t *data = results[0].algo.data;
    data[0] = LT_MAGIC;
    data[1] = (uint64_t)pref->align[0] | (uint64_t)pref->align[1] << 32;
    data[2] = (uint64_t)pref->align[2] | (uint64_t)pref->align[3] << 32;
    data[3] = signature(d, p);
    results[0].workspaceSize = 0;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

// ---- the GEMM -----------------------------------------------------------------------------------

// Everything the GEMM needs when it runs (now, or when a captured graph is launched).
struct gemm_job {
    int64_t m, n, k, lda, ldb, ldc, ldd;
    const void *a, *b, *c, *bias;
    void *d;
    bool a_bf16, b_bf16, d_bf16, transa, transb, use_c;
    int act;
    float alpha, beta;
    size_t a_bytes, b_bytes, c_bytes, d_bytes, bias_bytes; // for the check when it runs
};

typedef float f8 __attribute__((ext_vector_type(8)));

enum { MR = 8, NR = 4, MB = 64 }; // micro-tile rows (one f8), micro-tile columns, block rows

static inline float to_f(__nv_bfloat16 x) {
    return __bfloat162float(x);
}
static inline float to_f(float x) {
    return x;
}

// op(A) rows [i0, i0 + MB) (zeros past m) as MB / MR micro-panels, each K x MR floats, k-major:
// panel[(t * K + kk) * MR + r] = op(A)(i0 + t * MR + r, kk).
template <typename T> static void pack_a(const gemm_job &g, int64_t i0, float *panel) {
    const T *A = (const T *)g.a;
    int64_t K = g.k;
    for (int t = 0; t < MB / MR; t++) {
        float *pt = panel + (size_t)t * K * MR;
        int64_t ib = i0 + t * MR;
        if (g.transa) { // op(A)(i, kk) = A[kk + i * lda]: a row of op(A) is contiguous
            for (int r = 0; r < MR; r++) {
                int64_t i = ib + r;
                if (i >= g.m) {
                    for (int64_t kk = 0; kk < K; kk++)
                        pt[kk * MR + r] = 0;
                    continue;
                }
                const T *src = A + i * g.lda;
                for (int64_t kk = 0; kk < K; kk++)
                    pt[kk * MR + r] = to_f(src[kk]);
            }
        } else { // op(A)(i, kk) = A[i + kk * lda]: MR rows of a column are contiguous
            int64_t rows = g.m - ib < MR ? g.m - ib : MR; // <= 0 past the end of op(A)
            for (int64_t kk = 0; kk < K; kk++) {
                const T *src = A + ib + kk * g.lda;
                for (int r = 0; r < MR; r++)
                    pt[kk * MR + r] = r < rows ? to_f(src[r]) : 0.0f;
            }
        }
    }
}

// op(B) as ceil(n / NR) micro-panels, each K x NR floats (zeros past n):
// bp[(grp * K + kk) * NR + c] = op(B)(kk, grp * NR + c).
template <typename T> static void pack_b(const gemm_job &g, float *bp) {
    const T *B = (const T *)g.b;
    int64_t K = g.k, groups = (g.n + NR - 1) / NR;
    for (int64_t grp = 0; grp < groups; grp++) {
        float *pg = bp + (size_t)grp * K * NR;
        for (int c = 0; c < NR; c++) {
            int64_t j = grp * NR + c;
            if (j >= g.n) {
                for (int64_t kk = 0; kk < K; kk++)
                    pg[kk * NR + c] = 0;
            } else if (g.transb) { // op(B)(kk, j) = B[j + kk * ldb]
                for (int64_t kk = 0; kk < K; kk++)
                    pg[kk * NR + c] = to_f(B[j + kk * g.ldb]);
            } else { // op(B)(kk, j) = B[kk + j * ldb]: a column of op(B) is contiguous
                const T *src = B + j * g.ldb;
                for (int64_t kk = 0; kk < K; kk++)
                    pg[kk * NR + c] = to_f(src[kk]);
            }
        }
    }
}

// acc[c] (MR rows of column c) = sum over kk = 0..K-1, in that order, of op(A) * op(B): each
// output is its own sequential fp32 sum; the vector lanes are different outputs, never partial
// sums of one (so the result does not depend on the vector width or the build's flags).
template <int NC> static void micro(const float *pa, const float *pb, int64_t K, f8 *acc) {
    f8 s[NC];
    for (int c = 0; c < NC; c++)
        s[c] = 0.0f;
    for (int64_t kk = 0; kk < K; kk++) {
        f8 a;
        memcpy(&a, pa + kk * MR, sizeof a);
        const float *b = pb + kk * NR;
        for (int c = 0; c < NC; c++) {
            f8 prod = a * b[c];
            s[c] += prod;
        }
    }
    for (int c = 0; c < NC; c++)
        acc[c] = s[c];
}

// cuBLASLt's GELU: the tanh approximation.
static inline float gelu(float x) {
    float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
}

// D(rows ib.., columns j0..j0+nc) from the accumulators: alpha * acc (+ beta * C) (+ bias),
// the activation, one rounding to D's type.
static void epilogue(const gemm_job &g, const float *biasf, int64_t ib, int64_t j0, int nc,
                     const f8 *acc) {
    int rows = (int)(g.m - ib < MR ? g.m - ib : MR);
    for (int c = 0; c < nc; c++) {
        int64_t j = j0 + c;
        for (int r = 0; r < rows; r++) {
            int64_t i = ib + r;
            float v = g.alpha * acc[c][r];
            if (g.use_c) {
                int64_t e = i + j * g.ldc;
                float cv = g.d_bf16 ? __bfloat162float(((const __nv_bfloat16 *)g.c)[e])
                                    : ((const float *)g.c)[e];
                float scaled = g.beta * cv;
                v = v + scaled;
            }
            if (biasf) v = v + biasf[i];
            if (g.act == ACT_RELU)
                v = fmaxf(v, 0.0f);
            else if (g.act == ACT_GELU)
                v = gelu(v);
            int64_t e = i + j * g.ldd;
            if (g.d_bf16)
                ((__nv_bfloat16 *)g.d)[e] = __float2bfloat16_rn(v);
            else
                ((float *)g.d)[e] = v;
        }
    }
}

// Work items: (row block, column chunk) pairs, taken in turn by every thread; each packs its
// rows of op(A) into a panel that stays in cache while it sweeps its columns.
struct gemm_work {
    const gemm_job *g;
    const float *bp, *biasf;
    int64_t groups, nchunk, items;
    std::atomic<int64_t> next;
};

static void gemm_worker(gemm_work *w) {
    const gemm_job &g = *w->g;
    std::vector<float> panel((size_t)MB * g.k);
    f8 acc[NR];
    for (;;) {
        int64_t it = w->next.fetch_add(1);
        if (it >= w->items) break;
        int64_t blk = it / w->nchunk, chunk = it % w->nchunk;
        int64_t i0 = blk * MB;
        if (g.a_bf16)
            pack_a<__nv_bfloat16>(g, i0, panel.data());
        else
            pack_a<float>(g, i0, panel.data());
        int64_t g0 = chunk * w->groups / w->nchunk, g1 = (chunk + 1) * w->groups / w->nchunk;
        int tiles = (int)((g.m - i0 + MR - 1) / MR < MB / MR ? (g.m - i0 + MR - 1) / MR : MB / MR);
        for (int64_t grp = g0; grp < g1; grp++) {
            const float *pb = w->bp + (size_t)grp * g.k * NR;
            int nc = (int)(g.n - grp * NR < NR ? g.n - grp * NR : NR);
            for (int t = 0; t < tiles; t++) {
                const float *pa = panel.data() + (size_t)t * g.k * MR;
                switch (nc) { // a partial last group costs only its own columns (decode: 1)
                case 1:
                    micro<1>(pa, pb, g.k, acc);
                    break;
                case 2:
                    micro<2>(pa, pb, g.k, acc);
                    break;
                case 3:
                    micro<3>(pa, pb, g.k, acc);
                    break;
                default:
                    micro<4>(pa, pb, g.k, acc);
                    break;
                }
                epilogue(g, w->biasf, i0 + t * MR, grp * NR, nc, acc);
            }
        }
    }
}

// Whether the job's memory is still what it was when the call was checked (a graph may be
// launched after a buffer it captured was freed): what a GPU would fault on.
static bool job_ranges_ok(const gemm_job &g) {
    const char *what = "cublasLtMatmul (running)";
    return (!g.a_bytes || !simt::device_range(g.a, g.a_bytes, what)) &&
           (!g.b_bytes || !simt::device_range(g.b, g.b_bytes, what)) &&
           (!g.c_bytes || !simt::device_range(g.c, g.c_bytes, what)) &&
           (!g.bias_bytes || !simt::device_range(g.bias, g.bias_bytes, what)) &&
           !simt::device_range(g.d, g.d_bytes, what);
}

static void run_gemm(const gemm_job &g) {
    if (!job_ranges_ok(g)) {
        simt::fail_sticky(cudaErrorIllegalAddress);
        return;
    }
    int64_t groups = (g.n + NR - 1) / NR, blocks = (g.m + MB - 1) / MB;
    std::vector<float> bp((size_t)groups * g.k * NR), biasf;
    if (g.b_bf16)
        pack_b<__nv_bfloat16>(g, bp.data());
    else
        pack_b<float>(g, bp.data());
    if (g.bias) {
        biasf.resize(g.m);
        for (int64_t i = 0; i < g.m; i++)
            biasf[i] = g.d_bf16 ? __bfloat162float(((const __nv_bfloat16 *)g.bias)[i])
                                : ((const float *)g.bias)[i];
    }
    // Threads only where the work dwarfs starting them (~2^22 multiply-adds: a millisecond).
    unsigned hw = std::thread::hardware_concurrency();
    double macs = (double)g.m * (double)g.n * (double)g.k;
    int64_t nthreads = macs > (double)(1 << 22) && hw > 1 ? hw : 1;
    // Enough items for the threads to share evenly, but chunks of at least 4 micro-panels
    // (16 columns) so that repacking A's rows per item stays a small part of the work.
    int64_t nchunk = 1;
    if (nthreads > 1) {
        nchunk = (4 * nthreads + blocks - 1) / blocks;
        int64_t most = groups / 4 > 1 ? groups / 4 : 1;
        if (nchunk > most) nchunk = most;
    }
    gemm_work w;
    w.g = &g, w.bp = bp.data(), w.biasf = g.bias ? biasf.data() : NULL;
    w.groups = groups, w.nchunk = nchunk, w.items = blocks * nchunk, w.next = 0;
    if (nthreads > w.items) nthreads = w.items;
    std::vector<std::thread> pool;
    for (int64_t t = 1; t < nthreads; t++) {
        try {
            pool.emplace_back(gemm_worker, &w);
        } catch (...) { // no more threads to be had: the ones running share the rest
            break;
        }
    }
    gemm_worker(&w);
    for (std::thread &t : pool)
        t.join();
}

// ---- cublasLtMatmul -----------------------------------------------------------------------------

// A device operand's checks: its alignment against the promise (the algorithm was chosen for
// pointers at least that aligned), then that its bytes lie in one live allocation.
static cublasStatus_t check_operand(const char *fn, const char *name, const void *p, uint64_t align,
                                    size_t bytes) {
    if ((uintptr_t)p % align)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn,
                      "%s at %p is not %llu-byte aligned, as "
                      "promised to cublasLtMatmulAlgoGetHeuristic (MIN_ALIGNMENT) or required by "
                      "its type",
                      name, p, (unsigned long long)align);
    char what[64];
    snprintf(what, sizeof what, "cublasLtMatmul %s", name);
    if (simt::device_range(p, bytes, what)) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t
cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,
               cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc,
               const void *beta, const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
               cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo, void *workspace,
               size_t workspace_bytes, cudaStream_t stream) {
    const char *fn = "cublasLtMatmul";
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!desc || !Adesc || !Bdesc || !Cdesc || !Ddesc || !alpha || !beta)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn, "a NULL descriptor, layout, alpha or beta");
    const simt_lt_layout *l[4] = {Adesc, Bdesc, Cdesc, Ddesc};
    problem p;
    if (cublasStatus_t s = check_problem(fn, true, desc, l, &p)) return s;
    // The alignments the algorithm was chosen for; without one, the library picks its own for
    // the pointers at hand, so only whole elements are required.
    uint64_t align[4];
    for (int i = 0; i < 4; i++)
        align[i] = elem_size((int32_t)l[i]->type);
    if (algo) {
        if (algo->data[0] != LT_MAGIC)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn,
                          "the algorithm did not come from "
                          "cublasLtMatmulAlgoGetHeuristic");
        if (algo->data[3] != signature(desc, p))
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn,
                          "the algorithm was chosen for other "
                          "types (compute, scale, A, B, C or D)");
        align[0] = (uint32_t)algo->data[1], align[1] = algo->data[1] >> 32;
        align[2] = (uint32_t)algo->data[2], align[3] = algo->data[2] >> 32;
    }
    gemm_job g;
    memset(&g, 0, sizeof g);
    memcpy(&g.alpha, alpha, sizeof g.alpha); // host pointer mode: read now, as cuBLASLt does
    memcpy(&g.beta, beta, sizeof g.beta);
    g.m = (int64_t)p.m, g.n = (int64_t)p.n, g.k = (int64_t)p.k;
    g.lda = Adesc->ld, g.ldb = Bdesc->ld, g.ldc = Cdesc->ld, g.ldd = Ddesc->ld;
    g.a = A, g.b = B, g.c = C, g.d = D;
    g.a_bf16 = p.ta == CUDA_R_16BF, g.b_bf16 = p.tb == CUDA_R_16BF, g.d_bf16 = p.td == CUDA_R_16BF;
    g.transa = p.transa, g.transb = p.transb, g.act = p.act;
    g.use_c = g.beta != 0.0f; // beta == 0: C is not read (it may hold NaNs, or be NULL)
    if (!g.m || !g.n) return CUBLAS_STATUS_SUCCESS; // an empty D: nothing to do
    if (g.use_c && C == D && Cdesc->ld != Ddesc->ld)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, fn,
                      "in place (C == D) with ldc %lld != ldd "
                      "%lld",
                      (long long)Cdesc->ld, (long long)Ddesc->ld);
    if (g.k) {
        g.a_bytes = span_elems(Adesc) * elem_size(p.ta);
        g.b_bytes = span_elems(Bdesc) * elem_size(p.tb);
        if (cublasStatus_t s = check_operand(fn, "A", A, align[0], g.a_bytes)) return s;
        if (cublasStatus_t s = check_operand(fn, "B", B, align[1], g.b_bytes)) return s;
    }
    if (g.use_c) {
        g.c_bytes = span_elems(Cdesc) * elem_size(p.tc);
        if (cublasStatus_t s = check_operand(fn, "C", C, align[2], g.c_bytes)) return s;
    }
    g.d_bytes = span_elems(Ddesc) * elem_size(p.td);
    if (cublasStatus_t s = check_operand(fn, "D", D, align[3], g.d_bytes)) return s;
    if (p.tbias >= 0) {
        g.bias = desc->bias;
        if (!g.bias)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, fn,
                          "a bias epilogue without "
                          "CUBLASLT_MATMUL_DESC_BIAS_POINTER");
        g.bias_bytes = p.m * elem_size(p.tbias);
        if (cublasStatus_t s = check_operand(fn, "bias", g.bias, elem_size(p.tbias), g.bias_bytes))
            return s;
    }
    if (workspace && workspace_bytes &&
        simt::device_range(workspace, workspace_bytes, "cublasLtMatmul workspace"))
        return CUBLAS_STATUS_INVALID_VALUE;
    cudaError_t e = simt::stream_enqueue(stream, [g] { run_gemm(g); });
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
