// The ggml Q4_0 importer's second and third guards (beside tests/formats/import_int4_test.cc):
// rows of several blocks, each block with its own scale and codes, checked byte by byte
// against the canonical layout formula of docs/formats.md; and imported rows multiplied on
// every tier and thread configuration against an FP64 product computed straight from the ggml
// bytes. A block read from, or written to, its neighbour's place fails both.
#include <gtest/gtest.h>

#include <fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "qmoe/qmoe.h"
#include "tests/cpu/isa_test_util.h"
#include "tests/formats/q4_0_matrix.h"
#include "tests/gemm/int4_reference.h"
#include "tests/threaded_runs.h"

namespace qmoe::testing {
namespace {

constexpr size_t kBlockBytes = 18;  // block_q4_0: FP16 d, then 16 bytes of codes

// Q4_0 rows whose every block differs: block (r, b) has scale bits 0x2800 + 37 * (r * blocks +
// b) modulo 0x1400 (normal FP16 values from 2^-5 to 1) and random code bytes.
std::vector<uint8_t> distinct_blocks(uint32_t n, uint32_t blocks, std::mt19937_64& rng) {
  std::vector<uint8_t> q40(size_t{n} * blocks * kBlockBytes);
  for (uint32_t i = 0; i < n * blocks; ++i) {
    uint8_t* block = q40.data() + size_t{i} * kBlockBytes;
    const auto d = static_cast<uint16_t>(0x2800 + (37 * i) % 0x1400);
    std::memcpy(block, &d, 2);
    for (size_t j = 2; j < kBlockBytes; ++j) block[j] = static_cast<uint8_t>(rng());
  }
  return q40;
}

// Code k of row r from the ggml bytes: byte k % 16 of its block, low nibble for k % 32 < 16.
int ggml_code(const std::vector<uint8_t>& q40, uint32_t blocks, uint32_t r, uint32_t k) {
  const uint8_t byte = q40[(size_t{r} * blocks + k / 32) * kBlockBytes + 2 + k % 16];
  return k % 32 < 16 ? byte & 0x0F : byte >> 4;
}

uint16_t ggml_scale(const std::vector<uint8_t>& q40, uint32_t blocks, uint32_t r, uint32_t b) {
  uint16_t d;
  std::memcpy(&d, q40.data() + (size_t{r} * blocks + b) * kBlockBytes, 2);
  return d;
}

TEST(ImportInt4Q4_0, EveryBlockOfSeveralRowsLandsInItsTileAndScaleSlot) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (const auto& [n, blocks] : {std::pair<uint32_t, uint32_t>{1, 3}, {2, 3}, {9, 2}, {17, 5}}) {
    const uint32_t k = blocks * 32;
    const std::vector<uint8_t> q40 = distinct_blocks(n, blocks, rng);
    size_t bytes = 0;
    ASSERT_EQ(qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT4, n, k, &bytes), QMOE_STATUS_OK);
    std::vector<uint8_t> codes(bytes, 0xA5);
    // Scales in a padded row-major plane: row stride blocks + 1, so a slot off by one block
    // lands on a poisoned gap or the wrong block.
    const size_t row_stride = blocks + 1;
    std::vector<uint16_t> scales(n * row_stride, 0xBEEF);
    ASSERT_EQ(
        qmoe_import_int4_q4_0(q40.data(), n, k, codes.data(), bytes, scales.data(), row_stride, 1),
        QMOE_STATUS_OK)
        << qmoe_last_error_message();
    const std::string where = "n=" + std::to_string(n) + " blocks=" + std::to_string(blocks) +
                              " seed=" + std::to_string(seed);
    std::vector<uint8_t> expected(bytes, 0);  // padding rows are zero
    for (uint32_t r = 0; r < n; ++r) {
      for (uint32_t kk = 0; kk < k; ++kk) {
        const int c = ggml_code(q40, blocks, r, kk);
        expected[canonical_byte(r, kk, k)] |= static_cast<uint8_t>(kk % 32 < 16 ? c : c << 4);
      }
      for (uint32_t b = 0; b < blocks; ++b) {
        EXPECT_EQ(scales[r * row_stride + b], ggml_scale(q40, blocks, r, b))
            << where << ": scale of row " << r << " block " << b;
      }
      EXPECT_EQ(scales[r * row_stride + blocks], 0xBEEF) << where << ": the gap after row " << r;
    }
    for (size_t i = 0; i < bytes; ++i) {
      ASSERT_EQ(codes[i], expected[i])
          << where << ": canonical byte " << i << " (group " << i / 128 / ((k + 31) / 32)
          << ", chunk " << i / 128 % ((k + 31) / 32) << ", row " << i % 128 / 16 << ")";
    }
  }
}

class ImportQ4_0Gemm : public IsaTest {};

// Imported Q4_0 weights through qmoe_gemm (exact) on the tier, in every thread configuration,
// against sum_k x_k * (q - 8) * d from the ggml bytes in FP64, within the exact level's bound.
TEST_P(ImportQ4_0Gemm, MultiplyMatchesTheGgmlBytes) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  ThreadedRuns runs(GetParam());
  for (const auto& [n, blocks, m] :
       {std::tuple<uint32_t, uint32_t, uint32_t>{13, 4, 1}, {40, 7, 3}, {64, 16, 2}}) {
    const uint32_t k = blocks * 32;
    const std::vector<uint8_t> q40 = distinct_blocks(n, blocks, rng);
    ImportedQ4_0 imported;
    ASSERT_EQ(import_q4_0_matrix(q40, n, k, &imported), QMOE_STATUS_OK);
    const qmoe_quant_matrix& w = imported.matrix;
    const std::vector<float> x = random_activations(m, k, rng);
    const std::string where = std::string(isa_name(GetParam())) + " n=" + std::to_string(n) +
                              " blocks=" + std::to_string(blocks) + " m=" + std::to_string(m) +
                              " seed=" + std::to_string(seed);
    for (const ThreadedRun& run : runs.runs()) {
      std::vector<float> y(size_t{m} * n, -1.0f);
      ASSERT_EQ(qmoe_gemm(run.ctx, &w, QMOE_ACCURACY_EXACT, m, x.data(), k, y.data(), n, 0, n),
                QMOE_STATUS_OK)
          << qmoe_last_error_message();
      int reported = 0;
      for (uint32_t i = 0; i < m; ++i) {
        for (uint32_t r = 0; r < n; ++r) {
          double want = 0, magnitude = 0;
          for (uint32_t kk = 0; kk < k; ++kk) {
            const double d = fp16_ieee_to_fp32_value(ggml_scale(q40, blocks, r, kk / 32));
            const double wv = (ggml_code(q40, blocks, r, kk) - 8) * d;
            want += x[size_t{i} * k + kk] * wv;
            magnitude += std::fabs(x[size_t{i} * k + kk] * wv);
          }
          const float got = y[size_t{i} * n + r];
          if (!(std::fabs(got - want) <= 1e-5 * magnitude + 1e-30) && reported++ < 3) {
            ADD_FAILURE() << where << " on " << run.label << ": y[" << i << "," << r
                          << "] = " << got << ", from the ggml bytes " << want;
          }
        }
      }
    }
  }
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(ImportQ4_0Gemm);

}  // namespace
}  // namespace qmoe::testing
