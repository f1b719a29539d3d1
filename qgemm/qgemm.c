// qgemm/qgemm.c — q_matmul: a product on quantised weights by the path the caller names (qgemm.h),
// handed to the file that implements it: the row kernels and sgemm tiles (qgemm_cpu.c's drivers),
// AMX tiles (qgemm_amx.c), the VNNI GEMMs (qgemm_vnni.c). Those three share the activation digits
// and 8-bit weight forms (qgemm_forms.c) and the scratch (qgemm_cpu.c); none of them calls back here.
#include "qgemm.h"

#include "../util/check.h"
#include "../weights/gguf.h"

void q_matmul(enum q_isa isa, enum q_path path, float *out, const float *x, int n, int in,
              uint32_t type, const void *w, size_t row_bytes, int o, q_scratch *scratch) {
    const int float16 = type == GGML_F16 || type == GGML_BF16;
    CHECK_INTERNAL(q_type_supported(type) && (float16 || in % 32 == 0), "q_matmul: type %s, %d columns",
                   gguf_type_name(type), in);
    if (n <= 0 || o <= 0) return;
    if (path == Q_PATH_VNNI || path == Q_PATH_VNNI8) {
        if (isa == Q_ISA_AVX512 && q_vnni_supported(type)) {
            q_matmul_vnni(out, x, n, in, type, w, row_bytes, o, path == Q_PATH_VNNI8 ? 1 : 2, scratch);
            return;
        }
        path = Q_PATH_SGEMM;
    }
    if (path == Q_PATH_AMX) q_matmul_amx(out, x, n, in, type, w, row_bytes, o, scratch);
    else q_matmul_cpu(isa, path, out, x, n, in, type, w, row_bytes, o, scratch);
}
