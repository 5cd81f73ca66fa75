// The values of the E2M1 formats, exhaustively: every E2M1 code and every E8M0 and E4M3 byte
// (NaN, zeros, subnormals included). The decoders of tests/gemm/fp4_reference.cc are written
// from the OCP specifications; they are checked here against values written out from the
// specifications' tables, then the library against them: its decode tables
// (lib/formats/byte_scales.h, lib/formats/e2m1_layout.h) entry by entry, and every tier's
// kernels at both levels through qmoe_gemm, one matrix per byte.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lib/formats/byte_scales.h"
#include "lib/formats/e2m1_layout.h"
#include "tests/cpu/isa_test_util.h"
#include "tests/gemm/fp4_reference.h"

namespace qmoe::testing {
namespace {

bool same_value(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

TEST(Fp4SpecDecoders, MatchTheSpecificationTables) {
  // OCP MX v1.0, table "FP4 E2M1": the eight magnitudes, then the same with the sign bit.
  const double e2m1[16] = {0.0,  0.5,  1.0,  1.5,  2.0,  3.0,  4.0,  6.0,
                           -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};
  for (int c = 0; c < 16; ++c) EXPECT_TRUE(same_value(e2m1_value(c), e2m1[c])) << c;
  // E8M0: bias 127, 0xFF NaN, no zero.
  EXPECT_EQ(e8m0_value(127), 1.0);
  EXPECT_EQ(e8m0_value(128), 2.0);
  EXPECT_EQ(e8m0_value(0), std::ldexp(1.0, -127));
  EXPECT_EQ(e8m0_value(254), std::ldexp(1.0, 127));
  EXPECT_TRUE(std::isnan(e8m0_value(255)));
  // E4M3 (OFP8 v1.0 table 1): max normal S.1111.110 = 448, min normal S.0001.000 = 2^-6,
  // max subnormal S.0000.111 = 0.875 * 2^-6, min subnormal S.0000.001 = 2^-9, NaN S.1111.111.
  EXPECT_EQ(e4m3_value(0x7E), 448.0);
  EXPECT_EQ(e4m3_value(0xFE), -448.0);
  EXPECT_EQ(e4m3_value(0x08), std::ldexp(1.0, -6));
  EXPECT_EQ(e4m3_value(0x07), 0.875 * std::ldexp(1.0, -6));
  EXPECT_EQ(e4m3_value(0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(e4m3_value(0x38), 1.0);
  EXPECT_EQ(e4m3_value(0x3C), 1.5);
  EXPECT_EQ(e4m3_value(0x40), 2.0);
  EXPECT_EQ(e4m3_value(0x77), 240.0);  // S.1110.111: no infinity below the NaN
  EXPECT_TRUE(same_value(e4m3_value(0x80), -0.0));
  EXPECT_TRUE(same_value(e4m3_value(0x00), 0.0));
  EXPECT_TRUE(std::isnan(e4m3_value(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_value(0xFF)));
}

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(Fp4LibraryTables, EveryEntryMatchesTheSpecDecoders) {
  // The doubled integer table has no -0 (code 8): a weight -0 adds the same as +0 to any sum.
  for (int c = 0; c < 16; ++c) EXPECT_EQ(0.5 * kE2M1Doubled[c], e2m1_value(c)) << "E2M1 code " << c;
  for (int b = 0; b < 256; ++b) {
    const double e8m0 = e8m0_value(static_cast<uint8_t>(b));
    const double e4m3 = e4m3_value(static_cast<uint8_t>(b));
    // Every value of both is an FP32 value (2^-127 as a subnormal), so the FP32 bits are exact.
    EXPECT_TRUE(same_value(from_bits(kE8M0Bits.bits[b]), e8m0)) << "E8M0 byte " << b;
    EXPECT_TRUE(same_value(from_bits(kE4M3Bits.bits[b]), e4m3)) << "E4M3 byte " << b;
    // NaNs are quiet, with the byte's sign for E4M3.
    if (std::isnan(e4m3)) {
      EXPECT_EQ(kE4M3Bits.bits[b] & 0x7FC00000u, 0x7FC00000u);
      EXPECT_EQ(kE4M3Bits.bits[b] >> 31, static_cast<uint32_t>(b >> 7));
    }
  }
  EXPECT_EQ(kE8M0Bits.bits[0xFF], 0x7FC00000u);
}

// Through each tier's kernels: a matrix whose every scale is one byte, random codes and
// activations, checked against the FP64 reference; NaN bytes must give NaN everywhere. The
// activations are scaled against the scale (|x| about 2^(127 - e), within 2^+-100) so that every
// output is an ordinary FP32 number whatever the byte.
class Fp4EveryByte : public IsaTest {
 protected:
  void check_byte(qmoe_weight_format format, uint8_t byte, qmoe_accuracy level, uint32_t m,
                  std::mt19937_64& rng, uint64_t seed) {
    Fp4Options o{format, 8, 64, ScaleOrder::kGrouped};
    Fp4Matrix w = make_fp4_matrix(o, rng);
    const uint32_t blocks = o.k / fp4_block_size(format);
    for (uint32_t n = 0; n < o.n; ++n) {
      for (uint32_t b = 0; b < blocks; ++b) w.set_scale(n, b, byte);
    }
    int shift = 0;
    if (format == QMOE_WEIGHT_FORMAT_MXFP4) shift = std::max(-100, std::min(100, 127 - byte));
    std::uniform_real_distribution<float> r(-1.0f, 1.0f);
    std::vector<float> x(size_t{m} * o.k);
    for (float& v : x) v = std::ldexp(r(rng), shift);
    ContextPtr ctx = make_context(GetParam(), 1);
    std::vector<float> y(size_t{m} * o.n, -1.0f);
    ASSERT_EQ(qmoe_gemm(ctx.get(), &w.desc, level, m, x.data(), o.k, y.data(), o.n, 0, o.n),
              QMOE_STATUS_OK);
    const Fp4Reference ref = reference_gemm(w, x, m);
    const double scale = format == QMOE_WEIGHT_FORMAT_MXFP4 ? e8m0_value(byte) : e4m3_value(byte);
    for (size_t i = 0; i < y.size(); ++i) {
      const std::string where = std::string(isa_name(GetParam())) + "/" +
                                (level == QMOE_ACCURACY_EXACT ? "exact " : "fast ") +
                                fp4_format_name(format) + " byte " + std::to_string(byte) +
                                " m=" + std::to_string(m) + " output " + std::to_string(i) +
                                " seed=" + std::to_string(seed);
      if (std::isnan(scale)) {
        EXPECT_TRUE(std::isnan(y[i])) << where << ": " << y[i];
        continue;
      }
      const double tol = ref.tol(level, i);
      EXPECT_NEAR(y[i], ref.y[i], tol + 1e-30) << where;
    }
  }
};

TEST_P(Fp4EveryByte, EveryE8M0ByteOnEveryLevel) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    for (int byte = 0; byte < 256; ++byte) {
      for (uint32_t m : {1u, 3u}) {
        check_byte(QMOE_WEIGHT_FORMAT_MXFP4, static_cast<uint8_t>(byte), level, m, rng, seed);
      }
    }
  }
}

TEST_P(Fp4EveryByte, EveryE4M3ByteOnEveryLevel) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    for (int byte = 0; byte < 256; ++byte) {
      for (uint32_t m : {1u, 3u}) {
        check_byte(QMOE_WEIGHT_FORMAT_NVFP4, static_cast<uint8_t>(byte), level, m, rng, seed);
      }
    }
  }
}

// Every code, exactly: row r holds code r % 16 at every k, every scale is 1, and X is one-hot
// at k = j (x_j = 1), so that Y[r] is E2M1(r % 16) on the dot, bit for bit at the exact level
// (and within the fast level's bound, which is exact here too: q = 127 times 1/127).
TEST_P(Fp4EveryByte, EveryCodeAtEveryPosition) {
  for (qmoe_weight_format format : {QMOE_WEIGHT_FORMAT_MXFP4, QMOE_WEIGHT_FORMAT_NVFP4}) {
    std::mt19937_64 rng(1);
    Fp4Options o{format, 16, 64, ScaleOrder::kBlockMajor};
    Fp4Matrix w = make_fp4_matrix(o, rng);
    const uint8_t one = format == QMOE_WEIGHT_FORMAT_MXFP4 ? 127 : 0x38;
    for (uint32_t n = 0; n < o.n; ++n) {
      for (uint32_t b = 0; b < o.k / fp4_block_size(format); ++b) w.set_scale(n, b, one);
      for (uint32_t k = 0; k < o.k; ++k) w.set_code(n, k, static_cast<uint8_t>((n + k) % 16));
    }
    ContextPtr ctx = make_context(GetParam(), 1);
    for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      for (uint32_t j = 0; j < o.k; ++j) {
        std::vector<float> x(o.k, 0.0f), y(o.n, -7.0f);
        x[j] = 1.0f;
        ASSERT_EQ(qmoe_gemm(ctx.get(), &w.desc, level, 1, x.data(), o.k, y.data(), o.n, 0, o.n),
                  QMOE_STATUS_OK);
        for (uint32_t n = 0; n < o.n; ++n) {
          const double want = e2m1_value(static_cast<uint8_t>((n + j) % 16));
          const double tol = level == QMOE_ACCURACY_EXACT ? 0.0 : 1e-6 * std::fabs(want);
          EXPECT_NEAR(y[n], want, tol) << isa_name(GetParam()) << " " << fp4_format_name(format)
                                       << " code " << (n + j) % 16 << " at k=" << j << " row " << n;
        }
      }
    }
  }
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(Fp4EveryByte);

}  // namespace
}  // namespace qmoe::testing
