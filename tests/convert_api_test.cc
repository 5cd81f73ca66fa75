// The conversion entry points of the C ABI: argument checks, and that splitting a row over
// threads gives exactly the single-threaded kernel's result on every tier.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tests/cpu/isa_test_util.h"

namespace {

using qmoe::Isa;
using qmoe::testing::ContextPtr;
using qmoe::testing::make_context;

TEST(ConvertApi, BadInputGetsAStatus) {
  ContextPtr ctx = make_context(qmoe::default_isa(), 1);
  std::vector<float> f(16, 1.0f);
  std::vector<uint16_t> h(16, 0x3C00);
  EXPECT_EQ(qmoe_convert_f16_to_f32(nullptr, h.data(), f.data(), 16), QMOE_STATUS_INVALID_CONTEXT);
  EXPECT_EQ(qmoe_convert_f16_to_f32(ctx.get(), nullptr, f.data(), 16),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("qmoe_convert_f16_to_f32: src is NULL"),
            std::string::npos)
      << qmoe_last_error_message();
  EXPECT_EQ(qmoe_convert_f32_to_f16(ctx.get(), f.data(), nullptr, 16),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_convert_bf16_to_f32(ctx.get(), nullptr, nullptr, 3), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_convert_f32_to_bf16(nullptr, f.data(), h.data(), 16), QMOE_STATUS_INVALID_CONTEXT);
  // n == 0 is a no-op whatever the pointers.
  EXPECT_EQ(qmoe_convert_f32_to_bf16(ctx.get(), nullptr, nullptr, 0), QMOE_STATUS_OK);
  // Sizes whose byte count overflows are rejected before any access.
  EXPECT_EQ(qmoe_convert_f16_to_f32(ctx.get(), h.data(), f.data(), SIZE_MAX / 2),
            QMOE_STATUS_INVALID_ARGUMENT);
  // Overlapping source and destination.
  auto* bytes = reinterpret_cast<uint16_t*>(f.data());
  EXPECT_EQ(qmoe_convert_f16_to_f32(ctx.get(), bytes + 2, f.data(), 8),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("overlap"), std::string::npos);
  EXPECT_EQ(f[0], 1.0f);  // nothing written on failure
}

class ConvertApiThreads : public qmoe::testing::IsaTest {};

// Long rows are split into chunks; the result must not depend on the thread count, and the
// chunk boundaries must not drop or duplicate elements. Sizes straddle the split threshold.
TEST_P(ConvertApiThreads, SplitRowsEqualOneThread) {
  const uint64_t seed = qmoe::testing::fresh_seed();
  std::mt19937_64 rng(seed);
  ContextPtr one = make_context(GetParam(), 1);
  ContextPtr many = make_context(GetParam(), 3);
  for (size_t n : {size_t{1}, size_t{65535}, size_t{65536}, size_t{65537}, size_t{300001}}) {
    std::vector<uint32_t> bits(n);
    for (auto& b : bits) b = static_cast<uint32_t>(rng());
    std::vector<float> f32(n);
    std::memcpy(f32.data(), bits.data(), n * 4);
    std::vector<uint16_t> h16(n);
    for (size_t i = 0; i < n; ++i) h16[i] = static_cast<uint16_t>(bits[i]);

    std::vector<uint16_t> a16(n), b16(n);
    std::vector<float> a32(n), b32(n);
    ASSERT_EQ(qmoe_convert_f32_to_f16(one.get(), f32.data(), a16.data(), n), QMOE_STATUS_OK);
    ASSERT_EQ(qmoe_convert_f32_to_f16(many.get(), f32.data(), b16.data(), n), QMOE_STATUS_OK);
    ASSERT_EQ(a16, b16) << "f32->f16 n=" << n << " seed=" << seed;
    ASSERT_EQ(qmoe_convert_f32_to_bf16(one.get(), f32.data(), a16.data(), n), QMOE_STATUS_OK);
    ASSERT_EQ(qmoe_convert_f32_to_bf16(many.get(), f32.data(), b16.data(), n), QMOE_STATUS_OK);
    ASSERT_EQ(a16, b16) << "f32->bf16 n=" << n << " seed=" << seed;
    ASSERT_EQ(qmoe_convert_f16_to_f32(one.get(), h16.data(), a32.data(), n), QMOE_STATUS_OK);
    ASSERT_EQ(qmoe_convert_f16_to_f32(many.get(), h16.data(), b32.data(), n), QMOE_STATUS_OK);
    ASSERT_EQ(std::memcmp(a32.data(), b32.data(), n * 4), 0) << "f16->f32 n=" << n;
    ASSERT_EQ(qmoe_convert_bf16_to_f32(one.get(), h16.data(), a32.data(), n), QMOE_STATUS_OK);
    ASSERT_EQ(qmoe_convert_bf16_to_f32(many.get(), h16.data(), b32.data(), n), QMOE_STATUS_OK);
    ASSERT_EQ(std::memcmp(a32.data(), b32.data(), n * 4), 0) << "bf16->f32 n=" << n;
    // And the ABI result is the tier's kernel result.
    std::vector<uint16_t> direct(n);
    table().convert_f32_to_bf16.fn(f32.data(), direct.data(), n);
    ASSERT_EQ(direct, b16) << "n=" << n;
  }
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(ConvertApiThreads);

}  // namespace
