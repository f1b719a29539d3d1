// attn/pages.c — see pages.h.
#include "pages.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../util/check.h"

enum kv_type pages_bound_type(enum kv_type kt) { return kt == KV_Q8_0 ? KV_F16 : kt; }

int pages_count(int n, int size) { return n > 0 ? (n + size - 1) / size : 0; }

size_t pages_bytes(enum kv_type kt, int n, int size, int hd) {
    return (size_t)pages_count(n, size) * 2 * kv_row_bytes(pages_bound_type(kt), hd);
}

// The 16-bit neighbour of h towards +inf (up) or -inf, for sign-magnitude bits (f16 and bf16
// alike): NaN stays, an infinity towards zero becomes the largest finite value.
static uint16_t step16(uint16_t h, int up, uint16_t inf) {
    uint16_t mag = h & 0x7fff;
    int neg = h >> 15;
    if (mag > inf) return h;
    if (mag == inf) return (uint16_t)(neg == up ? h - 1 : h);
    if (mag == 0) return up ? 0x0001 : 0x8001;   // +-0 -> the smallest subnormal of that side
    return (uint16_t)(neg == up ? h - 1 : h + 1);
}

void pages_round(enum kv_type t, float x, int up, void *dst) {
    if (t == KV_F32) {
        memcpy(dst, &x, 4);
        return;
    }
    uint16_t h = t == KV_BF16 ? kv_f32_to_bf16(x) : kv_f32_to_f16(x);
    float y;
    kv_row_decode(t, &y, &h, 1);
    if (up ? y < x : y > x) h = step16(h, up, t == KV_BF16 ? 0x7f80 : 0x7c00);
    memcpy(dst, &h, 2);
}

void pages_build_cpu(void *out, const void *k, enum kv_type kt, int n, int size, int hd) {
    enum kv_type bt = pages_bound_type(kt);
    size_t krow = kv_row_bytes(kt, hd), brow = kv_row_bytes(bt, hd);
    float *row = xmalloc((size_t)hd * 3 * sizeof(float)), *lo = row + hd, *hi = lo + hd;
    for (int p = 0, np = pages_count(n, size); p < np; p++) {
        int j0 = p * size, j1 = j0 + size < n ? j0 + size : n;
        for (int c = 0; c < hd; c++) lo[c] = INFINITY, hi[c] = -INFINITY;
        for (int j = j0; j < j1; j++) {
            kv_row_decode(kt, row, (const char *)k + (size_t)j * krow, hd);
            for (int c = 0; c < hd; c++) {
                lo[c] = row[c] < lo[c] ? row[c] : lo[c];
                hi[c] = row[c] > hi[c] ? row[c] : hi[c];
            }
        }
        char *b = (char *)out + (size_t)p * 2 * brow;
        size_t el = bt == KV_F32 ? 4 : 2;
        for (int c = 0; c < hd; c++) {
            pages_round(bt, lo[c], 0, b + c * el);
            pages_round(bt, hi[c], 1, b + brow + c * el);
        }
    }
    free(row);
}
