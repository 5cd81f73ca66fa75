// FP16 -> FP32 and BF16 -> FP32 on every tier, exhaustively (all 65,536 inputs each): the tier
// equals the scalar kernel bit for bit on every input, NaNs included; each NaN stays a quiet NaN
// with its sign; and every tier matches independent oracles: the exact value of each encoding
// (decoded with ldexp in FP64), the F16C instruction where the CPU has it, and libfp16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/cpu/isa_test_util.h"
#include "tests/cpu/oracles/convert_oracles.h"

namespace qmoe::testing {
namespace {

std::string hex(uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%0*X", digits, static_cast<unsigned>(v));
  return buf;
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

bool is_nan_f32(uint32_t x) {
  return (x & 0x7FFFFFFFu) > 0x7F800000u;
}
bool is_nan_f16(uint16_t h) {
  return (h & 0x7FFFu) > 0x7C00u;
}
bool is_nan_bf16(uint16_t b) {
  return (b & 0x7FFFu) > 0x7F80u;
}

std::vector<uint16_t> all_16bit_patterns() {
  std::vector<uint16_t> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = static_cast<uint16_t>(i);
  return v;
}

template <typename Fn>
std::vector<uint32_t> widen(Fn fn, const std::vector<uint16_t>& in) {
  std::vector<float> out(in.size());
  fn(in.data(), out.data(), in.size());
  std::vector<uint32_t> bits(out.size());
  std::memcpy(bits.data(), out.data(), out.size() * sizeof(float));
  return bits;
}

// Exact value of an FP16 encoding, built from its fields in FP64 (every FP16 value is an FP32
// normal or zero, so the final narrowing to float is exact). NaN: the documented payload rule.
uint32_t exact_f16_to_f32(uint16_t h) {
  const bool neg = (h & 0x8000u) != 0;
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  if (e == 0x1F) {
    if (m != 0) return (neg ? 0x80000000u : 0u) | 0x7FC00000u | (static_cast<uint32_t>(m) << 13);
    return neg ? 0xFF800000u : 0x7F800000u;
  }
  const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return bits_of(static_cast<float>(neg ? -mag : mag));
}

// Exact value of a BF16 encoding from its fields in FP64. NaN: the documented payload rule.
uint32_t exact_bf16_to_f32(uint16_t b) {
  const bool neg = (b & 0x8000u) != 0;
  const int e = (b >> 7) & 0xFF;
  const int m = b & 0x7F;
  if (e == 0xFF) {
    if (m != 0) return (static_cast<uint32_t>(b) << 16) | 0x00400000u;
    return neg ? 0xFF800000u : 0x7F800000u;
  }
  const double mag = e == 0 ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134);
  return bits_of(static_cast<float>(neg ? -mag : mag));
}

// Every input's output bits equal; on failure, the count and the first differing input.
void expect_same_bits(const char* isa, const char* what, const std::vector<uint16_t>& in,
                      const std::vector<uint32_t>& got, const std::vector<uint32_t>& want) {
  size_t count = 0;
  size_t first = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    if (got[i] != want[i] && count++ == 0) first = i;
  }
  EXPECT_EQ(count, 0u) << "[" << isa << "] " << what << ": " << count << " of " << in.size()
                       << " inputs differ; first input " << hex(in[first], 4) << " -> got "
                       << hex(got[first], 8) << ", want " << hex(want[first], 8);
}

// NaN in -> NaN out, quiet bit set, sign kept; non-NaN in -> non-NaN out.
template <typename IsNan16>
void expect_nan_rule(const char* isa, const std::vector<uint16_t>& in,
                     const std::vector<uint32_t>& got, IsNan16 is_nan16) {
  size_t count = 0;
  size_t first = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const bool nan_in = is_nan16(in[i]);
    const bool ok = nan_in ? (is_nan_f32(got[i]) && (got[i] & 0x00400000u) != 0 &&
                              (got[i] >> 31) == static_cast<uint32_t>(in[i] >> 15))
                           : !is_nan_f32(got[i]);
    if (!ok && count++ == 0) first = i;
  }
  EXPECT_EQ(count, 0u) << "[" << isa << "] " << count << " inputs break the NaN rule; first input "
                       << hex(in[first], 4) << " -> " << hex(got[first], 8);
}

class ConvertWidenTest : public IsaTest {
 protected:
  const char* isa() const { return isa_name(GetParam()); }
  static const KernelTable& scalar_table() { return scalar_kernels(); }
};

TEST_P(ConvertWidenTest, ConversionKernelsAreTheTiersOwn) {
  const std::string suffix = std::string("__") + isa();
  for (const char* name : {table().convert_f16_to_f32.name, table().convert_f32_to_f16.name,
                           table().convert_bf16_to_f32.name, table().convert_f32_to_bf16.name}) {
    ASSERT_NE(name, nullptr);
    const std::string s(name);
    EXPECT_TRUE(s.size() > suffix.size() &&
                s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0)
        << "tier " << isa() << " runs kernel " << s;
  }
}

TEST_P(ConvertWidenTest, F16ToF32AllInputsMatchScalar) {
  const std::vector<uint16_t> in = all_16bit_patterns();
  const std::vector<uint32_t> got = widen(table().convert_f16_to_f32.fn, in);
  const std::vector<uint32_t> want = widen(scalar_table().convert_f16_to_f32.fn, in);
  expect_same_bits(isa(), "vs scalar", in, got, want);
  expect_nan_rule(isa(), in, got, is_nan_f16);
}

TEST_P(ConvertWidenTest, F16ToF32AllInputsMatchExactValue) {
  const std::vector<uint16_t> in = all_16bit_patterns();
  const std::vector<uint32_t> got = widen(table().convert_f16_to_f32.fn, in);
  std::vector<uint32_t> want(in.size());
  for (size_t i = 0; i < in.size(); ++i) want[i] = exact_f16_to_f32(in[i]);
  expect_same_bits(isa(), "vs exact FP16 value (FP64 ldexp)", in, got, want);
}

TEST_P(ConvertWidenTest, F16ToF32AllInputsMatchF16c) {
  if (!oracle_f16c_available()) GTEST_SKIP() << "CPU lacks F16C (or the OS lacks YMM state)";
  const std::vector<uint16_t> in = all_16bit_patterns();
  const std::vector<uint32_t> got = widen(table().convert_f16_to_f32.fn, in);
  // vcvtph2ps defines NaNs exactly as our rule does, so every input is compared.
  const std::vector<uint32_t> want = widen(oracle_f16c_f16_to_f32, in);
  expect_same_bits(isa(), "vs F16C vcvtph2ps", in, got, want);
}

TEST_P(ConvertWidenTest, F16ToF32AllInputsMatchLibfp16) {
  const std::vector<uint16_t> in = all_16bit_patterns();
  const std::vector<uint32_t> got = widen(table().convert_f16_to_f32.fn, in);
  std::vector<uint32_t> want(in.size());
  oracle_libfp16_f16_to_f32(in.data(), want.data(), in.size());
  // fp16_ieee_to_fp32_bits shifts the payload like we do but leaves a signalling NaN
  // signalling; with the quiet bit forced it must equal our result on every input.
  for (size_t i = 0; i < in.size(); ++i) {
    if (is_nan_f16(in[i])) want[i] |= 0x00400000u;
  }
  expect_same_bits(isa(), "vs libfp16 fp16_ieee_to_fp32_bits (NaN quieted)", in, got, want);
}

TEST_P(ConvertWidenTest, Bf16ToF32AllInputsMatchScalar) {
  const std::vector<uint16_t> in = all_16bit_patterns();
  const std::vector<uint32_t> got = widen(table().convert_bf16_to_f32.fn, in);
  const std::vector<uint32_t> want = widen(scalar_table().convert_bf16_to_f32.fn, in);
  expect_same_bits(isa(), "vs scalar", in, got, want);
  expect_nan_rule(isa(), in, got, is_nan_bf16);
}

TEST_P(ConvertWidenTest, Bf16ToF32AllInputsMatchExactValue) {
  const std::vector<uint16_t> in = all_16bit_patterns();
  const std::vector<uint32_t> got = widen(table().convert_bf16_to_f32.fn, in);
  std::vector<uint32_t> want(in.size());
  for (size_t i = 0; i < in.size(); ++i) want[i] = exact_bf16_to_f32(in[i]);
  expect_same_bits(isa(), "vs exact BF16 value (FP64 ldexp)", in, got, want);
  // And the defining identity: a BF16 is the upper half of an FP32 (NaN: plus the quiet bit).
  for (size_t i = 0; i < in.size(); ++i) {
    want[i] = (static_cast<uint32_t>(in[i]) << 16) | (is_nan_bf16(in[i]) ? 0x00400000u : 0u);
  }
  expect_same_bits(isa(), "vs bits << 16", in, got, want);
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(ConvertWidenTest);

}  // namespace
}  // namespace qmoe::testing
