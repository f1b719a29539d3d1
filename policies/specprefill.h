// policies/specprefill.h — the token-importance arithmetic of `specprefill` (specs/specprefill.md
// steps D-F), pure functions on host arrays, exposed for the unit tests.
#pragma once

// Folds one speculator query row's attention at one layer into s_j: each head's probabilities
// probs (heads, m) over the m context keys are average-pooled (kernel pool, zero padding, always
// divided by pool), then row_max[i] = max(row_max[i], pooled[h][i]) over the heads.
void specprefill_fold_row(const float *probs, int heads, int m, int pool, float *row_max);

// Chunks of `chunk` tokens from 0 (the last may be shorter) scored by the mean of score (m,)
// over their actual length; keeps the top ceil(num_chunks * keep) chunks (ties to the earlier
// chunk) and, when keep_last, the last chunk too. Writes the kept token indices to idx (m,),
// ascending; returns |I|.
int specprefill_select(const float *score, int m, int chunk, float keep, int keep_last, int *idx);
