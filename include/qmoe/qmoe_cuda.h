/*
 * libqmoe's CUDA C ABI: the GPU half of expert offload. Every library build has these
 * functions; each checks its host-side arguments first, then, in a build without CUDA
 * (QMOE_CUDA=OFF, or no toolkit), returns QMOE_STATUS_CUDA_UNAVAILABLE with a message saying
 * so. C99-clean; needs no CUDA header.
 */
#ifndef QMOE_QMOE_CUDA_H_
#define QMOE_QMOE_CUDA_H_

#include "qmoe/qmoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/// Number of CUDA devices visible; QMOE_STATUS_CUDA_UNAVAILABLE in a build without CUDA or with
/// no usable driver, QMOE_STATUS_CUDA_ERROR (message names the CUDA error) when the runtime
/// cannot be queried. A NULL `device_count` is INVALID_ARGUMENT in every build (host-side
/// arguments are checked before CUDA is asked).
QMOE_API qmoe_status qmoe_cuda_get_device_count(int* device_count);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* QMOE_QMOE_CUDA_H_ */
