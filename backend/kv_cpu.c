// backend/kv_cpu.c — the CPU backend's KV cache (append, keep) and the glue to the attention
// kernels of attn/: causal attention, probabilities, selected attention with phi completion.
#include "../attn/attn.h"
#include "../attn/phi.h"
#include "../kv/kv.h"
#include "backend_cpu.h"

// append k, v (n, n_kv_head, hd) to L at L->len
void cpu_kv_append(backend *b, kv_layer *L, const void *k, const void *v, const int *pos, int n) {
    (void)b;
    CHECK_INTERNAL(L->len + n <= L->cap, "KV layer overflow: %d + %d > %d", L->len, n, L->cap);
    int hd = L->head_dim;
    for (int g = 0; g < L->n_kv_head; g++)
        for (int i = 0; i < n; i++) {
            size_t dst = ((size_t)g * L->cap + L->len + i) * hd;
            size_t src = ((size_t)i * L->n_kv_head + g) * hd;
            memcpy((float *)L->k + dst, (const float *)k + src, hd * sizeof(float));
            memcpy((float *)L->v + dst, (const float *)v + src, hd * sizeof(float));
        }
    kv_note_append(L, pos, n);
}

void cpu_attention(backend *b, void *out, const void *q, const int *qpos, int n, int heads,
                   const kv_layer *L) {
    (void)b;
    attn_causal_cpu(out, q, qpos, n, heads, L->k, L->v, L->pos, L->len, L->cap, L->n_kv_head,
                    L->head_dim);
}

// The sequences spread over the threads (each one's attention then runs on one thread: the
// nested parallel region inside is serial), instead of a parallel region per sequence.
void cpu_attention_multi(backend *b, int k, void *const *out, const void *const *q,
                         const int *const *qpos, const int *n, int heads,
                         const kv_layer *const *L) {
#pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < k; i++) cpu_attention(b, out[i], q[i], qpos[i], n[i], heads, L[i]);
}

void cpu_attn_probs(backend *b, float *probs, const void *q, const int *qpos, int n,
                    int heads, const kv_layer *L, int m) {
    (void)b;
    attn_probs_cpu(probs, q, qpos, n, heads, L->k, L->pos, m, L->cap, L->n_kv_head, L->head_dim);
}

// L keeps per KV head g the entries idx[g*k + j], moved into buffers of capacity new_cap
void cpu_kv_keep(backend *b, kv_layer *L, const int *idx, int k, int new_cap) {
    (void)b;
    int hd = L->head_dim, nh = L->n_kv_head;
    size_t n = (size_t)nh * (new_cap > 0 ? new_cap : 1);
    float *nk = xmalloc(n * hd * sizeof(float)), *nv = xmalloc(n * hd * sizeof(float));
    int *np = xmalloc(n * sizeof(int));
    for (int g = 0; g < nh; g++)
        for (int j = 0; j < k; j++) {
            size_t src = (size_t)g * L->cap + idx[g * k + j], dst = (size_t)g * new_cap + j;
            memcpy(nk + dst * hd, (float *)L->k + src * hd, hd * sizeof(float));
            memcpy(nv + dst * hd, (float *)L->v + src * hd, hd * sizeof(float));
            np[dst] = L->pos[src];
        }
    free(L->k);
    free(L->v);
    free(L->pos);
    L->k = nk;
    L->v = nv;
    L->pos = np;
    L->cap = new_cap;
    L->len = k;
}

void cpu_attn_select(backend *b, void *out, const void *q, int heads, const kv_layer *L,
                     const int *sel, int n_sel, int n_sub, const phi_completion *comp) {
    (void)b;
    int hd = L->head_dim, group = heads / L->n_kv_head;
    if (comp && comp->maps) {   // log phi_k of the retrieved keys, once per key per request
#pragma omp parallel for if (L->n_kv_head > 1)
        for (int g = 0; g < L->n_kv_head; g++)
            if (comp->sum[g].n > n_sub)
                for (int h = g * group; h < (g + 1) * group; h++)
                    phi_summary_memo(&comp->sum[g], comp->maps, phi_par_k(comp->maps, comp->layer, g),
                                     (const float *)L->k + (size_t)g * L->cap * hd,
                                     sel + (size_t)h * n_sel, n_sub, hd);
    }
#pragma omp parallel for if (heads > 1)
    for (int h = 0; h < heads; h++) {
        int g = h / group;
        size_t off = (size_t)g * L->cap * hd;
        const phi_maps *p = comp ? comp->maps : NULL;
        phi_attend_head((float *)out + (size_t)h * hd, (const float *)q + (size_t)h * hd,
                        (const float *)L->k + off, (const float *)L->v + off,
                        sel + (size_t)h * n_sel, n_sel, hd, n_sub, p,
                        p ? phi_par_q(p, comp->layer, h) : NULL,
                        p ? phi_par_k(p, comp->layer, g) : NULL, comp ? &comp->sum[g] : NULL);
    }
}

void cpu_phi_summarize(backend *b, phi_summary *out, const phi_maps *p, int layer,
                       const kv_layer *L, int lo, int hi) {
    (void)b;
    int hd = L->head_dim;
#pragma omp parallel for
    for (int g = 0; g < L->n_kv_head; g++) {
        size_t off = ((size_t)g * L->cap + lo) * hd;
        phi_summary_build(&out[g], p, phi_par_k(p, layer, g), (const float *)L->k + off,
                          (const float *)L->v + off, hi - lo, hd, hd);
    }
}
