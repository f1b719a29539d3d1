// tests/tool_weights.h — how the test tools keep weights: $SIFT_WEIGHTS = native (default) | f32
// | fast, so the Python tests run every reference check on both modes of the CPU backend (fast:
// for measuring one-digit activations' fidelity, bench/RESULTS.md).
#pragma once
#include <stdlib.h>
#include <string.h>

#include "../backend/backend.h"

static inline enum bk_weights tool_weights(void) {
    const char *v = getenv("SIFT_WEIGHTS");
    return v && strcmp(v, "f32") == 0    ? BK_WEIGHTS_F32
           : v && strcmp(v, "fast") == 0 ? BK_WEIGHTS_FAST
                                         : BK_WEIGHTS_NATIVE;
}
