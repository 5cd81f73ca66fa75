// The GPU half behind lib/cuda_api.cc: one table of entry points that lib/cuda/ fills in a build
// with CUDA (lib/cuda/cuda_backend.cu) and that a build without CUDA does not have
// (lib/no_cuda_backend.cc returns nullptr). The ABI functions check their host-side arguments
// themselves, so those checks run, and are tested, on machines with no GPU and in builds with
// no CUDA; only then do they ask for the backend, and report QMOE_STATUS_CUDA_UNAVAILABLE when
// there is none. A new CUDA call is one entry here, its checks in cuda_api.cc and its work in
// lib/cuda/, with no stub to keep in step.
//
// No CUDA header here: lib/cuda_api.cc is compiled by the host compiler in every build.
#ifndef QMOE_LIB_CUDA_BACKEND_H_
#define QMOE_LIB_CUDA_BACKEND_H_

#include "qmoe/qmoe.h"

namespace qmoe {

struct CudaBackend {
  /// Number of visible devices; failure statuses name `function` (lib/cuda/cuda_status.h maps
  /// CUDA errors).
  qmoe_status (*get_device_count)(const char* function, int* device_count);
};

/// The backend of a build with CUDA, or nullptr in a build without it.
const CudaBackend* cuda_backend();

}  // namespace qmoe

#endif  // QMOE_LIB_CUDA_BACKEND_H_
