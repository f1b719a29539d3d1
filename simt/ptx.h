// simt/ptx.h — the SIMT emulation build's half of util/cuda_util.cuh: the kernel launch,
// dynamic shared memory, and the PTX wrappers (one per instruction) executed by runtime.cpp from
// the PTX ISA's definitions: cp.async (delayed until its group is waited for; the destination
// poisoned and marked pending meanwhile), ldmatrix and mma.sync (warp-collective, fragments per
// the ISA's tables), wgmma.mma_async (sm_90a; each warp's share of the warpgroup's product,
// its result held back until wait_group), ex2.approx.ftz.
#pragma once
#include "simt.h"

// Runs the kernel on the CPU before returning (streams execute in order, synchronously), so a
// finding of the checkers surfaces here, at the launch (CUDA_LAUNCHED: exit 3 with the report).
#define CUDA_LAUNCH(kernel, grid, block, smem, stream, ...)                                        \
    do {                                                                                           \
        simt_launch(simt_launch_site{#kernel, __FILE__, __LINE__, (const void *)(kernel)}, kernel, \
                    grid, block, smem, stream, __VA_ARGS__);                                       \
        CUDA_LAUNCHED(kernel);                                                                     \
    } while (0)
#define SHARED_DYNAMIC(T, name) T *name = (T *)simt_dynamic_shared()
#define CUDA_EMULATED 1 // the GPU is emulated; cuBLASLt is simt/cublaslt.cpp, linked in

void simt_cp_async16(void *dst, const void *src, bool valid);
void simt_cp_async_commit();
void simt_cp_async_wait(int n);
void simt_ldmatrix(uint32_t *r, const void *p, int n, int trans);
void simt_mma_m16n8k16_bf16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1);
float simt_ex2_approx_ftz(float x);
void simt_wgmma(float *d, int n, const uint32_t *a, uint64_t da, uint64_t db, int trans_b, int acc);
void simt_wgmma_fence();
void simt_wgmma_commit();
void simt_wgmma_wait(int n);

static inline uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
static inline void cp_async16(void *dst, const void *src, bool valid) {
    simt_cp_async16(dst, src, valid);
}
static inline void cp_async_commit() {
    simt_cp_async_commit();
}
template <int N> static inline void cp_async_wait() {
    simt_cp_async_wait(N);
}
static inline void ldsm_x1(uint32_t *r, const void *p) {
    simt_ldmatrix(r, p, 1, 0);
}
static inline void ldsm_x1_t(uint32_t *r, const void *p) {
    simt_ldmatrix(r, p, 1, 1);
}
static inline void ldsm_x2(uint32_t *r, const void *p) {
    simt_ldmatrix(r, p, 2, 0);
}
static inline void ldsm_x2_t(uint32_t *r, const void *p) {
    simt_ldmatrix(r, p, 2, 1);
}
static inline void ldsm_x4(uint32_t *r, const void *p) {
    simt_ldmatrix(r, p, 4, 0);
}
static inline void ldsm_x4_t(uint32_t *r, const void *p) {
    simt_ldmatrix(r, p, 4, 1);
}
static inline void mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    simt_mma_m16n8k16_bf16(c, a, b0, b1);
}
static inline float ex2(float x) {
    return simt_ex2_approx_ftz(x);
}
// wgmma (cuda_util.cuh has the instructions' text and wg_desc): every body compiled in this build
#define SIFT_WGMMA 1
static inline void wg_fence() {
    simt_wgmma_fence();
}
static inline void wg_commit() {
    simt_wgmma_commit();
}
template <int N> static inline void wg_wait() {
    simt_wgmma_wait(N);
}
template <int N> static inline void wg_hold(float *) {}
template <int N> static inline void wg_hold_u(uint32_t *) {}
static inline void fence_proxy_async() {}
static inline void wgmma_m64n64k16_ss(float *d, uint64_t da, uint64_t db, int acc) {
    simt_wgmma(d, 64, NULL, da, db, 0, acc);
}
static inline void wgmma_m64n128k16_rs_tb(float *d, const uint32_t *a, uint64_t db, int acc) {
    simt_wgmma(d, 128, a, 0, db, 1, acc);
}
static inline void wgmma_m64n64k16_rs_tb(float *d, const uint32_t *a, uint64_t db, int acc) {
    simt_wgmma(d, 64, a, 0, db, 1, acc);
}
// ld.global.nc.L1::no_allocate.v4.u32: the address must be 16-byte aligned and in global memory
// (checked; the load itself is traced as every other, bounds and races)
void simt_ld_global_check(const void *p, unsigned n, const char *what);
static inline uint4 ld_stream16(const void *p) {
    simt_ld_global_check(p, 16, "ld.global.nc");
    return *(const uint4 *)p;
}
// dp4a.s32.s32: c + sum over bytes k of (int8) a_k * (int8) b_k (PTX ISA: signed bytes, 32-bit
// wrap-around add)
static inline int dp4a_s32(int a, int b, int c) {
    uint32_t s = (uint32_t)c;
    for (int k = 0; k < 4; k++)
        s += (uint32_t)((int32_t)(int8_t)(a >> (8 * k)) * (int32_t)(int8_t)(b >> (8 * k)));
    return (int)s;
}
// cvt.f32.f16 of the low 16 bits of h: exact (every f16, subnormals included, is an fp32; NaN
// keeps its payload's top bits). The same rule as weights/dequant.c's dq_f16_to_f32, restated:
// simt/ includes nothing of sift's (it emulates the instruction, not sift's loader)
static inline float f16_to_f32(uint32_t h) {
    uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (e == 0x1f) bits = sign | 0x7f800000u | man << 13;
    else if (e) bits = sign | (e + 112) << 23 | man << 13;
    else {
        float f = (float)man * 0x1p-24f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float y;
    memcpy(&y, &bits, 4);
    return y;
}
