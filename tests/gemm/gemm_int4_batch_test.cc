// Whether a row's output bits depend on the other activation rows of the call (M), per tier and
// accuracy level, as docs/abi.md states it. (The thread count and the column range never change
// a bit; other tests check that.)
//
// Promised, and checked here: on the scalar tier (both levels) and on the AVX2 tier's fast
// level, row i of an M-row call has exactly the bits of row i computed alone or in any other
// batch. The fast level's chunk sums are exact integers in every path, and the AVX2 paths for
// M = 1 and for tiles of M >= 2 share the float epilogue instruction for instruction.
//
// Not promised (the level's test skips with the reason): the exact level on the SIMD tiers sums M =
// 1 in a latency-bound order (chains of two, one accumulator per row pair) and tiles of M >= 2 in a
// throughput-bound one; the AVX-512 fast level runs M = 1 on the 256-bit body and M >= 2 on
// the 512-bit one, whose float epilogue works on two partial sums per row. Both stay within
// the levels' bounds (docs/formats.md), which the other tests check at every M.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/cpu/isa_test_util.h"
#include "tests/gemm/int4_reference.h"

namespace qmoe::testing {
namespace {

const char* not_promised(Isa isa, qmoe_accuracy level) {
  if (isa == Isa::kScalar) return nullptr;
  if (level == QMOE_ACCURACY_EXACT) {
    return "the exact level's SIMD order differs between M = 1 and tiles of M >= 2";
  }
  if (isa == Isa::kAvx512) return "AVX-512 fast: M = 1 runs the 256-bit body, M >= 2 the 512-bit";
  return nullptr;
}

// Y for rows [first, first + count) of x (row stride k), all n columns, on `ctx`.
std::vector<float> rows_of(qmoe_context* ctx, const Int4Matrix& w, qmoe_accuracy level,
                           const std::vector<float>& x, uint32_t first, uint32_t count) {
  const uint32_t n = w.options.n, k = w.options.k;
  std::vector<float> y(size_t{count} * n, -1.0f);
  EXPECT_EQ(
      qmoe_gemm(ctx, &w.desc, level, count, x.data() + size_t{first} * k, k, y.data(), n, 0, n),
      QMOE_STATUS_OK)
      << qmoe_last_error_message();
  return y;
}

class GemmInt4Batch : public IsaTest {
 protected:
  // One level: skipped with the reason where the docs do not promise it (a test that checked
  // nothing must not pass), else every row's bits against the same rows in other batches.
  void check_level(qmoe_accuracy level) {
    if (const char* reason = not_promised(GetParam(), level)) {
      GTEST_SKIP() << isa_name(GetParam()) << "/"
                   << (level == QMOE_ACCURACY_EXACT ? "exact" : "fast") << ": not promised ("
                   << reason << ")";
    }
    const uint64_t seed = fresh_seed();
    std::mt19937_64 rng(seed);
    ContextPtr ctx = make_context(GetParam(), 2);
    for (int trial = 0; trial < 24; ++trial) {
      const Int4Options o = random_int4_options(rng, 512);
      const Int4Matrix w = make_int4_matrix(o, rng);
      constexpr uint32_t kRows = 11;  // two tiles of 4 and a tile of 3
      const std::vector<float> x = random_activations(kRows, o.k, rng);
      const std::vector<float> all = rows_of(ctx.get(), w, level, x, 0, kRows);
      const std::string where = std::string(isa_name(GetParam())) + "/" +
                                (level == QMOE_ACCURACY_EXACT ? "exact " : "fast ") + o.describe() +
                                " seed=" + std::to_string(seed);
      // Every row alone, and every window of 2, 3 and 5 rows (so each row meets other tile
      // positions and tile sizes than in the 11-row call).
      for (uint32_t count : {1u, 2u, 3u, 5u}) {
        for (uint32_t first = 0; first + count <= kRows; ++first) {
          const std::vector<float> part = rows_of(ctx.get(), w, level, x, first, count);
          const size_t offset = size_t{first} * o.n;
          ASSERT_EQ(std::memcmp(part.data(), all.data() + offset, part.size() * sizeof(float)), 0)
              << where << ": rows [" << first << ", " << first + count
              << ") differ from the same rows of the " << kRows << "-row call";
        }
      }
    }
  }
};

TEST_P(GemmInt4Batch, ExactRowBitsDoNotDependOnTheOtherRows) {
  check_level(QMOE_ACCURACY_EXACT);
}

TEST_P(GemmInt4Batch, FastRowBitsDoNotDependOnTheOtherRows) {
  check_level(QMOE_ACCURACY_FAST);
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(GemmInt4Batch);

}  // namespace
}  // namespace qmoe::testing
