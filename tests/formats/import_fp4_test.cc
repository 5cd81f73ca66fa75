// Importers into the canonical MXFP4 and NVFP4 layouts, on hand-written byte vectors (what the
// bytes must be, written out, with each source's convention cited), then round trips (the
// canonical codes read back through docs/formats.md's layout formula give the source bytes), then
// end to end: imported weights multiplied by qmoe_gemm equal an FP64 product computed from the
// source bytes with the source's own dequantisation rule.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "qmoe/qmoe.h"
#include "tests/gemm/fp4_reference.h"

namespace qmoe::testing {
namespace {

// gpt-oss (gpt_oss/torch/weights.py): FP4_VALUES, indexed by a nibble; out[..., 0::2] takes
// the low nibbles of the blocks tensor and out[..., 1::2] the high ones; torch.ldexp(value,
// scale - 127).
const double kGptOssFp4Values[16] = {+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
                                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};
// ggml (ggml-common.h kvalues_mxfp4, ggml-impl.h ggml_e8m0_to_fp32_half,
// ggml-quants.c dequantize_row_mxfp4): y[j] = kvalues[qs[j] & 0xF] * d, y[j + 16] =
// kvalues[qs[j] >> 4] * d, d = 2^(e - 128) (bits 0x00200000 << e for e < 2, (e - 1) << 23
// otherwise).
const int kGgmlKvaluesMxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
float ggml_e8m0_to_fp32_half(uint8_t x) {
  const uint32_t bits = x < 2 ? 0x00200000u << x : static_cast<uint32_t>(x - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// NVIDIA ModelOpt (modelopt/torch/quantization/qtensor/nvfp4_tensor.py): packed =
// (q[..., 1::2] << 4) | q[..., 0::2]; dequantize: e2m1_values[nibble] * float(e4m3 scale) *
// weights_scaling_factor_2.
const double kModelOptE2M1Values[16] = {0, 0.5,  1,  1.5,  2,  3,  4,  6,
                                        0, -0.5, -1, -1.5, -2, -3, -4, -6};

// The code of (n, k) in canonical codes, by docs/formats.md's formula.
uint8_t canonical_code(const std::vector<uint8_t>& codes, uint32_t n, uint32_t k,
                       uint32_t k_total) {
  const size_t chunks = (k_total + 31) / 32;
  const uint8_t byte = codes[((n / 8) * chunks + k / 32) * 128 + (n % 8) * 16 + (k % 16)];
  return (k % 32) < 16 ? byte & 0x0F : byte >> 4;
}

size_t codes_bytes(qmoe_weight_format format, uint32_t n, uint32_t k) {
  size_t bytes = 0;
  EXPECT_EQ(qmoe_quant_matrix_codes_size(format, n, k, &bytes), QMOE_STATUS_OK);
  return bytes;
}

qmoe_context* default_context() {
  qmoe_context* ctx = nullptr;
  EXPECT_EQ(qmoe_context_create(nullptr, &ctx), QMOE_STATUS_OK);
  return ctx;
}

qmoe_quant_matrix fp4_matrix(qmoe_weight_format format, uint32_t n, uint32_t k, const void* codes,
                             const void* scales, size_t row_stride, size_t block_stride) {
  qmoe_quant_matrix w{};
  w.struct_size = sizeof w;
  w.format = format;
  w.n = n;
  w.k = k;
  w.block_size = fp4_block_size(format);
  w.codes = codes;
  w.scale_dtype = fp4_scale_dtype(format);
  w.scales = scales;
  w.scale_row_stride = row_stride;
  w.scale_block_stride = block_stride;
  return w;
}

TEST(ImportMxfp4GptOss, HandWrittenBlockMatchesTheCanonicalBytes) {
  // One row, K = 32: E2M1 code k is k for k < 16 and 31 - k above (codes j and j + 16 differ,
  // so swapped nibble halves fail). gpt-oss byte j = code 2j | code 2j+1 << 4.
  const uint8_t blocks[16] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE,
                              0xEF, 0xCD, 0xAB, 0x89, 0x67, 0x45, 0x23, 0x01};
  // Canonical byte j: code j low, code j + 16 high -> j | (15 - j) << 4; rows 1-7 padding.
  std::vector<uint8_t> expected(128, 0);
  const uint8_t row0[16] = {0xF0, 0xE1, 0xD2, 0xC3, 0xB4, 0xA5, 0x96, 0x87,
                            0x78, 0x69, 0x5A, 0x4B, 0x3C, 0x2D, 0x1E, 0x0F};
  std::memcpy(expected.data(), row0, 16);
  std::vector<uint8_t> out(128, 0xA5);
  ASSERT_EQ(qmoe_import_mxfp4_gpt_oss(blocks, 1, 32, out.data(), out.size()), QMOE_STATUS_OK);
  EXPECT_EQ(out, expected);
}

TEST(ImportMxfp4GptOss, RoundTripAndProductFollowGptOss) {
  const uint32_t n = 11, k = 96, blocks = k / 32;
  std::mt19937 rng(11);
  std::vector<uint8_t> src(size_t{n} * blocks * 16), scales(size_t{n} * blocks);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (auto& s : scales) s = static_cast<uint8_t>(118 + rng() % 12);
  std::vector<uint8_t> codes(codes_bytes(QMOE_WEIGHT_FORMAT_MXFP4, n, k));
  ASSERT_EQ(qmoe_import_mxfp4_gpt_oss(src.data(), n, k, codes.data(), codes.size()),
            QMOE_STATUS_OK);
  // Round trip: the canonical codes packed back gpt-oss's way are the source bytes.
  for (uint32_t r = 0; r < n; ++r) {
    for (uint32_t i = 0; i < k / 2; ++i) {
      const uint8_t back = static_cast<uint8_t>(canonical_code(codes, r, 2 * i, k) |
                                                canonical_code(codes, r, 2 * i + 1, k) << 4);
      ASSERT_EQ(back, src[r * (k / 2) + i]) << "row " << r << " byte " << i;
    }
  }
  // The scales tensor [N, K/32] in place, and regrouped: both multiply as gpt-oss dequantises.
  std::vector<uint8_t> grouped(qmoe_grouped_plane_elements(n, blocks));
  ASSERT_EQ(
      qmoe_group_plane(scales.data(), n, blocks, 1, blocks, 1, grouped.data(), grouped.size()),
      QMOE_STATUS_OK);
  std::vector<float> x(2 * k);
  for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 200) - 100) / 37.0f;
  qmoe_context* ctx = default_context();
  for (bool regrouped : {false, true}) {
    qmoe_quant_matrix w = fp4_matrix(QMOE_WEIGHT_FORMAT_MXFP4, n, k, codes.data(),
                                     regrouped ? grouped.data() : scales.data(),
                                     regrouped ? 1 : blocks, regrouped ? 8 : 1);
    if (regrouped) w.scale_group_stride = 8 * blocks;
    std::vector<float> y(2 * n);
    ASSERT_EQ(qmoe_gemm(ctx, &w, QMOE_ACCURACY_EXACT, 2, x.data(), k, y.data(), n, 0, n),
              QMOE_STATUS_OK);
    for (uint32_t m = 0; m < 2; ++m) {
      for (uint32_t r = 0; r < n; ++r) {
        double want = 0, mag = 0;
        for (uint32_t kk = 0; kk < k; ++kk) {
          const uint8_t byte = src[r * (k / 2) + kk / 2];
          const int nibble = kk % 2 == 0 ? byte & 0x0F : byte >> 4;
          const double wv =
              std::ldexp(kGptOssFp4Values[nibble], scales[r * blocks + kk / 32] - 127);
          want += x[m * k + kk] * wv;
          mag += std::fabs(x[m * k + kk] * wv);
        }
        EXPECT_NEAR(y[m * n + r], want, 1e-5 * mag + 1e-30) << "m " << m << " row " << r;
      }
    }
  }
  qmoe_context_destroy(ctx);
}

// ggml's value of every (e, code) with e < 0xFF equals E2M1(code) * 2^(e - 127), bit for bit
// in FP32: the import copies the bytes and keeps every weight's value.
TEST(ImportMxfp4Ggml, GgmlHalfScaleConventionIsE8M0ValueForValue) {
  for (int e = 0; e < 255; ++e) {
    for (int c = 0; c < 16; ++c) {
      const float ggml = static_cast<float>(kGgmlKvaluesMxfp4[c]) *
                         ggml_e8m0_to_fp32_half(static_cast<uint8_t>(e));
      const double ours = e2m1_value(static_cast<uint8_t>(c)) * e8m0_value(static_cast<uint8_t>(e));
      EXPECT_EQ(static_cast<double>(ggml), static_cast<double>(static_cast<float>(ours)))
          << "e " << e << " code " << c;
    }
  }
}

TEST(ImportMxfp4Ggml, HandWrittenBlock) {
  // block_mxfp4 = e, then 16 bytes; byte j: code j low, code j + 16 high (as Q4_0).
  uint8_t block[17] = {0x80};  // 2^1
  for (int j = 0; j < 16; ++j) block[1 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
  std::vector<uint8_t> codes(128, 0xA5);
  uint8_t scale = 0;
  ASSERT_EQ(qmoe_import_mxfp4_ggml(block, 1, 32, codes.data(), codes.size(), &scale, 1, 1),
            QMOE_STATUS_OK);
  EXPECT_EQ(scale, 0x80);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(codes[j], block[1 + j]) << j;
  for (int j = 16; j < 128; ++j) EXPECT_EQ(codes[j], 0) << j;
}

TEST(ImportMxfp4Ggml, RoundTripAndProductFollowGgml) {
  const uint32_t n = 13, k = 128, blocks = k / 32;
  std::mt19937 rng(5);
  std::vector<uint8_t> src(size_t{n} * blocks * 17);
  for (size_t i = 0; i < src.size(); ++i) {
    src[i] = i % 17 == 0
                 ? static_cast<uint8_t>(i % 2 ? 120 + rng() % 10 : rng() % 3)  // e = 0..2 too
                 : static_cast<uint8_t>(rng());
  }
  std::vector<uint8_t> codes(codes_bytes(QMOE_WEIGHT_FORMAT_MXFP4, n, k));
  std::vector<uint8_t> scales(size_t{blocks} * n);  // [K/32, N]
  ASSERT_EQ(
      qmoe_import_mxfp4_ggml(src.data(), n, k, codes.data(), codes.size(), scales.data(), 1, n),
      QMOE_STATUS_OK);
  for (uint32_t r = 0; r < n; ++r) {
    for (uint32_t b = 0; b < blocks; ++b) {
      const uint8_t* block = src.data() + (r * blocks + b) * 17;
      ASSERT_EQ(scales[b * n + r], block[0]);
      for (uint32_t j = 0; j < 16; ++j) {
        const uint8_t back =
            static_cast<uint8_t>(canonical_code(codes, r, 32 * b + j, k) |
                                 canonical_code(codes, r, 32 * b + j + 16, k) << 4);
        ASSERT_EQ(back, block[1 + j]) << "row " << r << " block " << b << " byte " << j;
      }
    }
  }
  // Small e (2^-127 .. 2^-125) in half the blocks: activations large enough for ordinary outputs.
  std::vector<float> x(k);
  for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 200) - 100) / 50.0f;
  qmoe_quant_matrix w =
      fp4_matrix(QMOE_WEIGHT_FORMAT_MXFP4, n, k, codes.data(), scales.data(), 1, n);
  std::vector<float> y(n);
  qmoe_context* ctx = default_context();
  ASSERT_EQ(qmoe_gemm(ctx, &w, QMOE_ACCURACY_EXACT, 1, x.data(), k, y.data(), n, 0, n),
            QMOE_STATUS_OK);
  qmoe_context_destroy(ctx);
  for (uint32_t r = 0; r < n; ++r) {
    double want = 0, mag = 0;
    for (uint32_t kk = 0; kk < k; ++kk) {
      const uint8_t* block = src.data() + (r * blocks + kk / 32) * 17;
      const uint32_t j = kk % 32;
      const int q = j < 16 ? block[1 + j] & 0x0F : block[1 + j - 16] >> 4;
      const double wv =
          kGgmlKvaluesMxfp4[q] * static_cast<double>(ggml_e8m0_to_fp32_half(block[0]));
      want += x[kk] * wv;
      mag += std::fabs(x[kk] * wv);
    }
    EXPECT_NEAR(y[r], want, 1e-5 * mag + 1e-38) << "row " << r;
  }
}

TEST(ImportNvfp4ModelOpt, HandWrittenRowMatchesTheCanonicalBytes) {
  // One row, K = 16, codes 0..15 in order: ModelOpt packs (q[1::2] << 4) | q[0::2].
  const uint8_t packed[8] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE};
  // Canonical: codes 0-15 in the low nibbles of bytes 0-15; codes 16-31 (past K) zero.
  std::vector<uint8_t> expected(128, 0);
  for (int j = 0; j < 16; ++j) expected[j] = static_cast<uint8_t>(j);
  std::vector<uint8_t> out(128, 0xA5);
  ASSERT_EQ(qmoe_import_nvfp4_modelopt(packed, 1, 16, out.data(), out.size()), QMOE_STATUS_OK);
  EXPECT_EQ(out, expected);
}

TEST(ImportNvfp4ModelOpt, RoundTripAndProductFollowModelOpt) {
  const uint32_t n = 10, k = 80, blocks = k / 16;  // K % 32 == 16: a half-filled last chunk
  std::mt19937 rng(3);
  std::vector<uint8_t> src(size_t{n} * k / 2), scales(size_t{n} * blocks);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (auto& s : scales) s = static_cast<uint8_t>(1 + rng() % 0x70);  // E4M3, subnormals too
  const float global = 0.0078125f * 1.5f;                             // weight_scale_2
  std::vector<uint8_t> codes(codes_bytes(QMOE_WEIGHT_FORMAT_NVFP4, n, k));
  ASSERT_EQ(qmoe_import_nvfp4_modelopt(src.data(), n, k, codes.data(), codes.size()),
            QMOE_STATUS_OK);
  for (uint32_t r = 0; r < n; ++r) {
    for (uint32_t i = 0; i < k / 2; ++i) {
      const uint8_t back = static_cast<uint8_t>(canonical_code(codes, r, 2 * i, k) |
                                                canonical_code(codes, r, 2 * i + 1, k) << 4);
      ASSERT_EQ(back, src[r * (k / 2) + i]) << "row " << r << " byte " << i;
    }
  }
  std::vector<float> x(3 * k);
  for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 200) - 100) / 37.0f;
  qmoe_quant_matrix w =
      fp4_matrix(QMOE_WEIGHT_FORMAT_NVFP4, n, k, codes.data(), scales.data(), blocks, 1);
  w.global_scale = global;
  qmoe_context* ctx = default_context();
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    std::vector<float> y(3 * n);
    ASSERT_EQ(qmoe_gemm(ctx, &w, level, 3, x.data(), k, y.data(), n, 0, n), QMOE_STATUS_OK);
    for (uint32_t m = 0; m < 3; ++m) {
      for (uint32_t r = 0; r < n; ++r) {
        double want = 0, mag = 0, quant = 0;
        for (uint32_t kk = 0; kk < k; ++kk) {
          const uint8_t byte = src[r * (k / 2) + kk / 2];
          const int nibble = kk % 2 == 0 ? byte & 0x0F : byte >> 4;
          const double wv =
              kModelOptE2M1Values[nibble] * e4m3_value(scales[r * blocks + kk / 16]) * global;
          want += x[m * k + kk] * wv;
          mag += std::fabs(x[m * k + kk] * wv);
          quant += 100.0 / 37.0 / 127.0 / 2.0 * std::fabs(wv);  // max|x| / 127 / 2 per chunk
        }
        const double tol = level == QMOE_ACCURACY_EXACT ? 1e-5 * mag : quant + 1e-5 * (mag + quant);
        EXPECT_NEAR(y[m * n + r], want, tol + 1e-30) << "m " << m << " row " << r;
      }
    }
  }
  qmoe_context_destroy(ctx);
}

TEST(ImportFp4, BadInputGetsAStatusAndWritesNothing) {
  uint8_t src[256] = {};
  std::vector<uint8_t> dst(256, 0xA5);
  uint8_t scales[8];
  std::fill(std::begin(scales), std::end(scales), uint8_t{0xA5});
  // NULLs, short destinations, K not a multiple of the format's block, N or K out of range.
  EXPECT_EQ(qmoe_import_mxfp4_gpt_oss(nullptr, 1, 32, dst.data(), dst.size()),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_mxfp4_gpt_oss(src, 1, 32, nullptr, 128), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_mxfp4_gpt_oss(src, 1, 32, dst.data(), 127), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("mxfp4"), std::string::npos);
  EXPECT_EQ(qmoe_import_mxfp4_gpt_oss(src, 1, 16, dst.data(), dst.size()),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_mxfp4_gpt_oss(src, 0, 32, dst.data(), dst.size()),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_mxfp4_gpt_oss(src, QMOE_MAX_MATRIX_DIM + 1, 32, dst.data(), SIZE_MAX),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_nvfp4_modelopt(src, 1, 8, dst.data(), dst.size()),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_nvfp4_modelopt(src, 1, 16, nullptr, 128), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_nvfp4_modelopt(nullptr, 1, 16, dst.data(), 128),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_nvfp4_modelopt(src, 9, 16, dst.data(), 128), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_mxfp4_ggml(src, 1, 48, dst.data(), dst.size(), scales, 1, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_mxfp4_ggml(src, 1, 32, dst.data(), dst.size(), nullptr, 1, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_mxfp4_ggml(nullptr, 1, 32, dst.data(), dst.size(), scales, 1, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_mxfp4_ggml(src, 2, 64, dst.data(), dst.size(), scales, 0, 0),
            QMOE_STATUS_INVALID_ARGUMENT);
  // Overlaps: in place would read bytes already cleared.
  std::vector<uint8_t> both(512, 0x5A);
  EXPECT_EQ(qmoe_import_mxfp4_gpt_oss(both.data(), 1, 32, both.data(), 256),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_nvfp4_modelopt(both.data() + 100, 1, 32, both.data(), 128),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_mxfp4_ggml(both.data(), 1, 32, both.data() + 4, 256, scales, 1, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_import_mxfp4_ggml(src, 1, 32, dst.data(), dst.size(), dst.data() + 3, 1, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(both, std::vector<uint8_t>(512, 0x5A));
  // ggml e = 0xFF: a finite scale to ggml, NaN in E8M0; refused, naming the block, before any
  // byte is written.
  uint8_t nan_blocks[2 * 17] = {};
  nan_blocks[0] = 127;
  nan_blocks[17] = 0xFF;
  EXPECT_EQ(qmoe_import_mxfp4_ggml(nan_blocks, 1, 64, dst.data(), dst.size(), scales, 1, 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("block 1"), std::string::npos)
      << qmoe_last_error_message();
  EXPECT_EQ(dst, std::vector<uint8_t>(256, 0xA5));
  for (uint8_t v : scales) EXPECT_EQ(v, 0xA5);
  // Disjoint buffers work.
  nan_blocks[17] = 0xFE;
  EXPECT_EQ(qmoe_import_mxfp4_ggml(nan_blocks, 1, 64, dst.data(), dst.size(), scales, 1, 1),
            QMOE_STATUS_OK);
  EXPECT_EQ(scales[1], 0xFE);
}

}  // namespace
}  // namespace qmoe::testing
