// The one-byte scale types of the E2M1 formats (qmoe_dtype E8M0 and F8_E4M3, docs/formats.md),
// as FP32 bit patterns for every byte: what the scalar kernels and the GEMM driver's group
// panels read, and what every SIMD decoder must equal (tests/formats/fp4_values_test.cc checks
// all 256 bytes of each on every tier).
//
// - E8M0 (OCP MX v1.0, 5.4.1): e is the value 2^(e - 127). e = 0 is 2^-127, an FP32 subnormal
//   (0x00400000); e = 0xFF is NaN (here the quiet NaN 0x7FC00000). No sign, no zero.
// - E4M3 (OCP FP8 v1.0, "E4M3"): sign bit 7, exponent bits 6-3 (bias 7), mantissa bits 2-0.
//   Exponent 0 is subnormal, m * 2^-9; otherwise (1 + m / 8) * 2^(e - 7), up to 448 (0x7E). No
//   infinities: S.1111.111 (0x7F, 0xFF) is NaN (here quiet, with the byte's sign).
//
// Constants only (tables computed at compile time by lambdas, which emit no code): included by
// translation units of every ISA's flags.
#ifndef QMOE_LIB_FORMATS_BYTE_SCALES_H_
#define QMOE_LIB_FORMATS_BYTE_SCALES_H_

#include <cstdint>

namespace qmoe {

/// FP32 bit patterns of the 256 bytes of one scale type.
struct ByteScaleBits {
  uint32_t bits[256];
};

inline constexpr uint8_t kE8M0NaN = 0xFF;

inline constexpr ByteScaleBits kE8M0Bits = [] {
  ByteScaleBits t{};
  for (uint32_t e = 0; e < 256; ++e) {
    t.bits[e] = e == 0 ? 0x00400000u : e == 0xFF ? 0x7FC00000u : e << 23;
  }
  return t;
}();

inline constexpr ByteScaleBits kE4M3Bits = [] {
  ByteScaleBits t{};
  for (uint32_t b = 0; b < 256; ++b) {
    const uint32_t sign = (b & 0x80u) << 24;
    uint32_t exponent = (b >> 3) & 0x0Fu;
    uint32_t mantissa = b & 0x07u;
    if (exponent == 0x0F && mantissa == 0x07) {
      t.bits[b] = sign | 0x7FC00000u;
      continue;
    }
    if (exponent == 0 && mantissa == 0) {
      t.bits[b] = sign;
      continue;
    }
    // FP32 exponent field = E4M3 exponent + (127 - 7); a subnormal's mantissa is normalised
    // first: m * 2^-9 = (1 + f / 8) * 2^(e' - 7) with the leading bit shifted out.
    int32_t unbiased = static_cast<int32_t>(exponent) - 7;
    if (exponent == 0) {
      unbiased = -6;
      while ((mantissa & 0x08u) == 0) {
        mantissa <<= 1;
        --unbiased;
      }
      mantissa &= 0x07u;
    }
    t.bits[b] = sign | static_cast<uint32_t>(unbiased + 127) << 23 | mantissa << 20;
  }
  return t;
}();

}  // namespace qmoe

#endif  // QMOE_LIB_FORMATS_BYTE_SCALES_H_
