// The offload session ABI (include/qmoe/qmoe_cuda.h): host-side argument checks, which run in
// every build and on machines without a GPU, then the CUDA backend (lib/cuda_backend.h), or
// QMOE_STATUS_CUDA_UNAVAILABLE in a build without one.
//
// Handles: as with contexts (lib/context_api.cc), a qmoe_cuda_offload is a shell {magic,
// backend object, what the checks need} that is never returned to the allocator, so a
// destroyed handle is rejected.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>
#include <vector>

#include "lib/abi_enum.h"
#include "lib/context.h"
#include "lib/cuda_backend.h"
#include "lib/cuda_handles.h"
#include "lib/cuda_moe_params.h"
#include "lib/error.h"
#include "lib/gemm/activation_dtype.h"
#include "lib/handle_pool.h"
#include "lib/moe/expert_set.h"
#include "lib/offload/ring_layout.h"
#include "lib/struct_size.h"
#include "qmoe/qmoe_cuda.h"

struct qmoe_cuda_offload {
  std::atomic<uint64_t> magic{0};
  // Written only while the shell is not live (see qmoe_context in lib/context_api.cc).
  void* session = nullptr;  // the backend's object
  uint32_t m_capacity = 0, k_max = 0, hidden = 0;
  std::vector<uint32_t> num_experts;  // per layer
  std::vector<void*> gpu_sets;        // per layer, the backend's expert-set objects
};

namespace qmoe {
namespace {

constexpr uint64_t kLiveMagic = 0x716d6f652d6f666cull;  // "qmoe-ofl"
constexpr uint64_t kDeadMagic = 0x716d6f652d6f6464ull;  // "qmoe-odd"
constexpr uint32_t kMaxLayers = 1u << 16;
constexpr size_t kWorkspaceAlignment = 256;

qmoe_status resolve(const qmoe_cuda_offload* handle, const char* function) {
  return check_handle(handle, &qmoe_cuda_offload::session, kLiveMagic, kDeadMagic,
                      QMOE_STATUS_INVALID_ARGUMENT, function, "session",
                      "qmoe CUDA offload session");
}

// Every check of qmoe_cuda_offload_create that needs no device, then the backend.
qmoe_status create(const qmoe_cuda_offload_desc* desc, qmoe_cuda_offload** out,
                   const char* function) {
  if (out == nullptr) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "session out-pointer is NULL");
  }
  *out = nullptr;
  if (desc == nullptr) return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "desc is NULL");
  if (!struct_size_ok(desc->struct_size, sizeof(qmoe_cuda_offload_desc))) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "desc->struct_size is %zu, not the size of any version of the struct; set it to "
                "sizeof(qmoe_cuda_offload_desc) (%zu)",
                desc->struct_size, sizeof(qmoe_cuda_offload_desc));
  }
  qmoe_cuda_offload_desc d;
  std::memcpy(&d, desc, sizeof d);
  Context* context = nullptr;
  if (qmoe_status s = resolve_context(d.context, function, &context); s != QMOE_STATUS_OK) {
    return s;
  }
  if (d.device < 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "device %d is negative", d.device);
  }
  if (d.num_layers == 0 || d.num_layers > kMaxLayers) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "num_layers = %u must be in [1, %u]",
                d.num_layers, kMaxLayers);
  }
  if (d.host_layers == nullptr || d.gpu_layers == nullptr) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "desc->%s is NULL",
                d.host_layers == nullptr ? "host_layers" : "gpu_layers");
  }
  std::vector<const ExpertSet*> host;
  std::vector<const void*> gpu;
  std::vector<uint32_t> experts;
  try {
    host.resize(d.num_layers);
    gpu.resize(d.num_layers);
    experts.resize(d.num_layers);
  } catch (const std::bad_alloc&) {
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating %u layers", d.num_layers);
  }
  uint32_t e_max = 0, hidden = 0;
  for (uint32_t l = 0; l < d.num_layers; ++l) {
    if (qmoe_status s = resolve_expert_set(d.host_layers[l], function, &host[l]);
        s != QMOE_STATUS_OK) {
      return s;
    }
    CudaExpertSetView g{};
    if (qmoe_status s = resolve_cuda_expert_set(d.gpu_layers[l], function, &g);
        s != QMOE_STATUS_OK) {
      return s;
    }
    gpu[l] = g.impl;
    const ExpertSet& h = *host[l];
    if (g.num_experts != h.num_experts || g.hidden != h.hidden) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "layer %u: the host set has E = %u, H = %u, the GPU set E = %u, H = %u", l,
                  h.num_experts, h.hidden, g.num_experts, g.hidden);
    }
    if (l > 0 && h.hidden != hidden) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "layer %u has H = %u, layer 0 H = %u: every layer takes the same activations", l,
                  h.hidden, hidden);
    }
    hidden = h.hidden;
    if (h.num_experts > offload::kMaxExperts) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "layer %u has %u experts, above %u", l,
                  h.num_experts, offload::kMaxExperts);
    }
    if (d.k == 0 || d.k > h.num_experts) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "desc->k = %u must be in [1, %u] (layer %u's experts)", d.k, h.num_experts, l);
    }
    experts[l] = h.num_experts;
    e_max = std::max(e_max, h.num_experts);
  }
  if (d.m_capacity == 0 || uint64_t{d.m_capacity} * d.k > offload::kMaxSlotsPerCall) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "desc->m_capacity = %u must be >= 1 with m_capacity * k <= %u", d.m_capacity,
                offload::kMaxSlotsPerCall);
  }
  if (d.ring_size == 0 || d.ring_size > offload::kMaxRingSize) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "desc->ring_size = %u must be in [1, %u]",
                d.ring_size, offload::kMaxRingSize);
  }
  if (d.timeout_us == 0 || d.park_poll_us == 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "desc->%s is 0",
                d.timeout_us == 0 ? "timeout_us" : "park_poll_us");
  }
  const offload::RingGeometry geometry{d.ring_size, d.m_capacity, d.k, e_max, hidden};
  if (!offload::ring_geometry_ok(geometry)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "hidden = %u is above 2^24", hidden);
  }
  const CudaBackend* backend = cuda_backend_or_fail(function);
  if (backend == nullptr) return QMOE_STATUS_CUDA_UNAVAILABLE;
  CudaOffloadCreate c{};
  c.device = d.device;
  c.context = context;
  c.num_layers = d.num_layers;
  c.host_layers = host.data();
  c.gpu_layers = gpu.data();
  c.geometry = geometry;
  c.timeout_ns = uint64_t{d.timeout_us} * 1000;
  c.spin_ns = uint64_t{d.spin_us} * 1000;
  c.park_ns = uint64_t{d.park_poll_us} * 1000;
  c.short_circuit = d.short_circuit != 0;
  qmoe_cuda_offload* shell = HandlePool<qmoe_cuda_offload>::acquire();
  if (shell == nullptr) {
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the session handle failed");
  }
  try {
    shell->num_experts = experts;
    shell->gpu_sets.assign(gpu.size(), nullptr);
    for (size_t l = 0; l < gpu.size(); ++l) shell->gpu_sets[l] = const_cast<void*>(gpu[l]);
  } catch (const std::bad_alloc&) {
    shell->magic.store(kDeadMagic, std::memory_order_release);
    HandlePool<qmoe_cuda_offload>::release(shell);
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the session handle failed");
  }
  void* impl = nullptr;
  if (qmoe_status s = backend->offload_create(function, c, &impl); s != QMOE_STATUS_OK) {
    shell->magic.store(kDeadMagic, std::memory_order_release);
    HandlePool<qmoe_cuda_offload>::release(shell);
    return s;
  }
  shell->session = impl;
  shell->m_capacity = d.m_capacity;
  shell->k_max = d.k;
  shell->hidden = hidden;
  shell->magic.store(kLiveMagic, std::memory_order_release);
  *out = shell;
  return QMOE_STATUS_OK;
}

// The checks of qmoe_cuda_offload_forward that need no device memory.
qmoe_status check_forward(const qmoe_cuda_offload* h, uint32_t layer,
                          const qmoe_cuda_moe_params* params, const char* function,
                          qmoe_cuda_moe_params* p) {
  if (qmoe_status s = resolve(h, function); s != QMOE_STATUS_OK) return s;
  if (layer >= h->num_experts.size()) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "layer %u of %zu", layer,
                h->num_experts.size());
  }
  if (qmoe_status s = read_moe_params(params, function, p); s != QMOE_STATUS_OK) return s;
  const auto dtype = static_cast<qmoe_dtype>(enum_bits(p->dtype));
  if (p->m_capacity == 0 || p->m_capacity > h->m_capacity) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "params->m_capacity = %u must be in [1, %u] (the session's)", p->m_capacity,
                h->m_capacity);
  }
  if (qmoe_status s = check_tokens_per_expert_hint(*p, function); s != QMOE_STATUS_OK) return s;
  const uint32_t k_limit = std::min(h->k_max, h->num_experts[layer]);
  if (p->k == 0 || p->k > k_limit) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "params->k = %u must be in [1, %u] (the session's k and the layer's experts)", p->k,
                k_limit);
  }
  if (p->m == nullptr || p->x == nullptr || p->y == nullptr) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "params->%s is NULL",
                p->m == nullptr   ? "m"
                : p->x == nullptr ? "x"
                                  : "y");
  }
  if (qmoe_status s = check_one_routing(*p, function); s != QMOE_STATUS_OK) return s;
  if (p->m_capacity > 1 && (p->ldx < h->hidden || p->ldy < h->hidden)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "ldx = %zu and ldy = %zu must be >= hidden = %u", p->ldx, p->ldy, h->hidden);
  }
  const size_t element = dtype_size(dtype);
  if (reinterpret_cast<uintptr_t>(p->x) % element != 0 ||
      reinterpret_cast<uintptr_t>(p->y) % element != 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "params->x and params->y must be aligned to their %zu-byte elements", element);
  }
  if (p->workspace != nullptr) {
    if (reinterpret_cast<uintptr_t>(p->workspace) % kWorkspaceAlignment != 0) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "params->workspace is not 256-byte aligned");
    }
    const size_t need = cuda_backend()->moe_workspace_size(h->gpu_sets[layer], p->m_capacity, p->k);
    if (need == 0 || p->workspace_bytes < need) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "workspace_bytes = %zu, qmoe_cuda_moe_workspace_size gives %zu",
                  p->workspace_bytes, need);
    }
  }
  return QMOE_STATUS_OK;
}

}  // namespace

void* offload_session_object(const qmoe_cuda_offload* handle) {
  if (handle == nullptr || handle->magic.load(std::memory_order_acquire) != kLiveMagic) {
    return nullptr;
  }
  return handle->session;
}

}  // namespace qmoe

extern "C" {

QMOE_API void qmoe_cuda_offload_desc_init(qmoe_cuda_offload_desc* desc) {
  if (desc == nullptr) return;
  *desc = qmoe_cuda_offload_desc{};
  desc->struct_size = sizeof(qmoe_cuda_offload_desc);
  desc->m_capacity = 4;
  desc->k = 8;
  desc->ring_size = 4;
  desc->timeout_us = 1000000;
  desc->spin_us = 2000;
  desc->park_poll_us = 100;
  desc->short_circuit = 1;
}

QMOE_API qmoe_status qmoe_cuda_offload_create(const qmoe_cuda_offload_desc* desc,
                                              qmoe_cuda_offload** session) {
  return qmoe::create(desc, session, __func__);
}

QMOE_API qmoe_status qmoe_cuda_offload_destroy(qmoe_cuda_offload* session) {
  using namespace qmoe;
  if (session == nullptr) return QMOE_STATUS_OK;
  if (qmoe_status s = resolve(session, __func__); s != QMOE_STATUS_OK) return s;
  if (!HandlePool<qmoe_cuda_offload>::claim_for_destroy(session, kLiveMagic, kDeadMagic)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "session was destroyed");
  }
  // A live session exists only when the backend made it.
  cuda_backend()->offload_destroy(session->session);
  session->session = nullptr;
  HandlePool<qmoe_cuda_offload>::release(session);
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_cuda_offload_forward(qmoe_cuda_offload* session, uint32_t layer,
                                               const qmoe_cuda_moe_params* params,
                                               qmoe_cuda_stream stream) {
  using namespace qmoe;
  qmoe_cuda_moe_params p;
  if (qmoe_status s = check_forward(session, layer, params, __func__, &p); s != QMOE_STATUS_OK) {
    return s;
  }
  const CudaMoeCall call = moe_call_of(p, stream);
  return cuda_backend()->offload_forward(__func__, session->session, layer, call);
}

QMOE_API qmoe_status qmoe_cuda_offload_wake(qmoe_cuda_offload* session) {
  using namespace qmoe;
  if (qmoe_status s = resolve(session, __func__); s != QMOE_STATUS_OK) return s;
  cuda_backend()->offload_wake(session->session);
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_cuda_offload_check(qmoe_cuda_offload* session, qmoe_cuda_stream stream) {
  using namespace qmoe;
  if (qmoe_status s = resolve(session, __func__); s != QMOE_STATUS_OK) return s;
  return cuda_backend()->offload_check(__func__, session->session, stream);
}

QMOE_API qmoe_status qmoe_cuda_offload_get_telemetry(qmoe_cuda_offload* session,
                                                     qmoe_cuda_stream stream,
                                                     qmoe_cuda_offload_telemetry* telemetry) {
  using namespace qmoe;
  if (qmoe_status s = resolve(session, __func__); s != QMOE_STATUS_OK) return s;
  if (telemetry == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "telemetry is NULL");
  const size_t caller_size = telemetry->struct_size;
  if (!struct_size_ok(caller_size, sizeof(qmoe_cuda_offload_telemetry))) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
              "telemetry->struct_size is %zu, not the size of any version of the struct; set it "
              "to sizeof(qmoe_cuda_offload_telemetry) (%zu)",
              caller_size, sizeof(qmoe_cuda_offload_telemetry));
  }
  CudaOffloadTelemetry t{};
  if (qmoe_status s = cuda_backend()->offload_telemetry(__func__, session->session, stream, &t);
      s != QMOE_STATUS_OK) {
    return s;
  }
  qmoe_cuda_offload_telemetry out{};
  out.struct_size = caller_size;
  out.classify_calls = t.device.classify_calls;
  out.short_circuits = t.device.short_circuits;
  out.published_requests = t.device.published;
  out.refused_calls = t.device.refused;
  out.cold_selections = t.device.cold_selections;
  out.requests_served = t.host.requests_served;
  out.selections_served = t.host.selections_served;
  out.failed_requests = t.host.failed_requests;
  out.wakeups = t.host.wakeups;
  out.parks = t.host.parks;
  out.service_ns = t.host.service_ns;
  static_assert(QMOE_CUDA_OFFLOAD_HISTOGRAM_BUCKETS == offload::kHistogramBuckets,
                "the ABI's histogram is the service's");
  for (uint32_t b = 0; b < offload::kHistogramBuckets; ++b) {
    out.service_histogram[b] = t.host.histogram[b];
  }
  std::memcpy(telemetry, &out, sizeof out);
  return QMOE_STATUS_OK;
}

}  // extern "C"
