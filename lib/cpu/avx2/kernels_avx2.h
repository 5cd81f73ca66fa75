// Prototypes of the avx2 kernels; only lib/cpu/avx2/ includes this header. Semantics of each
// signature are in lib/cpu/kernel_table.h and the public header.
#ifndef QMOE_LIB_CPU_AVX2_KERNELS_AVX2_H_
#define QMOE_LIB_CPU_AVX2_KERNELS_AVX2_H_

#include <cstddef>
#include <cstdint>

#include "lib/formats/int4_layout.h"

namespace qmoe::avx2 {

void convert_f16_to_f32(const uint16_t* src, float* dst, size_t n);
void convert_f32_to_f16(const float* src, uint16_t* dst, size_t n);
void convert_bf16_to_f32(const uint16_t* src, float* dst, size_t n);
void convert_f32_to_bf16(const float* src, uint16_t* dst, size_t n);
uint64_t read_bandwidth(const void* data, size_t bytes);
void quantize_activations_q8(const float* x, size_t k, int8_t* q, float* scale, float* sum_q);
void gemm_int4_exact(const Int4GroupArgs& args);
void gemm_int4_fast(const Int4GroupArgs& args);

}  // namespace qmoe::avx2

// AVX-VNNI extension (files *_avxvnni.cc, built with the avx2 flags + -mavxvnni).
namespace qmoe::avxvnni {

void gemm_int4_fast(const Int4GroupArgs& args);

}  // namespace qmoe::avxvnni

#endif  // QMOE_LIB_CPU_AVX2_KERNELS_AVX2_H_
