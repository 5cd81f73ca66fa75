// MXFP4 and NVFP4 dequant-GEMM through the C ABI, per tier and accuracy level: against an FP64
// reference (tests/gemm/fp4_reference.h: decoders written from the OCP specifications) and
// against the scalar tier, over M, N tails, K, scale orders, bias, global scales and partial
// column ranges with poisoned outputs and guard words; NaN and extreme scales; bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/cpu/isa_test_util.h"
#include "tests/gemm/fp4_reference.h"
#include "tests/gemm/poisoned_gemm.h"

namespace qmoe::testing {
namespace {

constexpr float kPoison = kGemmPoison;
constexpr qmoe_weight_format kFormats[] = {QMOE_WEIGHT_FORMAT_MXFP4, QMOE_WEIGHT_FORMAT_NVFP4};

const char* level_name(qmoe_accuracy a) {
  return a == QMOE_ACCURACY_EXACT ? "exact" : "fast";
}

// gemm_into_poisoned_y (tests/gemm/poisoned_gemm.h) against the FP4 FP64 reference and the
// level's bound: the outputs, n per row (the poison outside [n_begin, n_end)).
std::vector<float> run_and_check(qmoe_context* ctx, const Fp4Matrix& w, qmoe_accuracy level,
                                 const std::vector<float>& x, uint32_t m, uint32_t n_begin,
                                 uint32_t n_end, const std::string& where) {
  const Fp4Reference ref = reference_gemm(w, x, m);
  return gemm_into_poisoned_y(
      ctx, w.desc, level, x, m, n_begin, n_end, [&](size_t o) { return ref.y[o]; },
      [&](size_t o) { return ref.tol(level, o); }, where);
}

struct Case {
  Fp4Options w;
  uint32_t m;
  uint32_t n_begin, n_end;  // n_end 0 = n
};

class GemmFp4 : public IsaTest {
 protected:
  // The case on this tier and on scalar: both within the reference bound, and each other.
  void run_case(const Case& c, qmoe_accuracy level, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const Fp4Matrix w = make_fp4_matrix(c.w, rng);
    const std::vector<float> x = random_activations(c.m, c.w.k, rng);
    const uint32_t n_end = c.n_end ? c.n_end : c.w.n;
    const std::string where = std::string(isa_name(GetParam())) + "/" + level_name(level) + " " +
                              c.w.describe() + " m=" + std::to_string(c.m) + " cols [" +
                              std::to_string(c.n_begin) + "," + std::to_string(n_end) +
                              ") seed=" + std::to_string(seed);
    ContextPtr ctx = make_context(GetParam(), 1);
    const std::vector<float> got =
        run_and_check(ctx.get(), w, level, x, c.m, c.n_begin, n_end, where);
    if (GetParam() == Isa::kScalar) return;
    ContextPtr scalar = make_context(Isa::kScalar, 1);
    const std::vector<float> want =
        run_and_check(scalar.get(), w, level, x, c.m, c.n_begin, n_end, where + " [scalar]");
    const Fp4Reference ref = reference_gemm(w, x, c.m);
    int reported = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double tol = 2 * ref.tol(level, i);
      if (!(std::fabs(got[i] - want[i]) <= tol + 1e-30) && reported++ < 3) {
        ADD_FAILURE() << where << ": output " << i << " " << got[i] << " vs scalar " << want[i];
      }
    }
  }
};

TEST_P(GemmFp4, ShapesAndTails) {
  const uint64_t seed = fresh_seed();
  for (qmoe_weight_format format : kFormats) {
    for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      for (uint32_t m : {1u, 2u, 3u, 4u, 5u, 7u, 8u, 17u}) {
        for (uint32_t n : {8u, 13u, 37u}) {  // N % 8 and N % 16 != 0 in the last two
          Fp4Options o{format, n, 256};
          run_case(Case{o, m, 0, 0}, level, seed + m * 131 + n);
        }
      }
    }
  }
}

TEST_P(GemmFp4, KFromOneBlockTo4096) {
  const uint64_t seed = fresh_seed();
  for (qmoe_weight_format format : kFormats) {
    const uint32_t block = fp4_block_size(format);
    for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      // NVFP4: 1, 3 and 5 blocks of 16 leave the last chunk half filled (K % 32 == 16).
      for (uint32_t blocks : {1u, 2u, 3u, 5u, 8u}) {
        for (uint32_t m : {1u, 2u}) {
          Fp4Options o{format, 21, block * blocks};
          run_case(Case{o, m, 0, 0}, level, seed + blocks * 7 + m);
        }
      }
      Fp4Options big{format, 19, 4096};
      run_case(Case{big, 1, 0, 0}, level, seed + block);
      run_case(Case{big, 4, 0, 0}, level, seed + block + 1);
    }
  }
}

TEST_P(GemmFp4, ScaleOrdersBiasAndGlobalScale) {
  const uint64_t seed = fresh_seed();
  int variant = 0;
  for (qmoe_weight_format format : kFormats) {
    for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      for (ScaleOrder order : {ScaleOrder::kBlockMajor, ScaleOrder::kRowMajor,
                               ScaleOrder::kPaddedRowMajor, ScaleOrder::kGrouped}) {
        for (qmoe_dtype bias : {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16}) {
          for (uint32_t m : {1u, 3u, 4u}) {
            Fp4Options o{format, 24, 192, order, true, bias};
            if (format == QMOE_WEIGHT_FORMAT_NVFP4) o.global_scale = 0.0123f * (1 + variant % 3);
            run_case(Case{o, m, 0, 0}, level, seed + ++variant);
          }
        }
        Fp4Options plain{format, 16, 96, order};
        run_case(Case{plain, 2, 0, 0}, level, seed + ++variant);
      }
    }
  }
}

TEST_P(GemmFp4, PartialColumnRangesWriteOnlyTheirColumns) {
  const uint64_t seed = fresh_seed();
  for (qmoe_weight_format format : kFormats) {
    for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      const uint32_t ranges[][2] = {{0, 1},  {3, 4},   {5, 13}, {7, 9},  {8, 16},
                                    {9, 37}, {36, 37}, {1, 36}, {16, 33}};
      for (const auto& r : ranges) {
        for (uint32_t m : {1u, 3u, 6u}) {
          Fp4Options o{format, 37, 96, ScaleOrder::kBlockMajor, true};
          run_case(Case{o, m, r[0], r[1]}, level, seed + r[0] * 100 + r[1] + m);
        }
      }
    }
  }
}

// The global scale reaches every output (NVFP4): doubling it doubles Y exactly, bias aside.
TEST_P(GemmFp4, GlobalScaleMultipliesEveryOutput) {
  std::mt19937_64 rng(fresh_seed());
  Fp4Options o{QMOE_WEIGHT_FORMAT_NVFP4, 24, 128};
  Fp4Matrix w = make_fp4_matrix(o, rng);
  const std::vector<float> x = random_activations(3, o.k, rng);
  ContextPtr ctx = make_context(GetParam(), 1);
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    std::vector<float> none(3 * o.n), two(3 * o.n);
    w.desc.global_scale = 0.0f;
    ASSERT_EQ(qmoe_gemm(ctx.get(), &w.desc, level, 3, x.data(), o.k, none.data(), o.n, 0, o.n),
              QMOE_STATUS_OK);
    w.desc.global_scale = 2.0f;
    ASSERT_EQ(qmoe_gemm(ctx.get(), &w.desc, level, 3, x.data(), o.k, two.data(), o.n, 0, o.n),
              QMOE_STATUS_OK);
    for (size_t i = 0; i < none.size(); ++i) {
      EXPECT_EQ(two[i], 2.0f * none[i]) << level_name(level) << " output " << i;
    }
  }
}

// A NaN scale (E8M0 0xFF; E4M3 0x7F and 0xFF) makes every output of its row NaN, at both levels
// and on every tier, also when the block's codes are all zero; the other rows stay as they were.
TEST_P(GemmFp4, NanScalesMakeTheirRowsNan) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (qmoe_weight_format format : kFormats) {
    const std::vector<uint8_t> nans = format == QMOE_WEIGHT_FORMAT_MXFP4
                                          ? std::vector<uint8_t>{0xFF}
                                          : std::vector<uint8_t>{0x7F, 0xFF};
    for (ScaleOrder order : {ScaleOrder::kGrouped, ScaleOrder::kRowMajor}) {
      for (uint8_t nan : nans) {
        Fp4Options o{format, 21, 160, order};
        Fp4Matrix w = make_fp4_matrix(o, rng);
        const uint32_t blocks = o.k / fp4_block_size(format);
        const uint32_t nan_rows[] = {0, 9, 20};
        w.set_scale(0, 0, nan);
        w.set_scale(9, blocks - 1, nan);
        w.set_scale(20, blocks / 2, nan);
        for (uint32_t k = 0; k < fp4_block_size(format); ++k) {
          w.set_code(20, blocks / 2 * fp4_block_size(format) + k, 0);  // all +0 codes
        }
        for (uint32_t m : {1u, 2u, 5u}) {
          const std::vector<float> x = random_activations(m, o.k, rng);
          ContextPtr ctx = make_context(GetParam(), 1);
          for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
            std::vector<float> y(size_t{m} * o.n, kPoison);
            ASSERT_EQ(qmoe_gemm(ctx.get(), &w.desc, level, m, x.data(), o.k, y.data(), o.n, 0, o.n),
                      QMOE_STATUS_OK);
            const Fp4Reference ref = reference_gemm(w, x, m);
            for (uint32_t i = 0; i < m; ++i) {
              for (uint32_t j = 0; j < o.n; ++j) {
                const bool nan_row =
                    std::find(std::begin(nan_rows), std::end(nan_rows), j) != std::end(nan_rows);
                const float v = y[size_t{i} * o.n + j];
                EXPECT_EQ(std::isnan(v), nan_row)
                    << isa_name(GetParam()) << "/" << level_name(level) << " "
                    << fp4_format_name(format) << " scale 0x" << std::hex << int{nan} << std::dec
                    << " m=" << m << " y[" << i << "," << j << "] = " << v << " seed=" << seed;
                if (!nan_row) {
                  const size_t o_i = size_t{i} * o.n + j;
                  const double tol = ref.tol(level, o_i);
                  EXPECT_NEAR(v, ref.y[o_i], tol + 1e-30);
                }
              }
            }
          }
        }
      }
    }
  }
}

// MXFP4 scales up to 2^127 (E8M0 0xFE): weights of 6 * 2^127 overflow FP32 while the outputs,
// with small activations, do not. Every tier must return the finite reference (the AVX2 exact
// kernel's scaled sums overflow here and its rows are recomputed by the scalar kernel); and the
// smallest scales (E8M0 0x00, 2^-127; E4M3 subnormals) must not flush.
TEST_P(GemmFp4, ExtremeScalesStayAccurate) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (qmoe_weight_format format : kFormats) {
    const uint8_t largest = format == QMOE_WEIGHT_FORMAT_MXFP4 ? 0xFE : 0x7E;
    const uint8_t smallest = format == QMOE_WEIGHT_FORMAT_MXFP4 ? 0x00 : 0x01;
    for (bool large : {true, false}) {
      Fp4Options o{format, 19, 256, ScaleOrder::kGrouped};
      Fp4Matrix w = make_fp4_matrix(o, rng);
      const uint32_t blocks = o.k / fp4_block_size(format);
      for (uint32_t n = 0; n < o.n; ++n) {
        for (uint32_t b = 0; b < blocks; ++b) w.set_scale(n, b, large ? largest : smallest);
      }
      for (uint32_t m : {1u, 2u, 3u}) {
        std::vector<float> x = random_activations(m, o.k, rng);
        // Outputs far from FP32's limits either way; |x| times a largest scale, or a smallest
        // scale's |x| of 2^100, overflows the AVX2 exact kernel's sums, scaled by 2^25.
        const int shift = large ? (format == QMOE_WEIGHT_FORMAT_MXFP4 ? -20 : 90) : 100;
        for (float& v : x) v = std::ldexp(v, shift);
        ContextPtr ctx = make_context(GetParam(), 1);
        for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
          run_and_check(ctx.get(), w, level, x, m, 0, o.n,
                        std::string(isa_name(GetParam())) + "/" + level_name(level) + " " +
                            fp4_format_name(format) + (large ? " largest" : " smallest") +
                            " scales m=" + std::to_string(m) + " seed=" + std::to_string(seed));
        }
      }
    }
  }
}

// A NaN in a row of X makes every output of that row NaN at the exact level.
TEST_P(GemmFp4, NanActivationsReachTheirRow) {
  std::mt19937_64 rng(fresh_seed());
  for (qmoe_weight_format format : kFormats) {
    Fp4Options o{format, 21, 256};
    const Fp4Matrix w = make_fp4_matrix(o, rng);
    for (uint32_t m : {1u, 3u, 4u, 5u}) {
      std::vector<float> x = random_activations(m, o.k, rng);
      x[size_t{m - 1} * o.k + 77] = std::nanf("");
      ContextPtr ctx = make_context(GetParam(), 1);
      std::vector<float> y(size_t{m} * o.n, 0.0f);
      ASSERT_EQ(qmoe_gemm(ctx.get(), &w.desc, QMOE_ACCURACY_EXACT, m, x.data(), o.k, y.data(), o.n,
                          0, o.n),
                QMOE_STATUS_OK);
      for (uint32_t i = 0; i < m; ++i) {
        for (uint32_t j = 0; j < o.n; ++j) {
          EXPECT_EQ(std::isnan(y[size_t{i} * o.n + j]), i == m - 1)
              << fp4_format_name(format) << " m=" << m << " y[" << i << "," << j << "]";
        }
      }
    }
  }
}

// The result must not depend on the thread count (columns are split, never K).
TEST_P(GemmFp4, ThreadCountDoesNotChangeTheResult) {
  std::mt19937_64 rng(fresh_seed());
  for (qmoe_weight_format format : kFormats) {
    Fp4Options o{format, 203, 512, ScaleOrder::kBlockMajor, true};
    const Fp4Matrix w = make_fp4_matrix(o, rng);
    for (uint32_t m : {1u, 4u}) {
      const std::vector<float> x = random_activations(m, o.k, rng);
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        std::vector<float> one(size_t{m} * o.n), many(size_t{m} * o.n);
        ContextPtr c1 = make_context(GetParam(), 1), c3 = make_context(GetParam(), 3);
        ASSERT_EQ(qmoe_gemm(c1.get(), &w.desc, level, m, x.data(), o.k, one.data(), o.n, 0, o.n),
                  QMOE_STATUS_OK);
        ASSERT_EQ(qmoe_gemm(c3.get(), &w.desc, level, m, x.data(), o.k, many.data(), o.n, 0, o.n),
                  QMOE_STATUS_OK);
        EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)), 0)
            << fp4_format_name(format) << " " << level_name(level) << " m=" << m;
      }
    }
  }
}

// Randomised shapes and options against the FP64 reference.
TEST_P(GemmFp4, Fuzz) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (int iteration = 0; iteration < 60; ++iteration) {
    const Fp4Options o = random_fp4_options(rng, 512);
    const uint32_t m = static_cast<uint32_t>(1 + rng() % 9);
    const uint32_t a = static_cast<uint32_t>(rng() % o.n), b = static_cast<uint32_t>(rng() % o.n);
    const Case c{o, m, std::min(a, b), std::max(a, b) + 1};
    run_case(c, rng() % 2 ? QMOE_ACCURACY_EXACT : QMOE_ACCURACY_FAST, seed + iteration);
  }
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(GemmFp4);

// Bad descriptions get a status and a message, and nothing is written.
TEST(GemmFp4Api, BadInputGetsAStatus) {
  std::mt19937_64 rng(7);
  ContextPtr ctx = make_context(default_isa(), 1);
  for (qmoe_weight_format format : kFormats) {
    Fp4Options o{format, 16, 64};
    Fp4Matrix w = make_fp4_matrix(o, rng);
    std::vector<float> x(o.k, 1.0f), y(o.n, kPoison);
    auto with = [&](auto&& edit) {
      qmoe_quant_matrix d = w.desc;
      edit(d);
      return qmoe_gemm(ctx.get(), &d, QMOE_ACCURACY_FAST, 1, x.data(), o.k, y.data(), o.n, 0, o.n);
    };
    const char* name = fp4_format_name(format);
    const bool mx = format == QMOE_WEIGHT_FORMAT_MXFP4;
    // Block sizes: MXFP4 32 only, NVFP4 16 only.
    for (uint32_t block : {16u, 32u, 64u, 128u}) {
      if (block == fp4_block_size(format)) continue;
      EXPECT_EQ(with([&](qmoe_quant_matrix& d) { d.block_size = block; }),
                QMOE_STATUS_INVALID_ARGUMENT)
          << name << " block " << block;
      EXPECT_NE(std::string(qmoe_last_error_message()).find("block_size"), std::string::npos);
    }
    // Scale types: only the format's own byte type.
    for (qmoe_dtype dtype : {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16,
                             mx ? QMOE_DTYPE_F8_E4M3 : QMOE_DTYPE_E8M0}) {
      EXPECT_EQ(with([&](qmoe_quant_matrix& d) { d.scale_dtype = dtype; }),
                QMOE_STATUS_UNSUPPORTED_FORMAT)
          << name << " dtype " << dtype;
    }
    // Zero points are refused (E2M1 codes are signed values).
    EXPECT_EQ(with([&](qmoe_quant_matrix& d) {
                d.zero_points = w.codes.data();
                d.zero_point_row_stride = 1;
                d.zero_point_block_stride = o.n;
              }),
              QMOE_STATUS_INVALID_ARGUMENT)
        << name;
    EXPECT_NE(std::string(qmoe_last_error_message()).find("zero points"), std::string::npos);
    // Global scale: MXFP4 takes none (0 or 1); NVFP4 any finite value > 0; neither NaN,
    // infinity, 0-or-below.
    EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.global_scale = 1.0f; }), QMOE_STATUS_OK);
    EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.global_scale = 0.0f; }), QMOE_STATUS_OK);
    EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.global_scale = 0.25f; }),
              mx ? QMOE_STATUS_INVALID_ARGUMENT : QMOE_STATUS_OK)
        << name;
    for (float bad : {-1.0f, -2.0f, std::nanf(""), INFINITY, -INFINITY}) {
      EXPECT_EQ(with([&](qmoe_quant_matrix& d) { d.global_scale = bad; }),
                QMOE_STATUS_INVALID_ARGUMENT)
          << name << " " << bad;
      EXPECT_NE(std::string(qmoe_last_error_message()).find("global_scale"), std::string::npos);
    }
    std::fill(y.begin(), y.end(), kPoison);
    // K not a multiple of the block.
    EXPECT_EQ(with([&](qmoe_quant_matrix& d) { d.k = fp4_block_size(format) * 3 / 2; }),
              QMOE_STATUS_INVALID_ARGUMENT);
    for (float v : y) EXPECT_EQ(std::memcmp(&v, &kPoison, sizeof v), 0) << "a refused call wrote y";
  }
}

}  // namespace
}  // namespace qmoe::testing
