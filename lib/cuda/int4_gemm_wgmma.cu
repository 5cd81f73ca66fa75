// The wgmma tile of the tensor-core INT4 GEMM (int4_gemm_wgmma_kernel.cuh), for BF16 and FP16 X
// and both fold granularities, and the fast level's scaled weights with BF16 X. Built for sm_90a
// alone (lib/CMakeLists.txt): the launcher calls into this file only on a compute capability 9.0
// device.
//
// Place in the stream: programmatic dependent launch (grid_dependency.cuh's contract, as the
// decode kernels keep it). A CTA lets the next grid launch at once, prefetches into the L2 the
// codes of its W rows over its K slice and their scale and zero-point planes (a hint, never
// stale: the L2 is the point of coherence),
// and then waits for the preceding grid before it reads anything else (the device row count, X,
// the planes) or writes Y; every CTA executes that wait. So a GEMM's start, its barriers and the
// first weights' trip from HBM overlap the preceding kernel's end.
#include "lib/cuda/grid_dependency.cuh"
#include "lib/cuda/int4_gemm_wgmma_kernel.cuh"

namespace qmoe::cuda::tc {
namespace {

// 128 x 64: one MMA warpgroup and the producer, two CTAs a multiprocessor (about 100 KB of
// shared memory each); 128 x 128, 256 x 128 and 128 x 64 split over K: two MMA warpgroups and
// the producer, one CTA (its registers). WgmmaConfig::kConsumerRegisters says how the registers are
// shared.
template <int kTile, XMode kX, uint32_t kFold, bool kScaled>
__global__ void __launch_bounds__(WgmmaConfig<kTile, kX, kFold, kScaled>::kCtaThreads,
                                  WgmmaConfig<kTile, kX, kFold, kScaled>::kCtasPerSm)
    int4_gemm_wgmma_kernel(const __grid_constant__ Params p,
                           const __grid_constant__ CUtensorMap x_map) {
  using C = WgmmaConfig<kTile, kX, kFold, kScaled>;
  extern __shared__ __align__(1024) uint8_t smem[];
  allow_dependent_launch();
  // The CTA's code groups (8 rows each), one bulk L2 prefetch per group by the first threads of
  // the producer warpgroup: chunks [2 kt_begin, 2 kt_end) of each group that holds rows < N, and
  // the group's scales and zero points (all of K: a few KB, and in the grouped order one run).
  // The producer loads the planes into registers only a few k-tiles ahead, which covers an L2
  // hit, not a trip to HBM.
  const uint32_t pt = threadIdx.x - C::kThreads;
  if (threadIdx.x >= C::kThreads && pt < C::kBN / kGroupRows) {
    const uint32_t group = (p.n_base + blockIdx.x * C::kBN) / kGroupRows + pt;
    const KSlice slice = k_slice(p, blockIdx.z);
    const uint32_t chunk_begin = 2 * slice.begin, chunk_end = min(2 * slice.end, p.w.chunks);
    if (group * kGroupRows < p.w.n && chunk_begin < chunk_end) {
      prefetch_l2(p.w.codes + (size_t{group} * p.w.chunks + chunk_begin) * kChunkBytes,
                  size_t{chunk_end - chunk_begin} * kChunkBytes, 0);
      prefetch_group_planes(p.w, group, 0, p.scale_bytes);
    }
  }
  wait_for_preceding_grid();
  // x_map is used in place: the TMA takes the parameter's own address. With a split over K the
  // cluster is (1, 1, k_splits) on a grid of depth k_splits, so blockIdx.z is the CTA's rank.
  run_cta_wgmma<WgmmaConfig<kTile, kX, kFold, kScaled>, kX>(p, &x_map, smem, blockIdx.x, blockIdx.y,
                                                            blockIdx.z, threadIdx.x);
}

template <int kTile, XMode kX, uint32_t kFold, bool kScaled>
cudaError_t launch_one_wgmma(const Params& p, const CUtensorMap& x_map, dim3 grid,
                             cudaStream_t stream) {
  using C = WgmmaConfig<kTile, kX, kFold, kScaled>;
  const auto kernel = int4_gemm_wgmma_kernel<kTile, kX, kFold, kScaled>;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(C::kCtaThreads);
  config.dynamicSmemBytes = C::kSharedBytes;
  config.stream = stream;
  cudaLaunchAttribute cluster{};
  if (p.k_splits > 1) {
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 1;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = p.k_splits;
    config.attrs = &cluster;
    config.numAttrs = 1;
  }
  return launch_with_optional_pdl(config, pdl_enabled(), kernel, p, x_map);  // sm_90 here
}

template <int kTile, XMode kX, bool kScaled>
cudaError_t launch_fold(uint32_t fold, const Params& p, const CUtensorMap& x_map, dim3 grid,
                        cudaStream_t stream) {
  return fold == 16 ? launch_one_wgmma<kTile, kX, 16, kScaled>(p, x_map, grid, stream)
                    : launch_one_wgmma<kTile, kX, 32, kScaled>(p, x_map, grid, stream);
}

template <int kTile>
cudaError_t launch_x(qmoe_dtype x_dtype, uint32_t fold, bool scaled, const Params& p,
                     const CUtensorMap& x_map, dim3 grid, cudaStream_t stream) {
  switch (x_dtype) {
    case QMOE_DTYPE_BF16:
      return scaled ? launch_fold<kTile, XMode::kBf16, true>(fold, p, x_map, grid, stream)
                    : launch_fold<kTile, XMode::kBf16, false>(fold, p, x_map, grid, stream);
    case QMOE_DTYPE_F16:
      if (scaled) break;  // BF16 X only
      return launch_fold<kTile, XMode::kF16, false>(fold, p, x_map, grid, stream);
    case QMOE_DTYPE_F32:
      break;
  }
  return cudaErrorInvalidValue;
}

template <int kTile, XMode kX, uint32_t kFold, bool kScaled = false>
cudaError_t configure_one_wgmma(size_t max_shared_bytes) {
  using C = WgmmaConfig<kTile, kX, kFold, kScaled>;
  if (C::kSharedBytes > max_shared_bytes) return cudaSuccess;  // never launched on this device
  const auto kernel = int4_gemm_wgmma_kernel<kTile, kX, kFold, kScaled>;
  cudaError_t error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(C::kSharedBytes));
  if (error != cudaSuccess) return error;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                              cudaSharedmemCarveoutMaxShared);
}

}  // namespace

cudaError_t launch_wgmma(Int4GemmTcTile tile, qmoe_dtype x_dtype, uint32_t fold, bool scaled,
                         const Params& p, const CUtensorMap& x_map, dim3 grid,
                         cudaStream_t stream) {
  switch (tile) {
    case Int4GemmTcTile::kWgmma128x64:
      return launch_x<static_cast<int>(Int4GemmTcTile::kWgmma128x64)>(x_dtype, fold, scaled, p,
                                                                      x_map, grid, stream);
    case Int4GemmTcTile::kWgmma128x128:
      return launch_x<static_cast<int>(Int4GemmTcTile::kWgmma128x128)>(x_dtype, fold, scaled, p,
                                                                       x_map, grid, stream);
    case Int4GemmTcTile::kWgmma128x64SplitK:
      return launch_x<static_cast<int>(Int4GemmTcTile::kWgmma128x64SplitK)>(x_dtype, fold, scaled,
                                                                            p, x_map, grid, stream);
    case Int4GemmTcTile::kWgmma256x128:  // scaled weights only
      if (!scaled || x_dtype != QMOE_DTYPE_BF16) break;
      return launch_fold<static_cast<int>(Int4GemmTcTile::kWgmma256x128), XMode::kBf16, true>(
          fold, p, x_map, grid, stream);
    default:
      break;
  }
  return cudaErrorInvalidValue;
}

template <int kTile>
cudaError_t configure_tile_wgmma(size_t max_shared_bytes) {
  cudaError_t error = configure_one_wgmma<kTile, XMode::kBf16, 16>(max_shared_bytes);
  if (error == cudaSuccess) error = configure_one_wgmma<kTile, XMode::kBf16, 32>(max_shared_bytes);
  if (error == cudaSuccess) error = configure_one_wgmma<kTile, XMode::kF16, 16>(max_shared_bytes);
  if (error == cudaSuccess) error = configure_one_wgmma<kTile, XMode::kF16, 32>(max_shared_bytes);
  if (error == cudaSuccess) {
    error = configure_one_wgmma<kTile, XMode::kBf16, 16, true>(max_shared_bytes);
  }
  if (error == cudaSuccess) {
    error = configure_one_wgmma<kTile, XMode::kBf16, 32, true>(max_shared_bytes);
  }
  return error;
}

cudaError_t configure_wgmma(size_t max_shared_bytes) {
  cudaError_t error =
      configure_tile_wgmma<static_cast<int>(Int4GemmTcTile::kWgmma128x64)>(max_shared_bytes);
  if (error == cudaSuccess) {
    error = configure_tile_wgmma<static_cast<int>(Int4GemmTcTile::kWgmma128x128)>(max_shared_bytes);
  }
  if (error == cudaSuccess) {
    error = configure_tile_wgmma<static_cast<int>(Int4GemmTcTile::kWgmma128x64SplitK)>(
        max_shared_bytes);
  }
  constexpr int kScaledOnly = static_cast<int>(Int4GemmTcTile::kWgmma256x128);
  if (error == cudaSuccess) {
    error = configure_one_wgmma<kScaledOnly, XMode::kBf16, 16, true>(max_shared_bytes);
  }
  if (error == cudaSuccess) {
    error = configure_one_wgmma<kScaledOnly, XMode::kBf16, 32, true>(max_shared_bytes);
  }
  return error;
}

}  // namespace qmoe::cuda::tc
