// Host side of the tensor-core INT4 GEMM: argument checks, the per-device one-time setup, the
// tile choice and the launch. The kernels are in int4_gemm_tc_kernel.cuh.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <utility>

#include "lib/cuda/int4_gemm_tc.cuh"
#include "lib/cuda/int4_gemm_tc_layout.cuh"
#include "lib/cuda/int4_gemm_tc_params.cuh"
#include "lib/cuda/tensor_map.h"

namespace qmoe::cuda {
namespace {

using tc::kTileGeometry;

bool valid_dtype(qmoe_dtype d) {
  return d == QMOE_DTYPE_F32 || d == QMOE_DTYPE_F16 || d == QMOE_DTYPE_BF16;
}

uint32_t element_bytes(qmoe_dtype d) {
  return d == QMOE_DTYPE_F32 ? 4 : 2;
}

// The tile choice models the busiest warp scheduler (4 per multiprocessor; CTAs spread evenly
// over the multiprocessors, a CTA's warps round-robin over its schedulers): the instructions
// it issues, counted in 64 x 32 warp-tile k-steps (halved by split K) times the tile's
// instructions per MMA relative to 128x128 (the split-K tiles pay their per-k-tile loads and
// loop work with half as many MMAs), over the rate one scheduler sustains with that many warps
// resident (one warp stalls on its own latencies). Residency assumes 192 registers a thread
// (ptxas reports 134-254 across the variants, which gives the same CTAs per multiprocessor:
// 2 of 128 threads, 1 of 192 or 256) and the opt-in shared memory. Ties go to the larger
// tile, which reloads X and W less.
//
// The wgmma tiles (where they run, 16-bit X) are chosen instead whenever they run: on the H200
// they beat every mma.sync tile at every measured shape (docs/results/2026-12-02-h200-wgmma-gemm.md
// and the files after it). Among them a second model (wgmma_cost) picks 128 x 64 alone, split
// over K across a cluster of 2, 4 or 8 CTAs, or 128 x 64 split over K inside the CTA (two
// warpgroups, one CTA a multiprocessor), and at the fast level's scaled weights 256 x 128 (never
// split) where it is cheaper. 128 x 128 is not chosen: with the producer
// warpgroup it runs 10-20% below 128 x 64 at every measured shape, though it reads X half as often
// per output (its one producer copies and converts 128 rows' codes and planes for two MMA
// warpgroups, which then wait for it).
constexpr uint32_t kSchedulers = 4;
constexpr uint32_t kRegistersPerThread = 192;
constexpr uint32_t kRegistersPerSm = 65536;
constexpr double kIssuePerMma[] = {1.0, 1.25, 1.25, 1.25};  // the mma.sync tiles, by index
static_assert(static_cast<int>(Int4GemmTcTile::kWgmma128x64) == 4 &&
              static_cast<int>(Int4GemmTcTile::kWgmma128x128) == 5 &&
              static_cast<int>(Int4GemmTcTile::kWgmma128x64SplitK) == 6 &&
              static_cast<int>(Int4GemmTcTile::kWgmma256x128) == 7);
constexpr double kSchedulerRate[] = {0.0, 0.6, 0.85, 1.0};  // by resident warps, 3 or more

// The wgmma model, fitted to one H200 run of every split of 128 x 64 and its in-CTA split
// variant at M = 16 to 2048 on the three benchmark shapes
// (docs/results/2026-12-03-h200-gemm-cluster-split.md): a CTA costs its k-tiles plus
// kCtaOverheadKTiles (its pipeline's fill and its epilogue); 128 x 64 CTAs that have a
// multiprocessor each run at that cost, two on one multiprocessor each take kTwoCtasFactor times
// it (two CTAs of 128 x 64 fit one multiprocessor: a wave is 2 x SMs of them); the in-CTA split
// tile, one CTA a multiprocessor, runs at kInCtaSplitFactor times 128 x 64's alone. 128 x 64 is
// the default; another candidate replaces the best so far only if it is kSplitGain cheaper. Only
// grids of one wave are candidates besides it: the in-CTA split tile while its grid is at most
// one CTA a multiprocessor, a split while its CTAs fit two a multiprocessor (splits of two waves
// or more measured far below the model, e.g. Qwen3 FC1 at M = 1024 split 4 ways, 0.28 of
// cuBLAS). Clusters of 2, 4 and 8 only, with at least kMinKTilesPerSplit k-tiles a CTA: the
// in-CTA split tile (one CTA a multiprocessor) ran clusters of 4 and 5 at half the speed of 3,
// which fits clusters that cannot all be resident at once (a GPC's free multiprocessors are not
// a multiple of the cluster), so it is not split. kInCtaSplitFactor was 0.93 when fitted; with
// the producer taking two k-tiles a step the in-CTA split tile ran at 0.71-0.87 of 128 x 64 alone
// where its grid holds 48 to 128 CTAs, and 1.0 at 24 and 32
// (docs/results/2026-12-03-h200-wgmma-256-token-tile.md).
constexpr uint64_t kMinKTilesPerSplit = 2;
constexpr uint64_t kCtaOverheadKTiles = 2;
constexpr double kTwoCtasFactor = 1.65;
constexpr double kInCtaSplitFactor = 0.8;
constexpr double kSplitGain = 0.05;
constexpr uint64_t kClusterSizes[] = {2, 4, 8};
// 256 x 128 (the fast level's scaled weights only): one CTA a multiprocessor, its k-tile
// kWideKTileFactor times a 128 x 64 CTA's alone (four times the MMAs; per MMA, half the
// dequantisation and copies), fitted to one H200 run of both tiles at M = 128 to 2048 on the
// three benchmark shapes (docs/results/2026-12-03-h200-wgmma-256-token-tile.md). It is never
// split over K: a cluster of such CTAs, each a whole multiprocessor, ran slower than one CTA
// alone at every measured shape (FC2 at M = 512: 14.1 us alone, 16.9 split 2 ways, 25.4 4 ways).
constexpr double kWideKTileFactor = 1.9;

// The model's time of `tiles` output tiles of `tile` with K split `c` ways, in k-tiles of one
// 128 x 64 CTA alone on a multiprocessor.
double wgmma_cost(Int4GemmTcTile tile, uint64_t tiles, uint64_t k_tiles, uint64_t c, uint64_t sms) {
  const double per_cta = static_cast<double>((k_tiles + c - 1) / c + kCtaOverheadKTiles);
  const uint64_t ctas = tiles * c;
  const uint64_t pairs = (ctas + 2 * sms - 1) / (2 * sms);  // waves of two CTAs a multiprocessor
  switch (tile) {
    case Int4GemmTcTile::kWgmma128x64:
      return ctas <= sms ? per_cta : static_cast<double>(pairs) * per_cta * kTwoCtasFactor;
    case Int4GemmTcTile::kWgmma256x128:
      return static_cast<double>((ctas + sms - 1) / sms) * per_cta * kWideKTileFactor;
    default:
      break;
  }
  return static_cast<double>((ctas + sms - 1) / sms) * per_cta * kInCtaSplitFactor;
}

// CTA tiles of `tile` over m rows and columns [n_begin, n_end) (column tiles start at n_begin
// rounded down to a group, as grid_for's).
uint64_t output_tiles(Int4GemmTcTile tile, uint32_t m, uint32_t n_begin, uint32_t n_end) {
  const tc::TileGeometry& g = kTileGeometry[static_cast<int>(tile)];
  const uint64_t columns = n_end - n_begin / kGroupRows * kGroupRows;
  return (uint64_t{m} + g.bm - 1) / g.bm * ((columns + g.bn - 1) / g.bn);
}

// The 128 x 64 splits the model allows, each taken if kSplitGain cheaper than *best (the cost
// of the choice so far), which it then lowers; *splits is set to the split taken, if any.
// Returns whether one was.
bool take_cheaper_split(uint64_t tiles, uint64_t k_tiles, uint64_t sms, double* best,
                        uint32_t* splits) {
  bool taken = false;
  for (const uint64_t c : kClusterSizes) {
    if (k_tiles / c < kMinKTilesPerSplit || tiles * c > 2 * sms) continue;
    const double cost = wgmma_cost(Int4GemmTcTile::kWgmma128x64, tiles, k_tiles, c, sms);
    if (cost < *best * (1.0 - kSplitGain)) {
      *best = cost;
      *splits = static_cast<uint32_t>(c);
      taken = true;
    }
  }
  return taken;
}

// The wgmma tile and split the model picks (128 x 64's and the in-CTA split's shared memory fit:
// the caller checks; `wide`: 256 x 128 runs and fits too).
void choose_wgmma(uint32_t m, uint32_t n_begin, uint32_t n_end, uint32_t k, uint64_t sms, bool wide,
                  Int4GemmTcTile* tile, uint32_t* k_splits) {
  const uint64_t tiles = output_tiles(Int4GemmTcTile::kWgmma128x64, m, n_begin, n_end);
  const uint64_t k_tiles = (uint64_t{k} + tc::kTileK - 1) / tc::kTileK;
  *tile = Int4GemmTcTile::kWgmma128x64;
  *k_splits = 1;
  double best = wgmma_cost(*tile, tiles, k_tiles, 1, sms);
  if (tiles <= sms) {
    const double in_cta = wgmma_cost(Int4GemmTcTile::kWgmma128x64SplitK, tiles, k_tiles, 1, sms);
    if (in_cta < best * (1.0 - kSplitGain)) {
      best = in_cta;
      *tile = Int4GemmTcTile::kWgmma128x64SplitK;
    }
  }
  if (take_cheaper_split(tiles, k_tiles, sms, &best, k_splits)) {
    *tile = Int4GemmTcTile::kWgmma128x64;
  }
  const Int4GemmTcTile wide_tile = Int4GemmTcTile::kWgmma256x128;
  if (wide && wgmma_cost(wide_tile, output_tiles(wide_tile, m, n_begin, n_end), k_tiles, 1, sms) <
                  best * (1.0 - kSplitGain)) {
    *tile = wide_tile;
    *k_splits = 1;
  }
}

// Per device: filled once under the mutex, then read without it (`ready` publishes it).
struct DeviceState {
  std::atomic<bool> ready{false};
  int sm_count = 0;
  size_t max_shared_bytes = 0;
  // The wgmma tiles run here: built for sm_90a, compute capability 9.0, and a driver that
  // encodes their X tensor maps.
  bool wgmma = false;
};

// Whether `tile` may run with this X type where the wgmma tiles do (`wgmma`) or do not: the
// mma.sync tiles always; the wgmma tiles there, with 16-bit X only, and those that run scaled
// weights only with BF16 X.
bool tile_runs(Int4GemmTcTile tile, bool wgmma, qmoe_dtype x_dtype) {
  if (int4_gemm_tc_tile_scaled_only(tile)) return wgmma && x_dtype == QMOE_DTYPE_BF16;
  return !int4_gemm_tc_tile_is_wgmma(tile) || (wgmma && x_dtype != QMOE_DTYPE_F32);
}
constexpr int kMaxDevices = 64;
// The wgmma tiles' kernels exist only in a build that targets sm_90 (lib/CMakeLists.txt builds
// int4_gemm_wgmma.cu for sm_90a then); elsewhere these stand in, and are never reached.
#if defined(QMOE_HAVE_WGMMA)
constexpr bool kHaveWgmma = true;
cudaError_t configure_wgmma_kernels(size_t max_shared_bytes) {
  return tc::configure_wgmma(max_shared_bytes);
}
cudaError_t launch_wgmma_kernel(Int4GemmTcTile tile, qmoe_dtype x_dtype, uint32_t fold, bool scaled,
                                const tc::Params& p, const CUtensorMap& x_map, dim3 grid,
                                cudaStream_t stream) {
  return tc::launch_wgmma(tile, x_dtype, fold, scaled, p, x_map, grid, stream);
}
#else
constexpr bool kHaveWgmma = false;
cudaError_t configure_wgmma_kernels(size_t) {
  return cudaErrorInvalidValue;
}
cudaError_t launch_wgmma_kernel(Int4GemmTcTile, qmoe_dtype, uint32_t, bool, const tc::Params&,
                                const CUtensorMap&, dim3, cudaStream_t) {
  return cudaErrorInvalidValue;
}
#endif
DeviceState g_devices[kMaxDevices];
std::mutex g_setup_mutex;

cudaError_t current_device_state(const DeviceState** state) {
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return error;
  if (device < 0 || device >= kMaxDevices) return cudaErrorInvalidDevice;
  DeviceState& s = g_devices[device];
  if (!s.ready.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(g_setup_mutex);
    if (!s.ready.load(std::memory_order_relaxed)) {
      int sm_count = 0, max_shared = 0, major = 0, minor = 0;
      error = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
      if (error == cudaSuccess) {
        error =
            cudaDeviceGetAttribute(&max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      }
      if (error == cudaSuccess) {
        error = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
      }
      if (error == cudaSuccess) {
        error = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
      }
      const size_t max_bytes = static_cast<size_t>(std::max(max_shared, 0));
      // sm_90a code runs on compute capability 9.0 exactly.
      const bool wgmma = kHaveWgmma && major == 9 && minor == 0 && tensor_map_encoder_available();
      if (error == cudaSuccess) error = tc::configure_variants_bf16(max_bytes);
      if (error == cudaSuccess) error = tc::configure_variants_f16(max_bytes);
      if (error == cudaSuccess) error = tc::configure_variants_f32(max_bytes);
      if (error == cudaSuccess && wgmma) error = configure_wgmma_kernels(max_bytes);
      if (error != cudaSuccess) return error;  // not marked ready: the next call tries again
      s.sm_count = std::max(sm_count, 1);
      s.max_shared_bytes = max_bytes;
      s.wgmma = wgmma;
      s.ready.store(true, std::memory_order_release);
    }
  }
  *state = &s;
  return cudaSuccess;
}

cudaError_t check_arguments(const DeviceQuantMatrix& w, uint32_t m, qmoe_dtype x_dtype,
                            const void* x, size_t ldx, qmoe_dtype y_dtype, const void* y,
                            size_t ldy, uint32_t n_begin, uint32_t n_end) {
  const uint32_t b = w.block_size;
  if (b != 16 && b != 32 && b != 64 && b != 128) return cudaErrorInvalidValue;
  if (w.n == 0 || w.k == 0 || w.n > QMOE_MAX_MATRIX_DIM || w.k > QMOE_MAX_MATRIX_DIM ||
      w.k % b != 0 || w.chunks != (w.k + kChunkCodes - 1) / kChunkCodes) {
    return cudaErrorInvalidValue;
  }
  if (w.codes == nullptr || reinterpret_cast<uintptr_t>(w.codes) % 16 != 0 || w.scales == nullptr ||
      !valid_dtype(w.scale_dtype) || (w.bias != nullptr && !valid_dtype(w.bias_dtype))) {
    return cudaErrorInvalidValue;
  }
  // A scale that straddles two aligned words could not be staged by one 4-byte cp.async (and
  // a misaligned load faulted before the planes went through cp.async).
  if (reinterpret_cast<uintptr_t>(w.scales) % element_bytes(w.scale_dtype) != 0) {
    return cudaErrorInvalidValue;
  }
  if (!valid_dtype(x_dtype) || !valid_dtype(y_dtype) || n_begin > n_end || n_end > w.n) {
    return cudaErrorInvalidValue;
  }
  if (m == 0 || n_begin == n_end) return cudaSuccess;
  if (x == nullptr || y == nullptr || ldx < w.k || ldy < n_end ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0 || (ldx * element_bytes(x_dtype)) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  // Row tiles go on grid.y (at most 65535); the shortest tile has 64 rows.
  if ((m + 63) / 64 > 65535u) return cudaErrorInvalidValue;
  return cudaSuccess;
}

// k_splits: 0 for the launcher's choice (choose_int4_gemm_tc_k_splits).
cudaError_t launch(const Int4GemmTcTile* given_tile, const DeviceQuantMatrix& w, uint32_t m,
                   const uint32_t* m_device, qmoe_dtype x_dtype, const void* x, size_t ldx,
                   qmoe_dtype y_dtype, void* y, size_t ldy, uint32_t n_begin, uint32_t n_end,
                   cudaStream_t stream, qmoe_accuracy accuracy, uint32_t k_splits) {
  if (accuracy != QMOE_ACCURACY_EXACT && accuracy != QMOE_ACCURACY_FAST) {
    return cudaErrorInvalidValue;
  }
  cudaError_t error = check_arguments(w, m, x_dtype, x, ldx, y_dtype, y, ldy, n_begin, n_end);
  if (error != cudaSuccess || m == 0 || n_begin == n_end) return error;
  const DeviceState* device = nullptr;
  error = current_device_state(&device);
  if (error != cudaSuccess) return error;

  // Whether a wgmma tile would run scaled weights.
  const bool scaled_level = int4_gemm_tc_scaled_level(accuracy, x_dtype, w.scale_dtype);
  Int4GemmTcTile tile;
  if (given_tile != nullptr) {
    tile = *given_tile;
    if (static_cast<int>(tile) < 0 || static_cast<int>(tile) >= kInt4GemmTcTileCount ||
        int4_gemm_tc_shared_bytes(tile, x_dtype, w.block_size) > device->max_shared_bytes ||
        !tile_runs(tile, device->wgmma, x_dtype) ||
        (int4_gemm_tc_tile_scaled_only(tile) && !scaled_level)) {
      return cudaErrorInvalidValue;
    }
  } else if (!choose_int4_gemm_tc_tile(m, n_begin, n_end, w.k, device->sm_count,
                                       device->max_shared_bytes, x_dtype, w.block_size, &tile,
                                       device->wgmma, k_splits == 0 ? &k_splits : nullptr,
                                       scaled_level)) {
    return cudaErrorInvalidValue;
  }
  tc::Params p = tc::make_params(w, m, m_device, x, ldx, y_dtype, y, ldy, n_begin, n_end);
  if (k_splits == 0) {
    k_splits = choose_int4_gemm_tc_k_splits(tile, m, n_begin, n_end, w.k, device->sm_count);
  } else if (k_splits > (int4_gemm_tc_tile_is_wgmma(tile) ? tc::kMaxKSplits : 1) ||
             k_splits > p.k_tiles) {
    return cudaErrorInvalidValue;
  }
  p.k_splits = k_splits;
  const dim3 grid = tc::grid_for(tile, p);
  const uint32_t fold = tc::fold_k(w.block_size);
  if (int4_gemm_tc_tile_is_wgmma(tile)) {
    const tc::XTileMap d = tc::x_tile_map(p, kTileGeometry[static_cast<int>(tile)].bm);
    CUtensorMap x_map;
    error =
        encode_tile_map_u16_sw128(d.base, d.k, d.rows, d.row_bytes, d.box_k, d.box_rows, &x_map);
    if (error != cudaSuccess) return error;
    const bool scaled = int4_gemm_tc_scaled_weights(tile, accuracy, x_dtype, w.scale_dtype);
    return launch_wgmma_kernel(tile, x_dtype, fold, scaled, p, x_map, grid, stream);
  }
  switch (x_dtype) {
    case QMOE_DTYPE_BF16:
      return tc::launch_variant_bf16(tile, fold, p, grid, stream);
    case QMOE_DTYPE_F16:
      return tc::launch_variant_f16(tile, fold, p, grid, stream);
    case QMOE_DTYPE_F32:
      break;
  }
  return tc::launch_variant_f32(tile, fold, p, grid, stream);
}

}  // namespace

Int4GemmTcTileShape int4_gemm_tc_tile_shape(Int4GemmTcTile tile) {
  const tc::TileGeometry& g = kTileGeometry[static_cast<int>(tile)];
  return {g.bm, g.bn, tc::tile_threads(g)};
}

size_t int4_gemm_tc_shared_bytes(Int4GemmTcTile tile, qmoe_dtype x_dtype, uint32_t block_size) {
  if (!valid_dtype(x_dtype)) return 0;
  return tc::shared_bytes(kTileGeometry[static_cast<int>(tile)], element_bytes(x_dtype),
                          tc::fold_k(block_size));
}

bool int4_gemm_tc_tile_available(Int4GemmTcTile tile, qmoe_dtype x_dtype) {
  const DeviceState* device = nullptr;
  if (!valid_dtype(x_dtype) || static_cast<int>(tile) < 0 ||
      static_cast<int>(tile) >= kInt4GemmTcTileCount ||
      current_device_state(&device) != cudaSuccess) {
    return false;
  }
  if (!tile_runs(tile, device->wgmma, x_dtype)) return false;
  return int4_gemm_tc_shared_bytes(tile, x_dtype, 32) <= device->max_shared_bytes &&
         int4_gemm_tc_shared_bytes(tile, x_dtype, 16) <= device->max_shared_bytes;
}

bool choose_int4_gemm_tc_tile(uint32_t m, uint32_t n_begin, uint32_t n_end, uint32_t k,
                              int sm_count, size_t max_shared_bytes, qmoe_dtype x_dtype,
                              uint32_t block_size, Int4GemmTcTile* tile, bool wgmma,
                              uint32_t* k_splits, bool scaled_weights) {
  const uint64_t sms = static_cast<uint64_t>(std::max(sm_count, 1));
  uint32_t splits = 1;
  if (k_splits != nullptr) *k_splits = 1;
  const auto fits = [&](Int4GemmTcTile t) {
    return tile_runs(t, wgmma, x_dtype) &&
           int4_gemm_tc_shared_bytes(t, x_dtype, block_size) <= max_shared_bytes;
  };
  if (fits(Int4GemmTcTile::kWgmma128x64) && fits(Int4GemmTcTile::kWgmma128x64SplitK)) {
    const bool wide = scaled_weights && fits(Int4GemmTcTile::kWgmma256x128);
    choose_wgmma(m, n_begin, n_end, k, sms, wide, tile, &splits);
    if (k_splits != nullptr) *k_splits = splits;
    return true;
  }
  bool found = false;
  double best = 0.0;
  for (int i = 0; i < kInt4GemmTcTileCount; ++i) {
    const auto candidate = static_cast<Int4GemmTcTile>(i);
    if (int4_gemm_tc_tile_is_wgmma(candidate)) continue;  // chosen above or not at all
    const size_t shared = int4_gemm_tc_shared_bytes(candidate, x_dtype, block_size);
    if (shared > max_shared_bytes) continue;
    const tc::TileGeometry& g = kTileGeometry[i];
    const uint64_t threads = tc::tile_threads(g), warps = threads / 32;
    const uint64_t tiles = output_tiles(candidate, m, n_begin, n_end);
    const uint64_t per_sm = (tiles + sms - 1) / sms;
    const uint64_t resident = std::max<uint64_t>(
        1, std::min<uint64_t>({per_sm, kRegistersPerSm / (threads * kRegistersPerThread),
                               max_shared_bytes / std::max<size_t>(shared, 1)}));
    const uint64_t issued = (per_sm * warps + kSchedulers - 1) / kSchedulers;  // warps, serially
    const uint64_t concurrent =
        std::min<uint64_t>((resident * warps + kSchedulers - 1) / kSchedulers, 3);
    const double cost =
        static_cast<double>(issued) / g.split_k * kIssuePerMma[i] / kSchedulerRate[concurrent];
    if (!found || cost < best * (1.0 - 1e-9)) {
      found = true;
      best = cost;
      *tile = candidate;
    }
  }
  return found;
}

uint32_t choose_int4_gemm_tc_k_splits(Int4GemmTcTile tile, uint32_t m, uint32_t n_begin,
                                      uint32_t n_end, uint32_t k, int sm_count) {
  if (tile != Int4GemmTcTile::kWgmma128x64 || m == 0 || n_begin >= n_end || k == 0) return 1;
  const uint64_t sms = static_cast<uint64_t>(std::max(sm_count, 1));
  const uint64_t tiles = output_tiles(tile, m, n_begin, n_end);
  const uint64_t k_tiles = (uint64_t{k} + tc::kTileK - 1) / tc::kTileK;
  uint32_t splits = 1;
  double best = wgmma_cost(tile, tiles, k_tiles, 1, sms);
  take_cheaper_split(tiles, k_tiles, sms, &best, &splits);
  return splits;
}

cudaError_t prepare_int4_gemm_tc() {
  const DeviceState* device = nullptr;
  return current_device_state(&device);
}

cudaError_t launch_int4_gemm_tc(const DeviceQuantMatrix& w, uint32_t m, qmoe_dtype x_dtype,
                                const void* x, size_t ldx, qmoe_dtype y_dtype, void* y, size_t ldy,
                                uint32_t n_begin, uint32_t n_end, cudaStream_t stream,
                                qmoe_accuracy accuracy) {
  return launch(nullptr, w, m, nullptr, x_dtype, x, ldx, y_dtype, y, ldy, n_begin, n_end, stream,
                accuracy, 0);
}

cudaError_t launch_int4_gemm_tc_device_m(const DeviceQuantMatrix& w, uint32_t m_capacity,
                                         const uint32_t* m_device, qmoe_dtype x_dtype,
                                         const void* x, size_t ldx, qmoe_dtype y_dtype, void* y,
                                         size_t ldy, uint32_t n_begin, uint32_t n_end,
                                         cudaStream_t stream, qmoe_accuracy accuracy) {
  if (m_device == nullptr) return cudaErrorInvalidValue;
  return launch(nullptr, w, m_capacity, m_device, x_dtype, x, ldx, y_dtype, y, ldy, n_begin, n_end,
                stream, accuracy, 0);
}

cudaError_t launch_int4_gemm_tc_tile(Int4GemmTcTile tile, const DeviceQuantMatrix& w, uint32_t m,
                                     const uint32_t* m_device, qmoe_dtype x_dtype, const void* x,
                                     size_t ldx, qmoe_dtype y_dtype, void* y, size_t ldy,
                                     uint32_t n_begin, uint32_t n_end, cudaStream_t stream,
                                     qmoe_accuracy accuracy, uint32_t k_splits) {
  return launch(&tile, w, m, m_device, x_dtype, x, ldx, y_dtype, y, ldy, n_begin, n_end, stream,
                accuracy, k_splits);
}

double int4_gemm_tc_accumulation_bound(uint32_t k, uint32_t block_size, qmoe_dtype x_dtype) {
  const uint32_t fold = tc::fold_k(block_size);
  const double steps = (fold / 16) * (x_dtype == QMOE_DTYPE_F32 ? 2.0 : 1.0);
  const double folds = std::ceil(static_cast<double>(k) / fold);
  return (32.0 * steps + folds + 2.0) * 0x1p-23;
}

double int4_gemm_tc_x_split_bound(qmoe_dtype x_dtype) {
  return x_dtype == QMOE_DTYPE_F32 ? 0x1p-16 : 0.0;
}

double int4_gemm_tc_scaled_accumulation_bound(uint32_t k) {
  const double steps = std::ceil(static_cast<double>(k) / 16.0);
  return (32.0 * steps + 2.0) * 0x1p-23;
}

double int4_gemm_tc_fast_bound(uint32_t k) {
  const double w = kInt4GemmTcScaledWeightBound;
  return w + int4_gemm_tc_scaled_accumulation_bound(k) * (1.0 + w);
}

namespace tc {

Params make_params(const DeviceQuantMatrix& w, uint32_t m, const uint32_t* m_device, const void* x,
                   size_t ldx, qmoe_dtype y_dtype, void* y, size_t ldy, uint32_t n_begin,
                   uint32_t n_end) {
  Params p{};
  p.w = w;
  p.x = x;
  p.ldx = ldx;
  p.y = y;
  p.ldy = ldy;
  p.y_dtype = y_dtype;
  p.m = m;
  p.m_device = m_device;
  p.n_begin = n_begin;
  p.n_end = n_end;
  p.n_base = n_begin / kGroupRows * kGroupRows;
  p.k_tiles = (w.k + kTileK - 1) / kTileK;
  p.k_splits = 1;
  p.block_shift = static_cast<uint32_t>(__builtin_ctz(w.block_size));
  p.y_pairs = reinterpret_cast<uintptr_t>(y) % (2 * element_bytes(y_dtype)) == 0 && ldy % 2 == 0;
  p.y_octets = reinterpret_cast<uintptr_t>(y) % 16 == 0 && ldy * element_bytes(y_dtype) % 16 == 0;
  p.scale_bytes = element_bytes(w.scale_dtype);
  p.scale_block_bytes = w.scale_block_stride * p.scale_bytes;
  p.zero_block_bytes = w.zero_point_block_stride;
  const uint32_t blocks = (w.k + w.block_size - 1) / w.block_size;
  p.scale_end = plane_end_address(w.scales, w.n, blocks, w.scale_row_stride, w.scale_block_stride,
                                  w.scale_group_stride, p.scale_bytes);
  p.zero_end = w.zero_points == nullptr
                   ? 0
                   : plane_end_address(w.zero_points, w.n, blocks, w.zero_point_row_stride,
                                       w.zero_point_block_stride, w.zero_point_group_stride, 1);
  p.tail_ktile = static_cast<uint32_t>(size_t{blocks > 4 ? blocks - 4 : 0} * w.block_size / kTileK);
  return p;
}

XTileMap x_tile_map(const Params& p, uint32_t box_rows) {
  // check_arguments has made x 16-byte aligned and ldx * 2 a multiple of 16, as the TMA needs.
  return {p.x, p.w.k, p.m, p.ldx * 2, kTileK, box_rows};
}

dim3 grid_for(Int4GemmTcTile tile, const Params& p) {
  const TileGeometry& g = kTileGeometry[static_cast<int>(tile)];
  return dim3((p.n_end - p.n_base + g.bn - 1) / g.bn, (p.m + g.bm - 1) / g.bm, p.k_splits);
}

}  // namespace tc
}  // namespace qmoe::cuda
