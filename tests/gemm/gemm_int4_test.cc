// INT4 dequant-GEMM through the C ABI, per tier and accuracy level: against an FP64 reference
// and against the scalar tier, over M, N tails, K, block sizes, scale dtypes and orders, zero
// points, bias, and partial column ranges with poisoned outputs and guard words.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tests/cpu/isa_test_util.h"
#include "tests/gemm/int4_reference.h"
#include "tests/gemm/poisoned_gemm.h"
#include "tests/threaded_runs.h"

namespace qmoe::testing {
namespace {

constexpr float kPoison = kGemmPoison;

const char* level_name(qmoe_accuracy a) {
  return a == QMOE_ACCURACY_EXACT ? "exact" : "fast";
}

// gemm_into_poisoned_y (tests/gemm/poisoned_gemm.h) against the INT4 FP64 reference and the
// level's bound: the outputs, n per row (the poison outside [n_begin, n_end)).
std::vector<float> run_and_check(qmoe_context* ctx, const Int4Matrix& w, qmoe_accuracy level,
                                 const std::vector<float>& x, uint32_t m, uint32_t n_begin,
                                 uint32_t n_end, const Reference& ref, const std::string& where) {
  return gemm_into_poisoned_y(
      ctx, w.desc, level, x, m, n_begin, n_end, [&](size_t o) { return ref.y[o]; },
      [&](size_t o) {
        return level == QMOE_ACCURACY_EXACT ? 1e-5 * ref.abs_sum[o] : ref.fast_bound[o];
      },
      where);
}

// run_and_check on every thread configuration of `runs` (tests/threaded_runs.h): each meets
// the reference, and each has the bits of the first (one thread), as docs/abi.md promises.
// Returns the one-thread outputs.
std::vector<float> check_threaded(const ThreadedRuns& runs, const Int4Matrix& w,
                                  qmoe_accuracy level, const std::vector<float>& x, uint32_t m,
                                  uint32_t n_begin, uint32_t n_end, const Reference& ref,
                                  const std::string& where) {
  std::vector<float> first;
  for (const ThreadedRun& run : runs.runs()) {
    const std::vector<float> got =
        run_and_check(run.ctx, w, level, x, m, n_begin, n_end, ref, where + " on " + run.label);
    if (first.empty()) {
      first = got;
      continue;
    }
    const long i = first_bit_difference(first.data(), got.data(), got.size());
    if (i >= 0) {
      ADD_FAILURE() << where << ": output " << i << " on " << run.label << " is " << got[i]
                    << ", on " << runs.runs()[0].label << " " << first[i]
                    << " (the thread count changed a bit)";
    }
  }
  return first;
}

struct Case {
  Int4Options w;
  uint32_t m;
  uint32_t n_begin, n_end;  // n_end 0 = n
};

class GemmInt4 : public IsaTest {
 protected:
  // The tier's contexts in every thread configuration, made on first use.
  ThreadedRuns& runs() {
    if (runs_ == nullptr) runs_ = std::make_unique<ThreadedRuns>(GetParam());
    return *runs_;
  }
  // Asserts that the caller-pool context ran some call as more than one task, for the tests
  // whose shapes are meant to reach the parallel path.
  void expect_split_calls() {
    EXPECT_GT(runs().pool().split_calls(), 0u)
        << "no call of this test was split over threads: its thread checks checked nothing";
  }

  // Each case on this tier in every thread configuration and on scalar; all must meet the
  // reference bound, the tier's configurations must agree bit for bit, and the tier must agree
  // with scalar to the same bound.
  void run_case(const Case& c, qmoe_accuracy level, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const Int4Matrix w = make_int4_matrix(c.w, rng);
    const std::vector<float> x = random_activations(c.m, c.w.k, rng);
    const uint32_t n_end = c.n_end ? c.n_end : c.w.n;
    const std::string where = std::string(isa_name(GetParam())) + "/" + level_name(level) + " " +
                              c.w.describe() + " m=" + std::to_string(c.m) + " cols [" +
                              std::to_string(c.n_begin) + "," + std::to_string(n_end) +
                              ") seed=" + std::to_string(seed);
    const Reference ref = reference_gemm(w, x, c.m);
    const std::vector<float> got =
        check_threaded(runs(), w, level, x, c.m, c.n_begin, n_end, ref, where);
    if (GetParam() == Isa::kScalar) return;
    ContextPtr scalar = make_context(Isa::kScalar, 1);
    const std::vector<float> want =
        run_and_check(scalar.get(), w, level, x, c.m, c.n_begin, n_end, ref, where + " [scalar]");
    int reported = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double tol =
          level == QMOE_ACCURACY_EXACT ? 2e-5 * ref.abs_sum[i] : 2 * ref.fast_bound[i];
      if (!(std::fabs(got[i] - want[i]) <= tol + 1e-30) && reported++ < 3) {
        ADD_FAILURE() << where << ": output " << i << " " << got[i] << " vs scalar " << want[i];
      }
    }
  }

 private:
  std::unique_ptr<ThreadedRuns> runs_;
};

TEST_P(GemmInt4, ShapesAndTails) {
  const uint64_t seed = fresh_seed();
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    for (uint32_t m : {1u, 2u, 3u, 4u, 5u, 7u, 8u, 17u}) {
      for (uint32_t n : {8u, 13u, 37u}) {  // N % 8 and N % 16 != 0 in the last two
        Case c{{n, 256, 32}, m, 0, 0};
        run_case(c, level, seed + m * 131 + n);
      }
    }
  }
  expect_split_calls();
}

TEST_P(GemmInt4, KFromOneBlockTo4096EveryBlockSize) {
  const uint64_t seed = fresh_seed();
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    for (uint32_t block : {16u, 32u, 64u, 128u}) {
      for (uint32_t blocks : {1u, 2u, 3u, 5u}) {
        Case c{{21, block * blocks, block}, 2, 0, 0};
        run_case(c, level, seed + block * 7 + blocks);
      }
      Case big{{19, 4096, block}, 1, 0, 0};
      run_case(big, level, seed + block);
    }
  }
  expect_split_calls();
}

TEST_P(GemmInt4, ScaleDtypesOrdersZeroPointsAndBias) {
  const uint64_t seed = fresh_seed();
  int variant = 0;
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    for (qmoe_dtype dtype : {QMOE_DTYPE_F16, QMOE_DTYPE_BF16, QMOE_DTYPE_F32}) {
      for (ScaleOrder order : {ScaleOrder::kBlockMajor, ScaleOrder::kRowMajor,
                               ScaleOrder::kPaddedRowMajor, ScaleOrder::kGrouped}) {
        for (bool zeros : {false, true}) {
          for (bool bias : {false, true}) {
            Int4Options o{24, 192, 32, dtype, order, zeros, ScaleOrder::kBlockMajor, bias, dtype};
            if (zeros && order == ScaleOrder::kRowMajor) o.zero_point_order = ScaleOrder::kRowMajor;
            if (zeros && order == ScaleOrder::kGrouped) o.zero_point_order = ScaleOrder::kGrouped;
            run_case(Case{o, 3, 0, 0}, level, seed + ++variant);
          }
        }
      }
      // Block 16 with the zero points and scales in each order.
      Int4Options b16{16,
                      80,
                      16,
                      dtype,
                      ScaleOrder::kRowMajor,
                      true,
                      ScaleOrder::kRowMajor,
                      true,
                      QMOE_DTYPE_F16};
      run_case(Case{b16, 2, 0, 0}, level, seed + ++variant);
    }
  }
}

TEST_P(GemmInt4, PartialColumnRangesWriteOnlyTheirColumns) {
  const uint64_t seed = fresh_seed();
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    const uint32_t ranges[][2] = {{0, 1},  {3, 4},   {5, 13}, {7, 9},  {8, 16},
                                  {9, 37}, {36, 37}, {1, 36}, {16, 33}};
    for (const auto& r : ranges) {
      for (uint32_t m : {1u, 3u, 6u}) {
        Case c{{37, 96, 32, QMOE_DTYPE_F16, ScaleOrder::kBlockMajor, true}, m, r[0], r[1]};
        run_case(c, level, seed + r[0] * 100 + r[1] + m);
      }
    }
  }
}

// A BF16 scale plane read as FP16 (or the reverse) must fail the reference check: make sure
// the dtype actually reaches the kernel by swapping it and expecting large errors.
TEST_P(GemmInt4, ScaleDtypeIsHonoured) {
  // A fixed seed: with random data a row can land near the reference by chance.
  std::mt19937_64 rng(1);
  Int4Options o{16, 128, 32, QMOE_DTYPE_BF16, ScaleOrder::kBlockMajor};
  Int4Matrix w = make_int4_matrix(o, rng);
  const std::vector<float> x = random_activations(1, o.k, rng);
  ContextPtr ctx = make_context(GetParam(), 1);
  std::vector<float> right(o.n), wrong(o.n);
  ASSERT_EQ(qmoe_gemm(ctx.get(), &w.desc, QMOE_ACCURACY_EXACT, 1, x.data(), o.k, right.data(), o.n,
                      0, o.n),
            QMOE_STATUS_OK);
  w.desc.scale_dtype = QMOE_DTYPE_F16;
  ASSERT_EQ(qmoe_gemm(ctx.get(), &w.desc, QMOE_ACCURACY_EXACT, 1, x.data(), o.k, wrong.data(), o.n,
                      0, o.n),
            QMOE_STATUS_OK);
  w.desc.scale_dtype = QMOE_DTYPE_BF16;
  const Reference ref = reference_gemm(w, x, 1);
  int mismatches = 0;
  for (uint32_t j = 0; j < o.n; ++j) {
    EXPECT_NEAR(right[j], ref.y[j], 1e-5 * ref.abs_sum[j] + 1e-30);
    mismatches += std::fabs(wrong[j] - ref.y[j]) > 1e-2 * ref.abs_sum[j];
  }
  EXPECT_EQ(mismatches, static_cast<int>(o.n));
}

// Activations near the top of the float range, where a kernel that scales its intermediate
// sums (the AVX2 exact kernel's top-nibble form does, by 2^28) overflows unless it notices
// and recomputes; and a NaN in X, which must reach every output of its row.
TEST_P(GemmInt4, ExtremeActivations) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (bool zero_points : {false, true}) {
    Int4Options o{21, 256, 32, QMOE_DTYPE_F32, ScaleOrder::kGrouped, zero_points};
    const Int4Matrix w = make_int4_matrix(o, rng);
    for (uint32_t m : {1u, 3u, 4u, 5u}) {
      std::vector<float> x = random_activations(m, o.k, rng);
      for (float& v : x) v = std::ldexp(v, 100);  // |x| up to about 1e30; sums stay finite
      ContextPtr ctx = make_context(GetParam(), 1);
      const Reference ref = reference_gemm(w, x, m);
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        const std::string where = std::string(isa_name(GetParam())) + "/" + level_name(level) +
                                  " x * 2^100 m=" + std::to_string(m) +
                                  (zero_points ? " zero points" : "") +
                                  " seed=" + std::to_string(seed);
        check_threaded(runs(), w, level, x, m, 0, o.n, ref, where);
      }
      x[size_t{m - 1} * o.k + 77] = std::nanf("");
      std::vector<float> y(size_t{m} * o.n, 0.0f);
      ASSERT_EQ(qmoe_gemm(ctx.get(), &w.desc, QMOE_ACCURACY_EXACT, m, x.data(), o.k, y.data(), o.n,
                          0, o.n),
                QMOE_STATUS_OK);
      for (uint32_t i = 0; i < m; ++i) {
        for (uint32_t j = 0; j < o.n; ++j) {
          const float v = y[size_t{i} * o.n + j];
          EXPECT_EQ(std::isnan(v), i == m - 1) << "m=" << m << " y[" << i << "," << j << "] " << v;
        }
      }
    }
  }
}

// Activations far below FP32's normal range: 127 / max|x| overflows below ~2^-121, and below
// 2^-119 max|x| / 127 is subnormal. The fast level flushes such chunks to 0 (docs/formats.md);
// every tier used to quantize their non-zero values to +-127 (127 / max = +Inf), far outside
// the bound. Chunks at 2^-130 (subnormal), 2^-121, 2^-119 exactly, 2^-110 and ordinary ones.
TEST_P(GemmInt4, TinyActivationsMeetTheBound) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  Int4Options o{19, 320, 32, QMOE_DTYPE_F16, ScaleOrder::kGrouped, false};
  const Int4Matrix w = make_int4_matrix(o, rng);
  for (uint32_t m : {1u, 4u}) {
    std::vector<float> x = random_activations(m, o.k, rng);
    for (size_t i = 0; i < x.size(); ++i) {
      const int exponents[] = {-130, -121, -119, -110, 0};
      const int e = exponents[(i / 32) % 5];
      // Every chunk's max at exactly 2^e (its first value), the rest below it.
      x[i] = i % 32 == 0 ? std::ldexp(1.0f, e) : std::ldexp(std::fmod(x[i], 1.0f), e);
    }
    check_threaded(runs(), w, QMOE_ACCURACY_FAST, x, m, 0, o.n, reference_gemm(w, x, m),
                   std::string(isa_name(GetParam())) + "/fast tiny activations m=" +
                       std::to_string(m) + " seed=" + std::to_string(seed));
  }
}

// Scales near FLT_MAX (FP32 ones up to 2^125.6 here): the products (code - z) * scale overflow
// FP32 while every output is finite. The AVX-512 exact kernel's weight tables held exactly those
// products and returned Inf (a review found it); it now hands such groups to the scalar kernel.
TEST_P(GemmInt4, ScalesNearFltMaxStayFinite) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (bool zero_points : {false, true}) {
    Int4Options o{21, 256, 32, QMOE_DTYPE_F32, ScaleOrder::kRowMajor, zero_points};
    Int4Matrix w = make_int4_matrix(o, rng);
    // Every scale times 2^130 (exact): magnitudes 2^121 to 2^125.6, in place in the plane.
    for (size_t i = 0; i < w.scale_values.size(); ++i) {
      w.scale_values[i] = std::ldexp(w.scale_values[i], 130);
      const float v = static_cast<float>(w.scale_values[i]);
      std::memcpy(w.scales.data() + i * sizeof(float), &v, sizeof(float));
    }
    for (uint32_t m : {1u, 2u, 3u}) {
      std::vector<float> x = random_activations(m, o.k, rng);
      for (float& v : x) v = std::ldexp(v, -20);  // outputs about 2^115: finite
      const Reference ref = reference_gemm(w, x, m);
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        check_threaded(runs(), w, level, x, m, 0, o.n, ref,
                       std::string(isa_name(GetParam())) + "/" + level_name(level) +
                           " scales * 2^130 m=" + std::to_string(m) +
                           (zero_points ? " zero points" : "") + " seed=" + std::to_string(seed));
      }
    }
  }
}

// The result must not depend on the thread count (columns are split, never K): a shape of 26
// row groups, so every configuration splits it, against the reference and bit for bit.
TEST_P(GemmInt4, ThreadCountDoesNotChangeTheResult) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  Int4Options o{203, 512, 32, QMOE_DTYPE_F16, ScaleOrder::kBlockMajor, true};
  const Int4Matrix w = make_int4_matrix(o, rng);
  for (uint32_t m : {1u, 4u}) {
    const std::vector<float> x = random_activations(m, o.k, rng);
    const Reference ref = reference_gemm(w, x, m);
    for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      check_threaded(runs(), w, level, x, m, 0, o.n, ref,
                     std::string(isa_name(GetParam())) + "/" + level_name(level) + " " +
                         o.describe() + " m=" + std::to_string(m) +
                         " seed=" + std::to_string(seed));
    }
  }
  expect_split_calls();
}

// Randomised shapes and options against the FP64 reference (run under ASan+UBSan in CI).
TEST_P(GemmInt4, Fuzz) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (int iteration = 0; iteration < 60; ++iteration) {
    const Int4Options o = random_int4_options(rng, 512);
    const uint32_t m = static_cast<uint32_t>(1 + rng() % 9);
    const uint32_t a = static_cast<uint32_t>(rng() % o.n), b = static_cast<uint32_t>(rng() % o.n);
    Case c{o, m, std::min(a, b), std::max(a, b) + 1};
    run_case(c, rng() % 2 ? QMOE_ACCURACY_EXACT : QMOE_ACCURACY_FAST, seed + iteration);
  }
  expect_split_calls();
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(GemmInt4);

// Bad input gets a status and a message, and nothing is written.
TEST(GemmInt4Api, BadInputGetsAStatus) {
  std::mt19937_64 rng(7);
  Int4Options o{16, 64, 32};
  Int4Matrix w = make_int4_matrix(o, rng);
  std::vector<float> x(o.k, 1.0f), y(o.n, kPoison);
  ContextPtr ctx = make_context(default_isa(), 1);
  auto gemm = [&](const qmoe_quant_matrix* d, qmoe_accuracy level = QMOE_ACCURACY_EXACT,
                  uint32_t m = 1, uint32_t n0 = 0, uint32_t n1 = 16) {
    return qmoe_gemm(ctx.get(), d, level, m, x.data(), o.k, y.data(), o.n, n0, n1);
  };
  EXPECT_EQ(gemm(&w.desc), QMOE_STATUS_OK);
  std::fill(y.begin(), y.end(), kPoison);
  EXPECT_EQ(
      qmoe_gemm(nullptr, &w.desc, QMOE_ACCURACY_EXACT, 1, x.data(), o.k, y.data(), o.n, 0, 16),
      QMOE_STATUS_INVALID_CONTEXT);
  EXPECT_EQ(gemm(nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(gemm(&w.desc, static_cast<qmoe_accuracy>(0)), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(gemm(&w.desc, static_cast<qmoe_accuracy>(3)), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(gemm(&w.desc, QMOE_ACCURACY_EXACT, 0), QMOE_STATUS_INVALID_ARGUMENT);  // m = 0
  EXPECT_EQ(gemm(&w.desc, QMOE_ACCURACY_EXACT, 1, 4, 4), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(gemm(&w.desc, QMOE_ACCURACY_EXACT, 1, 5, 3), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(gemm(&w.desc, QMOE_ACCURACY_EXACT, 1, 0, 17), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(
      qmoe_gemm(ctx.get(), &w.desc, QMOE_ACCURACY_EXACT, 1, nullptr, o.k, y.data(), o.n, 0, 16),
      QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(
      qmoe_gemm(ctx.get(), &w.desc, QMOE_ACCURACY_EXACT, 1, x.data(), o.k, nullptr, o.n, 0, 16),
      QMOE_STATUS_INVALID_ARGUMENT);
  // m > 1 with leading dimensions that do not fit.
  EXPECT_EQ(qmoe_gemm(ctx.get(), &w.desc, QMOE_ACCURACY_EXACT, 2, x.data(), o.k - 1, y.data(), o.n,
                      0, 16),
            QMOE_STATUS_INVALID_ARGUMENT);
  // x and y overlapping.
  EXPECT_EQ(
      qmoe_gemm(ctx.get(), &w.desc, QMOE_ACCURACY_EXACT, 1, y.data(), o.k, y.data(), o.n, 0, 16),
      QMOE_STATUS_INVALID_ARGUMENT);
  // y over the weights: the codes, the scale plane, or the bias.
  {
    Int4Options ob = o;
    ob.bias = true;
    Int4Matrix wb = make_int4_matrix(ob, rng);
    auto* codes = static_cast<float*>(const_cast<void*>(wb.desc.codes));
    auto* scales = static_cast<float*>(const_cast<void*>(wb.desc.scales));
    auto* bias = static_cast<float*>(const_cast<void*>(wb.desc.bias));
    for (float* target : {codes + 3, scales, bias + 1}) {
      EXPECT_EQ(
          qmoe_gemm(ctx.get(), &wb.desc, QMOE_ACCURACY_FAST, 1, x.data(), o.k, target, o.n, 0, 4),
          QMOE_STATUS_INVALID_ARGUMENT);
      EXPECT_NE(std::string(qmoe_last_error_message()).find("weights"), std::string::npos);
    }
  }

  auto with = [&](auto&& edit) {
    qmoe_quant_matrix d = w.desc;
    edit(d);
    return gemm(&d);
  };
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.struct_size = 8; }), QMOE_STATUS_INVALID_ARGUMENT);
  // Ending inside the bias pointer (half of it would be read).
  EXPECT_EQ(
      with([](qmoe_quant_matrix& d) { d.struct_size = offsetof(qmoe_quant_matrix, bias) + 4; }),
      QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("struct_size"), std::string::npos);
  // A scale plane whose span (rows x row stride) does not fit in the address space, each
  // stride on its own being allowed.
  EXPECT_EQ(with([](qmoe_quant_matrix& d) {
              d.n = (1u << 17) + 8;
              d.k = 32;
              d.scale_row_stride = size_t{1} << 47;
              d.scale_block_stride = 1;
              d.scale_group_stride = 0;
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("address space"), std::string::npos);
  // 16-bit scales at an odd address.
  EXPECT_EQ(with([](qmoe_quant_matrix& d) {
              d.scales = static_cast<const unsigned char*>(d.scales) + 1;
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("aligned"), std::string::npos);
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.format = static_cast<qmoe_weight_format>(9); }),
            QMOE_STATUS_UNSUPPORTED_FORMAT);
  // Byte scale types are other formats' (MXFP4's E8M0, NVFP4's E4M3): INT4 takes none, and no
  // bias has them; an unknown dtype is no dtype at all.
  for (qmoe_dtype byte_scale : {QMOE_DTYPE_E8M0, QMOE_DTYPE_F8_E4M3}) {
    EXPECT_EQ(with([&](qmoe_quant_matrix& d) { d.scale_dtype = byte_scale; }),
              QMOE_STATUS_UNSUPPORTED_FORMAT);
    EXPECT_EQ(with([&](qmoe_quant_matrix& d) {
                d.bias = x.data();
                d.bias_dtype = byte_scale;
              }),
              QMOE_STATUS_INVALID_ARGUMENT);
  }
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.scale_dtype = static_cast<qmoe_dtype>(6); }),
            QMOE_STATUS_INVALID_ARGUMENT);
  // The global scale: 0 (none) and 1 are INT4's only values; NaN, infinity, negatives and
  // anything else are refused, and a caller whose struct ends before the field gets none.
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.global_scale = 1.0f; }), QMOE_STATUS_OK);
  for (float bad : {2.0f, 0.5f, -1.0f, std::nanf(""), INFINITY}) {
    EXPECT_EQ(with([&](qmoe_quant_matrix& d) { d.global_scale = bad; }),
              QMOE_STATUS_INVALID_ARGUMENT)
        << bad;
    EXPECT_NE(std::string(qmoe_last_error_message()).find("global_scale"), std::string::npos);
    EXPECT_EQ(with([&](qmoe_quant_matrix& d) {
                d.global_scale = bad;
                d.struct_size = offsetof(qmoe_quant_matrix, global_scale);
              }),
              QMOE_STATUS_OK);
  }
  std::fill(y.begin(), y.end(), kPoison);
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.k = 48; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("multiple"), std::string::npos);
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.block_size = 24; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.n = 0; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.k = 0; }), QMOE_STATUS_INVALID_ARGUMENT);
  // N or K above QMOE_MAX_MATRIX_DIM: refused before any plane is read. Near 2^32 the chunk
  // and row-group counts once wrapped in 32 bits: K = 0xFFFFFFF0 sized the scale panel to 0
  // bytes and the gather wrote past it; N = 0xFFFFFFFF returned OK without computing
  // columns, and with a 16-bit Y rounded one column past n_end.
  for (const auto& [n, k] : {std::pair<uint32_t, uint32_t>{16, 0xFFFFFFF0u},
                             {0xFFFFFFFFu, 32},
                             {QMOE_MAX_MATRIX_DIM + 8, 32},
                             {16, QMOE_MAX_MATRIX_DIM + 32}}) {
    EXPECT_EQ(with([n = n, k = k](qmoe_quant_matrix& d) {
                d.n = n;
                d.k = k;
                d.block_size = 16;
                d.scale_row_stride = 1;
                d.scale_block_stride = 1;
                d.scale_group_stride = 0;
              }),
              QMOE_STATUS_INVALID_ARGUMENT)
        << n << " x " << k;
    EXPECT_NE(std::string(qmoe_last_error_message()).find("QMOE_MAX_MATRIX_DIM"),
              std::string::npos);
  }
  size_t max_bytes = 0;
  EXPECT_EQ(
      qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT4, 8, QMOE_MAX_MATRIX_DIM, &max_bytes),
      QMOE_STATUS_OK);
  EXPECT_EQ(max_bytes, size_t{QMOE_MAX_MATRIX_DIM} / 2 * 8);
  EXPECT_EQ(
      qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT4, 8, QMOE_MAX_MATRIX_DIM + 1, &max_bytes),
      QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT4, QMOE_MAX_MATRIX_DIM + 1, 32,
                                         &max_bytes),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.codes = nullptr; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.scales = nullptr; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.scale_dtype = static_cast<qmoe_dtype>(0); }),
            QMOE_STATUS_INVALID_ARGUMENT);
  // Strides that alias rows or blocks.
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.scale_row_stride = 0; }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](qmoe_quant_matrix& d) {
              d.scale_row_stride = 1;
              d.scale_block_stride = 1;
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.scale_block_stride = size_t{1} << 60; }),
            QMOE_STATUS_INVALID_ARGUMENT);
  // None of the refusals above wrote an output (the accepted call below writes them all).
  for (float v : y) ASSERT_EQ(std::memcmp(&v, &kPoison, sizeof v), 0) << "a refused call wrote y";
  // A caller whose struct ends before the group strides gets 0 (plain planes), whatever
  // follows its struct in memory.
  EXPECT_EQ(with([](qmoe_quant_matrix& d) {
              d.struct_size = offsetof(qmoe_quant_matrix, scale_group_stride);
              d.scale_group_stride = 3;
              d.zero_point_group_stride = 5;
            }),
            QMOE_STATUS_OK);
  std::fill(y.begin(), y.end(), kPoison);  // the rest of the test checks nothing is written
  // Group strides: groups that overlap, a group stride past 2^48, and in-group aliasing.
  EXPECT_EQ(with([](qmoe_quant_matrix& d) {
              d.scale_row_stride = 1;
              d.scale_block_stride = 8;
              d.scale_group_stride = 8 * (d.k / d.block_size) - 1;
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("group"), std::string::npos);
  EXPECT_EQ(with([](qmoe_quant_matrix& d) {
              d.scale_row_stride = 1;
              d.scale_block_stride = 8;
              d.scale_group_stride = size_t{1} << 50;
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](qmoe_quant_matrix& d) {
              d.scale_row_stride = 1;
              d.scale_block_stride = 4;
              d.scale_group_stride = 8 * (d.k / d.block_size);
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([&](qmoe_quant_matrix& d) {
              d.zero_points = w.codes.data();
              d.zero_point_row_stride = 1;
              d.zero_point_block_stride = 8;
              d.zero_point_group_stride = 7;
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([&](qmoe_quant_matrix& d) {
              d.zero_points = w.codes.data();
              d.zero_point_row_stride = 0;
              d.zero_point_block_stride = 0;
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([&](qmoe_quant_matrix& d) {
              d.bias = x.data();
              d.bias_dtype = static_cast<qmoe_dtype>(7);
            }),
            QMOE_STATUS_INVALID_ARGUMENT);
  for (float v : y) EXPECT_EQ(std::memcmp(&v, &kPoison, sizeof v), 0);

  size_t bytes = 0;
  EXPECT_EQ(qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT4, 13, 96, &bytes), QMOE_STATUS_OK);
  EXPECT_EQ(bytes, 2u * 3u * 128u);
  EXPECT_EQ(qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT4, 13, 96, nullptr),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_quant_matrix_codes_size(static_cast<qmoe_weight_format>(0), 13, 96, &bytes),
            QMOE_STATUS_UNSUPPORTED_FORMAT);
  EXPECT_EQ(qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT4, 0, 96, &bytes),
            QMOE_STATUS_INVALID_ARGUMENT);
}

// A caller's parallel-for may run other work on a thread while it waits, libqmoe calls
// included. Here each level of the caller's parallel-for first runs a larger GEMM on the same
// context, on the same thread, two levels deep: the outer call holds the context's scratch, the
// first nested call the thread's, the second a buffer of its own. No level may free or share
// another's (this was a use-after-free once: the innermost call regrew the thread's buffer
// under the level above). Every level's result must be the bits a plain context gives.
struct NestingPool {
  qmoe_context* ctx = nullptr;
  const qmoe_quant_matrix* w = nullptr;
  uint32_t k = 0, n = 0, depth = 0;
  std::vector<std::vector<float>> x, y;  // per nesting level

  static void parallel_for(void* state, qmoe_parallel_task_fn task, void* task_state,
                           size_t range) {
    auto* pool = static_cast<NestingPool*>(state);
    if (pool->depth < 2) {
      const uint32_t level = ++pool->depth;
      const uint32_t m = static_cast<uint32_t>(pool->x[level].size() / pool->k);
      EXPECT_EQ(qmoe_gemm(pool->ctx, pool->w, QMOE_ACCURACY_FAST, m, pool->x[level].data(), pool->k,
                          pool->y[level].data(), pool->n, 0, pool->n),
                QMOE_STATUS_OK)
          << qmoe_last_error_message();
      --pool->depth;
    }
    for (size_t i = 0; i < range; ++i) task(task_state, i);
  }
};

TEST(GemmInt4Api, CallsNestedInACallerParallelForKeepTheirScratch) {
  std::mt19937_64 rng(fresh_seed());
  Int4Options o{256, 512, 32};
  Int4Matrix w = make_int4_matrix(o, rng);
  NestingPool pool;
  pool.w = &w.desc;
  pool.k = o.k;
  pool.n = o.n;
  const uint32_t rows[3] = {1, 4, 16};  // each level needs more scratch than the one above
  for (uint32_t m : rows) {
    std::vector<float> x(size_t{m} * o.k);
    for (float& v : x) v = std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
    pool.x.push_back(std::move(x));
    pool.y.emplace_back(size_t{m} * o.n, kPoison);
  }
  qmoe_context_options co;
  qmoe_context_options_init(&co);
  co.num_threads = 2;
  co.parallel_for = &NestingPool::parallel_for;
  co.parallel_for_state = &pool;
  qmoe_context* raw = nullptr;
  ASSERT_EQ(qmoe_context_create(&co, &raw), QMOE_STATUS_OK);
  ContextPtr nesting(raw);
  pool.ctx = nesting.get();
  ASSERT_EQ(qmoe_gemm(pool.ctx, &w.desc, QMOE_ACCURACY_FAST, rows[0], pool.x[0].data(), o.k,
                      pool.y[0].data(), o.n, 0, o.n),
            QMOE_STATUS_OK);
  ContextPtr plain = make_context(default_isa(), 1);
  for (size_t level = 0; level < 3; ++level) {
    std::vector<float> expected(size_t{rows[level]} * o.n, kPoison);
    ASSERT_EQ(qmoe_gemm(plain.get(), &w.desc, QMOE_ACCURACY_FAST, rows[level], pool.x[level].data(),
                        o.k, expected.data(), o.n, 0, o.n),
              QMOE_STATUS_OK);
    EXPECT_EQ(std::memcmp(expected.data(), pool.y[level].data(), expected.size() * sizeof(float)),
              0)
        << "nesting level " << level;
  }
}

}  // namespace
}  // namespace qmoe::testing
