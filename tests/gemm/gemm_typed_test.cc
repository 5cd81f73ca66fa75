// qmoe_gemm_typed: X and Y in FP32, FP16 or BF16. Per tier, level and dtype pair, the typed call
// must give exactly the bits of the FP32 path wrapped in the library's conversions (widen X,
// qmoe_gemm, round the written columns of Y), on 1 and 3 threads, write only its columns (poison
// and guard words), and read X as its own dtype: a BF16 X read as FP16 (or the reverse), or a Y
// rounded to the other 16-bit type, gives other bits and fails the comparison.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/activation_dtype_util.h"
#include "tests/cpu/isa_test_util.h"
#include "tests/gemm/int4_reference.h"

namespace qmoe::testing {
namespace {

struct TypedCase {
  Int4Options w;
  uint32_t m, n_begin, n_end;
};

class GemmTyped : public IsaTest {
 protected:
  void run_case(const TypedCase& c, qmoe_accuracy level, qmoe_dtype xd, qmoe_dtype yd,
                uint32_t threads, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const Int4Matrix w = make_int4_matrix(c.w, rng);
    const uint32_t n = c.w.n, k = c.w.k, m = c.m;
    const size_t ldx = k + 3, ldy = n + 5;  // strides in elements, not the row lengths
    const std::string where =
        std::string(isa_name(GetParam())) + "/" +
        (level == QMOE_ACCURACY_EXACT ? "exact" : "fast") + " x " + dtype_name(xd) + " y " +
        dtype_name(yd) + " " + c.w.describe() + " m=" + std::to_string(m) + " cols [" +
        std::to_string(c.n_begin) + "," + std::to_string(c.n_end) +
        ") threads=" + std::to_string(threads) + " seed=" + std::to_string(seed);
    ContextPtr ctx = make_context(GetParam(), threads);

    // X in its dtype (strided rows; the gaps hold values that must not be read), and the same
    // values widened: the FP32 operand of the reference composition.
    std::vector<float> x_values = random_activations(m, static_cast<uint32_t>(ldx), rng);
    const std::vector<unsigned char> x = narrow(ctx.get(), xd, x_values.data(), x_values.size());
    const std::vector<float> x32 = widen(ctx.get(), xd, x);

    // Reference: qmoe_gemm on the widened X, then the written columns rounded to yd.
    std::vector<float> y32(size_t{m} * ldy, 0.0f);
    ASSERT_EQ(qmoe_gemm(ctx.get(), &w.desc, level, m, x32.data(), ldx, y32.data(), ldy, c.n_begin,
                        c.n_end),
              QMOE_STATUS_OK)
        << where << ": " << qmoe_last_error_message();
    const std::vector<unsigned char> want = narrow(ctx.get(), yd, y32.data(), y32.size());

    // The typed call into a poisoned buffer with guard elements on both sides.
    const size_t es = element_size(yd), guard = 16;
    std::vector<unsigned char> buffer((guard + size_t{m} * ldy + guard) * es, 0xA5);
    unsigned char* y = buffer.data() + guard * es;
    ASSERT_EQ(qmoe_gemm_typed(ctx.get(), &w.desc, level, m, xd, x.data(), ldx, yd, y, ldy,
                              c.n_begin, c.n_end),
              QMOE_STATUS_OK)
        << where << ": " << qmoe_last_error_message();

    int reported = 0;
    for (size_t e = 0; e < buffer.size() / es; ++e) {
      const unsigned char* got = buffer.data() + e * es;
      const bool inside = e >= guard && e < guard + size_t{m} * ldy;
      const size_t col = inside ? (e - guard) % ldy : 0;
      const bool written = inside && col >= c.n_begin && col < c.n_end;
      bool ok = true;
      if (written) {
        ok = std::memcmp(got, want.data() + (e - guard) * es, es) == 0;
      } else {
        for (size_t b = 0; b < es; ++b) ok = ok && got[b] == 0xA5;
      }
      if (!ok && reported++ < 3) {
        ADD_FAILURE() << where << ": element " << e
                      << (written ? " differs from the conversions"
                                  : " outside the output changed");
      }
    }
  }
};

TEST_P(GemmTyped, MatchesTheConversionsAroundTheFp32Gemm) {
  const uint64_t seed = fresh_seed();
  const TypedCase cases[] = {
      {{37, 96, 32, QMOE_DTYPE_F16, ScaleOrder::kGrouped}, 1, 0, 37},
      {{20, 48, 16, QMOE_DTYPE_BF16, ScaleOrder::kRowMajor, true}, 3, 5, 17},
      {{64, 256, 64, QMOE_DTYPE_F32, ScaleOrder::kBlockMajor, false, ScaleOrder::kRowMajor, true},
       5,
       8,
       61},
  };
  const qmoe_dtype dtypes[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
  uint64_t s = seed;
  for (const TypedCase& c : cases) {
    for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      for (qmoe_dtype xd : dtypes) {
        for (qmoe_dtype yd : dtypes) {
          for (uint32_t threads : {1u, 3u}) run_case(c, level, xd, yd, threads, s++);
        }
      }
    }
  }
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(GemmTyped);

// A BF16 X is not read as FP16: 0x3F80 is 1.0 in BF16 and 1.875 in FP16, so W = all ones (code
// 9, scale 1) against X = [0x3F80] x 32 must give 32 with BF16 and 60 with FP16; likewise Y.
TEST(GemmTypedApi, EachSixteenBitTypeIsItsOwn) {
  Int4Options o{8, 32, 32, QMOE_DTYPE_F32, ScaleOrder::kRowMajor};
  std::mt19937_64 rng(1);
  Int4Matrix w = make_int4_matrix(o, rng);
  std::fill(w.codes.begin(), w.codes.end(), uint8_t{0x99});  // every code 9: weight 1
  std::vector<float> ones(w.scales.size() / sizeof(float), 1.0f);
  std::memcpy(w.scales.data(), ones.data(), w.scales.size());
  ContextPtr ctx = make_context(default_isa(), 1);
  const std::vector<uint16_t> x(o.k, 0x3F80);
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    float y[8];
    ASSERT_EQ(qmoe_gemm_typed(ctx.get(), &w.desc, level, 1, QMOE_DTYPE_BF16, x.data(), o.k,
                              QMOE_DTYPE_F32, y, 8, 0, 8),
              QMOE_STATUS_OK);
    EXPECT_EQ(y[0], 32.0f);
    ASSERT_EQ(qmoe_gemm_typed(ctx.get(), &w.desc, level, 1, QMOE_DTYPE_F16, x.data(), o.k,
                              QMOE_DTYPE_F32, y, 8, 0, 8),
              QMOE_STATUS_OK);
    EXPECT_EQ(y[0], 60.0f);
    uint16_t y16[8];
    ASSERT_EQ(qmoe_gemm_typed(ctx.get(), &w.desc, level, 1, QMOE_DTYPE_BF16, x.data(), o.k,
                              QMOE_DTYPE_BF16, y16, 8, 0, 8),
              QMOE_STATUS_OK);
    EXPECT_EQ(y16[7], 0x4200);  // 32 in BF16
    ASSERT_EQ(qmoe_gemm_typed(ctx.get(), &w.desc, level, 1, QMOE_DTYPE_BF16, x.data(), o.k,
                              QMOE_DTYPE_F16, y16, 8, 0, 8),
              QMOE_STATUS_OK);
    EXPECT_EQ(y16[7], 0x5000);  // 32 in FP16
  }
}

// Bad dtypes and byte-level overlaps of 16-bit buffers get a status, and nothing is written.
TEST(GemmTypedApi, BadInputGetsAStatus) {
  Int4Options o{16, 64, 32};
  std::mt19937_64 rng(7);
  const Int4Matrix w = make_int4_matrix(o, rng);
  ContextPtr ctx = make_context(default_isa(), 1);
  std::vector<uint16_t> x(o.k, 0x3C00);
  std::vector<uint16_t> y(o.n, 0xA5A5);
  const auto typed = [&](qmoe_dtype xd, const void* xp, qmoe_dtype yd, void* yp) {
    return qmoe_gemm_typed(ctx.get(), &w.desc, QMOE_ACCURACY_FAST, 1, xd, xp, o.k, yd, yp, o.n, 0,
                           o.n);
  };
  EXPECT_EQ(typed(static_cast<qmoe_dtype>(0), x.data(), QMOE_DTYPE_F16, y.data()),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("x_dtype 0"), std::string::npos)
      << qmoe_last_error_message();
  EXPECT_EQ(typed(QMOE_DTYPE_F16, x.data(), static_cast<qmoe_dtype>(4), y.data()),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("y_dtype 4"), std::string::npos)
      << qmoe_last_error_message();
  EXPECT_EQ(typed(QMOE_DTYPE_F16, nullptr, QMOE_DTYPE_F16, y.data()), QMOE_STATUS_INVALID_ARGUMENT);
  for (uint16_t v : y) EXPECT_EQ(v, 0xA5A5);

  // X and Y in one buffer: Y starting at X's last element overlaps (2-byte elements), Y
  // starting just past it does not.
  std::vector<uint16_t> both(o.k + o.n, 0x3C00);
  EXPECT_EQ(typed(QMOE_DTYPE_BF16, both.data(), QMOE_DTYPE_BF16, both.data() + o.k - 1),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("overlap"), std::string::npos);
  for (size_t i = 0; i < both.size(); ++i) EXPECT_EQ(both[i], 0x3C00) << i;
  EXPECT_EQ(typed(QMOE_DTYPE_BF16, both.data(), QMOE_DTYPE_BF16, both.data() + o.k),
            QMOE_STATUS_OK);
}

}  // namespace
}  // namespace qmoe::testing
