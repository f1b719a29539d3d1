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
//  - wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 (sm_90a), A from a descriptor or
//    registers, B from a descriptor; see "wgmma" below for the layouts; fence, commit_group,
//    wait_group N;
//  - ex2.approx.ftz.f32.
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

// ---- wgmma.mma_async m64nNk16 bf16 -> fp32 (sm_90a)
// -------------------------------------------------------------
// A warpgroup (4 consecutive warps, warp rank % 4 = w) computes D (64 x N) += A (64 x 16) B (16 x
// N); warp w owns rows 16w .. 16w+15, and its lanes' registers follow the mma.m16n8k16 tables:
//  - D, N/2 fp32 per lane: d[i] = (16w + g + 8 ((i >> 1) & 1), 8 (i >> 2) + 2t + (i & 1));
//  - A from registers, 4 per lane: a0..a3 as mma.m16n8k16's A for the warp's 16 rows.
// An operand in shared memory is named by a 64-bit descriptor: bits 0-13 the start address >> 4,
// 16-29 the leading dimension byte offset (LBO) >> 4, 32-45 the stride dimension byte offset
// (SBO) >> 4, 49-51 the base offset, 62-63 the swizzle mode. Only the canonical layout without
// swizzling (mode 0, base offset 0) is emulated; another is a finding. It is made of "core
// matrices" of 8 rows x 16 bytes stored as 128 contiguous bytes:
//  - K-major (no transpose): element (r, k) of an R x 16 operand (R = 64 for A, N for B) at
//    start + (r / 8) SBO + (k / 8) LBO + (r % 8) 16 + (k % 8) 2 bytes;
//  - MN-major (imm-trans = 1): start + (r / 8) SBO + (k / 8) LBO + (k % 8) 16 + (r % 8) 2.
// (PTX ISA, "Shared Memory Matrix Layout" for wgmma, the no-swizzle canonical layouts
// ((8,m),(T,2)):((1T,SBO),(1,LBO)) and ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)), T = 8 bf16.)
// The product is asynchronous: the emulator computes it when issued but keeps the result from
// the registers (NaN there) until a wait_group completes its group, and reports a shared byte
// it read that changed before then (a GPU may read it at any time in between). Each warp counts
// and race-checks a quarter of B's core matrices (the warpgroup reads B once) and its own A rows,
// a core matrix per 8 lanes (how the tensor cores read shared memory is not documented: this
// models whole 128-byte core matrices as conflict-free wavefronts).
// Not modelled: the wgmma.fence rule (registers written by other instructions since the last
// fence must not feed a wgmma) and the async proxy (shared memory written by ordinary stores or
// cp.async must be published by fence.proxy.async before a wgmma reads it); both fences are
// accepted anywhere.

namespace {
struct wgmma_arg {
    float *d;
    int n, trans_b, acc;
    const uint32_t *a;
    uint64_t da, db;
    const void *site;
};
const unsigned char *desc_elem(uint64_t desc, int r, int k, int mn_major) {
    const uint32_t start = (uint32_t)(desc & 0x3fff) << 4, lbo = (uint32_t)(desc >> 16 & 0x3fff) << 4,
                   sbo = (uint32_t)(desc >> 32 & 0x3fff) << 4;
    uint32_t off = start + (uint32_t)(r / 8) * sbo + (uint32_t)(k / 8) * lbo +
                   (mn_major ? (k % 8) * 16 + (r % 8) * 2 : (r % 8) * 16 + (k % 8) * 2);
    return (const unsigned char *)shared_at(off);
}
// The 16-byte row of the core matrix holding element (r, k), checked: in shared memory, read by
// lane `lane` (race and bounds checks, counted), and remembered for the completion check.
bool desc_row(const wgmma_arg *x, uint64_t desc, int r, int k, int mn_major, int lane,
              std::vector<std::pair<const unsigned char *, std::vector<unsigned char>>> &read) {
    const unsigned char *p = desc_elem(desc, mn_major ? r - r % 8 : r, mn_major ? k : k - k % 8, mn_major);
    if (!p) {
        finding_at(op_lane(lane), x->site,
                   "wgmma descriptor 0x%016llx names shared address %u, outside this block's "
                   "shared memory",
                   (unsigned long long)desc, (unsigned)((desc & 0x3fff) << 4));
        return false;
    }
    check_access(op_lane(lane), p, 16, 0, x->site);
    read.push_back({p, std::vector<unsigned char>(p, p + 16)});
    return true;
}
float bf16_at(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return __uint_as_float((uint32_t)h << 16);
}
bool desc_ok(const wgmma_arg *x, uint64_t desc) {
    if (desc >> 62 || (desc >> 49 & 7)) {
        finding_at(op_lane(0), x->site,
                   "wgmma descriptor 0x%016llx: swizzle mode %d, base offset %d (only the "
                   "no-swizzle canonical layout is emulated)",
                   (unsigned long long)desc, (int)(desc >> 62), (int)(desc >> 49 & 7));
        return false;
    }
    return true;
}
void wgmma_op(void *const *args, unsigned mask) {
    const wgmma_arg *x0 = (const wgmma_arg *)args[0];
    thread_rec *t0 = op_lane(0);
    if (mask != 0xffffffffu) {
        finding_at(t0, x0->site, "wgmma.mma_async needs the whole warp (mask 0x%08x)", mask);
        return;
    }
    const int nthreads = block_threads();
    if (nthreads % 128) {
        finding_at(t0, x0->site, "wgmma.mma_async in a block of %d threads: not whole warpgroups of 128",
                   nthreads);
        return;
    }
    for (int l = 1; l < 32; l++) {
        const wgmma_arg *x = (const wgmma_arg *)args[l];
        if (x->n != x0->n || x->trans_b != x0->trans_b || x->acc != x0->acc || !x->a != !x0->a ||
            x->da != x0->da || x->db != x0->db) {
            finding_at(op_lane(l), x->site, "wgmma.mma_async: lanes disagree on the shape, operands or scale-d");
            return;
        }
    }
    const int n = x0->n, w = warp_index(t0) % 4;
    if ((x0->a == NULL && !desc_ok(x0, x0->da)) || !desc_ok(x0, x0->db)) return;
    std::vector<std::pair<const unsigned char *, std::vector<unsigned char>>> read;
    float A[16][16], B[16][256];
    if (x0->a) {   // registers: mma.m16n8k16's A table
        for (int l = 0; l < 32; l++) {
            const wgmma_arg *x = (const wgmma_arg *)args[l];
            int g = l / 4, t = l % 4;
            for (int h = 0; h < 2; h++) {
                A[g][2 * t + h] = h ? bf16_hi(x->a[0]) : bf16_lo(x->a[0]);
                A[g + 8][2 * t + h] = h ? bf16_hi(x->a[1]) : bf16_lo(x->a[1]);
                A[g][2 * t + 8 + h] = h ? bf16_hi(x->a[2]) : bf16_lo(x->a[2]);
                A[g + 8][2 * t + 8 + h] = h ? bf16_hi(x->a[3]) : bf16_lo(x->a[3]);
            }
        }
    } else {   // this warp's 16 rows, K-major: 32 16-byte rows of core matrices, one per lane
        for (int c = 0; c < 32; c++)
            if (!desc_row(x0, x0->da, 16 * w + c % 16, c / 16 * 8, 0, c, read)) return;
        for (int r = 0; r < 16; r++)
            for (int k = 0; k < 16; k++) A[r][k] = bf16_at(desc_elem(x0->da, 16 * w + r, k, 0));
    }
    // B: N / 4 core matrices of 8 16-byte rows; this warp takes a quarter of them, 8 lanes per
    // core matrix (one 128-byte wavefront each)
    const int rows = 2 * n, per = rows / 4;
    for (int c = w * per; c < (w + 1) * per; c++) {
        const int cm = c / 8, i = c % 8, nb = cm / 2, kb = cm % 2;
        // the row: K-major (n = 8 nb + i, k 8 kb .. + 7); MN-major (n 8 nb .. + 7, k = 8 kb + i)
        const int r = x0->trans_b ? 8 * nb : 8 * nb + i, k = x0->trans_b ? 8 * kb + i : 8 * kb;
        if (!desc_row(x0, x0->db, r, k, x0->trans_b, (c - w * per) % 32, read)) return;
    }
    for (int k = 0; k < 16; k++)   // every element: another warp's quarter may leave shared memory
        for (int c = 0; c < n; c++) {
            const unsigned char *p = desc_elem(x0->db, c, k, x0->trans_b);
            if (!p) {
                finding_at(t0, x0->site,
                           "wgmma descriptor 0x%016llx reaches past this block's shared memory (B "
                           "row %d, column %d)",
                           (unsigned long long)x0->db, k, c);
                return;
            }
            B[k][c] = bf16_at(p);
        }
    for (int l = 0; l < 32; l++) {
        const wgmma_arg *x = (const wgmma_arg *)args[l];
        thread_rec *t = op_lane(l);
        // the accumulator's current value: the latest pending result for these registers
        const float *cur = x->d;
        for (auto &g : wgmma_groups(t))
            for (auto &p : g)
                if (p.d == x->d) cur = p.val.data();
        for (auto &p : wgmma_open(t))
            if (p.d == x->d) cur = p.val.data();
        wgmma_pending p{x->d, std::vector<float>(n / 2), {}, x->site};
        const int g = l / 4, tq = l % 4;
        for (int i = 0; i < n / 2; i++) {
            int r = g + 8 * (i >> 1 & 1), c = 8 * (i >> 2) + 2 * tq + (i & 1);
            p.val[i] = simt_tc_dot(x->acc ? cur[i] : 0.0f, &A[r][0], 1, &B[0][c], 256, 16);
        }
        if (l == 0) p.read = std::move(read);
        for (int i = 0; i < n / 2; i++) x->d[i] = NAN;   // until wait_group
        wgmma_open(t).push_back(std::move(p));
    }
}
} // namespace

void simt::wgmma_complete(thread_rec *t, std::vector<wgmma_pending> &g) {
    for (wgmma_pending &p : g) {
        for (auto &r : p.read)
            if (memcmp(r.first, r.second.data(), 16)) {
                finding_at(t, p.site,
                           "shared memory at %p read by wgmma.mma_async changed before the "
                           "wait_group that completes it",
                           (const void *)r.first);
                break;
            }
        memcpy(p.d, p.val.data(), p.val.size() * sizeof(float));
    }
    g.clear();
}

void simt_wgmma(float *d, int n, const uint32_t *a, uint64_t da, uint64_t db, int trans_b, int acc) {
    profile_count(&counters::mma, n / 8 / 32.0);   // per warp: N/8 m16n8k16's worth
    wgmma_arg x = {d, n, trans_b, acc, a, da, db, __builtin_return_address(0)};
    simt_warp_op("wgmma.mma_async", 0xffffffffu, &x, wgmma_op);
}
void simt_wgmma_fence() {
    self_or_die("wgmma.fence");
}
void simt_wgmma_commit() {
    thread_rec *t = self_or_die("wgmma.commit_group");
    wgmma_groups(t).push_back(std::move(wgmma_open(t)));
    wgmma_open(t).clear();
}
void simt_wgmma_wait(int n) {
    thread_rec *t = self_or_die("wgmma.wait_group");
    auto &g = wgmma_groups(t);
    while ((int)g.size() > n) {
        wgmma_complete(t, g.front());
        g.erase(g.begin());
    }
}
