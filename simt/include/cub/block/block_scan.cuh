// simt/include/cub/block/block_scan.cuh — cub::BlockScan's ExclusiveSum for the SIMT
// emulation build, written with the block's own barriers: every thread stores its value, thread 0
// writes the prefixes, every thread reads its own. Like cub's, the temporary storage may be
// reused only after a __syncthreads (the race checker sees a reuse that has none).
#pragma once
#include "../../../simt.h"

namespace cub {
template <typename T, int BLOCK_THREADS> class BlockScan {
  public:
    struct TempStorage {
        T in[BLOCK_THREADS], prefix[BLOCK_THREADS], total;
    };
    explicit BlockScan(TempStorage &t) : s(t) {}
    void ExclusiveSum(T input, T &output, T &aggregate) {
        const int tid = (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
        s.in[tid] = input;
        __syncthreads();
        if (tid == 0) {
            T acc = T();
            for (int i = 0; i < BLOCK_THREADS; i++)
                s.prefix[i] = acc, acc = acc + s.in[i];
            s.total = acc;
        }
        __syncthreads();
        output = s.prefix[tid];
        aggregate = s.total;
    }
    void ExclusiveSum(T input, T &output) {
        T aggregate;
        ExclusiveSum(input, output, aggregate);
    }

  private:
    TempStorage &s;
};
} // namespace cub
