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

struct qmoe_expert_set {
  // kLiveMagic while the set exists, kDeadMagic after destroy. Atomic only so that a caller's
  // racy misuse is a rejected handle rather than a data race inside the library.
  std::atomic<uint64_t> magic{0};
  // Written only while the shell is not live (see qmoe_context in lib/context.cc): destroy
  // leaves it as it is.
  qmoe::ExpertSet* set = nullptr;
};

namespace qmoe {
namespace {

constexpr uint64_t kLiveMagic = 0x716d6f652d736574ull;  // "qmoe-set"
constexpr uint64_t kDeadMagic = 0x716d6f652d646564ull;  // "qmoe-ded"
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

qmoe_status resolve_expert_set(const qmoe_expert_set* handle, const char* function,
                               const ExpertSet** set) {
  if (handle == nullptr) return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "set is NULL");
  const uint64_t magic = handle->magic.load(std::memory_order_acquire);
  if (magic == kDeadMagic) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "set was destroyed");
  }
  if (magic != kLiveMagic || handle->set == nullptr) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "not a qmoe expert set");
  }
  *set = handle->set;
  return QMOE_STATUS_OK;
}

}  // namespace qmoe

extern "C" {

QMOE_API void qmoe_expert_set_desc_init(qmoe_expert_set_desc* desc) {
  if (desc == nullptr) return;
  *desc = qmoe_expert_set_desc{};
  desc->struct_size = sizeof(qmoe_expert_set_desc);
  desc->swiglu_fusion = QMOE_SWIGLU_INTERLEAVED;
  desc->swiglu_alpha = 1.0f;
  desc->swiglu_beta = 0.0f;
  desc->swiglu_limit = INFINITY;
}

QMOE_API qmoe_status qmoe_expert_set_create(const qmoe_expert_set_desc* desc,
                                            qmoe_expert_set** set) {
  using namespace qmoe;
  if (set == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "set out-pointer is NULL");
  *set = nullptr;
  if (desc == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "desc is NULL");
  // Read only the fields the caller's struct has; alpha, beta and limit keep their defaults.
  using D = qmoe_expert_set_desc;
  constexpr size_t kRequired = offsetof(D, fc2) + sizeof(desc->fc2);
  static constexpr FieldSpan kFields[] = {QMOE_FIELD(D, swiglu_alpha), QMOE_FIELD(D, swiglu_beta),
                                          QMOE_FIELD(D, swiglu_limit)};
  if (!struct_size_ok(desc->struct_size, kRequired, kFields)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
              "desc->struct_size is %zu, not the size of any version of the struct; set it to "
              "sizeof(qmoe_expert_set_desc) (%zu)",
              desc->struct_size, sizeof(qmoe_expert_set_desc));
  }
  qmoe_expert_set_desc d;
  qmoe_expert_set_desc_init(&d);
  std::memcpy(&d, desc, std::min(desc->struct_size, sizeof d));

  if (d.num_experts == 0 || d.hidden == 0 || d.intermediate == 0) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
              "num_experts = %u, hidden = %u and intermediate = %u must be >= 1", d.num_experts,
              d.hidden, d.intermediate);
  }
  if (d.intermediate > UINT32_MAX / 2) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "intermediate = %u: 2 * intermediate overflows",
              d.intermediate);
  }
  const int32_t fusion = enum_bits(d.swiglu_fusion);
  if (fusion != QMOE_SWIGLU_INTERLEAVED && fusion != QMOE_SWIGLU_CONCATENATED) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "swiglu_fusion %d is not a qmoe_swiglu_fusion",
              static_cast<int>(fusion));
  }
  if (!std::isfinite(d.swiglu_alpha) || !std::isfinite(d.swiglu_beta)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "swiglu_alpha = %g and swiglu_beta = %g must be finite",
              static_cast<double>(d.swiglu_alpha), static_cast<double>(d.swiglu_beta));
  }
  if (!(d.swiglu_limit > 0.0f)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
              "swiglu_limit = %g must be > 0, or +infinity for none "
              "(qmoe_expert_set_desc_init sets that)",
              static_cast<double>(d.swiglu_limit));
  }
  if (d.fc1 == nullptr || d.fc2 == nullptr) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "desc->%s is NULL", d.fc1 == nullptr ? "fc1" : "fc2");
  }

  auto* impl = new (std::nothrow) ExpertSet{};
  if (impl == nullptr) QMOE_FAIL(QMOE_STATUS_OUT_OF_MEMORY, "allocating the set failed");
  impl->num_experts = d.num_experts;
  impl->hidden = d.hidden;
  impl->intermediate = d.intermediate;
  impl->interleaved = fusion == QMOE_SWIGLU_INTERLEAVED;
  impl->alpha = d.swiglu_alpha;
  impl->beta = d.swiglu_beta;
  impl->clamp = std::isfinite(d.swiglu_limit);
  impl->limit = d.swiglu_limit;
  try {
    impl->fc1.resize(d.num_experts);
    impl->fc2.resize(d.num_experts);
  } catch (const std::bad_alloc&) {
    delete impl;
    QMOE_FAIL(QMOE_STATUS_OUT_OF_MEMORY, "allocating %u expert descriptions failed", d.num_experts);
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
    QMOE_FAIL(QMOE_STATUS_OUT_OF_MEMORY, "allocating the weight ranges failed");
  }

  qmoe_expert_set* shell = HandlePool<qmoe_expert_set>::acquire();
  if (shell == nullptr) {
    delete impl;
    QMOE_FAIL(QMOE_STATUS_OUT_OF_MEMORY, "allocating the set handle failed");
  }
  shell->set = impl;
  shell->magic.store(kLiveMagic, std::memory_order_release);
  *set = shell;
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_expert_set_destroy(qmoe_expert_set* set) {
  using namespace qmoe;
  if (set == nullptr) return QMOE_STATUS_OK;
  const ExpertSet* impl = nullptr;
  if (qmoe_status s = resolve_expert_set(set, __func__, &impl); s != QMOE_STATUS_OK) return s;
  if (!HandlePool<qmoe_expert_set>::claim_for_destroy(set, kLiveMagic, kDeadMagic)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "set was destroyed");
  }
  delete impl;
  HandlePool<qmoe_expert_set>::release(set);
  return QMOE_STATUS_OK;
}

}  // extern "C"
