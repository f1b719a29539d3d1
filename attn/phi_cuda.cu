// attn/phi_cuda.cu — selected decode attention completed by a phi summary, on the GPU; the CPU
// twins are in attn/phi_cpu.c and read the same way (specs/topk-phi.md). One block per row (features), per (feature, KV head)
// (summary) and per query head (selected attention). Correct first: fp32 throughout, simple
// loops; a decode step's work here is small next to reading the weights.
#include "../util/cuda_util.cuh"
extern "C" {
#include "phi.h"
}
#include "phi_cuda.h"

#define PHI_THREADS 256

__device__ static float phi_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678f)); }

// y (o,) = W (o, i) x (i,) + b (o,)  (b may be NULL); threads stride over outputs; x in shared
__device__ static void phi_affine(float *y, const float *w, const float *b, const float *x, int o,
                                  int i) {
    for (int r = threadIdx.x; r < o; r += blockDim.x) {
        const float *wr = w + (size_t)r * i;
        float acc = b ? b[r] : 0.0f;
        for (int j = 0; j < i; j++) acc += wr[j] * x[j];
        y[r] = acc;
    }
    __syncthreads();
}

// grid n, block PHI_THREADS, shared (d_in + 2 d_emb + d_hid) floats.
// out (n, d_phi) = log phi(x_r), phi_log_features' math.
// Rows without arrays (phi_rows): rows NULL and idx NULL, row r and block r (each query head's
// own query); idx (heads, kk), row r = head h = r / kk's KV head g = h / group, entry idx[r] of
// it (g * cap + idx[r]) and block g (the retrieved keys of a device selection).
typedef struct {
    const int *rows, *par_of, *idx;
    int kk, group, cap;
} phi_rows;

__device__ static void phi_row_of(const phi_rows &w, int r, int *row, int *block) {
    if (w.rows) *row = w.rows[r], *block = w.par_of[r];
    else if (w.idx) {
        int g = r / w.kk / w.group;
        *row = g * w.cap + w.idx[r], *block = g;
    } else *row = *block = r;
}

__global__ void phi_features_kernel(float *out, const bf16 *x, phi_rows w, const float *par,
                                    phi_cuda_shape s) {
    SHARED_DYNAMIC(float, sh);
    int d = s.d_in, e = s.d_emb, h = s.d_hid, f = s.d_phi, row, block;
    phi_row_of(w, blockIdx.x, &row, &block);
    const bf16 *xr = x + (size_t)row * d;
    const float *p = par + (size_t)block * s.n_par;
    float *o = out + (size_t)blockIdx.x * f, *xs = sh;
    for (int j = threadIdx.x; j < d; j += blockDim.x) xs[j] = __bfloat162float(xr[j]);
    __syncthreads();
    if (s.kind == PHI_PRF) {   // x~ = x / d^(1/4): w x~ - |x~|^2 / 2 - log(f) / 2
        float sc = 1.0f / sqrtf(sqrtf((float)d)), nrm = 0;
        for (int j = 0; j < d; j++) nrm += (xs[j] * sc) * (xs[j] * sc);
        phi_affine(o, p, NULL, xs, f, d);
        for (int r = threadIdx.x; r < f; r += blockDim.x) o[r] = o[r] * sc - 0.5f * nrm - 0.5f * logf((float)f);
        return;
    }
    const float *ws = p, *bs = ws + e * d, *w1 = bs + e, *b1 = w1 + h * e, *w2 = b1 + h;
    const float *b2 = w2 + e * h, *alpha = b2 + e, *wo = alpha + 1, *bo = wo + f * e;
    float *g0 = xs + d, *a = g0 + e, *g1 = a + h;
    phi_affine(g0, ws, bs, xs, e, d);   // g0 = Ws x + bs
    phi_affine(a, w1, b1, g0, h, e);
    for (int j = threadIdx.x; j < h; j += blockDim.x) a[j] = phi_gelu(a[j]);
    __syncthreads();
    phi_affine(g1, w2, b2, a, e, h);    // D = W2 gelu(W1 g0 + b1) + b2
    for (int j = threadIdx.x; j < e; j += blockDim.x) g1[j] = g0[j] + *alpha * g1[j];
    __syncthreads();
    phi_affine(o, wo, bo, g1, f, e);    // log phi = Wo g1 + bo
}

static void features(float *out, const void *x, phi_rows w, int n, const float *par,
                     phi_cuda_shape s, cudaStream_t stream) {
    if (n == 0) return;
    size_t shared = (size_t)(s.d_in + 2 * s.d_emb + s.d_hid) * sizeof(float);
    CUDA_LAUNCH(phi_features_kernel, n, PHI_THREADS, shared, stream, out, (const bf16 *)x, w, par, s);
}

void phi_features_cuda(float *out, const void *x, const int *rows, const int *par_of, int n,
                       const float *par, phi_cuda_shape s, cudaStream_t stream) {
    features(out, x, phi_rows{rows, par_of, NULL, 0, 0, 0}, n, par, s, stream);
}

void phi_features_sel_cuda(float *out, const void *x, const int *idx, int heads, int kk, int group,
                           int cap, const float *par, phi_cuda_shape s, cudaStream_t stream) {
    if (idx) features(out, x, phi_rows{NULL, NULL, idx, kk, group, cap}, heads * kk, par, s, stream);
    else features(out, x, phi_rows{NULL, NULL, NULL, 0, 0, 0}, heads, par, s, stream);
}

// grid (d_phi, n_kv), block PHI_THREADS, shared (32 + PHI_THREADS) floats; hd <= PHI_THREADS.
// Threads stride over entries for m and u; for t they split into PHI_THREADS / hd groups of hd
// lanes (lane j = column j), each group summing every groups-th entry, then the groups add up.
__global__ void phi_summary_kernel(float *m, float *u, float *t, const float *F, const bf16 *v,
                                   int n, int cap, int lo, int hd, int d_phi) {
    __shared__ float red[32];
    SHARED_DYNAMIC(float, part); // (groups, hd)
    int f = blockIdx.x, g = blockIdx.y;
    const float *Fg = F + (size_t)g * n * d_phi;
    const bf16 *vg = v + ((size_t)g * cap + lo) * hd;
    float mx = -INFINITY, z = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, Fg[(size_t)i * d_phi + f]);
    mx = block_reduce(mx, red, 1);
    for (int i = threadIdx.x; i < n; i += blockDim.x) z += expf(Fg[(size_t)i * d_phi + f] - mx);
    z = block_reduce(z, red, 0);
    int groups = blockDim.x / hd, grp = threadIdx.x / hd, j = threadIdx.x % hd;
    if (grp < groups) {
        float acc = 0;
        for (int i = grp; i < n; i += groups) acc += expf(Fg[(size_t)i * d_phi + f] - mx) * __bfloat162float(vg[(size_t)i * hd + j]);
        part[grp * hd + j] = acc;
    }
    __syncthreads();
    size_t at = (size_t)g * d_phi + f;
    if ((int)threadIdx.x < hd) {
        float acc = 0;
        for (int q = 0; q < groups; q++) acc += part[q * hd + threadIdx.x];
        t[at * hd + threadIdx.x] = acc;
    }
    if (threadIdx.x == 0) m[at] = mx, u[at] = z;
}

void phi_summary_cuda(float *m, float *u, float *t, const float *F, const void *v, int n_kv,
                      int n, int cap, int lo, int hd, int d_phi, cudaStream_t stream) {
    if (n == 0) return;
    size_t shared = (size_t)PHI_THREADS * sizeof(float);
    CUDA_LAUNCH(phi_summary_kernel, dim3(d_phi, n_kv), PHI_THREADS, shared, stream, m, u, t, F,
                (const bf16 *)v, n, cap, lo, hd, d_phi);
}

// The selected entries of query head h: a list sel (heads, n_sel) (attn_select), or topk's
// step with the anchors implicit (attn_topk_step): idx[h * kk .. + kk), then [0, sink), then
// [sink + n, len), len = *dlen in a bound step (read at replay).
struct sel_list {
    const int *sel;
    int n_sel;
    __device__ int count() const { return n_sel; }
    __device__ int at(int h, int i) const { return sel[(size_t)h * n_sel + i]; }
};
struct sel_topk {
    const int *idx;
    int kk, sink, n, len;
    const int *dlen;
    __device__ int count() const { return kk + (dlen ? *dlen : len) - n; }
    __device__ int at(int h, int i) const {
        return i < kk ? idx[(size_t)h * kk + i] : i - kk < sink ? i - kk : i - kk + n;
    }
};

// grid heads, block PHI_THREADS, shared (2 hd + 2 d_phi) floats. phi_attend_head's math:
// exact part over the selection (scores in work, ld floats a head), then, with lq, the
// completion from the summary minus the first n_sub selected entries, merged by one
// normalisation in the log domain.
template <class S>
__global__ void phi_select_kernel(bf16 *out, const bf16 *q, const bf16 *k, const bf16 *v, int cap,
                                  int heads, int n_kv, int hd, S sel, int n_sub, const float *lq,
                                  float *fsel, const float *m, const float *u, const float *t,
                                  int d_phi, int n_region, float *work, size_t ld) {
    __shared__ float red[32];
    SHARED_DYNAMIC(float, sh);
    int h = blockIdx.x, g = h / (heads / n_kv), n_sel = sel.count();
    const bf16 *kg = k + (size_t)g * cap * hd, *vg = v + (size_t)g * cap * hd;
    float *sc = work + (size_t)h * ld, *qs = sh, *ye = qs + hd, *ur = ye + hd, *a = ur + d_phi;
    for (int j = threadIdx.x; j < hd; j += blockDim.x) qs[j] = __bfloat162float(q[(size_t)h * hd + j]);
    __syncthreads();
    float scale = 1.0f / sqrtf((float)hd), mx = -INFINITY, z = 0, mn = INFINITY;
    for (int i = threadIdx.x; i < n_sel; i += blockDim.x) {   // q (hd,) . K (n_sel rows) -> sc
        const bf16 *ki = kg + (size_t)sel.at(h, i) * hd;
        float dot = 0;
        for (int j = 0; j < hd; j++) dot += qs[j] * __bfloat162float(ki[j]);
        sc[i] = dot * scale;
        mx = fmaxf(mx, sc[i]);
        if (i < n_sub) mn = fminf(mn, sc[i]);   // the lowest retrieved score (the top-K bound)
    }
    mx = block_reduce(mx, red, 1);
    mn = -block_reduce(-mn, red, 1);
    for (int i = threadIdx.x; i < n_sel; i += blockDim.x) z += (sc[i] = expf(sc[i] - mx));
    z = block_reduce(z, red, 0);   // its barrier also publishes sc to the block
    for (int j = threadIdx.x; j < hd; j += blockDim.x) {   // softmax (n_sel,) @ V -> y_E
        float acc = 0;
        for (int i = 0; i < n_sel; i++) acc += sc[i] * __bfloat162float(vg[(size_t)sel.at(h, i) * hd + j]);
        ye[j] = n_sel > 0 ? acc / z : 0.0f;
    }
    float lze = n_sel > 0 ? mx + logf(z) : -INFINITY;
    if (!lq) {   // selection only, renormalised
        for (int j = threadIdx.x; j < hd; j += blockDim.x) out[(size_t)h * hd + j] = __float2bfloat16(ye[j]);
        return;
    }
    const float *mg = m + (size_t)g * d_phi, *ug = u + (size_t)g * d_phi, *tg = t + (size_t)g * d_phi * hd;
    float *E = fsel + (size_t)h * n_sub * d_phi;   // exp(log phi_k(k_i) - m) of the retrieved
    for (int x = threadIdx.x; x < n_sub * d_phi; x += blockDim.x) E[x] = expf(E[x] - mg[x % d_phi]);
    __syncthreads();
    float amax = -INFINITY, za = 0;
    for (int f = threadIdx.x; f < d_phi; f += blockDim.x) {   // u~_R, a_f = log phi_q + m + log u~_R
        float uk = 0;
        for (int i = 0; i < n_sub; i++) uk += E[(size_t)i * d_phi + f];
        ur[f] = fmaxf(ug[f] - uk, PHI_EPS);
        a[f] = lq[(size_t)h * d_phi + f] + mg[f] + logf(ur[f]);
        amax = fmaxf(amax, a[f]);
    }
    amax = block_reduce(amax, red, 1);
    for (int f = threadIdx.x; f < d_phi; f += blockDim.x) za += expf(a[f] - amax);
    za = block_reduce(za, red, 0);
    float lzr = amax + logf(za);
    if (n_sub > 0) lzr = fminf(lzr, logf((float)(n_region - n_sub)) + mn);   // Z_R <= (n - K) e^smin
    float mxx = fmaxf(lze, lzr);
    float we = n_sel > 0 ? expf(lze - mxx) : 0.0f, wr = expf(lzr - mxx);
    // y^_R = softmax_f(a) @ (T~_R / u~_R) as completion_part reassociates it: with
    // c_f = exp(a_f - amax) / u~_R[f] (into a) and d_i = sum_f c_f E_if (into sc, free since y_E),
    // za y^_R = sum_f c_f T~_M[f] - sum_i d_i v_i
    for (int f = threadIdx.x; f < d_phi; f += blockDim.x) a[f] = expf(a[f] - amax) / ur[f];
    __syncthreads();
    for (int i = threadIdx.x; i < n_sub; i += blockDim.x) {
        float di = 0;
        for (int f = 0; f < d_phi; f++) di += a[f] * E[(size_t)i * d_phi + f];
        sc[i] = di;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < hd; j += blockDim.x) {
        float acc = 0;
        for (int f = 0; f < d_phi; f++) acc += a[f] * tg[(size_t)f * hd + j];
        for (int i = 0; i < n_sub; i++) acc -= sc[i] * __bfloat162float(vg[(size_t)sel.at(h, i) * hd + j]);
        out[(size_t)h * hd + j] = __float2bfloat16((we * ye[j] + wr * acc / za) / (we + wr));
    }
}

void phi_select_cuda(void *out, const void *q, const void *k, const void *v, int cap, int heads,
                     int n_kv, int hd, const int *sel, int n_sel, int n_sub, const float *lq,
                     float *fsel, const float *m, const float *u, const float *t, int d_phi,
                     int n_region, float *work, cudaStream_t stream) {
    size_t shared = (size_t)(2 * hd + 2 * (lq ? d_phi : 0)) * sizeof(float);
    CUDA_LAUNCH(phi_select_kernel<sel_list>, heads, PHI_THREADS, shared, stream, (bf16 *)out,
                (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, cap, heads, n_kv, hd,
                sel_list{sel, n_sel}, n_sub, lq, fsel, m, u, t, d_phi, n_region, work, (size_t)n_sel);
}

void topk_attend_cuda(void *out, const void *q, const void *k, const void *v, int cap, int heads,
                      int n_kv, int hd, const int *idx, int kk, int sink, int n, int len,
                      const int *dlen, const float *lq, float *fsel, const float *m, const float *u,
                      const float *t, int d_phi, float *work, size_t ld, cudaStream_t stream) {
    size_t shared = (size_t)(2 * hd + 2 * (lq ? d_phi : 0)) * sizeof(float);
    CUDA_LAUNCH(phi_select_kernel<sel_topk>, heads, PHI_THREADS, shared, stream, (bf16 *)out,
                (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, cap, heads, n_kv, hd,
                sel_topk{idx, kk, sink, n, len, dlen}, kk, lq, fsel, m, u, t, d_phi, n, work, ld);
}
