// The expert-set ABI: qmoe_expert_set_* and the handle shells behind them. A set's validation
// and planning are in lib/moe/expert_set.cc.
//
// Handles: as with contexts (lib/context_api.cc), the qmoe_expert_set the caller holds is a
// small shell {magic, ExpertSet*} that is never returned to the allocator; a destroyed shell is
// reused only after HandlePool::kQuarantine (lib/handle_pool.h) other sets have been
// destroyed, so a destroyed handle is rejected instead of being a use-after-free.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "lib/abi_enum.h"
#include "lib/error.h"
#include "lib/handle_pool.h"
#include "lib/moe/expert_set.h"
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

}  // namespace

qmoe_status resolve_expert_set(const qmoe_expert_set* handle, const char* function,
                               const ExpertSet** set) {
  if (const qmoe_status s =
          check_handle(handle, &qmoe_expert_set::set, kLiveMagic, kDeadMagic,
                       QMOE_STATUS_INVALID_ARGUMENT, function, "set", "qmoe expert set");
      s != QMOE_STATUS_OK) {
    return s;
  }
  *set = handle->set;
  return QMOE_STATUS_OK;
}

qmoe_status publish_expert_set(ExpertSet* impl, const char* function, qmoe_expert_set** set) {
  qmoe_expert_set* shell =
      HandlePool<qmoe_expert_set>::publish(&qmoe_expert_set::set, impl, kLiveMagic);
  if (shell == nullptr) {
    delete impl;
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the set handle failed");
  }
  *set = shell;
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

  ExpertSet* impl = nullptr;
  if (qmoe_status s = make_expert_set(d, __func__, &impl); s != QMOE_STATUS_OK) return s;
  return publish_expert_set(impl, __func__, set);
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
