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

TEST(FormatTraits, Fp4Rows) {
  const FormatTraits* mxfp4 = find_format(QMOE_WEIGHT_FORMAT_MXFP4);
  const FormatTraits* nvfp4 = find_format(QMOE_WEIGHT_FORMAT_NVFP4);
  ASSERT_NE(mxfp4, nullptr);
  ASSERT_NE(nvfp4, nullptr);
  EXPECT_STREQ(mxfp4->name, "mxfp4");
  EXPECT_STREQ(nvfp4->name, "nvfp4");
  for (const FormatTraits* f : {mxfp4, nvfp4}) {
    EXPECT_EQ(f->code_bits, 4u);
    EXPECT_EQ(tile_bytes(*f), 128u);  // the INT4 nibble tiles
    EXPECT_FALSE(f->zero_points);
    for (int32_t d : {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16}) {
      EXPECT_FALSE(format_accepts_scale_dtype(*f, d)) << f->name << " " << d;
    }
  }
  EXPECT_FALSE(mxfp4->global_scale);
  EXPECT_TRUE(nvfp4->global_scale);
  EXPECT_TRUE(format_accepts_scale_dtype(*mxfp4, QMOE_DTYPE_E8M0));
  EXPECT_FALSE(format_accepts_scale_dtype(*mxfp4, QMOE_DTYPE_F8_E4M3));
  EXPECT_TRUE(format_accepts_scale_dtype(*nvfp4, QMOE_DTYPE_F8_E4M3));
  EXPECT_FALSE(format_accepts_scale_dtype(*nvfp4, QMOE_DTYPE_E8M0));
  for (uint32_t b : {16u, 32u, 64u, 128u}) {
    EXPECT_EQ(format_accepts_block_size(*mxfp4, b), b == 32) << b;
    EXPECT_EQ(format_accepts_block_size(*nvfp4, b), b == 16) << b;
  }
  size_t bytes = 0;
  ASSERT_EQ(qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_MXFP4, 9, 48, &bytes), QMOE_STATUS_OK);
  EXPECT_EQ(bytes, 2u * 2u * 128u);
}

TEST(FormatTraits, UnknownValuesHaveNoRow) {
  for (int32_t f : {0, 5, 6, -1, 0x7FFFFFFF}) EXPECT_EQ(find_format(f), nullptr) << f;
}

// The slots are row positions, not value - 1: a value without a row (INT3, 2, in a build
// without it) leaves no hole in the tables, and the rows above it keep dense slots.
TEST(FormatTraits, SlotsAreRowPositions) {
  const uint32_t int3_rows = find_format(QMOE_WEIGHT_FORMAT_INT3) != nullptr ? 1u : 0u;
  EXPECT_EQ(format_slot(QMOE_WEIGHT_FORMAT_INT4), 0u);
  if (int3_rows != 0) {
    EXPECT_EQ(format_slot(QMOE_WEIGHT_FORMAT_INT3), 1u);
  }
  EXPECT_EQ(format_slot(QMOE_WEIGHT_FORMAT_MXFP4),
            format_slot(QMOE_WEIGHT_FORMAT_INT4) + 1 + int3_rows);
  EXPECT_EQ(format_slot(QMOE_WEIGHT_FORMAT_NVFP4), format_slot(QMOE_WEIGHT_FORMAT_MXFP4) + 1);
  for (int32_t f : {5, 1000}) {
    EXPECT_EQ(format_slot(static_cast<qmoe_weight_format>(f)), format_count()) << f;
  }
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
