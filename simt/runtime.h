// simt/runtime.h — what the emulator's own parts share (runtime.cpp, which also keeps the
// profiler's counters, ptx.cpp, cublaslt.cpp); kernels never include it.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "simt.h"

namespace simt {

struct thread_rec;

// A device allocation: [base, base + bytes), in 64 KiB granules followed by an unmapped one.
struct allocation {
    uint32_t id;
    uintptr_t base;
    size_t bytes;
    bool freed;
    const void *site; // the code that called cudaMalloc
};

// Checks an access of n bytes at p made by thread t (NULL: the current fiber's thread) for an
// emulated instruction (ldmatrix, cp.async): global bounds or shared-memory rules.
void check_access(thread_rec *t, const void *p, size_t n, int write, const void *site);
// The state space of p for the instructions that name one (ldmatrix .shared, cp.async .shared
// and .global): the running block's shared memory, or device memory from cudaMalloc.
bool is_shared(const void *p);
bool is_global(const void *p);
// Marks shared bytes [p, p + n) as the destination of t's cp.async (pending) or as landed.
void check_async(thread_rec *t, const void *p, size_t n, bool landed, const void *site);
// During a warp operation: the thread of lane l of the warp (NULL past a short warp's end).
thread_rec *op_lane(int l);
// The running thread (a fiber), or exit with "what called outside a kernel".
thread_rec *self_or_die(const char *what);
// A finding against thread t (reports name the kernel, block, thread and site); fails the launch.
void finding_at(thread_rec *t, const void *site, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
// The thread's cp.async state (ptx.cpp).
struct async_copy {
    unsigned char *dst;
    const unsigned char *src;
    bool valid;
    const void *site;
};
std::vector<async_copy> &async_open(thread_rec *t);
std::vector<std::vector<async_copy>> &async_groups(thread_rec *t);
void async_complete(thread_rec *t, std::vector<async_copy> &g); // ptx.cpp: the copies land
// The thread's wgmma.mma_async state (ptx.cpp): each issued product's result for this lane's
// accumulator registers, held back until a wait_group completes its group (the registers hold
// NaN meanwhile), and (lane 0 of each warp) the shared bytes it read, compared at completion.
struct wgmma_pending {
    float *d;
    std::vector<float> val;
    std::vector<std::pair<const unsigned char *, std::vector<unsigned char>>> read;
    const void *site;
};
std::vector<wgmma_pending> &wgmma_open(thread_rec *t);
std::vector<std::vector<wgmma_pending>> &wgmma_groups(thread_rec *t);
void wgmma_complete(thread_rec *t, std::vector<wgmma_pending> &g); // ptx.cpp: results land
// The linear index of t's warp in its block; the running block's thread count.
int warp_index(thread_rec *t);
int block_threads();
// The shared-memory address a descriptor names (simt_shared_offset's inverse), NULL if none.
void *shared_at(uint32_t offset);

// Host side (cuBLASLt): 0 when [p, p + bytes) lies in one live allocation, else -1 after a
// report naming `what`.
int device_range(const void *p, size_t bytes, const char *what);
// Runs fn now on stream s, or records it when s is capturing a graph; the stream's error state.
cudaError_t stream_enqueue(cudaStream_t s, std::function<void()> fn);
// Sets the launch-failure error that every later CUDA call returns (a GPU's sticky error).
void fail_sticky(cudaError_t e);

// Counters per kernel (SIMT_PROFILE=FILE: written there as JSON at exit, per kernel summed over
// its launches). A request is one warp-wide memory instruction: the k-th execution of one load
// or store by each lane of a warp; its shared-memory wavefronts (1 when no bank conflict) and
// global 32-byte sectors (coalescing) are counted when profiling.
struct counters {
    double blocks, threads, barriers, warp_ops;
    double global_bytes, shared_read_bytes, shared_write_bytes;
    double shared_requests, shared_wavefronts;
    double global_requests, global_sectors;
    double mma, ldmatrix, cp_async;
};
extern const int profiling;
void profile_count(double counters::*field, double n); // for the running kernel
} // namespace simt
