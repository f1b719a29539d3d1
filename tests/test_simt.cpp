// tests/test_simt.cpp — the SIMT emulator itself (simt/), built like the CUDA sources of
// the emulation build (build/tests/test_simt), and the same checks on a real GPU with nvcc
// (build/tests/gpu_tables, run by bench/gpu.sh: the device validates the tables the emulator
// implements). Without arguments: the PTX fragment tables, restated here from the PTX
// ISA ("Matrix fragments for mma.m16n8k16 with floating point type", "ldmatrix") and checked
// against what the emulated instructions deliver, on values that identify every element; cp.async
// group semantics; shuffles, barriers with a predicate, shared atomics, BlockScan, graph
// capture and replay. With `--case NAME`: one kernel bug the checkers must report (tests/
// test_simt.py runs each and reads the report); `--list` names them.
#include <cub/block/block_scan.cuh>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/cuda_util.cuh"

static int fails, checks;
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            fails++;                                                                               \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

template <typename T> static T *dev(size_t n) {
    void *p;
    CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
    return (T *)p;
}
template <typename T> static void up(T *d, const T *h, size_t n) {
    CUDA_CHECK(cudaMemcpy(d, h, n * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T> static void down(T *h, const T *d, size_t n) {
    CUDA_CHECK(cudaMemcpy(h, d, n * sizeof(T), cudaMemcpyDeviceToHost));
}

// ---- the PTX ISA's tables -----------------------------------------------------------------------
// mma.m16n8k16 .bf16, per lane: groupID = lane >> 2, threadID_in_group = lane % 4.
// A: 8 elements a0..a7 in 4 registers (a_{2j} low half of register j, a_{2j+1} high half):
//    row = groupID for a_i, i < 2 or 4 <= i < 6; groupID + 8 otherwise;
//    col = threadID_in_group * 2 + (i & 1) for i < 4; + 8 for i >= 4.
// B: 4 elements b0..b3 in 2 registers: row (k) = threadID_in_group * 2 + (i & 1), + 8 for
//    i >= 2; col (n) = groupID.
// C/D: 4 fp32 c0..c3: row = groupID for i < 2, groupID + 8 otherwise; col = threadID_in_group
//    * 2 + (i & 1).
__host__ __device__ static inline int a_row(int l, int i) {
    return (i < 2 || (i >= 4 && i < 6)) ? l >> 2 : (l >> 2) + 8;
}
__host__ __device__ static inline int a_col(int l, int i) {
    return (l % 4) * 2 + (i & 1) + (i >= 4 ? 8 : 0);
}
__host__ __device__ static inline int b_row(int l, int i) {
    return (l % 4) * 2 + (i & 1) + (i >= 2 ? 8 : 0);
}
__host__ __device__ static inline int b_col(int l) {
    return l >> 2;
}
__host__ __device__ static inline int c_row(int l, int i) {
    return (l >> 2) + (i >= 2 ? 8 : 0);
}
__host__ __device__ static inline int c_col(int l, int i) {
    return (l % 4) * 2 + (i & 1);
}
// ldmatrix .m8n8 .b16: threads 8m .. 8m+7 give the addresses of rows 0..7 of matrix m (.x1:
// m = 0; .x2: m < 2; .x4: m < 4); thread l receives, of each matrix, row l / 4, elements
// 2 (l % 4) (low half) and 2 (l % 4) + 1; with .trans, column l / 4, rows 2 (l % 4) and + 1.

__host__ __device__ static inline uint16_t bf16_bits(float x) {
    __nv_bfloat16 h = __float2bfloat16_rn(x);
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}

// One warp: fragments built from A (16x16), B (16x8), C (16x8) by the tables above, one mma,
// D written back by the C table.
__global__ void mma_kernel(float *D, const float *A, const float *B, const float *C) {
    int l = threadIdx.x;
    uint32_t a[4], b[2];
    float c[4];
    for (int j = 0; j < 4; j++)
        a[j] = bf16_bits(A[a_row(l, 2 * j) * 16 + a_col(l, 2 * j)]) |
               (uint32_t)bf16_bits(A[a_row(l, 2 * j + 1) * 16 + a_col(l, 2 * j + 1)]) << 16;
    for (int j = 0; j < 2; j++)
        b[j] = bf16_bits(B[b_row(l, 2 * j) * 8 + b_col(l)]) |
               (uint32_t)bf16_bits(B[b_row(l, 2 * j + 1) * 8 + b_col(l)]) << 16;
    for (int i = 0; i < 4; i++)
        c[i] = C[c_row(l, i) * 8 + c_col(l, i)];
    mma16816(c, a, b[0], b[1]);
    for (int i = 0; i < 4; i++)
        D[c_row(l, i) * 8 + c_col(l, i)] = c[i];
}

static void test_mma() {
    float A[256], B[128], C[128], D[128];
    for (int i = 0; i < 256; i++)
        A[i] = (float)((i * 7) % 13 - 6); // small integers: exact
    for (int i = 0; i < 128; i++)
        B[i] = (float)((i * 5) % 11 - 5), C[i] = (float)(i % 9 - 4);
    float *dA = dev<float>(256), *dB = dev<float>(128), *dC = dev<float>(128),
          *dD = dev<float>(128);
    up(dA, A, 256), up(dB, B, 128), up(dC, C, 128);
    CUDA_LAUNCH(mma_kernel, 1, 32, 0, 0, dD, dA, dB, dC);
    down(D, dD, 128);
    int bad = 0;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            double s = C[i * 8 + j];
            for (int k = 0; k < 16; k++)
                s += (double)A[i * 16 + k] * B[k * 8 + j];
            bad += D[i * 8 + j] != s;
        }
    EXPECT(bad == 0, "mma.m16n8k16: %d of 128 outputs differ from A B + C by the ISA's tables",
           bad);
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD);
}

// How the tensor cores accumulate: C = 1 plus one product of 1.5 * 2^-24 (0.75 of fp32's unit at
// 1) in output (0, 0), every other input zero. Adding in fp32 with round to nearest gives
// 1 + 2^-23; the truncating block FMA (simt/ptx.cpp, SIMT_TC_ACCUM=trunc, after Fasi et al.) gives
// 1. The emulator must give its mode's value; a GPU's is printed (it says which model holds).
static void test_mma_accumulation() {
    float A[256] = {0}, B[128] = {0}, C[128] = {0}, D[128];
    A[0] = ldexpf(1.5f, -12), B[0] = ldexpf(1.0f, -12), C[0] = 1.0f;
    float *dA = dev<float>(256), *dB = dev<float>(128), *dC = dev<float>(128),
          *dD = dev<float>(128);
    up(dA, A, 256), up(dB, B, 128), up(dC, C, 128);
    CUDA_LAUNCH(mma_kernel, 1, 32, 0, 0, dD, dA, dB, dC);
    down(D, dD, 128);
    const float nearest = 1.0f + ldexpf(1.0f, -23);
    printf("test_simt: mma accumulation probe: 1 + 1.5 * 2^-24 = 1 + %g * 2^-23 (round to nearest "
           "gives 1, truncation 0)\n", (D[0] - 1.0f) * ldexpf(1.0f, 23));
    if (CUDA_EMULATED) {
        const char *m = getenv("SIMT_TC_ACCUM");
        float want = m && !strcmp(m, "trunc") ? 1.0f : nearest;
        EXPECT(D[0] == want, "mma accumulation (SIMT_TC_ACCUM=%s): got 1 + %g * 2^-23, want 1 + %g",
               m ? m : "", (D[0] - 1.0f) * ldexpf(1.0f, 23), (want - 1.0f) * ldexpf(1.0f, 23));
    }
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD);
}

// A shared tile of 4 matrices whose rows are stored in reverse order, so that the row a lane
// points to is not the one its index would suggest; element value = m * 64 + r * 8 + c.
__global__ void ldsm_kernel(uint32_t *out, int n, int trans) {
    __shared__ __align__(16) uint16_t tile[4][8][8];
    int l = threadIdx.x;
    for (int e = l; e < 256; e += 32) {
        int m = e / 64, r = e / 8 % 8, c = e % 8;
        tile[m][7 - r][c] = (uint16_t)(m * 64 + r * 8 + c);
    }
    __syncwarp();
    uint32_t r[4] = {0, 0, 0, 0};
    int m = l / 8 < n ? l / 8 : 0; // lanes past the .xN ones give some valid row anyway
    const void *row = &tile[m][7 - l % 8][0];
    if (n == 1)
        trans ? ldsm_x1_t(r, row) : ldsm_x1(r, row);
    else if (n == 2)
        trans ? ldsm_x2_t(r, row) : ldsm_x2(r, row);
    else
        trans ? ldsm_x4_t(r, row) : ldsm_x4(r, row);
    for (int i = 0; i < n; i++)
        out[l * 4 + i] = r[i];
}

static void test_ldmatrix() {
    uint32_t *d = dev<uint32_t>(128), h[128];
    for (int n = 1; n <= 4; n *= 2)
        for (int trans = 0; trans < 2; trans++) {
            CUDA_LAUNCH(ldsm_kernel, 1, 32, 0, 0, d, n, trans);
            down(h, d, 128);
            int bad = 0;
            for (int l = 0; l < 32; l++)
                for (int m = 0; m < n; m++) {
                    int r0 = trans ? 2 * (l % 4) : l / 4, c0 = trans ? l / 4 : 2 * (l % 4);
                    int r1 = trans ? r0 + 1 : r0, c1 = trans ? c0 : c0 + 1;
                    uint32_t want =
                        (uint32_t)(m * 64 + r0 * 8 + c0) | (uint32_t)(m * 64 + r1 * 8 + c1) << 16;
                    bad += h[l * 4 + m] != want;
                }
            EXPECT(bad == 0, "ldmatrix .x%d%s: %d of %d registers differ from the ISA's table", n,
                   trans ? ".trans" : "", bad, 32 * n);
        }
    cudaFree(d);
}

// wgmma.mma_async m64nNk16 (sm_90a; simt/ptx.cpp restates the ISA): a warpgroup of 4 warps, A (64
// x 16) and B (16 x N) placed in shared memory by the no-swizzle canonical layouts, restated:
// core matrices of 8 rows x 16 bytes, 128 contiguous bytes each, lbo bytes apart along K and sbo
// along M or N; K-major: element (r, k) at (r/8) sbo + (k/8) lbo + (r%8) 16 + (k%8) 2; MN-major
// (B with imm-trans-b = 1): (r/8) sbo + (k/8) lbo + (k%8) 16 + (r%8) 2, r the N index.
// D: warp w, lane l, register i: row 16w + l/4 + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 (l % 4)
// + (i & 1). A from registers: warp w's rows 16w.. by mma.m16n8k16's A table. `twice` issues the
// product twice in one group (the second accumulates on the first's pending result).
#define WG_B_OFF 16384
__host__ __device__ [[maybe_unused]] static inline uint32_t wg_at(int r, int k, int mn_major, uint32_t lbo, uint32_t sbo) {
    return (uint32_t)(r / 8) * sbo + (uint32_t)(k / 8) * lbo +
           (mn_major ? (k % 8) * 16 + (r % 8) * 2 : (r % 8) * 16 + (k % 8) * 2);
}
__global__ void wgmma_table_kernel(float *D, const float *A, const float *B, const float *C, int n,
                                   int rs, int twice, uint4 off) {   // off: a lbo, a sbo, b lbo, b sbo
#if SIFT_WGMMA
    SHARED_DYNAMIC(unsigned char, sm);
    const int tid = threadIdx.x, w = tid / 32, l = tid % 32;
    for (int e = tid; e < 64 * 16; e += 128) {
        *(uint16_t *)(sm + wg_at(e / 16, e % 16, 0, off.x, off.y)) = bf16_bits(A[e]);
    }
    for (int e = tid; e < 16 * n; e += 128) {   // B[k][c]: K-major for ss, MN-major for rs
        *(uint16_t *)(sm + WG_B_OFF + wg_at(e % n, e / n, rs, off.z, off.w)) = bf16_bits(B[e]);
    }
    fence_proxy_async();   // the stores, visible to wgmma
    __syncthreads();
    float d[64];
    uint32_t a[4];
    for (int i = 0; i < n / 2; i++)
        d[i] = C[(16 * w + l / 4 + 8 * (i >> 1 & 1)) * n + 8 * (i >> 2) + 2 * (l % 4) + (i & 1)];
    for (int j = 0; j < 4; j++)
        a[j] = bf16_bits(A[(16 * w + a_row(l, 2 * j)) * 16 + a_col(l, 2 * j)]) |
               (uint32_t)bf16_bits(A[(16 * w + a_row(l, 2 * j + 1)) * 16 + a_col(l, 2 * j + 1)]) << 16;
    const uint64_t da = wg_desc(sm, off.x, off.y), db = wg_desc(sm + WG_B_OFF, off.z, off.w);
    wg_hold<64>(d);
    wg_hold_u<4>(a);
    wg_fence();
    for (int rep = 0; rep <= twice; rep++) {
        if (!rs) wgmma_m64n64k16_ss(d, da, db, 1);
        else if (n == 64) wgmma_m64n64k16_rs_tb(d, a, db, 1);
        else wgmma_m64n128k16_rs_tb(d, a, db, 1);
    }
    wg_commit();
    wg_wait<0>();
    wg_hold<64>(d);
    for (int i = 0; i < n / 2; i++)
        D[(16 * w + l / 4 + 8 * (i >> 1 & 1)) * n + 8 * (i >> 2) + 2 * (l % 4) + (i & 1)] = d[i];
#endif
}

static bool has_wgmma() {   // sm_90a code runs on compute capability 9.0 only
    if (CUDA_EMULATED) return true;
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    return p.major == 9 && p.minor == 0;
}

static void test_wgmma() {
    if (!has_wgmma()) {
        printf("test_simt: wgmma tables skipped (not a compute capability 9.0 device)\n");
        return;
    }
    static float A[64 * 16], B[16 * 128], C[64 * 128], D[64 * 128];
    for (int i = 0; i < 64 * 16; i++) A[i] = (float)((i * 7) % 13 - 6);
    for (int i = 0; i < 16 * 128; i++) B[i] = (float)((i * 5) % 11 - 5);
    for (int i = 0; i < 64 * 128; i++) C[i] = (float)(i % 9 - 4);
    float *dA = dev<float>(64 * 16), *dB = dev<float>(16 * 128), *dC = dev<float>(64 * 128),
          *dD = dev<float>(64 * 128);
    up(dA, A, 64 * 16), up(dB, B, 16 * 128);
    struct {
        int n, rs, twice;
        uint4 off;
        const char *what;
    } cases[] = {
        // A: the two K halves adjacent (lbo 128), 8-row groups 256 apart; B K-major with the K
        // halves far apart (lbo 1024) and 8-key groups adjacent (sbo 128)
        {64, 0, 0, make_uint4(128, 256, 1024, 128), "m64n64k16 A, B K-major (shared)"},
        {64, 0, 1, make_uint4(1024, 128, 128, 256), "m64n64k16 twice in one group"},
        // B MN-major: 8-column groups 256 apart, K halves 128 apart (and the reverse)
        {64, 1, 0, make_uint4(128, 256, 128, 256), "m64n64k16 A registers, B MN-major"},
        {128, 1, 0, make_uint4(128, 256, 2048, 128), "m64n128k16 A registers, B MN-major"},
    };
    for (auto &c : cases) {
        for (int i = 0; i < 64 * c.n; i++) C[i] = (float)(i % 9 - 4);
        up(dC, C, 64 * c.n);
        CUDA_CHECK(cudaMemset(dD, 0xff, 64 * 128 * sizeof(float)));
        CUDA_CHECK(cudaFuncSetAttribute(wgmma_table_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        WG_B_OFF + 16384));
        CUDA_LAUNCH(wgmma_table_kernel, 1, 128, WG_B_OFF + 16384, 0, dD, dA, dB, dC, c.n, c.rs,
                    c.twice, c.off);
        down(D, dD, 64 * c.n);
        int bad = 0;
        for (int i = 0; i < 64; i++)
            for (int j = 0; j < c.n; j++) {
                double s = 0;
                for (int k = 0; k < 16; k++) s += (double)A[i * 16 + k] * B[k * c.n + j];
                bad += D[i * c.n + j] != C[i * c.n + j] + (c.twice + 1) * s;
            }
        EXPECT(bad == 0, "wgmma %s: %d of %d outputs differ from A B + C by the ISA's layouts", c.what,
               bad, 64 * c.n);
    }
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD);
}

// cp.async: three groups; wait_group 2, 1, 0 make the oldest groups land one by one; a source
// size of 0 zero-fills.
__global__ void async_kernel(int *out, const int *src) {
    __shared__ __align__(16) int s[3][4];
    __shared__ __align__(16) int z[4];
    for (int g = 0; g < 3; g++) {
        cp_async16(s[g], src + 4 * g, true);
        if (g == 0) cp_async16(z, src, false);
        cp_async_commit();
    }
    cp_async_wait<2>();
    out[0] = s[0][1], out[1] = z[2];
    cp_async_wait<1>();
    out[2] = s[1][2];
    cp_async_wait<0>();
    out[3] = s[2][3];
}

static void test_async() {
    int h[12], o[4];
    for (int i = 0; i < 12; i++)
        h[i] = 100 + i;
    int *src = dev<int>(12), *out = dev<int>(4);
    up(src, h, 12);
    CUDA_LAUNCH(async_kernel, 1, 1, 0, 0, out, src);
    down(o, out, 4);
    EXPECT(o[0] == 101 && o[1] == 0 && o[2] == 106 && o[3] == 111,
           "cp.async groups: got %d %d %d %d, want 101 0 106 111", o[0], o[1], o[2], o[3]);
    cudaFree(src), cudaFree(out);
}

// Shuffles of every kind, __syncthreads_or/and, a shared histogram by atomics, BlockScan.
__global__ void collective_kernel(int *out) {
    typedef cub::BlockScan<int, 64> scan_t;
    __shared__ typename scan_t::TempStorage tmp;
    __shared__ unsigned hist[4];
    int t = threadIdx.x, l = t % 32;
    if (t < 4) hist[t] = 0;
    __syncthreads();
    out[t * 8 + 0] = __shfl_xor_sync(0xffffffffu, l * 10, 5);
    out[t * 8 + 1] = __shfl_sync(0xffffffffu, l * 10, 3);
    out[t * 8 + 2] = __shfl_up_sync(0xffffffffu, l * 10, 2);
    out[t * 8 + 3] = __shfl_down_sync(0xffffffffu, l * 10, 1, 8);
    out[t * 8 + 4] = __syncthreads_or(t == 37) * 10 + __syncthreads_and(t < 64);
    atomicAdd(&hist[t % 4], 1u);
    int excl, total;
    scan_t(tmp).ExclusiveSum(t % 3, excl, total);
    out[t * 8 + 5] = excl;
    out[t * 8 + 6] = total;
    out[t * 8 + 7] = (int)hist[t % 4];
}

static void test_collectives() {
    int *d = dev<int>(64 * 8), h[64 * 8];
    CUDA_LAUNCH(collective_kernel, 1, 64, 0, 0, d);
    down(h, d, 64 * 8);
    int bad = 0, excl = 0, total = 0;
    for (int t = 0; t < 64; t++)
        total += t % 3;
    for (int t = 0; t < 64; t++) {
        int l = t % 32, *o = h + t * 8;
        bad += o[0] != (l ^ 5) * 10;
        bad += o[1] != 30;
        bad += o[2] != (l >= 2 ? l - 2 : l) * 10;
        bad += o[3] != (l % 8 < 7 ? l + 1 : l) * 10;
        bad += o[4] != 11;
        bad += o[5] != excl || o[6] != total || o[7] != 16;
        excl += t % 3;
    }
    EXPECT(bad == 0, "shuffles / barrier predicates / atomics / BlockScan: %d wrong values", bad);
    cudaFree(d);
}

// Every shuffle kind at every width and a spread of lane arguments (past the width and past 31
// too) against the PTX ISA's shfl.sync pseudo-code restated here, with the c operand CUDA's
// __shfl_*_sync pass (segment mask 32 - width; clamp 0 for up, 31 otherwise).
#define SHFL_ARGS 11
__global__ void shfl_table_kernel(int *out) {   // out [kind 4][width 6][arg][lane 32]
    const int shfl_args[SHFL_ARGS] = {0, 1, 3, 5, 8, 15, 16, 17, 31, 32, 33};
    const int l = threadIdx.x, v = l * 10 + 1;
    for (int wi = 0; wi < 6; wi++)
        for (int ai = 0; ai < SHFL_ARGS; ai++) {
            const int w = 1 << wi, a = shfl_args[ai], o = ((0 * 6 + wi) * SHFL_ARGS + ai) * 32 + l;
            const int K = 6 * SHFL_ARGS * 32;
            out[o] = __shfl_sync(0xffffffffu, v, a, w);
            out[o + K] = __shfl_xor_sync(0xffffffffu, v, a, w);
            out[o + 2 * K] = __shfl_up_sync(0xffffffffu, v, (unsigned)a, w);
            out[o + 3 * K] = __shfl_down_sync(0xffffffffu, v, (unsigned)a, w);
        }
}

static int shfl_expect(int kind, int w, int b, int lane) {   // 0 idx, 1 bfly, 2 up, 3 down
    const int segmask = (32 - w) & 31, clamp = kind == 2 ? 0 : 31;
    const int maxl = (lane & segmask) | (clamp & ~segmask), minl = lane & segmask;
    int j;
    bool p;
    b &= 31;
    if (kind == 0) j = minl | (b & ~segmask), p = j <= maxl;
    else if (kind == 1) j = lane ^ b, p = j <= maxl;
    else if (kind == 2) j = lane - b, p = j >= maxl;
    else j = lane + b, p = j <= maxl;
    return (p ? j : lane) * 10 + 1;
}

static void test_shfl_table() {
    const int n = 4 * 6 * SHFL_ARGS * 32;
    int *d = dev<int>(n), *h = (int *)malloc(n * sizeof(int));
    int host_args[SHFL_ARGS] = {0, 1, 3, 5, 8, 15, 16, 17, 31, 32, 33};
    CUDA_LAUNCH(shfl_table_kernel, 1, 32, 0, 0, d);
    down(h, d, n);
    int bad = 0, first = -1;
    for (int k = 0; k < 4; k++)
        for (int wi = 0; wi < 6; wi++)
            for (int ai = 0; ai < SHFL_ARGS; ai++)
                for (int l = 0; l < 32; l++) {
                    int i = ((k * 6 + wi) * SHFL_ARGS + ai) * 32 + l;
                    if (h[i] != shfl_expect(k, 1 << wi, host_args[ai], l) && bad++ == 0) first = i;
                }
    EXPECT(bad == 0, "shfl.sync table (4 kinds x 6 widths x %d arguments x 32 lanes): %d wrong, "
           "first at entry %d", SHFL_ARGS, bad, first);
    cudaFree(d);
    free(h);
}

__global__ void inc_kernel(int *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += i;
}

// Graph capture records launches and copies; every replay runs them again, in order.
static void test_graph() {
    int n = 300, h[300];
    int *d = dev<int>(n);
    CUDA_CHECK(cudaMemset(d, 0, n * sizeof(int)));
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CUDA_LAUNCH(inc_kernel, cuda_blocks(n, 128), 128, 0, s, d, n);
    cudaGraph_t g;
    CUDA_CHECK(cudaStreamEndCapture(s, &g));
    down(h, d, n);
    EXPECT(h[7] == 0, "a captured launch ran at capture time");
    cudaGraphExec_t e;
    CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
    for (int r = 0; r < 3; r++)
        CUDA_CHECK(cudaGraphLaunch(e, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    down(h, d, n);
    EXPECT(h[7] == 21 && h[299] == 897, "3 replays: got %d %d, want 21 897", h[7], h[299]);
    CUDA_CHECK(cudaGraphExecDestroy(e));
    CUDA_CHECK(cudaGraphDestroy(g));
    CUDA_CHECK(cudaStreamDestroy(s));
    cudaFree(d);
}

// ---- planted kernel bugs: each must be reported by the emulator ---------------------------------

__global__ void race_kernel(int *out) { // a read and a write of another warp, no barrier between
    __shared__ int s[64];
    s[threadIdx.x] = threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[63 - threadIdx.x];
    s[threadIdx.x] = 0;
}
__global__ void uninit_kernel(int *out) {
    __shared__ int s[64];
    if (threadIdx.x < 32) s[threadIdx.x] = 1;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x + 1]; // thread 31 reads s[32]: nobody wrote it
}
__global__ void partial_barrier_kernel(int *out) {
    if (threadIdx.x >= 32) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}
__global__ void divergent_barrier_kernel(int *out) {
    if (threadIdx.x < 32) {
        __syncthreads();
        out[threadIdx.x] = 1;
    } else {
        out[threadIdx.x] = 2;
        __syncthreads();
    }
}
__global__ void shfl_exited_kernel(int *out) {
    if (threadIdx.x == 31) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}
__global__ void oob_kernel(int *out, int n) {
    out[threadIdx.x] = out[threadIdx.x + n];
}
// four 16-byte stores of zeros, one past a 48-byte buffer: clang merges them into one memset,
// which the store hooks would not see unless the kernels are compiled -fno-builtin (Makefile)
__global__ void zero_fill_oob_kernel(uint4 *out) {
    if (threadIdx.x == 0)
#pragma unroll
        for (int i = 0; i < 4; i++) out[i] = make_uint4(0, 0, 0, 0);
}
__global__ void dyn_oob_kernel(int *out) {
    SHARED_DYNAMIC(int, s);
    s[threadIdx.x] = 1;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x + 16]; // 64 bytes of dynamic shared memory: 16 ints
}
__global__ void misaligned_kernel(int *out) {
    out[threadIdx.x] = *(int *)((char *)out + 2);
}
__global__ void async_early_kernel(int *out, const int *src) {
    __shared__ __align__(16) int s[2][4];
    cp_async16(s[0], src, true);
    cp_async_commit();
    cp_async16(s[1], src + 4, true);
    cp_async_commit();
    cp_async_wait<1>(); // the newest group may still be in flight
    out[0] = s[0][0] + s[1][0];
}
__global__ void async_race_kernel(int *out, const int *src) {
    __shared__ __align__(16) int s[4];
    if (threadIdx.x == 0) s[0] = 1, s[1] = s[2] = s[3] = 0;
    __syncthreads();
    out[threadIdx.x] = s[0];                         // every warp reads s ...
    if (threadIdx.x == 32) cp_async16(s, src, true); // ... while warp 1 overwrites it
    cp_async_wait<0>();
}

__global__ void ldmatrix_global_kernel(int *out, const int *g) {   // ldmatrix reads .shared only
    uint32_t r[1];
    ldsm_x1(r, g + 4 * (threadIdx.x % 8));
    out[threadIdx.x] = (int)r[0];
}
__global__ void ldnc_shared_kernel(int *out) {   // ld.global.nc reads .global only
    __shared__ __align__(16) int s[4];
    if (threadIdx.x < 4) s[threadIdx.x] = 1;
    __syncthreads();
    out[threadIdx.x] = (int)ld_stream16(s).x;
}
__global__ void cp_async_src_shared_kernel(int *out) {   // cp.async's source is .global
    __shared__ __align__(16) int s[2][4];
    if (threadIdx.x == 0) s[0][0] = s[0][1] = s[0][2] = s[0][3] = 1;
    __syncthreads();
    if (threadIdx.x == 0) cp_async16(s[1], s[0], true);
    cp_async_wait<0>();
    out[threadIdx.x] = s[1][0];
}
// wgmma's planted bugs: B overwritten by another warpgroup before the issuing one waits; a
// descriptor past the launch's shared memory (what 1), or starting inside it and running past its
// end beyond the issuing warp's quarter of B (what 3); a block that is not whole warpgroups
__global__ void wgmma_case_kernel(int *out, int what) {
#if SIFT_WGMMA
    SHARED_DYNAMIC(unsigned char, sm);
    const int tid = threadIdx.x;
    for (int e = tid; e < 1024; e += blockDim.x) ((uint32_t *)sm)[e] = 0;
    __syncthreads();
    float d[32];
    for (int i = 0; i < 32; i++) d[i] = 0;
    const uint64_t da = wg_desc(sm, 128, 256), db = wg_desc(sm + (what == 1 ? 8192 : what == 3 ? 3072 : 2048), 128, 256);
    if (what != 0 || tid < 128) {
        wg_fence();
        wgmma_m64n64k16_ss(d, da, db, 0);
        wg_commit();
    }
    if (what == 0) {   // the second warpgroup writes B while the first's product is in flight
        __syncthreads();
        if (tid == 128) ((uint32_t *)sm)[512] = 0x3f80;
        __syncthreads();
    }
    wg_wait<0>();
    out[tid % 64] = (int)d[0];
#endif
}

static int run_case(const char *name) {
    int *d = dev<int>(64), *src = dev<int>(8);
    CUDA_CHECK(cudaMemset(d, 0, 64 * sizeof(int)));
    CUDA_CHECK(cudaMemset(src, 0, 8 * sizeof(int)));
    if (!strcmp(name, "race"))
        CUDA_LAUNCH(race_kernel, 1, 64, 0, 0, d);
    else if (!strcmp(name, "uninit"))
        CUDA_LAUNCH(uninit_kernel, 1, 64, 0, 0, d);
    else if (!strcmp(name, "partial-barrier"))
        CUDA_LAUNCH(partial_barrier_kernel, 1, 64, 0, 0, d);
    else if (!strcmp(name, "divergent-barrier"))
        CUDA_LAUNCH(divergent_barrier_kernel, 1, 64, 0, 0, d);
    else if (!strcmp(name, "shfl-exited"))
        CUDA_LAUNCH(shfl_exited_kernel, 1, 32, 0, 0, d);
    else if (!strcmp(name, "global-oob"))
        CUDA_LAUNCH(oob_kernel, 1, 32, 0, 0, d, 40);
    else if (!strcmp(name, "use-after-free")) {
        CUDA_CHECK(cudaFree(src));
        CUDA_LAUNCH(oob_kernel, 1, 8, 0, 0, src, 0);
    } else if (!strcmp(name, "dyn-shared-oob"))
        CUDA_LAUNCH(dyn_oob_kernel, 1, 16, 64, 0, d);
    else if (!strcmp(name, "misaligned"))
        CUDA_LAUNCH(misaligned_kernel, 1, 1, 0, 0, d);
    else if (!strcmp(name, "async-early"))
        CUDA_LAUNCH(async_early_kernel, 1, 1, 0, 0, d, src);
    else if (!strcmp(name, "async-race"))
        CUDA_LAUNCH(async_race_kernel, 1, 64, 0, 0, d, src);
    else if (!strcmp(name, "ldmatrix-global"))
        CUDA_LAUNCH(ldmatrix_global_kernel, 1, 32, 0, 0, d, src);
    else if (!strcmp(name, "cp-async-src-shared"))
        CUDA_LAUNCH(cp_async_src_shared_kernel, 1, 32, 0, 0, d);
    else if (!strcmp(name, "zero-fill-oob")) {
        uint4 *z = dev<uint4>(3);
        CUDA_LAUNCH(zero_fill_oob_kernel, 1, 32, 0, 0, z);
    } else if (!strcmp(name, "wgmma-changed") || !strcmp(name, "wgmma-desc-oob") ||
               !strcmp(name, "wgmma-warpgroup") || !strcmp(name, "wgmma-desc-partial")) {
        int what = !strcmp(name, "wgmma-changed")    ? 0
                   : !strcmp(name, "wgmma-desc-oob") ? 1
                   : !strcmp(name, "wgmma-warpgroup") ? 2
                                                      : 3;
        CUDA_LAUNCH(wgmma_case_kernel, 1, what == 2 ? 96 : 256, 4096, 0, d, what);
    } else if (!strcmp(name, "ldnc-shared"))
        CUDA_LAUNCH(ldnc_shared_kernel, 1, 32, 0, 0, d);
    else if (!strcmp(name, "host-deref"))
        printf("%d\n", d[3]);
    else if (!strcmp(name, "smem-attribute"))
        CUDA_LAUNCH(dyn_oob_kernel, 1, 16, 64 << 10, 0, d);
    else if (!strcmp(name, "grid-y"))
        CUDA_LAUNCH(inc_kernel, dim3(1, 70000), 32, 0, 0, d, 1);
    else if (!strcmp(name, "capture-sync")) {
        cudaStream_t s;
        CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        CUDA_LAUNCH(inc_kernel, 1, 32, 0, s, d, 8);
        CUDA_CHECK(cudaStreamSynchronize(s));
    } else {
        fprintf(stderr, "test_simt: unknown case %s\n", name);
        return 2;
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    printf("case %s: no finding\n", name);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--list")) {
        puts("race uninit partial-barrier divergent-barrier shfl-exited global-oob use-after-free "
             "dyn-shared-oob misaligned async-early async-race host-deref smem-attribute grid-y "
             "capture-sync ldmatrix-global cp-async-src-shared ldnc-shared "
             "zero-fill-oob wgmma-changed wgmma-desc-oob wgmma-desc-partial wgmma-warpgroup");
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "--case")) {
        if (CUDA_EMULATED) return run_case(argv[2]);
        fprintf(stderr,
                "test_simt: --case plants bugs for the emulator's checkers; not on a GPU\n");
        return 2;
    }
    test_mma();
    test_mma_accumulation();
    test_ldmatrix();
    test_async();
    test_collectives();
    test_shfl_table();
    test_wgmma();
    test_graph();
    printf("test_simt: %d checks, %d failed\n", checks, fails);
    return fails ? 1 : 0;
}
