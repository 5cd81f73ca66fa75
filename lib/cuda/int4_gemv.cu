// The INT4 decode GEMV kernel and its launcher (int4_gemv.cuh says what it computes and how the
// work is split).
#include "lib/cuda/activation_stage.cuh"
#include "lib/cuda/int4_block.cuh"
#include "lib/cuda/int4_gemv.cuh"
#include "lib/cuda/int4_tile.cuh"

namespace qmoe::cuda {
namespace {

constexpr uint32_t kThreads = kBlockThreads;
constexpr uint32_t kWarps = kBlockWarps;
constexpr uint32_t kStageBudgetBytes = 36 * 1024;  // activation tile; keeps several blocks per SM

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
};

uint32_t padded_rows(uint32_t m) {
  return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : 8;
}

uint32_t dtype_bytes(qmoe_dtype d) {
  return d == QMOE_DTYPE_F32 ? 4 : 2;
}

template <Level L, int MAXM, qmoe_dtype SD>
__device__ void gemv_body(const GemvParams& p, unsigned char* smem,
                          float (*partial)[MAXM][kGroupRows]) {
  const uint32_t slots = kWarps / p.k_warps;
  const auto group_of = [&p, slots](uint32_t round, uint32_t slot) -> int64_t {
    const uint64_t g = p.g_begin + (uint64_t{blockIdx.x} * p.rounds + round) * slots + slot;
    return g < p.g_end ? static_cast<int64_t>(g) : -1;
  };
  const auto stage = [&p, smem](uint32_t c0) {
    stage_rows<L, MAXM>(smem, c0, p.tile_chunks, p.w.k, p.m, p.x_dtype, false,
                        [&p](uint32_t m) -> const void* { return p.x + m * p.x_row_bytes; });
  };
  const auto sink = [&p](uint32_t g, uint32_t r, uint32_t sub, const float* acc) {
    const uint32_t n = g * kGroupRows + r;
    if (n < p.n_begin || n >= p.n_end) return;
    const float bias = load_bias(p.w, n);
#pragma unroll
    for (int m = 0; m < MAXM; ++m) {
      if ((m & 3) != static_cast<int>(sub) || m >= static_cast<int>(p.m)) continue;
      store_narrowed(p.y, size_t(m) * p.ldy + n, p.y_dtype, acc[m] + bias);
    }
  };
  run_groups<L, MAXM, SD>(p.w, p.k_warps, p.rounds, p.tile_chunks, smem, partial, group_of, stage,
                          sink);
}

template <Level L, int MAXM>
__global__ void __launch_bounds__(kThreads, MAXM >= 8 ? 1 : 2)
    int4_gemv_kernel(const __grid_constant__ GemvParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float partial[kWarps][MAXM][kGroupRows];
  switch (p.w.scale_dtype) {
    case QMOE_DTYPE_F16:
      gemv_body<L, MAXM, QMOE_DTYPE_F16>(p, smem, partial);
      break;
    case QMOE_DTYPE_BF16:
      gemv_body<L, MAXM, QMOE_DTYPE_BF16>(p, smem, partial);
      break;
    default:
      gemv_body<L, MAXM, QMOE_DTYPE_F32>(p, smem, partial);
      break;
  }
}

using KernelFn = void (*)(GemvParams);

KernelFn pick_kernel(Level level, uint32_t m_pad) {
  if (level == Level::kExact) {
    switch (m_pad) {
      case 1:
        return int4_gemv_kernel<Level::kExact, 1>;
      case 2:
        return int4_gemv_kernel<Level::kExact, 2>;
      case 4:
        return int4_gemv_kernel<Level::kExact, 4>;
      default:
        return int4_gemv_kernel<Level::kExact, 8>;
    }
  }
  switch (m_pad) {
    case 1:
      return int4_gemv_kernel<Level::kFast, 1>;
    case 2:
      return int4_gemv_kernel<Level::kFast, 2>;
    case 4:
      return int4_gemv_kernel<Level::kFast, 4>;
    default:
      return int4_gemv_kernel<Level::kFast, 8>;
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

bool valid_arguments(const DeviceQuantMatrix& w, qmoe_accuracy accuracy, uint32_t m,
                     qmoe_dtype x_dtype, const void* x, size_t ldx, qmoe_dtype y_dtype,
                     const void* y, size_t ldy, uint32_t n_begin, uint32_t n_end) {
  if (!quant_matrix_is_valid(w)) return false;
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
                                uint32_t n_begin, uint32_t n_end, int sm_count) {
  const uint32_t quads = (w.chunks + kQuadChunks - 1) / kQuadChunks;
  // Each warp should get about two quads or more of a group's K.
  const uint32_t kw = quads >= 12 ? 8 : quads >= 6 ? 4 : quads >= 3 ? 2 : 1;
  const uint32_t slots = kWarps / kw;
  const uint64_t groups = n_end > n_begin ? (n_end - 1) / kGroupRows - n_begin / kGroupRows + 1 : 1;
  const uint64_t blocks = (groups + slots - 1) / slots;
  // More groups per block once there are over two blocks per SM: X is then staged (and, at the
  // fast level, quantized) fewer times.
  const uint64_t target = 2 * static_cast<uint64_t>(sm_count > 0 ? sm_count : 1);
  uint64_t rounds = blocks / target;
  if (rounds < 1) rounds = 1;
  if (rounds > 64) rounds = 64;
  const uint32_t m_pad = padded_rows(m);
  const uint32_t needed = (w.chunks + 3) / 4 * 4;
  const uint32_t tc = min(needed, max_tile_chunks(accuracy, m_pad));
  return {kw, static_cast<uint32_t>(rounds), tc};
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
  const size_t smem = size_t{m_pad} * config.tile_chunks * stage_record_bytes(accuracy);
  const Level level = accuracy == QMOE_ACCURACY_EXACT ? Level::kExact : Level::kFast;
  pick_kernel(level, m_pad)<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_int4_gemv(const DeviceQuantMatrix& w, qmoe_accuracy accuracy, uint32_t m,
                             qmoe_dtype x_dtype, const void* x, size_t ldx, qmoe_dtype y_dtype,
                             void* y, size_t ldy, uint32_t n_begin, uint32_t n_end,
                             cudaStream_t stream) {
  if (!valid_arguments(w, accuracy, m, x_dtype, x, ldx, y_dtype, y, ldy, n_begin, n_end)) {
    return cudaErrorInvalidValue;
  }
  int device = 0, sm_count = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error == cudaSuccess) {
    error = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);
  }
  if (error != cudaSuccess) return error;
  const Int4GemvConfig config = int4_gemv_config(w, accuracy, m, n_begin, n_end, sm_count);
  return launch_int4_gemv_with_config(w, accuracy, m, x_dtype, x, ldx, y_dtype, y, ldy, n_begin,
                                      n_end, config, stream);
}

}  // namespace qmoe::cuda
