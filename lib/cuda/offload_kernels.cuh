// The offload kernels (bodies in lib/offload/kernels.h, shared with the host emulation the
// tests run): classify-publish, one block per layer call, and wait-accumulate, a block per
// slice of the hidden columns. Both take only pointers and sizes as arguments, so a captured
// graph replays them with whatever the memory they point at holds then.
#ifndef QMOE_LIB_CUDA_OFFLOAD_KERNELS_CUH_
#define QMOE_LIB_CUDA_OFFLOAD_KERNELS_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "lib/offload/kernels.h"

namespace qmoe::cuda {

/// Threads of a classify-publish block and of a wait-accumulate block.
constexpr uint32_t kOffloadClassifyThreads = 256;
constexpr uint32_t kOffloadWaitThreads = 256;

/// Blocks of a wait-accumulate launch for H columns: one per 256 columns, 1 to 64. More blocks
/// put more of the result's PCIe reads in flight at once (each is a round trip).
uint32_t offload_wait_blocks(uint32_t hidden);

cudaError_t launch_offload_classify_publish(const offload::ClassifyArgs& args, cudaStream_t stream);
cudaError_t launch_offload_wait_accumulate(const offload::WaitArgs& args, uint32_t blocks,
                                           cudaStream_t stream);

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_OFFLOAD_KERNELS_CUH_
