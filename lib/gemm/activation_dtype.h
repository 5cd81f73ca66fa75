// Activations (X, Y) in FP32, FP16 or BF16: the element types qmoe_gemm_typed and
// qmoe_moe_forward accept, and their exact widening to / rounding from FP32 through the
// context's conversion kernels (so the bits are those of the qmoe_convert_* calls).
#ifndef QMOE_LIB_GEMM_ACTIVATION_DTYPE_H_
#define QMOE_LIB_GEMM_ACTIVATION_DTYPE_H_

#include <cstddef>

#include "lib/cpu/kernel_table.h"
#include "lib/formats/quant_matrix.h"
#include "qmoe/qmoe.h"

namespace qmoe {

/// F32, F16 or BF16.
bool is_activation_dtype(qmoe_dtype dtype);

/// n elements of `dtype` at src -> FP32 (exact: every FP16 and BF16 value is an FP32 value).
void widen_activations(const KernelTable& kernels, qmoe_dtype dtype, const void* src, float* dst,
                       size_t n);

/// n FP32 values -> elements of `dtype` at dst, rounded to nearest even.
void narrow_activations(const KernelTable& kernels, qmoe_dtype dtype, const float* src, void* dst,
                        size_t n);

/// Address of element `index` of an array of `dtype` elements.
inline const void* activation_at(const void* base, qmoe_dtype dtype, size_t index) {
  return static_cast<const unsigned char*>(base) + index * dtype_size(dtype);
}
inline void* activation_at(void* base, qmoe_dtype dtype, size_t index) {
  return static_cast<unsigned char*>(base) + index * dtype_size(dtype);
}

}  // namespace qmoe

#endif  // QMOE_LIB_GEMM_ACTIVATION_DTYPE_H_
