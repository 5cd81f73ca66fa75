#include "lib/cuda/offload_session.cuh"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "lib/cuda/cuda_status.h"
#include "lib/cuda/moe_layer.cuh"
#include "lib/cuda/offload_kernels.cuh"
#include "lib/error.h"
#include "lib/moe/expert_set.h"

namespace qmoe::cuda {
namespace {

constexpr size_t kAlign = 256;

size_t align_up(size_t v) {
  return (v + kAlign - 1) & ~(kAlign - 1);
}

// Frees what a session holds (any part may be missing: a failed create calls it too).
void release(OffloadSession* s) {
  if (s->service != nullptr) s->service->stop();
  if (s->ring_host != nullptr) cudaFreeHost(s->ring_host);
  if (s->device_memory != nullptr) cudaFree(s->device_memory);
  cudaGetLastError();
  delete s;
}

}  // namespace

qmoe_status create_offload_session(const char* function, const CudaOffloadCreate& c,
                                   OffloadSession** out) {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    return status_from_cuda(e, function, "cudaGetDeviceCount");
  }
  if (c.device >= count) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "device %d: %d visible", c.device, count);
  }
  // The GPU sets: on this device, with the host sets' FFN shape.
  for (uint32_t l = 0; l < c.num_layers; ++l) {
    const auto* g = static_cast<const DeviceExpertSet*>(c.gpu_layers[l]);
    const ExpertSet& h = *c.host_layers[l];
    if (g->device != c.device) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "gpu_layers[%u] is on device %d, the session on %d", l, g->device, c.device);
    }
    if (g->intermediate != h.intermediate || g->interleaved != h.interleaved) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "layer %u: the GPU set's intermediate size or SwiGLU fusion differs from the "
                  "host set's",
                  l);
    }
  }
  DeviceScope scope(c.device);
  if (scope.status() != cudaSuccess) {
    return status_from_cuda(static_cast<cudaError_t>(scope.status()), function, "cudaSetDevice");
  }
  int can_map = 0;
  if (const cudaError_t e = cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, c.device);
      e != cudaSuccess || can_map == 0) {
    cudaGetLastError();
    return fail(QMOE_STATUS_UNSUPPORTED_HARDWARE, function,
                "device %d cannot map host memory (the doorbell ring needs it)", c.device);
  }
  auto* s = new (std::nothrow) OffloadSession;
  if (s == nullptr) return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the session");
  s->device = c.device;
  s->timeout_ns = c.timeout_ns;
  s->short_circuit = c.short_circuit;
  s->layout = offload::make_ring_layout(c.geometry);
  try {
    for (uint32_t l = 0; l < c.num_layers; ++l) {
      s->layers.push_back(static_cast<const DeviceExpertSet*>(c.gpu_layers[l]));
    }
  } catch (const std::bad_alloc&) {
    release(s);
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the layer list");
  }

  // The ring: mapped pinned host memory, zeroed (every sequence word 0: every slot free).
  void* ring = nullptr;
  cudaError_t e =
      cudaHostAlloc(&ring, s->layout.total_bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();
    release(s);
    return status_from_cuda(e, function, "cudaHostAlloc of the doorbell ring");
  }
  s->ring_host = static_cast<unsigned char*>(ring);
  std::memset(s->ring_host, 0, s->layout.total_bytes);
  void* ring_device = nullptr;
  if ((e = cudaHostGetDevicePointer(&ring_device, ring, 0)) != cudaSuccess) {
    cudaGetLastError();
    release(s);
    return status_from_cuda(e, function, "cudaHostGetDevicePointer of the doorbell ring");
  }
  s->ring_device = static_cast<unsigned char*>(ring_device);

  // Device memory: state, records, token flags, the resident layer's workspace.
  const uint32_t m_capacity = c.geometry.m_capacity;
  size_t workspace = 0;
  for (const DeviceExpertSet* g : s->layers) {
    const size_t bytes = moe_layer_workspace_size(m_capacity, c.geometry.k_max, g->num_experts,
                                                  g->hidden, g->intermediate);
    if (bytes == 0) {
      release(s);
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "m_capacity = %u, k = %u: beyond what the resident layer's kernels take",
                  m_capacity, c.geometry.k_max);
    }
    workspace = std::max(workspace, bytes);
  }
  const size_t state_at = 0;
  const size_t records_at = state_at + align_up(sizeof(offload::OffloadDeviceState));
  const size_t flags_at =
      records_at + align_up(size_t{c.num_layers} * sizeof(offload::OffloadCallRecord));
  const size_t workspace_at = flags_at + align_up(size_t{c.num_layers} * m_capacity);
  const size_t total = workspace_at + align_up(workspace);
  if ((e = cudaMalloc(&s->device_memory, total)) != cudaSuccess) {
    cudaGetLastError();
    s->device_memory = nullptr;
    release(s);
    return status_from_cuda(e, function, "cudaMalloc of the session's device state");
  }
  auto* base = static_cast<unsigned char*>(s->device_memory);
  s->state = reinterpret_cast<offload::OffloadDeviceState*>(base + state_at);
  s->records = reinterpret_cast<offload::OffloadCallRecord*>(base + records_at);
  s->token_cold = base + flags_at;
  s->workspace = base + workspace_at;
  s->workspace_bytes = workspace;
  offload::OffloadDeviceState initial{};
  initial.next_seq = 1;
  e = cudaMemset(s->device_memory, 0, total);
  if (e == cudaSuccess) {
    e = cudaMemcpy(s->state, &initial, sizeof initial, cudaMemcpyHostToDevice);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    release(s);
    return status_from_cuda(e, function, "initialising the session's device state");
  }

  // The CPU side: the MoE handler over the host sets, then the service thread.
  std::vector<const ExpertSet*> host;
  try {
    host.assign(c.host_layers, c.host_layers + c.num_layers);
  } catch (const std::bad_alloc&) {
    release(s);
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the layer list");
  }
  if (qmoe_status st =
          offload::MoeRequestHandler::create(c.context, host, c.geometry, function, &s->handler);
      st != QMOE_STATUS_OK) {
    release(s);
    return st;
  }
  offload::ServiceOptions options;
  options.spin_ns = c.spin_ns;
  options.park_ns = c.park_ns;
  s->service.reset(new (std::nothrow)
                       offload::OffloadService(s->ring_host, s->layout, s->handler.get(), options));
  if (s->service == nullptr) {
    release(s);
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the service");
  }
  if (qmoe_status st = s->service->start(function); st != QMOE_STATUS_OK) {
    release(s);
    return st;
  }
  *out = s;
  return QMOE_STATUS_OK;
}

void destroy_offload_session(OffloadSession* s) {
  DeviceScope scope(s->device);
  // Kernels of any stream may still poll the ring or wait for an answer: the device's work
  // ends first, with the service still answering (each wait is bounded by the timeout), then
  // the service stops and the memory goes.
  cudaDeviceSynchronize();
  cudaGetLastError();
  release(s);
}

uint32_t offload_mirrored_error(const OffloadSession* s) {
  return __atomic_load_n(offload::ring_error_mirror(s->ring_host), __ATOMIC_ACQUIRE);
}

qmoe_status offload_error_status(const OffloadSession* s, uint32_t error, std::string* what) {
  what->clear();
  if (error & offload::kErrorTimeout) {
    *what += "a wait for the CPU passed the session's timeout";
  }
  if (error & offload::kErrorHost) {
    if (!what->empty()) *what += "; ";
    *what += "the CPU service failed a request (" + s->service->last_failure() + ")";
  }
  if (error & offload::kErrorProtocol) {
    if (!what->empty()) *what += "; ";
    *what += "a request's ring slot was still in use";
  }
  return (error & offload::kErrorTimeout) != 0 ? QMOE_STATUS_TIMEOUT : QMOE_STATUS_INTERNAL_ERROR;
}

qmoe_status enqueue_offload_layer(const char* function, OffloadSession* s, uint32_t layer,
                                  const CudaMoeCall& c) {
  const DeviceExpertSet& g = *s->layers[layer];
  const auto stream = static_cast<cudaStream_t>(c.stream);
  // The service may be parked: the request this call publishes is a few microseconds away.
  s->service->wake();

  uint8_t* token_cold = s->token_cold + size_t{layer} * s->layout.geometry.m_capacity;

  offload::WaitArgs w{};
  w.state = s->state;
  w.record = s->records + layer;
  w.token_cold = token_cold;
  w.ring = s->ring_device;
  w.layout = s->layout;
  w.y = c.y;
  w.ldy = c.ldy;
  w.dtype = static_cast<uint32_t>(c.dtype);
  w.timeout_ns = s->timeout_ns;

  MoeLayerParams p{};
  p.num_experts = g.num_experts;
  p.hidden = g.hidden;
  p.intermediate = g.intermediate;
  p.top_k = c.k;
  p.m_capacity = c.m_capacity;
  p.num_slots = g.num_slots;
  p.accuracy = c.accuracy;
  p.dtype = c.dtype;
  p.fusion = g.interleaved ? QMOE_SWIGLU_INTERLEAVED : QMOE_SWIGLU_CONCATENATED;
  p.alpha = g.alpha;
  p.beta = g.beta;
  p.limit = g.limit;
  p.accumulate = c.accumulate;
  p.fc1 = g.fc1;
  p.fc2 = g.fc2;
  p.format = g.format;
  p.lean_walk = g.lean_walk;
  p.m = c.m;
  p.x = c.x;
  p.ldx = c.ldx;
  p.y = c.y;
  p.ldy = c.ldy;
  p.ids = c.ids;
  p.weights = c.weights;
  p.logits = c.logits;
  p.renormalize = c.renormalize;
  p.residency = g.residency;
  p.inputs_ready_early = false;
  p.expected_tokens_per_expert = c.expected_tokens_per_expert;
  p.expert_counts = c.expert_counts;
  p.workspace = c.workspace != nullptr ? c.workspace : s->workspace;
  p.workspace_bytes = c.workspace != nullptr ? c.workspace_bytes : s->workspace_bytes;
  // The layer's FC1 kernel carries the classify-publish (moe_layer.cuh): the resident experts
  // (the residency map is their run mask) run on the GPU while the CPU runs the cold ones.
  p.offload.enabled = true;
  p.offload.state = s->state;
  p.offload.record = s->records + layer;
  p.offload.token_cold = token_cold;
  p.offload.ring = s->ring_device;
  p.offload.layout = s->layout;
  p.offload.layer = layer;
  p.offload.short_circuit = s->short_circuit;
  uint32_t launched = 0;
  const cudaError_t resident = launch_moe_layer(p, stream, &launched);
  if (resident != cudaSuccess) {
    cudaGetLastError();
    // Nothing published: the record still names the last call's request, so no wait either.
    if (launched == 0) return status_from_cuda(resident, function, "launching the hybrid layer");
  }
  // Launched even when FC2's launch failed, so that a request already published is consumed
  // and the ring stays in step.
  const cudaError_t e = launch_offload_wait_accumulate(w, offload_wait_blocks(g.hidden), stream);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return status_from_cuda(e, function, "launching the offload's wait-accumulate");
  }
  if (resident != cudaSuccess) {
    return status_from_cuda(resident, function, "launching the resident MoE layer");
  }
  return QMOE_STATUS_OK;
}

}  // namespace qmoe::cuda
