// qmoe_group_plane and qmoe_grouped_plane_elements: every element lands where docs/formats.md
// says, padding is zero, a matrix described with the regrouped planes gives the same bits as
// with the originals, and bad input gets a status.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lib/dispatch.h"
#include "tests/cpu/isa_test_util.h"
#include "tests/gemm/int4_reference.h"

namespace qmoe::testing {
namespace {

struct PlaneOrder {
  const char* name;
  size_t row_stride, block_stride;  // in elements
};

TEST(GroupedPlane, EveryElementLandsInItsGroupSlot) {
  for (size_t element : {size_t{1}, size_t{2}, size_t{4}}) {
    for (uint32_t n : {1u, 7u, 8u, 13u, 24u}) {
      for (uint32_t blocks : {1u, 3u, 64u}) {
        const PlaneOrder orders[] = {
            {"row-major", blocks, 1}, {"block-major", 1, n}, {"padded row-major", blocks + 3, 1}};
        for (const PlaneOrder& order : orders) {
          SCOPED_TRACE(std::string(order.name) + " element " + std::to_string(element) + " n " +
                       std::to_string(n) + " blocks " + std::to_string(blocks));
          const size_t src_elements =
              (n - 1) * order.row_stride + (blocks - 1) * order.block_stride + 1;
          // Element (r, b) holds the bytes of r * 1000 + b + 1 (never 0), so a misplaced or
          // missing copy cannot look right.
          std::vector<unsigned char> src(src_elements * element, 0xEE);
          auto value = [&](uint32_t r, uint32_t b) { return uint32_t{r * 1000u + b + 1u}; };
          for (uint32_t r = 0; r < n; ++r) {
            for (uint32_t b = 0; b < blocks; ++b) {
              const uint32_t v = value(r, b);
              std::memcpy(&src[(r * order.row_stride + b * order.block_stride) * element], &v,
                          element);
            }
          }
          const size_t count = qmoe_grouped_plane_elements(n, blocks);
          ASSERT_EQ(count, size_t{(n + 7) / 8 * 8} * blocks);
          std::vector<unsigned char> dst(count * element + 16, 0xA5);
          ASSERT_EQ(qmoe_group_plane(src.data(), n, blocks, element, order.row_stride,
                                     order.block_stride, dst.data(), count * element),
                    QMOE_STATUS_OK)
              << qmoe_last_error_message();
          for (uint32_t r = 0; r < (n + 7) / 8 * 8; ++r) {
            for (uint32_t b = 0; b < blocks; ++b) {
              uint32_t got = 0, want = r < n ? value(r, b) : 0;
              std::memcpy(&got, &dst[((r / 8) * 8 * blocks + b * 8 + r % 8) * element], element);
              if (element < 4) want &= (1u << (8 * element)) - 1;
              ASSERT_EQ(got, want) << "row " << r << " block " << b;
            }
          }
          for (size_t i = count * element; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xA5);
        }
      }
    }
  }
}

// A matrix with row-major FP16 scales and zero points, and the same matrix with both planes
// regrouped: the GEMM must not see a difference at either level.
TEST(GroupedPlane, RegroupedPlanesGiveTheSameBits) {
  std::mt19937_64 rng(7);
  Int4Options o{37, 256, 32, QMOE_DTYPE_F16, ScaleOrder::kRowMajor, true, ScaleOrder::kRowMajor};
  const Int4Matrix w = make_int4_matrix(o, rng);
  const uint32_t blocks = o.k / o.block_size, m = 3;
  std::vector<uint16_t> scales(qmoe_grouped_plane_elements(o.n, blocks));
  std::vector<uint8_t> zeros(scales.size());
  ASSERT_EQ(qmoe_group_plane(w.scales.data(), o.n, blocks, 2, blocks, 1, scales.data(),
                             scales.size() * 2),
            QMOE_STATUS_OK);
  ASSERT_EQ(
      qmoe_group_plane(w.zero_points.data(), o.n, blocks, 1, blocks, 1, zeros.data(), zeros.size()),
      QMOE_STATUS_OK);
  qmoe_quant_matrix grouped = w.desc;
  grouped.scales = scales.data();
  grouped.scale_row_stride = 1;
  grouped.scale_block_stride = 8;
  grouped.scale_group_stride = 8 * blocks;
  grouped.zero_points = zeros.data();
  grouped.zero_point_row_stride = 1;
  grouped.zero_point_block_stride = 8;
  grouped.zero_point_group_stride = 8 * blocks;

  const std::vector<float> x = random_activations(m, o.k, rng);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (isa_unavailable_reason(isa) != nullptr) continue;  // tiers the host lacks
    ContextPtr ctx = make_context(isa, 2);
    for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      std::vector<float> y0(size_t{m} * o.n, 1.0f), y1(y0.size(), 2.0f);
      ASSERT_EQ(qmoe_gemm(ctx.get(), &w.desc, level, m, x.data(), o.k, y0.data(), o.n, 0, o.n),
                QMOE_STATUS_OK);
      ASSERT_EQ(qmoe_gemm(ctx.get(), &grouped, level, m, x.data(), o.k, y1.data(), o.n, 0, o.n),
                QMOE_STATUS_OK);
      EXPECT_EQ(std::memcmp(y0.data(), y1.data(), y0.size() * sizeof(float)), 0)
          << isa_name(isa) << " level " << static_cast<int>(level);
    }
  }
}

TEST(GroupedPlane, BadInputGetsAStatusAndWritesNothing) {
  std::vector<uint16_t> src(64, 1), dst(64, 0x5555);
  auto call = [&](const void* s, uint32_t n, uint32_t blocks, size_t element, size_t rs, size_t bs,
                  void* d, size_t bytes) {
    return qmoe_group_plane(s, n, blocks, element, rs, bs, d, bytes);
  };
  EXPECT_EQ(call(nullptr, 8, 4, 2, 4, 1, dst.data(), 128), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(call(src.data(), 8, 4, 2, 4, 1, nullptr, 128), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(call(src.data(), 0, 4, 2, 4, 1, dst.data(), 128), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(call(src.data(), 8, 0, 2, 4, 1, dst.data(), 128), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(call(src.data(), 8, 4, 3, 4, 1, dst.data(), 128), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(call(src.data(), 8, 4, 2, 1, 1, dst.data(), 128), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(call(src.data(), 8, 4, 2, 4, 1, dst.data(), 63), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("dst_bytes"), std::string::npos);
  EXPECT_EQ(call(src.data(), 8, 4, 2, 4, 1, src.data() + 8, 64), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("overlap"), std::string::npos);
  // Each stride below 2^48, but (n - 1) x row stride = 2^64: the source span does not fit (the
  // copy once read wild addresses here).
  std::vector<unsigned char> wide_dst(qmoe_grouped_plane_elements((1u << 17) + 1, 1));
  EXPECT_EQ(
      call(src.data(), (1u << 17) + 1, 1, 1, size_t{1} << 47, 1, wide_dst.data(), wide_dst.size()),
      QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("address space"), std::string::npos);
  for (uint16_t v : dst) EXPECT_EQ(v, 0x5555);
  EXPECT_EQ(qmoe_grouped_plane_elements(0, 4), 0u);
  EXPECT_EQ(qmoe_grouped_plane_elements(9, 2), 32u);
}

}  // namespace
}  // namespace qmoe::testing
