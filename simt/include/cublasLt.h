// simt/include/cublasLt.h — the SIMT emulation build's <cublasLt.h>: the part of cuBLASLt's
// API that sift uses (one fp32-accumulated GEMM per call, column-major, host alpha and beta, the
// bias/ReLU/GELU epilogues) with the real library's type names, enumerator values and function
// signatures, so that backend_cuda.cu compiles unchanged. simt/cublaslt.cpp implements it
// as a CPU reference GEMM. The functions are extern "C" and the executable is linked -rdynamic,
// so backend_cuda.cu's dlopen(NULL) + dlsym("cublasLt...") finds them as it would in the .so.
// Attributes the emulator does not model are declared (their numbering is the real one) but
// setting them is refused with CUBLAS_STATUS_NOT_SUPPORTED rather than silently ignored. The
// enums have int as their fixed underlying type (the real ones are int-sized too), so that any
// int a caller passes is a valid value to check, not undefined behaviour.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "../simt.h"

// ---- library-wide types (cublas_api.h, library_types.h) ----------------------------------------
typedef enum : int {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
    CUBLAS_STATUS_LICENSE_ERROR = 16,
} cublasStatus_t;

typedef enum cudaDataType_t : int {
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16F = 2,
    CUDA_R_8I = 3,
    CUDA_C_32F = 4,
    CUDA_R_8U = 8,
    CUDA_R_32I = 10,
    CUDA_R_16BF = 14,
    CUDA_R_8F_E4M3 = 28,
    CUDA_R_8F_E5M2 = 29,
} cudaDataType;

typedef enum : int {
    CUBLAS_COMPUTE_16F = 64,
    CUBLAS_COMPUTE_16F_PEDANTIC = 65,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_PEDANTIC = 69,
    CUBLAS_COMPUTE_64F = 70,
    CUBLAS_COMPUTE_64F_PEDANTIC = 71,
    CUBLAS_COMPUTE_32I = 72,
    CUBLAS_COMPUTE_32I_PEDANTIC = 73,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
} cublasComputeType_t;

typedef enum : int {
    CUBLAS_OP_N = 0,
    CUBLAS_OP_T = 1,
    CUBLAS_OP_C = 2, // on real matrices the same as CUBLAS_OP_T
} cublasOperation_t;

typedef enum : int {
    CUBLAS_FILL_MODE_LOWER = 0,
    CUBLAS_FILL_MODE_UPPER = 1,
    CUBLAS_FILL_MODE_FULL = 2,
} cublasFillMode_t;

// ---- cuBLASLt's objects: opaque here, defined in simt/cublaslt.cpp ------------------------
typedef struct simt_lt_handle *cublasLtHandle_t;
typedef struct simt_lt_desc *cublasLtMatmulDesc_t;
typedef struct simt_lt_layout *cublasLtMatrixLayout_t;
typedef struct simt_lt_pref *cublasLtMatmulPreference_t;

// An algorithm as cublasLtMatmulAlgoGetHeuristic hands it out (the real one's size; its content
// is the emulator's own: what the heuristic was told, checked again by cublasLtMatmul).
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;

typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

typedef enum : int {
    CUBLASLT_POINTER_MODE_HOST = 0,
    CUBLASLT_POINTER_MODE_DEVICE = 1,
    CUBLASLT_POINTER_MODE_DEVICE_VECTOR = 2,
    CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO = 3,
    CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST = 4,
} cublasLtPointerMode_t;

typedef enum : int {
    CUBLASLT_ORDER_COL = 0,
    CUBLASLT_ORDER_ROW = 1,
    CUBLASLT_ORDER_COL32 = 2,
    CUBLASLT_ORDER_COL4_4R2_8C = 3,
    CUBLASLT_ORDER_COL32_2R_4R4 = 4,
} cublasLtOrder_t;

typedef enum : int {
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_RELU = 2,
    CUBLASLT_EPILOGUE_RELU_AUX = 130,
    CUBLASLT_EPILOGUE_BIAS = 4,
    CUBLASLT_EPILOGUE_RELU_BIAS = 6,
    CUBLASLT_EPILOGUE_RELU_AUX_BIAS = 134,
    CUBLASLT_EPILOGUE_DRELU = 136,
    CUBLASLT_EPILOGUE_DRELU_BGRAD = 152,
    CUBLASLT_EPILOGUE_GELU = 32,
    CUBLASLT_EPILOGUE_GELU_AUX = 160,
    CUBLASLT_EPILOGUE_GELU_BIAS = 36,
    CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 164,
    CUBLASLT_EPILOGUE_DGELU = 192,
    CUBLASLT_EPILOGUE_DGELU_BGRAD = 208,
    CUBLASLT_EPILOGUE_BGRADA = 256,
    CUBLASLT_EPILOGUE_BGRADB = 512,
} cublasLtEpilogue_t;

typedef enum : int {
    CUBLASLT_SEARCH_BEST_FIT = 0,
    CUBLASLT_SEARCH_LIMITED_BY_ALGO_ID = 1,
} cublasLtMatmulSearch_t;

// Each attribute's value type (what SetAttribute's sizeInBytes must be) follows its name.
typedef enum : int {
    CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,          // int32_t (cublasComputeType_t)
    CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,            // int32_t (cudaDataType)
    CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,          // int32_t (cublasLtPointerMode_t)
    CUBLASLT_MATMUL_DESC_TRANSA = 3,                // int32_t (cublasOperation_t)
    CUBLASLT_MATMUL_DESC_TRANSB = 4,                // int32_t
    CUBLASLT_MATMUL_DESC_TRANSC = 5,                // int32_t
    CUBLASLT_MATMUL_DESC_FILL_MODE = 6,             // int32_t (cublasFillMode_t)
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,              // uint32_t (cublasLtEpilogue_t)
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,          // void *
    CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE = 10,    // int64_t
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11, // not emulated from here on
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE = 13,
    CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE = 14,
    CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET = 15,
    CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = 17,
    CUBLASLT_MATMUL_DESC_B_SCALE_POINTER = 18,
    CUBLASLT_MATMUL_DESC_C_SCALE_POINTER = 19,
    CUBLASLT_MATMUL_DESC_D_SCALE_POINTER = 20,
    CUBLASLT_MATMUL_DESC_AMAX_D_POINTER = 21,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE = 22,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER = 23,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER = 24,
    CUBLASLT_MATMUL_DESC_FAST_ACCUM = 25,
    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26, // int32_t (cudaDataType; -1: D's type)
} cublasLtMatmulDescAttributes_t;

typedef enum : int {
    CUBLASLT_MATRIX_LAYOUT_TYPE = 0,                 // uint32_t (cudaDataType)
    CUBLASLT_MATRIX_LAYOUT_ORDER = 1,                // int32_t (cublasLtOrder_t)
    CUBLASLT_MATRIX_LAYOUT_ROWS = 2,                 // uint64_t
    CUBLASLT_MATRIX_LAYOUT_COLS = 3,                 // uint64_t
    CUBLASLT_MATRIX_LAYOUT_LD = 4,                   // int64_t
    CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,          // int32_t
    CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6, // int64_t
    CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET = 7,         // not emulated
} cublasLtMatrixLayoutAttribute_t;

typedef enum : int {
    CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,           // uint32_t (cublasLtMatmulSearch_t)
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,   // uint64_t
    CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3, // uint32_t
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5, // uint32_t, default 256
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6, // uint32_t, default 256
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7, // uint32_t, default 256
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8, // uint32_t, default 256
    CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT = 9,       // float
    CUBLASLT_MATMUL_PREF_IMPL_MASK = 12,            // uint64_t
} cublasLtMatmulPreferenceAttributes_t;

// ---- functions ----------------------------------------------------------------------------------
extern "C" {
size_t cublasLtGetVersion(void);
const char *cublasLtGetStatusName(cublasStatus_t status);
const char *cublasLtGetStatusString(cublasStatus_t status);

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle);

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t sizeInBytes);
cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, void *buf,
                                              size_t sizeInBytes, size_t *sizeWritten);

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType_t type,
                                          uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout);
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr, void *buf,
                                                size_t sizeInBytes, size_t *sizeWritten);

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes);
cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    void *buf, size_t sizeInBytes,
                                                    size_t *sizeWritten);

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int *returnAlgoCount);

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream);
}
