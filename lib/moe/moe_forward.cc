// The MoE layer executor: qmoe_moe_forward, qmoe_moe_forward_logits, their _typed variants
// (FP32, FP16 or BF16 activations), and qmoe_moe_workspace_size.
//
// One forward, on the calling thread then in three parallel phases:
//  0. Routes. Every (token t, slot j) whose expert runs (weight != 0, marked in run_mask) is a
//     route; routes are numbered expert by expert in ascending id, tokens ascending within an
//     expert, so expert a's routes are rows [offset[a], offset[a + 1]) of every per-route
//     buffer. X rows are prepared once per token (fast: int8 per 32 k; exact: used in place
//     when H % 32 == 0) and gathered into route order only for an expert whose tokens are not
//     consecutive (never at M = 1).
//  1. FC1 + SwiGLU. Units are (expert, 32 intermediates): the FC1 rows of those intermediates
//     (8 groups interleaved; 4 gate and 4 up groups concatenated), then SwiGLU of the same 32
//     and their preparation as FC2 activations (fast: quantized per 32 k, which is exactly one
//     unit, so no unit waits for another).
//  2. FC2. Units are (expert, 8 output rows).
//  3. Combine: y[t] = (accumulate ? y[t] : 0) + sum over slots j in order of w[t, j] * out, in
//     FP32 and rounded once to the activation dtype. (A 16-bit X is widened chunk by chunk as
//     it is prepared, so the typed forward gives the bits of widening X, the FP32 forward and
//     rounding Y.)
// Phases 1 and 2 split their units, in (expert, unit) order and weighted by the expert's
// route count, into one contiguous run per task (a few tasks per thread, parallel_task_count,
// so an idle thread can take a descheduled one's unstarted work): with more experts than tasks
// a task gets whole experts, with fewer an expert is split over tasks; every task reads
// sequential streams. Each output element is computed by one kernel call over the whole K whatever
// the split, and phase 3 sums in slot order, so the result is bitwise independent of the thread
// count, and an expert's output rows do not depend on which other experts run (marking every
// expert in run_mask gives the full layer bit for bit).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "lib/context.h"
#include "lib/error.h"
#include "lib/formats/quant_matrix.h"
#include "lib/gemm/activation_dtype.h"
#include "lib/gemm/gemm_driver.h"
#include "lib/memory_ranges.h"
#include "lib/moe/expert_set.h"
#include "lib/moe/routing.h"
#include "lib/struct_size.h"

namespace qmoe {
namespace {

constexpr size_t kMinChunksPerTask = 64;          // as qmoe_gemm: ~8 KiB of codes per task
constexpr size_t kMinCombinePerTask = 16 * 1024;  // multiply-adds per combine task
constexpr size_t kCombineBlock = 256;             // Y elements summed in FP32 at a time

// Byte offsets of one forward's workspace pieces from its 64-byte aligned base.
struct Layout {
  size_t counts, offsets, active, route_token, slot_route, ids, weights, logits;
  size_t tokens, gathered, h1, a2, y2, row_scratch;
  size_t total;
  bool direct_tokens;  // exact level, H % 32 == 0: FP32 X rows are read in place
};

// False when the sizes do not fit in size_t.
bool make_layout(const ExpertSet& s, qmoe_accuracy accuracy, uint32_t m, uint32_t k,
                 uint32_t threads, Layout* out) {
  const size_t routes = size_t{m} * k;
  const size_t h = s.hidden, i = s.intermediate;
  // Bound every per-route piece (padded rows, both levels) before multiplying.
  const size_t per_route = 4 * ((h + 32) * 2 + 2 * i + (i + 32) + 2 * (h / 32 + i / 32 + 2)) + 64;
  if (routes > INT32_MAX || routes > (SIZE_MAX / 4) / per_route ||
      s.num_experts > (SIZE_MAX / 64) / 16 || size_t{m} > (SIZE_MAX / 8) / s.num_experts ||
      (s.row_scratch_bytes != 0 &&
       max_parallel_tasks(threads) > (SIZE_MAX / 4) / s.row_scratch_bytes)) {
    return false;
  }
  Layout l{};
  size_t at = 0;
  // The bounds above keep each piece's product in size_t; their sum is checked as it grows
  // (each piece is at most a quarter or half of SIZE_MAX, not their total).
  bool fits = true;
  const auto take = [&at, &fits](size_t bytes) {
    const size_t offset = at;
    if (bytes > SIZE_MAX - 64 - at) {
      fits = false;
    } else {
      at += align64(bytes);
    }
    return offset;
  };
  l.counts = take(size_t{s.num_experts} * sizeof(uint32_t));
  l.offsets = take((size_t{s.num_experts} + 1) * sizeof(uint32_t));
  l.active = take(size_t{s.num_experts} * sizeof(uint32_t));
  l.route_token = take(routes * sizeof(uint32_t));
  l.slot_route = take(routes * sizeof(int32_t));
  l.ids = take(routes * sizeof(int32_t));
  l.weights = take(routes * sizeof(float));
  // 16-bit router logits widened for the routing (FP32 ones are read in place); reserved
  // whatever the dtype, as the X rows below are.
  l.logits = take(size_t{m} * s.num_experts * sizeof(float));
  l.direct_tokens = accuracy == QMOE_ACCURACY_EXACT && s.hidden % kChunkCodes == 0;
  // Reserved even when FP32 rows could be read in place: a 16-bit X is always prepared, and
  // qmoe_moe_workspace_size does not depend on the activation dtype.
  l.tokens = take(activation_rows_bytes(accuracy, s.hidden, m));
  // Rows of experts whose tokens are not consecutive: at M > 1 any expert's, at M = 1 an expert
  // that a token lists twice (its routes are token 0 twice).
  l.gathered = take(activation_rows_bytes(accuracy, s.hidden, routes));
  l.h1 = take(routes * 2 * i * sizeof(float));
  l.a2 = take(activation_rows_bytes(accuracy, s.intermediate, routes));
  l.y2 = take(routes * h * sizeof(float));
  l.row_scratch = take(max_parallel_tasks(threads) * s.row_scratch_bytes);
  if (!fits) return false;
  l.total = at;
  *out = l;
  return true;
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
  ActivationView tokens;    // m rows of X, prepared or in place
  ActivationView gathered;  // X rows in route order (experts with non-consecutive tokens)
  float* h1;                // [routes, 2I] FC1 outputs
  ActivationRows a2;        // [routes] FC2 activations (SwiGLU outputs, prepared)
  float* y2;                // [routes, H] FC2 outputs
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
    });
  }

  // Task t combines elements [M H t / T, M H (t + 1) / T) of Y in row-major order, up to
  // kCombineBlock at a time: the sum is formed in FP32 (from 0, or from y widened) and written
  // to y once, rounded to the activation dtype.
  static void combine_task(void* state, size_t t) {
    const auto* c = static_cast<const MoeCall*>(state);
    const size_t h = c->set->hidden, total = c->m * h;
    const size_t lo = total * t / c->tasks, hi = total * (t + 1) / c->tasks;
    float sum[kCombineBlock];
    for (size_t token = lo / h; token * h < hi; ++token) {
      const size_t n0 = std::max(lo, token * h) - token * h;
      const size_t n1 = std::min(hi, (token + 1) * h) - token * h;
      for (size_t b0 = n0; b0 < n1; b0 += kCombineBlock) {
        const size_t len = std::min(kCombineBlock, n1 - b0);
        void* y = activation_at(c->y, c->dtype, token * c->ldy + b0);
        if (c->accumulate) {
          widen_activations(*c->kernels, c->dtype, y, sum, len);
        } else {
          std::fill(sum, sum + len, 0.0f);
        }
        for (uint32_t j = 0; j < c->k; ++j) {
          const int32_t r = c->slot_route[token * c->k + j];
          if (r < 0) continue;
          const float w = c->weights[token * c->k + j];
          const float* out = c->y2 + static_cast<size_t>(r) * h + b0;
          for (size_t n = 0; n < len; ++n) sum[n] += w * out[n];
        }
        narrow_activations(*c->kernels, c->dtype, sum, y, len);
      }
    }
  }
};

// Run one forward whose arguments have been checked; `base` is the 64-byte aligned workspace.
void run_forward(Context& ctx, const ExpertSet& s, qmoe_accuracy accuracy, uint32_t m,
                 qmoe_dtype dtype, const void* x, size_t ldx, const int32_t* ids,
                 const float* weights, uint32_t k, const uint8_t* run_mask, bool accumulate,
                 void* y, size_t ldy, const Layout& l, unsigned char* base) {
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
  c.y = y;
  c.ldy = ldy;
  c.accumulate = accumulate;
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
    const size_t fc2_units = size_t{num_active} * ((s.hidden + 7) / 8);
    c.tasks = parallel_task_count(
        threads, fc2_units, size_t{routes} * ((s.hidden + 7) / 8) * i_chunks, kMinChunksPerTask);
    ctx.parallel_for(&MoeCall::fc2_task, &c, c.tasks);
  }

  // 3. Combine, in slot order.
  const size_t elements = size_t{m} * s.hidden;
  c.tasks = parallel_task_count(threads, elements, elements * (k + 1), kMinCombinePerTask);
  ctx.parallel_for(&MoeCall::combine_task, &c, c.tasks);
}

struct Options {
  const uint8_t* run_mask = nullptr;
  bool accumulate = false;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Bytes from the first to the last element of M rows of `hidden` elements, ld apart.
size_t activation_bytes(qmoe_dtype dtype, uint32_t m, size_t ld, uint32_t hidden) {
  return (size_t{m - 1} * ld + hidden) * dtype_size(dtype);
}

// INVALID_ARGUMENT when the input `name`, [p, p + bytes), overlaps y ([y, y + y_bytes)) or the
// caller's workspace: both are written while the routing inputs (ids and weights, or logits)
// and the run mask are still read.
qmoe_status check_read_input(const char* function, const char* name, const void* p, size_t bytes,
                             const void* y, size_t y_bytes, const Options& o) {
  if (ranges_overlap(p, bytes, y, y_bytes)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s and y overlap", name);
  }
  if (o.workspace != nullptr && ranges_overlap(o.workspace, o.workspace_bytes, p, bytes)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "the workspace and %s overlap", name);
  }
  return QMOE_STATUS_OK;
}

// What check_forward resolved and derived for the call that passed it.
struct CheckedForward {
  Context* ctx = nullptr;
  const ExpertSet* set = nullptr;
  Options options;
  Layout layout;
  size_t y_bytes = 0;  // activation_bytes of y
};

// Every check of the forwards except those of the routing (ids and weights, or logits).
qmoe_status check_forward(const qmoe_context* context, const qmoe_expert_set* set,
                          qmoe_accuracy accuracy, uint32_t m, qmoe_dtype dtype, const void* x,
                          size_t ldx, uint32_t k, const void* y, size_t ldy,
                          const qmoe_moe_options* options, const char* function,
                          CheckedForward* f) {
  if (qmoe_status st = resolve_context(context, function, &f->ctx); st != QMOE_STATUS_OK) {
    return st;
  }
  if (qmoe_status st = resolve_expert_set(set, function, &f->set); st != QMOE_STATUS_OK) {
    return st;
  }
  const ExpertSet& es = *f->set;
  Options* o = &f->options;
  Layout* l = &f->layout;
  if (accuracy != QMOE_ACCURACY_EXACT && accuracy != QMOE_ACCURACY_FAST) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "accuracy %d is not a qmoe_accuracy",
                static_cast<int>(accuracy));
  }
  if (!is_activation_dtype(dtype)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "dtype %d is not F32, F16 or BF16",
                static_cast<int>(dtype));
  }
  if (m == 0) return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "m is 0");
  if (k == 0 || k > es.num_experts) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "k = %u must be in [1, num_experts = %u]",
                k, es.num_experts);
  }
  if (x == nullptr || y == nullptr) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s is NULL", x == nullptr ? "x" : "y");
  }
  if (m > 1 && (ldx < es.hidden || ldy < es.hidden)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "ldx = %zu and ldy = %zu must be >= hidden = %u", ldx, ldy, es.hidden);
  }
  if (m > 1 && (ldx > SIZE_MAX / sizeof(float) / m || ldy > SIZE_MAX / sizeof(float) / m)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "m * ld overflows");
  }
  const size_t x_bytes = activation_bytes(dtype, m, ldx, es.hidden);
  const size_t y_bytes = activation_bytes(dtype, m, ldy, es.hidden);
  const bool in_place = x == y && (m == 1 || ldx == ldy);
  if (!in_place && ranges_overlap(x, x_bytes, y, y_bytes)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "x and y overlap (only y == x with ldy == ldx is allowed)");
  }
  if (es.overlaps_weights(y, y_bytes)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "y overlaps the expert set's weights");
  }
  if (options != nullptr) {
    using O = qmoe_moe_options;
    constexpr size_t kRequired = offsetof(O, run_mask) + sizeof(options->run_mask);
    static constexpr FieldSpan kFields[] = {QMOE_FIELD(O, accumulate), QMOE_FIELD(O, workspace),
                                            QMOE_FIELD(O, workspace_bytes)};
    if (!struct_size_ok(options->struct_size, kRequired, kFields)) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "options->struct_size is %zu, not the size of any version of the struct; set "
                  "it to sizeof(qmoe_moe_options) (%zu)",
                  options->struct_size, sizeof(qmoe_moe_options));
    }
    qmoe_moe_options copy;
    qmoe_moe_options_init(&copy);
    std::memcpy(&copy, options, std::min(options->struct_size, sizeof copy));
    o->run_mask = copy.run_mask;
    o->accumulate = copy.accumulate != 0;
    o->workspace = copy.workspace;
    o->workspace_bytes = copy.workspace_bytes;
  }
  if (!make_layout(es, accuracy, m, k, f->ctx->num_threads(), l)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "m = %u, k = %u: scratch size overflows", m,
                k);
  }
  if (o->workspace != nullptr) {
    if (range_wraps(o->workspace, o->workspace_bytes)) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "workspace + workspace_bytes (%zu) runs past the end of the address space",
                  o->workspace_bytes);
    }
    if (o->workspace_bytes < l->total + 64) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "workspace_bytes = %zu, qmoe_moe_workspace_size gives %zu", o->workspace_bytes,
                  l->total + 64);
    }
    if (ranges_overlap(o->workspace, o->workspace_bytes, x, x_bytes) ||
        ranges_overlap(o->workspace, o->workspace_bytes, y, y_bytes)) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "workspace overlaps x or y");
    }
    if (es.overlaps_weights(o->workspace, o->workspace_bytes)) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "workspace overlaps the expert set's weights");
    }
  }
  f->y_bytes = y_bytes;
  // The mask is read while the workspace's route tables are written.
  if (o->run_mask != nullptr) {
    return check_read_input(function, "options->run_mask", o->run_mask, es.num_experts, y, y_bytes,
                            *o);
  }
  return QMOE_STATUS_OK;
}

// The caller's workspace aligned to 64 bytes, or the context's scratch (held until the lease
// is destroyed).
ScratchLease workspace_base(const CheckedForward& f) {
  const Options& o = f.options;
  if (o.workspace == nullptr) return f.ctx->acquire_scratch(f.layout.total);
  const auto address = reinterpret_cast<uintptr_t>(o.workspace);
  return ScratchLease(static_cast<unsigned char*>(o.workspace) + (align64(address) - address),
                      nullptr);
}

// qmoe_moe_forward and qmoe_moe_forward_typed: the checks, then one forward.
qmoe_status forward_routed(const char* function, qmoe_context* context, const qmoe_expert_set* set,
                           qmoe_accuracy accuracy, uint32_t m, qmoe_dtype dtype, const void* x,
                           size_t ldx, const int32_t* ids, const float* weights, uint32_t k,
                           void* y, size_t ldy, const qmoe_moe_options* options) {
  CheckedForward f;
  if (qmoe_status st =
          check_forward(context, set, accuracy, m, dtype, x, ldx, k, y, ldy, options, function, &f);
      st != QMOE_STATUS_OK) {
    return st;
  }
  const ExpertSet* s = f.set;
  if (ids == nullptr || weights == nullptr) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s is NULL",
                ids == nullptr ? "ids" : "weights");
  }
  const size_t slots = size_t{m} * k;
  if (qmoe_status st =
          check_read_input(function, "ids", ids, slots * sizeof(int32_t), y, f.y_bytes, f.options);
      st != QMOE_STATUS_OK) {
    return st;
  }
  if (qmoe_status st = check_read_input(function, "weights", weights, slots * sizeof(float), y,
                                        f.y_bytes, f.options);
      st != QMOE_STATUS_OK) {
    return st;
  }
  for (size_t i = 0; i < slots; ++i) {
    if (ids[i] < 0 || static_cast<uint32_t>(ids[i]) >= s->num_experts) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "ids[%zu] = %d is outside [0, %u)", i,
                  ids[i], s->num_experts);
    }
    if (!std::isfinite(weights[i])) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "weights[%zu] = %g is not finite", i,
                  static_cast<double>(weights[i]));
    }
  }
  const ScratchLease lease = workspace_base(f);
  unsigned char* base = lease.data();
  if (base == nullptr) {
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "scratch allocation failed");
  }
  run_forward(*f.ctx, *s, accuracy, m, dtype, x, ldx, ids, weights, k, f.options.run_mask,
              f.options.accumulate, y, ldy, f.layout, base);
  return QMOE_STATUS_OK;
}

// qmoe_moe_forward_logits and qmoe_moe_forward_logits_typed: the checks, the routing (from
// 16-bit logits widened into the workspace first), then one forward.
qmoe_status forward_logits(const char* function, qmoe_context* context, const qmoe_expert_set* set,
                           qmoe_accuracy accuracy, uint32_t m, qmoe_dtype dtype, const void* x,
                           size_t ldx, const void* logits, uint32_t k, int renormalize, void* y,
                           size_t ldy, const qmoe_moe_options* options) {
  CheckedForward f;
  if (qmoe_status st =
          check_forward(context, set, accuracy, m, dtype, x, ldx, k, y, ldy, options, function, &f);
      st != QMOE_STATUS_OK) {
    return st;
  }
  const ExpertSet* s = f.set;
  const Layout& l = f.layout;
  if (logits == nullptr) return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "logits is NULL");
  const size_t logit_count = size_t{m} * s->num_experts;
  const size_t logit_bytes = logit_count * dtype_size(dtype);
  if (qmoe_status st =
          check_read_input(function, "logits", logits, logit_bytes, y, f.y_bytes, f.options);
      st != QMOE_STATUS_OK) {
    return st;
  }
  const ScratchLease lease = workspace_base(f);
  unsigned char* base = lease.data();
  if (base == nullptr) {
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "scratch allocation failed");
  }
  const float* logits32 = static_cast<const float*>(logits);
  if (dtype != QMOE_DTYPE_F32) {
    auto* widened = reinterpret_cast<float*>(base + l.logits);
    widen_activations(f.ctx->kernels(), dtype, logits, widened, logit_count);
    logits32 = widened;
  }
  auto* ids = reinterpret_cast<int32_t*>(base + l.ids);
  auto* weights = reinterpret_cast<float*>(base + l.weights);
  if (qmoe_status st =
          route_topk(logits32, m, s->num_experts, k, renormalize != 0, ids, weights, function);
      st != QMOE_STATUS_OK) {
    return st;
  }
  run_forward(*f.ctx, *s, accuracy, m, dtype, x, ldx, ids, weights, k, f.options.run_mask,
              f.options.accumulate, y, ldy, l, base);
  return QMOE_STATUS_OK;
}

}  // namespace
}  // namespace qmoe

extern "C" {

QMOE_API void qmoe_moe_options_init(qmoe_moe_options* options) {
  if (options == nullptr) return;
  *options = qmoe_moe_options{};
  options->struct_size = sizeof(qmoe_moe_options);
}

QMOE_API qmoe_status qmoe_moe_workspace_size(const qmoe_context* context,
                                             const qmoe_expert_set* set, qmoe_accuracy accuracy,
                                             uint32_t m, uint32_t k, size_t* bytes) {
  using namespace qmoe;
  QMOE_RESOLVE_CONTEXT(ctx, context);
  const ExpertSet* s = nullptr;
  if (qmoe_status st = resolve_expert_set(set, __func__, &s); st != QMOE_STATUS_OK) return st;
  if (bytes == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "bytes out-pointer is NULL");
  if (accuracy != QMOE_ACCURACY_EXACT && accuracy != QMOE_ACCURACY_FAST) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "accuracy %d is not a qmoe_accuracy",
              static_cast<int>(accuracy));
  }
  if (m == 0 || k == 0 || k > s->num_experts) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "m = %u must be >= 1 and k = %u in [1, %u]", m, k,
              s->num_experts);
  }
  Layout l;
  if (!make_layout(*s, accuracy, m, k, ctx->num_threads(), &l)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "m = %u, k = %u: scratch size overflows", m, k);
  }
  *bytes = l.total + 64;  // room to align any caller pointer to 64 bytes
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_moe_forward(qmoe_context* context, const qmoe_expert_set* set,
                                      qmoe_accuracy accuracy, uint32_t m, const float* x,
                                      size_t ldx, const int32_t* ids, const float* weights,
                                      uint32_t k, float* y, size_t ldy,
                                      const qmoe_moe_options* options) {
  return qmoe::forward_routed(__func__, context, set, accuracy, m, QMOE_DTYPE_F32, x, ldx, ids,
                              weights, k, y, ldy, options);
}

QMOE_API qmoe_status qmoe_moe_forward_typed(qmoe_context* context, const qmoe_expert_set* set,
                                            qmoe_accuracy accuracy, uint32_t m, qmoe_dtype dtype,
                                            const void* x, size_t ldx, const int32_t* ids,
                                            const float* weights, uint32_t k, void* y, size_t ldy,
                                            const qmoe_moe_options* options) {
  return qmoe::forward_routed(__func__, context, set, accuracy, m, dtype, x, ldx, ids, weights, k,
                              y, ldy, options);
}

QMOE_API qmoe_status qmoe_moe_forward_logits(qmoe_context* context, const qmoe_expert_set* set,
                                             qmoe_accuracy accuracy, uint32_t m, const float* x,
                                             size_t ldx, const float* logits, uint32_t k,
                                             int renormalize, float* y, size_t ldy,
                                             const qmoe_moe_options* options) {
  return qmoe::forward_logits(__func__, context, set, accuracy, m, QMOE_DTYPE_F32, x, ldx, logits,
                              k, renormalize, y, ldy, options);
}

QMOE_API qmoe_status qmoe_moe_forward_logits_typed(
    qmoe_context* context, const qmoe_expert_set* set, qmoe_accuracy accuracy, uint32_t m,
    qmoe_dtype dtype, const void* x, size_t ldx, const void* logits, uint32_t k, int renormalize,
    void* y, size_t ldy, const qmoe_moe_options* options) {
  return qmoe::forward_logits(__func__, context, set, accuracy, m, dtype, x, ldx, logits, k,
                              renormalize, y, ldy, options);
}

}  // extern "C"
