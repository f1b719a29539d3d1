// simt/simt.h — the CUDA that sift's kernels use, emulated on the CPU (the SIMT emulation
// build: the same .cu sources compiled as C++ by clang++ with simt/include/ in front of the
// include path, so <cuda_runtime.h>, <cuda_bf16.h>, <cublasLt.h> and cub's BlockScan
// are ours). What lives here: the qualifiers, built-in variables, vector types, barriers and
// warp-collective operations, atomics, math intrinsics, the kernel launch, and the runtime API
// (memory, streams, events, graphs). runtime.cpp implements it: every CUDA thread is a fiber,
// a block's fibers run on one worker thread, blocks run on a small pool of workers; device
// memory is bounds-checked, shared memory race- and initialisation-checked (docs/gpu.md, "GPU code
// without a GPU"). Only clang++ builds this (ext_vector_type, -fsanitize-coverage hooks).
#pragma once
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- qualifiers ------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// A block-scope thread_local is static: one copy per worker thread, i.e. per running block.
// runtime.cpp finds these in the executable's TLS block and checks every access to them.
#define __shared__ thread_local

// ---- vector types (layout and alignment as CUDA's; one vector load or store per access) -----
typedef int int2 __attribute__((ext_vector_type(2)));
typedef int int4 __attribute__((ext_vector_type(4)));
typedef unsigned uint2 __attribute__((ext_vector_type(2)));
typedef unsigned uint4 __attribute__((ext_vector_type(4)));
typedef float float2 __attribute__((ext_vector_type(2)));
typedef float float4 __attribute__((ext_vector_type(4)));
static inline int2 make_int2(int x, int y) {
    return int2{x, y};
}
static inline uint2 make_uint2(unsigned x, unsigned y) {
    return uint2{x, y};
}
static inline float2 make_float2(float x, float y) {
    return float2{x, y};
}
static inline float4 make_float4(float x, float y, float z, float w) {
    return float4{x, y, z, w};
}
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

// ---- built-in variables: the running thread is found from the stack pointer ------------------
// Each CUDA thread runs on a fiber whose stack lies in a SIMT_SLOT-aligned slot that starts with
// its descriptor.
#define SIMT_SLOT ((uintptr_t)128 << 10)

struct simt_block_info {
    uint3 block_idx;
    dim3 block_dim, grid_dim;
};
struct simt_lane { // the start of a thread's descriptor
    uint3 thread_idx;
    const simt_block_info *blk;
};
static inline const simt_lane *simt_self() {
    uintptr_t sp;
    __asm__("mov %%rsp, %0" : "=r"(sp));
    return (const simt_lane *)(sp & ~(SIMT_SLOT - 1));
}
#define threadIdx (simt_self()->thread_idx)
#define blockIdx (simt_self()->blk->block_idx)
#define blockDim (simt_self()->blk->block_dim)
#define gridDim (simt_self()->blk->grid_dim)
static constexpr int warpSize = 32;

// ---- barriers and warp-collective operations (runtime.cpp; every one a scheduling point) -----
void __syncthreads();
int __syncthreads_or(int pred);
int __syncthreads_and(int pred);
void __syncwarp(unsigned mask = 0xffffffffu);

// A warp-collective operation: every lane of `mask` calls it with its own arg; once all have
// arrived, op(args, mask) runs once with the 32 lanes' args (NULL for lanes outside the mask,
// or past the end of a short last warp), then every lane goes on. `what` names it in reports.
typedef void (*simt_warp_fn)(void *const *args, unsigned mask);
void simt_warp_op(const char *what, unsigned mask, void *arg, simt_warp_fn op);

enum { SIMT_SHFL_IDX, SIMT_SHFL_XOR, SIMT_SHFL_UP, SIMT_SHFL_DOWN };
uint64_t simt_shfl(unsigned mask, uint64_t v, int kind, int arg, int width);
template <typename T>
static inline T simt_shfl_t(unsigned mask, T v, int kind, int arg, int width) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of <= 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    u = simt_shfl(mask, u, kind, arg, width);
    memcpy(&v, &u, sizeof v);
    return v;
}
template <typename T> T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return simt_shfl_t(mask, v, SIMT_SHFL_IDX, src, width);
}
template <typename T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return simt_shfl_t(mask, v, SIMT_SHFL_XOR, lane_mask, width);
}
template <typename T> T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return simt_shfl_t(mask, v, SIMT_SHFL_UP, (int)d, width);
}
template <typename T> T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return simt_shfl_t(mask, v, SIMT_SHFL_DOWN, (int)d, width);
}

// ---- atomics (checked like any access; atomic among themselves) --------------------------------
void simt_atomic_check(const void *p, size_t size);
#define SIMT_ATOMIC(name, T, op)                                                                   \
    static inline T name(T *p, T v) {                                                              \
        simt_atomic_check(p, sizeof(T));                                                           \
        return op;                                                                                 \
    }
SIMT_ATOMIC(atomicAdd, int, __atomic_fetch_add(p, v, __ATOMIC_RELAXED))
SIMT_ATOMIC(atomicAdd, unsigned, __atomic_fetch_add(p, v, __ATOMIC_RELAXED))
SIMT_ATOMIC(atomicAdd, unsigned long long, __atomic_fetch_add(p, v, __ATOMIC_RELAXED))
SIMT_ATOMIC(atomicMax, int, __atomic_fetch_max(p, v, __ATOMIC_RELAXED))
SIMT_ATOMIC(atomicMin, int, __atomic_fetch_min(p, v, __ATOMIC_RELAXED))
SIMT_ATOMIC(atomicExch, unsigned, __atomic_exchange_n(p, v, __ATOMIC_RELAXED))
#undef SIMT_ATOMIC
static inline float atomicAdd(float *p, float v) { // compare-and-swap from a guess: no plain load
    simt_atomic_check(p, sizeof(float));
    uint32_t cur = 0, next;
    float old;
    do {
        memcpy(&old, &cur, 4);
        float s = old + v;
        memcpy(&next, &s, 4);
    } while (!__atomic_compare_exchange_n((uint32_t *)p, &cur, next, false, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return old;
}

// ---- math intrinsics --------------------------------------------------------------------------
static inline int min(int a, int b) {
    return a < b ? a : b;
}
static inline int max(int a, int b) {
    return a > b ? a : b;
}
static inline unsigned min(unsigned a, unsigned b) {
    return a < b ? a : b;
}
static inline unsigned max(unsigned a, unsigned b) {
    return a > b ? a : b;
}
static inline long long min(long long a, long long b) {
    return a < b ? a : b;
}
static inline long long max(long long a, long long b) {
    return a > b ? a : b;
}
static inline float min(float a, float b) {
    return fminf(a, b);
}
static inline float max(float a, float b) {
    return fmaxf(a, b);
}
#define __expf(x) expf(x) // glibc declares __expf and __logf itself
#define __logf(x) logf(x)
static inline float __fdividef(float a, float b) {
    return a / b;
}
static inline float rsqrtf(float x) {
    return 1.0f / sqrtf(x);
}
static inline float __fmul_rn(float a, float b) {
    return a * b;
} // built with -ffp-contract=off
static inline float __fadd_rn(float a, float b) {
    return a + b;
}
static inline unsigned __float_as_uint(float x) {
    unsigned u;
    memcpy(&u, &x, 4);
    return u;
}
static inline float __uint_as_float(unsigned u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}
static inline int __float_as_int(float x) {
    return (int)__float_as_uint(x);
}
static inline float __int_as_float(int i) {
    return __uint_as_float((unsigned)i);
}

// ---- shared memory ----------------------------------------------------------------------------
void *simt_dynamic_shared();              // this launch's dynamic shared memory (its size exactly)
size_t simt_shared_offset(const void *p); // a shared address as PTX sees it (for smem_u32)
static inline size_t __cvta_generic_to_shared(const void *p) {
    return simt_shared_offset(p);
}

// ---- runtime API ------------------------------------------------------------------------------
#define CUDART_VERSION 13000
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureWrongThread = 908,
    cudaErrorNotSupported = 801,
} cudaError_t;

typedef struct simt_stream *cudaStream_t;
typedef struct simt_event *cudaEvent_t;
typedef struct simt_graph *cudaGraph_t;
typedef struct simt_graph_exec *cudaGraphExec_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
};
#define cudaStreamDefault 0x0
#define cudaStreamNonBlocking 0x1

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin, sharedMemPerMultiprocessor;
    int regsPerBlock, regsPerMultiprocessor, warpSize, maxThreadsPerBlock;
    int maxThreadsPerMultiProcessor, maxBlocksPerMultiProcessor;
    int maxThreadsDim[3], maxGridSize[3];
    int major, minor, multiProcessorCount, l2CacheSize;
};

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMalloc(void **p, size_t bytes);
template <typename T> static inline cudaError_t cudaMalloc(T **p, size_t bytes) {
    return cudaMalloc((void **)p, bytes);
}
cudaError_t cudaFree(void *p);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s = 0);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t s = 0);
cudaError_t cudaMemset(void *p, int value, size_t n);
cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s = 0);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char *cudaGetErrorName(cudaError_t e);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t simt_func_set_attribute(const void *fn, cudaFuncAttribute attr, int value);
template <typename F>
static inline cudaError_t cudaFuncSetAttribute(F *fn, cudaFuncAttribute a, int v) {
    return simt_func_set_attribute((const void *)fn, a, v);
}

// ---- kernel launch ----------------------------------------------------------------------------
// kernel<<<grid, block, smem, stream>>>(args) is CUDA_LAUNCH(kernel, grid, block, smem, stream,
// args) in both builds (util/cuda_util.cuh); here the arguments are converted to the kernel's
// parameter types once, and every thread calls the kernel with its own copy of them.
struct simt_launch_site {
    const char *name, *file;
    int line;
    const void *fn;
};
void simt_launch_run(const simt_launch_site &site, dim3 grid, dim3 block, size_t smem,
                     cudaStream_t stream, std::function<void()> body);
template <typename... P, typename... A>
static inline void simt_launch(const simt_launch_site &site, void (*k)(P...), dim3 grid, dim3 block,
                               size_t smem, cudaStream_t stream, A &&...args) {
    auto a =
        std::make_shared<std::tuple<typename std::decay<P>::type...>>(std::forward<A>(args)...);
    simt_launch_run(site, grid, block, smem, stream, [k, a] { std::apply(k, *a); });
}
