// Every MXFP4 and NVFP4 kernel of the kernel list (lib/cpu/kernel_list.inc), called directly on
// 8-row groups against the scalar kernel of its format and level: each ISA's own kernel, also
// where an extension (AVX512-VNNI, AVX512-VBMI) overlays it in the tier's table and the ABI tests
// never reach it. Byte scales read in place (grouped and [K/B, N] orders) and FP32 panels, every M
// from 1 to 9, partial row ranges, bias and global scales. Extension kernels must give the bits of
// the plain kernel of their tier (the same exact integer sums, the same float epilogue).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lib/cpu/kernel_tables.h"
#include "lib/formats/byte_scales.h"
#include "lib/gemm/group_args.h"
#include "tests/cpu/isa_test_util.h"
#include "tests/gemm/fp4_reference.h"

namespace qmoe::testing {
namespace {

constexpr float kPoison = -12345.678f;

// One 8-row group's inputs and their decoded values.
struct Group {
  qmoe_weight_format format;
  uint32_t chunks, blocks, rows;
  std::vector<uint8_t> codes;  // chunks * 128
  std::vector<uint8_t> bytes;  // scale bytes, [block][8] (block stride 8) or [block][stride]
  size_t byte_stride;          // elements between blocks of the byte plane
  std::vector<float> panel;    // FP32 panel [block][8] as the driver builds it
  std::vector<double> weight;  // [8][chunks * 32], decoded (0 past K and past the rows)
  std::vector<float> bias;     // 8
  float global_scale;
};

Group make_group(qmoe_weight_format format, uint32_t k, uint32_t rows, size_t byte_stride,
                 std::mt19937_64& rng) {
  Group g;
  g.format = format;
  g.chunks = (k + 31) / 32;
  const uint32_t block = fp4_block_size(format);
  g.blocks = k / block;
  g.rows = rows;
  g.byte_stride = byte_stride;
  g.codes.assign(size_t{g.chunks} * 128, 0);
  g.weight.assign(size_t{8} * g.chunks * 32, 0.0);
  const uint32_t panel_blocks = g.chunks * 32 / block;
  g.bytes.assign(size_t{panel_blocks} * byte_stride, 0xEE);
  g.panel.assign(size_t{panel_blocks} * 8, 0.0f);  // rows past `rows`, blocks past K: scale 0
  g.global_scale = format == QMOE_WEIGHT_FORMAT_NVFP4 ? 0.0123f : 1.0f;
  for (uint32_t r = 0; r < rows; ++r) {
    for (uint32_t b = 0; b < g.blocks; ++b) {
      uint8_t byte = format == QMOE_WEIGHT_FORMAT_MXFP4 ? static_cast<uint8_t>(118 + rng() % 14)
                                                        : static_cast<uint8_t>(1 + rng() % 0x7D);
      if (format == QMOE_WEIGHT_FORMAT_NVFP4 && rng() % 8 == 0) byte |= 0x80;
      g.bytes[b * byte_stride + r] = byte;
      const uint32_t bits = (format == QMOE_WEIGHT_FORMAT_MXFP4 ? kE8M0Bits : kE4M3Bits).bits[byte];
      std::memcpy(&g.panel[b * 8 + r], &bits, 4);
      const double scale = format == QMOE_WEIGHT_FORMAT_MXFP4 ? e8m0_value(byte) : e4m3_value(byte);
      for (uint32_t j = 0; j < block; ++j) {
        const uint32_t kk = b * block + j;
        const uint8_t code = static_cast<uint8_t>(rng() % 16);
        uint8_t& dst = g.codes[(kk / 32) * 128 + r * 16 + kk % 16];
        dst |= kk % 32 < 16 ? code : static_cast<uint8_t>(code << 4);
        g.weight[size_t{r} * g.chunks * 32 + kk] = e2m1_value(code) * scale * g.global_scale;
      }
    }
  }
  g.bias.resize(8);
  for (float& v : g.bias) v = static_cast<float>(static_cast<int>(rng() % 100) - 50) / 25.0f;
  return g;
}

struct Run {
  std::vector<float> y;  // [m][8]
};

// Runs `kernel` on the group for activation rows x ([m][chunks * 32], zero past K).
std::vector<float> run(GemmGroupFn kernel, const Group& g, qmoe_accuracy level, bool panel,
                       const std::vector<float>& x, uint32_t m, uint32_t row_begin,
                       uint32_t row_end) {
  const size_t stride = size_t{g.chunks} * 32;
  std::vector<int8_t> q(m * stride);
  std::vector<float> scale(size_t{m} * g.chunks), sum_q(size_t{m} * g.chunks);
  for (uint32_t i = 0; i < m; ++i) {
    scalar_kernels().quantize_activations_q8.fn(x.data() + i * stride, stride,
                                                q.data() + i * stride, scale.data() + i * g.chunks,
                                                sum_q.data() + i * g.chunks);
  }
  // Each half chunk's -12 sum q (Q8Activations::e2m1_start), added up here.
  std::vector<int32_t> e2m1_start(size_t{m} * g.chunks * 2);
  for (size_t c = 0; c < size_t{m} * g.chunks; ++c) {
    for (size_t half = 0; half < 2; ++half) {
      int32_t sum = 0;
      for (size_t j = 0; j < 16; ++j) sum += q[c * 32 + half * 16 + j];
      e2m1_start[2 * c + half] = -12 * sum;
    }
  }
  GemmGroupArgs a{};
  a.codes = g.codes.data();
  a.chunks = g.chunks;
  a.block_size = fp4_block_size(g.format);
  if (panel) {
    a.scale_dtype = QMOE_DTYPE_F32;
    a.scales = g.panel.data();
    a.scale_block_stride = 8;
  } else {
    a.scale_dtype = fp4_scale_dtype(g.format);
    a.scales = g.bytes.data();
    a.scale_block_stride = g.byte_stride;
  }
  a.bias = g.bias.data();
  a.global_scale = g.global_scale;
  a.m = m;
  a.x = x.data();
  a.ldx = stride;
  a.xq = Q8Activations{q.data(), scale.data(), sum_q.data(), stride, g.chunks, e2m1_start.data()};
  std::vector<float> y(size_t{m} * 8, kPoison);
  a.y = y.data();
  a.ldy = 8;
  a.row_begin = row_begin;
  a.row_end = row_end;
  kernel(a);
  return y;
}

class GemmFp4Kernels : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GemmFp4Kernels, MatchScalarOnEveryPathOfTheGroup) {
  const CpuKernelInfo& info = cpu_kernel_at(GetParam());
  if (const char* reason = cpu_isa_unavailable_reason(info.isa)) {
    GTEST_SKIP() << info.name << " skipped: " << reason;
  }
  const GemmGroupFn kernel =
      gemm_kernel(*cpu_isa_info(info.isa).table, info.format, info.accuracy).fn;
  const GemmGroupFn scalar = gemm_kernel(scalar_kernels(), info.format, info.accuracy).fn;
  ASSERT_NE(kernel, nullptr);
  // The plain kernel of an extension's tier, which the extension must match bit for bit.
  GemmGroupFn plain = nullptr;
  if (cpu_isa_info(info.isa).feature != 0) {
    for (uint32_t i = 0; i < kCpuIsaCount; ++i) {
      const CpuIsaInfo& base = cpu_isa_info(static_cast<CpuIsa>(i));
      if (base.tier == cpu_isa_info(info.isa).tier && base.feature == 0) {
        plain = gemm_kernel(*base.table, info.format, info.accuracy).fn;
      }
    }
  }
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const uint32_t block = fp4_block_size(info.format);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint32_t blocks : {1u, 2u, 3u, 7u, 16u}) {
    const uint32_t k = block * blocks;
    for (bool panel : {false, true}) {
      // In place only where the driver reads in place: whole chunks (K % 32 == 0).
      if (!panel && k % 32 != 0) continue;
      for (size_t byte_stride : {size_t{8}, size_t{13}}) {
        if (panel && byte_stride != 8) continue;
        for (uint32_t m = 1; m <= 9; ++m) {
          const uint32_t rows = panel ? 1 + static_cast<uint32_t>(rng() % 8) : 8;
          const uint32_t row_begin = static_cast<uint32_t>(rng() % rows);
          const uint32_t row_end =
              row_begin + 1 + static_cast<uint32_t>(rng() % (rows - row_begin));
          const Group g = make_group(info.format, k, rows, byte_stride, rng);
          std::vector<float> x(size_t{m} * g.chunks * 32, 0.0f);
          for (uint32_t i = 0; i < m; ++i) {
            for (uint32_t kk = 0; kk < k; ++kk) x[size_t{i} * g.chunks * 32 + kk] = normal(rng);
          }
          const std::vector<float> got =
              run(kernel, g, info.accuracy, panel, x, m, row_begin, row_end);
          const std::vector<float> want =
              run(scalar, g, info.accuracy, panel, x, m, row_begin, row_end);
          std::vector<float> plain_y;
          if (plain != nullptr)
            plain_y = run(plain, g, info.accuracy, panel, x, m, row_begin, row_end);
          const std::string where =
              std::string(info.name) + " k=" + std::to_string(k) +
              (panel ? " panel" : " in place, block stride " + std::to_string(byte_stride)) +
              " m=" + std::to_string(m) + " rows [" + std::to_string(row_begin) + "," +
              std::to_string(row_end) + ") seed=" + std::to_string(seed);
          for (uint32_t i = 0; i < m; ++i) {
            for (uint32_t r = 0; r < 8; ++r) {
              const size_t o = size_t{i} * 8 + r;
              if (r < row_begin || r >= row_end) {
                ASSERT_EQ(std::memcmp(&got[o], &kPoison, 4), 0) << where << ": wrote row " << r;
                continue;
              }
              // Both kernels sum the same exact integers (fast) or the same products (exact);
              // they differ by FP32 rounding only: 2e-5 of sum |x w|, and the output's rounding.
              double abs_sum = 0;
              for (uint32_t kk = 0; kk < k; ++kk) {
                abs_sum += std::fabs(x[size_t{i} * g.chunks * 32 + kk] *
                                     g.weight[size_t{r} * g.chunks * 32 + kk]);
              }
              const double tol = 2e-5 * abs_sum + 0x1p-22 * std::fabs(want[o]) + 1e-30;
              ASSERT_NEAR(got[o], want[o], tol) << where << ": y[" << i << "," << r << "]";
              if (plain != nullptr) {
                ASSERT_EQ(std::memcmp(&got[o], &plain_y[o], 4), 0)
                    << where << ": y[" << i << "," << r << "] = " << got[o]
                    << ", the tier's plain kernel " << plain_y[o];
              }
            }
          }
        }
      }
    }
  }
}

std::vector<uint32_t> fp4_kernel_rows() {
  std::vector<uint32_t> rows;
  for (uint32_t i = 0; i < cpu_kernel_count(); ++i) {
    const CpuKernelInfo& info = cpu_kernel_at(i);
    if (info.format == QMOE_WEIGHT_FORMAT_MXFP4 || info.format == QMOE_WEIGHT_FORMAT_NVFP4) {
      rows.push_back(i);
    }
  }
  return rows;
}

INSTANTIATE_TEST_SUITE_P(Kernel, GemmFp4Kernels, ::testing::ValuesIn(fp4_kernel_rows()),
                         [](const ::testing::TestParamInfo<uint32_t>& row) {
                           std::string name = cpu_kernel_at(row.param).name;
                           return name.substr(std::string("qmoe_gemm_").size());
                         });

}  // namespace
}  // namespace qmoe::testing
