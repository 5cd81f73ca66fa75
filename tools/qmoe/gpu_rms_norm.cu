#include "gpu_rms_norm.h"

namespace {

constexpr unsigned kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    rms_normalize_kernel(float* x, const uint32_t* rows, uint32_t hidden, size_t ld) {
  if (blockIdx.x >= *rows) return;
  float* row = x + blockIdx.x * ld;
  float sum = 0.0f;
  for (uint32_t i = threadIdx.x; i < hidden; i += kThreads) sum += row[i] * row[i];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
  __shared__ float warp_sums[kThreads / 32];
  __shared__ float scale;
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (unsigned w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    const float mean = total / static_cast<float>(hidden);
    scale = mean > 0.0f && isfinite(mean) ? rsqrtf(mean) : 1.0f;
  }
  __syncthreads();
  for (uint32_t i = threadIdx.x; i < hidden; i += kThreads) row[i] *= scale;
}

}  // namespace

cudaError_t launch_rms_normalize(float* x, const uint32_t* rows, uint32_t max_rows, uint32_t hidden,
                                 size_t ld, cudaStream_t stream) {
  rms_normalize_kernel<<<max_rows, kThreads, 0, stream>>>(x, rows, hidden, ld);
  return cudaGetLastError();
}
