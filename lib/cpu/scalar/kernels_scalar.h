// Prototypes of the scalar kernels; only lib/cpu/scalar/ includes this header. Semantics of each
// signature are in lib/cpu/kernel_table.h and the public header.
#ifndef QMOE_LIB_CPU_SCALAR_KERNELS_SCALAR_H_
#define QMOE_LIB_CPU_SCALAR_KERNELS_SCALAR_H_

#include <cstddef>
#include <cstdint>

#include "lib/formats/int4_layout.h"

namespace qmoe::scalar {

void convert_f16_to_f32(const uint16_t* src, float* dst, size_t n);
void convert_f32_to_f16(const float* src, uint16_t* dst, size_t n);
void convert_bf16_to_f32(const uint16_t* src, float* dst, size_t n);
void convert_f32_to_bf16(const float* src, uint16_t* dst, size_t n);
uint64_t read_bandwidth(const void* data, size_t bytes);
void quantize_activations_q8(const float* x, size_t k, int8_t* q, float* scale, float* sum_q);
void gemm_int4_exact(const Int4GroupArgs& args);
void gemm_int4_fast(const Int4GroupArgs& args);

}  // namespace qmoe::scalar

#endif  // QMOE_LIB_CPU_SCALAR_KERNELS_SCALAR_H_
