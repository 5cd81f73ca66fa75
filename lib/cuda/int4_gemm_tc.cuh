// The prefill dequant-GEMM on tensor cores (sm_80+, mma.sync m16n8k16; on compute capability
// 9.0, the wgmma tiles: int4_gemm_wgmma_kernel.cuh), reading the canonical INT4 codes and scale
// planes in place (docs/formats.md): no repack, no dequantised copy.
//
//   Y[i, n] = sum_k X[i, k] * W[n, k] (+ bias[n])   for i < M, n_begin <= n < n_end,
//   W[n, k] = (code[n, k] - zero_point[n, k / B]) * scale[n, k / B]
//
// Only columns [n_begin, n_end) of rows i < M are written. X and Y are FP32, FP16 or BF16
// (x_dtype, y_dtype; ldx and ldy count elements of those types).
//
// Numerics. (code - zero_point) is a small integer, exact in BF16 and FP16, so the weights enter
// the tensor cores exactly; every quantization block's products are summed in FP32 by the
// tensor cores and the block's scale is applied once, in FP32 (acc = fma(scale, block_sum,
// acc); a 64- or 128-code block is summed as 32-code parts, each folded with the same scale;
// the split-K tiles fold alternate 32-code chunks in two warps and add the two sums at the end).
// The only rounding of an operand is X's own type:
// - X in BF16 or FP16 is used as given (the MMA runs in that type).
// - X in FP32 is split into BF16 hi = rn(x) and lo = rn(x - hi), two MMAs each; hi + lo equals
//   x within 2^-16 |x| (plus 2^-134 absolute below BF16's normal range). |x| must stay below
//   BF16's largest finite value (about 3.39e38): hi would round to infinity.
// Bound, for y_ref computed in FP64 from the X the kernel uses (BF16/FP16 X as given, FP32 X
// as hi + lo), with S = sum_k |x_k w_k| + |bias_n|:
//   |y - y_ref| <= int4_gemm_tc_accumulation_bound(K, B, x_dtype) * S
// which counts each m16n8k16 step as adding its 16 exact products to the running sum with an
// error below 32 * 2^-23 of their magnitudes (the tensor cores align addends to the largest
// exponent and may truncate, in up to four partial sums per step, each normalised), and each
// FP32 fold and the bias add as one rounding; against the exact FP32 X add
// int4_gemm_tc_x_split_bound() * sum_k |x_k w_k|. Products and partial sums below FP32's
// normal range may be flushed to zero by the tensor cores (an absolute error below 2^-126 per
// flushed value). A Y in FP16 or BF16 is then rounded to nearest even (overflow to infinity);
// NaN payloads are not kept.
// Scaled weights (accuracy QMOE_ACCURACY_FAST on a wgmma tile with BF16 X and FP16 scales;
// int4_gemm_tc_scaled_weights). The scale goes into the weight before the MMA, as the usual
// weight-only GEMMs do: each weight enters the tensor cores as the BF16 rn(W[n, k]), rounded
// once (scale_pairs in int4_gemm_wgmma_kernel.cuh), and the tensor cores sum the whole of K in FP32
// with no fold. That removes the fold's FFMAs (64 a thread per fold unit, half the MMAs' time) and
// the waits between the folds and the MMAs. Bound against y_ref from the exact weights:
// int4_gemm_tc_fast_bound(K) * S, that is 2^-8 S (BF16's rounding of each weight) plus 32 * 2^-23
// S per k16 step (the running sum is one of each step's addends): the order of the CPU fast
// level's activation term (at least S / 254), not within it. FP16 scales only: every weight
// then fits BF16's range (|W| <= 15 * 65504; FP16's smallest scale, 2^-24, is normal in BF16)
// and the scale splits exactly into two BF16 parts; with other scales the fast level runs exact
// weights.
// Results are bitwise reproducible: fixed reduction order, no atomics, no dependence on
// timing.
//
// Requirements (violations return cudaErrorInvalidValue and launch nothing): device pointers;
// X 16-byte aligned with rows 16-byte aligned (ldx * element size a multiple of 16) and
// ldx >= K; codes 16-byte aligned (cudaMalloc gives 256); scales aligned to their element size;
// ldy >= n_end; n_begin <= n_end <= N;
// a well-formed matrix (block size 16/32/64/128, K a multiple of it, chunks = ceil(K / 32),
// scales present). Zero points are read as their low 4 bits (docs/formats.md: 0..15). Y must
// not overlap X or the weights. Devices 64 and up are cudaErrorInvalidDevice (the one-time
// setup is kept per device in a fixed table).
//
// Launches are asynchronous on `stream`, allocate nothing, synchronise nothing and can be
// captured in a CUDA graph. The first launch on each device sets the kernels' shared-memory
// limits (cudaFuncSetAttribute, once, under a lock); call prepare_int4_gemm_tc() on the current
// device before capturing a graph to keep that out of the capture.
#ifndef QMOE_LIB_CUDA_INT4_GEMM_TC_CUH_
#define QMOE_LIB_CUDA_INT4_GEMM_TC_CUH_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "lib/cuda/device_quant_matrix.cuh"
#include "qmoe/qmoe.h"

namespace qmoe::cuda {

/// The GEMM above on `stream`; rows M = m. cudaSuccess with nothing launched when m == 0 or
/// n_begin == n_end.
cudaError_t launch_int4_gemm_tc(const DeviceQuantMatrix& w, uint32_t m, qmoe_dtype x_dtype,
                                const void* x, size_t ldx, qmoe_dtype y_dtype, void* y, size_t ldy,
                                uint32_t n_begin, uint32_t n_end, cudaStream_t stream,
                                qmoe_accuracy accuracy = QMOE_ACCURACY_EXACT);

/// The same for a graph captured once for up to m_capacity rows: M = min(*m_device,
/// m_capacity), read by the kernel when it runs (blocks past M exit at once). The grid and the
/// tile are chosen for m_capacity; X and Y must be valid for m_capacity rows.
cudaError_t launch_int4_gemm_tc_device_m(const DeviceQuantMatrix& w, uint32_t m_capacity,
                                         const uint32_t* m_device, qmoe_dtype x_dtype,
                                         const void* x, size_t ldx, qmoe_dtype y_dtype, void* y,
                                         size_t ldy, uint32_t n_begin, uint32_t n_end,
                                         cudaStream_t stream,
                                         qmoe_accuracy accuracy = QMOE_ACCURACY_EXACT);

/// One-time setup of the current device (shared-memory limits of every kernel that fits it);
/// idempotent and thread-safe. The launchers call it themselves.
cudaError_t prepare_int4_gemm_tc();

/// CTA tiles (rows of X by rows of W). The first four run mma.sync (sm_80+) and are made of
/// 64 x 32 warp tiles; all but 128x128 give each warp tile two warps, one per half of every
/// 64-code k-tile. The kWgmma tiles run Hopper's warpgroup MMA (int4_gemm_wgmma_kernel.cuh),
/// one warpgroup per 64 rows of W (kWgmma128x64SplitK: two warpgroups on the same 64 rows, one
/// per 32-code half of every k-tile; kWgmma256x128: 256 rows of X, the fast level only): compute
/// capability 9.0 only, a build with sm_90 among its architectures, 16-bit X only
/// (int4_gemm_tc_tile_available).
enum class Int4GemmTcTile : int {
  k128x128 = 0,
  k64x128 = 1,
  k64x96 = 2,
  k64x64 = 3,
  kWgmma128x64 = 4,
  kWgmma128x128 = 5,
  kWgmma128x64SplitK = 6,
  kWgmma256x128 = 7
};
constexpr int kInt4GemmTcTileCount = 8;

/// Whether a tile runs on Hopper's warpgroup MMA.
constexpr bool int4_gemm_tc_tile_is_wgmma(Int4GemmTcTile tile) {
  return static_cast<int>(tile) >= static_cast<int>(Int4GemmTcTile::kWgmma128x64);
}

/// Whether a tile runs the fast level's scaled weights only (int4_gemm_tc_scaled_weights):
/// kWgmma256x128, whose 128 accumulators a thread leave no registers for the exact level's
/// partial sums. Launched otherwise, it is cudaErrorInvalidValue.
constexpr bool int4_gemm_tc_tile_scaled_only(Int4GemmTcTile tile) {
  return tile == Int4GemmTcTile::kWgmma256x128;
}

/// Whether `tile` runs with this X type on the current device (false also when the device
/// cannot be queried).
bool int4_gemm_tc_tile_available(Int4GemmTcTile tile, qmoe_dtype x_dtype);

/// Rows of X, rows of W and threads of a tile's CTA.
struct Int4GemmTcTileShape {
  uint32_t rows_m, rows_n, threads;
};
Int4GemmTcTileShape int4_gemm_tc_tile_shape(Int4GemmTcTile tile);

/// Dynamic shared memory of a tile's kernel for this X type and block size (0 for an unknown
/// dtype).
size_t int4_gemm_tc_shared_bytes(Int4GemmTcTile tile, qmoe_dtype x_dtype, uint32_t block_size);

/// The tile the launchers pick for m rows, columns [n_begin, n_end) and depth k on a device
/// with `sm_count` multiprocessors and `max_shared_bytes` of opt-in shared memory per block, and
/// its split over K (k_splits, if not null: 1 unless a wgmma tile is split across a cluster);
/// `wgmma`: whether the kWgmma tiles run on that device (16-bit X only either way);
/// `scaled_weights`: whether a wgmma tile would run them (int4_gemm_tc_scaled_level), which
/// makes the tiles that run nothing else candidates. Where the wgmma tiles run, one of them by a
/// model of the H200's measurements; elsewhere the mma.sync tile with the least work on the
/// busiest warp scheduler, at the rate its resident warps sustain (both models are in
/// int4_gemm_tc.cu). Returns false when no tile fits the shared memory.
bool choose_int4_gemm_tc_tile(uint32_t m, uint32_t n_begin, uint32_t n_end, uint32_t k,
                              int sm_count, size_t max_shared_bytes, qmoe_dtype x_dtype,
                              uint32_t block_size, Int4GemmTcTile* tile, bool wgmma = false,
                              uint32_t* k_splits = nullptr, bool scaled_weights = false);

/// How many CTAs of a cluster split K for each output tile of a launch of the tile given (the
/// model of choose_int4_gemm_tc_tile): 1, 2, 4 or 8 for kWgmma128x64, so that a grid that would
/// leave multiprocessors idle, or a last wave short, has more, shorter CTAs; 1 for the others.
uint32_t choose_int4_gemm_tc_k_splits(Int4GemmTcTile tile, uint32_t m, uint32_t n_begin,
                                      uint32_t n_end, uint32_t k, int sm_count);

/// Either launcher with the tile given instead of chosen (tests, benchmarks); m_device may be
/// nullptr (then M = m); k_splits 0 for the launcher's choice, else 1 .. 8 on a wgmma tile (at
/// most the 64-code k-tiles) and 1 on the others. cudaErrorInvalidValue if the tile's shared
/// memory exceeds the device's limit, the tile does not run on this device with this X, it runs
/// scaled weights only and the launch would not (int4_gemm_tc_tile_scaled_only), or k_splits is
/// out of range.
cudaError_t launch_int4_gemm_tc_tile(Int4GemmTcTile tile, const DeviceQuantMatrix& w, uint32_t m,
                                     const uint32_t* m_device, qmoe_dtype x_dtype, const void* x,
                                     size_t ldx, qmoe_dtype y_dtype, void* y, size_t ldy,
                                     uint32_t n_begin, uint32_t n_end, cudaStream_t stream,
                                     qmoe_accuracy accuracy = QMOE_ACCURACY_EXACT,
                                     uint32_t k_splits = 0);

/// The relative bound above: (32 * steps + K / F + 2) * 2^-23, where F = 16 for block size 16
/// and 32 otherwise (the FP32 fold granularity) and steps = F / 16 MMAs per fold, twice that
/// for FP32 X.
double int4_gemm_tc_accumulation_bound(uint32_t k, uint32_t block_size, qmoe_dtype x_dtype);

/// 2^-16 for FP32 X (the hi + lo split), 0 for BF16 and FP16 X.
double int4_gemm_tc_x_split_bound(qmoe_dtype x_dtype);

/// Whether a launch at this level, X type and scale type runs scaled weights on whichever wgmma
/// tile it takes: the fast level, BF16 X and FP16 scales.
constexpr bool int4_gemm_tc_scaled_level(qmoe_accuracy accuracy, qmoe_dtype x_dtype,
                                         qmoe_dtype scale_dtype) {
  return accuracy == QMOE_ACCURACY_FAST && x_dtype == QMOE_DTYPE_BF16 &&
         scale_dtype == QMOE_DTYPE_F16;
}

/// Whether a launch runs scaled weights ("Scaled weights" above): a wgmma tile at a scaled level
/// (int4_gemm_tc_scaled_level).
constexpr bool int4_gemm_tc_scaled_weights(Int4GemmTcTile tile, qmoe_accuracy accuracy,
                                           qmoe_dtype x_dtype, qmoe_dtype scale_dtype) {
  return int4_gemm_tc_tile_is_wgmma(tile) &&
         int4_gemm_tc_scaled_level(accuracy, x_dtype, scale_dtype);
}

/// Scaled weights, against y_ref computed from the BF16 weights the kernel uses
/// (rn(W[n, k]) each): (32 * ceil(K / 16) + 2) * 2^-23.
double int4_gemm_tc_scaled_accumulation_bound(uint32_t k);

/// The relative error of a scaled weight against the exact one: 2^-8 (one rounding to BF16,
/// whose significand has 8 bits).
constexpr double kInt4GemmTcScaledWeightBound = 0x1p-8;

/// The fast level's bound where weights are scaled, against the exact weights' y_ref:
/// w + acc * (1 + w), w = kInt4GemmTcScaledWeightBound, acc =
/// int4_gemm_tc_scaled_accumulation_bound(K). Where they are not, the fast level meets the exact
/// bound, which is below this one.
double int4_gemm_tc_fast_bound(uint32_t k);

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_INT4_GEMM_TC_CUH_
