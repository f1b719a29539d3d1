// simt/ptx.cpp — the PTX instructions sift's kernels issue, executed as the PTX ISA
// defines them (the tables are restated in tests/test_simt.cpp, which checks them):
//  - cp.async.cg.shared.global 16 bytes (zero-filled when the source size is 0), commit_group,
//    wait_group N: the copies of a thread are delayed until a wait leaves at most N of its newer
//    groups in flight; meanwhile the destination holds 0xff bytes and is marked pending, so a
//    read before the wait is a finding (and would see poison);
//  - ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16: lanes 8m .. 8m+7 give the row
//    addresses of matrix m (16-byte aligned rows of 8 b16); lane l receives (row l/4, columns
//    2(l%4), 2(l%4)+1) of each matrix, or with .trans (rows 2(l%4), 2(l%4)+1, column l/4);
//  - mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: g = lane/4, t = lane%4;
//    A a0:(g, 2t..2t+1) a1:(g+8, 2t..) a2:(g, 2t+8..) a3:(g+8, 2t+8..), the lower column in the
//    low 16 bits; B b0:(k 2t..2t+1, n g) b1:(k 2t+8.., n g); C/D c0,c1:(g, 2t..2t+1) c2,c3:(g+8,
//    ..);
//  - ex2.approx.ftz.f32; the nvcuda::wmma operations (whole tiles per lane, mma.h).
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "include/mma.h"
#include "ptx.h"
#include "runtime.h"

using namespace simt;

static float bf16_lo(uint32_t r) {
    return __uint_as_float(r << 16);
}
static float bf16_hi(uint32_t r) {
    return __uint_as_float(r & 0xffff0000u);
}

// ---- cp.async ---------------------------------------------------------------------------------

void simt::async_complete(thread_rec *t, std::vector<async_copy> &g) {
    for (const async_copy &c : g) {
        if (c.valid)
            memcpy(c.dst, c.src, 16);
        else
            memset(c.dst, 0, 16);
        check_async(t, c.dst, 16, true, c.site);
    }
    g.clear();
}

void simt_cp_async16(void *dst, const void *src, bool valid) {
    thread_rec *t = self_or_die("cp.async");
    const void *site = __builtin_return_address(0);
    if ((uintptr_t)dst % 16 || (uintptr_t)src % 16)
        finding_at(t, site, "cp.async with a %s address that is not 16-byte aligned (%p)",
                   (uintptr_t)dst % 16 ? "shared" : "global", (uintptr_t)dst % 16 ? dst : src);
    if (!is_global(src)) // cp.async.cg.shared.global: the source is device memory
        finding_at(t, site, "cp.async source %p is not global memory", src);
    check_access(t, src, valid ? 16 : 1, 0, site); // even a zero-size source must be mapped
    check_async(t, dst, 16, false, site);
    memset(dst, 0xff, 16); // until the copy lands
    async_open(t).push_back({(unsigned char *)dst, (const unsigned char *)src, valid, site});
    profile_count(&counters::cp_async, 1);
}

void simt_ld_global_check(const void *p, unsigned n, const char *what) {
    thread_rec *t = self_or_die(what);
    const void *site = __builtin_return_address(0);
    if ((uintptr_t)p % n) finding_at(t, site, "%s address %p is not %u-byte aligned", what, p, n);
    if (!is_global(p)) finding_at(t, site, "%s address %p is not global memory", what, p);
}

void simt_cp_async_commit() {
    thread_rec *t = self_or_die("cp.async.commit_group");
    async_groups(t).push_back(std::move(async_open(t)));
    async_open(t).clear();
}

void simt_cp_async_wait(int n) {
    thread_rec *t = self_or_die("cp.async.wait_group");
    auto &g = async_groups(t);
    while ((int)g.size() > n) {
        async_complete(t, g.front());
        g.erase(g.begin());
    }
}

// ---- ldmatrix -----------------------------------------------------------------------------------

namespace {
struct ldsm_arg {
    const void *p;
    uint32_t *r;
    int n, trans;
    const void *site;
};
void ldsm_op(void *const *args, unsigned mask) {
    const ldsm_arg *a0 = (const ldsm_arg *)args[0];
    if (mask != 0xffffffffu) {
        finding_at(op_lane(0), a0->site, "ldmatrix needs the whole warp (mask 0x%08x)", mask);
        return;
    }
    uint16_t m[4][8][8];
    for (int i = 0; i < a0->n; i++)
        for (int row = 0; row < 8; row++) {
            const ldsm_arg *a = (const ldsm_arg *)args[8 * i + row];
            thread_rec *t = op_lane(8 * i + row);
            if (a->n != a0->n || a->trans != a0->trans) {
                finding_at(t, a->site, "ldmatrix: lanes disagree on .x%d / .trans", a0->n);
                return;
            }
            if ((uintptr_t)a->p % 16) {
                finding_at(t, a->site, "ldmatrix row address %p is not 16-byte aligned", a->p);
                return;
            }
            if (!is_shared(a->p)) {   // ldmatrix's state space is .shared only
                finding_at(t, a->site, "ldmatrix row address %p is not shared memory", a->p);
                return;
            }
            check_access(t, a->p, 16, 0, a->site);
            memcpy(m[i][row], a->p, 16);
        }
    for (int l = 0; l < 32; l++) {
        ldsm_arg *a = (ldsm_arg *)args[l];
        int r = l / 4, c = 2 * (l % 4);
        for (int i = 0; i < a0->n; i++)
            a->r[i] = a0->trans ? m[i][c][r] | (uint32_t)m[i][c + 1][r] << 16
                                : m[i][r][c] | (uint32_t)m[i][r][c + 1] << 16;
    }
}

// ---- tensor-core accumulation -------------------------------------------------------------------
// Default: exact products summed in fp32 one at a time, round to nearest (what the kernels' CPU
// twins do). SIMT_TC_ACCUM=trunc: the block-FMA model measured on NVIDIA tensor cores by Fasi,
// Higham, Mikaitis and Pranesh ("Numerical behavior of NVIDIA tensor cores", PeerJ Computer
// Science 7:e330, 2021; V100, T4, A100): per block of 8 products along k, the accumulator and the
// 8 exact products are aligned to the largest exponent among them, the bits below fp32's 24-bit
// significand at that exponent are dropped (truncation, toward zero), the aligned terms are
// summed exactly and the sum is rounded toward zero to fp32; no normalisation in between. Under
// it the kernels' results drift toward zero by up to about 9 units of the block's largest term
// per block, where round-to-nearest gives half a unit per addition: gpu_check's bounds must hold
// either way (tests/test_gpu_simt.py runs the attention section in this mode).
static int tc_trunc() {
    static int mode = -1;
    if (mode < 0) {
        const char *e = getenv("SIMT_TC_ACCUM");
        mode = e && !strcmp(e, "trunc");
    }
    return mode;
}

static float round_toward_zero(double x) {
    float f = (float)x;   // nearest
    if (fabs((double)f) > fabs(x)) f = nextafterf(f, 0.0f);
    return f;
}

// c + sum_k a[k] b[k] (k = 0..n-1, a and b with bf16 values), as the tensor cores accumulate
float simt_tc_dot(float c, const float *a, int as, const float *b, int bs, int n) {
    if (!tc_trunc()) {
        for (int k = 0; k < n; k++) c += a[k * as] * b[k * bs];
        return c;
    }
    for (int k0 = 0; k0 < n; k0 += 8) {
        double t[9];
        int m = 0, emax = INT_MIN;
        t[m++] = c;
        for (int k = k0; k < k0 + 8 && k < n; k++) t[m++] = (double)a[k * as] * b[k * bs];   // exact
        for (int i = 0; i < m; i++)
            if (t[i] != 0) {
                int e;
                frexp(t[i], &e);
                emax = e > emax ? e : emax;
            }
        if (emax == INT_MIN) {
            c = 0;
            continue;
        }
        const double unit = ldexp(1.0, emax - 24);   // fp32's last significand bit at emax
        double sum = 0;
        for (int i = 0; i < m; i++) sum += trunc(t[i] / unit) * unit;   // exact: < 2^29 units
        c = round_toward_zero(sum);
    }
    return c;
}

// ---- mma.sync m16n8k16 bf16 -> fp32
// ----------------------------------------------------------------

struct mma_arg {
    float *c;
    const uint32_t *a;
    uint32_t b0, b1;
};
void mma_op(void *const *args, unsigned mask) {
    if (mask != 0xffffffffu) {
        finding_at(op_lane(0), NULL, "mma.sync needs the whole warp (mask 0x%08x)", mask);
        return;
    }
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        const mma_arg *x = (const mma_arg *)args[l];
        int g = l / 4, t = l % 4;
        for (int h = 0; h < 2; h++) { // the two elements of each register, lower column first
            A[g][2 * t + h] = h ? bf16_hi(x->a[0]) : bf16_lo(x->a[0]);
            A[g + 8][2 * t + h] = h ? bf16_hi(x->a[1]) : bf16_lo(x->a[1]);
            A[g][2 * t + 8 + h] = h ? bf16_hi(x->a[2]) : bf16_lo(x->a[2]);
            A[g + 8][2 * t + 8 + h] = h ? bf16_hi(x->a[3]) : bf16_lo(x->a[3]);
            B[2 * t + h][g] = h ? bf16_hi(x->b0) : bf16_lo(x->b0);
            B[2 * t + 8 + h][g] = h ? bf16_hi(x->b1) : bf16_lo(x->b1);
            C[g][2 * t + h] = x->c[h];
            C[g + 8][2 * t + h] = x->c[2 + h];
        }
    }
    for (int l = 0; l < 32; l++) {
        mma_arg *x = (mma_arg *)args[l];
        int g = l / 4, t = l % 4;
        for (int e = 0; e < 4; e++) {
            int i = g + (e >= 2 ? 8 : 0), j = 2 * t + (e & 1);
            x->c[e] = simt_tc_dot(C[i][j], &A[i][0], 1, &B[0][j], 8, 16);
        }
    }
}
} // namespace

void simt_ldmatrix(uint32_t *r, const void *p, int n, int trans) {
    profile_count(&counters::ldmatrix, 1.0 / 32); // one per warp
    ldsm_arg a = {p, r, n, trans, __builtin_return_address(0)};
    simt_warp_op("ldmatrix", 0xffffffffu, &a, ldsm_op);
}

void simt_mma_m16n8k16_bf16(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    profile_count(&counters::mma, 1.0 / 32); // one per warp: 16 x 8 x 16 multiply-adds
    mma_arg x = {c, a, b0, b1};
    simt_warp_op("mma.sync", 0xffffffffu, &x, mma_op);
}

float simt_ex2_approx_ftz(float x) {
    if (fabsf(x) < FLT_MIN) x = 0; // .ftz: subnormal in, zero out
    float y = exp2f(x);
    return y < FLT_MIN ? 0.0f : y;
}

// ---- nvcuda::wmma
// ---------------------------------------------------------------------------------

namespace {
struct wmma_arg {
    void *frag;
    const void *p;
    unsigned ldm;
    int rows, cols, elem, col_major;
    const void *site;
};
size_t tile_at(const wmma_arg *a, int r, int c) {
    return ((size_t)(a->col_major ? c : r) * a->ldm + (a->col_major ? r : c)) * a->elem;
}
// Lanes must agree on the pointer and stride; lane 0 acts for the warp.
bool agree(void *const *args, unsigned mask, const char *what) {
    const wmma_arg *a0 = (const wmma_arg *)args[0];
    if (mask != 0xffffffffu) {
        finding_at(op_lane(0), a0->site, "%s needs the whole warp (mask 0x%08x)", what, mask);
        return false;
    }
    for (int l = 1; l < 32; l++) {
        const wmma_arg *a = (const wmma_arg *)args[l];
        if (a->p != a0->p || a->ldm != a0->ldm) {
            finding_at(op_lane(l), a->site, "%s: lane %d passes %p, stride %u; lane 0 %p, %u", what,
                       l, a->p, a->ldm, a0->p, a0->ldm);
            return false;
        }
    }
    // the CUDA programming guide's rules for load/store_matrix_sync: a 256-bit aligned pointer,
    // and ldm a multiple of 8 elements for 16-bit types, of 4 for float (16 bytes either way)
    if ((uintptr_t)a0->p % 32) {
        finding_at(op_lane(0), a0->site, "%s pointer %p is not 32-byte aligned", what, a0->p);
        return false;
    }
    if ((size_t)a0->ldm * a0->elem % 16) {
        finding_at(op_lane(0), a0->site, "%s: ldm %u is not a multiple of %d elements (16 bytes)",
                   what, a0->ldm, 16 / a0->elem);
        return false;
    }
    return true;
}
void wmma_load_op(void *const *args, unsigned mask) {
    if (!agree(args, mask, "wmma::load_matrix_sync")) return;
    const wmma_arg *a = (const wmma_arg *)args[0];
    for (int r = 0; r < a->rows; r++)
        for (int c = 0; c < a->cols; c++) {
            const char *src = (const char *)a->p + tile_at(a, r, c);
            check_access(op_lane(0), src, a->elem, 0, a->site);
            memcpy((char *)a->frag + ((size_t)r * a->cols + c) * a->elem, src, a->elem);
        }
    for (int l = 1; l < 32; l++)
        memcpy(((wmma_arg *)args[l])->frag, a->frag, (size_t)a->rows * a->cols * a->elem);
}
void wmma_store_op(void *const *args, unsigned mask) {
    if (!agree(args, mask, "wmma::store_matrix_sync")) return;
    const wmma_arg *a = (const wmma_arg *)args[0];
    for (int r = 0; r < a->rows; r++)
        for (int c = 0; c < a->cols; c++) {
            char *dst = (char *)a->p + tile_at(a, r, c);
            check_access(op_lane(0), dst, 4, 1, a->site);
            memcpy(dst, (const float *)a->frag + (size_t)r * a->cols + c, 4);
        }
}
struct wmma_mma_arg {
    float *d;
    const __nv_bfloat16 *a, *b;
    const float *c;
    int m, n, k;
};
void wmma_mma_op(void *const *args, unsigned mask) {
    if (mask != 0xffffffffu) return;
    const wmma_mma_arg *x = (const wmma_mma_arg *)args[0];
    float d[16 * 16];
    for (int i = 0; i < x->m; i++)
        for (int j = 0; j < x->n; j++) {
            float ra[16], rb[16];
            for (int k = 0; k < x->k; k++)
                ra[k] = __bfloat162float(x->a[i * x->k + k]), rb[k] = __bfloat162float(x->b[k * x->n + j]);
            d[i * x->n + j] = simt_tc_dot(x->c[i * x->n + j], ra, 1, rb, 1, x->k);
        }
    for (int l = 0; l < 32; l++)
        memcpy(((wmma_mma_arg *)args[l])->d, d, (size_t)x->m * x->n * sizeof(float));
}
} // namespace

void nvcuda::wmma::simt_wmma_load(void *frag, const void *p, unsigned ldm, int rows, int cols,
                                  int elem, int col_major) {
    wmma_arg a = {frag, p, ldm, rows, cols, elem, col_major, __builtin_return_address(0)};
    simt_warp_op("wmma::load_matrix_sync", 0xffffffffu, &a, wmma_load_op);
}
void nvcuda::wmma::simt_wmma_store(void *p, const void *frag, unsigned ldm, int rows, int cols,
                                   int col_major) {
    wmma_arg a = {(void *)frag, p, ldm, rows, cols, 4, col_major, __builtin_return_address(0)};
    simt_warp_op("wmma::store_matrix_sync", 0xffffffffu, &a, wmma_store_op);
}
void nvcuda::wmma::simt_wmma_mma(float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *b,
                                 const float *c, int m, int n, int k) {
    wmma_mma_arg x = {d, a, b, c, m, n, k};
    simt_warp_op("wmma::mma_sync", 0xffffffffu, &x, wmma_mma_op);
}
void nvcuda::wmma::simt_wmma_fill(void *frag, const void *value, int n, int elem) {
    for (int i = 0; i < n; i++)
        memcpy((char *)frag + (size_t)i * elem, value, elem);
}
