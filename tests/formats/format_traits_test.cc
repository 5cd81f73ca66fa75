// The format traits rows (lib/formats/format_traits.h): what validation, the GEMM driver and
// the codes-size query read from them.
#include <gtest/gtest.h>

#include <cstdint>

#include "lib/formats/format_traits.h"
#include "qmoe/qmoe.h"

namespace qmoe {
namespace {

TEST(FormatTraits, Int4Row) {
  const FormatTraits* int4 = find_format(QMOE_WEIGHT_FORMAT_INT4);
  ASSERT_NE(int4, nullptr);
  EXPECT_STREQ(int4->name, "int4");
  EXPECT_EQ(int4->code_bits, 4u);
  EXPECT_EQ(int4->tile_row_bytes, 16u);
  EXPECT_EQ(tile_bytes(*int4), 128u);
  EXPECT_TRUE(int4->zero_points);
  EXPECT_EQ(int4->default_zero_point, 8u);
  for (uint32_t b : {16u, 32u, 64u, 128u}) EXPECT_TRUE(format_accepts_block_size(*int4, b)) << b;
  for (uint32_t b : {0u, 1u, 8u, 24u, 48u, 256u, 0x80000000u, 0xFFFFFFFFu}) {
    EXPECT_FALSE(format_accepts_block_size(*int4, b)) << b;
  }
  for (int32_t d : {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16}) {
    EXPECT_TRUE(format_accepts_scale_dtype(*int4, d)) << d;
  }
  for (int32_t d : {0, 4, 31, 32, -1, 1000})
    EXPECT_FALSE(format_accepts_scale_dtype(*int4, d)) << d;
}

TEST(FormatTraits, UnknownValuesHaveNoRow) {
  for (int32_t f : {0, 5, 6, -1, 0x7FFFFFFF}) EXPECT_EQ(find_format(f), nullptr) << f;
}

TEST(FormatTraits, RowsAreInValueOrder) {
  ASSERT_GE(format_count(), 1u);
  for (uint32_t i = 0; i < format_count(); ++i) {
    EXPECT_EQ(format_slot(format_at(i).format), i);
    EXPECT_EQ(find_format(format_at(i).format), &format_at(i));
    EXPECT_EQ(format_at(i).tile_row_bytes, format_at(i).code_bits * 4) << format_at(i).name;
  }
}

// The ABI's codes size is the traits' tile count times the tile bytes, padding included.
TEST(FormatTraits, CodesSizeCountsWholeTiles) {
  const FormatTraits& int4 = *find_format(QMOE_WEIGHT_FORMAT_INT4);
  const struct {
    uint32_t n, k;
    size_t bytes;
  } cases[] = {{1, 16, 128},
               {8, 32, 128},
               {9, 32, 256},
               {8, 48, 256},
               {1536, 2048, 1536 / 8 * 64 * 128},
               {0x80000000u, 0x80000000u, size_t{1} << 61}};
  for (const auto& c : cases) {
    EXPECT_EQ(codes_size(int4, c.n, c.k), c.bytes) << c.n << " x " << c.k;
    size_t abi = 0;
    ASSERT_EQ(qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT4, c.n, c.k, &abi),
              QMOE_STATUS_OK);
    EXPECT_EQ(abi, c.bytes);
  }
  size_t bytes = 7;
  EXPECT_EQ(qmoe_quant_matrix_codes_size(static_cast<qmoe_weight_format>(5), 8, 32, &bytes),
            QMOE_STATUS_UNSUPPORTED_FORMAT);
  EXPECT_EQ(bytes, 7u);
}

}  // namespace
}  // namespace qmoe
