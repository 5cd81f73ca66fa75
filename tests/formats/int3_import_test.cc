// qmoe_import_int3_packed: the upstream 3-bit stream (each row LSB-first, code k in bits
// 3k..3k+2) into the canonical INT3 layout. Hand-written byte vectors (the stream bytes derived
// by hand in the comments, the canonical bytes from docs/formats.md's rule), random round trips
// against the tests' own packers, an end-to-end product against FP64 computed from the stream,
// and bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/cpu/isa_test_util.h"
#include "tests/gemm/int3_reference.h"

namespace qmoe::testing {
namespace {

// The upstream stream of codes [n][k]: an implementation independent of the library's.
std::vector<uint8_t> pack_stream(const std::vector<uint8_t>& codes, uint32_t n, uint32_t k) {
  const size_t row_bytes = size_t{k} * 3 / 8;
  std::vector<uint8_t> out(n * row_bytes, 0);
  for (uint32_t r = 0; r < n; ++r) {
    for (uint32_t i = 0; i < k; ++i) {
      for (int b = 0; b < 3; ++b) {
        const size_t bit = size_t{i} * 3 + b;
        if ((codes[size_t{r} * k + i] >> b) & 1) out[r * row_bytes + bit / 8] |= 1u << (bit % 8);
      }
    }
  }
  return out;
}

std::vector<uint8_t> import(const std::vector<uint8_t>& stream, uint32_t n, uint32_t k) {
  size_t bytes = 0;
  EXPECT_EQ(qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT3, n, k, &bytes), QMOE_STATUS_OK);
  std::vector<uint8_t> out(bytes, 0xA5);
  EXPECT_EQ(qmoe_import_int3_packed(stream.data(), n, k, out.data(), out.size()), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  return out;
}

TEST(ImportInt3Packed, CodesZeroToSevenAreTheBytes88C6Fa) {
  // Codes 0, 1, ..., 7 at bits 0-2, 3-5, ..., 21-23: byte 0 = bit 3 (code 1) + bits 6-7 (code
  // 2 = 010: bit 7) = 0x88; byte 1 = bit 8 (code 2's top, 0), bits 9-11 (code 3 = 011: 9, 10),
  // bits 12-14 (code 4 = 100: 14), bit 15 (code 5 = 101: its bit 0) = 0xC6; byte 2 = bits 16-17
  // (code 5's bits 1-2: 0, 1 -> bit 17), bits 18-20 (code 6 = 110: 19, 20), bits 21-23 (code
  // 7: all) = 0xFA.
  const std::vector<uint8_t> stream = {0x88, 0xC6, 0xFA};
  EXPECT_EQ(pack_stream({0, 1, 2, 3, 4, 5, 6, 7}, 1, 8), stream);
  // Canonical: row 0's codes k < 16 in bits 0-2 of bytes 0-15 of the tile; the rest padding.
  std::vector<uint8_t> expected(96, 0);
  for (uint8_t i = 0; i < 8; ++i) expected[i] = i;
  EXPECT_EQ(import(stream, 1, 8), expected);
}

TEST(ImportInt3Packed, HandWrittenRows) {
  // Codes 7, 6, 5, 4, 3, 2, 1, 0: code 7 bits 0-2, code 6 (110) bits 4-5, code 5 (101) bits 6
  // and 8, code 4 (100) bit 11, code 3 (011) bits 12-13, code 2 (010) bit 16, code 1 bit 18:
  // bytes 0x77 (bits 0, 1, 2, 4, 5, 6), 0x39 (bits 8, 11, 12, 13), 0x05 (bits 16, 18).
  {
    const std::vector<uint8_t> stream = {0x77, 0x39, 0x05};
    EXPECT_EQ(pack_stream({7, 6, 5, 4, 3, 2, 1, 0}, 1, 8), stream);
    std::vector<uint8_t> expected(96, 0);
    for (uint8_t i = 0; i < 8; ++i) expected[i] = static_cast<uint8_t>(7 - i);
    EXPECT_EQ(import(stream, 1, 8), expected);
  }
  // Eight rows of K = 32: rows 0-6 all code 0; row 7 codes 0-15 all 5 (101), codes 16-31 all 1
  // (001). Code 5 repeated: bits 1 0 1 1 0 1 1 0 | 1 1 0 1 1 0 1 1 | 0 1 1 0 1 1 0 1 from bit 0,
  // the bytes 6d db b6 per 8 codes; code 1 repeated: bits 0, 3, 6 | 9, 12, 15 | 18, 21, the bytes
  // 49 92 24. Canonical: row 7 is split; the low bits (01 for both codes) go to bits 6-7 of
  // bytes 16-31 (k 0-15) and 48-63 (k 16-31): 0x40; the high bits (1 for code 5, 0 for code 1)
  // to bit 6 (k 0-15) of bytes 80-95, and nothing to their bit 7 (k 16-31): 0x40.
  {
    std::vector<uint8_t> stream(8 * 12, 0);
    const uint8_t row7[12] = {0x6D, 0xDB, 0xB6, 0x6D, 0xDB, 0xB6,
                              0x49, 0x92, 0x24, 0x49, 0x92, 0x24};
    std::memcpy(stream.data() + 7 * 12, row7, 12);
    std::vector<uint8_t> codes(8 * 32, 0);
    for (int i = 0; i < 32; ++i) codes[7 * 32 + i] = i < 16 ? 5 : 1;
    EXPECT_EQ(pack_stream(codes, 8, 32), stream);
    std::vector<uint8_t> expected(96, 0);
    for (int j = 0; j < 16; ++j) {
      expected[16 + j] = 0x40;
      expected[48 + j] = 0x40;
      expected[80 + j] = 0x40;
    }
    EXPECT_EQ(import(stream, 8, 32), expected);
  }
  // Row 1, K = 32: codes 0-15 zero, codes 16-31 all 5: stream bytes 0-5 zero, then 6d db b6
  // twice. Canonical: row 1 is lane 1 of vector 0, whole: bits 3-5 (k 16-31) of bytes 16-31 =
  // 101 << 3 = 0x28. Row 0 is all zero, and so is the padding of rows 2-7.
  {
    std::vector<uint8_t> stream(2 * 12, 0);
    const uint8_t fives[6] = {0x6D, 0xDB, 0xB6, 0x6D, 0xDB, 0xB6};
    std::memcpy(stream.data() + 12 + 6, fives, 6);
    std::vector<uint8_t> expected(96, 0);
    for (int j = 0; j < 16; ++j) expected[16 + j] = 0x28;
    EXPECT_EQ(import(stream, 2, 32), expected);
  }
}

// Random codes, shapes with every tail (N % 8 != 0, K % 32 == 8, 16 or 24, several groups and
// tiles): the import equals the tests' canonical packer byte for byte (padding zero), and each
// code reads back.
TEST(ImportInt3Packed, RandomRoundTrips) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (int iteration = 0; iteration < 40; ++iteration) {
    const uint32_t n = static_cast<uint32_t>(1 + rng() % 40);
    const uint32_t k = static_cast<uint32_t>(8 * (1 + rng() % 40));
    std::vector<uint8_t> codes(size_t{n} * k);
    for (uint8_t& c : codes) c = static_cast<uint8_t>(rng() % 8);
    const std::vector<uint8_t> canonical = import(pack_stream(codes, n, k), n, k);
    ASSERT_EQ(canonical, pack_int3_canonical(codes, n, k))
        << "n=" << n << " k=" << k << " seed=" << seed;
    for (uint32_t r = 0; r < n; ++r) {
      for (uint32_t i = 0; i < k; ++i) {
        ASSERT_EQ(canonical_int3_code(canonical.data(), r, i, k), codes[size_t{r} * k + i])
            << "n=" << n << " k=" << k << " row " << r << " k " << i << " seed=" << seed;
      }
    }
  }
}

// Imported weights multiplied on every tier equal an FP64 product computed from the stream:
// W[n, k] = (code(stream, n, k) - z[n, b]) * s[n, b].
class ImportInt3Gemm : public IsaTest {};

TEST_P(ImportInt3Gemm, MultiplyMatchesTheStreamsValues) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const uint32_t n = 21, k = 176, block = 16, blocks = k / block, m = 3;
  std::vector<uint8_t> stream(n * k * 3 / 8);
  for (uint8_t& b : stream) b = static_cast<uint8_t>(rng());
  std::vector<float> s(n * blocks);
  for (float& v : s) v = static_cast<float>(static_cast<int>(rng() % 2000) - 1000) / 16384.0f;
  std::vector<uint8_t> z(n * blocks);
  for (uint8_t& v : z) v = static_cast<uint8_t>(rng() % 8);
  const std::vector<uint8_t> codes = import(stream, n, k);
  qmoe_quant_matrix w{};
  w.struct_size = sizeof w;
  w.format = QMOE_WEIGHT_FORMAT_INT3;
  w.n = n;
  w.k = k;
  w.block_size = block;
  w.codes = codes.data();
  w.scale_dtype = QMOE_DTYPE_F32;
  w.scales = s.data();
  w.scale_row_stride = blocks;
  w.scale_block_stride = 1;
  w.zero_points = z.data();
  w.zero_point_row_stride = blocks;
  w.zero_point_block_stride = 1;
  std::vector<float> x(m * k);
  for (float& v : x) v = static_cast<float>(static_cast<int>(rng() % 200) - 100) / 37.0f;
  std::vector<float> y(m * n);
  ContextPtr ctx = make_context(GetParam(), 1);
  ASSERT_EQ(qmoe_gemm(ctx.get(), &w, QMOE_ACCURACY_EXACT, m, x.data(), k, y.data(), n, 0, n),
            QMOE_STATUS_OK);
  const size_t row_bytes = k * 3 / 8;
  for (uint32_t i = 0; i < m; ++i) {
    for (uint32_t r = 0; r < n; ++r) {
      double want = 0, mag = 0;
      for (uint32_t kk = 0; kk < k; ++kk) {
        uint32_t code = 0;
        for (int b = 0; b < 3; ++b) {
          const size_t bit = size_t{kk} * 3 + b;
          code |= ((stream[r * row_bytes + bit / 8] >> (bit % 8)) & 1u) << b;
        }
        const uint32_t blk = kk / block;
        const double wv = (static_cast<double>(code) - z[r * blocks + blk]) * s[r * blocks + blk];
        want += x[i * k + kk] * wv;
        mag += std::fabs(x[i * k + kk] * wv);
      }
      EXPECT_NEAR(y[i * n + r], want, 1e-5 * mag + 1e-30)
          << isa_name(GetParam()) << " m " << i << " row " << r << " seed=" << seed;
    }
  }
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(ImportInt3Gemm);

TEST(ImportInt3Packed, BadInputGetsAStatus) {
  // Outputs filled with a pattern no import writes (it clears its destination first, so a
  // zero-filled one could not show an early write).
  const uint8_t src[48] = {};
  std::vector<uint8_t> dst(192, 0xA5);
  EXPECT_EQ(qmoe_import_int3_packed(nullptr, 1, 32, dst.data(), dst.size()),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int3_packed(src, 1, 32, nullptr, 96), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int3_packed(src, 1, 32, dst.data(), 95), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("needs 96"), std::string::npos);
  EXPECT_EQ(qmoe_import_int3_packed(src, 9, 32, dst.data(), 191), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int3_packed(src, 0, 32, dst.data(), 96), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int3_packed(src, 1, 0, dst.data(), 96), QMOE_STATUS_INVALID_ARGUMENT);
  for (uint32_t k : {4u, 12u, 20u, 33u}) {  // rows would not start on byte boundaries
    EXPECT_EQ(qmoe_import_int3_packed(src, 1, k, dst.data(), dst.size()),
              QMOE_STATUS_INVALID_ARGUMENT)
        << k;
    EXPECT_NE(std::string(qmoe_last_error_message()).find("multiple of 8"), std::string::npos);
  }
  // N or K above QMOE_MAX_MATRIX_DIM, refused before either buffer is touched.
  EXPECT_EQ(qmoe_import_int3_packed(src, QMOE_MAX_MATRIX_DIM + 1, 32, dst.data(), SIZE_MAX),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("QMOE_MAX_MATRIX_DIM"), std::string::npos);
  EXPECT_EQ(qmoe_import_int3_packed(src, 1, 0xFFFFFFF8u, dst.data(), SIZE_MAX),
            QMOE_STATUS_INVALID_ARGUMENT);
  // Overlapping source and destination: the destination is cleared before the source is read,
  // so an import in place would be silently wrong. Source inside, at the start of, and ending
  // inside the destination.
  std::vector<uint8_t> both(512, 0x5A);
  EXPECT_EQ(qmoe_import_int3_packed(both.data(), 1, 32, both.data(), 96),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("overlap"), std::string::npos);
  EXPECT_EQ(qmoe_import_int3_packed(both.data() + 90, 1, 32, both.data(), 96),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int3_packed(both.data(), 1, 32, both.data() + 11, 96),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(both, std::vector<uint8_t>(512, 0x5A));
  EXPECT_EQ(dst, std::vector<uint8_t>(192, 0xA5));
  // Adjacent, disjoint buffers work, and a larger destination keeps its bytes past the codes.
  EXPECT_EQ(qmoe_import_int3_packed(both.data() + 96, 1, 32, both.data(), 96), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_import_int3_packed(src, 1, 32, dst.data(), dst.size()), QMOE_STATUS_OK);
  EXPECT_EQ(std::vector<uint8_t>(dst.begin(), dst.begin() + 96), std::vector<uint8_t>(96, 0));
  EXPECT_EQ(std::vector<uint8_t>(dst.begin() + 96, dst.end()), std::vector<uint8_t>(96, 0xA5));
}

}  // namespace
}  // namespace qmoe::testing
