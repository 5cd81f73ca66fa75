// The CUDA backend (lib/cuda_backend.h): the table of lib/cuda's entry points, and the two
// calls that pick among the kernels (the GEMM by M, the layer's parameters from a set).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <initializer_list>
#include <string>

#include "lib/cuda/cuda_status.h"
#include "lib/cuda/device_expert_set.cuh"
#include "lib/cuda/int4_gemm_tc.cuh"
#include "lib/cuda/int4_gemv.cuh"
#include "lib/cuda/moe_layer.cuh"
#include "lib/cuda/offload_session.cuh"
#include "lib/cuda_backend.h"
#include "lib/error.h"

namespace qmoe {
namespace {

using cuda::DeviceExpertSet;

qmoe_status get_device_count(const char* function, int* device_count) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();  // clear the error so later calls start clean
    return cuda::status_from_cuda(error, function, "cudaGetDeviceCount");
  }
  *device_count = count;
  return QMOE_STATUS_OK;
}

qmoe_status create_expert_set(const char* function, const CudaExpertUpload& upload, void** set) {
  DeviceExpertSet* s = nullptr;
  const qmoe_status status = cuda::create_device_expert_set(function, upload, &s);
  if (status == QMOE_STATUS_OK) *set = s;
  return status;
}

void destroy_expert_set(void* set) {
  cuda::destroy_device_expert_set(static_cast<DeviceExpertSet*>(set));
}

const int32_t* residency(const void* set) {
  return static_cast<const DeviceExpertSet*>(set)->residency;
}

size_t moe_workspace_size(const void* set, uint32_t m_capacity, uint32_t k) {
  const auto* s = static_cast<const DeviceExpertSet*>(set);
  return cuda::moe_layer_workspace_size(m_capacity, k, s->num_experts, s->hidden, s->intermediate);
}

// The stream's device must be the set's (the legacy stream takes the current one, which the
// caller's scope has set). Not checked while the stream is being captured: cudaStreamGetDevice
// on a capturing stream fails with cudaErrorStreamCaptureUnsupported and invalidates the
// capture, in relaxed capture mode too (CUDA 13 on the H200). There a stream of another device
// fails the launch that follows instead (a CUDA_ERROR status).
qmoe_status check_stream(const char* function, void* stream, int device) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture) != cudaSuccess) {
    cudaGetLastError();
  }
  if (capture != cudaStreamCaptureStatusNone) return QMOE_STATUS_OK;
  int stream_device = -1;
  const cudaError_t e = cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &stream_device);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cuda::status_from_cuda(e, function, "cudaStreamGetDevice");
  }
  if (stream_device != device) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "the stream is on device %d, the set on %d",
                stream_device, device);
  }
  return QMOE_STATUS_OK;
}

// A residency update's preconditions: the set's device current (`scope`; the legacy stream is
// the current device's), and each stream not capturing (an update is not capturable) and on
// that device.
qmoe_status check_update_streams(const char* function, const cuda::DeviceScope& scope, int device,
                                 std::initializer_list<void*> streams) {
  if (scope.status() != cudaSuccess) {
    return cuda::status_from_cuda(static_cast<cudaError_t>(scope.status()), function,
                                  "cudaSetDevice");
  }
  for (void* stream : streams) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &capture) != cudaSuccess) {
      cudaGetLastError();
    }
    if (capture != cudaStreamCaptureStatusNone) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "the stream is being captured: a residency update is not capturable");
    }
    if (qmoe_status st = check_stream(function, stream, device); st != QMOE_STATUS_OK) return st;
  }
  return QMOE_STATUS_OK;
}

qmoe_status update_residency(const char* function, void* set, const CudaExpertUpload& upload,
                             void* stream, uint32_t* copied) {
  auto* s = static_cast<DeviceExpertSet*>(set);
  const cuda::DeviceScope scope(s->device);
  if (qmoe_status st = check_update_streams(function, scope, s->device, {stream});
      st != QMOE_STATUS_OK) {
    return st;
  }
  return cuda::update_device_expert_set(function, s, upload, static_cast<cudaStream_t>(stream),
                                        copied);
}

qmoe_status begin_residency_update(const char* function, void* set, const CudaExpertUpload& upload,
                                   void* stream, void* copy_stream, uint32_t* copied) {
  auto* s = static_cast<DeviceExpertSet*>(set);
  const cuda::DeviceScope scope(s->device);
  if (qmoe_status st = check_update_streams(function, scope, s->device, {stream, copy_stream});
      st != QMOE_STATUS_OK) {
    return st;
  }
  return cuda::begin_device_expert_set_update(function, s, upload,
                                              static_cast<cudaStream_t>(stream),
                                              static_cast<cudaStream_t>(copy_stream), copied);
}

qmoe_status finish_residency_update(const char* function, void* set, void* stream, bool wait,
                                    bool* finished) {
  auto* s = static_cast<DeviceExpertSet*>(set);
  const cuda::DeviceScope scope(s->device);
  if (qmoe_status st = check_update_streams(function, scope, s->device, {stream});
      st != QMOE_STATUS_OK) {
    return st;
  }
  return cuda::finish_device_expert_set_update(function, s, static_cast<cudaStream_t>(stream), wait,
                                               finished);
}

qmoe_status moe_forward(const char* function, const void* set, const CudaMoeCall& c) {
  const auto* s = static_cast<const DeviceExpertSet*>(set);
  cuda::DeviceScope scope(s->device);
  if (scope.status() != cudaSuccess) {
    return cuda::status_from_cuda(static_cast<cudaError_t>(scope.status()), function,
                                  "cudaSetDevice");
  }
  if (qmoe_status st = check_stream(function, c.stream, s->device); st != QMOE_STATUS_OK) return st;
  const struct {
    const char* name;
    const void* p;
  } pointers[] = {{"params->m", c.m},           {"params->x", c.x},
                  {"params->y", c.y},           {"params->workspace", c.workspace},
                  {"params->ids", c.ids},       {"params->weights", c.weights},
                  {"params->logits", c.logits}, {"params->expert_counts", c.expert_counts}};
  for (const auto& p : pointers) {
    if (p.p == nullptr) continue;  // the routing not taken, or no counts asked for
    if (qmoe_status st = cuda::check_device_pointer(function, p.name, p.p, s->device);
        st != QMOE_STATUS_OK) {
      return st;
    }
  }
  cuda::MoeLayerParams p{};
  p.num_experts = s->num_experts;
  p.hidden = s->hidden;
  p.intermediate = s->intermediate;
  p.top_k = c.k;
  p.m_capacity = c.m_capacity;
  p.num_slots = s->num_slots;
  p.accuracy = c.accuracy;
  p.dtype = c.dtype;
  p.fusion = s->interleaved ? QMOE_SWIGLU_INTERLEAVED : QMOE_SWIGLU_CONCATENATED;
  p.alpha = s->alpha;
  p.beta = s->beta;
  p.limit = s->limit;
  p.accumulate = c.accumulate;
  p.fc1 = s->fc1;
  p.fc2 = s->fc2;
  p.format = s->format;
  p.lean_walk = s->lean_walk;
  p.m = c.m;
  p.x = c.x;
  p.ldx = c.ldx;
  p.y = c.y;
  p.ldy = c.ldy;
  p.ids = c.ids;
  p.weights = c.weights;
  p.logits = c.logits;
  p.renormalize = c.renormalize;
  p.residency = s->residency;
  p.inputs_ready_early = false;
  p.expected_tokens_per_expert = c.expected_tokens_per_expert;
  p.expert_counts = c.expert_counts;
  p.workspace = c.workspace;
  p.workspace_bytes = c.workspace_bytes;
  const cudaError_t e = cuda::launch_moe_layer(p, static_cast<cudaStream_t>(c.stream));
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cuda::status_from_cuda(e, function, "launching the MoE layer");
  }
  return QMOE_STATUS_OK;
}

qmoe_status moe_check(const char* function, const void* workspace, void* stream) {
  uint32_t word = 0;
  cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  if (e == cudaSuccess) {
    e = cudaMemcpy(&word, cuda::moe_layer_error_word(workspace), sizeof word,
                   cudaMemcpyDeviceToHost);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cuda::status_from_cuda(e, function, "reading the layer's error word");
  }
  if (word == 0) return QMOE_STATUS_OK;
  static const struct {
    uint32_t bit;
    const char* what;
  } kBits[] = {{cuda::kMoeErrorTokensOverCapacity, "m above m_capacity"},
               {cuda::kMoeErrorExpertId, "an expert id outside [0, E)"},
               {cuda::kMoeErrorWeight, "a non-finite routing weight"},
               {cuda::kMoeErrorLogits, "a NaN or +infinity logit, or a row of -infinity only"},
               {cuda::kMoeErrorResidency, "a residency entry outside the slots"},
               {cuda::kMoeErrorSlotMatrix, "a malformed slot description"}};
  std::string found;
  for (const auto& b : kBits) {
    if ((word & b.bit) == 0) continue;
    if (!found.empty()) found += "; ";
    found += b.what;
  }
  return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
              "the last forward found %s (error word 0x%x); its y rows were set to 0",
              found.c_str(), word);
}

cuda::DeviceQuantMatrix device_matrix(const qmoe_quant_matrix& w) {
  cuda::DeviceQuantMatrix d{};
  d.n = w.n;
  d.k = w.k;
  d.block_size = w.block_size;
  d.chunks = (w.k + cuda::kChunkCodes - 1) / cuda::kChunkCodes;
  d.codes = static_cast<const uint8_t*>(w.codes);
  d.scale_dtype = w.scale_dtype;
  d.scales = w.scales;
  d.scale_row_stride = w.scale_row_stride;
  d.scale_block_stride = w.scale_block_stride;
  d.scale_group_stride = w.scale_group_stride;
  d.zero_points = w.zero_points;
  d.zero_point_row_stride = w.zero_point_row_stride;
  d.zero_point_block_stride = w.zero_point_block_stride;
  d.zero_point_group_stride = w.zero_point_group_stride;
  d.bias_dtype = w.bias_dtype;
  d.bias = w.bias;
  d.format = w.format;
  d.global_scale = w.global_scale == 0.0f ? 1.0f : w.global_scale;  // validated: 0 is "none"
  return d;
}

size_t element_bytes(qmoe_dtype d) {
  return d == QMOE_DTYPE_F32 ? 4 : 2;
}

// Up to 8 rows: the decode GEMV. More: the tensor-core GEMM where its operands allow (INT4
// weights, the only format it reads; X rows 16-byte aligned; FP32 X only at the fast level,
// since its BF16 pair is within 2^-16, not the exact level's 1e-5), else the GEMV 8 rows at a
// time (every format the GEMV reads: INT3, MXFP4 and NVFP4 at any M).
qmoe_status gemm(const char* function, const CudaGemmCall& c) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
    cudaGetLastError();
    return cuda::status_from_cuda(e, function, "cudaGetDevice");
  }
  if (qmoe_status st = check_stream(function, c.stream, device); st != QMOE_STATUS_OK) return st;
  const qmoe_quant_matrix& w = *c.w;
  const struct {
    const char* name;
    const void* p;
  } pointers[] = {{"weights->codes", w.codes},
                  {"weights->scales", w.scales},
                  {"weights->zero_points", w.zero_points},
                  {"weights->bias", w.bias},
                  {"x", c.x},
                  {"y", c.y}};
  for (const auto& p : pointers) {
    if (p.p == nullptr) continue;
    if (qmoe_status st = cuda::check_device_pointer(function, p.name, p.p, device);
        st != QMOE_STATUS_OK) {
      return st;
    }
  }
  const cuda::DeviceQuantMatrix d = device_matrix(w);
  const auto stream = static_cast<cudaStream_t>(c.stream);
  const size_t x_row = c.ldx * element_bytes(c.x_dtype);
  const bool tc_operands = reinterpret_cast<uintptr_t>(c.x) % 16 == 0 && x_row % 16 == 0;
  const bool tc = c.m > cuda::kInt4GemvMaxRows && w.format == QMOE_WEIGHT_FORMAT_INT4 &&
                  tc_operands &&
                  !(c.accuracy == QMOE_ACCURACY_EXACT && c.x_dtype == QMOE_DTYPE_F32);
  cudaError_t e = cudaSuccess;
  if (tc) {
    e = cuda::launch_int4_gemm_tc(d, c.m, c.x_dtype, c.x, c.ldx, c.y_dtype, c.y, c.ldy, c.n_begin,
                                  c.n_end, stream, c.accuracy);
  } else {
    const size_t y_row = c.ldy * element_bytes(c.y_dtype);
    for (uint32_t m0 = 0; m0 < c.m && e == cudaSuccess; m0 += cuda::kInt4GemvMaxRows) {
      const uint32_t rows = c.m - m0 < cuda::kInt4GemvMaxRows ? c.m - m0 : cuda::kInt4GemvMaxRows;
      e = cuda::launch_int4_gemv(d, c.accuracy, rows, c.x_dtype,
                                 static_cast<const unsigned char*>(c.x) + m0 * x_row, c.ldx,
                                 c.y_dtype, static_cast<unsigned char*>(c.y) + m0 * y_row, c.ldy,
                                 c.n_begin, c.n_end, stream);
    }
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cuda::status_from_cuda(e, function,
                                  tc ? "launching the tensor-core GEMM" : "launching the GEMV");
  }
  return QMOE_STATUS_OK;
}

qmoe_status offload_create(const char* function, const CudaOffloadCreate& create, void** session) {
  cuda::OffloadSession* s = nullptr;
  const qmoe_status status = cuda::create_offload_session(function, create, &s);
  if (status == QMOE_STATUS_OK) *session = s;
  return status;
}

void offload_destroy(void* session) {
  cuda::destroy_offload_session(static_cast<cuda::OffloadSession*>(session));
}

qmoe_status offload_forward(const char* function, void* session, uint32_t layer,
                            const CudaMoeCall& c) {
  auto* s = static_cast<cuda::OffloadSession*>(session);
  // Fail fast: after a sticky error the device would refuse the call anyway.
  if (const uint32_t error = cuda::offload_mirrored_error(s); error != 0) {
    std::string what;
    const qmoe_status st = cuda::offload_error_status(s, error, &what);
    return fail(st, function, "the session has failed: %s", what.c_str());
  }
  cuda::DeviceScope scope(s->device);
  if (scope.status() != cudaSuccess) {
    return cuda::status_from_cuda(static_cast<cudaError_t>(scope.status()), function,
                                  "cudaSetDevice");
  }
  if (qmoe_status st = check_stream(function, c.stream, s->device); st != QMOE_STATUS_OK) return st;
  const struct {
    const char* name;
    const void* p;
  } pointers[] = {{"params->m", c.m},           {"params->x", c.x},
                  {"params->y", c.y},           {"params->workspace", c.workspace},
                  {"params->ids", c.ids},       {"params->weights", c.weights},
                  {"params->logits", c.logits}, {"params->expert_counts", c.expert_counts}};
  for (const auto& p : pointers) {
    if (p.p == nullptr) continue;  // the session's workspace, the routing not taken, no counts
    if (qmoe_status st = cuda::check_device_pointer(function, p.name, p.p, s->device);
        st != QMOE_STATUS_OK) {
      return st;
    }
  }
  return cuda::enqueue_offload_layer(function, s, layer, c);
}

void offload_wake(void* session) {
  static_cast<cuda::OffloadSession*>(session)->service->wake();
}

qmoe_status sync_and_read(const char* function, const cuda::OffloadSession& s, void* stream,
                          void* dst, const void* src, size_t bytes) {
  cuda::DeviceScope scope(s.device);
  cudaError_t e = static_cast<cudaError_t>(scope.status());
  if (e == cudaSuccess) e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  if (e == cudaSuccess) e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cuda::status_from_cuda(e, function, "reading the offload session's device state");
  }
  return QMOE_STATUS_OK;
}

qmoe_status offload_check(const char* function, void* session, void* stream) {
  auto* s = static_cast<cuda::OffloadSession*>(session);
  uint32_t error = 0;
  if (qmoe_status st = sync_and_read(function, *s, stream, &error, &s->state->error, sizeof error);
      st != QMOE_STATUS_OK) {
    return st;
  }
  if (error != 0) {
    std::string what;
    const qmoe_status st = cuda::offload_error_status(s, error, &what);
    return fail(st, function, "%s (sticky: every later call fails fast)", what.c_str());
  }
  // The resident layer's own error word (its inputs), in the session's workspace.
  return moe_check(function, s->workspace, stream);
}

qmoe_status offload_telemetry(const char* function, void* session, void* stream,
                              CudaOffloadTelemetry* out) {
  auto* s = static_cast<cuda::OffloadSession*>(session);
  if (qmoe_status st = sync_and_read(function, *s, stream, &out->device, &s->state->telemetry,
                                     sizeof out->device);
      st != QMOE_STATUS_OK) {
    return st;
  }
  out->host = s->service->telemetry();
  return QMOE_STATUS_OK;
}

constexpr CudaBackend kCudaBackend = {
    /*get_device_count=*/&get_device_count,
    /*create_expert_set=*/&create_expert_set,
    /*destroy_expert_set=*/&destroy_expert_set,
    /*residency=*/&residency,
    /*update_residency=*/&update_residency,
    /*begin_residency_update=*/&begin_residency_update,
    /*finish_residency_update=*/&finish_residency_update,
    /*moe_workspace_size=*/&moe_workspace_size,
    /*moe_forward=*/&moe_forward,
    /*moe_check=*/&moe_check,
    /*gemm=*/&gemm,
    /*offload_create=*/&offload_create,
    /*offload_destroy=*/&offload_destroy,
    /*offload_forward=*/&offload_forward,
    /*offload_wake=*/&offload_wake,
    /*offload_check=*/&offload_check,
    /*offload_telemetry=*/&offload_telemetry,
};

}  // namespace

const CudaBackend* cuda_backend() {
  return &kCudaBackend;
}

}  // namespace qmoe
