// policies/specprefill.h — the chunk selection of `specprefill` (specs/specprefill.md step F), a
// pure function on host arrays, exposed for the unit tests. Steps D-E (pooling each head's
// attention and folding it into the max over layers and heads) are the backend ops the strategy
// composes: attn/score.h score_window_pool and score_fold_max are their CPU arithmetic.
#pragma once

// Chunks of `chunk` tokens from 0 (the last may be shorter) scored by the mean of score (m,)
// over their actual length; keeps the top ceil(num_chunks * keep) chunks (ties to the earlier
// chunk) and, when keep_last, the last chunk too. Writes the kept token indices to idx (m,),
// ascending; returns |I|.
int specprefill_select(const float *score, int m, int chunk, float keep, int keep_last, int *idx);
