// The MoE layer executor. One forward, on the calling thread then in parallel phases:
//  0. Routes. Every (token t, slot j) whose expert runs (weight != 0, marked in run_mask) is a
//     route; routes are numbered expert by expert in ascending id, tokens ascending within an
//     expert, so expert a's routes are rows [offset[a], offset[a + 1]) of every per-route
//     buffer. X rows are prepared once per token (fast: int8 per 32 k; exact: used in place
//     when H % 32 == 0) and gathered into route order only for an expert whose tokens are not
//     consecutive (never at M = 1).
//  1. FC1 + SwiGLU. Units are (expert, one 32-k activation chunk of intermediates): the FC1
//     rows of those intermediates (8 row groups interleaved; 4 gate and 4 up concatenated),
//     then SwiGLU of the same 32 and their preparation as FC2 activations (fast: quantized per
//     32 k, which is exactly one unit, so no unit waits for another).
//  2. FC2. Units are (expert, one row group of outputs).
//  3. Combine: y[t, n] = (accumulate ? y[t, n] : 0) + sum over slots j in order of w[t, j] *
//     out, in FP32 and rounded once to the activation dtype (combine_span), as a parallel phase
//     of its own, or at M = 1 (combine_in_fc2 says why) inside phase 2: each FC2 task counts
//     its groups done (group_done: an acq_rel fetch_add after the group's outputs are
//     written), and the task whose count reaches the number of active experts has acquired
//     every other task's outputs of that group and combines it for every token. A call with
//     no route runs the phase. (A 16-bit X is widened chunk by chunk as it is prepared, so the
//     typed forward gives the bits of widening X, the FP32 forward and rounding Y.)
// The unit sizes are the tiling every weight format shares (lib/formats/tiles.h), so the
// executor is the same for every format.
// Phases 1 and 2 split their units, in (expert, unit) order and weighted by the expert's
// route count, into one contiguous run per task (a few tasks per thread, parallel_task_count,
// so an idle thread can take a descheduled one's unstarted work): with more experts than tasks
// a task gets whole experts, with fewer an expert is split over tasks; every task reads
// sequential streams. Each output element is computed by one kernel call over the whole K whatever
// the split, and the combine sums in slot order whichever thread runs it, so the result is
// bitwise independent of the thread count, and an expert's output rows do not depend on which
// other experts run (marking every expert in run_mask gives the full layer bit for bit).
#include "lib/moe/executor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <new>

#include "lib/formats/quant_matrix.h"
#include "lib/formats/tiles.h"
#include "lib/gemm/activation_dtype.h"
#include "lib/gemm/activation_rows.h"
#include "lib/gemm/gemm_plan.h"
#include "lib/gemm/gemm_rows.h"
#include "lib/gemm/task_split.h"

namespace qmoe {
namespace {

constexpr size_t kMinChunksPerTask = 64;          // as qmoe_gemm: ~8 KiB of codes per task
constexpr size_t kMinCombinePerTask = 16 * 1024;  // multiply-adds per task of the combine phase
constexpr size_t kCombineBlock = 256;             // Y elements summed in FP32 at a time

// FC2's per-group counters live in the workspace (caller memory, reused call after call), one
// 4-byte word each, constructed at the start of every call that uses them.
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "group_done is an array of plain lock-free words");

// Where the combine runs: inside FC2 (the last expert of each group of outputs combines it) or
// as a phase of its own. Alternating the two call by call in one process on the H200 host's
// 16 cores, the former took 0.96-1.005 of the latter's time at M = 1 and 1.003-1.03 at M = 4
// (docs/results/2026-12-04-h200-host-paired-roof.md): with several tokens a group's combine
// reads many more routes' outputs from other cores, inside the FC2 tasks' streams.
bool combine_in_fc2(uint32_t m) {
  return m == 1;
}

// Expert a's routes read X rows in place when their tokens are consecutive.
bool consecutive(const uint32_t* tokens, uint32_t count) {
  for (uint32_t r = 1; r < count; ++r) {
    if (tokens[r] != tokens[0] + r) return false;
  }
  return true;
}

struct MoeCall {
  const ExpertSet* set;
  const KernelTable* kernels;
  uint32_t m, k;
  const float* weights;  // [m, k]
  qmoe_dtype dtype;      // of Y (and X)
  void* y;
  size_t ldy;
  bool accumulate;
  // Routes.
  uint32_t routes, num_active;
  const uint32_t* active;       // [num_active] expert ids, ascending
  const uint32_t* offset;       // [num_active + 1] first route of each active expert
  const uint32_t* route_token;  // [routes]
  const int32_t* slot_route;    // [m * k] route of each slot, -1 when it does not run
  // Buffers.
  ActivationView tokens;              // m rows of X, prepared or in place
  ActivationView gathered;            // X rows in route order (experts with non-consecutive tokens)
  float* h1;                          // [routes, 2I] FC1 outputs
  ActivationRows a2;                  // [routes] FC2 activations (SwiGLU outputs, prepared)
  float* y2;                          // [routes, H] FC2 outputs
  std::atomic<uint32_t>* group_done;  // [H / 8] experts whose FC2 outputs of the group are done
  unsigned char* row_scratch;
  size_t row_scratch_stride;
  uint32_t tasks;  // of the phase being run

  // Calls fn(a, u0, u1) for the units [u0, u1) of active expert a that task t runs, when each
  // active expert has `units` units that cost its route count each: task t takes the units
  // whose cost starts in [C t / T, C (t + 1) / T), C = units * routes.
  template <typename Fn>
  void for_task_units(uint32_t units, size_t t, Fn&& fn) const {
    const uint64_t total = uint64_t{units} * routes, q = total / tasks, r = total % tasks;
    const uint64_t lo = q * t + r * t / tasks, hi = q * (t + 1) + r * (t + 1) / tasks;
    // First expert whose units reach past lo: units * offset[a + 1] > lo.
    uint32_t a = static_cast<uint32_t>(
        std::upper_bound(offset + 1, offset + num_active + 1, lo / units) - (offset + 1));
    for (; a < num_active; ++a) {
      const uint64_t base = uint64_t{units} * offset[a];
      const uint64_t count = offset[a + 1] - offset[a];
      if (base >= hi) break;
      const uint64_t u0 = lo <= base ? 0 : (lo - base + count - 1) / count;
      const uint64_t u1 = std::min<uint64_t>(units, (hi - base + count - 1) / count);
      if (u0 < u1) fn(a, static_cast<uint32_t>(u0), static_cast<uint32_t>(u1));
    }
  }

  // ONNX Runtime QMoE's SwiGLU of intermediates [i0, i0 + len) of one FC1 output row.
  void swiglu(const float* h, uint32_t i0, uint32_t len, float* out) const {
    const ExpertSet& s = *set;
    for (uint32_t i = 0; i < len; ++i) {
      const uint32_t n = i0 + i;
      float g = s.interleaved ? h[2 * n] : h[n];
      float u = s.interleaved ? h[2 * n + 1] : h[s.intermediate + n];
      if (s.clamp) {
        g = std::min(g, s.limit);
        u = std::clamp(u, -s.limit, s.limit);
      }
      const float sigmoid = 1.0f / (1.0f + std::exp(-(s.alpha * g)));
      out[i] = g * sigmoid * (u + s.beta);
    }
  }

  static void fc1_task(void* state, size_t t) {
    const auto* c = static_cast<const MoeCall*>(state);
    const ExpertSet& s = *c->set;
    const uint32_t inter = s.intermediate, units = chunk_count(inter);
    unsigned char* scratch = c->row_scratch + t * c->row_scratch_stride;
    c->for_task_units(units, t, [&](uint32_t a, uint32_t u0, uint32_t u1) {
      const uint32_t r0 = c->offset[a], count = c->offset[a + 1] - r0;
      const GemmPlan& plan = s.fc1[c->active[a]];
      const bool direct = consecutive(c->route_token + r0, count);
      const ActivationView& x = direct ? c->tokens : c->gathered;
      const size_t first = direct ? c->route_token[r0] : r0;
      float* h = c->h1 + size_t{r0} * 2 * inter;
      const size_t ldh = size_t{2} * inter;
      const uint32_t i0 = u0 * kChunkCodes, i1 = std::min(u1 * kChunkCodes, inter);
      if (s.interleaved) {
        run_gemm_rows(plan, *c->kernels, x, first, count, h, ldh, 2 * i0, 2 * i1, scratch);
      } else {
        run_gemm_rows(plan, *c->kernels, x, first, count, h, ldh, i0, i1, scratch);
        run_gemm_rows(plan, *c->kernels, x, first, count, h, ldh, inter + i0, inter + i1, scratch);
      }
      float act[kChunkCodes];
      for (uint32_t r = 0; r < count; ++r) {
        for (uint32_t u = u0; u < u1; ++u) {
          const uint32_t len = std::min(kChunkCodes, inter - u * kChunkCodes);
          c->swiglu(h + r * ldh, u * kChunkCodes, len, act);
          prepare_activation_chunk(*c->kernels, c->a2, r0 + r, u, act, len);
        }
      }
    });
  }

  static void fc2_task(void* state, size_t t) {
    const auto* c = static_cast<const MoeCall*>(state);
    const ExpertSet& s = *c->set;
    const uint32_t units = row_groups(s.hidden);
    unsigned char* scratch = c->row_scratch + t * c->row_scratch_stride;
    const ActivationView a2 = view_of(c->a2);
    c->for_task_units(units, t, [&](uint32_t a, uint32_t u0, uint32_t u1) {
      const uint32_t r0 = c->offset[a], count = c->offset[a + 1] - r0;
      run_gemm_rows(s.fc2[c->active[a]], *c->kernels, a2, r0, count, c->y2 + size_t{r0} * s.hidden,
                    s.hidden, u0 * kGroupRows, std::min(u1 * kGroupRows, s.hidden), scratch);
      // Release this expert's outputs of groups [u0, u1); the last expert of a group to finish
      // acquires the others' and combines the group.
      if (c->group_done == nullptr) return;  // the combine runs as a phase of its own
      for (uint32_t g = u0; g < u1; ++g) {
        if (c->group_done[g].fetch_add(1, std::memory_order_acq_rel) + 1 == c->num_active) {
          const uint32_t n0 = g * kGroupRows;
          for (uint32_t token = 0; token < c->m; ++token) {
            c->combine_span(token, n0, std::min<size_t>(kGroupRows, s.hidden - n0));
          }
        }
      }
    });
  }

  // y[token, n0 .. n0 + len) for len <= kCombineBlock: the sum is formed in FP32 (from 0, or
  // from y widened) over the token's slots in order and written to y once, rounded to the
  // activation dtype. The one place the combine's arithmetic is written, so the phase below
  // and FC2's per-group combine give the same bits.
  void combine_span(size_t token, size_t n0, size_t len) const {
    float sum[kCombineBlock];
    void* out_y = activation_at(y, dtype, token * ldy + n0);
    if (accumulate) {
      widen_activations(*kernels, dtype, out_y, sum, len);
    } else {
      std::fill(sum, sum + len, 0.0f);
    }
    for (uint32_t j = 0; j < k; ++j) {
      const int32_t r = slot_route[token * k + j];
      if (r < 0) continue;
      const float w = weights[token * k + j];
      const float* out = y2 + static_cast<size_t>(r) * set->hidden + n0;
      for (size_t n = 0; n < len; ++n) sum[n] += w * out[n];
    }
    narrow_activations(*kernels, dtype, sum, out_y, len);
  }

  // The combine as a phase (a call with no route): task t combines elements
  // [M H t / T, M H (t + 1) / T) of Y in row-major order, up to kCombineBlock at a time.
  static void combine_task(void* state, size_t t) {
    const auto* c = static_cast<const MoeCall*>(state);
    const size_t h = c->set->hidden, total = c->m * h;
    const size_t lo = total * t / c->tasks, hi = total * (t + 1) / c->tasks;
    for (size_t token = lo / h; token * h < hi; ++token) {
      const size_t n0 = std::max(lo, token * h) - token * h;
      const size_t n1 = std::min(hi, (token + 1) * h) - token * h;
      for (size_t b0 = n0; b0 < n1; b0 += kCombineBlock) {
        c->combine_span(token, b0, std::min(kCombineBlock, n1 - b0));
      }
    }
  }
};

}  // namespace

void run_moe_forward(Context& ctx, const ExpertSet& s, const MoeForward& f, const MoeLayout& l,
                     unsigned char* base) {
  const qmoe_accuracy accuracy = f.accuracy;
  const uint32_t m = f.m, k = f.k;
  const qmoe_dtype dtype = f.dtype;
  const void* x = f.x;
  const size_t ldx = f.ldx;
  const int32_t* ids = f.ids;
  const float* weights = f.weights;
  const uint8_t* run_mask = f.run_mask;
  const KernelTable& kernels = ctx.kernels();
  auto* counts = reinterpret_cast<uint32_t*>(base + l.counts);
  auto* offset = reinterpret_cast<uint32_t*>(base + l.offsets);
  auto* active = reinterpret_cast<uint32_t*>(base + l.active);
  auto* route_token = reinterpret_cast<uint32_t*>(base + l.route_token);
  auto* slot_route = reinterpret_cast<int32_t*>(base + l.slot_route);

  // 0. Routes, numbered expert by expert (ascending id), tokens ascending within an expert.
  const size_t slots = size_t{m} * k;
  std::fill(counts, counts + s.num_experts, 0u);
  for (size_t i = 0; i < slots; ++i) {
    const auto e = static_cast<uint32_t>(ids[i]);
    const bool runs = weights[i] != 0.0f && (run_mask == nullptr || run_mask[e] != 0);
    slot_route[i] = runs ? 0 : -1;
    counts[e] += runs;
  }
  uint32_t num_active = 0, routes = 0;
  for (uint32_t e = 0; e < s.num_experts; ++e) {
    if (counts[e] == 0) continue;
    active[num_active] = e;
    offset[num_active++] = routes;
    routes += counts[e];
    counts[e] = routes - counts[e];  // now the expert's next route
  }
  offset[num_active] = routes;
  for (size_t i = 0; i < slots; ++i) {
    if (slot_route[i] < 0) continue;
    const uint32_t r = counts[ids[i]]++;
    route_token[r] = static_cast<uint32_t>(i / k);
    slot_route[i] = static_cast<int32_t>(r);
  }

  MoeCall c{};
  c.set = &s;
  c.kernels = &kernels;
  c.m = m;
  c.k = k;
  c.weights = weights;
  c.dtype = dtype;
  c.y = f.y;
  c.ldy = f.ldy;
  c.accumulate = f.accumulate;
  c.routes = routes;
  c.num_active = num_active;
  c.active = active;
  c.offset = offset;
  c.route_token = route_token;
  c.slot_route = slot_route;
  c.row_scratch = base + l.row_scratch;
  c.row_scratch_stride = s.row_scratch_bytes;
  const uint32_t threads = ctx.num_threads();

  if (routes > 0) {
    // X rows: prepared once per token that has a route, gathered only where needed.
    if (l.direct_tokens && dtype == QMOE_DTYPE_F32) {
      c.tokens = direct_activation_view(static_cast<const float*>(x), ldx, s.hidden);
    } else {
      const ActivationRows rows = carve_activation_rows(accuracy, s.hidden, m, base + l.tokens);
      for (uint32_t t = 0; t < m; ++t) {
        const int32_t* slot = slot_route + size_t{t} * k;
        if (std::any_of(slot, slot + k, [](int32_t r) { return r >= 0; })) {
          prepare_activation_rows_typed(kernels, rows, t, 1, dtype,
                                        activation_at(x, dtype, t * ldx), 0);
        }
      }
      c.tokens = view_of(rows);
    }
    // Experts whose tokens are not consecutive read gathered rows, in route order (at M = 1
    // only an expert that the token lists twice).
    const ActivationRows gathered =
        carve_activation_rows(accuracy, s.hidden, slots, base + l.gathered);
    for (uint32_t a = 0; a < num_active; ++a) {
      const uint32_t r0 = offset[a], count = offset[a + 1] - r0;
      if (consecutive(route_token + r0, count)) continue;
      for (uint32_t r = r0; r < r0 + count; ++r) {
        copy_activation_row(c.tokens, route_token[r], gathered, r);
      }
    }
    c.gathered = view_of(gathered);
    c.h1 = reinterpret_cast<float*>(base + l.h1);
    c.a2 = carve_activation_rows(accuracy, s.intermediate, slots, base + l.a2);
    c.y2 = reinterpret_cast<float*>(base + l.y2);

    // 1. FC1 + SwiGLU, 2. FC2: one contiguous run of (expert, unit) per task.
    const size_t h_chunks = s.fc1[active[0]].chunks, i_chunks = s.fc2[active[0]].chunks;
    const size_t fc1_units = size_t{num_active} * ((s.intermediate + 31) / 32);
    c.tasks = parallel_task_count(threads, fc1_units,
                                  size_t{routes} * ((2 * s.intermediate + 7) / 8) * h_chunks,
                                  kMinChunksPerTask);
    ctx.parallel_for(&MoeCall::fc1_task, &c, c.tasks);
    const uint32_t groups = row_groups(s.hidden);
    if (combine_in_fc2(m)) {
      c.group_done = reinterpret_cast<std::atomic<uint32_t>*>(base + l.group_done);
      for (uint32_t g = 0; g < groups; ++g) new (&c.group_done[g]) std::atomic<uint32_t>(0);
    }
    const size_t fc2_units = size_t{num_active} * groups;
    c.tasks = parallel_task_count(threads, fc2_units, size_t{routes} * groups * i_chunks,
                                  kMinChunksPerTask);
    ctx.parallel_for(&MoeCall::fc2_task, &c, c.tasks);
    if (c.group_done != nullptr) return;  // FC2 combined every group
  }

  // 3. The combine as a phase: at M > 1, and for a call with no route (y = 0, or y rounded
  // once with accumulate).
  const size_t elements = size_t{m} * s.hidden;
  c.tasks = parallel_task_count(threads, elements, elements * (k + 1), kMinCombinePerTask);
  ctx.parallel_for(&MoeCall::combine_task, &c, c.tasks);
}

}  // namespace qmoe
