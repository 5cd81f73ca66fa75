// The canonical INT3 layout (docs/formats.md, "INT3 weights"): its traits row, and what every
// tier's kernels read from hand-written tiles. A tile is decoded by an exact-level qmoe_gemm
// with zero points 0, scales 1 and X the identity, so Y[i][n] is code (n, i) exactly; the
// expected codes are written out by hand from the layout's rule, and random tiles must decode
// as the tests' own reader of the rule (tests/gemm/int3_reference.h) says.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "lib/formats/format_traits.h"
#include "tests/cpu/isa_test_util.h"
#include "tests/gemm/int3_reference.h"

namespace qmoe::testing {
namespace {

TEST(FormatTraits, Int3Row) {
  const FormatTraits* int3 = find_format(QMOE_WEIGHT_FORMAT_INT3);
  ASSERT_NE(int3, nullptr);
  EXPECT_STREQ(int3->name, "int3");
  EXPECT_EQ(int3->code_bits, 3u);
  EXPECT_EQ(int3->tile_row_bytes, 12u);
  EXPECT_EQ(tile_bytes(*int3), 96u);
  EXPECT_TRUE(int3->zero_points);
  EXPECT_EQ(int3->default_zero_point, 4u);
  EXPECT_FALSE(int3->global_scale);
  for (uint32_t b : {16u, 32u, 64u, 128u}) EXPECT_TRUE(format_accepts_block_size(*int3, b)) << b;
  for (uint32_t b : {0u, 8u, 24u, 256u}) EXPECT_FALSE(format_accepts_block_size(*int3, b)) << b;
  for (int32_t d : {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16}) {
    EXPECT_TRUE(format_accepts_scale_dtype(*int3, d)) << d;
  }
  for (int32_t d : {0, int32_t{QMOE_DTYPE_E8M0}, int32_t{QMOE_DTYPE_F8_E4M3}, 6}) {
    EXPECT_FALSE(format_accepts_scale_dtype(*int3, d)) << d;
  }
  EXPECT_EQ(codes_size(*int3, 9, 48), 2u * 2u * 96u);  // two row groups, two tiles of k
}

// Codes [n][k] of canonical INT3 `codes` as every tier's exact kernel reads them.
std::vector<int> decode(Isa isa, const std::vector<uint8_t>& codes, uint32_t n, uint32_t k) {
  const uint32_t blocks = k / 16;
  std::vector<float> scales(size_t{n} * blocks, 1.0f);
  std::vector<uint8_t> zeros(size_t{n} * blocks, 0);
  qmoe_quant_matrix w{};
  w.struct_size = sizeof w;
  w.format = QMOE_WEIGHT_FORMAT_INT3;
  w.n = n;
  w.k = k;
  w.block_size = 16;
  w.codes = codes.data();
  w.scale_dtype = QMOE_DTYPE_F32;
  w.scales = scales.data();
  w.scale_row_stride = blocks;
  w.scale_block_stride = 1;
  w.zero_points = zeros.data();
  w.zero_point_row_stride = blocks;
  w.zero_point_block_stride = 1;
  std::vector<float> identity(size_t{k} * k, 0.0f), y(size_t{k} * n, -1.0f);
  for (uint32_t i = 0; i < k; ++i) identity[size_t{i} * k + i] = 1.0f;
  ContextPtr ctx = make_context(isa, 1);
  EXPECT_EQ(qmoe_gemm(ctx.get(), &w, QMOE_ACCURACY_EXACT, k, identity.data(), k, y.data(), n, 0, n),
            QMOE_STATUS_OK)
      << qmoe_last_error_message();
  std::vector<int> out(size_t{n} * k);
  for (uint32_t row = 0; row < n; ++row) {
    for (uint32_t i = 0; i < k; ++i) out[size_t{row} * k + i] = static_cast<int>(y[i * n + row]);
  }
  return out;
}

class Int3Layout : public IsaTest {};

// One tile (8 rows, 32 k), every byte written by hand from docs/formats.md's rule: byte
// 32v + 16L + j holds codes j (bits 0-2) and 16 + j (bits 3-5) of row 2v + L for v < 3; rows
// 6 + L keep the low two bits of code j in bits 6-7 of byte 16L + j, of code 16 + j in bits
// 6-7 of byte 32 + 16L + j, and the high bits in bits 6 and 7 of byte 64 + 16L + j.
TEST_P(Int3Layout, HandWrittenTileDecodes) {
  std::vector<uint8_t> tile(96, 0);
  tile[0] = 0x03;   // row 0, k 0: code 3 (011) in bits 0-2
  tile[20] = 0x28;  // row 1 (lane 1 of vector 0), k 20 = 16 + 4: code 5 (101) in bits 3-5
  tile[37] = 0x32;  // row 2 (vector 1, lane 0), k 5: code 2 (010) bits 0-2; k 21: code 6 (110)
  tile[57] = 0x01;  // row 3 (vector 1, lane 1), k 9: code 1
  tile[79] = 0x20;  // row 4 (vector 2, lane 0), k 31 = 16 + 15: code 4 (100) in bits 3-5
  tile[3] = 0x80;   // row 6, k 3: code 6 (110): low bits 10 in bits 6-7 of byte 3 ...
  tile[67] = 0x40;  // ... and the high bit in bit 6 of byte 64 + 3
  tile[32] = 0x40;  // row 6, k 16: code 1 (001): low bits 01 in bits 6-7 of byte 32 + 0
  tile[49] = 0xC0;  // row 7, k 17: code 7 (111): low bits 11 in bits 6-7 of byte 32 + 16 + 1 ...
  tile[81] = 0x80;  // ... and the high bit in bit 7 of byte 64 + 16 + 1
  tile[80] = 0x40;  // row 7, k 0: code 4 (100): only the high bit, bit 6 of byte 64 + 16 + 0
  std::vector<int> expected(8 * 32, 0);
  expected[0 * 32 + 0] = 3;
  expected[1 * 32 + 20] = 5;
  expected[2 * 32 + 5] = 2;
  expected[2 * 32 + 21] = 6;
  expected[3 * 32 + 9] = 1;
  expected[4 * 32 + 31] = 4;
  expected[6 * 32 + 3] = 6;
  expected[6 * 32 + 16] = 1;
  expected[7 * 32 + 17] = 7;
  expected[7 * 32 + 0] = 4;
  const std::vector<int> got = decode(GetParam(), tile, 8, 32);
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(got[i], expected[i]) << isa_name(GetParam()) << ": row " << i / 32 << " k " << i % 32;
  }
  // Every bit set: every code 7; no bit belongs to two codes or to none.
  const std::vector<int> sevens = decode(GetParam(), std::vector<uint8_t>(96, 0xFF), 8, 32);
  for (size_t i = 0; i < sevens.size(); ++i) {
    EXPECT_EQ(sevens[i], 7) << isa_name(GetParam()) << ": row " << i / 32 << " k " << i % 32;
  }
  // Each single bit of the tile is exactly one bit of one code.
  for (size_t byte = 0; byte < 96; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> one(96, 0);
      one[byte] = static_cast<uint8_t>(1u << bit);
      const std::vector<int> codes = decode(GetParam(), one, 8, 32);
      int nonzero = 0, value = 0;
      for (int c : codes) {
        nonzero += c != 0;
        value += c;
      }
      ASSERT_EQ(nonzero, 1) << "byte " << byte << " bit " << bit;
      EXPECT_TRUE(value == 1 || value == 2 || value == 4) << "byte " << byte << " bit " << bit;
    }
  }
}

// Random tiles over several groups and tiles (N and K tails: 13 rows, K = 80 ends in a half
// tile) decode as the tests' reader of the rule says.
TEST_P(Int3Layout, RandomTilesDecodeAsTheRuleSays) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (const auto& [n, k] : {std::pair<uint32_t, uint32_t>{13, 80}, {8, 32}, {3, 128}}) {
    std::vector<uint8_t> codes((n + 7) / 8 * ((k + 31) / 32) * 96);
    for (uint8_t& b : codes) b = static_cast<uint8_t>(rng());
    const std::vector<int> got = decode(GetParam(), codes, n, k);
    for (uint32_t row = 0; row < n; ++row) {
      for (uint32_t i = 0; i < k; ++i) {
        ASSERT_EQ(got[size_t{row} * k + i], canonical_int3_code(codes.data(), row, i, k))
            << isa_name(GetParam()) << " n=" << n << " k=" << k << ": row " << row << " k " << i
            << " seed=" << seed;
      }
    }
  }
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(Int3Layout);

}  // namespace
}  // namespace qmoe::testing
