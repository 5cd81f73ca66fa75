// Resident experts on one device: their canonical buffers copied as they are, the device
// descriptions the kernels read, and the residency map (qmoe_cuda_expert_set_create).
//
// One device allocation holds, each piece 256-byte aligned: for every slot, the spans its FC1 and
// FC2 read on the host (codes, scale plane, zero-point plane, bias; lib/formats/quant_matrix.h's
// matrix_spans), byte for byte, so the device descriptions keep the host's strides; then the
// slots' FC1 and FC2 DeviceQuantMatrix arrays; then the residency map, E int32 (expert -> slot,
// -1 when not resident).
#ifndef QMOE_LIB_CUDA_DEVICE_EXPERT_SET_CUH_
#define QMOE_LIB_CUDA_DEVICE_EXPERT_SET_CUH_

#include <cstdint>

#include "lib/cuda/device_quant_matrix.cuh"
#include "lib/cuda_backend.h"
#include "qmoe/qmoe.h"

namespace qmoe::cuda {

struct DeviceExpertSet {
  int device;
  uint32_t num_experts, hidden, intermediate, num_slots;
  bool interleaved;
  float alpha, beta, limit;
  void* memory;            // the one allocation
  DeviceQuantMatrix* fc1;  // device, [num_slots]
  DeviceQuantMatrix* fc2;
  int32_t* residency;  // device, [num_experts]
};

/// Upload as lib/cuda_backend.h's create_expert_set describes; *set is new'd.
qmoe_status create_device_expert_set(const char* function, const CudaExpertUpload& upload,
                                     DeviceExpertSet** set);

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
