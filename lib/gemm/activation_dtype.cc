#include "lib/gemm/activation_dtype.h"

#include <cstdint>
#include <cstring>

namespace qmoe {

bool is_activation_dtype(qmoe_dtype dtype) {
  return dtype == QMOE_DTYPE_F32 || dtype == QMOE_DTYPE_F16 || dtype == QMOE_DTYPE_BF16;
}

void widen_activations(const KernelTable& kernels, qmoe_dtype dtype, const void* src, float* dst,
                       size_t n) {
  if (dtype == QMOE_DTYPE_F32) {
    std::memcpy(dst, src, n * sizeof(float));
  } else if (dtype == QMOE_DTYPE_F16) {
    kernels.convert_f16_to_f32.fn(static_cast<const uint16_t*>(src), dst, n);
  } else {
    kernels.convert_bf16_to_f32.fn(static_cast<const uint16_t*>(src), dst, n);
  }
}

void narrow_activations(const KernelTable& kernels, qmoe_dtype dtype, const float* src, void* dst,
                        size_t n) {
  if (dtype == QMOE_DTYPE_F32) {
    std::memcpy(dst, src, n * sizeof(float));
  } else if (dtype == QMOE_DTYPE_F16) {
    kernels.convert_f32_to_f16.fn(src, static_cast<uint16_t*>(dst), n);
  } else {
    kernels.convert_f32_to_bf16.fn(src, static_cast<uint16_t*>(dst), n);
  }
}

}  // namespace qmoe
