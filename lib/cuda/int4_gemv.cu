// The decode GEMV kernel and its launcher (int4_gemv.cuh says what it computes and how the work
// is split), one instantiation per weight format (decode_formats.cuh), level and row count.
#include "lib/cuda/activation_stage.cuh"
#include "lib/cuda/decode_formats.cuh"
#include "lib/cuda/grid_dependency.cuh"
#include "lib/cuda/int4_block.cuh"
#include "lib/cuda/int4_gemv.cuh"

namespace qmoe::cuda {
namespace {

constexpr uint32_t kThreads = kBlockThreads;
constexpr uint32_t kWarps = kBlockWarps;
// Activation tile: four blocks of it fit in an sm_90 SM (228 KiB) with their static memory, and
// it holds all of K = 2880 (gpt-oss) at the exact level for m <= 4 and the fast level for m <= 8.
constexpr uint32_t kStageBudgetBytes = 52 * 1024;
// Blocks per SM a launch uses: 2 of the 3 the register cap allows (int4_tile.cuh), so one block
// of the next decode kernel in the stream fits beside them and can start (and prefetch) early.
constexpr uint32_t kLaunchBlocksPerSm = 2;
// Bytes of weights a block prefetches into the L2 before its wait (its first rounds).
constexpr size_t kPrefetchBytesPerBlock = 64 * 1024;

struct GemvParams {
  DeviceQuantMatrix w;
  const unsigned char* x;
  size_t x_row_bytes;  // ldx * element size
  qmoe_dtype x_dtype;
  unsigned char* y;
  size_t ldy;
  qmoe_dtype y_dtype;
  uint32_t m;
  uint32_t n_begin, n_end;
  uint32_t g_begin, g_end;  // 8-row groups covering [n_begin, n_end)
  uint32_t k_warps, rounds, tile_chunks;
  uint32_t prefetch_rounds;  // rounds whose groups a block prefetches into the L2
};

uint32_t padded_rows(uint32_t m) {
  return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : 8;
}

uint32_t dtype_bytes(qmoe_dtype d) {
  return d == QMOE_DTYPE_F32 ? 4 : 2;
}

// Round-major: round t of block b takes groups (t * blocks + b) * slots .. + slots - 1, so the
// last, partial round is spread over the first blocks rather than left to the last ones.
__device__ __forceinline__ int64_t gemv_group(const GemvParams& p, uint32_t round, uint32_t slot) {
  const uint32_t slots = kWarps / p.k_warps;
  const uint64_t g =
      p.g_begin + (uint64_t{round} * gridDim.x + blockIdx.x) * slots + uint64_t{slot};
  return g < p.g_end ? static_cast<int64_t>(g) : -1;
}

template <class F, Level L, int MAXM>
__device__ __forceinline__ void gemv_body(const GemvParams& p, unsigned char* smem,
                                          float (*partial)[MAXM][kGroupRows]) {
  const auto group_of = [&p](uint32_t round, uint32_t slot) { return gemv_group(p, round, slot); };
  // X is read after the wait and through the L2: the preceding grid may have written it.
  const auto stage = [&p, smem](uint32_t c0) {
    stage_rows<L, MAXM>(smem, c0, p.tile_chunks, p.w.k, p.m, p.x_dtype, true,
                        [&p](uint32_t m) -> const void* { return p.x + m * p.x_row_bytes; });
  };
  const auto sink = [&p](uint32_t g, uint32_t r, uint32_t sub, const float* acc) {
    const uint32_t n = g * kGroupRows + r;
    if (n < p.n_begin || n >= p.n_end) return;
    const float bias = load_bias(p.w, n);
#pragma unroll
    for (int m = 0; m < MAXM; ++m) {
      if ((m & 3) != static_cast<int>(sub) || m >= static_cast<int>(p.m)) continue;
      store_narrowed(p.y, size_t(m) * p.ldy + n, p.y_dtype,
                     F::template finish<L>(acc[m], p.w) + bias);
    }
  };
  run_groups<F, L, MAXM>(p.w, p.m, p.k_warps, p.rounds, p.tile_chunks, smem, partial, group_of,
                         stage, sink);
}

// Ordering (grid_dependency.cuh): before the wait a block only prefetches its weights into the
// L2; X is read and Y written after it. Every block waits, then lets the next grid launch.
template <class F, Level L, int MAXM>
__global__ void __launch_bounds__(kThreads, kDecodeMinBlocksPerSm)
    int4_gemv_kernel(const __grid_constant__ GemvParams p) {
  QMOE_DECODE_DYNAMIC_SMEM(smem);
  __shared__ float partial[kWarps][MAXM][kGroupRows];
  {
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp % p.k_warps == 0) {
      for (uint32_t round = 0; round < p.prefetch_rounds; ++round) {
        const int64_t g = gemv_group(p, round, warp / p.k_warps);
        if (g >= 0) prefetch_group(p.w, static_cast<uint32_t>(g), lane, F::scale_bytes(p.w));
      }
    }
  }
  wait_for_preceding_grid();
  allow_dependent_launch();
  gemv_body<F, L, MAXM>(p, smem, partial);
}

using KernelFn = void (*)(GemvParams);

template <class F>
KernelFn pick_kernel(Level level, uint32_t m_pad) {
  if (level == Level::kExact) {
    switch (m_pad) {
      case 1:
        return int4_gemv_kernel<F, Level::kExact, 1>;
      case 2:
        return int4_gemv_kernel<F, Level::kExact, 2>;
      case 4:
        return int4_gemv_kernel<F, Level::kExact, 4>;
      default:
        return int4_gemv_kernel<F, Level::kExact, 8>;
    }
  }
  switch (m_pad) {
    case 1:
      return int4_gemv_kernel<F, Level::kFast, 1>;
    case 2:
      return int4_gemv_kernel<F, Level::kFast, 2>;
    case 4:
      return int4_gemv_kernel<F, Level::kFast, 4>;
    default:
      return int4_gemv_kernel<F, Level::kFast, 8>;
  }
}

uint32_t stage_record_bytes(qmoe_accuracy accuracy) {
  return accuracy == QMOE_ACCURACY_EXACT ? kExactRecordBytes : kFastRecordBytes;
}

// The largest tile (a multiple of 4 chunks, at least 4) within the staging budget.
uint32_t max_tile_chunks(qmoe_accuracy accuracy, uint32_t m_pad) {
  const uint32_t tc = kStageBudgetBytes / (m_pad * stage_record_bytes(accuracy)) / 4 * 4;
  return tc < 4 ? 4 : tc;
}

size_t stage_bytes(qmoe_accuracy accuracy, uint32_t m_pad, uint32_t tile_chunks) {
  return size_t{m_pad} * tile_chunks * stage_record_bytes(accuracy);
}

// Blocks a launch puts on each SM: kLaunchBlocksPerSm, or fewer when twice that many blocks'
// shared memory (ours and the next kernel's) would not fit; smem_per_sm 0: assume it does.
uint32_t launch_blocks_per_sm(size_t dynamic_smem, uint32_t m_pad, int smem_per_sm) {
  const size_t per_block =
      dynamic_smem + sizeof(float) * kWarps * m_pad * kGroupRows + 1024;  // + static, reserved
  uint32_t s = kLaunchBlocksPerSm;
  while (s > 1 && smem_per_sm > 0 && 2 * s * per_block > static_cast<size_t>(smem_per_sm)) --s;
  return s;
}

bool valid_arguments(const DeviceQuantMatrix& w, qmoe_accuracy accuracy, uint32_t m,
                     qmoe_dtype x_dtype, const void* x, size_t ldx, qmoe_dtype y_dtype,
                     const void* y, size_t ldy, uint32_t n_begin, uint32_t n_end) {
  if (!decode_matrix_is_valid(w)) return false;
  if (accuracy != QMOE_ACCURACY_EXACT && accuracy != QMOE_ACCURACY_FAST) return false;
  if (m < 1 || m > kInt4GemvMaxRows) return false;
  if (!is_activation_dtype_value(x_dtype) || !is_activation_dtype_value(y_dtype)) return false;
  if (x == nullptr || y == nullptr) return false;
  if (n_begin > n_end || n_end > w.n) return false;
  if (m > 1 && (ldx < w.k || ldy < n_end)) return false;
  return true;
}

}  // namespace

Int4GemvConfig int4_gemv_config(const DeviceQuantMatrix& w, qmoe_accuracy accuracy, uint32_t m,
                                uint32_t n_begin, uint32_t n_end, int sm_count, int smem_per_sm) {
  const uint32_t m_pad = padded_rows(m);
  const uint32_t needed = (w.chunks + 3) / 4 * 4;
  const uint32_t tc = min(needed, max_tile_chunks(accuracy, m_pad));
  const uint64_t groups = n_end > n_begin ? (n_end - 1) / kGroupRows - n_begin / kGroupRows + 1 : 1;
  const uint64_t quads = (w.chunks + kQuadChunks - 1) / kQuadChunks;
  const uint64_t resident =
      uint64_t{launch_blocks_per_sm(stage_bytes(accuracy, m_pad, tc), m_pad, smem_per_sm)} *
      static_cast<uint64_t>(sm_count > 0 ? sm_count : 1);
  // A warp's time is about one memory latency per 2U quads it walks (two batches of U are in
  // flight) plus one for the staging, per round, and half of one for a cross-warp sum. Pick
  // the K split with the fewest such latencies when every block is resident at once; on a tie,
  // the one that spreads the groups over more blocks.
  const Level level = accuracy == QMOE_ACCURACY_EXACT ? Level::kExact : Level::kFast;
  int batch_u = 1;  // the format's U: its policy's batch_quads, as its walk compiles it
  with_decode_format(w.format, [&](auto policy) {
    batch_u = decltype(policy)::batch_quads(level, static_cast<int>(m_pad), true);
  });
  const uint64_t in_flight = 2 * static_cast<uint64_t>(batch_u);
  uint32_t best_kw = 1;
  uint64_t best_cost = ~uint64_t{0}, best_blocks = 0, best_rounds = 1;
  for (uint32_t kw = 1; kw <= kWarps; kw *= 2) {
    const uint64_t slots = kWarps / kw;
    const uint64_t rounds = (groups + resident * slots - 1) / (resident * slots);
    const uint64_t blocks = (groups + slots * rounds - 1) / (slots * rounds);
    const uint64_t per_warp = (quads + kw - 1) / kw;
    const uint64_t batches = (per_warp + in_flight - 1) / in_flight;
    const uint64_t cost = rounds * (2 + 2 * batches + (kw > 1 ? 1 : 0));
    if (cost < best_cost || (cost == best_cost && blocks > best_blocks)) {
      best_kw = kw;
      best_cost = cost;
      best_blocks = blocks;
      best_rounds = rounds;
    }
  }
  return {best_kw, static_cast<uint32_t>(best_rounds), tc};
}

cudaError_t launch_int4_gemv_with_config(const DeviceQuantMatrix& w, qmoe_accuracy accuracy,
                                         uint32_t m, qmoe_dtype x_dtype, const void* x, size_t ldx,
                                         qmoe_dtype y_dtype, void* y, size_t ldy, uint32_t n_begin,
                                         uint32_t n_end, const Int4GemvConfig& config,
                                         cudaStream_t stream) {
  if (!valid_arguments(w, accuracy, m, x_dtype, x, ldx, y_dtype, y, ldy, n_begin, n_end)) {
    return cudaErrorInvalidValue;
  }
  const uint32_t m_pad = padded_rows(m);
  const uint32_t kw = config.k_warps;
  if ((kw != 1 && kw != 2 && kw != 4 && kw != 8) || config.rounds < 1 || config.tile_chunks < 4 ||
      config.tile_chunks % 4 != 0 || config.tile_chunks > max_tile_chunks(accuracy, m_pad)) {
    return cudaErrorInvalidValue;
  }
  if (n_begin == n_end) return cudaSuccess;

  GemvParams p{};
  p.w = w;
  p.x = static_cast<const unsigned char*>(x);
  p.x_row_bytes = ldx * dtype_bytes(x_dtype);
  p.x_dtype = x_dtype;
  p.y = static_cast<unsigned char*>(y);
  p.ldy = ldy;
  p.y_dtype = y_dtype;
  p.m = m;
  p.n_begin = n_begin;
  p.n_end = n_end;
  p.g_begin = n_begin / kGroupRows;
  p.g_end = (n_end - 1) / kGroupRows + 1;
  p.k_warps = kw;
  p.rounds = config.rounds;
  p.tile_chunks = config.tile_chunks;

  const uint64_t slots = kWarps / kw;
  const uint64_t per_block = slots * config.rounds;
  const uint64_t blocks = (uint64_t{p.g_end - p.g_begin} + per_block - 1) / per_block;
  if (blocks > 0x7FFFFFFFu) return cudaErrorInvalidValue;
  const size_t group_bytes = size_t{w.chunks} * code_chunk_bytes(w.format) * 9 / 8;  // + ~scales
  const size_t round_bytes = group_bytes * slots;
  const size_t pf_rounds =
      round_bytes >= kPrefetchBytesPerBlock ? 1 : kPrefetchBytesPerBlock / round_bytes;
  p.prefetch_rounds = static_cast<uint32_t>(pf_rounds < config.rounds ? pf_rounds : config.rounds);
  const size_t smem = stage_bytes(accuracy, m_pad, config.tile_chunks);
  const Level level = accuracy == QMOE_ACCURACY_EXACT ? Level::kExact : Level::kFast;
  bool pdl = false;
  const cudaError_t e = pdl_on_current_device(&pdl);
  if (e != cudaSuccess) return e;
  KernelFn kernel = nullptr;
  with_decode_format(w.format, [&](auto f) { kernel = pick_kernel<decltype(f)>(level, m_pad); });
  return launch_decode_kernel(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), smem,
                              pdl, p, stream);
}

cudaError_t launch_int4_gemv(const DeviceQuantMatrix& w, qmoe_accuracy accuracy, uint32_t m,
                             qmoe_dtype x_dtype, const void* x, size_t ldx, qmoe_dtype y_dtype,
                             void* y, size_t ldy, uint32_t n_begin, uint32_t n_end,
                             cudaStream_t stream) {
  if (!valid_arguments(w, accuracy, m, x_dtype, x, ldx, y_dtype, y, ldy, n_begin, n_end)) {
    return cudaErrorInvalidValue;
  }
  int device = 0, sm_count = 0, smem_per_sm = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error == cudaSuccess) {
    error = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
  }
  if (error == cudaSuccess) {
    error =
        cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  }
  if (error != cudaSuccess) return error;
  const Int4GemvConfig config =
      int4_gemv_config(w, accuracy, m, n_begin, n_end, sm_count, smem_per_sm);
  return launch_int4_gemv_with_config(w, accuracy, m, x_dtype, x, ldx, y_dtype, y, ldy, n_begin,
                                      n_end, config, stream);
}

}  // namespace qmoe::cuda
