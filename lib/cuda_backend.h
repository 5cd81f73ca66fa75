// The GPU half behind lib/cuda_api.cc: one table of entry points that lib/cuda/ fills in a build
// with CUDA (lib/cuda/cuda_backend.cu) and that a build without CUDA does not have
// (lib/no_cuda_backend.cc returns nullptr). The ABI functions check their host-side arguments
// themselves, so those checks run, and are tested, on machines with no GPU and in builds with
// no CUDA; only then do they ask for the backend, and report QMOE_STATUS_CUDA_UNAVAILABLE when
// there is none. A new CUDA call is one entry here, its checks in cuda_api.cc and its work in
// lib/cuda/, with no stub to keep in step.
//
// No CUDA header here: lib/cuda_api.cc is compiled by the host compiler in every build.
// Streams travel as void* (a cudaStream_t). Every argument the entries receive has passed the
// ABI's checks; failure statuses name `function`.
#ifndef QMOE_LIB_CUDA_BACKEND_H_
#define QMOE_LIB_CUDA_BACKEND_H_

#include <cstddef>
#include <cstdint>

#include "lib/error.h"
#include "lib/offload/device_state.h"
#include "lib/offload/ring_layout.h"
#include "lib/offload/service.h"
#include "qmoe/qmoe.h"

namespace qmoe {

class Context;
struct ExpertSet;

/// Host descriptions of the experts to place on a device (validated; their pointers are host
/// memory the upload reads).
struct CudaExpertUpload {
  int device;
  uint32_t num_experts, hidden, intermediate;
  bool interleaved;              // SwiGLU fusion
  float alpha, beta, limit;      // limit +infinity: no clamp
  const qmoe_quant_matrix* fc1;  // [num_experts]
  const qmoe_quant_matrix* fc2;
  const uint32_t* resident;  // nullptr: every expert, expert e in slot e
  uint32_t num_resident;
  uint32_t num_slots;  // >= the resident count (E when resident is nullptr); creation only
  bool batched;        // one cudaMemcpyBatchAsync where the runtime has it
};

/// One qmoe_cuda_gemm call (w validated; pointers the caller's).
struct CudaGemmCall {
  const qmoe_quant_matrix* w;
  qmoe_accuracy accuracy;
  uint32_t m;
  qmoe_dtype x_dtype;
  const void* x;
  size_t ldx;
  qmoe_dtype y_dtype;
  void* y;
  size_t ldy;
  uint32_t n_begin, n_end;
  void* stream;
};

/// One qmoe_cuda_moe_forward call (checked).
struct CudaMoeCall {
  qmoe_accuracy accuracy;
  qmoe_dtype dtype;
  uint32_t m_capacity;
  const uint32_t* m;
  const void* x;
  size_t ldx;
  void* y;
  size_t ldy;
  uint32_t k;
  const int32_t* ids;
  const float* weights;
  const void* logits;
  bool renormalize;
  bool accumulate;
  void* workspace;
  size_t workspace_bytes;
  void* stream;
  float expected_tokens_per_expert;  // 0: none (checked: else in [1, m_capacity])
  uint32_t* expert_counts;           // [E] selections per expert, or NULL (checked: aligned)
};

/// One qmoe_cuda_offload_create call (checked: the geometry passes ring_geometry_ok, every
/// layer's host and GPU sets have the same E and H, and H is every layer's).
struct CudaOffloadCreate {
  int device;
  Context* context;  // the CPU context the cold experts run on
  uint32_t num_layers;
  const ExpertSet* const* host_layers;  // [num_layers]
  const void* const* gpu_layers;        // [num_layers] the backend's expert-set objects
  offload::RingGeometry geometry;
  uint64_t timeout_ns;  // the device's wait for an answer
  uint64_t spin_ns, park_ns;
  bool short_circuit;
};

/// Both halves of a session's telemetry.
struct CudaOffloadTelemetry {
  offload::DeviceTelemetry device;
  offload::HostTelemetry host;
};

struct CudaBackend {
  /// Number of visible devices.
  qmoe_status (*get_device_count)(const char* function, int* device_count);
  /// Place experts on a device; *set is an opaque object for the entries below.
  qmoe_status (*create_expert_set)(const char* function, const CudaExpertUpload& upload,
                                   void** set);
  /// Free it (after its device's work is done).
  void (*destroy_expert_set)(void* set);
  /// The set's device residency map (E int32).
  const int32_t* (*residency)(const void* set);
  /// Make upload.resident the set's resident experts on `stream` (upload: the host set's
  /// descriptions, checked by lib/cuda_api.cc to have the set's E, H, intermediate size, SwiGLU
  /// and format; the ids distinct, in range and at most the set's slots); *copied = experts
  /// copied. Refuses a capturing stream and a stream of another device itself.
  qmoe_status (*update_residency)(const char* function, void* set, const CudaExpertUpload& upload,
                                  void* stream, uint32_t* copied);
  /// The same update begun without holding `stream` up: the map drops leavers and joiners on
  /// `stream`, the joiners' copies run on `copy_stream` (lib/cuda/device_expert_set.cuh).
  /// Refuses capturing streams, streams of another device, and a set with a begun update.
  qmoe_status (*begin_residency_update)(const char* function, void* set,
                                        const CudaExpertUpload& upload, void* stream,
                                        void* copy_stream, uint32_t* copied);
  /// Maps a begun update's joiners on `stream` once their copies are done (or, with `wait`,
  /// makes `stream` wait for them); *finished = false when they are not done and not waited on.
  qmoe_status (*finish_residency_update)(const char* function, void* set, void* stream, bool wait,
                                         bool* finished);
  /// Workspace bytes of a forward; 0 when the sizes are out of the kernels' range.
  size_t (*moe_workspace_size)(const void* set, uint32_t m_capacity, uint32_t k);
  qmoe_status (*moe_forward)(const char* function, const void* set, const CudaMoeCall& call);
  qmoe_status (*moe_check)(const char* function, const void* workspace, void* stream);
  qmoe_status (*gemm)(const char* function, const CudaGemmCall& call);
  /// An offload session: its ring, device state and started service thread.
  qmoe_status (*offload_create)(const char* function, const CudaOffloadCreate& create,
                                void** session);
  /// Waits for the session's device, stops the service, frees everything.
  void (*offload_destroy)(void* session);
  /// One hybrid layer call on call.stream (checked against the layer's set and the session).
  qmoe_status (*offload_forward)(const char* function, void* session, uint32_t layer,
                                 const CudaMoeCall& call);
  /// Wake the service thread if it is parked.
  void (*offload_wake)(void* session);
  /// Wait for `stream`, then the session's sticky error and its workspace's error word.
  qmoe_status (*offload_check)(const char* function, void* session, void* stream);
  /// Wait for `stream`, then both halves of the telemetry.
  qmoe_status (*offload_telemetry)(const char* function, void* session, void* stream,
                                   CudaOffloadTelemetry* out);
};

/// The backend of a build with CUDA, or nullptr in a build without it.
const CudaBackend* cuda_backend();

/// cuda_backend(), or nullptr after recording CUDA_UNAVAILABLE for `function`.
inline const CudaBackend* cuda_backend_or_fail(const char* function) {
  const CudaBackend* backend = cuda_backend();
  if (backend == nullptr) {
    fail(QMOE_STATUS_CUDA_UNAVAILABLE, function, "libqmoe was built without CUDA (QMOE_CUDA=OFF)");
  }
  return backend;
}

}  // namespace qmoe

#endif  // QMOE_LIB_CUDA_BACKEND_H_
