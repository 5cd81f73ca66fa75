#include "lib/moe/expert_set.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>

#include "lib/abi_enum.h"
#include "lib/error.h"
#include "lib/formats/quant_matrix.h"
#include "lib/handle_pool.h"
#include "lib/struct_size.h"

namespace qmoe {
namespace {

// Validate one projection of one expert against its expected shape.
qmoe_status plan_projection(const qmoe_quant_matrix* in, uint32_t expert, const char* name,
                            uint32_t n, uint32_t k, GemmPlan* plan) {
  char label[96];
  std::snprintf(label, sizeof label, "qmoe_expert_set_create: expert %u %s", expert, name);
  if (in == nullptr) return fail(QMOE_STATUS_INVALID_ARGUMENT, label, "description is NULL");
  if (qmoe_status s = make_gemm_plan(in, label, plan); s != QMOE_STATUS_OK) return s;
  if (plan->w.n != n || plan->w.k != k) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, label, "is [%u, %u], expected [%u, %u]", plan->w.n,
                plan->w.k, n, k);
  }
  return QMOE_STATUS_OK;
}

// ExpertSet::weight_ranges from every plan: each span as [begin, end) (validated spans are
// never empty and never run past the address space), sorted, touching or overlapping ranges
// merged. Throws bad_alloc.
void collect_weight_ranges(ExpertSet* set) {
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  ranges.reserve(size_t{set->num_experts} * 8);
  for (const std::vector<GemmPlan>* plans : {&set->fc1, &set->fc2}) {
    for (const GemmPlan& plan : *plans) {
      MemorySpan spans[4];
      const size_t count = matrix_spans(plan.w, spans);
      for (size_t i = 0; i < count; ++i) {
        const auto begin = reinterpret_cast<uintptr_t>(spans[i].data);
        ranges.emplace_back(begin, begin + spans[i].bytes);
      }
    }
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uintptr_t, uintptr_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  merged.shrink_to_fit();
  set->weight_ranges = std::move(merged);
}

}  // namespace

qmoe_status make_expert_set(const qmoe_expert_set_desc& d, const char* function, ExpertSet** set) {
  auto* impl = new (std::nothrow) ExpertSet{};
  if (impl == nullptr)
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the set failed");
  impl->num_experts = d.num_experts;
  impl->hidden = d.hidden;
  impl->intermediate = d.intermediate;
  impl->interleaved = enum_bits(d.swiglu_fusion) == QMOE_SWIGLU_INTERLEAVED;
  impl->alpha = d.swiglu_alpha;
  impl->beta = d.swiglu_beta;
  impl->clamp = std::isfinite(d.swiglu_limit);
  impl->limit = d.swiglu_limit;
  try {
    impl->fc1.resize(d.num_experts);
    impl->fc2.resize(d.num_experts);
  } catch (const std::bad_alloc&) {
    delete impl;
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating %u expert descriptions failed",
                d.num_experts);
  }
  size_t scratch = 0;
  for (uint32_t e = 0; e < d.num_experts; ++e) {
    qmoe_status s =
        plan_projection(d.fc1[e], e, "fc1", 2 * d.intermediate, d.hidden, &impl->fc1[e]);
    if (s == QMOE_STATUS_OK) {
      s = plan_projection(d.fc2[e], e, "fc2", d.hidden, d.intermediate, &impl->fc2[e]);
    }
    if (s != QMOE_STATUS_OK) {
      delete impl;
      return s;
    }
    scratch = std::max(
        {scratch, gemm_row_scratch_bytes(impl->fc1[e]), gemm_row_scratch_bytes(impl->fc2[e])});
  }
  impl->row_scratch_bytes = scratch;
  try {
    collect_weight_ranges(impl);
  } catch (const std::bad_alloc&) {
    delete impl;
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the weight ranges failed");
  }

  *set = impl;
  return QMOE_STATUS_OK;
}

bool ExpertSet::overlaps_weights(const void* p, size_t bytes) const {
  if (bytes == 0) return false;
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t end = bytes > UINTPTR_MAX - begin ? UINTPTR_MAX : begin + bytes;
  // The first merged range that ends after `begin`; it overlaps when it starts before `end`.
  const auto it = std::upper_bound(weight_ranges.begin(), weight_ranges.end(), begin,
                                   [](uintptr_t address, const std::pair<uintptr_t, uintptr_t>& r) {
                                     return address < r.second;
                                   });
  return it != weight_ranges.end() && it->first < end;
}

}  // namespace qmoe
