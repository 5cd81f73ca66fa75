// Per-task scratch of the GEMM driver (lib/gemm/gemm_rows.h): a group panel of FP32 scales, zero
// points and 16-bit staging is built only for groups that cannot read the caller's planes in
// place, so a plan whose groups all can needs none. Reserving it anyway cost 56 bytes per block
// of 8 rows and task: at K = 2^31 with block 16 about 7 GiB per task, and the call failed with
// QMOE_STATUS_OUT_OF_MEMORY for planes it would never have copied (found by review).
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <random>

#include "lib/gemm/gemm_plan.h"
#include "tests/gemm/int4_reference.h"

namespace qmoe::testing {
namespace {

// Zero points (when `zero_points`) in `zero_point_order`, the scales' order unless given.
size_t scratch_for(uint32_t n, uint32_t k, uint32_t block, ScaleOrder order, bool zero_points,
                   std::optional<ScaleOrder> zero_point_order = std::nullopt) {
  std::mt19937_64 rng(n * 1000 + k);
  Int4Options o{n, k, block, QMOE_DTYPE_F16, order, zero_points};
  o.zero_point_order = zero_point_order.value_or(order);
  const Int4Matrix w = make_int4_matrix(o, rng);
  GemmPlan plan;
  EXPECT_EQ(make_gemm_plan(&w.desc, "test", &plan), QMOE_STATUS_OK);
  return gemm_row_scratch_bytes(plan);
}

TEST(GemmScratch, PlanesReadInPlaceNeedNone) {
  // [K/block, N] and the grouped order (row stride 1), full groups, K a multiple of 32.
  EXPECT_EQ(scratch_for(64, 256, 32, ScaleOrder::kBlockMajor, false), 0u);
  EXPECT_EQ(scratch_for(64, 256, 16, ScaleOrder::kGrouped, false), 0u);
  EXPECT_EQ(scratch_for(24, 512, 128, ScaleOrder::kGrouped, true), 0u);
}

TEST(GemmScratch, PanelsWhereSomeGroupBuildsOne) {
  // Row-major scales, a partial last group, row-major zero points, K % 32 == 16.
  const size_t blocks_8_rows = 256 / 32 * 8;
  EXPECT_GE(scratch_for(64, 256, 32, ScaleOrder::kRowMajor, false), blocks_8_rows * 4);
  EXPECT_GE(scratch_for(61, 256, 32, ScaleOrder::kBlockMajor, false), blocks_8_rows * 4);
  EXPECT_GE(scratch_for(64, 256, 32, ScaleOrder::kBlockMajor, true, ScaleOrder::kRowMajor),
            blocks_8_rows * 4);
  EXPECT_GE(scratch_for(64, 48, 16, ScaleOrder::kBlockMajor, false), size_t{2} * 8 * 4);
}

}  // namespace
}  // namespace qmoe::testing
