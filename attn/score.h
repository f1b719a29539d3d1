// attn/score.h — token-score arithmetic on host arrays, for strategies that select tokens:
// pooling along the sequence and top-k selection. Mechanisms only; policies/ decides how to use
// them.
#pragma once

// out[j] = max of s[t] over t in [j - kernel/2, j + kernel/2] ∩ [0, n)  (padding ignored)
void score_maxpool(const float *s, int n, int kernel, float *out);
// out[j] = (sum of s[t] over t in [j - kernel/2, j + kernel/2] ∩ [0, n)) / kernel
// (zero padding, the count always includes the padding)
void score_avgpool(const float *s, int n, int kernel, float *out);
// idx (k,) = indices of the k largest s[0..n), ties to the lower index, sorted ascending.
// k is clamped to [0, n]; returns the count written.
int score_topk(const float *s, int n, int k, int *idx);
