// The MoE layer's two kernels and their launcher (moe_layer.cuh says what each computes).
//
// Workspace: [0, 256) the error word; then the SwiGLU activations of every route, FP32 rows of
// ceil(I / 32) * 32 values (values past I are never written and never read: FC2 stages k < I
// only); then FC2's outputs per route, [m_capacity * k][H] FP32, used when they do not fit in
// (b)'s shared memory.
//
// Ordering (grid_dependency.cuh states the contract). (a) waits for the preceding stream work
// (griddepcontrol.wait: a no-op without programmatic launch) before reading anything, or, with
// inputs_ready_early, after building its routing and prefetching its FC1 weights into the L2 but
// before reading x; every block of (a) waits before it exits, and (a) lets (b) launch at once.
// (b) reads only the call's inputs before its own wait (routing, residency, slot descriptions,
// through the L2 with ld.global.cg; complete when (a) started), prefetches its FC2 weights into
// the L2, then waits for (a) to complete before reading (a)'s activations or writing anything.
// Neither kernel writes global memory before its wait, so a layer's (a) never overwrites
// activations the previous layer's (b) still reads, and the completion of (b) implies that of
// everything before it in the stream.
//
// Residency. The grids are sized so that both kernels' blocks fit on every SM at once (3 blocks
// of 256 threads at 80 registers: two of (a), one of (b)): (b)'s blocks start, route and prefetch
// while (a) computes, and the next layer's (a) does the same while (b) computes.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "lib/cuda/activation_stage.cuh"
#include "lib/cuda/decode_formats.cuh"
#include "lib/cuda/grid_dependency.cuh"
#include "lib/cuda/int4_block.cuh"
#include "lib/cuda/moe_layer.cuh"
#include "lib/cuda/moe_routes.cuh"
#include "lib/cuda/offload_cta.cuh"

namespace qmoe::cuda {
namespace {

constexpr uint32_t kThreads = kBlockThreads;
constexpr uint32_t kWarps = kBlockWarps;
constexpr size_t kHeaderBytes = 256;                  // the error word's line
constexpr uint32_t kStageBudgetBytes = 36 * 1024;     // (a)'s X tile
constexpr uint32_t kWarpStageBudgetBytes = 7 * 1024;  // (b)'s activation tile per warp
constexpr uint32_t kSmemY2MaxEntries = 1024;          // (b) keeps (route, group) outputs in smem
// Shared memory a block needs beside its dynamic part: a bound on either kernel's static shared
// memory, and the per-block reserve the SM keeps.
constexpr size_t kStaticSmemBoundBytes = 6 * 1024;
constexpr size_t kBlockSmemReserveBytes = 1024;
constexpr uint32_t kFc1BlocksPerSm = 2;  // (a) blocks per SM, beside one of (b)
constexpr uint32_t kFc2BlocksPerSm = 1;
// With more (a) tasks than one wave of kFc1BlocksPerSm: (a) alone on the SMs, as many blocks as
// the register cap lets one SM hold, then (b) two blocks per SM; (b) two blocks per SM at eight
// tokens an item too (launch_moe_layer).
constexpr uint32_t kFillFc1BlocksPerSm = kDecodeMinBlocksPerSm;
constexpr uint32_t kFillFc2BlocksPerSm = 2;
constexpr uint32_t kFc2PrefetchItemsPerWarp = 2;  // items whose FC2 rows a warp prefetches
constexpr uint32_t kFc2PrefetchRounds = 2;        // of the block's groups

static_assert(sizeof(DeviceQuantMatrix) % 8 == 0, "copied as 8-byte words");

struct MoeKernelParams {
  MoeLayerParams p;
  uint32_t tokens_per_item;  // T
  uint32_t slots_cap;        // m_capacity * k
  uint32_t inter_chunks;     // ceil(I / 32): FC2's K chunks
  uint32_t fc1_tasks;        // (a) tasks per work item (fc1_task_groups)
  uint32_t fc1_task_groups;  // most FC1 groups one task computes: 1, 2 or 3
  uint32_t fc2_groups;       // ceil(H / 8)
  uint32_t fc2_rounds;       // groups per (b) block: block b takes b, b + grid, ...
  size_t act_offset;         // workspace bytes
  size_t act_route_bytes;    // inter_chunks * 128
  size_t y2_offset;
  uint32_t tables_bytes;
  uint32_t tc1;  // FC1 K tile (chunks of H)
  uint32_t tc2;  // FC2 K tile (chunks of I), per warp
  bool y2_in_smem;
};

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

// A slot's FC1 and FC2 have the call's shapes and the format of F, the kernels' decode policy
// (p.format: every slot of a set has the same), described as its code requires.
template <class F>
__device__ __forceinline__ bool fc1_matrix_ok(const DeviceQuantMatrix& a, const MoeLayerParams& p) {
  return F::valid(a) && a.n == 2 * p.intermediate && a.k == p.hidden;
}

template <class F>
__device__ __forceinline__ bool fc2_matrix_ok(const DeviceQuantMatrix& b, const MoeLayerParams& p) {
  return F::valid(b) && b.n == p.hidden && b.k == p.intermediate;
}

template <class F>
__device__ __forceinline__ bool slot_matrices_valid(const MoeLayerParams& p, int32_t slot) {
  return fc1_matrix_ok<F>(load_matrix(p.fc1 + slot), p) &&
         fc2_matrix_ok<F>(load_matrix(p.fc2 + slot), p);
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

// The classify-publish arguments of the call p describes (moe_layer.cuh: MoeOffloadSteps).
__device__ __forceinline__ offload::ClassifyArgs classify_args(const MoeLayerParams& p) {
  offload::ClassifyArgs a{};
  a.state = p.offload.state;
  a.record = p.offload.record;
  a.token_cold = p.offload.token_cold;
  a.ring = p.offload.ring;
  a.layout = p.offload.layout;
  a.m = p.m;
  a.ids = p.ids;
  a.weights = p.weights;
  a.residency = p.residency;
  a.x = p.x;
  a.ldx = p.ldx;
  a.layer = p.offload.layer;
  a.m_capacity = p.m_capacity;
  a.k = p.top_k;
  a.num_experts = p.num_experts;
  a.num_slots = p.num_slots;
  a.dtype = static_cast<uint32_t>(p.dtype);
  a.accuracy = static_cast<uint32_t>(p.accuracy);
  a.short_circuit = p.offload.short_circuit ? 1 : 0;
  return a;
}

// ---- (a) FC1 + SwiGLU ---------------------------------------------------------------------------
//
// Work. The call's (work item, task) pairs, item-major, are split into one contiguous range per
// block. A task is what one warp computes on its own, start to end, with no other warp:
//   interleaved fusion: FC1 group t (rows 8t..8t+7 = gate and up of intermediates 4t..4t+3);
//   concatenated: intermediates 8t..8t+7, i.e. gate group t and the one or two groups holding
//   up rows I + 8t..I + 8t + 7 (two when I % 8 != 0).
// A block walks its range one work item (a "segment") at a time: it stages the item's tokens'
// X rows once (block-wide, all of H when it fits the tile, as it does for H = 2048 at T <= 4),
// then warp w takes tasks w, w + 8, ... of the segment: for each of the task's groups the lanes
// walk K (int4_tile.cuh) and the 4 lanes of each row sum, row sums plus bias go to the warp's
// own shared scratch h, and then every lane computes SwiGLU for
// (token, intermediate) pairs and writes the FP32 activation to the workspace. Nothing is
// shared between warps inside a segment, so there are no block barriers there (with tiles of X,
// every warp steps through the tiles together: each tile is staged between two barriers).
//
// Spread segments (kernels of one token an item). When a segment's tasks times their groups fit
// the block's warps (the concatenated fusion at M = 1: a Qwen3-shaped layer gives a block 3 tasks
// of 2 groups), warp w walks group w % G of task w / G instead of one warp walking its task's G
// groups in turn while the other warps idle: the walks run side by side, their row sums meet in
// the task's scratch h[w / G] (each group writes its own rows' entries) behind one block
// barrier, and warp G * (w / G) computes the task's SwiGLU.
//
// L1 prefetch (kernels of one token an item). A warp walks a group (16 quads at K = 2048) with
// two batches in registers, so each batch waits about one memory latency; the walk also keeps
// the next 8 quads in flight as L1 prefetches (int4_tile.cuh). Measured on the H200 it made the
// 48-layer stack at M = 1 faster, except with inputs_ready_early (whose first tasks the blocks
// prefetch into the L2 before their wait), which it made slightly slower, so those calls run
// instances without it (kPrefetchL1); FC2's shorter walks (6 quads at K = 768) were slower with
// it in every row, so they do not prefetch (docs/results/2026-12-04-h200-moe-l1-prefetch.md).

struct TaskGroups {
  uint32_t i0;          // first intermediate of the task
  uint32_t count;       // groups (1..3)
  uint32_t g0, g1, g2;  // scalars, not an array: a run-time index would put it in local memory
  __device__ __forceinline__ uint32_t group(uint32_t i) const {
    return i == 0 ? g0 : i == 1 ? g1 : g2;
  }
};

__device__ __forceinline__ TaskGroups task_groups(const MoeLayerParams& p, uint32_t task) {
  TaskGroups tg;
  tg.g0 = tg.g1 = tg.g2 = task;  // gate rows 8t..8t+7 (interleaved: the task's only group)
  tg.count = 1;
  if (p.fusion == QMOE_SWIGLU_INTERLEAVED) {
    tg.i0 = 4 * task;
    return tg;
  }
  const uint32_t I = p.intermediate;
  tg.i0 = 8 * task;
  // Up rows I + i0 .. I + min(i0 + 8, I) - 1, in the groups after the gate group (with I < 8
  // the gate group holds up rows too): at most two.
  const uint32_t u0 = (I + tg.i0) / kGroupRows;
  const uint32_t u1 = (I + min(tg.i0 + kGroupRows, I) - 1) / kGroupRows;
  const uint32_t first = max(u0, task + 1);
  if (first <= u1) {
    tg.g1 = first;
    tg.count = 2;
  }
  if (first + 1 <= u1) {
    tg.g2 = first + 1;
    tg.count = 3;
  }
  return tg;
}

template <class F, Level L, int MC, bool kSpread, bool kPrefetchL1>
__device__ __forceinline__ void fc1_segment(const MoeKernelParams& kp, const DeviceQuantMatrix& w,
                                            const WorkItem& wi, uint64_t t0, uint64_t t1,
                                            unsigned char* xs, const int32_t* token,
                                            float (*h)[2][8][8]) {
  constexpr int U = F::batch_quads(L, MC, false);
  constexpr int kAhead = MC == 1 && kPrefetchL1 ? l1_ahead_batches<U>() : 0;
  const MoeLayerParams& p = kp.p;
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t r = lane % kGroupRows, sub = lane / kGroupRows;
  const uint32_t tc = kp.tc1, tiles = (w.chunks + tc - 1) / tc;
  const uint32_t I = p.intermediate;
  const bool interleaved = p.fusion == QMOE_SWIGLU_INTERLEAVED;
  const uint32_t J = interleaved ? 4 : 8;  // intermediates of a task
  const size_t x_row_bytes = p.ldx * (p.dtype == QMOE_DTYPE_F32 ? 4 : 2);
  const uint32_t G = kp.fc1_task_groups;
  const uint32_t per_round = kSpread ? kWarps / G : kWarps;  // tasks a round
  const uint32_t slot = kSpread ? warp / G : warp;           // the task's index in its round
  const uint32_t gi_begin = kSpread ? warp % G : 0, gi_end = kSpread ? gi_begin + 1 : G;
  const uint32_t rounds = static_cast<uint32_t>((t1 - t0 + per_round - 1) / per_round);

  for (uint32_t round = 0; round < rounds; ++round) {
    const uint64_t task = t0 + uint64_t{round} * per_round + slot;
    const bool active = slot < per_round && task < t1;
    const TaskGroups tg = task_groups(p, active ? static_cast<uint32_t>(task % kp.fc1_tasks) : 0u);
    for (uint32_t gi = gi_begin; gi < gi_end; ++gi) {  // the same count on every warp
      const bool has = active && gi < tg.count;
      const bool first = round == 0 && gi == gi_begin;
      const uint32_t g = tg.group(gi);
      float acc[MC];
#pragma unroll
      for (int m = 0; m < MC; ++m) acc[m] = 0.0f;
      for (uint32_t t = 0; t < tiles; ++t) {
        const QuadWalk qw = tile_walk(wi.count, sub, 1, t * tc, tc, w.chunks);
        const uint32_t q0 = qw.tile_c0 / kQuadChunks;
        const typename F::Row lr = F::row(w, g, r);
        const typename F::Walk wm = F::walk(w);
        typename F::template Batch<U> a{}, b{};
        if (has) F::template prime<U, kAhead>(a, b, wm, lr, qw, q0);  // loads fly while X is staged
        if (tiles > 1 || first) {
          if (!first || t != 0) __syncthreads();  // the last tile is done with
          stage_rows<L, MC>(xs, qw.tile_c0, tc, p.hidden, wi.count, p.dtype, true,
                            [&](uint32_t m) -> const void* {
                              return static_cast<const unsigned char*>(p.x) +
                                     size_t(token[m]) * x_row_bytes;
                            });
          __syncthreads();
        }
        if (has) F::template run<L, MC, U, kAhead>(a, b, wm, lr, qw, q0, xs, acc);
      }
      if (!has) continue;  // warp-uniform
      reduce_row_lanes<MC>(acc);
      // Row n of FC1 -> (intermediate, gate or up); the task's rows go to h[up][m][j].
      const uint32_t n = g * kGroupRows + r;
      if (n < 2 * I) {
        const uint32_t up = interleaved ? n % 2 : (n >= I ? 1 : 0);
        const uint32_t i = interleaved ? n / 2 : (up ? n - I : n);
        const uint32_t j = i - tg.i0;  // wraps around when i < i0
        if (j < J) {
          const float bias = load_bias(w, n);
#pragma unroll
          for (int m = 0; m < MC; ++m) {
            if ((m & 3) == static_cast<int>(sub)) {
              h[slot][up][m][j] = F::template finish<L>(acc[m], w) + bias;
            }
          }
        }
      }
    }
    if (kSpread) {
      __syncthreads();  // every group of the task has written its rows to h[slot]
    } else {
      __syncwarp();
    }
    if (!active || gi_begin != 0) continue;
    // SwiGLU of the task's (token, intermediate) pairs, one per lane.
    for (uint32_t idx = lane; idx < MC * J; idx += 32) {
      const uint32_t m = idx / J, j = idx % J, i = tg.i0 + j;
      if (m >= wi.count || i >= I) continue;
      float* act =
          reinterpret_cast<float*>(static_cast<unsigned char*>(p.workspace) + kp.act_offset +
                                   size_t(wi.first_route + m) * kp.act_route_bytes);
      act[i] = swiglu(h[slot][0][m][j], h[slot][1][m][j], p);
    }
    // h is rewritten by the next task (a spread segment has one round, and the next segment
    // starts behind a block barrier).
    __syncwarp();
  }
}

// kSpread (T = 1 only): the kernel may spread its segments (fc1_segment), each segment through
// the instance its size calls for. The launcher picks it for tasks of more than one group, i.e.
// the concatenated fusion; the other kernels hold the plain instance alone, because holding both
// cost the interleaved layer registers and time on the H200
// (docs/results/2026-12-04-h200-moe-spread-segments.md).
// kPrefetchL1 (T = 1 only): the walks prefetch into the L1 (fc1_segment). The launcher picks the
// instance without it for inputs_ready_early, where the blocks prefetch their first tasks into
// the L2 before their wait and the L1 prefetch measured slower.
template <class F, Level L, int T, bool kSpread = false, bool kPrefetchL1 = true>
__global__ void __launch_bounds__(kThreads, kDecodeMinBlocksPerSm)
    moe_fc1_kernel(const __grid_constant__ MoeKernelParams kp) {
  QMOE_DECODE_DYNAMIC_SMEM(smem);
  __shared__ RouteInfo info;
  __shared__ __align__(16) DeviceQuantMatrix mat;
  __shared__ int32_t token[T];
  __shared__ float h[kWarps][2][8][8];  // a round's tasks: gate and up sums, [token][j]
  const MoeLayerParams& p = kp.p;
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // The offload's classify-publish is block 0's whole work (moe_layer.cuh). It reads m, the
  // routing and x, which the preceding kernel may write: it waits first. Given router logits,
  // the block first routes them as every block of both kernels does (moe_routes.cuh), and the
  // request carries the ids and weights of its tables (the CPU runs what the GPU routed); a
  // call whose routing the tables found invalid is refused, as the kernels refuse it.
  if (p.offload.enabled && blockIdx.x == 0) {
    wait_for_preceding_grid();
    allow_dependent_launch();
    DeviceCta cta;
    offload::ClassifyArgs a = classify_args(p);
    unsigned char* classify_smem = smem;
    if (p.logits != nullptr) {
      const RouteTables tab = carve_route_tables(smem, kp.slots_cap, p.num_experts);
      build_routes(p, tab, info, T);
      a.ids = tab.sel_id;
      a.weights = tab.sel_w;
      a.routing_invalid = info.error != 0 ? 1u : 0u;
      classify_smem = smem + kp.tables_bytes;  // 16-byte aligned (route_table_bytes)
    }
    offload::classify_publish(cta, *reinterpret_cast<offload::ClassifyShared*>(classify_smem), a);
    return;
  }
  const uint32_t first_block = p.offload.enabled ? 1 : 0;
  const uint32_t block = blockIdx.x - first_block, blocks = gridDim.x - first_block;

  // Nothing is written to global memory before the wait, so (b), and the next layer, may
  // start as soon as every block of this grid runs.
  const bool early = p.inputs_ready_early;
  if (!early) wait_for_preceding_grid();
  allow_dependent_launch();
  const RouteTables tab = carve_route_tables(smem, kp.slots_cap, p.num_experts);
  build_routes(p, tab, info, T);
  // This block's range of the (item, task) list (64-bit: items x tasks may pass 2^32 for an
  // intermediate size near its limit).
  const uint64_t total = info.error != 0 ? 0 : uint64_t{info.items} * kp.fc1_tasks;
  const uint64_t per = (total + blocks - 1) / blocks;
  const uint64_t t_begin = block * per < total ? block * per : total;
  const uint64_t t_end = t_begin + per < total ? t_begin + per : total;

  // With inputs_ready_early, each warp prefetches the groups of its first task into the L2
  // while the preceding kernel finishes. Without it the wait has already returned, and a
  // prefetch there only delays the walks that load the same groups: measured on the H200, the
  // 48-layer stack at M = 1 took 4.5% longer with it
  // (docs/results/2026-12-02-h200-moe-prefetch-hybrid-split.md).
  if (early && t_begin + warp < t_end) {
    const uint64_t task = t_begin + warp;
    const WorkItem wi = find_item(p, tab, static_cast<uint32_t>(task / kp.fc1_tasks), T);
    const DeviceQuantMatrix w = load_matrix(p.fc1 + tab.residency[wi.expert]);
    if (fc1_matrix_ok<F>(w, p)) {
      const TaskGroups tg = task_groups(p, static_cast<uint32_t>(task % kp.fc1_tasks));
      for (uint32_t i = 0; i < tg.count; ++i)
        prefetch_group(w, tg.group(i), lane, F::scale_bytes(w));
    }
  }
  // Every block waits before it exits, so this grid's completion implies the preceding one's
  // (which (b), and whatever follows it, rely on).
  if (early) wait_for_preceding_grid();

  unsigned char* xs = smem + kp.tables_bytes;
  for (uint64_t t = t_begin; t < t_end;) {  // block-uniform
    const uint32_t item = static_cast<uint32_t>(t / kp.fc1_tasks);
    const uint64_t item_end = uint64_t{item + 1} * kp.fc1_tasks;
    const uint64_t seg_end = item_end < t_end ? item_end : t_end;
    const WorkItem wi = find_item(p, tab, item, T);
    __syncthreads();  // every warp is done with the last segment's matrix, tokens and X
    copy_matrix(&mat, p.fc1 + tab.residency[wi.expert], threadIdx.x, kThreads);
    if (threadIdx.x < wi.count) {
      token[threadIdx.x] =
          tab.route_slot[wi.first_route + threadIdx.x] / static_cast<int32_t>(p.top_k);
    }
    __syncthreads();
    if (fc1_matrix_ok<F>(mat, p)) {  // else skipped: (b) reports it
      bool spread = false;
      if constexpr (kSpread) spread = (seg_end - t) * kp.fc1_task_groups <= kWarps;
      if (spread) {
        fc1_segment<F, L, T, true, kPrefetchL1>(kp, mat, wi, t, seg_end, xs, token, h);
      } else {
        fc1_segment<F, L, T, false, kPrefetchL1>(kp, mat, wi, t, seg_end, xs, token, h);
      }
    }
    t = seg_end;
  }
}

// ---- (b) FC2 + combine --------------------------------------------------------------------------
//
// Work. Block b owns output groups b, b + grid, ... of H (fc2_rounds of them) for every route.
// Warp w takes work items w, w + 8, ...: it stages the item's routes' activations once into its
// own shared area (FP32 records, or int8 records quantized per 32 as the CPU quantizes FC2's
// input), then computes each of the block's groups for those routes and keeps the results per
// (route, group). kByRound, for calls of one token and top-k below 8 (gpt-oss's top-4, say),
// whose items leave warps idle: the rounds are dealt over the warps as well, (item, round) pair
// p = w, w + 8, ... being item p % items, round p / items, so no warp walks several rounds while
// another has none (measured: docs/results/2026-12-05-h100-fc2-round-deal.md). Either way one
// warp computes each (route, group), in the same order, so the bits do not depend on the deal. A
// kernel of its own, so that the other kernels' registers are not the two loops' (at the
// 80-register cap either loop beside the other spilled more). After a barrier the block combines
// every token's slots in slot order.

// Rounds [gr_begin, gr_end) of the block's groups for item wi. stage_first: the warp's staging
// area does not hold the item's activations yet (with one tile a warp stages them once an item).
template <class F, Level L, int MC>
__device__ __forceinline__ void fc2_item(const MoeKernelParams& kp, const DeviceQuantMatrix& w,
                                         const WorkItem& wi, unsigned char* xs, float* y2s,
                                         float* y2g, uint32_t gr_begin, uint32_t gr_end,
                                         bool stage_first) {
  constexpr int U = F::batch_quads(L, MC, false);
  const uint32_t lane = threadIdx.x % 32, r = lane % kGroupRows, sub = lane / kGroupRows;
  const unsigned char* act = static_cast<const unsigned char*>(kp.p.workspace) + kp.act_offset +
                             size_t(wi.first_route) * kp.act_route_bytes;
  const uint32_t tc = kp.tc2, tiles = (w.chunks + tc - 1) / tc;
  for (uint32_t gr = gr_begin; gr < gr_end; ++gr) {
    const uint32_t g = blockIdx.x + gr * gridDim.x;
    if (g >= kp.fc2_groups) break;
    float acc[MC];
#pragma unroll
    for (int m = 0; m < MC; ++m) acc[m] = 0.0f;
    for (uint32_t t = 0; t < tiles; ++t) {
      const QuadWalk qw = tile_walk(wi.count, sub, 1, t * tc, tc, w.chunks);
      const uint32_t q0 = qw.tile_c0 / kQuadChunks;
      const typename F::Row lr = F::row(w, g, r);
      const typename F::Walk wm = F::walk(w);
      typename F::template Batch<U> a{}, b{};
      F::template prime<U>(a, b, wm, lr, qw, q0);  // the loads fly while the activations are staged
      if (tiles > 1 || (gr == gr_begin && t == 0 && stage_first)) {
        __syncwarp();  // every lane is done with the last tile
        stage_f32_warp<L, MC>(xs, act, kp.act_route_bytes, wi.count, qw.tile_c0, tc, w.k, lane);
        __syncwarp();
      }
      F::template run<L, MC, U>(a, b, wm, lr, qw, q0, xs, acc);
    }
    reduce_row_lanes<MC>(acc);
    const uint32_t n = g * kGroupRows + r;
    if (n >= w.n) continue;
    const float bias = load_bias(w, n);
#pragma unroll
    for (int m = 0; m < MC; ++m) {
      if ((m & 3) != static_cast<int>(sub) || m >= static_cast<int>(wi.count)) continue;
      const size_t route = wi.first_route + m;
      const float out = F::template finish<L>(acc[m], w) + bias;
      if (kp.y2_in_smem) {
        y2s[(route * kp.fc2_rounds + gr) * kGroupRows + r] = out;
      } else {
        y2g[route * kp.p.hidden + n] = out;
      }
    }
  }
}

template <class F, Level L, int T, bool kByRound = false>
__global__ void __launch_bounds__(kThreads, kDecodeMinBlocksPerSm)
    moe_fc2_kernel(const __grid_constant__ MoeKernelParams kp) {
  QMOE_DECODE_DYNAMIC_SMEM(smem);
  __shared__ RouteInfo info;
  __shared__ __align__(16) DeviceQuantMatrix mats[kWarps];
  const MoeLayerParams& p = kp.p;
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // Before the wait: only the call's own inputs.
  const RouteTables tab = carve_route_tables(smem, kp.slots_cap, p.num_experts);
  build_routes(p, tab, info, T);
  bool bad = false;
  if (info.error == 0) {
    for (uint32_t item = threadIdx.x; item < info.items; item += kThreads) {
      const WorkItem wi = find_item(p, tab, item, T);
      bad |= !slot_matrices_valid<F>(p, tab.residency[wi.expert]);
    }
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(&info.error, kMoeErrorSlotMatrix);
  __syncthreads();
  const bool failed = info.error != 0;
  const uint32_t items = failed ? 0 : info.items;
  // The call's selections per expert (moe_layer.cuh, expert_counts), counted by block 0 in the
  // logits area of its tables, which nothing reads once the routing is built; every selected
  // slot of a valid call (ids in [0, E), weights finite) counts once if its weight is nonzero.
  const bool counting = p.expert_counts != nullptr && blockIdx.x == 0;  // uniform in the block
  int32_t* const counts = reinterpret_cast<int32_t*>(tab.logit);
  if (counting) {
    for (uint32_t e = threadIdx.x; e < p.num_experts; e += kThreads) counts[e] = 0;
    __syncthreads();
    const uint32_t selected = failed ? 0 : info.slots;
    for (uint32_t s = threadIdx.x; s < selected; s += kThreads) {
      if (tab.sel_w[s] != 0.0f) atomicAdd(&counts[tab.sel_id[s]], 1);
    }
    __syncthreads();
  }
  for (uint32_t item = warp; item < items && item < kFc2PrefetchItemsPerWarp * kWarps;
       item += kWarps) {
    const WorkItem wi = find_item(p, tab, item, T);
    const DeviceQuantMatrix w = load_matrix(p.fc2 + tab.residency[wi.expert]);  // validated
    for (uint32_t gr = 0; gr < kp.fc2_rounds && gr < kFc2PrefetchRounds; ++gr) {
      const uint32_t g = blockIdx.x + gr * gridDim.x;
      if (g < kp.fc2_groups) prefetch_group(w, g, lane, F::scale_bytes(w));
    }
  }

  wait_for_preceding_grid();
  allow_dependent_launch();
  if (blockIdx.x == 0 && threadIdx.x == 0) *static_cast<uint32_t*>(p.workspace) = info.error;
  if (counting) {
    for (uint32_t e = threadIdx.x; e < p.num_experts; e += kThreads) {
      p.expert_counts[e] = static_cast<uint32_t>(counts[e]);
    }
  }

  const size_t warp_stage = size_t(T) * kp.tc2 * record_bytes<L>();
  unsigned char* xs_all = smem + kp.tables_bytes;
  float* y2s = reinterpret_cast<float*>(xs_all + kWarps * warp_stage);
  float* y2g = reinterpret_cast<float*>(static_cast<unsigned char*>(p.workspace) + kp.y2_offset);
  unsigned char* xs = xs_all + warp * warp_stage;
  if constexpr (!kByRound) {
    for (uint32_t item = warp; item < items; item += kWarps) {
      const WorkItem wi = find_item(p, tab, item, T);
      copy_matrix(&mats[warp], p.fc2 + tab.residency[wi.expert], lane, 32);
      __syncwarp();
      fc2_item<F, L, T>(kp, mats[warp], wi, xs, y2s, y2g, 0, kp.fc2_rounds, true);
      __syncwarp();  // mats[warp] and the staging area are rewritten by the next item
    }
  } else {
    uint32_t held = items;  // the item whose matrix and activations the warp holds: none yet
    for (uint32_t pair = warp; pair < items * kp.fc2_rounds; pair += kWarps) {
      const uint32_t item = pair % items, gr = pair / items;
      const WorkItem wi = find_item(p, tab, item, T);
      if (item != held) {
        copy_matrix(&mats[warp], p.fc2 + tab.residency[wi.expert], lane, 32);
        __syncwarp();
      }
      fc2_item<F, L, T>(kp, mats[warp], wi, xs, y2s, y2g, gr, gr + 1, item != held);
      held = item;
      __syncwarp();  // as above
    }
  }
  __syncthreads();

  // Combine: y[t, n] = (accumulate ? y : 0) + sum over slots in order of w * out, in FP32,
  // rounded once; zero for every row this call covers when its input was invalid.
  for (uint32_t gr = 0; gr < kp.fc2_rounds; ++gr) {
    const uint32_t g = blockIdx.x + gr * gridDim.x;
    if (g >= kp.fc2_groups) break;
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
          if (route < 0) continue;
          const float out = kp.y2_in_smem
                                ? y2s[(size_t(route) * kp.fc2_rounds + gr) * kGroupRows + rr]
                                : y2g[size_t(route) * p.hidden + n];
          sum = __fmaf_rn(tab.sel_w[s], out, sum);
        }
      }
      store_narrowed(p.y, at, p.dtype, sum);
    }
  }
}

// ---- Host side ---------------------------------------------------------------------------------

// rho: the caller's expected_tokens_per_expert, else the uniform estimate. At least 1 (the hint
// is checked to lie in [1, M]; M k tokens on at most M k experts).
double tokens_per_routed_expert(const MoeLayerParams& p) {
  const uint32_t m = p.m_capacity;
  if (p.expected_tokens_per_expert > 0.0f) return p.expected_tokens_per_expert;
  if (m <= 1) return 1.0;
  const double share = double(p.top_k) / p.num_experts;  // top_k <= num_experts: checked
  const double routed = p.num_experts * (1.0 - std::pow(1.0 - share, double(m)));
  const double rho = m * p.top_k / routed;
  return rho > 1.0 ? rho : 1.0;
}

// Tokens per work item (T: 1, 2, 4 or 8), the kernels' template argument: fixed when a graph is
// captured, while the tokens that each expert receives change call to call. A larger T decodes an
// expert's weights once for up to T tokens; a smaller one runs more items, each with fewer
// accumulators and registers, and walks an expert with more than T routes once per item (the
// later walks mostly hit the L2). The choice follows rho, the tokens per routed expert that
// uniform routing gives at capacity M: rho = M k / (E (1 - (1 - k / E)^M)), about 1.0 to 1.6 at
// M = 2 to 16 for Qwen3-30B-A3B's E = 128, k = 8:
//   fast level: T = 1 below rho = 2 (since T = 1 calls fill the SMs when FC1's tasks outnumber
//     two blocks' warps an SM, its random-routing calls at M = 2 to 16 ran faster there than at
//     T = 2: docs/results/2026-12-05-h100-fast-level-one-token-items.md), T = 2 below rho = 2.5
//     (not measured at T = 1), else 4. It has no T = 8 kernel: that one was slower than T = 4
//     even with every item full.
//   exact level: T = 1 below rho = 2.5 (its T = 2 and 4 kernels were much slower than T = 1
//     where experts hold a token or two), T = 2 below rho = 8, else 8.
// Where a call's tokens share their experts, rho is larger than that, and a larger T wins
// (docs/results/2026-12-04-h200-moe-tokens-per-item.md): a caller who knows it says so with
// expected_tokens_per_expert, which replaces the uniform estimate.
uint32_t tokens_per_item(const MoeLayerParams& p) {
  const uint32_t m = p.m_capacity;
  if (m <= 1) return 1;
  const double rho = tokens_per_routed_expert(p);
  const bool fast = p.accuracy == QMOE_ACCURACY_FAST;
  uint32_t t = 0;
  if (fast) {
    t = rho < 2.0 ? 1 : rho < 2.5 ? 2 : 4;
  } else {
    t = rho < 2.5 ? 1 : rho < 8.0 ? 2 : 8;
  }
  const uint32_t m_pow2 = m <= 2 ? 2 : m <= 4 ? 4 : 8;  // no more than M needs
  return t < m_pow2 ? t : m_pow2;
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

// The T = 1 instance. spread: the call's tasks have more than one group (kSpread); early:
// inputs_ready_early (no kPrefetchL1).
template <class F, Level L>
KernelFn pick_fc1_one(bool spread, bool early) {
  if (early) {
    return spread ? moe_fc1_kernel<F, L, 1, true, false> : moe_fc1_kernel<F, L, 1, false, false>;
  }
  return spread ? moe_fc1_kernel<F, L, 1, true> : moe_fc1_kernel<F, L, 1>;
}

// The T each level runs (tokens_per_item): 1, 2 and 4 at the fast level, 1, 2 and 8 at the
// exact level; no other instances are compiled.
template <Level L>
constexpr int kLargestT = L == Level::kFast ? 4 : 8;

template <class F, Level L>
KernelFn pick_fc1(uint32_t T, bool spread, bool early) {
  if (T == 1) return pick_fc1_one<F, L>(spread, early);
  if (T == 2) return moe_fc1_kernel<F, L, 2>;
  if (T == kLargestT<L>) return moe_fc1_kernel<F, L, kLargestT<L>>;
  return nullptr;
}

// The T = 1 instance. by_round: FC2's rounds dealt over the warps too (kByRound).
template <class F, Level L>
KernelFn pick_fc2_one(bool by_round) {
  return by_round ? moe_fc2_kernel<F, L, 1, true> : moe_fc2_kernel<F, L, 1>;
}

template <class F, Level L>
KernelFn pick_fc2(uint32_t T, bool by_round) {
  if (T == 1) return pick_fc2_one<F, L>(by_round);
  if (T == 2) return moe_fc2_kernel<F, L, 2>;
  if (T == kLargestT<L>) return moe_fc2_kernel<F, L, kLargestT<L>>;
  return nullptr;
}

// Which of the two kernels run the lean walk (Int4LeanDecode, Int3LeanDecode) for INT4 or INT3
// experts of the lean layout (MoeLayerParams::lean_walk) at this level and T: where it measured
// faster than the kernels that also hold the general walk (for INT4; INT3 takes its rule). The
// exact level: both kernels at every T. The fast level: FC1 at T = 1 only (at T = 2 and 4 its lean
// walk, which waits for each batch's loads in turn, was slower:
// docs/results/2026-12-03-h200-moe-lean-walk.md), FC2 at T = 1 and 4 (at T = 2 it was slower:
// docs/results/2026-12-04-h200-moe-tokens-per-item.md). Only those lean instances are compiled.
struct LeanKernels {
  bool fc1, fc2;
};

LeanKernels lean_kernels_for(const MoeLayerParams& p, uint32_t T) {
  if (!p.lean_walk || !has_lean_decode(p.format)) return {false, false};
  if (p.accuracy == QMOE_ACCURACY_EXACT) return {true, true};
  return {T == 1, T == 1 || T == 4};
}

// The two kernels for the call's format (lean INT4 and INT3: lean_kernels_for), level and T;
// false for a format without decode kernels or a T the level does not run.
// fc2_by_round (T = 1 only): FC2's rounds dealt over the warps too (moe_fc2_kernel's kByRound).
bool pick_kernels(const MoeLayerParams& p, uint32_t T, bool fc2_by_round, KernelFn* fc1,
                  KernelFn* fc2) {
  const bool exact = p.accuracy == QMOE_ACCURACY_EXACT;
  const bool spread = p.fusion == QMOE_SWIGLU_CONCATENATED;  // tasks of two or three groups
  const bool early = p.inputs_ready_early;
  const auto pick = [&](auto f) {
    using F = decltype(f);
    *fc1 = exact ? pick_fc1<F, Level::kExact>(T, spread, early)
                 : pick_fc1<F, Level::kFast>(T, spread, early);
    *fc2 = exact ? pick_fc2<F, Level::kExact>(T, fc2_by_round)
                 : pick_fc2<F, Level::kFast>(T, fc2_by_round);
  };
  if (!with_decode_format(p.format, pick)) return false;
  const LeanKernels lean = lean_kernels_for(p, T);
  const auto pick_lean = [&](auto f) {
    using Lean = decltype(f);
    if (lean.fc1) {  // fast level: T = 1
      *fc1 = exact ? pick_fc1<Lean, Level::kExact>(T, spread, early)
                   : pick_fc1_one<Lean, Level::kFast>(spread, early);
    }
    if (lean.fc2) {  // fast level: T = 1 or 4
      *fc2 = exact ? pick_fc2<Lean, Level::kExact>(T, fc2_by_round)
                   : (T == 1 ? pick_fc2_one<Lean, Level::kFast>(fc2_by_round)
                             : moe_fc2_kernel<Lean, Level::kFast, 4>);
    }
  };
  if (lean.fc1 || lean.fc2) {
    if (p.format == QMOE_WEIGHT_FORMAT_INT3) {
      pick_lean(Int3LeanDecode{});
    } else {
      pick_lean(Int4LeanDecode{});
    }
  }
  return *fc1 != nullptr && *fc2 != nullptr;
}

// The device's limits that the grids follow.
struct DeviceLimits {
  uint32_t sms;
  size_t smem_per_sm;     // cudaDevAttrMaxSharedMemoryPerMultiprocessor
  size_t smem_per_block;  // cudaDevAttrMaxSharedMemoryPerBlockOptin
};

// What one call launches: the kernels' parameters, both grids and their dynamic shared memory.
struct MoeLaunchPlan {
  MoeKernelParams kp;
  uint32_t fc1_grid;
  uint32_t fc2_grid;
  size_t smem1;
  size_t smem2;
  uint32_t fc1_blocks_per_sm;  // the places (a) takes on each SM
  uint32_t fc2_blocks_per_sm;
  bool fc2_by_round;  // (b)'s rounds dealt over its warps (kByRound)
};

// The plan for a checked call on a device with limits d; false where a block's shared memory
// does not fit the device. No CUDA call: the choices are a function of the call's sizes, its
// tokens-per-expert estimate and d.
bool plan_moe_launch(const MoeLayerParams& p, const DeviceLimits& d, MoeLaunchPlan* plan) {
  const bool exact = p.accuracy == QMOE_ACCURACY_EXACT;
  const uint32_t record = exact ? kExactRecordBytes : kFastRecordBytes;
  const bool interleaved = p.fusion == QMOE_SWIGLU_INTERLEAVED;
  MoeKernelParams& kp = plan->kp;
  kp = MoeKernelParams{};
  kp.p = p;
  kp.tokens_per_item = tokens_per_item(p);
  kp.slots_cap = p.m_capacity * p.top_k;
  kp.inter_chunks = (p.intermediate + 31) / 32;
  kp.fc1_tasks = interleaved ? (2 * p.intermediate + kGroupRows - 1) / kGroupRows
                             : (p.intermediate + kGroupRows - 1) / kGroupRows;
  kp.fc1_task_groups = interleaved ? 1 : (p.intermediate % kGroupRows == 0 ? 2 : 3);
  kp.fc2_groups = (p.hidden + kGroupRows - 1) / kGroupRows;
  kp.act_offset = kHeaderBytes;
  kp.act_route_bytes = size_t{kp.inter_chunks} * 128;
  kp.y2_offset = kHeaderBytes + round_up(size_t{kp.slots_cap} * kp.inter_chunks * 128, 256);
  kp.tables_bytes = static_cast<uint32_t>(route_table_bytes(kp.slots_cap, p.num_experts));
  const uint32_t T = kp.tokens_per_item;
  kp.tc1 = tile_chunks((p.hidden + 31) / 32, kStageBudgetBytes, T, record);
  kp.tc2 = tile_chunks(kp.inter_chunks, kWarpStageBudgetBytes, T, record);

  // Grids. (b)'s groups of H are dealt round-robin over its blocks. By default (b) has one block
  // per SM, launched early (PDL) to wait beside (a)'s two (one when their shared memory would not
  // fit): the three blocks the register cap (kDecodeMinBlocksPerSm) lets an SM hold. Where (a)'s
  // expected tasks outnumber the warps of two blocks per SM (gpt-oss-20b's top-4 at M = 1: 2880
  // tasks on 2112 warps; Qwen3's exact M = 4: 6144; Qwen3 at M = 64: 24,576 or more), (a) takes
  // all three places of every SM, so its tasks run in fewer waves, and (b) two blocks per SM,
  // which start as (a)'s exit and give its groups fewer rounds. Where (a)'s tasks fit one wave
  // anyway (Qwen3 at M = 1; M tokens all on the same k experts at M <= T), (b)'s early start is
  // worth more. The expected work items are S / min(rho, T) for S slots: one a slot at T = 1;
  // above, one a routed expert (S / rho of them) or one per T of its tokens, whichever is more.
  // (The bound max_items assumes every expert's last item holds one token; it would fill the SMs
  // for T tokens on each of k experts too.) Measured:
  // docs/results/2026-12-05-h100-moe-few-slots-grid.md,
  // docs/results/2026-12-05-h100-fc1-waves-k-shares.md and
  // docs/results/2026-12-05-moe-fill-by-expected-tasks.md.
  const double fc1_items = double(kp.slots_cap) / std::min(tokens_per_routed_expert(p), double(T));
  const bool fill_sms = fc1_items * kp.fc1_tasks > double(kFc1BlocksPerSm) * kWarps * d.sms;
  const uint64_t fc1_work = uint64_t{max_items(kp.slots_cap, p.num_experts, T)} * kp.fc1_tasks;
  // (b) takes two blocks per SM at T = 8 too, its second block starting as one of (a)'s exits:
  // a round of groups costs a warp eight tokens there, so halving the rounds is worth more than
  // the early start of the second half (the exact level's eight tokens on each of k experts,
  // FC1 one wave: 18% faster on an H100; at T = 2 and 4 the same grid was 6% slower and even:
  // docs/results/2026-12-05-h100-fc2-two-blocks-at-eight-tokens.md).
  const uint32_t fc2_per_sm = fill_sms || T >= 8 ? kFillFc2BlocksPerSm : kFc2BlocksPerSm;
  const uint32_t fc2_grid = std::min<uint32_t>(kp.fc2_groups, fc2_per_sm * d.sms);
  kp.fc2_rounds = (kp.fc2_groups + fc2_grid - 1) / fc2_grid;
  kp.y2_in_smem = uint64_t{kp.slots_cap} * kp.fc2_rounds <= kSmemY2MaxEntries;
  // (a)'s classify-publish block keeps its offload::ClassifyShared there too, after the tables
  // (where it routes logits itself).
  const size_t smem1 =
      kp.tables_bytes + std::max(size_t{T} * kp.tc1 * record, sizeof(offload::ClassifyShared));
  const size_t smem2 = kp.tables_bytes + size_t{kWarps} * T * kp.tc2 * record +
                       (kp.y2_in_smem ? size_t{kp.slots_cap} * kp.fc2_rounds * kGroupRows * 4 : 0);
  constexpr size_t kStaticAndReserved = kStaticSmemBoundBytes + kBlockSmemReserveBytes;
  const auto fits = [&](uint32_t fc1_blocks, uint32_t fc2_blocks) {
    return fc1_blocks * (smem1 + kStaticAndReserved) + fc2_blocks * (smem2 + kStaticAndReserved) <=
           d.smem_per_sm;
  };
  uint32_t fc1_per_sm = 1;
  if (fill_sms && fits(kFillFc1BlocksPerSm, 0)) {
    fc1_per_sm = kFillFc1BlocksPerSm;
  } else if (fits(kFc1BlocksPerSm, kFc2BlocksPerSm)) {
    fc1_per_sm = kFc1BlocksPerSm;
  }
  // The classify-publish block takes one of the places the register cap leaves the SMs when (a)
  // fills them all, so that no computing block waits for a place.
  const uint32_t publish = p.offload.enabled ? 1 : 0;
  const uint64_t places = uint64_t{kDecodeMinBlocksPerSm} * d.sms;
  const uint64_t fc1_grid =
      std::min({fc1_work, uint64_t{fc1_per_sm} * d.sms, places - publish}) + publish;
  if (smem1 + kStaticSmemBoundBytes > d.smem_per_block ||
      smem2 + kStaticSmemBoundBytes > d.smem_per_block) {
    return false;
  }
  plan->fc1_grid = static_cast<uint32_t>(fc1_grid > 0 ? fc1_grid : 1);
  plan->fc2_grid = fc2_grid;
  plan->smem1 = smem1;
  plan->smem2 = smem2;
  plan->fc1_blocks_per_sm = fc1_per_sm;
  plan->fc2_blocks_per_sm = fc2_per_sm;
  // One token with fewer than 8 slots: fewer FC2 items than warps.
  plan->fc2_by_round = T == 1 && kp.slots_cap < kWarps && kp.fc2_rounds > 1;
  return true;
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

cudaError_t launch_moe_layer(const MoeLayerParams& p, cudaStream_t stream,
                             uint32_t* kernels_launched) {
  if (kernels_launched != nullptr) *kernels_launched = 0;
  const size_t ws =
      moe_layer_workspace_size(p.m_capacity, p.top_k, p.num_experts, p.hidden, p.intermediate);
  const bool routing_ok = (p.logits != nullptr) != (p.ids != nullptr || p.weights != nullptr) &&
                          (p.logits != nullptr || (p.ids != nullptr && p.weights != nullptr));
  if (ws == 0 || p.workspace == nullptr || p.workspace_bytes < ws ||
      (reinterpret_cast<uintptr_t>(p.workspace) & 255) != 0 || p.num_slots == 0 ||
      p.num_slots > 0x7FFFFFFFu || p.fc1 == nullptr || p.fc2 == nullptr || p.m == nullptr ||
      p.x == nullptr || p.y == nullptr || p.residency == nullptr || !routing_ok ||
      (reinterpret_cast<uintptr_t>(p.expert_counts) & 3) != 0 ||
      (p.accuracy != QMOE_ACCURACY_EXACT && p.accuracy != QMOE_ACCURACY_FAST) ||
      !is_activation_dtype_value(p.dtype) ||
      (p.fusion != QMOE_SWIGLU_INTERLEAVED && p.fusion != QMOE_SWIGLU_CONCATENATED) ||
      !std::isfinite(p.alpha) || !std::isfinite(p.beta) || !(p.limit > 0.0f) ||
      (p.m_capacity > 1 && (p.ldx < p.hidden || p.ldy < p.hidden)) ||
      !(p.expected_tokens_per_expert == 0.0f ||
        (p.expected_tokens_per_expert >= 1.0f && p.expected_tokens_per_expert <= p.m_capacity)) ||
      uint64_t{p.hidden} * 2 > 0x7FFFFFFFu || uint64_t{p.intermediate} * 2 > 0x7FFFFFFFu) {
    return cudaErrorInvalidValue;
  }
  int device = 0, major = 0, smem_max = 0, sms = 0, smem_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) {
    e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  }
  if (e == cudaSuccess) {
    e = cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  }
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) {
    e = cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  }
  if (e != cudaSuccess) return e;
  if (sms < 1) sms = 1;
  MoeLaunchPlan plan;
  if (!plan_moe_launch(p,
                       DeviceLimits{static_cast<uint32_t>(sms), static_cast<size_t>(smem_sm),
                                    static_cast<size_t>(smem_max)},
                       &plan)) {
    return cudaErrorInvalidValue;
  }
  const MoeKernelParams& kp = plan.kp;
  KernelFn fc1 = nullptr, fc2 = nullptr;
  if (!pick_kernels(p, kp.tokens_per_item, plan.fc2_by_round, &fc1, &fc2)) {
    return cudaErrorInvalidValue;
  }
  const bool pdl = pdl_for_compute_capability(major);
  e = launch_decode_kernel(fc1, dim3(plan.fc1_grid), dim3(kThreads), plan.smem1, pdl, kp, stream);
  if (e != cudaSuccess) return e;
  if (kernels_launched != nullptr) *kernels_launched = 1;
  e = launch_decode_kernel(fc2, dim3(plan.fc2_grid), dim3(kThreads), plan.smem2, pdl, kp, stream);
  if (e == cudaSuccess && kernels_launched != nullptr) *kernels_launched = 2;
  return e;
}

}  // namespace qmoe::cuda
