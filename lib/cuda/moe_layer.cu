// The MoE layer's two kernels and their launcher (moe_layer.cuh says what each computes).
//
// Workspace: [0, 256) the error word; then the activations of every route (exact: FP32 rows of
// ceil(I / 32) * 32 values, zero past I; fast: one 48-byte int4_tile.cuh record per 32 values);
// then FC2's outputs per route, [m_capacity * k][H] FP32, used when they do not fit in (b)'s
// shared memory.
//
// Ordering. (a) waits for the preceding stream work (griddepcontrol.wait: a no-op without
// programmatic launch) before reading anything, or, with inputs_ready_early, after building its
// routing and prefetching its FC1 weights but before reading x; every block of (a) waits before
// it exits, and (a) lets (b) launch at once. (b) reads only the call's inputs before its own
// wait (routing, residency, slot descriptions, through the L2 with ld.global.cg; complete when
// (a) started), prefetches its FC2 weights into L2, then waits for (a) to complete before reading
// (a)'s activations or writing anything. Neither kernel writes global memory before its wait, so
// a layer's (a) never overwrites activations the previous layer's (b) still reads, and the
// completion of (b) implies that of everything before it in the stream.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "lib/cuda/activation_stage.cuh"
#include "lib/cuda/int4_block.cuh"
#include "lib/cuda/int4_tile.cuh"
#include "lib/cuda/moe_layer.cuh"
#include "lib/cuda/moe_routes.cuh"

namespace qmoe::cuda {
namespace {

constexpr uint32_t kThreads = kBlockThreads;
constexpr uint32_t kWarps = kBlockWarps;
constexpr size_t kHeaderBytes = 256;                  // the error word's line
constexpr uint32_t kStageBudgetBytes = 36 * 1024;     // (a)'s X tile
constexpr uint32_t kWarpStageBudgetBytes = 6 * 1024;  // (b)'s activation tile per warp
constexpr uint32_t kSmemY2MaxSlots = 1024;            // (b) keeps FC2 outputs in shared memory

static_assert(sizeof(DeviceQuantMatrix) % 8 == 0, "copied as 8-byte words");

struct MoeKernelParams {
  MoeLayerParams p;
  uint32_t tokens_per_item;  // T
  uint32_t slots_cap;        // m_capacity * k
  uint32_t inter_chunks;     // ceil(I / 32): FC1 units and FC2's K chunks
  size_t act_offset;         // workspace bytes
  size_t act_route_bytes;    // exact: inter_chunks * 128; fast: inter_chunks * 48
  size_t y2_offset;
  uint32_t tables_bytes;
  uint32_t tc1;  // FC1 K tile (chunks of H)
  uint32_t tc2;  // FC2 K tile (chunks of I), per warp
  bool y2_in_smem;
};

// ---- Programmatic dependent launch (sm_90 and up; nothing elsewhere) ------------------------

__device__ __forceinline__ void wait_for_preceding_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ---- Helpers -----------------------------------------------------------------------------------

__device__ __forceinline__ void copy_matrix(DeviceQuantMatrix* dst, const DeviceQuantMatrix* src,
                                            uint32_t thread, uint32_t threads) {
  constexpr uint32_t kWords = sizeof(DeviceQuantMatrix) / 8;
  for (uint32_t i = thread; i < kWords; i += threads) {
    reinterpret_cast<unsigned long long*>(dst)[i] =
        __ldcg(reinterpret_cast<const unsigned long long*>(src) + i);
  }
}

// The same into registers (a union, so no local-memory copy).
__device__ __forceinline__ DeviceQuantMatrix load_matrix(const DeviceQuantMatrix* src) {
  constexpr uint32_t kWords = sizeof(DeviceQuantMatrix) / 8;
  union {
    unsigned long long words[kWords];
    DeviceQuantMatrix matrix;
  } u;
#pragma unroll
  for (uint32_t i = 0; i < kWords; ++i) {
    u.words[i] = __ldcg(reinterpret_cast<const unsigned long long*>(src) + i);
  }
  return u.matrix;
}

__device__ __forceinline__ bool slot_matrices_valid(const MoeLayerParams& p, int32_t slot) {
  const DeviceQuantMatrix a = load_matrix(p.fc1 + slot);
  const DeviceQuantMatrix b = load_matrix(p.fc2 + slot);
  return quant_matrix_is_valid(a) && a.n == 2 * p.intermediate && a.k == p.hidden &&
         quant_matrix_is_valid(b) && b.n == p.hidden && b.k == p.intermediate;
}

// Quantizes one value per lane (a 32-value chunk, zeros past the end) into a fast record, as
// quantize_eight does for 8 values per thread (activation_stage.cuh).
__device__ __forceinline__ void quantize_warp_chunk(float v, uint32_t lane, unsigned char* rec) {
  float amax = fabsf(v);
  for (int d = 16; d >= 1; d /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, d));
  const bool flush = !(amax >= kQ8FlushBelowDevice);
  const float scale = flush ? 0.0f : __fdiv_rn(amax, 127.0f);
  const float inv = flush ? 0.0f : __fdiv_rn(127.0f, amax);
  const float t = __fmul_rn(v, inv);
  const int32_t q = t == t ? __float2int_rn(t) : 0;
  int32_t half = q;
  for (int d = 8; d >= 1; d /= 2) half += __shfl_xor_sync(0xFFFFFFFFu, half, d);  // lanes 0-15
  const int32_t all = half + __shfl_xor_sync(0xFFFFFFFFu, half, 16);
  rec[lane] = static_cast<unsigned char>(q & 0xFF);
  int32_t* meta = reinterpret_cast<int32_t*>(rec + 32);
  if (lane == 0) {
    meta[0] = __float_as_int(scale);
    meta[1] = half;
    meta[3] = all;
  } else if (lane == 16) {
    meta[2] = half;
  }
}

// ONNX Runtime QMoE's SwiGLU as lib/moe_forward.cc: the clamps as std::min / std::clamp (a NaN
// passes through), sigmoid = 1 / (1 + exp(-(alpha g))), a = (g * sigmoid) * (u + beta).
__device__ __forceinline__ float swiglu(float g, float u, const MoeLayerParams& p) {
  if (isfinite(p.limit)) {
    g = p.limit < g ? p.limit : g;
    u = u < -p.limit ? -p.limit : (p.limit < u ? p.limit : u);
  }
  const float sigmoid = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-__fmul_rn(p.alpha, g))));
  return __fmul_rn(__fmul_rn(g, sigmoid), __fadd_rn(u, p.beta));
}

// L2 prefetch of what a warp will read of group g of w: its code chunks (one line each), and
// its rows' scales and zero points.
__device__ __forceinline__ void prefetch_group(const DeviceQuantMatrix& w, uint32_t g,
                                               uint32_t lane) {
  if (g * kGroupRows >= w.n) return;
  const uint8_t* codes = w.codes + size_t(g) * w.chunks * kChunkBytes;
  for (uint32_t c = lane; c < w.chunks; c += 32) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(codes + size_t(c) * kChunkBytes));
  }
  const uint32_t r = lane % kGroupRows, n = g * kGroupRows + r;
  if (n >= w.n) return;
  const size_t so = plane_row_offset(n, w.scale_row_stride, w.scale_group_stride);
  const size_t zo = plane_row_offset(n, w.zero_point_row_stride, w.zero_point_group_stride);
  const uint32_t blocks = w.k / w.block_size;
  const size_t es = w.scale_dtype == QMOE_DTYPE_F32 ? 4 : 2;
  for (uint32_t b = lane / kGroupRows; b < blocks; b += 4) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const unsigned char*>(w.scales) +
                                                  (so + b * w.scale_block_stride) * es));
    if (w.zero_points != nullptr) {
      asm volatile(
          "prefetch.global.L2 [%0];" ::"l"(w.zero_points + zo + b * w.zero_point_block_stride));
    }
  }
}

// ---- (a) FC1 + SwiGLU ---------------------------------------------------------------------------

template <Level L, int MAXM>
__global__ void __launch_bounds__(kThreads, MAXM >= 8 ? 1 : 2)
    moe_fc1_kernel(const __grid_constant__ MoeKernelParams kp) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ RouteInfo info;
  __shared__ __align__(16) DeviceQuantMatrix mat;
  __shared__ int32_t token[MAXM];
  __shared__ uint32_t group_list[9];
  __shared__ uint32_t group_count;
  __shared__ float h[MAXM][64];  // per token: gate of the unit's 32 intermediates, then up
  const MoeLayerParams& p = kp.p;
  constexpr uint32_t T = MAXM;

  // Nothing is written to global memory before the wait, so (b), and the next layer, may
  // start as soon as every block of this grid runs.
  const bool early = p.inputs_ready_early;
  if (!early) wait_for_preceding_grid();
  allow_dependent_launch();
  const RouteTables tab = carve_route_tables(smem, kp.slots_cap, p.num_experts);
  build_routes(p, tab, info, T);
  const uint32_t unit = blockIdx.x, item = blockIdx.y;
  // Every block waits before it exits, so this grid's completion implies the preceding one's
  // (which (b), and whatever follows it, rely on).
  if (info.error != 0 || item >= info.items) {  // block-uniform
    if (early) wait_for_preceding_grid();
    return;
  }

  const WorkItem wi = find_item(p, tab, item, T);
  copy_matrix(&mat, p.fc1 + tab.residency[wi.expert], threadIdx.x, kThreads);
  if (threadIdx.x < wi.count) {
    token[threadIdx.x] =
        tab.route_slot[wi.first_route + threadIdx.x] / static_cast<int32_t>(p.top_k);
  }
  for (uint32_t i = threadIdx.x; i < MAXM * 64; i += kThreads) h[i / 64][i % 64] = 0.0f;
  if (threadIdx.x == 0) {
    // FC1 groups holding the gate and up rows of intermediates [32 unit, 32 unit + 32).
    const uint32_t I = p.intermediate, i0 = 32 * unit, i1 = min(i0 + 32, I);
    uint32_t n = 0;
    if (p.fusion == QMOE_SWIGLU_INTERLEAVED) {
      for (uint32_t g = 2 * i0 / 8; g < (2 * i1 + 7) / 8; ++g) group_list[n++] = g;
    } else {
      const uint32_t gate_end = (i1 + 7) / 8;
      for (uint32_t g = i0 / 8; g < gate_end; ++g) group_list[n++] = g;
      const uint32_t up_begin = max((I + i0) / 8, gate_end);
      for (uint32_t g = up_begin; g < (I + i1 + 7) / 8; ++g) group_list[n++] = g;
    }
    group_count = n;
  }
  __syncthreads();
  const DeviceQuantMatrix& w = mat;
  if (!quant_matrix_is_valid(w) || w.n != 2 * p.intermediate || w.k != p.hidden) {
    if (early) wait_for_preceding_grid();
    return;  // (b) reports it
  }
  if (early) {
    // Warp s prefetches group s's code lines (and its rows' scales) while the preceding
    // kernel finishes; then the wait, before x is read.
    const uint32_t warp = threadIdx.x / 32;
    if (warp < group_count) prefetch_group(w, group_list[warp], threadIdx.x % 32);
    wait_for_preceding_grid();
  }

  unsigned char* xs = smem + kp.tables_bytes;
  const size_t x_row_bytes = p.ldx * (p.dtype == QMOE_DTYPE_F32 ? 4 : 2);
  const auto group_of = [](uint32_t round, uint32_t slot) -> int64_t {
    const uint32_t i = round * kWarps + slot;
    return i < group_count ? static_cast<int64_t>(group_list[i]) : -1;
  };
  const auto stage = [&](uint32_t c0) {
    stage_rows<L, MAXM>(
        xs, c0, kp.tc1, p.hidden, wi.count, p.dtype, true, [&](uint32_t m) -> const void* {
          return static_cast<const unsigned char*>(p.x) + size_t(token[m]) * x_row_bytes;
        });
  };
  const auto sink = [&](uint32_t g, uint32_t r, uint32_t sub, const float* acc) {
    const uint32_t n = g * kGroupRows + r, I = p.intermediate;
    if (n >= 2 * I) return;
    uint32_t i, up;
    if (p.fusion == QMOE_SWIGLU_INTERLEAVED) {
      i = n / 2;
      up = n % 2;
    } else {
      up = n >= I;
      i = up ? n - I : n;
    }
    const int32_t j = static_cast<int32_t>(i) - static_cast<int32_t>(32 * unit);
    if (j < 0 || j >= 32) return;
    const float bias = load_bias(w, n);
#pragma unroll
    for (int m = 0; m < MAXM; ++m) {
      if ((m & 3) == static_cast<int>(sub)) h[m][up * 32 + j] = acc[m] + bias;
    }
  };
  const uint32_t rounds = (group_count + kWarps - 1) / kWarps;
  switch (w.scale_dtype) {
    case QMOE_DTYPE_F16:
      run_groups<L, MAXM, QMOE_DTYPE_F16>(w, 1, rounds, kp.tc1, xs, nullptr, group_of, stage, sink);
      break;
    case QMOE_DTYPE_BF16:
      run_groups<L, MAXM, QMOE_DTYPE_BF16>(w, 1, rounds, kp.tc1, xs, nullptr, group_of, stage,
                                           sink);
      break;
    default:
      run_groups<L, MAXM, QMOE_DTYPE_F32>(w, 1, rounds, kp.tc1, xs, nullptr, group_of, stage, sink);
      break;
  }
  __syncthreads();

  // SwiGLU of the unit, one warp per token (route), one intermediate per lane.
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp >= wi.count) return;
  const uint32_t route = wi.first_route + warp;
  const uint32_t i = 32 * unit + lane;
  const float a = i < p.intermediate ? swiglu(h[warp][lane], h[warp][32 + lane], p) : 0.0f;
  unsigned char* act =
      static_cast<unsigned char*>(p.workspace) + kp.act_offset + size_t(route) * kp.act_route_bytes;
  if constexpr (L == Level::kExact) {
    reinterpret_cast<float*>(act)[i] = a;
  } else {
    quantize_warp_chunk(a, lane, act + size_t(unit) * kFastRecordBytes);
  }
}

// ---- (b) FC2 + combine
// ---------------------------------------------------------------------------

// Copies the records of routes [first, first + count) (rows m < MAXM; rows past count zero) and
// chunks [c0, c0 + tc) (zero past `chunks`) from the workspace into a warp's staging area.
template <Level L, int MAXM>
__device__ __forceinline__ void stage_routes(unsigned char* xs, const unsigned char* act,
                                             size_t act_route_bytes, uint32_t first, uint32_t count,
                                             uint32_t c0, uint32_t tc, uint32_t chunks,
                                             uint32_t lane) {
  constexpr uint32_t kPieces = L == Level::kExact ? 8 : 3;  // 16-byte pieces per record
  constexpr uint32_t kGlobalChunkBytes = L == Level::kExact ? 128 : kFastRecordBytes;
  const uint32_t per_row = tc * kPieces, total = MAXM * per_row;
  for (uint32_t idx = lane; idx < total; idx += 32) {
    const uint32_t m = idx / per_row, rem = idx % per_row;
    const uint32_t i = rem / kPieces, part = rem % kPieces;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (m < count && c0 + i < chunks) {
      v = __ldcg(reinterpret_cast<const uint4*>(act + size_t(first + m) * act_route_bytes +
                                                size_t(c0 + i) * kGlobalChunkBytes + part * 16));
    }
    *reinterpret_cast<uint4*>(xs + size_t(m * tc + i) * record_bytes<L>() + part * 16) = v;
  }
}

// One work item's 8 FC2 outputs (group g of H) for its routes, into y2[route * stride + r].
template <Level L, int MAXM, qmoe_dtype SD>
__device__ __forceinline__ void fc2_item(const MoeKernelParams& kp, const DeviceQuantMatrix& w,
                                         const WorkItem& wi, uint32_t g, unsigned char* xs,
                                         float* y2, size_t y2_stride) {
  constexpr int U = batch_quads<MAXM>();
  const uint32_t lane = threadIdx.x % 32, r = lane % kGroupRows, sub = lane / kGroupRows;
  const unsigned char* act = static_cast<const unsigned char*>(kp.p.workspace) + kp.act_offset;
  const uint32_t tc = kp.tc2, tiles = (w.chunks + tc - 1) / tc;
  const bool b16 = w.block_size == 16;
  const LaneRow lr = lane_row(w, g, r);
  float acc[MAXM];
#pragma unroll
  for (int m = 0; m < MAXM; ++m) acc[m] = 0.0f;
  for (uint32_t t = 0; t < tiles; ++t) {
    const uint32_t c0 = t * tc, c_end = min(c0 + tc, w.chunks);
    const uint32_t q_end = (c_end + kQuadChunks - 1) / kQuadChunks;
    uint32_t q = c0 / kQuadChunks;
    Batch<U> b;
    load_batch<U, SD>(b, w, lr, sub, q, 1, q_end, c_end, c0);
    stage_routes<L, MAXM>(xs, act, kp.act_route_bytes, wi.first_route, wi.count, c0, tc, w.chunks,
                          lane);
    __syncwarp();
    for (;;) {
      compute_batch<L, MAXM, U>(b, b16, xs, tc, acc);
      q += U;
      if (q >= q_end) break;
      load_batch<U, SD>(b, w, lr, sub, q, 1, q_end, c_end, c0);
    }
    __syncwarp();  // the staging area is rewritten by the next tile or item
  }
  reduce_row_lanes<MAXM>(acc);
  const uint32_t n = g * kGroupRows + r;
  if (n >= w.n) return;
  const float bias = load_bias(w, n);
#pragma unroll
  for (int m = 0; m < MAXM; ++m) {
    if ((m & 3) != static_cast<int>(sub) || m >= static_cast<int>(wi.count)) continue;
    y2[size_t(wi.first_route + m) * y2_stride + r] = acc[m] + bias;
  }
}

template <Level L, int MAXM>
__global__ void __launch_bounds__(kThreads, MAXM >= 8 ? 1 : 2)
    moe_fc2_kernel(const __grid_constant__ MoeKernelParams kp) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ RouteInfo info;
  __shared__ __align__(16) DeviceQuantMatrix mats[kWarps];
  const MoeLayerParams& p = kp.p;
  constexpr uint32_t T = MAXM;
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t g = blockIdx.x;

  // Before the wait: only the call's own inputs.
  const RouteTables tab = carve_route_tables(smem, kp.slots_cap, p.num_experts);
  build_routes(p, tab, info, T);
  bool bad = false;
  if (info.error == 0) {
    for (uint32_t item = threadIdx.x; item < info.items; item += kThreads) {
      const WorkItem wi = find_item(p, tab, item, T);
      bad |= !slot_matrices_valid(p, tab.residency[wi.expert]);
    }
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(&info.error, kMoeErrorSlotMatrix);
  __syncthreads();
  const bool failed = info.error != 0;
  const uint32_t items = failed ? 0 : info.items;
  for (uint32_t item = warp; item < items; item += kWarps) {
    const WorkItem wi = find_item(p, tab, item, T);
    const DeviceQuantMatrix w = load_matrix(p.fc2 + tab.residency[wi.expert]);
    prefetch_group(w, g, lane);  // validated above
  }

  wait_for_preceding_grid();
  allow_dependent_launch();
  if (blockIdx.x == 0 && threadIdx.x == 0) *static_cast<uint32_t*>(p.workspace) = info.error;

  unsigned char* xs_all = smem + kp.tables_bytes;
  float* y2;
  size_t y2_stride;
  if (kp.y2_in_smem) {
    y2 = reinterpret_cast<float*>(xs_all + size_t(kWarps) * MAXM * kp.tc2 * record_bytes<L>());
    y2_stride = kGroupRows;
  } else {
    y2 = reinterpret_cast<float*>(static_cast<unsigned char*>(p.workspace) + kp.y2_offset) +
         size_t(g) * kGroupRows;
    y2_stride = p.hidden;
  }
  unsigned char* xs = xs_all + size_t(warp) * MAXM * kp.tc2 * record_bytes<L>();
  for (uint32_t item = warp; item < items; item += kWarps) {
    const WorkItem wi = find_item(p, tab, item, T);
    copy_matrix(&mats[warp], p.fc2 + tab.residency[wi.expert], lane, 32);
    __syncwarp();
    const DeviceQuantMatrix& w = mats[warp];
    switch (w.scale_dtype) {
      case QMOE_DTYPE_F16:
        fc2_item<L, MAXM, QMOE_DTYPE_F16>(kp, w, wi, g, xs, y2, y2_stride);
        break;
      case QMOE_DTYPE_BF16:
        fc2_item<L, MAXM, QMOE_DTYPE_BF16>(kp, w, wi, g, xs, y2, y2_stride);
        break;
      default:
        fc2_item<L, MAXM, QMOE_DTYPE_F32>(kp, w, wi, g, xs, y2, y2_stride);
        break;
    }
    __syncwarp();  // mats[warp] is rewritten by the next item
  }
  __syncthreads();

  // Combine: y[t, n] = (accumulate ? y : 0) + sum over slots in order of w * out, in FP32,
  // rounded once; zero for every row this call covers when its input was invalid.
  for (uint32_t idx = threadIdx.x; idx < info.m_out * kGroupRows; idx += kThreads) {
    const uint32_t t = idx / kGroupRows, rr = idx % kGroupRows, n = g * kGroupRows + rr;
    if (n >= p.hidden) continue;
    const size_t at = size_t(t) * p.ldy + n;
    float sum = 0.0f;
    if (!failed) {
      if (p.accumulate) sum = load_widened_cg(p.y, at, p.dtype);
      for (uint32_t j = 0; j < p.top_k; ++j) {
        const uint32_t s = t * p.top_k + j;
        const int32_t route = tab.slot_route[s];
        if (route >= 0) sum = __fmaf_rn(tab.sel_w[s], y2[size_t(route) * y2_stride + rr], sum);
      }
    }
    store_narrowed(p.y, at, p.dtype, sum);
  }
}

// ---- Host side ---------------------------------------------------------------------------------

uint32_t tokens_per_item(uint32_t m_capacity) {
  return m_capacity <= 1 ? 1 : m_capacity <= 2 ? 2 : m_capacity <= 4 ? 4 : 8;
}

size_t round_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

uint32_t tile_chunks(uint32_t chunks, uint32_t budget, uint32_t rows, uint32_t record) {
  uint32_t tc = budget / (rows * record) / 4 * 4;
  if (tc < 4) tc = 4;
  const uint32_t needed = (chunks + 3) / 4 * 4;
  return needed < tc ? needed : tc;
}

// Work items at most: sum over experts of ceil(count / T) with sum(count) <= S and at most
// min(E, S) experts with a route.
uint32_t max_items(uint32_t slots, uint32_t experts, uint32_t T) {
  const uint64_t active = slots < experts ? slots : experts;
  const uint64_t bound = (uint64_t{slots} + (T - 1) * active) / T;
  return static_cast<uint32_t>(bound < slots ? bound : slots);
}

using KernelFn = void (*)(MoeKernelParams);

template <Level L>
void pick_kernels(uint32_t T, KernelFn* fc1, KernelFn* fc2) {
  switch (T) {
    case 1:
      *fc1 = moe_fc1_kernel<L, 1>;
      *fc2 = moe_fc2_kernel<L, 1>;
      break;
    case 2:
      *fc1 = moe_fc1_kernel<L, 2>;
      *fc2 = moe_fc2_kernel<L, 2>;
      break;
    case 4:
      *fc1 = moe_fc1_kernel<L, 4>;
      *fc2 = moe_fc2_kernel<L, 4>;
      break;
    default:
      *fc1 = moe_fc1_kernel<L, 8>;
      *fc2 = moe_fc2_kernel<L, 8>;
      break;
  }
}

// Programmatic dependent launch unless QMOE_CUDA_PDL=0 (read once; for A/B measurements).
bool pdl_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("QMOE_CUDA_PDL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

cudaError_t launch(KernelFn fn, dim3 grid, size_t smem, bool pdl, const MoeKernelParams& kp,
                   cudaStream_t stream) {
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(reinterpret_cast<const void*>(fn),
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = pdl ? &attribute : nullptr;
  config.numAttrs = pdl ? 1 : 0;
  cudaError_t e = cudaLaunchKernelEx(&config, fn, kp);
  if (e != cudaSuccess && pdl) {
    // A runtime or stream that refuses the attribute: clear that (non-sticky) error and launch
    // in plain stream order, unless a capture is in progress (its state is the caller's).
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capturing) == cudaSuccess &&
        capturing == cudaStreamCaptureStatusNone) {
      cudaGetLastError();
      config.attrs = nullptr;
      config.numAttrs = 0;
      e = cudaLaunchKernelEx(&config, fn, kp);
    }
  }
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace

size_t moe_layer_workspace_size(uint32_t m_capacity, uint32_t top_k, uint32_t num_experts,
                                uint32_t hidden, uint32_t intermediate) {
  if (m_capacity == 0 || top_k == 0 || top_k > num_experts || num_experts > kMoeMaxExperts ||
      hidden == 0 || intermediate == 0 || uint64_t{m_capacity} * top_k > kMoeMaxSlots) {
    return 0;
  }
  const size_t slots = size_t{m_capacity} * top_k;
  const size_t chunks = (size_t{intermediate} + 31) / 32;
  return kHeaderBytes + round_up(slots * chunks * 128, 256) + round_up(slots * hidden * 4, 256);
}

cudaError_t launch_moe_layer(const MoeLayerParams& p, cudaStream_t stream) {
  const size_t ws =
      moe_layer_workspace_size(p.m_capacity, p.top_k, p.num_experts, p.hidden, p.intermediate);
  const bool routing_ok = (p.logits != nullptr) != (p.ids != nullptr || p.weights != nullptr) &&
                          (p.logits != nullptr || (p.ids != nullptr && p.weights != nullptr));
  if (ws == 0 || p.workspace == nullptr || p.workspace_bytes < ws ||
      (reinterpret_cast<uintptr_t>(p.workspace) & 255) != 0 || p.num_slots == 0 ||
      p.num_slots > 0x7FFFFFFFu || p.fc1 == nullptr || p.fc2 == nullptr || p.m == nullptr ||
      p.x == nullptr || p.y == nullptr || p.residency == nullptr || !routing_ok ||
      (p.accuracy != QMOE_ACCURACY_EXACT && p.accuracy != QMOE_ACCURACY_FAST) ||
      !is_activation_dtype_value(p.dtype) ||
      (p.fusion != QMOE_SWIGLU_INTERLEAVED && p.fusion != QMOE_SWIGLU_CONCATENATED) ||
      !std::isfinite(p.alpha) || !std::isfinite(p.beta) || !(p.limit > 0.0f) ||
      (p.m_capacity > 1 && (p.ldx < p.hidden || p.ldy < p.hidden)) ||
      uint64_t{p.hidden} * 2 > 0x7FFFFFFFu || uint64_t{p.intermediate} * 2 > 0x7FFFFFFFu) {
    return cudaErrorInvalidValue;
  }
  const bool exact = p.accuracy == QMOE_ACCURACY_EXACT;
  const uint32_t record = exact ? kExactRecordBytes : kFastRecordBytes;
  MoeKernelParams kp{};
  kp.p = p;
  kp.tokens_per_item = tokens_per_item(p.m_capacity);
  kp.slots_cap = p.m_capacity * p.top_k;
  kp.inter_chunks = (p.intermediate + 31) / 32;
  kp.act_offset = kHeaderBytes;
  kp.act_route_bytes = size_t{kp.inter_chunks} * (exact ? 128 : kFastRecordBytes);
  kp.y2_offset = kHeaderBytes + round_up(size_t{kp.slots_cap} * kp.inter_chunks * 128, 256);
  kp.tables_bytes = static_cast<uint32_t>(route_table_bytes(kp.slots_cap, p.num_experts));
  const uint32_t T = kp.tokens_per_item;
  kp.tc1 = tile_chunks((p.hidden + 31) / 32, kStageBudgetBytes, T, record);
  kp.tc2 = tile_chunks(kp.inter_chunks, kWarpStageBudgetBytes, T, record);
  kp.y2_in_smem = kp.slots_cap <= kSmemY2MaxSlots;

  const size_t smem1 = kp.tables_bytes + size_t{T} * kp.tc1 * record;
  const size_t smem2 = kp.tables_bytes + size_t{kWarps} * T * kp.tc2 * record +
                       (kp.y2_in_smem ? size_t{kp.slots_cap} * kGroupRows * 4 : 0);
  int device = 0, major = 0, smem_max = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) {
    e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  }
  if (e == cudaSuccess) {
    e = cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  if (e != cudaSuccess) return e;
  // Static shared memory of either kernel stays under 6 KiB.
  if (smem1 + 6 * 1024 > size_t(smem_max) || smem2 + 6 * 1024 > size_t(smem_max)) {
    return cudaErrorInvalidValue;
  }
  KernelFn fc1 = nullptr, fc2 = nullptr;
  if (exact) {
    pick_kernels<Level::kExact>(T, &fc1, &fc2);
  } else {
    pick_kernels<Level::kFast>(T, &fc1, &fc2);
  }
  const bool pdl = major >= 9 && pdl_enabled();
  const dim3 grid1(kp.inter_chunks, max_items(kp.slots_cap, p.num_experts, T));
  const dim3 grid2((p.hidden + kGroupRows - 1) / kGroupRows);
  e = launch(fc1, grid1, smem1, pdl, kp, stream);
  if (e != cudaSuccess) return e;
  return launch(fc2, grid2, smem2, pdl, kp, stream);
}

}  // namespace qmoe::cuda
