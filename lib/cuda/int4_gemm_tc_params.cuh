// What the host side of the tensor-core GEMM shares with its kernels: the launch parameters,
// the tile and pipeline geometry (and so the shared-memory size of every variant), and the
// per-X-type entry points that the kernel files define.
#ifndef QMOE_LIB_CUDA_INT4_GEMM_TC_PARAMS_CUH_
#define QMOE_LIB_CUDA_INT4_GEMM_TC_PARAMS_CUH_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "lib/cuda/device_quant_matrix.cuh"
#include "lib/cuda/int4_gemm_tc.cuh"

namespace qmoe::cuda::tc {

// Everything one launch reads; passed by value as the kernel's only parameter.
struct Params {
  DeviceQuantMatrix w;
  const void* x;
  size_t ldx;  // elements
  void* y;
  size_t ldy;  // elements
  qmoe_dtype y_dtype;
  uint32_t m;                // rows; the capacity when m_device is set
  const uint32_t* m_device;  // nullptr, or the row count in device memory (clamped to m)
  uint32_t n_begin, n_end;   // written columns
  uint32_t n_base;           // n_begin rounded down to 8: CTA column tiles start here
  uint32_t k_tiles;          // ceil(K / kTileK)
  // CTAs that split K for one output tile, a cluster along the grid's z (wgmma tiles only; 1
  // elsewhere): 1 .. min(k_tiles, kMaxKSplits) (int4_gemm_wgmma_kernel.cuh).
  uint32_t k_splits;
  uint32_t block_shift;      // log2(block size)
  bool y_pairs;              // y and ldy allow two adjacent outputs as one aligned store
  bool y_octets;             // y and ldy allow eight (16 bytes a row: 16-byte aligned stores)
  uint32_t scale_bytes;      // 4 for FP32 scales, 2 for FP16 and BF16
  size_t scale_block_bytes;  // scale_block_stride * scale_bytes
  size_t zero_block_bytes;   // zero_point_block_stride (one byte per zero point)
  uintptr_t scale_end;       // one past the scale plane's last byte (plane_end_address)
  uintptr_t zero_end;        // likewise for the zero points (0 without them)
  // The first k-tile holding a block >= blocks - 4: an element of an earlier block lies at least
  // 4 elements before its plane's last, so its word ends inside the plane (block stride >= 1).
  uint32_t tail_ktile;
};

// K per pipeline stage: two 32-code chunks.
constexpr uint32_t kTileK = 64;

// The most CTAs a wgmma tile splits K over: the portable cluster size.
constexpr uint32_t kMaxKSplits = 8;

// Every CTA tile is warps_m x warps_n warp tiles of 64 x 32 (rows of X x rows of W): a warp
// holds 4 x 4 m16n8 accumulator tiles. With split_k = 2 each warp tile has two warps, one per
// 32-code chunk of every k-tile, whose sums are added at the end: twice the warps on the same
// work, for the shapes where the tile count, not the tile speed, limits (MoE expert GEMMs at
// prefill sizes leave a 64 x 32 warp tile per scheduler or less). Indexed by Int4GemmTcTile.
// The wgmma tiles' geometry gives their stage layout and thread count (warps_m x warps_n "warp
// tiles" of 64 x 32, times split_k: 128 threads for 128 x 64, 256 for 128 x 128, 256 x 128 and
// 128 x 64 split over K); their warps split the tile otherwise (int4_gemm_wgmma_kernel.cuh).
struct TileGeometry {
  uint32_t bm, bn, warps_m, warps_n, split_k;
  bool wgmma = false;
};
constexpr uint32_t kWarpRowsM = 64;
constexpr uint32_t kWarpRowsN = 32;
constexpr TileGeometry kTileGeometry[kInt4GemmTcTileCount] = {
    {128, 128, 2, 4, 1},      {64, 128, 1, 4, 2},       {64, 96, 1, 3, 2},
    {64, 64, 1, 2, 2},        {128, 64, 2, 2, 1, true}, {128, 128, 2, 4, 1, true},
    {128, 64, 2, 2, 2, true}, {256, 128, 2, 4, 1, true}};

// The wgmma tile's stages start on this boundary (its X tile is the 128-byte-swizzled operand
// of the MMA's descriptor, whose 8-row atoms must be 1024-byte aligned): the kernel aligns its
// dynamic shared memory itself, so the tile asks for this much more.
constexpr uint32_t kWgmmaAlignment = 1024;

constexpr uint32_t tile_threads(TileGeometry g) {
  return 32 * g.warps_m * g.warps_n * g.split_k;
}

// FP32 fold granularity in k: one fold per block when the block size is 16, else one per
// 32-code chunk (a larger block's chunks fold with the same scale).
constexpr uint32_t fold_k(uint32_t block_size) {
  return block_size == 16 ? 16 : 32;
}

// One pipeline stage: the X tile (bm rows x kTileK, 16-bit or FP32 elements), the code tile
// (bn / 8 groups x 2 chunks x 128 bytes), then per fold unit and column a 4-byte scale entry and
// a 4-byte zero-point entry (each first the aligned plane word that cp.async brings, then, once
// converted in place, the FP32 scale and the 32-bit zero constant). Every part is a multiple of
// 128 bytes.
struct StageLayout {
  uint32_t x_row_bytes, x_bytes, code_offset, scale_offset, zero_offset, bytes;
};
constexpr StageLayout stage_layout(TileGeometry g, uint32_t x_element_bytes, uint32_t fold) {
  const uint32_t x_row = kTileK * x_element_bytes;
  const uint32_t x_bytes = g.bm * x_row;
  const uint32_t code_bytes = g.bn * (kTileK / 2);
  const uint32_t plane_bytes = (kTileK / fold) * g.bn * 4;
  return {x_row,
          x_bytes,
          x_bytes,
          x_bytes + code_bytes,
          x_bytes + code_bytes + plane_bytes,
          x_bytes + code_bytes + 2 * plane_bytes};
}
// Stages of a variant: as many as fit kStageBudget, from kMinStages to kMaxStages. Every part of
// a stage (X, codes, both planes) travels by cp.async, kStages - 2 k-tiles ahead of the k-tile
// the warps compute (the kernel converts the planes of k-tile kt + 1 while it computes kt): at
// one 64 x 32 warp tile per scheduler a k-tile is a few hundred cycles, so the 64-row tiles
// need 5 to 6 k-tiles in flight to cover a cold HBM read (about 1 us under load), where the
// 128-row tiles take twice as long per k-tile. The budget keeps two CTAs' worth (plus the
// per-CTA reserve) within a Hopper multiprocessor's 228 KB and one within sm_86's 99 KB.
constexpr uint32_t kMinStages = 4;
constexpr uint32_t kMaxStages = 8;
// After a wgmma tile's stages: two 8-byte mbarriers per stage, full (on which the stage's copies
// complete) and empty (the stage's release by the consumers).
constexpr uint32_t kWgmmaBarrierBytes = 16 * kMaxStages;
// The wgmma tiles have budgets of their own: 128 x 64 two CTAs per multiprocessor with 5
// stages, 128 x 128, 256 x 128 and 128 x 64 split over K (one CTA each, by their registers) the
// deepest pipeline (their CTAs are fewest: 256 x 128 gets 5 stages of 38 or 40 KB).
constexpr uint32_t kStageBudget = 96 * 1024;
constexpr uint32_t stage_budget(TileGeometry g) {
  return !g.wgmma ? kStageBudget : g.bn == 64 && g.split_k == 1 ? 110 * 1024 : 200 * 1024;
}
constexpr uint32_t stage_count(TileGeometry g, uint32_t x_element_bytes, uint32_t fold) {
  const uint32_t fit = stage_budget(g) / stage_layout(g, x_element_bytes, fold).bytes;
  return fit < kMinStages ? kMinStages : fit > kMaxStages ? kMaxStages : fit;
}
constexpr size_t shared_bytes(TileGeometry g, uint32_t x_element_bytes, uint32_t fold) {
  return size_t{stage_count(g, x_element_bytes, fold)} *
             stage_layout(g, x_element_bytes, fold).bytes +
         (g.wgmma ? kWgmmaAlignment + kWgmmaBarrierBytes : 0);
}

// The wgmma tiles' X operand as the tensor the TMA copies stage by stage (its CUtensorMap is
// encoded from this by the launcher, tensor_map.h): X's rows [0, m) of K 16-bit elements, rows
// ldx elements apart, in boxes of kTileK elements x box_rows rows, swizzled by 128 bytes (the
// layout the wgmma descriptor reads, x_piece_offset); elements past K or row m read as zero.
// The CUDA host emulation reads the same description.
struct XTileMap {
  const void* base;
  uint64_t k, rows;    // tensor extent: elements per row, rows
  uint64_t row_bytes;  // ldx * 2 (a multiple of 16)
  uint32_t box_k, box_rows;
};
XTileMap x_tile_map(const Params& p, uint32_t box_rows);

// The launch parameters and grid of checked arguments (int4_gemm_tc.cu): also what the
// emulation test runs the kernel code with.
Params make_params(const DeviceQuantMatrix& w, uint32_t m, const uint32_t* m_device, const void* x,
                   size_t ldx, qmoe_dtype y_dtype, void* y, size_t ldy, uint32_t n_begin,
                   uint32_t n_end);
dim3 grid_for(Int4GemmTcTile tile, const Params& p);

// Per X type (int4_gemm_tc_{bf16,f16,f32}.cu): launch one variant on `grid`, and raise the
// dynamic shared-memory limit of every variant whose need is at most max_shared_bytes.
cudaError_t launch_variant_bf16(Int4GemmTcTile tile, uint32_t fold, const Params& p, dim3 grid,
                                cudaStream_t stream);
cudaError_t launch_variant_f16(Int4GemmTcTile tile, uint32_t fold, const Params& p, dim3 grid,
                               cudaStream_t stream);
cudaError_t launch_variant_f32(Int4GemmTcTile tile, uint32_t fold, const Params& p, dim3 grid,
                               cudaStream_t stream);
// The wgmma tile (int4_gemm_wgmma.cu, built for sm_90a only when QMOE_HAVE_WGMMA is defined):
// X in BF16 or FP16, copied by the TMA through x_map (x_tile_map(p, the tile's rows of X)).
// Configure only on a compute capability 9.0 device.
// `scaled`: the fast level's scaled weights (BF16 X only; the only variant of a tile that
// int4_gemm_tc_tile_scaled_only names).
cudaError_t launch_wgmma(Int4GemmTcTile tile, qmoe_dtype x_dtype, uint32_t fold, bool scaled,
                         const Params& p, const CUtensorMap& x_map, dim3 grid, cudaStream_t stream);
cudaError_t configure_wgmma(size_t max_shared_bytes);
cudaError_t configure_variants_bf16(size_t max_shared_bytes);
cudaError_t configure_variants_f16(size_t max_shared_bytes);
cudaError_t configure_variants_f32(size_t max_shared_bytes);

}  // namespace qmoe::cuda::tc

#endif  // QMOE_LIB_CUDA_INT4_GEMM_TC_PARAMS_CUH_
