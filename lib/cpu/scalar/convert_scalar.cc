// Portable row conversions between FP32 and FP16/BF16: the reference every SIMD tier must match
// bit for bit (docs/formats.md, "Floating-point row conversions").
//
// Invariant: integer bit manipulation only. No float arithmetic, no float compare, so neither
// MXCSR (DAZ, FTZ, rounding mode) nor the compiler's float model can change a result, and the
// NaN payload rule holds exactly. Every element is read and written with memcpy (a pure bit
// copy), floats and 16-bit halves alike: rows may start at any address (the ABI promises any
// alignment), and a dereference of a misaligned uint16_t* would be undefined.
#include <cstring>

#include "lib/cpu/kernels.h"

namespace qmoe::scalar {
namespace {

// The bits of one element (a float as uint32_t, a half as uint16_t), and back: memcpy, so any
// address works.
template <typename Bits, typename Element>
Bits load_bits(const Element* p) {
  static_assert(sizeof(Bits) == sizeof(Element), "a bit copy of one element");
  Bits bits;
  std::memcpy(&bits, p, sizeof(bits));
  return bits;
}

template <typename Element, typename Bits>
void store_bits(Element* p, Bits bits) {
  static_assert(sizeof(Bits) == sizeof(Element), "a bit copy of one element");
  std::memcpy(p, &bits, sizeof(bits));
}

uint32_t f16_to_f32_bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;  // exponent and mantissa
  if (em >= 0x7C00u) {
    // Inf keeps its bits; NaN: quiet bit forced, 10-bit payload at the top of the mantissa.
    return em == 0x7C00u ? (sign | 0x7F800000u) : (sign | 0x7FC00000u | (em & 0x3FFu) << 13);
  }
  if (em >= 0x0400u) {
    // Normal: rebias the exponent by 127 - 15 = 112.
    return sign | ((em << 13) + (112u << 23));
  }
  if (em == 0) return sign;
  // Subnormal m * 2^-24 (m in 1..1023): normalise so the leading one lands on bit 10.
  uint32_t m = em;
  uint32_t e = 113;  // biased FP32 exponent of 2^-14, the FP16 minimum normal
  do {
    m <<= 1;
    --e;
  } while ((m & 0x400u) == 0);
  return sign | (e << 23) | ((m & 0x3FFu) << 13);
}

// Results that are not FP16 normals: NaN, overflow/Inf, subnormal, zero.
uint16_t f32_bits_to_f16_rare(uint32_t x) {
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {
    // NaN: quiet, sign kept, the top 9 payload bits below the FP32 quiet bit kept (as F16C).
    return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x1FFu));
  }
  if (a >= 0x477FF000u) {
    // |x| >= 65520, halfway between 65504 (max finite) and 2^16: the tie goes to the even
    // neighbour 2^16, which overflows. Also takes +-Inf.
    return static_cast<uint16_t>(sign | 0x7C00u);
  }
  const uint32_t e = a >> 23;
  if (e < 102) {
    // |x| < 2^-25: below half the smallest subnormal, rounds to zero.
    return static_cast<uint16_t>(sign);
  }
  // Subnormal result (|x| < 2^-14): value / 2^-24 = m * 2^(e - 126) with the implicit bit
  // restored, shift in 14..24. Round to nearest even; rounding up from 0x3FF gives 0x400, the
  // smallest normal, which is the right encoding.
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126 - e;
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  const uint32_t up = (rem > half || (rem == half && (q & 1u) != 0)) ? 1u : 0u;
  return static_cast<uint16_t>(sign | (q + up));
}

uint16_t f32_bits_to_f16(uint32_t x) {
  const uint32_t a = x & 0x7FFFFFFFu;
  // FP16 normal result: 2^-14 <= |x| < 65520 (one unsigned range test). Rebias the exponent by
  // 127 - 15 = 112, then round the low 13 bits to nearest even; a mantissa carry ripples into
  // the exponent, which is exactly the next FP16 value (0x7BFF is never exceeded below 65520).
  if (a - 0x38800000u < 0x477FF000u - 0x38800000u) {
    const uint32_t r = a - (112u << 23);
    return static_cast<uint16_t>(((x >> 16) & 0x8000u) | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
  }
  return f32_bits_to_f16_rare(x);
}

uint32_t bf16_to_f32_bits(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) x |= 0x00400000u;  // NaN: force the quiet bit
  return x;
}

uint16_t f32_bits_to_bf16(uint32_t x) {
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
    // NaN: quiet, sign and the top 6 payload bits kept.
    return static_cast<uint16_t>((x >> 16) | 0x0040u);
  }
  // Round to nearest even on the low 16 bits; finite values near the top round to Inf.
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace

void convert_f16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) store_bits(dst + i, f16_to_f32_bits(load_bits<uint16_t>(src + i)));
}

void convert_f32_to_f16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) store_bits(dst + i, f32_bits_to_f16(load_bits<uint32_t>(src + i)));
}

void convert_bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i)
    store_bits(dst + i, bf16_to_f32_bits(load_bits<uint16_t>(src + i)));
}

void convert_f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i)
    store_bits(dst + i, f32_bits_to_bf16(load_bits<uint32_t>(src + i)));
}

}  // namespace qmoe::scalar
