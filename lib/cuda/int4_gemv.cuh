// The dequant GEMV for decode (M <= 8 activation rows) on the canonical layout, read in place:
// INT4, INT3, MXFP4 or NVFP4 weights (the description's format picks the kernel's compiled
// variant, lib/cuda/decode_formats.cuh; INT3's codes are rebuilt into INT4's in int3_tile.cuh,
// the E2M1 arithmetic is in e2m1_tile.cuh, and docs/formats.md has both).
//
//   Y[i, n] = sum_k X[i, k] * W[n, k] (+ bias[n])   for i < m, n_begin <= n < n_end
//
// with X and Y in FP32, FP16 or BF16 (rows ldx and ldy elements apart), FP32 accumulation, and
// the two accuracy levels of the CPU kernels (docs/formats.md):
//   exact: X widened to FP32; per chunk and block, sum_k x_k * (code_k - z) in FP32, times the
//          block's scale; within 1e-5 of an FP64 reference relative to sum_k |x_k w_k|.
//   fast:  X quantized to int8 per 32 k exactly as quantize_activations_q8 (inside each block,
//          into shared memory: no pre-kernel and no scratch), integer dot products (dp4a), the
//          zero point folded with the chunk's sum of q, acc += (dot - z sum_q) (scale x_scale).
// INT3 takes INT4's levels (zero point 4 by default). For MXFP4 and NVFP4 the same levels as the
// CPU's E2M1 kernels (no zero points; the output is
// the sum times the global scale, and times 1/2 at the fast level for the doubled codes).
// Only columns [n_begin, n_end) of each Y row are written.
//
// Work split. A block is 256 threads (8 warps). A warp computes one 8-row group against all m
// rows over a share of K: lane l reads row l % 8 of chunk 4q + l / 8 for its quads q (so one
// warp-wide 16-byte load is 512 contiguous bytes), with two batches of loads in flight
// (int4_tile.cuh); `k_warps` warps split a group's quads (interleaved: warp s of the group takes
// quads s, s + k_warps, ...), so 8 / k_warps groups run side by side, and a block does `rounds`
// such steps. Rounds are dealt round-major: round t of block b takes the groups after those of
// rounds < t of every block, so a last partial round lands on the first blocks, spread over the
// SMs. The launcher sizes the grid to one resident wave at two blocks per SM (64 registers a
// thread; half of what fits, leaving room for the next kernel's blocks), so X is staged (and at
// the fast level quantized) once per block, about 2 x SMs times a call, and picks k_warps for the
// fewest memory latencies a warp waits through in sequence. X is staged in shared memory per tile
// of `tile_chunks` chunks of K (all of K when it fits: K <= 2880 at the exact level with m <= 4
// and the fast level with m <= 8), once per block when K fits in one tile; each warp issues its
// first two batches of code loads before the staging, so the weights stream while X is
// converted. Partial sums of the k_warps warps of a group meet in shared memory and are added
// in a fixed order: the bits do not depend on timing.
//
// Stream order. On sm_90 the GEMV is launched with programmatic stream serialization (unless
// QMOE_CUDA_PDL=0): its blocks may start while the preceding kernel runs, prefetch their weights
// into the L2 (a hint, safe whoever writes them), then wait for that kernel to complete before
// reading X or writing Y (grid_dependency.cuh); every block waits, so the GEMV's completion
// still implies everything before it in the stream. Below sm_90 it is a plain launch.
#ifndef QMOE_LIB_CUDA_INT4_GEMV_CUH_
#define QMOE_LIB_CUDA_INT4_GEMV_CUH_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "lib/cuda/device_quant_matrix.cuh"
#include "qmoe/qmoe.h"

namespace qmoe::cuda {

constexpr uint32_t kInt4GemvMaxRows = 8;

/// How a launch splits the work (int4_gemv_config picks one; tests force others). k_warps is 1,
/// 2, 4 or 8; rounds >= 1; tile_chunks a multiple of 4 with tile_chunks * m_pad * record bytes
/// within the shared-memory budget (m_pad: m rounded up to 1, 2, 4 or 8).
struct Int4GemvConfig {
  uint32_t k_warps;
  uint32_t rounds;
  uint32_t tile_chunks;
};

/// The split for this shape on a device with `sm_count` multiprocessors of `smem_per_sm` bytes of
/// shared memory each (0: as many as four blocks' staging tiles need).
Int4GemvConfig int4_gemv_config(const DeviceQuantMatrix& w, qmoe_accuracy accuracy, uint32_t m,
                                uint32_t n_begin, uint32_t n_end, int sm_count,
                                int smem_per_sm = 0);

/// Launches the GEMV on `stream` (no host synchronisation, no allocation; capturable in a CUDA
/// graph). All pointers are device pointers; codes must be 16-byte aligned. Returns
/// cudaErrorInvalidValue without launching for an invalid matrix description (a format other
/// than INT4, INT3, MXFP4 and NVFP4, or planes that format does not take), m outside [1, 8],
/// an unknown dtype or accuracy, NULL x or y, n_begin > n_end or n_end > N, or ldx < K / ldy <
/// n_end when m > 1; cudaSuccess without launching for an empty range; otherwise the launch's
/// error (cudaGetLastError).
cudaError_t launch_int4_gemv(const DeviceQuantMatrix& w, qmoe_accuracy accuracy, uint32_t m,
                             qmoe_dtype x_dtype, const void* x, size_t ldx, qmoe_dtype y_dtype,
                             void* y, size_t ldy, uint32_t n_begin, uint32_t n_end,
                             cudaStream_t stream);

/// launch_int4_gemv with a given split (cudaErrorInvalidValue when the split is not one the
/// description above allows). Results of different splits agree within the accuracy bounds, not
/// bit for bit (the sums are grouped differently).
cudaError_t launch_int4_gemv_with_config(const DeviceQuantMatrix& w, qmoe_accuracy accuracy,
                                         uint32_t m, qmoe_dtype x_dtype, const void* x, size_t ldx,
                                         qmoe_dtype y_dtype, void* y, size_t ldy, uint32_t n_begin,
                                         uint32_t n_end, const Int4GemvConfig& config,
                                         cudaStream_t stream);

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_INT4_GEMV_CUH_
