// util/cuda_util.cuh — what the CUDA files share: checked CUDA calls (file:line, what failed, a
// hint, exit 3), the bf16 type, the launch-size helper, the kernel launch (CUDA_LAUNCH, never
// <<<>>> directly), dynamic shared memory (SHARED_DYNAMIC) and the PTX wrappers, one inline
// function per instruction. Included by *.cu files only. This is the one place the two builds
// differ: nvcc compiles the wrappers below; the SIMT emulation build (SIFT_SIMT, clang++, the
// CPU) takes simt/ptx.h's, which execute the same instructions thread by thread.
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

// The CUDA files' own counts of what they ask of the device (backend.h: bk_counters): bytes
// copied each way, stream synchronisations, device allocations, launches (kernels, device-side
// copies, cuBLASLt products) and graph replays. Kept here, by the wrappers below and
// CUDA_LAUNCHED, so that no copy, wait, allocation or launch of the backend goes uncounted: the
// CUDA files call cuda_memcpy_async, cuda_memcpy_2d_async, cuda_stream_sync and cuda_malloc,
// never the runtime's functions of those names.
struct cuda_counts_t {
    unsigned long long h2d_bytes, d2h_bytes, syncs, allocs, launches, graph_replays;
    int capturing;   // while a decode step is recorded: its launches run only as the replay
};
inline cuda_counts_t cuda_counts;

static inline void cuda_count_copy(size_t bytes, cudaMemcpyKind kind) {
    if (kind == cudaMemcpyHostToDevice) cuda_counts.h2d_bytes += bytes;
    else if (kind == cudaMemcpyDeviceToHost) cuda_counts.d2h_bytes += bytes;
    else cuda_counts.launches += !cuda_counts.capturing;   // a copy on the device: queued work
}
static inline cudaError_t cuda_memcpy_async(void *dst, const void *src, size_t bytes,
                                            cudaMemcpyKind kind, cudaStream_t st) {
    cuda_count_copy(bytes, kind);
    return cudaMemcpyAsync(dst, src, bytes, kind, st);
}
static inline cudaError_t cuda_memcpy_2d_async(void *dst, size_t dpitch, const void *src,
                                               size_t spitch, size_t width, size_t height,
                                               cudaMemcpyKind kind, cudaStream_t st) {
    cuda_count_copy(width * height, kind);
    return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, st);
}
static inline cudaError_t cuda_stream_sync(cudaStream_t st) {
    cuda_counts.syncs++;
    return cudaStreamSynchronize(st);
}
static inline cudaError_t cuda_malloc(void **p, size_t bytes) {
    cuda_counts.allocs++;
    return cudaMalloc(p, bytes);
}

// After every kernel launch (counted): a bad configuration is reported here, not at the next copy.
#define CUDA_LAUNCHED(kernel)                                                                      \
    (cuda_counts.launches += !cuda_counts.capturing,                                               \
     cuda_check(cudaGetLastError(), "launch of " #kernel, __FILE__, __LINE__))

// Blocks of `threads` covering n items (n > 0).
static inline unsigned cuda_blocks(size_t n, unsigned threads) {
    return (unsigned)((n + threads - 1) / threads);
}

// ---- launch, dynamic shared memory, PTX -------------------------------------------------------
#ifdef SIFT_SIMT
#include "../simt/ptx.h"
#else
// kernel<<<grid, block, smem, stream>>>(...), then the launch checked; a template kernel with
// more than one argument goes in parentheses: CUDA_LAUNCH((k<A, B>), ...)
#define CUDA_LAUNCH(kernel, grid, block, smem, stream, ...)                                        \
    do {                                                                                           \
        kernel<<<grid, block, smem, stream>>>(__VA_ARGS__);                                        \
        CUDA_LAUNCHED(kernel);                                                                     \
    } while (0)
// The launch's dynamic shared memory as T[] (16-byte aligned)
#define SHARED_DYNAMIC(T, name) extern __shared__ __align__(16) T name[]
#define CUDA_EMULATED 0   // a real GPU (simt/ptx.h: 1)

__device__ static inline uint32_t smem_u32(const void *p) {   // a shared-memory address for PTX
    return (uint32_t)__cvta_generic_to_shared(p);
}
// cp.async (sm_80+): 16 bytes global -> shared, asynchronously; zero-filled when !valid (src
// must still be mapped)
__device__ static inline void cp_async16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ static inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// waits until at most N committed groups are still in flight
template <int N>
__device__ static inline void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// ldmatrix: one, two or four 8x8 b16 matrices; lanes 8m .. 8m+7 give the row addresses of matrix m
__device__ static inline void ldsm_x1(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(smem_u32(p)));
}
__device__ static inline void ldsm_x1_t(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0])
                 : "r"(smem_u32(p)));
}
__device__ static inline void ldsm_x2(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_u32(p)));
}
__device__ static inline void ldsm_x2_t(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_u32(p)));
}
__device__ static inline void ldsm_x4(uint32_t *r, const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ static inline void ldsm_x4_t(uint32_t *r, const void *p) {   // transposed
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

// c (16x8 fp32) += a (16x16 bf16) @ b (16x8 bf16), the tensor cores (mma.sync m16n8k16)
__device__ static inline void mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ static inline float ex2(float x) {   // 2^x; -inf -> 0
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// 16 bytes of global memory read once and not changed while the kernel runs, kept out of L1
// (ld.global.nc.L1::no_allocate; p 16-byte aligned): a stream of weights that should not evict
// what the block re-reads
__device__ static inline uint4 ld_stream16(const void *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// c + the sum of the four products of a's and b's signed bytes (dp4a.s32.s32)
__device__ static inline int dp4a_s32(int a, int b, int c) {
    int d;
    asm("dp4a.s32.s32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// the f16 in the low 16 bits of h as fp32 (exact: cvt.f32.f16)
__device__ static inline float f16_to_f32(uint32_t h) {
    float y;
    asm("{ .reg .b16 t; cvt.u16.u32 t, %1; cvt.f32.f16 %0, t; }\n" : "=f"(y) : "r"(h));
    return y;
}

// ---- wgmma (sm_90a only: the bodies below exist where SIFT_WGMMA is 1) ------------------------
// A warpgroup (4 warps) multiplies asynchronously: D (64 x N, fp32, N/2 registers per lane) +=
// A (64 x 16 bf16: shared memory by descriptor, or 4 registers per lane) B (16 x N bf16, shared
// memory by descriptor). Register tables and descriptor layouts: simt/ptx.cpp ("wgmma"). Order:
// shared operands written by stores or cp.async are published to the tensor cores' (async)
// proxy by fence_proxy_async() before the barrier that precedes the products; wg_hold on the
// registers a product reads (accumulators, A fragments) and wg_fence() after their last
// ordinary write; the products, wg_commit(), wg_wait<N>(), and wg_hold(d) again so that no read
// of the accumulators moves above the wait (wg_hold: an empty asm the compiler must keep in
// order, as CUTLASS's warpgroup_fence_operand).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SIFT_WGMMA 1
#else
#define SIFT_WGMMA 0
#endif
#if SIFT_WGMMA
__device__ static inline void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ static inline void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ static inline void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ static inline void wg_hold(float *d) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N>
__device__ static inline void wg_hold_u(uint32_t *r) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(r[i])::"memory");
}
__device__ static inline void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// A and B K-major (imm-trans-a = imm-trans-b = 0); acc = 0: D = A B
__device__ static inline void wgmma_m64n64k16_ss(float *d, uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(acc));
}
// A from registers, B MN-major (imm-trans-b = 1)
__device__ static inline void wgmma_m64n64k16_rs_tb(float *d, const uint32_t *a, uint64_t db,
                                                     int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "{%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
__device__ static inline void wgmma_m64n128k16_rs_tb(float *d, const uint32_t *a, uint64_t db,
                                                     int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                 "{%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}
#endif
#endif

#ifdef __CUDACC__
// wgmma's descriptor of a shared-memory operand in the no-swizzle canonical layout (both builds):
// core matrices (8 rows x 16 bytes, 128 contiguous bytes) lbo bytes apart along K and sbo bytes
// apart along M or N; bits 0-13 the address >> 4, 16-29 lbo >> 4, 32-45 sbo >> 4, the rest 0
__device__ static inline uint64_t wg_desc(const void *p, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)(smem_u32(p) >> 4 & 0x3fff) | (uint64_t)(lbo >> 4 & 0x3fff) << 16 |
           (uint64_t)(sbo >> 4 & 0x3fff) << 32;
}

__device__ static inline float warp_max(float x) {
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ static inline float warp_sum(float x) {
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

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
