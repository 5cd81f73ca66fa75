// Resident experts on one device: a pool of slots holding experts' canonical buffers copied as
// they are, the device descriptions the kernels read, and the residency map
// (qmoe_cuda_expert_set_create, qmoe_cuda_expert_set_update_residency).
//
// One device allocation holds, each piece 256-byte aligned: num_slots slots of slot_bytes each
// (a slot: the spans FC1 and FC2 read on the host, i.e. codes, scale plane, zero-point plane and
// bias of lib/formats/quant_matrix.h's matrix_spans, byte for byte, so the device descriptions
// keep the host's strides; every span's room is the largest of that span over the host set's
// experts, so any expert fits any slot); then the slots' FC1 and FC2 DeviceQuantMatrix arrays;
// then the residency map, E int32 (expert -> slot, -1 when not resident).
//
// Who writes what. The host owns the mirrors below (slot_expert, map, the descriptions) and is
// the only writer of the device copies, by stream-ordered copies from pinned staging images:
// first an expert's buffers into its slot, then the descriptions, then the map. The kernels only
// read them. A slot is rewritten only when the map no longer names it, and the copies are
// ordered after the forwards enqueued before them on the same stream. A begun update splits
// that order over two streams: the map without the joiners (stream), an event, the joiners'
// copies waiting on it (copy stream), an event, and, at finish, the descriptions and the map
// with the joiners (stream; after the copies' event, queried or waited on).
#ifndef QMOE_LIB_CUDA_DEVICE_EXPERT_SET_CUH_
#define QMOE_LIB_CUDA_DEVICE_EXPERT_SET_CUH_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "lib/cuda/device_quant_matrix.cuh"
#include "lib/cuda_backend.h"
#include "qmoe/qmoe.h"

namespace qmoe::cuda {

// Offsets in a slot of one projection's four spans (codes, scales, zero points, bias) and the
// room each has (0 where no expert of the set has the span).
struct ProjectionRoom {
  size_t offset[4];
  size_t bytes[4];
};

struct DeviceExpertSet {
  int device;
  uint32_t num_experts, hidden, intermediate, num_slots;
  bool interleaved;
  float alpha, beta, limit;
  // Every expert's FC1 and FC2 format: the MoE kernels' compiled variant.
  qmoe_weight_format format;
  // INT4 or INT3 whose every expert's FC1 and FC2 has the lean layout: the MoE kernels' lean
  // variant (MoeLayerParams::lean_walk). A slot only ever holds an expert of the set, so it
  // holds.
  bool lean_walk;
  void* memory;            // the one allocation
  DeviceQuantMatrix* fc1;  // device, [num_slots]
  DeviceQuantMatrix* fc2;
  int32_t* residency;  // device, [num_experts]
  // Host side.
  ProjectionRoom fc1_room, fc2_room;
  size_t slot_bytes;
  std::vector<int32_t> slot_expert;         // slot -> expert, -1 when free
  std::vector<int32_t> map;                 // expert -> slot, -1: the device map's mirror
  std::vector<DeviceQuantMatrix> fc1_host;  // the device descriptions' mirrors
  std::vector<DeviceQuantMatrix> fc2_host;
  // Pinned images the device copies of the descriptions and the map are staged in, each
  // [fc1 descriptions][fc2 descriptions][map], used in turn. An image is rewritten only after
  // its `read` event (recorded after the copies out of it) has completed, a host wait. Two
  // images, because a step's finish and the next update's begin stage one map each, back to
  // back: with one image the begin would wait on the host for the finish's copies, which queue
  // behind the forwards and the joiners' copies already on the stream; with two it waits only
  // for the copies of two stagings ago.
  static constexpr int kStagingImages = 2;
  struct StagingImage {
    unsigned char* bytes = nullptr;
    cudaEvent_t read = nullptr;
  } staging[kStagingImages];
  int next_staging;  // the image the next staging writes
  // An update begun on a copy stream (begin_device_expert_set_update) and not yet finished:
  // the device map names the stayers only (the host `map` mirrors it), the joiners' buffers are
  // being copied into their slots, and these are the mirrors that finishing installs.
  struct PendingUpdate {
    bool active = false;
    std::vector<int32_t> map, slot_expert;
    std::vector<DeviceQuantMatrix> fc1_host, fc2_host;
  } pending;
  cudaEvent_t copies_done;  // recorded on the copy stream after a begun update's copies
};

/// Upload as lib/cuda_backend.h's create_expert_set describes; *set is new'd.
qmoe_status create_device_expert_set(const char* function, const CudaExpertUpload& upload,
                                     DeviceExpertSet** set);

/// Make upload.resident[0, num_resident) the resident experts, as lib/cuda_backend.h's
/// update_residency describes, enqueued on `stream`; *copied = the experts copied.
/// INVALID_ARGUMENT while a begun update is not finished.
qmoe_status update_device_expert_set(const char* function, DeviceExpertSet* set,
                                     const CudaExpertUpload& upload, cudaStream_t stream,
                                     uint32_t* copied);

/// The same update without holding `stream` up for the copies: on `stream` the map drops the
/// leavers and the joiners at once; the joiners' copies run on `copy_stream` after `stream`'s
/// work so far (which may still read a leaver's slot); finish maps them. *copied = the joiners.
/// INVALID_ARGUMENT while a begun update is not finished.
qmoe_status begin_device_expert_set_update(const char* function, DeviceExpertSet* set,
                                           const CudaExpertUpload& upload, cudaStream_t stream,
                                           cudaStream_t copy_stream, uint32_t* copied);

/// Map the joiners of the begun update on `stream` once their copies are done: at once, when
/// they are (or `wait`: `stream` waits for them, the host does not); else *finished = false and
/// nothing is enqueued. *finished = true when no update is pending.
qmoe_status finish_device_expert_set_update(const char* function, DeviceExpertSet* set,
                                            cudaStream_t stream, bool wait, bool* finished);

/// Wait for the device, free the allocation and the object.
void destroy_device_expert_set(DeviceExpertSet* set);

/// cudaSetDevice for a scope, the previous device restored at its end.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  /// The cudaSetDevice result (cudaSuccess when the scope is on `device`).
  int status() const { return status_; }

 private:
  int previous_ = -1;
  int status_ = 0;
};

/// INVALID_ARGUMENT (naming `what`) unless p is device (or managed) memory usable on `device`.
qmoe_status check_device_pointer(const char* function, const char* what, const void* p, int device);

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_DEVICE_EXPERT_SET_CUH_
