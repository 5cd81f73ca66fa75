#include "lib/cuda/device_expert_set.cuh"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include "lib/cuda/cuda_status.h"
#include "lib/cuda/decode_formats.cuh"
#include "lib/cuda/int4_tile.cuh"
#include "lib/cuda_slot_plan.h"
#include "lib/error.h"
#include "lib/formats/int3_layout.h"
#include "lib/formats/quant_matrix.h"
#include "lib/memory_ranges.h"

namespace qmoe::cuda {

// The kernels' copy of INT3's tile constants (device_quant_matrix.cuh) is the format's.
static_assert(kInt3ChunkBytes == ::qmoe::kInt3TileBytes &&
                  kInt3WholeRows == ::qmoe::kInt3WholeRows &&
                  kChunkRowBytes == ::qmoe::kInt3LaneBytes &&
                  kInt3DefaultZeroPoint == ::qmoe::kInt3DefaultZeroPoint,
              "lib/formats/int3_layout.h and lib/cuda/device_quant_matrix.cuh disagree");

namespace {

constexpr size_t kAlign = 256;

size_t align_up(size_t v) {
  return (v + kAlign - 1) & ~(kAlign - 1);
}

// One copy of an upload.
struct Copy {
  void* dst;
  const void* src;
  size_t bytes;
};

// A validated matrix's spans by kind: codes, scales, zero points, bias (bytes 0 when absent).
void projection_spans(const qmoe_quant_matrix& w, MemorySpan out[4]) {
  MemorySpan spans[4];
  const size_t count = matrix_spans(w, spans);  // validated: never 0
  for (int i = 0; i < 4; ++i) out[i] = MemorySpan{nullptr, 0};
  out[0] = spans[0];
  out[1] = spans[1];
  size_t next = 2;
  if (w.zero_points != nullptr && next < count) out[2] = spans[next++];
  if (w.bias != nullptr && next < count) out[3] = spans[next];
}

// Widen `room` to hold w's spans.
void widen_room(const qmoe_quant_matrix& w, ProjectionRoom* room) {
  MemorySpan spans[4];
  projection_spans(w, spans);
  for (int i = 0; i < 4; ++i) room->bytes[i] = std::max(room->bytes[i], spans[i].bytes);
}

// Lay the four spans out from `*at` (each 256-byte aligned) and advance it.
void place_room(ProjectionRoom* room, size_t* at) {
  for (int i = 0; i < 4; ++i) {
    room->offset[i] = *at;
    *at += align_up(room->bytes[i]);
  }
}

// Whether w's spans fit `room`.
bool fits(const qmoe_quant_matrix& w, const ProjectionRoom& room) {
  MemorySpan spans[4];
  projection_spans(w, spans);
  for (int i = 0; i < 4; ++i) {
    if (spans[i].bytes > room.bytes[i]) return false;
  }
  return true;
}

// Record the copies of w's spans into the slot at `slot_base` and return its description there.
DeviceQuantMatrix place_projection(const qmoe_quant_matrix& w, const ProjectionRoom& room,
                                   unsigned char* slot_base, std::vector<Copy>* copies) {
  MemorySpan spans[4];
  projection_spans(w, spans);
  for (int i = 0; i < 4; ++i) {
    if (spans[i].bytes != 0)
      copies->push_back({slot_base + room.offset[i], spans[i].data, spans[i].bytes});
  }
  DeviceQuantMatrix d{};
  d.n = w.n;
  d.k = w.k;
  d.block_size = w.block_size;
  d.chunks = (w.k + kChunkCodes - 1) / kChunkCodes;
  d.codes = slot_base + room.offset[0];
  d.scale_dtype = w.scale_dtype;
  d.scales = slot_base + room.offset[1];
  d.scale_row_stride = w.scale_row_stride;
  d.scale_block_stride = w.scale_block_stride;
  d.scale_group_stride = w.scale_group_stride;
  d.zero_points = w.zero_points != nullptr ? slot_base + room.offset[2] : nullptr;
  d.zero_point_row_stride = w.zero_point_row_stride;
  d.zero_point_block_stride = w.zero_point_block_stride;
  d.zero_point_group_stride = w.zero_point_group_stride;
  d.bias_dtype = w.bias_dtype;
  d.bias = w.bias != nullptr ? slot_base + room.offset[3] : nullptr;
  d.format = w.format;
  d.global_scale = w.global_scale == 0.0f ? 1.0f : w.global_scale;  // validated: 0 is "none"
  return d;
}

// Every copy on `stream`: one batch where the runtime has it, else (or when asked) a loop.
cudaError_t copy_all(const std::vector<Copy>& copies, bool batched, cudaStream_t stream) {
#if CUDART_VERSION >= 12080
  // cudaMemcpyBatchAsync refuses the legacy default stream (cudaErrorInvalidValue), which a
  // caller's NULL stream is: the loop below serves it.
  const bool legacy_stream = stream == nullptr || stream == cudaStreamLegacy;
  if (batched && !copies.empty() && !legacy_stream) {
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    dsts.reserve(copies.size());
    srcs.reserve(copies.size());
    sizes.reserve(copies.size());
    for (const Copy& c : copies) {
      dsts.push_back(c.dst);
      srcs.push_back(c.src);
      sizes.push_back(c.bytes);
    }
    // The sources are the caller's host buffers, untouched by earlier work on this private
    // stream: stream order is all the copies need.
    cudaMemcpyAttributes attrs{};
    attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t first = 0;
    const cudaError_t e = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(),
                                               copies.size(), &attrs, &first, 1, stream);
    if (e != cudaErrorNotSupported) return e;
    cudaGetLastError();  // not on this platform: the loop below
  }
#else
  (void)batched;
#endif
  for (const Copy& c : copies) {
    const cudaError_t e = cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyHostToDevice, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

DeviceScope::DeviceScope(int device) {
  cudaGetDevice(&previous_);
  status_ = cudaSetDevice(device);
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

qmoe_status check_device_pointer(const char* function, const char* what, const void* p,
                                 int device) {
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s: cudaPointerGetAttributes: %s", what,
                cudaGetErrorName(e));
  }
  const bool usable =
      (a.type == cudaMemoryTypeDevice && a.device == device) || a.type == cudaMemoryTypeManaged;
  if (!usable) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "%s is not device memory of device %d (memory type %d, device %d)", what, device,
                static_cast<int>(a.type), a.device);
  }
  return QMOE_STATUS_OK;
}

namespace {

void free_set(DeviceExpertSet* set) {
  for (DeviceExpertSet::StagingImage& image : set->staging) {
    if (image.read != nullptr) cudaEventDestroy(image.read);
    if (image.bytes != nullptr) cudaFreeHost(image.bytes);
  }
  if (set->copies_done != nullptr) cudaEventDestroy(set->copies_done);
  if (set->memory != nullptr) cudaFree(set->memory);
  cudaGetLastError();
  delete set;
}

size_t staging_bytes(const DeviceExpertSet& set) {
  return 2 * size_t{set.num_slots} * sizeof(DeviceQuantMatrix) +
         size_t{set.num_experts} * sizeof(int32_t);
}

}  // namespace

qmoe_status create_device_expert_set(const char* function, const CudaExpertUpload& upload,
                                     DeviceExpertSet** out) {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    return status_from_cuda(e, function, "cudaGetDeviceCount");
  }
  if (upload.device >= count) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "device %d: %d visible", upload.device,
                count);
  }
  DeviceScope scope(upload.device);
  if (scope.status() != cudaSuccess) {
    return status_from_cuda(static_cast<cudaError_t>(scope.status()), function, "cudaSetDevice");
  }
  auto* set = new (std::nothrow) DeviceExpertSet{};
  if (set == nullptr) return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the set failed");
  set->device = upload.device;
  set->num_experts = upload.num_experts;
  set->hidden = upload.hidden;
  set->intermediate = upload.intermediate;
  set->num_slots = upload.num_slots;
  set->interleaved = upload.interleaved;
  set->alpha = upload.alpha;
  set->beta = upload.beta;
  set->limit = upload.limit;
  set->format = upload.fc1[0].format;  // one per set (lib/cuda_api.cc checks)
  set->lean_walk = has_lean_decode(set->format);
  for (uint32_t e = 0; e < upload.num_experts; ++e) {
    set->lean_walk =
        set->lean_walk && int4_lean_layout(upload.fc1[e]) && int4_lean_layout(upload.fc2[e]);
  }
  try {
    set->slot_expert.assign(set->num_slots, -1);
    set->map.assign(set->num_experts, -1);
    set->fc1_host.assign(set->num_slots, DeviceQuantMatrix{});
    set->fc2_host.assign(set->num_slots, DeviceQuantMatrix{});
  } catch (const std::bad_alloc&) {
    delete set;
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the host mirrors failed");
  }
  // Every slot has room for any expert of the set, so any of them can be placed later.
  for (uint32_t e = 0; e < upload.num_experts; ++e) {
    widen_room(upload.fc1[e], &set->fc1_room);
    widen_room(upload.fc2[e], &set->fc2_room);
  }
  size_t at = 0;
  place_room(&set->fc1_room, &at);
  place_room(&set->fc2_room, &at);
  set->slot_bytes = at;
  const size_t desc_bytes = size_t{set->num_slots} * sizeof(DeviceQuantMatrix);
  const size_t fc1_off = size_t{set->num_slots} * set->slot_bytes;
  const size_t fc2_off = fc1_off + align_up(desc_bytes);
  const size_t map_off = fc2_off + align_up(desc_bytes);
  const size_t total = map_off + align_up(size_t{upload.num_experts} * sizeof(int32_t));
  cudaError_t e = cudaMalloc(&set->memory, total);
  const char* step = "cudaMalloc of the experts";
  for (DeviceExpertSet::StagingImage& image : set->staging) {
    if (e == cudaSuccess) {
      step = "cudaHostAlloc of a staging image";
      e = cudaHostAlloc(reinterpret_cast<void**>(&image.bytes), staging_bytes(*set),
                        cudaHostAllocDefault);
    }
    if (e == cudaSuccess) {
      step = "cudaEventCreateWithFlags";
      e = cudaEventCreateWithFlags(&image.read, cudaEventDisableTiming);
    }
  }
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&set->copies_done, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    cudaGetLastError();
    free_set(set);
    return status_from_cuda(e, function, step);
  }
  auto* base = static_cast<unsigned char*>(set->memory);
  set->fc1 = reinterpret_cast<DeviceQuantMatrix*>(base + fc1_off);
  set->fc2 = reinterpret_cast<DeviceQuantMatrix*>(base + fc2_off);
  set->residency = reinterpret_cast<int32_t*>(base + map_off);
  // The free slots' descriptions are zero (never read: no map entry names them).
  cudaStream_t stream = nullptr;
  e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    cudaGetLastError();
    free_set(set);
    return status_from_cuda(e, function, "cudaStreamCreateWithFlags");
  }
  uint32_t copied = 0;
  qmoe_status status = update_device_expert_set(function, set, upload, stream, &copied);
  e = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  if (status == QMOE_STATUS_OK && e != cudaSuccess) {
    cudaGetLastError();
    status = status_from_cuda(e, function, "copying the experts");
  }
  if (status != QMOE_STATUS_OK) {
    free_set(set);
    return status;
  }
  *out = set;
  return QMOE_STATUS_OK;
}

namespace {

// An update's plan: the slots (lib/cuda_slot_plan.h), the joiners' copies and the slot
// descriptions after it.
struct UpdatePlan {
  SlotPlan slots;
  std::vector<Copy> copies;
  std::vector<DeviceQuantMatrix> fc1_host, fc2_host;
};

qmoe_status plan_update(const char* function, const DeviceExpertSet* set,
                        const CudaExpertUpload& upload, UpdatePlan* plan) {
  const uint32_t count = upload.resident != nullptr ? upload.num_resident : upload.num_experts;
  std::vector<uint32_t> every_expert;  // the list of a set created without one: 0, 1, ...
  const uint32_t* ids = upload.resident;
  if (ids == nullptr) {
    try {
      every_expert.resize(count);
    } catch (const std::bad_alloc&) {
      return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the expert list failed");
    }
    for (uint32_t i = 0; i < count; ++i) every_expert[i] = i;
    ids = every_expert.data();
  }
  // Every new expert's buffers must fit a slot (checked before anything changes).
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t e = ids[i];
    if (set->map[e] < 0 &&
        (!fits(upload.fc1[e], set->fc1_room) || !fits(upload.fc2[e], set->fc2_room))) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "expert %u's buffers are larger than the slots the set was created with", e);
    }
  }
  try {
    plan->slots = plan_slots(set->map, set->num_slots, ids, count);
    plan->copies.reserve(plan->slots.copy_expert.size() * 8);
    plan->fc1_host = set->fc1_host;
    plan->fc2_host = set->fc2_host;
  } catch (const std::bad_alloc&) {
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the new map failed");
  }
  auto* base = static_cast<unsigned char*>(set->memory);
  for (size_t i = 0; i < plan->slots.copy_expert.size(); ++i) {
    const uint32_t e = plan->slots.copy_expert[i], slot = plan->slots.copy_slot[i];
    unsigned char* slot_base = base + size_t{slot} * set->slot_bytes;
    plan->fc1_host[slot] = place_projection(upload.fc1[e], set->fc1_room, slot_base, &plan->copies);
    plan->fc2_host[slot] = place_projection(upload.fc2[e], set->fc2_room, slot_base, &plan->copies);
  }
  return QMOE_STATUS_OK;
}

// Enqueues on `stream` the copy of `map` (and, with the descriptions, of both description arrays
// first: a forward that reads the new map reads the new slots) from the next staging image, after
// that image's last copies have run; records the image's `read` event after them and, when
// `read` is not NULL, returns it there (also the point on `stream` after the new map: the begun
// update's lease).
cudaError_t stage_map(DeviceExpertSet* set, const std::vector<int32_t>& map,
                      const std::vector<DeviceQuantMatrix>* fc1_host,
                      const std::vector<DeviceQuantMatrix>* fc2_host, cudaStream_t stream,
                      cudaEvent_t* read, const char** step) {
  DeviceExpertSet::StagingImage& image = set->staging[set->next_staging];
  set->next_staging = (set->next_staging + 1) % DeviceExpertSet::kStagingImages;
  if (read != nullptr) *read = image.read;
  *step = "waiting for a staging image's last copies";
  cudaError_t err = cudaEventSynchronize(image.read);
  const size_t desc_bytes = size_t{set->num_slots} * sizeof(DeviceQuantMatrix);
  unsigned char* stage = image.bytes;
  if (err == cudaSuccess && fc1_host != nullptr) {
    std::memcpy(stage, fc1_host->data(), desc_bytes);
    std::memcpy(stage + desc_bytes, fc2_host->data(), desc_bytes);
    *step = "copying the slot descriptions";
    err = cudaMemcpyAsync(set->fc1, stage, desc_bytes, cudaMemcpyHostToDevice, stream);
    if (err == cudaSuccess) {
      err =
          cudaMemcpyAsync(set->fc2, stage + desc_bytes, desc_bytes, cudaMemcpyHostToDevice, stream);
    }
  }
  if (err == cudaSuccess) {
    std::memcpy(stage + 2 * desc_bytes, map.data(), map.size() * sizeof(int32_t));
    *step = "copying the residency map";
    err = cudaMemcpyAsync(set->residency, stage + 2 * desc_bytes, map.size() * sizeof(int32_t),
                          cudaMemcpyHostToDevice, stream);
  }
  if (err == cudaSuccess) err = cudaEventRecord(image.read, stream);
  return err;
}

// After a failed enqueue: what was enqueued may have run in part (a leaving expert's slot may
// hold part of its successor), so the device's residency is unknown. The mirrors forget every
// slot, and the next successful update copies every resident expert and rewrites the whole map.
qmoe_status forget_residency(DeviceExpertSet* set, cudaError_t err, const char* function,
                             const char* step) {
  cudaGetLastError();
  std::fill(set->map.begin(), set->map.end(), -1);
  std::fill(set->slot_expert.begin(), set->slot_expert.end(), -1);
  set->pending = DeviceExpertSet::PendingUpdate{};
  return status_from_cuda(err, function, step);
}

qmoe_status refuse_while_pending(const DeviceExpertSet* set, const char* function) {
  if (!set->pending.active) return QMOE_STATUS_OK;
  return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
              "an update begun with qmoe_cuda_expert_set_begin_residency_update is not finished "
              "(qmoe_cuda_expert_set_finish_residency_update)");
}

}  // namespace

qmoe_status update_device_expert_set(const char* function, DeviceExpertSet* set,
                                     const CudaExpertUpload& upload, cudaStream_t stream,
                                     uint32_t* copied) {
  DeviceScope scope(set->device);
  if (scope.status() != cudaSuccess) {
    return status_from_cuda(static_cast<cudaError_t>(scope.status()), function, "cudaSetDevice");
  }
  if (qmoe_status s = refuse_while_pending(set, function); s != QMOE_STATUS_OK) return s;
  UpdatePlan plan;
  if (qmoe_status s = plan_update(function, set, upload, &plan); s != QMOE_STATUS_OK) return s;
  const char* step = "copying the experts";
  cudaError_t err = copy_all(plan.copies, upload.batched, stream);
  if (err == cudaSuccess) {
    err = stage_map(set, plan.slots.map, &plan.fc1_host, &plan.fc2_host, stream, nullptr, &step);
  }
  if (err != cudaSuccess) return forget_residency(set, err, function, step);
  set->map.swap(plan.slots.map);
  set->slot_expert.swap(plan.slots.slot_expert);
  set->fc1_host.swap(plan.fc1_host);
  set->fc2_host.swap(plan.fc2_host);
  *copied = static_cast<uint32_t>(plan.slots.copy_expert.size());
  return QMOE_STATUS_OK;
}

qmoe_status begin_device_expert_set_update(const char* function, DeviceExpertSet* set,
                                           const CudaExpertUpload& upload, cudaStream_t stream,
                                           cudaStream_t copy_stream, uint32_t* copied) {
  DeviceScope scope(set->device);
  if (scope.status() != cudaSuccess) {
    return status_from_cuda(static_cast<cudaError_t>(scope.status()), function, "cudaSetDevice");
  }
  if (qmoe_status s = refuse_while_pending(set, function); s != QMOE_STATUS_OK) return s;
  UpdatePlan plan;
  std::vector<int32_t> unmapped;
  if (qmoe_status s = plan_update(function, set, upload, &plan); s != QMOE_STATUS_OK) return s;
  try {
    unmapped = plan.slots.map;
  } catch (const std::bad_alloc&) {
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the map failed");
  }
  // The map until the copies are done: the stayers only. A joiner's slot is either free or a
  // leaver's, and no entry of this map names it, so forwards after it read neither.
  for (const uint32_t e : plan.slots.copy_expert) unmapped[e] = -1;
  const char* step = nullptr;
  cudaEvent_t map_staged = nullptr;
  cudaError_t err = stage_map(set, unmapped, nullptr, nullptr, stream, &map_staged, &step);
  // The lease on the joiners' slots: map_staged was recorded on `stream` after the forwards
  // enqueued before this call (which may still read a leaver in such a slot) and after the map
  // that no longer names it, so the copies that overwrite the slots wait for it.
  if (err == cudaSuccess) {
    step = "making the copy stream wait for the stream";
    err = cudaStreamWaitEvent(copy_stream, map_staged, 0);
  }
  if (err == cudaSuccess) {
    step = "copying the experts";
    err = copy_all(plan.copies, upload.batched, copy_stream);
  }
  if (err == cudaSuccess) {
    step = "recording the copies' event";
    err = cudaEventRecord(set->copies_done, copy_stream);
  }
  if (err != cudaSuccess) return forget_residency(set, err, function, step);
  set->pending.active = true;
  set->pending.map.swap(plan.slots.map);
  set->pending.slot_expert.swap(plan.slots.slot_expert);
  set->pending.fc1_host.swap(plan.fc1_host);
  set->pending.fc2_host.swap(plan.fc2_host);
  set->map.swap(unmapped);
  *copied = static_cast<uint32_t>(plan.slots.copy_expert.size());
  return QMOE_STATUS_OK;
}

qmoe_status finish_device_expert_set_update(const char* function, DeviceExpertSet* set,
                                            cudaStream_t stream, bool wait, bool* finished) {
  DeviceScope scope(set->device);
  if (scope.status() != cudaSuccess) {
    return status_from_cuda(static_cast<cudaError_t>(scope.status()), function, "cudaSetDevice");
  }
  *finished = true;
  if (!set->pending.active) return QMOE_STATUS_OK;
  const char* step = "querying the copies' event";
  cudaError_t err = cudaSuccess;
  if (wait) {
    step = "making the stream wait for the copies";
    err = cudaStreamWaitEvent(stream, set->copies_done, 0);
  } else {
    err = cudaEventQuery(set->copies_done);
    if (err == cudaErrorNotReady) {
      cudaGetLastError();
      *finished = false;
      return QMOE_STATUS_OK;
    }
  }
  // The joiners' descriptions, then the map that names them.
  if (err == cudaSuccess) {
    err = stage_map(set, set->pending.map, &set->pending.fc1_host, &set->pending.fc2_host, stream,
                    nullptr, &step);
  }
  if (err != cudaSuccess) {
    *finished = false;
    return forget_residency(set, err, function, step);
  }
  set->map.swap(set->pending.map);
  set->slot_expert.swap(set->pending.slot_expert);
  set->fc1_host.swap(set->pending.fc1_host);
  set->fc2_host.swap(set->pending.fc2_host);
  set->pending.active = false;
  return QMOE_STATUS_OK;
}

void destroy_device_expert_set(DeviceExpertSet* set) {
  DeviceScope scope(set->device);
  // Kernels of any stream may still read the weights: the device's work ends first.
  cudaDeviceSynchronize();
  free_set(set);
}

}  // namespace qmoe::cuda
