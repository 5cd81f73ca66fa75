// The MoE layer's routing, built by every block of both of its kernels from the call's device
// inputs (moe_layer.cuh): identical code on identical inputs gives every block the same tables,
// so the kernels need no inter-block communication. The grids are one or two blocks per SM, so
// this is done a few hundred times a call, in parallel: (b) builds its copy before its wait,
// while (a) computes, and (a) too with inputs_ready_early, while the previous kernel computes.
// Publishing one block's tables to the other kernel would not shorten the critical path: (b)
// needs them before its wait, to prefetch its weights.
//
// Tables (shared memory; S = m * k slots, slot s = t * k + j):
//   sel_id[s], sel_w[s]  the routing: the given ids and weights, or top-k of the logits
//   slot_route[s]        the route of the slot, or -1 (weight 0 or expert not resident)
//   route_slot[r]        the slot of route r
//   route_off[e]         first route of expert e (routes numbered expert by expert in ascending
//                        id, slots ascending within an expert, as lib/moe_forward.cc)
//   item_off[e]          first work item of expert e: its routes in runs of T (T = tokens per
//                        item), so item i of e covers routes route_off[e] + T i .. + T
// Logits routing matches lib/moe/routing.cc: rank by logit, equal logits to the lower id;
// w = exp(l - max) * (1 / sum), the sum over the k selected in rank order (renormalize) or over
// all E (here in a fixed tree order; the CPU sums in id order, so the last bits may differ).
#ifndef QMOE_LIB_CUDA_MOE_ROUTES_CUH_
#define QMOE_LIB_CUDA_MOE_ROUTES_CUH_

#include <cstdint>

#include "lib/cuda/int4_tile.cuh"
#include "lib/cuda/moe_layer.cuh"

namespace qmoe::cuda {

struct RouteTables {
  int32_t* sel_id;
  float* sel_w;
  int32_t* slot_route;
  int32_t* route_slot;
  float* logit;        // [E rounded up to 4] the token being routed (logits mode), 16-byte
                       // aligned; entries past E hold -inf
  int32_t* cursor;     // [E] counts, then next route per expert
  int32_t* residency;  // [E] copy of the input
  int32_t* route_off;  // [E + 1]
  int32_t* item_off;   // [E + 1]
};

struct RouteInfo {
  uint32_t error;   // kMoeError* bits
  uint32_t m_out;   // rows of y this call writes: min(m, capacity)
  uint32_t slots;   // m * k routed (0 on error)
  uint32_t routes;  // R
  uint32_t items;   // work items
};

// The logit row's length: E rounded up to whole 16-byte loads.
__host__ __device__ inline uint32_t padded_logits(uint32_t experts) {
  return (experts + 3) / 4 * 4;
}

// Bytes of the tables for a capacity of `slots` slots and E experts (16-byte multiple).
__host__ __device__ inline size_t route_table_bytes(uint32_t slots, uint32_t experts) {
  const size_t bytes = size_t{slots} * 16 + size_t{padded_logits(experts)} * 4 +
                       size_t{experts} * 8 + (size_t{experts} + 1) * 8;
  return (bytes + 15) / 16 * 16;
}

// `base` 16-byte aligned; so is the logit row (it follows the four slot arrays).
__device__ inline RouteTables carve_route_tables(unsigned char* base, uint32_t slots,
                                                 uint32_t experts) {
  RouteTables t;
  auto* i32 = reinterpret_cast<int32_t*>(base);
  t.sel_id = i32;
  t.sel_w = reinterpret_cast<float*>(i32 + slots);
  t.slot_route = i32 + 2 * size_t{slots};
  t.route_slot = i32 + 3 * size_t{slots};
  t.logit = reinterpret_cast<float*>(i32 + 4 * size_t{slots});
  int32_t* e = i32 + 4 * size_t{slots} + padded_logits(experts);
  t.cursor = e;
  t.residency = e + experts;
  t.route_off = e + 2 * size_t{experts};
  t.item_off = t.route_off + experts + 1;
  return t;
}

// Row t of the logits into t.logit, -inf past E. Block-wide; the caller synchronises.
__device__ inline void load_logit_row(const MoeLayerParams& p, const RouteTables& tab, uint32_t t) {
  const uint32_t E = p.num_experts;
  for (uint32_t e = threadIdx.x; e < padded_logits(E); e += blockDim.x) {
    tab.logit[e] = e < E ? load_widened_cg(p.logits, size_t{t} * E + e, p.dtype) : -INFINITY;
  }
}

// How many experts o in loads [q_begin, q_end) (o = 4 q .. 4 q + 3) rank before expert e, whose
// logit is v: before e in the order (logit descending, id ascending) means u >= v for o < e and
// u > v for o > e. Three branch-free runs: the loads wholly before e's, e's own, those after. A
// NaN u counts nowhere (both compares are false); the -inf padding past E sits at o > e and
// never counts.
__device__ __forceinline__ uint32_t ranked_before(const float4* row, uint32_t q_begin,
                                                  uint32_t q_end, float v, uint32_t e) {
  const uint32_t qe = e / 4;
  uint32_t n = 0;
  for (uint32_t q = q_begin; q < min(q_end, qe); ++q) {
    const float4 u = row[q];
    n += (u.x >= v) + (u.y >= v) + (u.z >= v) + (u.w >= v);
  }
  if (q_begin <= qe && qe < q_end) {
    const float4 u = row[qe];
    const uint32_t j = e % 4;
    n += (j > 0 && u.x >= v) + (j > 1 ? u.y >= v : j < 1 && u.y > v) +
         (j > 2 ? u.z >= v : j < 2 && u.z > v) + (j < 3 && u.w > v);
  }
  for (uint32_t q = max(q_begin, qe + 1); q < q_end; ++q) {
    const float4 u = row[q];
    n += (u.x > v) + (u.y > v) + (u.z > v) + (u.w > v);
  }
  return n;
}

// Routes token t's logits (already in t.logit, padded, behind a barrier) into
// sel_id/sel_w[t * k ...]; false when the row is invalid (a NaN or +inf logit, or -inf only).
// Block-wide; returns behind a barrier, with the same answer on every thread.
//
// Each expert's rank (the experts before it in the order) is counted by two adjacent threads,
// each over half the row in 16-byte loads, and summed with one shuffle: at E = 128 every thread
// of a 256-thread block counts 64 logits. Without a NaN the ranks are a permutation of [0, E),
// so the k lowest write sel once each; a NaN expert writes nothing (its own rank would be 0) and
// fails the row, as does a row whose top logit (rank 0's) is -inf: the row is -inf only. Both
// reach every thread through the one barrier's OR.
__device__ inline bool route_token_logits(const MoeLayerParams& p, const RouteTables& tab,
                                          uint32_t t) {
  const uint32_t E = p.num_experts, k = p.top_k;
  const uint32_t loads = padded_logits(E) / 4, half = (loads + 1) / 2;
  const auto* row = reinterpret_cast<const float4*>(tab.logit);
  const uint32_t pairs = blockDim.x / 2, part = threadIdx.x % 2;
  bool bad = false;
  for (uint32_t base = 0; base < E; base += pairs) {  // uniform trip count (the shuffle)
    const uint32_t e = base + threadIdx.x / 2;
    const bool live = e < E;
    const float v = live ? tab.logit[e] : 0.0f;
    uint32_t rank = 0;
    if (live) rank = ranked_before(row, part == 0 ? 0 : half, part == 0 ? half : loads, v, e);
    rank += __shfl_xor_sync(0xFFFFFFFFu, rank, 1);
    if (live && part == 0) {
      bad |= isnan(v) || v == INFINITY || (rank == 0 && v == -INFINITY);
      if (rank < k && !isnan(v)) {
        tab.sel_id[t * k + rank] = static_cast<int32_t>(e);
        tab.sel_w[t * k + rank] = v;  // the logit, until the weights below
      }
    }
  }
  if (__syncthreads_or(bad)) return false;
  if (threadIdx.x < 32) {
    const uint32_t lane = threadIdx.x;
    const float max = tab.sel_w[t * k];  // rank 0's logit
    __syncwarp();                        // read by every lane before sel_w is rewritten
    // The k exponentials side by side.
    for (uint32_t j = lane; j < k; j += 32) tab.sel_w[t * k + j] = expf(tab.sel_w[t * k + j] - max);
    float sum = 0.0f;
    if (p.renormalize) {
      __syncwarp();     // every exponential written before lane 0 reads them
      if (lane == 0) {  // their sum in rank order (lib/moe/routing.cc's order)
        for (uint32_t j = 0; j < k; ++j) sum += tab.sel_w[t * k + j];
      }
      sum = __shfl_sync(0xFFFFFFFFu, sum, 0);
    } else {
      for (uint32_t e = lane; e < E; e += 32) sum += expf(tab.logit[e] - max);
      for (int d = 16; d >= 1; d /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, d);
    }
    const float scale = 1.0f / sum;  // sum >= 1: the top expert contributes exp(0)
    for (uint32_t j = lane; j < k; j += 32) tab.sel_w[t * k + j] *= scale;
  }
  __syncthreads();
  return true;
}

// Builds the tables (see the top of this file) for the call; T = tokens per work item. Every
// thread of the block calls it; returns with the tables and `info` complete and visible.
__device__ inline void build_routes(const MoeLayerParams& p, const RouteTables& tab,
                                    RouteInfo& info, uint32_t tokens_per_item) {
  const uint32_t E = p.num_experts, k = p.top_k;
  const uint32_t m = __ldcg(p.m);
  if (threadIdx.x == 0) {
    info.error = m > p.m_capacity ? kMoeErrorTokensOverCapacity : 0u;
    info.m_out = m > p.m_capacity ? p.m_capacity : m;
  }
  const uint32_t m_route = m > p.m_capacity ? 0 : m;
  const uint32_t slots = m_route * k;
  for (uint32_t e = threadIdx.x; e < E; e += blockDim.x) {
    tab.cursor[e] = 0;
    tab.residency[e] = __ldcg(p.residency + e);
  }
  __syncthreads();

  // The routing.
  bool bad = false;
  uint32_t bad_bits = 0;
  if (p.logits != nullptr) {
    for (uint32_t t = 0; t < m_route; ++t) {
      load_logit_row(p, tab, t);
      __syncthreads();
      if (!route_token_logits(p, tab, t)) {
        bad_bits = kMoeErrorLogits;
        break;  // uniform: every thread saw the same row
      }
    }
  } else {
    for (uint32_t s = threadIdx.x; s < slots; s += blockDim.x) {
      const int32_t id = __ldcg(p.ids + s);
      const float w = __ldcg(p.weights + s);
      if (id < 0 || static_cast<uint32_t>(id) >= E) bad_bits |= kMoeErrorExpertId;
      if (!isfinite(w)) bad_bits |= kMoeErrorWeight;
      tab.sel_id[s] = id;
      tab.sel_w[s] = w;
    }
  }
  // Which slots run, and routes per expert.
  bad = __syncthreads_or(bad_bits != 0);
  if (bad) atomicOr(&info.error, bad_bits);
  const uint32_t live_slots = bad ? 0 : slots;
  bool bad_residency = false;
  for (uint32_t s = threadIdx.x; s < live_slots; s += blockDim.x) {
    const int32_t e = tab.sel_id[s];
    const int32_t slot = tab.residency[e];
    const bool weighted = tab.sel_w[s] != 0.0f;
    bad_residency |= weighted && (slot < -1 || slot >= static_cast<int32_t>(p.num_slots));
    const bool runs = weighted && slot >= 0 && slot < static_cast<int32_t>(p.num_slots);
    tab.slot_route[s] = runs ? 0 : -1;
    if (runs) atomicAdd(&tab.cursor[e], 1);
  }
  if (__syncthreads_or(bad_residency) && threadIdx.x == 0) {
    atomicOr(&info.error, kMoeErrorResidency);
  }
  __syncthreads();
  const bool failed = info.error != 0;

  // Offsets (warp 0): exclusive scans of routes and work items over experts in id order. Lane
  // l takes the run of experts [l c, l c + c), c = ceil(E / 32): its run's sums, one scan over
  // the lanes, then the run's offsets.
  if (threadIdx.x < 32) {
    const uint32_t lane = threadIdx.x, T = tokens_per_item;
    const uint32_t run = (E + 31) / 32, e0 = min(lane * run, E), e1 = min(e0 + run, E);
    uint32_t run_routes = 0, run_items = 0;
    for (uint32_t e = e0; e < e1; ++e) {
      const uint32_t c = failed ? 0 : static_cast<uint32_t>(tab.cursor[e]);
      run_routes += c;
      run_items += (c + T - 1) / T;
    }
    uint32_t routes = run_routes, items = run_items;  // inclusive over lanes 0..lane
    for (int d = 1; d < 32; d *= 2) {
      const uint32_t ur = __shfl_up_sync(0xFFFFFFFFu, routes, d);
      const uint32_t ui = __shfl_up_sync(0xFFFFFFFFu, items, d);
      if (lane >= static_cast<uint32_t>(d)) {
        routes += ur;
        items += ui;
      }
    }
    const uint32_t total_routes = __shfl_sync(0xFFFFFFFFu, routes, 31);
    const uint32_t total_items = __shfl_sync(0xFFFFFFFFu, items, 31);
    routes -= run_routes;
    items -= run_items;
    for (uint32_t e = e0; e < e1; ++e) {
      const uint32_t c = failed ? 0 : static_cast<uint32_t>(tab.cursor[e]);
      tab.route_off[e] = static_cast<int32_t>(routes);
      tab.item_off[e] = static_cast<int32_t>(items);
      tab.cursor[e] = static_cast<int32_t>(routes);  // next route of e
      routes += c;
      items += (c + T - 1) / T;
    }
    if (lane == 0) {
      tab.route_off[E] = static_cast<int32_t>(total_routes);
      tab.item_off[E] = static_cast<int32_t>(total_items);
      info.routes = total_routes;
      info.items = total_items;
      info.slots = failed ? 0 : slots;
    }
    __syncwarp();
    // Route numbers: slots in ascending order, so within an expert tokens come ascending.
    const uint32_t numbered = failed ? 0 : slots;
    for (uint32_t base = 0; base < numbered; base += 32) {
      const uint32_t s = base + lane;
      const int32_t e = (s < numbered && tab.slot_route[s] >= 0) ? tab.sel_id[s] : -1;
      const uint32_t peers = __match_any_sync(0xFFFFFFFFu, e);
      if (e >= 0) {
        const uint32_t rank = __popc(peers & ((1u << lane) - 1u));
        const int32_t r = tab.cursor[e] + static_cast<int32_t>(rank);
        tab.slot_route[s] = r;
        tab.route_slot[r] = static_cast<int32_t>(s);
      }
      __syncwarp();
      if (e >= 0 && lane == 31u - __clz(peers)) tab.cursor[e] += __popc(peers);
      __syncwarp();
    }
  }
  __syncthreads();
}

// Work item `item` (< info.items): its expert and first route, and its route count (<= T).
struct WorkItem {
  uint32_t expert, first_route, count;
};

__device__ inline WorkItem find_item(const MoeLayerParams& p, const RouteTables& tab, uint32_t item,
                                     uint32_t tokens_per_item) {
  // Largest e with item_off[e] <= item: experts with no items share their successor's offset.
  uint32_t lo = 0, hi = p.num_experts;
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (static_cast<uint32_t>(tab.item_off[mid]) <= item) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  WorkItem w;
  w.expert = lo;
  w.first_route = static_cast<uint32_t>(tab.route_off[lo]) +
                  (item - static_cast<uint32_t>(tab.item_off[lo])) * tokens_per_item;
  const uint32_t end = static_cast<uint32_t>(tab.route_off[lo + 1]);
  w.count = min(tokens_per_item, end - w.first_route);
  return w;
}

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_MOE_ROUTES_CUH_
