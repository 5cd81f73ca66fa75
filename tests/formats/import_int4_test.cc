// Importers into the canonical INT4 layout, checked on hand-written byte vectors (what the
// bytes must be, written out), then end to end: ONNX Runtime-layout weights imported and
// multiplied must equal an FP64 product computed straight from the ONNX Runtime bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "qmoe/qmoe.h"
#include "tests/formats/q4_0_matrix.h"

namespace {

TEST(ImportInt4Onnx, HandWrittenRowMatchesTheCanonicalBytes) {
  // One row, K = 32, code k = k for k < 16 and 31 - k above (so codes j and j + 16 differ and
  // an importer with the nibble halves swapped fails): ONNX Runtime packs k = 2i low,
  // k = 2i + 1 high.
  const uint8_t onnx[16] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE,
                            0xEF, 0xCD, 0xAB, 0x89, 0x67, 0x45, 0x23, 0x01};
  // Canonical byte j: code j low, code j + 16 high -> j | (15 - j) << 4; rows 1-7 are zero
  // padding.
  std::vector<uint8_t> expected(128, 0);
  const uint8_t row0[16] = {0xF0, 0xE1, 0xD2, 0xC3, 0xB4, 0xA5, 0x96, 0x87,
                            0x78, 0x69, 0x5A, 0x4B, 0x3C, 0x2D, 0x1E, 0x0F};
  std::memcpy(expected.data(), row0, 16);
  std::vector<uint8_t> out(128, 0xA5);
  ASSERT_EQ(qmoe_import_int4_onnx(onnx, 1, 32, out.data(), out.size()), QMOE_STATUS_OK);
  EXPECT_EQ(out, expected);
}

TEST(ImportInt4Onnx, RowsAndChunksLandInTheirTiles) {
  // N = 9 (two 8-row groups), K = 64 (two chunks). Row r has every code equal to r % 16 in the
  // first 32 k and 15 - r in the last 32 k.
  const uint32_t n = 9, k = 64;
  std::vector<uint8_t> onnx(n * k / 2);
  for (uint32_t r = 0; r < n; ++r) {
    for (uint32_t i = 0; i < k / 2; ++i) {
      const uint8_t c = i < 16 ? r : 15 - r;
      onnx[r * k / 2 + i] = static_cast<uint8_t>(c | c << 4);
    }
  }
  std::vector<uint8_t> out(2 * 2 * 128, 0xA5);
  ASSERT_EQ(qmoe_import_int4_onnx(onnx.data(), n, k, out.data(), out.size()), QMOE_STATUS_OK);
  // Group 0, chunk 0, row 3: bytes 48..63 all 0x33. Group 0, chunk 1 (offset 128), row 3:
  // 0xCC. Group 1 (offset 256), chunk 0, row 0 (= row 8): 0x88; chunk 1: 0x77; rows 9-15 of
  // group 1 are padding: 0.
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[48 + j], 0x33) << j;
    EXPECT_EQ(out[128 + 48 + j], 0xCC) << j;
    EXPECT_EQ(out[256 + j], 0x88) << j;
    EXPECT_EQ(out[256 + 128 + j], 0x77) << j;
    EXPECT_EQ(out[256 + 16 + j], 0x00) << j;
    EXPECT_EQ(out[256 + 128 + 112 + j], 0x00) << j;
  }
}

TEST(ImportInt4Onnx, ZeroPointsUnpackLowNibbleFirst) {
  // 2 rows, 3 blocks each: packed rows are ceil(3 / 2) = 2 bytes; the odd block's high nibble
  // is padding.
  const uint8_t packed[4] = {0x21, 0xF3, 0x54, 0x06};
  uint8_t out[6] = {};
  ASSERT_EQ(qmoe_import_int4_onnx_zero_points(packed, 2, 96, 32, out, 3, 1), QMOE_STATUS_OK);
  const uint8_t expected[6] = {1, 2, 3, 4, 5, 6};
  EXPECT_EQ(std::memcmp(out, expected, 6), 0);
  // Block-major destination.
  uint8_t bm[6] = {};
  ASSERT_EQ(qmoe_import_int4_onnx_zero_points(packed, 2, 96, 32, bm, 1, 2), QMOE_STATUS_OK);
  const uint8_t expected_bm[6] = {1, 4, 2, 5, 3, 6};
  EXPECT_EQ(std::memcmp(bm, expected_bm, 6), 0);
}

TEST(ImportInt4Q4_0, HandWrittenBlock) {
  // block_q4_0 = FP16 d (little endian) + 16 bytes; byte j: code j low, code j + 16 high.
  uint8_t block[18] = {0x00, 0x3C};  // d = 1.0
  for (int j = 0; j < 16; ++j) block[2 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
  std::vector<uint8_t> codes(128, 0xA5);
  uint16_t scale = 0;
  ASSERT_EQ(qmoe_import_int4_q4_0(block, 1, 32, codes.data(), codes.size(), &scale, 1, 1),
            QMOE_STATUS_OK);
  EXPECT_EQ(scale, 0x3C00);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(codes[j], block[2 + j]) << j;
  for (int j = 16; j < 128; ++j) EXPECT_EQ(codes[j], 0) << j;
}

TEST(ImportInt4Q4_0, MultiplyMatchesGgmlSemantics) {
  // Rows of Q4_0 blocks -> canonical + FP16 scales [K/32, N]; then qmoe_gemm must equal
  // sum_k x_k * (q - 8) * d computed from the ggml bytes.
  const uint32_t n = 11, k = 96, blocks = k / 32;
  std::mt19937 rng(3);
  std::vector<uint8_t> q40(n * blocks * 18);
  std::vector<float> d_values(n * blocks);
  for (uint32_t i = 0; i < n * blocks; ++i) {
    uint8_t* b = q40.data() + i * 18;
    const uint16_t d = static_cast<uint16_t>(0x2000 + rng() % 0x800);  // ~0.008 .. 0.06
    std::memcpy(b, &d, 2);
    for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(rng());
    // FP16 -> float by hand for these normal values: exponent and mantissa fields.
    d_values[i] = std::ldexp(1.0f + (d & 0x3FF) / 1024.0f, ((d >> 10) & 0x1F) - 15);
  }
  qmoe::testing::ImportedQ4_0 imported;
  ASSERT_EQ(qmoe::testing::import_q4_0_matrix(q40, n, k, &imported), QMOE_STATUS_OK);
  const qmoe_quant_matrix& w = imported.matrix;
  std::vector<float> x(k);
  for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 200) - 100) / 50.0f;
  qmoe_context* ctx = nullptr;
  ASSERT_EQ(qmoe_context_create(nullptr, &ctx), QMOE_STATUS_OK);
  std::vector<float> y(n);
  ASSERT_EQ(qmoe_gemm(ctx, &w, QMOE_ACCURACY_EXACT, 1, x.data(), k, y.data(), n, 0, n),
            QMOE_STATUS_OK);
  qmoe_context_destroy(ctx);
  for (uint32_t r = 0; r < n; ++r) {
    double want = 0, mag = 0;
    for (uint32_t kk = 0; kk < k; ++kk) {
      const uint8_t* b = q40.data() + (r * blocks + kk / 32) * 18;
      const int j = kk % 32;
      const int q = j < 16 ? (b[2 + j] & 0x0F) : (b[2 + j - 16] >> 4);
      const double wv = (q - 8) * static_cast<double>(d_values[r * blocks + kk / 32]);
      want += x[kk] * wv;
      mag += std::fabs(x[kk] * wv);
    }
    EXPECT_NEAR(y[r], want, 1e-5 * mag + 1e-30) << "row " << r;
  }
}

TEST(ImportInt4Onnx, MultiplyMatchesOnnxRuntimeSemantics) {
  // MatMulNBits semantics from its own bytes: W[n, k] = (nibble(k) - zp(n, k / B)) * s[n, k / B].
  const uint32_t n = 10, k = 128, block = 64, blocks = k / block;
  std::mt19937 rng(5);
  std::vector<uint8_t> onnx(n * k / 2), zp_packed(n * ((blocks + 1) / 2));
  for (auto& b : onnx) b = static_cast<uint8_t>(rng());
  for (auto& b : zp_packed) b = static_cast<uint8_t>(rng());
  std::vector<float> s(n * blocks);
  for (auto& v : s) v = static_cast<float>(rng() % 1000 + 1) / 16384.0f;
  size_t bytes = 0;
  ASSERT_EQ(qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT4, n, k, &bytes), QMOE_STATUS_OK);
  std::vector<uint8_t> codes(bytes);
  std::vector<uint8_t> zp(n * blocks);
  ASSERT_EQ(qmoe_import_int4_onnx(onnx.data(), n, k, codes.data(), bytes), QMOE_STATUS_OK);
  ASSERT_EQ(qmoe_import_int4_onnx_zero_points(zp_packed.data(), n, k, block, zp.data(), blocks, 1),
            QMOE_STATUS_OK);
  qmoe_quant_matrix w{};
  w.struct_size = sizeof w;
  w.format = QMOE_WEIGHT_FORMAT_INT4;
  w.n = n;
  w.k = k;
  w.block_size = block;
  w.codes = codes.data();
  w.scale_dtype = QMOE_DTYPE_F32;
  w.scales = s.data();
  w.scale_row_stride = blocks;
  w.scale_block_stride = 1;
  w.zero_points = zp.data();
  w.zero_point_row_stride = blocks;
  w.zero_point_block_stride = 1;
  std::vector<float> x(2 * k);
  for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 200) - 100) / 37.0f;
  qmoe_context* ctx = nullptr;
  ASSERT_EQ(qmoe_context_create(nullptr, &ctx), QMOE_STATUS_OK);
  std::vector<float> y(2 * n);
  ASSERT_EQ(qmoe_gemm(ctx, &w, QMOE_ACCURACY_EXACT, 2, x.data(), k, y.data(), n, 0, n),
            QMOE_STATUS_OK);
  qmoe_context_destroy(ctx);
  for (uint32_t m = 0; m < 2; ++m) {
    for (uint32_t r = 0; r < n; ++r) {
      double want = 0, mag = 0;
      for (uint32_t kk = 0; kk < k; ++kk) {
        const int code = (onnx[r * k / 2 + kk / 2] >> (4 * (kk % 2))) & 0x0F;
        const uint32_t b = kk / block;
        const int z = (zp_packed[r * ((blocks + 1) / 2) + b / 2] >> (4 * (b % 2))) & 0x0F;
        const double wv = (code - z) * static_cast<double>(s[r * blocks + b]);
        want += x[m * k + kk] * wv;
        mag += std::fabs(x[m * k + kk] * wv);
      }
      EXPECT_NEAR(y[m * n + r], want, 1e-5 * mag + 1e-30) << "m " << m << " row " << r;
    }
  }
}

TEST(ImportInt4, BadInputGetsAStatus) {
  // Outputs filled with a pattern no import writes (the importers clear their destination
  // first, so a zero-filled one could not show an early write).
  uint8_t src[64] = {};
  std::vector<uint8_t> dst(256, 0xA5);
  uint16_t scales[8];
  std::fill(std::begin(scales), std::end(scales), uint16_t{0xA5A5});
  EXPECT_EQ(qmoe_import_int4_onnx(nullptr, 1, 32, dst.data(), dst.size()),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int4_onnx(src, 1, 32, nullptr, 128), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int4_onnx(src, 1, 32, dst.data(), 127), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int4_onnx(src, 0, 32, dst.data(), 128), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int4_onnx(src, 1, 31, dst.data(), 128), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int4_onnx_zero_points(src, 2, 96, 32, nullptr, 3, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int4_onnx_zero_points(src, 2, 96, 64, dst.data(), 3, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int4_onnx_zero_points(src, 2, 96, 32, dst.data(), 1, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int4_q4_0(src, 1, 48, dst.data(), dst.size(), scales, 1, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int4_q4_0(src, 1, 32, dst.data(), dst.size(), nullptr, 1, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int4_q4_0(src, 2, 64, dst.data(), dst.size(), scales, 0, 0),
            QMOE_STATUS_INVALID_ARGUMENT);
  // Overlapping source and destination: the destination is cleared before the source is read,
  // so an import in place would be silently wrong.
  std::vector<uint8_t> both(512, 0x5A);
  EXPECT_EQ(qmoe_import_int4_onnx(both.data(), 1, 32, both.data(), 256),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(both[0], 0x5A);
  EXPECT_EQ(qmoe_import_int4_onnx(both.data() + 100, 1, 32, both.data(), 128),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int4_onnx_zero_points(both.data(), 2, 96, 32, both.data() + 1, 3, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int4_q4_0(both.data(), 1, 32, both.data() + 4, 256, scales, 1, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  auto* scales_in_codes = reinterpret_cast<uint16_t*>(dst.data() + 16);
  EXPECT_EQ(qmoe_import_int4_q4_0(src, 1, 32, dst.data(), dst.size(), scales_in_codes, 1, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int4_q4_0(src, 1, 32, dst.data(), dst.size(),
                                  reinterpret_cast<uint16_t*>(src + 8), 1, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  // Misaligned scales, and zero-point strides whose span does not fit.
  std::vector<uint16_t> scale_buf(4);
  auto* odd_scales =
      reinterpret_cast<uint16_t*>(reinterpret_cast<unsigned char*>(scale_buf.data()) + 1);
  EXPECT_EQ(qmoe_import_int4_q4_0(src, 1, 32, dst.data(), dst.size(), odd_scales, 1, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  std::vector<uint8_t> zp_src(((1u << 17) + 1) * 1, 0);
  EXPECT_EQ(qmoe_import_int4_onnx_zero_points(zp_src.data(), (1u << 17) + 1, 32, 32, dst.data(),
                                              size_t{1} << 47, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  // N or K above QMOE_MAX_MATRIX_DIM, refused before either buffer is touched (the claimed
  // sizes are far larger than the buffers). Near 2^32 the chunk count once wrapped to 0
  // (K = 0xFFFFFFFE: OK with every code left 0) and the zero points' source row length to 0
  // (K / block = 0xFFFFFFFF: the overlap check saw an empty source).
  EXPECT_EQ(qmoe_import_int4_onnx(src, 1, 0xFFFFFFFEu, dst.data(), SIZE_MAX),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("QMOE_MAX_MATRIX_DIM"), std::string::npos);
  EXPECT_EQ(qmoe_import_int4_onnx(src, QMOE_MAX_MATRIX_DIM + 1, 32, dst.data(), SIZE_MAX),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(
      qmoe_import_int4_q4_0(src, 1, QMOE_MAX_MATRIX_DIM + 32, dst.data(), SIZE_MAX, scales, 1, 1),
      QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_int4_onnx_zero_points(src, 1, 0xFFFFFFFFu, 1, dst.data(), 1, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(dst, std::vector<uint8_t>(256, 0xA5));
  for (uint16_t v : scales) EXPECT_EQ(v, 0xA5A5);
  // Disjoint buffers still work.
  EXPECT_EQ(qmoe_import_int4_onnx(both.data() + 256, 1, 32, both.data(), 128), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_import_int4_q4_0(src, 1, 32, dst.data(), dst.size(), scales, 1, 1),
            QMOE_STATUS_OK);
}

}  // namespace
