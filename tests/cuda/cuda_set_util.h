// Owning handles of the C ABI's expert sets and offload sessions, and the creations of sets and
// sessions the tests repeat. Header-only and free of CUDA headers: for the CPU suite's ABI checks
// (which run without a device) and the device tests alike.
#ifndef QMOE_TESTS_CUDA_CUDA_SET_UTIL_H_
#define QMOE_TESTS_CUDA_CUDA_SET_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "qmoe/qmoe.h"
#include "qmoe/qmoe_cuda.h"

namespace qmoe::testing {

struct HostSetDeleter {
  void operator()(qmoe_expert_set* s) const { qmoe_expert_set_destroy(s); }
};
struct GpuSetDeleter {
  void operator()(qmoe_cuda_expert_set* s) const { qmoe_cuda_expert_set_destroy(s); }
};
struct SessionDeleter {
  void operator()(qmoe_cuda_offload* s) const { qmoe_cuda_offload_destroy(s); }
};
using HostSet = std::unique_ptr<qmoe_expert_set, HostSetDeleter>;
using GpuSet = std::unique_ptr<qmoe_cuda_expert_set, GpuSetDeleter>;
using Session = std::unique_ptr<qmoe_cuda_offload, SessionDeleter>;

/// A host expert set of `desc` (null, after a failure, when the library refuses it).
inline HostSet make_host_set(const qmoe_expert_set_desc& desc) {
  qmoe_expert_set* raw = nullptr;
  EXPECT_EQ(qmoe_expert_set_create(&desc, &raw), QMOE_STATUS_OK) << qmoe_last_error_message();
  return HostSet(raw);
}

/// A host set of `desc`'s experts with expert `e`'s FC1 (FC2 when `fc2`) replaced by `other`
/// (null, after a failure, when the library refuses it).
inline HostSet host_set_replacing(const qmoe_expert_set_desc& desc, uint32_t e, bool fc2,
                                  const qmoe_quant_matrix* other) {
  std::vector<const qmoe_quant_matrix*> fc1(desc.fc1, desc.fc1 + desc.num_experts);
  std::vector<const qmoe_quant_matrix*> fc2_list(desc.fc2, desc.fc2 + desc.num_experts);
  (fc2 ? fc2_list : fc1)[e] = other;
  qmoe_expert_set_desc d = desc;
  d.fc1 = fc1.data();
  d.fc2 = fc2_list.data();
  return make_host_set(d);
}

/// A GPU set of `host` (null, after a failure, when the library refuses it): every expert
/// resident (`resident` empty) or those of `resident`, in `num_slots` slots (0: as many as
/// resident), copied in `mode`.
inline GpuSet make_gpu_set(const qmoe_expert_set* host, const std::vector<uint32_t>& resident = {},
                           uint32_t num_slots = 0,
                           qmoe_cuda_copy_mode mode = QMOE_CUDA_COPY_BATCHED) {
  qmoe_cuda_expert_set_desc d;
  qmoe_cuda_expert_set_desc_init(&d);
  d.experts = host;
  d.copy_mode = mode;
  if (!resident.empty()) {
    d.resident = resident.data();
    d.num_resident = static_cast<uint32_t>(resident.size());
  }
  d.num_slots = num_slots;
  qmoe_cuda_expert_set* raw = nullptr;
  EXPECT_EQ(qmoe_cuda_expert_set_create(&d, &raw), QMOE_STATUS_OK) << qmoe_last_error_message();
  return GpuSet(raw);
}

/// What qmoe_cuda_expert_set_create answers for a set of `host` with `num_resident` experts of
/// `resident` resident (none given: every one). A set it makes is destroyed again; a refused
/// one's handle must be null.
inline qmoe_status gpu_set_status(const qmoe_expert_set* host, const uint32_t* resident,
                                  uint32_t num_resident) {
  qmoe_cuda_expert_set_desc d;
  qmoe_cuda_expert_set_desc_init(&d);
  d.experts = host;
  d.resident = resident;
  d.num_resident = num_resident;
  qmoe_cuda_expert_set* raw = reinterpret_cast<qmoe_cuda_expert_set*>(0x1);
  const qmoe_status s = qmoe_cuda_expert_set_create(&d, &raw);
  if (s == QMOE_STATUS_OK) {
    EXPECT_EQ(qmoe_cuda_expert_set_destroy(raw), QMOE_STATUS_OK);
  } else {
    EXPECT_EQ(raw, nullptr) << "a refused set's handle";
  }
  return s;
}

/// An offload session (null, after a failure, when the library refuses it) over the layers
/// host_layers[l] and gpu_layers[l] with the CPU context `context`: calls of up to m_capacity
/// tokens of k slots each, the timeout and the short circuit as given.
inline Session make_session(qmoe_context* context,
                            const std::vector<const qmoe_expert_set*>& host_layers,
                            const std::vector<const qmoe_cuda_expert_set*>& gpu_layers,
                            uint32_t m_capacity, uint32_t k, uint32_t timeout_us,
                            bool short_circuit = true) {
  qmoe_cuda_offload_desc d;
  qmoe_cuda_offload_desc_init(&d);
  d.context = context;
  d.num_layers = static_cast<uint32_t>(host_layers.size());
  d.host_layers = host_layers.data();
  d.gpu_layers = gpu_layers.data();
  d.m_capacity = m_capacity;
  d.k = k;
  d.timeout_us = timeout_us;
  d.short_circuit = short_circuit ? 1 : 0;
  qmoe_cuda_offload* raw = nullptr;
  EXPECT_EQ(qmoe_cuda_offload_create(&d, &raw), QMOE_STATUS_OK) << qmoe_last_error_message();
  return Session(raw);
}

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_CUDA_CUDA_SET_UTIL_H_
