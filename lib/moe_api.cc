// The MoE layer ABI: top-k routing, the workspace size and qmoe_moe_forward, with every check
// of their arguments; the layer itself runs in lib/moe/executor.cc.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "lib/abi_enum.h"
#include "lib/context.h"
#include "lib/error.h"
#include "lib/formats/quant_matrix.h"
#include "lib/gemm/activation_dtype.h"
#include "lib/memory_ranges.h"
#include "lib/moe/executor.h"
#include "lib/moe/expert_set.h"
#include "lib/moe/routing.h"
#include "lib/moe/workspace_layout.h"
#include "lib/struct_size.h"

namespace qmoe {
namespace {

// Bytes from the first to the last element of M rows of `hidden` elements, ld apart.
size_t activation_bytes(qmoe_dtype dtype, uint32_t m, size_t ld, uint32_t hidden) {
  return (size_t{m - 1} * ld + hidden) * dtype_size(dtype);
}

// What check_forward read, resolved and derived for the call that passed it.
struct CheckedForward {
  Context* ctx = nullptr;
  const ExpertSet* set = nullptr;
  qmoe_moe_params p;  // the caller's params, defaults for fields its struct lacks
  MoeLayout layout;
  size_t y_bytes = 0;  // activation_bytes of y
};

// INVALID_ARGUMENT when the input `name`, [q, q + bytes), overlaps y or the caller's workspace:
// both are written while the routing inputs (ids and weights, or logits) and the run mask are
// still read.
qmoe_status check_read_input(const char* function, const char* name, const void* q, size_t bytes,
                             const CheckedForward& f) {
  if (ranges_overlap(q, bytes, f.p.y, f.y_bytes)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s and y overlap", name);
  }
  if (f.p.workspace != nullptr && ranges_overlap(f.p.workspace, f.p.workspace_bytes, q, bytes)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "the workspace and %s overlap", name);
  }
  return QMOE_STATUS_OK;
}

bool valid_accuracy(int32_t accuracy) {
  return accuracy == QMOE_ACCURACY_EXACT || accuracy == QMOE_ACCURACY_FAST;
}

// Every check of the forward except those of the routing's values.
qmoe_status check_forward(const qmoe_context* context, const qmoe_expert_set* set,
                          const qmoe_moe_params* params, const char* function, CheckedForward* f) {
  if (qmoe_status st = resolve_context(context, function, &f->ctx); st != QMOE_STATUS_OK) {
    return st;
  }
  if (qmoe_status st = resolve_expert_set(set, function, &f->set); st != QMOE_STATUS_OK) {
    return st;
  }
  if (params == nullptr) return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "params is NULL");
  // One version so far: every field is required.
  if (!struct_size_ok(params->struct_size, sizeof(qmoe_moe_params))) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "params->struct_size is %zu, not the size of any version of the struct; set it "
                "to sizeof(qmoe_moe_params) (%zu)",
                params->struct_size, sizeof(qmoe_moe_params));
  }
  qmoe_moe_params_init(&f->p);
  std::memcpy(&f->p, params, std::min(params->struct_size, sizeof f->p));
  const qmoe_moe_params& p = f->p;
  const ExpertSet& es = *f->set;

  if (!valid_accuracy(enum_bits(p.accuracy))) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "params->accuracy %d is not a qmoe_accuracy", enum_bits(p.accuracy));
  }
  if (!is_activation_dtype(static_cast<qmoe_dtype>(enum_bits(p.dtype)))) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "params->dtype %d is not F32, F16 or BF16",
                enum_bits(p.dtype));
  }
  if (p.m == 0) return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "params->m is 0");
  if (p.k == 0 || p.k > es.num_experts) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "params->k = %u must be in [1, num_experts = %u]", p.k, es.num_experts);
  }
  if (p.x == nullptr || p.y == nullptr) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "params->%s is NULL",
                p.x == nullptr ? "x" : "y");
  }
  if (p.m > 1 && (p.ldx < es.hidden || p.ldy < es.hidden)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "ldx = %zu and ldy = %zu must be >= hidden = %u", p.ldx, p.ldy, es.hidden);
  }
  if (p.m > 1 &&
      (p.ldx > SIZE_MAX / sizeof(float) / p.m || p.ldy > SIZE_MAX / sizeof(float) / p.m)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "m * ld overflows");
  }
  const size_t x_bytes = activation_bytes(p.dtype, p.m, p.ldx, es.hidden);
  const size_t y_bytes = activation_bytes(p.dtype, p.m, p.ldy, es.hidden);
  const bool in_place = p.x == p.y && (p.m == 1 || p.ldx == p.ldy);
  if (!in_place && ranges_overlap(p.x, x_bytes, p.y, y_bytes)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "x and y overlap (only y == x with ldy == ldx is allowed)");
  }
  if (es.overlaps_weights(p.y, y_bytes)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "y overlaps the expert set's weights");
  }
  if (!make_moe_layout(es, p.accuracy, p.m, p.k, f->ctx->num_threads(), &f->layout)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "m = %u, k = %u: scratch size overflows",
                p.m, p.k);
  }
  if (p.workspace != nullptr) {
    if (range_wraps(p.workspace, p.workspace_bytes)) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "workspace + workspace_bytes (%zu) runs past the end of the address space",
                  p.workspace_bytes);
    }
    if (p.workspace_bytes < f->layout.total + 64) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "workspace_bytes = %zu, qmoe_moe_workspace_size gives %zu", p.workspace_bytes,
                  f->layout.total + 64);
    }
    if (ranges_overlap(p.workspace, p.workspace_bytes, p.x, x_bytes) ||
        ranges_overlap(p.workspace, p.workspace_bytes, p.y, y_bytes)) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "workspace overlaps x or y");
    }
    if (es.overlaps_weights(p.workspace, p.workspace_bytes)) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "workspace overlaps the expert set's weights");
    }
  }
  f->y_bytes = y_bytes;
  // The mask is read while the workspace's route tables are written.
  if (p.run_mask != nullptr) {
    return check_read_input(function, "params->run_mask", p.run_mask, es.num_experts, *f);
  }
  return QMOE_STATUS_OK;
}

// Given ids and weights: in range and finite, and not overlapping what the call writes.
qmoe_status check_routing(const char* function, const CheckedForward& f) {
  const qmoe_moe_params& p = f.p;
  const size_t slots = size_t{p.m} * p.k;
  if (qmoe_status st = check_read_input(function, "params->ids", p.ids, slots * sizeof(int32_t), f);
      st != QMOE_STATUS_OK) {
    return st;
  }
  if (qmoe_status st =
          check_read_input(function, "params->weights", p.weights, slots * sizeof(float), f);
      st != QMOE_STATUS_OK) {
    return st;
  }
  for (size_t i = 0; i < slots; ++i) {
    if (p.ids[i] < 0 || static_cast<uint32_t>(p.ids[i]) >= f.set->num_experts) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "ids[%zu] = %d is outside [0, %u)", i,
                  p.ids[i], f.set->num_experts);
    }
    if (!std::isfinite(p.weights[i])) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "weights[%zu] = %g is not finite", i,
                  static_cast<double>(p.weights[i]));
    }
  }
  return QMOE_STATUS_OK;
}

// The caller's workspace aligned to 64 bytes, or the context's scratch (held until the lease
// is destroyed).
ScratchLease workspace_base(const CheckedForward& f) {
  if (f.p.workspace == nullptr) return f.ctx->acquire_scratch(f.layout.total);
  const auto address = reinterpret_cast<uintptr_t>(f.p.workspace);
  return ScratchLease(static_cast<unsigned char*>(f.p.workspace) + (align64(address) - address),
                      nullptr);
}

qmoe_status moe_forward(const char* function, qmoe_context* context, const qmoe_expert_set* set,
                        const qmoe_moe_params* params) {
  CheckedForward f;
  if (qmoe_status st = check_forward(context, set, params, function, &f); st != QMOE_STATUS_OK) {
    return st;
  }
  const qmoe_moe_params& p = f.p;
  const ExpertSet& s = *f.set;
  const bool given = p.ids != nullptr || p.weights != nullptr;
  if (given == (p.logits != nullptr)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "pass either params->ids and params->weights, or params->logits");
  }
  if (given && (p.ids == nullptr || p.weights == nullptr)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "params->%s is NULL",
                p.ids == nullptr ? "ids" : "weights");
  }
  const size_t logit_count = size_t{p.m} * s.num_experts;
  if (given) {
    if (qmoe_status st = check_routing(function, f); st != QMOE_STATUS_OK) return st;
  } else if (qmoe_status st = check_read_input(function, "params->logits", p.logits,
                                               logit_count * dtype_size(p.dtype), f);
             st != QMOE_STATUS_OK) {
    return st;
  }
  const ScratchLease lease = workspace_base(f);
  unsigned char* base = lease.data();
  if (base == nullptr) {
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "scratch allocation failed");
  }
  MoeForward run{p.accuracy, p.m,       p.k,        p.dtype,           p.x, p.ldx,
                 p.ids,      p.weights, p.run_mask, p.accumulate != 0, p.y, p.ldy};
  if (!given) {
    // Routed here, into the workspace: 16-bit logits widened to FP32 first.
    const float* logits32 = static_cast<const float*>(p.logits);
    if (p.dtype != QMOE_DTYPE_F32) {
      auto* widened = reinterpret_cast<float*>(base + f.layout.logits);
      widen_activations(f.ctx->kernels(), p.dtype, p.logits, widened, logit_count);
      logits32 = widened;
    }
    auto* ids = reinterpret_cast<int32_t*>(base + f.layout.ids);
    auto* weights = reinterpret_cast<float*>(base + f.layout.weights);
    if (qmoe_status st = route_topk(logits32, p.m, s.num_experts, p.k, p.renormalize != 0, ids,
                                    weights, function);
        st != QMOE_STATUS_OK) {
      return st;
    }
    run.ids = ids;
    run.weights = weights;
  }
  run_moe_forward(*f.ctx, s, run, f.layout, base);
  return QMOE_STATUS_OK;
}

}  // namespace
}  // namespace qmoe

extern "C" {

QMOE_API qmoe_status qmoe_moe_route_topk(const float* logits, uint32_t m, uint32_t num_experts,
                                         uint32_t k, int renormalize, int32_t* ids,
                                         float* weights) {
  using namespace qmoe;
  if (m == 0 || num_experts == 0) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "m = %u and num_experts = %u must be >= 1", m,
              num_experts);
  }
  if (num_experts > INT32_MAX) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "num_experts = %u exceeds the int32_t ids' range",
              num_experts);
  }
  if (k == 0 || k > num_experts) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "k = %u must be in [1, num_experts = %u]", k,
              num_experts);
  }
  if (logits == nullptr || ids == nullptr || weights == nullptr) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "%s is NULL",
              logits == nullptr ? "logits" : (ids == nullptr ? "ids" : "weights"));
  }
  if (size_t{m} * num_experts > SIZE_MAX / sizeof(float)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "m * num_experts overflows");
  }
  const size_t logit_bytes = size_t{m} * num_experts * sizeof(float);
  const size_t out_bytes = size_t{m} * k * sizeof(float);
  if (ranges_overlap(logits, logit_bytes, ids, out_bytes) ||
      ranges_overlap(logits, logit_bytes, weights, out_bytes) ||
      ranges_overlap(ids, out_bytes, weights, out_bytes)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "logits, ids and weights overlap");
  }
  return route_topk(logits, m, num_experts, k, renormalize != 0, ids, weights, __func__);
}

QMOE_API void qmoe_moe_params_init(qmoe_moe_params* params) {
  if (params == nullptr) return;
  *params = qmoe_moe_params{};
  params->struct_size = sizeof(qmoe_moe_params);
  params->accuracy = QMOE_ACCURACY_FAST;
  params->dtype = QMOE_DTYPE_F32;
  params->renormalize = 1;
}

QMOE_API qmoe_status qmoe_moe_workspace_size(const qmoe_context* context,
                                             const qmoe_expert_set* set, qmoe_accuracy accuracy,
                                             uint32_t m, uint32_t k, size_t* bytes) {
  using namespace qmoe;
  QMOE_RESOLVE_CONTEXT(ctx, context);
  const ExpertSet* s = nullptr;
  if (qmoe_status st = resolve_expert_set(set, __func__, &s); st != QMOE_STATUS_OK) return st;
  if (bytes == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "bytes out-pointer is NULL");
  if (!valid_accuracy(enum_bits(accuracy))) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "accuracy %d is not a qmoe_accuracy",
              enum_bits(accuracy));
  }
  if (m == 0 || k == 0 || k > s->num_experts) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "m = %u must be >= 1 and k = %u in [1, %u]", m, k,
              s->num_experts);
  }
  MoeLayout l;
  if (!make_moe_layout(*s, accuracy, m, k, ctx->num_threads(), &l)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "m = %u, k = %u: scratch size overflows", m, k);
  }
  *bytes = l.total + 64;  // room to align any caller pointer to 64 bytes
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_moe_forward(qmoe_context* context, const qmoe_expert_set* set,
                                      const qmoe_moe_params* params) {
  return qmoe::moe_forward(__func__, context, set, params);
}

}  // extern "C"
