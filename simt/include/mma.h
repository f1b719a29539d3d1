// simt/include/mma.h — nvcuda::wmma for the SIMT emulation build (bf16 and half inputs
// not needed: bf16 x bf16 -> fp32, 16x16x16). A fragment's element layout is opaque in CUDA, so
// here every lane holds the whole tile, row-major; each operation is warp-collective (every lane
// of the warp must reach it with the same pointer and stride; the last to arrive does the work).
#pragma once
#include "../simt.h"
#include "cuda_bf16.h"

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K> struct frag_dims;
template <int M, int N, int K> struct frag_dims<matrix_a, M, N, K> {
    enum { R = M, C = K };
};
template <int M, int N, int K> struct frag_dims<matrix_b, M, N, K> {
    enum { R = K, C = N };
};
template <int M, int N, int K> struct frag_dims<accumulator, M, N, K> {
    enum { R = M, C = N };
};

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    enum { rows = frag_dims<Use, M, N, K>::R, cols = frag_dims<Use, M, N, K>::C };
    static constexpr int num_elements = rows * cols;
    T x[rows * cols]; // (rows, cols) row-major, the same in every lane
};

// runtime.cpp: the collective behind each operation. elem: 2 (bf16) or 4 (fp32) bytes; the tile
// (rows, cols) is read from / written to p with stride ldm, row-major or column-major.
void simt_wmma_load(void *frag, const void *p, unsigned ldm, int rows, int cols, int elem,
                    int col_major);
void simt_wmma_store(void *p, const void *frag, unsigned ldm, int rows, int cols, int col_major);
void simt_wmma_mma(float *d, const __nv_bfloat16 *a, const __nv_bfloat16 *b, const float *c, int m,
                   int n, int k);
void simt_wmma_fill(void *frag, const void *value, int n, int elem);

template <typename Use, int M, int N, int K, typename T, typename L>
static inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, const T *p, unsigned ldm) {
    typedef fragment<Use, M, N, K, T, L> F;
    simt_wmma_load(f.x, p, ldm, F::rows, F::cols, (int)sizeof(T),
                   std::is_same<L, col_major>::value);
}
template <int M, int N, int K>
static inline void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const float *p,
                                    unsigned ldm, layout_t l) {
    simt_wmma_load(f.x, p, ldm, M, N, 4, l == mem_col_major);
}
template <int M, int N, int K>
static inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f,
                                     unsigned ldm, layout_t l) {
    simt_wmma_store(p, f.x, ldm, M, N, l == mem_col_major);
}
template <typename Use, int M, int N, int K, typename T, typename L>
static inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, T v) {
    simt_wmma_fill(f.x, &v, fragment<Use, M, N, K, T, L>::num_elements, (int)sizeof(T));
}
template <int M, int N, int K, typename LA, typename LB>
static inline void mma_sync(fragment<accumulator, M, N, K, float> &d,
                            const fragment<matrix_a, M, N, K, __nv_bfloat16, LA> &a,
                            const fragment<matrix_b, M, N, K, __nv_bfloat16, LB> &b,
                            const fragment<accumulator, M, N, K, float> &c) {
    simt_wmma_mma(d.x, a.x, b.x, c.x, M, N, K);
}
} // namespace wmma
} // namespace nvcuda
