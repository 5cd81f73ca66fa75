// The standalone offload kernels: their bodies are lib/offload/kernels.h's, over the GPU's Cta
// (offload_cta.cuh says what each memory operation compiles to).
#include "lib/cuda/offload_kernels.cuh"

#include "lib/cuda/grid_dependency.cuh"
#include "lib/cuda/offload_cta.cuh"

namespace qmoe::cuda {
namespace {

__global__ void __launch_bounds__(kOffloadClassifyThreads)
    offload_classify_publish_kernel(const offload::ClassifyArgs args) {
  __shared__ offload::ClassifyShared shared;
  DeviceCta cta;
  offload::classify_publish(cta, shared, args);
}

// Launched with programmatic serialization (launch_offload_wait_accumulate): it lets the next
// kernel in the stream launch at once, so the next layer's FC1 is resident and its
// classify-publish block starts as soon as this grid completes; then every block waits for the
// preceding grid (the layer's FC2, whose completion implies FC1's, and so the classify's
// record) before it reads anything. Without the attribute (before sm_90) both are no-ops.
__global__ void __launch_bounds__(kOffloadWaitThreads)
    offload_wait_accumulate_kernel(const offload::WaitArgs args) {
  allow_dependent_launch();
  wait_for_preceding_grid();
  __shared__ offload::WaitShared shared;
  DeviceCta cta;
  offload::wait_accumulate(cta, shared, args);
}

}  // namespace

uint32_t offload_wait_blocks(uint32_t hidden) {
  const uint32_t blocks = (hidden + kOffloadWaitThreads - 1) / kOffloadWaitThreads;
  return blocks < 1 ? 1 : blocks > 64 ? 64 : blocks;
}

cudaError_t launch_offload_classify_publish(const offload::ClassifyArgs& args,
                                            cudaStream_t stream) {
  offload_classify_publish_kernel<<<1, kOffloadClassifyThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_offload_wait_accumulate(const offload::WaitArgs& args, uint32_t blocks,
                                           cudaStream_t stream) {
  bool pdl = false;
  const cudaError_t e = pdl_on_current_device(&pdl);
  if (e != cudaSuccess) return e;
  return launch_decode_kernel(offload_wait_accumulate_kernel, dim3(blocks),
                              dim3(kOffloadWaitThreads), 0, pdl, args, stream);
}

}  // namespace qmoe::cuda
