// Helpers of the emulated decode-kernel tests (int4_gemv_emulation_test.cc,
// moe_layer_emulation_test.cc): host-side activation dtypes, the kernels' matrix description of
// a host-resident test matrix, and a fixture that resets the emulated device.
#ifndef QMOE_TESTS_CUDA_DECODE_EMULATION_UTIL_H_
#define QMOE_TESTS_CUDA_DECODE_EMULATION_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "tests/cpu/isa_test_util.h"
#include "tests/cuda/cuda_host_emulator.h"
#include "tests/cuda/output_rounding.h"
#include "tests/gemm/fp4_reference.h"
#include "tests/gemm/int4_reference.h"

namespace qmoe::testing {

constexpr unsigned char kPoison = 0x7F;

inline size_t dsize(qmoe_dtype d) {
  return d == QMOE_DTYPE_F32 ? 4 : 2;
}

inline std::vector<unsigned char> to_bytes(qmoe_dtype d, const std::vector<float>& v) {
  std::vector<unsigned char> out(v.size() * dsize(d));
  for (size_t i = 0; i < v.size(); ++i) {
    if (d == QMOE_DTYPE_F32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const unsigned short bits = d == QMOE_DTYPE_F16
                                      ? __half_as_ushort(__float2half_rn(v[i]))
                                      : __bfloat16_as_ushort(__float2bfloat16_rn(v[i]));
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
  }
  return out;
}

inline float element(qmoe_dtype d, const unsigned char* p, size_t i) {
  if (d == QMOE_DTYPE_F32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  unsigned short bits;
  std::memcpy(&bits, p + 2 * i, 2);
  if (d == QMOE_DTYPE_F16) return __half2float(__ushort_as_half(bits));
  const uint32_t x = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

inline std::vector<float> round_trip(qmoe_dtype d, const std::vector<float>& v) {
  const std::vector<unsigned char> b = to_bytes(d, v);
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = element(d, b.data(), i);
  return out;
}

inline const char* label(qmoe_dtype d) {
  return d == QMOE_DTYPE_F32 ? "f32" : d == QMOE_DTYPE_F16 ? "f16" : "bf16";
}

// The fields every format's description (Desc: the emulated copy's DeviceQuantMatrix) takes from
// a host-resident matrix's qmoe_quant_matrix: sizes, code and scale planes as they are, bias.
template <class Desc, class Matrix>
Desc describe_planes(const Matrix& w) {
  const qmoe_quant_matrix& h = w.desc;
  Desc m{};
  m.n = h.n;
  m.k = h.k;
  m.block_size = h.block_size;
  m.chunks = (h.k + 31) / 32;
  m.codes = w.codes.data();
  m.format = h.format;
  m.scale_dtype = h.scale_dtype;
  m.scales = w.scales.data();
  m.scale_row_stride = h.scale_row_stride;
  m.scale_block_stride = h.scale_block_stride;
  m.scale_group_stride = h.scale_group_stride;
  m.bias_dtype = QMOE_DTYPE_F32;
  if (h.bias != nullptr) {
    m.bias_dtype = h.bias_dtype;
    m.bias = w.bias.data();
  }
  return m;
}

// The kernels' description of a host-resident Int4Matrix: its planes as they are, zero points
// included.
template <class Desc>
Desc describe_host(const Int4Matrix& w) {
  const qmoe_quant_matrix& h = w.desc;
  Desc m = describe_planes<Desc>(w);
  m.global_scale = 1.0f;
  if (h.zero_points != nullptr) {
    m.zero_points = w.zero_points.data();
    m.zero_point_row_stride = h.zero_point_row_stride;
    m.zero_point_block_stride = h.zero_point_block_stride;
    m.zero_point_group_stride = h.zero_point_group_stride;
  }
  return m;
}

// The same of a host-resident Fp4Matrix (MXFP4 or NVFP4): one-byte scales as they are, the
// global scale as the library passes it (0, "none", read as 1).
template <class Desc>
Desc describe_host(const Fp4Matrix& w) {
  Desc m = describe_planes<Desc>(w);
  m.global_scale = w.desc.global_scale == 0.0f ? 1.0f : w.desc.global_scale;
  return m;
}

class EmulatedDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = fresh_seed();
    rng_.seed(seed_);
    qmoe_emu::device() = qmoe_emu::Device{};
  }
  void TearDown() override {
    if (HasFailure()) std::printf("seed %llu\n", static_cast<unsigned long long>(seed_));
    qmoe_emu::device() = qmoe_emu::Device{};
  }
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_CUDA_DECODE_EMULATION_UTIL_H_
