// An offload session on one GPU (qmoe_cuda_offload): the doorbell ring in mapped pinned host
// memory, the device side's state in device memory, the CPU service thread with its MoE
// handler, and the hybrid layer call that enqueues classify-publish, the resident layer and
// wait-accumulate on the caller's stream (docs/offload.md).
//
// Device memory, one allocation, each piece 256-byte aligned: the OffloadDeviceState, one
// OffloadCallRecord per layer, m_capacity per-token flags per layer, and the resident layer's
// workspace (the largest any layer needs for m_capacity and k_max).
#ifndef QMOE_LIB_CUDA_OFFLOAD_SESSION_CUH_
#define QMOE_LIB_CUDA_OFFLOAD_SESSION_CUH_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/cuda/device_expert_set.cuh"
#include "lib/cuda_backend.h"
#include "lib/offload/device_state.h"
#include "lib/offload/moe_handler.h"
#include "lib/offload/ring_layout.h"
#include "lib/offload/service.h"

namespace qmoe::cuda {

struct OffloadSession {
  int device = 0;
  std::vector<const DeviceExpertSet*> layers;
  offload::RingLayout layout{};
  uint64_t timeout_ns = 0;
  bool short_circuit = true;
  unsigned char* ring_host = nullptr;    // cudaHostAlloc'd (mapped): the service's address
  unsigned char* ring_device = nullptr;  // the same memory as the kernels address it
  void* device_memory = nullptr;         // cudaMalloc'd: the pieces below
  offload::OffloadDeviceState* state = nullptr;
  offload::OffloadCallRecord* records = nullptr;  // [layers]
  uint8_t* token_cold = nullptr;                  // [layers][m_capacity]
  void* workspace = nullptr;                      // the resident layer's
  size_t workspace_bytes = 0;
  std::unique_ptr<offload::MoeRequestHandler> handler;
  std::unique_ptr<offload::OffloadService> service;
};

/// Make a session as lib/cuda_backend.h's offload_create describes; *session is new'd.
qmoe_status create_offload_session(const char* function, const CudaOffloadCreate& create,
                                   OffloadSession** session);

/// Wait for the device (in-flight requests are still served), stop the service, free.
void destroy_offload_session(OffloadSession* session);

/// Enqueue one hybrid layer call (its arguments checked, the device scope set, the stream the
/// session's device's): classify-publish, the resident layer, wait-accumulate.
qmoe_status enqueue_offload_layer(const char* function, OffloadSession* session, uint32_t layer,
                                  const CudaMoeCall& call);

/// The host's copy of the sticky error (the ring header's mirror): 0 or kError* bits.
uint32_t offload_mirrored_error(const OffloadSession* session);

/// Statuses and words for the sticky error bits: TIMEOUT when a wait timed out, else
/// INTERNAL_ERROR; `what` gets a description (with the service's last failure).
qmoe_status offload_error_status(const OffloadSession* session, uint32_t error, std::string* what);

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_OFFLOAD_SESSION_CUH_
