// model/cuda_util.cuh — what the CUDA files share: checked CUDA calls (file:line, what failed, a
// hint, exit 3), the bf16 type, and the launch-size helper. Included by *.cu files only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef __nv_bfloat16 bf16;

static inline void cuda_check(cudaError_t e, const char *what, const char *file, int line) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "sift: CUDA error at %s:%d: %s: %s (%s)\n"
            "hint: rerun under compute-sanitizer to locate it, or use --device cpu\n",
            file, line, what, cudaGetErrorName(e), cudaGetErrorString(e));
    exit(3);
}

#define CUDA_CHECK(call) cuda_check((call), #call, __FILE__, __LINE__)
// After every kernel launch: a bad configuration is reported here, not at the next copy.
#define CUDA_LAUNCHED(kernel) cuda_check(cudaGetLastError(), "launch of " #kernel, __FILE__, __LINE__)

// Blocks of `threads` covering n items (n > 0).
static inline unsigned cuda_blocks(size_t n, unsigned threads) {
    return (unsigned)((n + threads - 1) / threads);
}

#ifdef __CUDACC__
__device__ static inline float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ static inline float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// ---- cp.async (sm_80+): 16-byte global -> shared copies that run while the block computes ----

__device__ static inline uint32_t smem_u32(const void *p) {   // a shared-memory address for PTX
    return (uint32_t)__cvta_generic_to_shared(p);
}
// 16 bytes global -> shared, asynchronously; zero-filled when !valid (src must still be mapped)
__device__ static inline void cp_async16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ static inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// waits until at most N committed groups are still in flight
template <int N>
__device__ static inline void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// The max (is_max) or sum of x over the block (blockDim.x a multiple of 32, at most 1024);
// every thread gets the result. red: 32 floats of shared memory.
__device__ static inline float block_reduce(float x, float *red, int is_max) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    x = is_max ? warp_max(x) : warp_sum(x);
    if (lane == 0) red[warp] = x;
    __syncthreads();
    x = lane < n_warps ? red[lane] : (is_max ? -INFINITY : 0.0f);
    x = is_max ? warp_max(x) : warp_sum(x);
    __syncthreads();   // red may be reused right after
    return x;
}
#endif
