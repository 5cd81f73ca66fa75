// The hybrid decode's stand-in for what a model runs between two MoE layers: each row of the
// hidden state rescaled to unit RMS on the GPU (so 48 layers of synthetic weights neither
// overflow nor vanish). The tool's own kernel, not the library's.
#ifndef QMOE_TOOLS_QMOE_GPU_RMS_NORM_H_
#define QMOE_TOOLS_QMOE_GPU_RMS_NORM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

// Rescales rows [0, rows) of x (rows of `hidden` floats, `ld` apart, device memory) to unit RMS
// on `stream` (capturable); *rows is read on the device, at most max_rows. A row of zeros or
// non-finite values is left as it is.
cudaError_t launch_rms_normalize(float* x, const uint32_t* rows, uint32_t max_rows, uint32_t hidden,
                                 size_t ld, cudaStream_t stream);

#endif  // QMOE_TOOLS_QMOE_GPU_RMS_NORM_H_
