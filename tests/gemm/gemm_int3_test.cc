// INT3 dequant-GEMM per tier and accuracy level: through qmoe_gemm against an FP64 reference of
// its own (tests/gemm/int3_reference.h) and against the scalar tier, over M, N tails, K (K % 32
// == 16 included), block sizes, scale dtypes and plane orders, zero points, bias and partial
// column ranges, with poisoned outputs and guard words; each tier's kernels called directly on
// one group; through qmoe_gemm_typed and the MoE layer (INT3 experts); bad input statuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lib/formats/int3_layout.h"
#include "lib/gemm/group_args.h"
#include "tests/cpu/isa_test_util.h"
#include "tests/cpu/tier_kernels.h"
#include "tests/gemm/int3_reference.h"
#include "tests/gemm/poisoned_gemm.h"
#include "tests/moe/moe_call.h"
#include "tests/moe/moe_reference.h"

namespace qmoe::testing {
namespace {

constexpr float kPoison = kGemmPoison;
constexpr size_t kGuard = kGemmGuard;

const char* level_name(qmoe_accuracy a) {
  return a == QMOE_ACCURACY_EXACT ? "exact" : "fast";
}

// The bound an output of `level` must meet against the FP64 reference (docs/formats.md).
double tolerance(const Reference& ref, qmoe_accuracy level, size_t o) {
  return (level == QMOE_ACCURACY_EXACT ? 1e-5 * ref.abs_sum[o] : ref.fast_bound[o]) + 1e-30;
}

// gemm_into_poisoned_y (tests/gemm/poisoned_gemm.h) against the INT3 FP64 reference and the
// level's bound: the outputs, n per row (the poison outside [n_begin, n_end)).
std::vector<float> run_and_check(qmoe_context* ctx, const Int4Matrix& w, qmoe_accuracy level,
                                 const std::vector<float>& x, uint32_t m, uint32_t n_begin,
                                 uint32_t n_end, const std::string& where) {
  const Reference ref = reference_gemm(w, x, m);
  return gemm_into_poisoned_y(
      ctx, w.desc, level, x, m, n_begin, n_end, [&](size_t o) { return ref.y[o]; },
      [&](size_t o) { return tolerance(ref, level, o); }, where);
}

struct Case {
  Int4Options w;
  uint32_t m;
  uint32_t n_begin, n_end;  // n_end 0 = n
};

class GemmInt3 : public IsaTest {
 protected:
  // The case on this tier and on scalar: both within the reference bound, and within twice it of
  // each other.
  void run_case(const Case& c, qmoe_accuracy level, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const Int4Matrix w = make_int3_matrix(c.w, rng);
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
    const Reference ref = reference_gemm(w, x, c.m);
    int reported = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (!(std::fabs(got[i] - want[i]) <= 2 * tolerance(ref, level, i)) && reported++ < 3) {
        ADD_FAILURE() << where << ": output " << i << " " << got[i] << " vs scalar " << want[i];
      }
    }
  }
};

TEST_P(GemmInt3, ShapesAndTails) {
  const uint64_t seed = fresh_seed();
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    for (uint32_t m : {1u, 2u, 3u, 4u, 5u, 7u, 8u, 17u}) {
      for (uint32_t n : {8u, 13u, 37u}) {  // N % 8 and N % 16 != 0 in the last two
        run_case(Case{{n, 256, 32}, m, 0, 0}, level, seed + m * 131 + n);
      }
    }
  }
}

// K from one block up, K % 32 == 16 (block 16 with an odd block count: a half-filled last tile),
// and a long K, at every block size.
TEST_P(GemmInt3, KFromOneBlockTo4096EveryBlockSize) {
  const uint64_t seed = fresh_seed();
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    for (uint32_t block : {16u, 32u, 64u, 128u}) {
      for (uint32_t blocks : {1u, 2u, 3u, 5u}) {
        for (uint32_t m : {1u, 2u, 5u}) {
          run_case(Case{{21, block * blocks, block}, m, 0, 0}, level,
                   seed + block * 7 + blocks * 3 + m);
        }
      }
      run_case(Case{{19, 4096, block}, 1, 0, 0}, level, seed + block);
    }
  }
}

TEST_P(GemmInt3, ScaleDtypesOrdersZeroPointsAndBias) {
  const uint64_t seed = fresh_seed();
  int variant = 0;
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    for (qmoe_dtype dtype : {QMOE_DTYPE_F16, QMOE_DTYPE_BF16, QMOE_DTYPE_F32}) {
      for (ScaleOrder order : {ScaleOrder::kBlockMajor, ScaleOrder::kRowMajor,
                               ScaleOrder::kPaddedRowMajor, ScaleOrder::kGrouped}) {
        for (bool zeros : {false, true}) {
          for (bool bias : {false, true}) {
            Int4Options o{24, 192, 32, dtype, order, zeros, order, bias, dtype};
            for (uint32_t m : {1u, 3u}) run_case(Case{o, m, 0, 0}, level, seed + ++variant);
          }
        }
      }
      // Block 16 (two scales per tile) with zero points, in a plane order of each kind.
      for (ScaleOrder order : {ScaleOrder::kRowMajor, ScaleOrder::kGrouped}) {
        Int4Options b16{16, 80, 16, dtype, order, true, order, true, QMOE_DTYPE_F16};
        for (uint32_t m : {1u, 2u}) run_case(Case{b16, m, 0, 0}, level, seed + ++variant);
      }
    }
  }
}

TEST_P(GemmInt3, PartialColumnRangesWriteOnlyTheirColumns) {
  const uint64_t seed = fresh_seed();
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    const uint32_t ranges[][2] = {{0, 1},  {3, 4},   {5, 13}, {6, 8},  {8, 16},
                                  {9, 37}, {36, 37}, {1, 36}, {16, 33}};
    for (const auto& r : ranges) {
      for (uint32_t m : {1u, 3u, 6u}) {
        Case c{{37, 96, 32, QMOE_DTYPE_F16, ScaleOrder::kGrouped, true, ScaleOrder::kGrouped},
               m,
               r[0],
               r[1]};
        run_case(c, level, seed + r[0] * 100 + r[1] + m);
      }
    }
  }
}

// Activations near the top of the float range, where the AVX2 exact kernel's shifted form (sums
// scaled by 2^24) overflows unless it notices and recomputes; and a NaN in X, which must reach
// every output of its row.
TEST_P(GemmInt3, ExtremeActivations) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (bool zero_points : {false, true}) {
    const Int4Matrix w =
        make_int3_matrix({21, 256, 32, QMOE_DTYPE_F32, ScaleOrder::kGrouped, zero_points}, rng);
    for (uint32_t m : {1u, 3u, 4u, 5u}) {
      std::vector<float> x = random_activations(m, 256, rng);
      for (float& v : x) v = std::ldexp(v, 100);  // |x| up to about 1e32; sums stay finite
      ContextPtr ctx = make_context(GetParam(), 1);
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        run_and_check(ctx.get(), w, level, x, m, 0, 21,
                      std::string(isa_name(GetParam())) + "/" + level_name(level) +
                          " x * 2^100 m=" + std::to_string(m) +
                          (zero_points ? " zero points" : "") + " seed=" + std::to_string(seed));
      }
      x[size_t{m - 1} * 256 + 77] = std::nanf("");
      std::vector<float> y(size_t{m} * 21, 0.0f);
      ASSERT_EQ(
          qmoe_gemm(ctx.get(), &w.desc, QMOE_ACCURACY_EXACT, m, x.data(), 256, y.data(), 21, 0, 21),
          QMOE_STATUS_OK);
      for (uint32_t i = 0; i < m; ++i) {
        for (uint32_t j = 0; j < 21; ++j) {
          EXPECT_EQ(std::isnan(y[i * 21 + j]), i == m - 1)
              << "m=" << m << " y[" << i << "," << j << "] " << y[i * 21 + j];
        }
      }
    }
  }
}

// Scales near FLT_MAX: (code - z) * scale overflows while every output is finite; the AVX-512
// exact kernel's tables hold those products and must hand such groups to the scalar kernel.
TEST_P(GemmInt3, ScalesNearFltMaxStayFinite) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (bool zero_points : {false, true}) {
    Int4Matrix w =
        make_int3_matrix({21, 256, 32, QMOE_DTYPE_F32, ScaleOrder::kRowMajor, zero_points}, rng);
    for (size_t i = 0; i < w.scale_values.size(); ++i) {  // times 2^130: 2^121 to 2^125.6
      w.scale_values[i] = std::ldexp(w.scale_values[i], 130);
      const float v = static_cast<float>(w.scale_values[i]);
      std::memcpy(w.scales.data() + i * sizeof(float), &v, sizeof(float));
    }
    ContextPtr ctx = make_context(GetParam(), 1);
    for (uint32_t m : {1u, 2u, 3u}) {
      std::vector<float> x = random_activations(m, 256, rng);
      for (float& v : x) v = std::ldexp(v, -20);
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        run_and_check(ctx.get(), w, level, x, m, 0, 21,
                      std::string(isa_name(GetParam())) + "/" + level_name(level) +
                          " scales * 2^130 m=" + std::to_string(m) +
                          (zero_points ? " zero points" : "") + " seed=" + std::to_string(seed));
      }
    }
  }
}

// Chunks whose max|x| is below 2^-119 are flushed by the fast level's quantizer; the bound must
// still hold (chunks at 2^-130, 2^-121, 2^-119, 2^-110 and ordinary ones).
TEST_P(GemmInt3, TinyActivationsMeetTheBound) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const Int4Matrix w = make_int3_matrix({19, 320, 32, QMOE_DTYPE_F16, ScaleOrder::kGrouped}, rng);
  ContextPtr ctx = make_context(GetParam(), 1);
  for (uint32_t m : {1u, 4u}) {
    std::vector<float> x = random_activations(m, 320, rng);
    for (size_t i = 0; i < x.size(); ++i) {
      const int exponents[] = {-130, -121, -119, -110, 0};
      const int e = exponents[(i / 32) % 5];
      x[i] = i % 32 == 0 ? std::ldexp(1.0f, e) : std::ldexp(std::fmod(x[i], 1.0f), e);
    }
    run_and_check(ctx.get(), w, QMOE_ACCURACY_FAST, x, m, 0, 19,
                  std::string(isa_name(GetParam())) + "/fast tiny activations m=" +
                      std::to_string(m) + " seed=" + std::to_string(seed));
  }
}

// Columns are split over threads, never K: the thread count does not change a bit.
TEST_P(GemmInt3, ThreadCountDoesNotChangeTheResult) {
  std::mt19937_64 rng(fresh_seed());
  const Int4Options o{203, 512, 32, QMOE_DTYPE_F16, ScaleOrder::kBlockMajor, true};
  const Int4Matrix w = make_int3_matrix(o, rng);
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
          << level_name(level) << " m=" << m;
    }
  }
}

// FP16 X and Y through qmoe_gemm_typed: the bits of widening X, qmoe_gemm, and rounding Y.
TEST_P(GemmInt3, TypedActivations) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const Int4Matrix w = make_int3_matrix({29, 160, 32, QMOE_DTYPE_BF16, ScaleOrder::kGrouped}, rng);
  ContextPtr ctx = make_context(GetParam(), 1);
  const uint32_t m = 3;
  const std::vector<float> x = random_activations(m, 160, rng);
  std::vector<uint16_t> x16(x.size()), y16(size_t{m} * 29), want16(size_t{m} * 29);
  std::vector<float> x_back(x.size()), y(size_t{m} * 29);
  ASSERT_EQ(qmoe_convert_f32_to_f16(ctx.get(), x.data(), x16.data(), x.size()), QMOE_STATUS_OK);
  ASSERT_EQ(qmoe_convert_f16_to_f32(ctx.get(), x16.data(), x_back.data(), x.size()),
            QMOE_STATUS_OK);
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    ASSERT_EQ(qmoe_gemm(ctx.get(), &w.desc, level, m, x_back.data(), 160, y.data(), 29, 0, 29),
              QMOE_STATUS_OK);
    ASSERT_EQ(qmoe_convert_f32_to_f16(ctx.get(), y.data(), want16.data(), y.size()),
              QMOE_STATUS_OK);
    ASSERT_EQ(qmoe_gemm_typed(ctx.get(), &w.desc, level, m, QMOE_DTYPE_F16, x16.data(), 160,
                              QMOE_DTYPE_F16, y16.data(), 29, 0, 29),
              QMOE_STATUS_OK)
        << qmoe_last_error_message();
    EXPECT_EQ(y16, want16) << level_name(level) << " seed=" << seed;
  }
}

// Randomised shapes and options (every block size, K up to 512, N 1..70, every dtype, order,
// zero-point and bias option, M 1..9, random column ranges) against the FP64 reference.
TEST_P(GemmInt3, Fuzz) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (int iteration = 0; iteration < 60; ++iteration) {
    const Int4Options o = random_int4_options(rng, 512);
    const uint32_t m = static_cast<uint32_t>(1 + rng() % 9);
    const uint32_t a = static_cast<uint32_t>(rng() % o.n), b = static_cast<uint32_t>(rng() % o.n);
    run_case(Case{o, m, std::min(a, b), std::max(a, b) + 1},
             rng() % 2 ? QMOE_ACCURACY_EXACT : QMOE_ACCURACY_FAST, seed + iteration);
  }
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(GemmInt3);

// ---------------------------------------------------------------------------------------------
// The kernels themselves, one 8-row group per call, as the GEMM driver calls them: scales in
// place at strides above 8 (the driver's panels use exactly 8), every row range, M up to 9.

// One random group's inputs in the kernel contract (lib/gemm/group_args.h): random tile bytes,
// scales that are multiples of 2^-16 below 2^-6 (exact in every scale dtype but BF16, which
// rounds them once), zero points 0..7, X of multiples of 1/64, quantized by the scalar tier.
struct RandomGroup {
  uint32_t block, chunks, m;
  qmoe_dtype dtype;
  bool zeros, bias;
  uint32_t row_begin, row_end;
  size_t scale_stride, zero_stride, k;
  std::vector<uint8_t> codes;
  std::vector<float> scale_values;
  std::vector<unsigned char> scales;
  std::vector<uint8_t> zero_points;
  std::vector<float> bias_values, x, x_scale, x_sum;
  std::vector<int8_t> q;
  // Per output (activation row i, group row r: [i * 8 + r]) the size of its rounding error at
  // either level: sum over k of |x (code - z) scale| (exact) or |q (code - z) scale| x_scale
  // (fast), plus |bias|.
  std::vector<double> magnitude[2];

  explicit RandomGroup(std::mt19937_64& rng) {
    const KernelTable& scalar = scalar_kernels();
    block = 16u << (rng() % 4);
    chunks = static_cast<uint32_t>(1 + rng() % 9);
    m = static_cast<uint32_t>(1 + rng() % 9);
    dtype = static_cast<qmoe_dtype>(1 + rng() % 3);
    zeros = rng() % 2;
    bias = rng() % 2;
    row_begin = static_cast<uint32_t>(rng() % 8);
    row_end = row_begin + 1 + static_cast<uint32_t>(rng() % (8 - row_begin));
    scale_stride = 8 + rng() % 3;
    zero_stride = 8 + rng() % 3;
    const uint32_t blocks = (chunks * 32 + block - 1) / block;
    codes.resize(size_t{chunks} * kInt3TileBytes);
    for (uint8_t& b : codes) b = static_cast<uint8_t>(rng());
    scale_values.resize(blocks * scale_stride);
    for (float& v : scale_values) v = std::ldexp(static_cast<float>(rng() % 2000) - 1000.0f, -16);
    scales.resize(scale_values.size() * 4);
    if (dtype == QMOE_DTYPE_F32) {
      std::memcpy(scales.data(), scale_values.data(), scales.size());
    } else {
      auto* bits = reinterpret_cast<uint16_t*>(scales.data());
      (dtype == QMOE_DTYPE_F16 ? scalar.convert_f32_to_f16.fn : scalar.convert_f32_to_bf16.fn)(
          scale_values.data(), bits, scale_values.size());
    }
    zero_points.resize(blocks * zero_stride);
    for (uint8_t& z : zero_points) z = static_cast<uint8_t>(rng() % 8);
    bias_values.resize(8);
    for (float& b : bias_values) b = static_cast<float>(rng() % 100) - 50.0f;
    k = size_t{chunks} * 32;
    x.resize(m * k);
    for (float& v : x) v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 64.0f;
    q.resize(m * k);
    x_scale.resize(m * chunks);
    x_sum.resize(m * chunks);
    for (uint32_t i = 0; i < m; ++i) {
      scalar.quantize_activations_q8.fn(x.data() + i * k, k, q.data() + i * k,
                                        x_scale.data() + i * chunks, x_sum.data() + i * chunks);
    }
    for (int l = 0; l < 2; ++l) magnitude[l].assign(size_t{m} * 8, 0.0);
    for (uint32_t i = 0; i < m; ++i) {
      for (uint32_t r = 0; r < 8; ++r) {
        double exact = bias ? std::fabs(bias_values[r]) : 0.0, fast = exact;
        for (uint32_t kk = 0; kk < k; ++kk) {
          const uint32_t b = kk / block;
          const double w = (canonical_int3_code(codes.data(), r, kk, static_cast<uint32_t>(k)) -
                            (zeros ? zero_points[b * zero_stride + r] : 4.0)) *
                           static_cast<double>(scale_values[b * scale_stride + r]);
          exact += std::fabs(x[i * k + kk] * w);
          fast += std::fabs(q[i * k + kk] * w) * x_scale[i * chunks + kk / 32];
        }
        magnitude[0][i * 8 + r] = exact;
        magnitude[1][i * 8 + r] = fast;
      }
    }
  }

  std::string describe() const {
    return "block=" + std::to_string(block) + " chunks=" + std::to_string(chunks) +
           " m=" + std::to_string(m) + " dtype=" + std::to_string(dtype) +
           " zeros=" + std::to_string(zeros) + " bias=" + std::to_string(bias) + " rows [" +
           std::to_string(row_begin) + "," + std::to_string(row_end) + ")";
  }

  // The kernel's outputs in a poisoned buffer of m rows 11 floats apart between guard words.
  std::vector<float> run(GemmGroupFn fn) const {
    constexpr size_t kLdy = 11;
    std::vector<float> y(2 * kGuard + m * kLdy, kPoison);
    GemmGroupArgs a{};
    a.codes = codes.data();
    a.chunks = chunks;
    a.block_size = block;
    a.scale_dtype = dtype;
    a.scales = scales.data();
    a.scale_block_stride = scale_stride;
    a.zero_points = zeros ? zero_points.data() : nullptr;
    a.zero_point_block_stride = zero_stride;
    a.bias = bias ? bias_values.data() : nullptr;
    a.m = m;
    a.x = x.data();
    a.ldx = k;
    a.xq = Q8Activations{q.data(), x_scale.data(), x_sum.data(), k,
                         chunks,   nullptr};  // e2m1_start: read by E2M1 formats only
    a.y = y.data() + kGuard;
    a.ldy = kLdy;
    a.row_begin = row_begin;
    a.row_end = row_end;
    fn(a);
    return y;
  }

  // Whether word i of run()'s buffer is an output (activation row *act, group row *row).
  bool output(size_t i, size_t* act, size_t* row) const {
    constexpr size_t kLdy = 11;
    if (i < kGuard || i >= kGuard + m * kLdy) return false;
    *act = (i - kGuard) / kLdy;
    *row = (i - kGuard) % kLdy;
    return *row >= row_begin && *row < row_end;
  }
};

class GemmInt3Kernel : public IsaTest {};

TEST_P(GemmInt3Kernel, GroupsMatchScalarAndKeepTheirGuards) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (int iteration = 0; iteration < 400; ++iteration) {
    const RandomGroup g(rng);
    for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      const std::vector<float> got = g.run(gemm_kernel(table(), QMOE_WEIGHT_FORMAT_INT3, level).fn);
      const std::vector<float> want =
          g.run(gemm_kernel(scalar_kernels(), QMOE_WEIGHT_FORMAT_INT3, level).fn);
      const std::string where = std::string(isa_name(GetParam())) + "/" + level_name(level) + " " +
                                g.describe() + " seed=" + std::to_string(seed);
      for (size_t i = 0; i < got.size(); ++i) {
        size_t act = 0, row = 0;
        if (!g.output(i, &act, &row)) {
          ASSERT_EQ(std::memcmp(&got[i], &kPoison, sizeof(float)), 0)
              << where << ": word " << i << " outside the group's rows changed";
          continue;
        }
        // Both kernels sum the same exact products in FP32 in different orders.
        const double tol =
            1e-5 * g.magnitude[level == QMOE_ACCURACY_EXACT ? 0 : 1][act * 8 + row] + 1e-30;
        ASSERT_LE(std::fabs(static_cast<double>(got[i]) - want[i]), tol)
            << where << ": output " << i << " " << got[i] << " vs scalar " << want[i];
      }
    }
  }
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(GemmInt3Kernel);

#if defined(QMOE_HAVE_X86_TIERS)

// INT3 kernels of the list's extension ISAs (AVX512-VNNI, avx512gfni): named by the extension,
// never taken by the assembled table of their tier when the host lacks the features, and bit for
// bit the plain kernel of their tier (the same exact integer sums through the same float
// epilogue).
TEST(GemmInt3Extension, PickedOnlyWithTheFeatureAndBitIdenticalToThePlainKernel) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  int ran = 0;
  for (CpuIsa isa : extension_isas()) {
    const CpuIsaInfo& info = cpu_isa_info(isa);
    const KernelEntry<GemmGroupFn> fast =
        gemm_kernel(*info.table, QMOE_WEIGHT_FORMAT_INT3, QMOE_ACCURACY_FAST);
    if (fast.fn == nullptr) continue;
    EXPECT_EQ(std::string(fast.name), std::string("qmoe_gemm_int3_fast_8x32__") + info.name);
    if (const char* reason = cpu_isa_unavailable_reason(isa)) {
      std::printf("%s skipped: %s\n", info.name, reason);
      if (const KernelTable* assembled = kernel_table_for_isa(info.tier)) {
        EXPECT_NE(gemm_kernel(*assembled, QMOE_WEIGHT_FORMAT_INT3, QMOE_ACCURACY_FAST).fn, fast.fn);
      }
      continue;
    }
    const KernelTable* assembled = kernel_table_for_isa(info.tier);
    ASSERT_NE(assembled, nullptr);
    // The tier's table holds this kernel unless a later extension the host also has provides
    // the entry (tests/cpu/tier_kernels.h has the rule); either way, it holds the rule's.
    const KernelEntry<GemmGroupFn> held =
        gemm_kernel(*assembled, QMOE_WEIGHT_FORMAT_INT3, QMOE_ACCURACY_FAST);
    int rules = 0;
    for (const ExpectedKernel& want : expected_tier_kernels(info.tier)) {
      if (want.operation == "gemm" && want.format == QMOE_WEIGHT_FORMAT_INT3 &&
          want.accuracy == QMOE_ACCURACY_FAST) {
        EXPECT_EQ(std::string(held.name), want.name);
        EXPECT_EQ(reinterpret_cast<const void*>(held.fn), want.fn);
        ++rules;
      }
    }
    EXPECT_EQ(rules, 1) << "the tier rule has no gemm[int3][fast] entry for " << info.name;
    const KernelTable* plain = nullptr;
    for (uint32_t i = 0; i < kCpuIsaCount; ++i) {
      const CpuIsaInfo& base = cpu_isa_info(static_cast<CpuIsa>(i));
      if (base.tier == info.tier && base.feature == 0) plain = base.table;
    }
    ASSERT_NE(plain, nullptr);
    const GemmGroupFn plain_fast =
        gemm_kernel(*plain, QMOE_WEIGHT_FORMAT_INT3, QMOE_ACCURACY_FAST).fn;
    for (int iteration = 0; iteration < 300; ++iteration) {
      const RandomGroup g(rng);
      const std::vector<float> got = g.run(fast.fn), want = g.run(plain_fast);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << info.name << " " << g.describe() << " seed=" << seed;
    }
    ++ran;
  }
  if (ran == 0) GTEST_SKIP() << "no INT3 extension kernel this host can run";
}

#endif

// ---------------------------------------------------------------------------------------------
// The MoE layer with INT3 experts: FC2 only (an INT4 FC1), and both projections.

class MoeInt3 : public IsaTest {};

struct SetDeleter {
  void operator()(qmoe_expert_set* s) const { qmoe_expert_set_destroy(s); }
};

TEST_P(MoeInt3, ExpertsWithInt3ProjectionsMeetTheLayerBound) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (bool int3_fc1 : {false, true}) {
    MoeOptions o;
    o.experts = 5;
    o.hidden = 96;
    o.intermediate = 48;
    use_gpt_oss_swiglu(&o);
    o.fc1.block_size = 32;
    o.fc1.scale_order = ScaleOrder::kRowMajor;
    o.fc1.bias = true;
    o.fc2.block_size = 16;  // K = 48: half-filled last tiles
    o.fc2.scale_order = ScaleOrder::kGrouped;
    o.fc2.zero_points = true;
    o.fc2.zero_point_order = ScaleOrder::kGrouped;
    const auto model = make_moe_model(o, rng);
    // Replace the projections with INT3 ones of the same options: the set reads model->fcX[e]'s
    // description, which a move keeps pointing at the moved buffers.
    for (uint32_t e = 0; e < o.experts; ++e) {
      Int4Options fc2 = o.fc2;
      fc2.n = o.hidden;
      fc2.k = o.intermediate;
      model->fc2[e] = make_int3_matrix(fc2, rng);
      if (int3_fc1) {
        Int4Options fc1 = o.fc1;
        fc1.n = 2 * o.intermediate;
        fc1.k = o.hidden;
        model->fc1[e] = make_int3_matrix(fc1, rng);
      }
    }
    qmoe_expert_set* raw = nullptr;
    ASSERT_EQ(qmoe_expert_set_create(&model->desc, &raw), QMOE_STATUS_OK)
        << qmoe_last_error_message();
    std::unique_ptr<qmoe_expert_set, SetDeleter> set(raw);
    ContextPtr ctx = make_context(GetParam(), 2);
    for (uint32_t m : {1u, 3u}) {
      const uint32_t k = 2;
      std::vector<float> x = random_activations(m, o.hidden, rng);
      for (float& v : x) v *= 4.0f;  // FC1 outputs cross gpt-oss's limit of 7
      std::vector<int32_t> ids;
      std::vector<float> weights;
      random_routing(m, o.experts, k, rng, &ids, &weights);
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        std::vector<float> y(2 * kGuard + size_t{m} * o.hidden, kPoison);
        ASSERT_EQ(moe_forward(ctx.get(), set.get(), level, m, x.data(), o.hidden, ids.data(),
                              weights.data(), k, y.data() + kGuard, o.hidden, nullptr),
                  QMOE_STATUS_OK)
            << qmoe_last_error_message();
        const MoeReference ref = reference_moe(*model, level, x, m, ids, weights, k, nullptr, {});
        const std::string where = std::string(isa_name(GetParam())) + "/" + level_name(level) +
                                  (int3_fc1 ? " INT3 FC1 and FC2" : " INT3 FC2") +
                                  " m=" + std::to_string(m) + " seed=" + std::to_string(seed);
        int reported = 0;
        for (size_t i = 0; i < y.size(); ++i) {
          if (i < kGuard || i >= kGuard + size_t{m} * o.hidden) {
            EXPECT_EQ(std::memcmp(&y[i], &kPoison, sizeof(float)), 0) << where << ": guard " << i;
            continue;
          }
          const size_t o_i = i - kGuard;
          const double err = std::fabs(static_cast<double>(y[i]) - ref.y[o_i]);
          if (!(err <= ref.tol[o_i]) && reported++ < 3) {
            ADD_FAILURE() << where << ": y[" << o_i << "] = " << y[i] << ", FP64 reference "
                          << ref.y[o_i] << ", |err| " << err << " > tol " << ref.tol[o_i];
          }
        }
      }
    }
  }
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(MoeInt3);

// ---------------------------------------------------------------------------------------------
// The ABI around INT3 weights.

TEST(GemmInt3Api, KernelsAreAvailableAndNamedPerTier) {
  for (Isa isa : built_tiers()) {
    if (isa_unavailable_reason(isa) != nullptr) continue;
    ContextPtr ctx = make_context(isa, 1);
    for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      for (uint32_t block : {16u, 32u, 64u, 128u}) {
        int available = -1;
        const char* name = nullptr;
        ASSERT_EQ(qmoe_gemm_kernel_available(ctx.get(), QMOE_WEIGHT_FORMAT_INT3, block, level,
                                             &available, &name),
                  QMOE_STATUS_OK);
        EXPECT_EQ(available, 1);
        // The tier's own kernel, or (fast) one of an extension of the tier the host has.
        const std::string prefix = std::string("qmoe_gemm_int3_") + level_name(level) + "_8x32__";
        EXPECT_EQ(std::string(name).rfind(prefix + isa_name(isa), 0), 0u) << name;
        EXPECT_STREQ(name,
                     gemm_kernel(*kernel_table_for_isa(isa), QMOE_WEIGHT_FORMAT_INT3, level).name);
      }
      int available = -1;
      ASSERT_EQ(qmoe_gemm_kernel_available(ctx.get(), QMOE_WEIGHT_FORMAT_INT3, 8, level, &available,
                                           nullptr),
                QMOE_STATUS_OK);
      EXPECT_EQ(available, 0);
    }
  }
}

TEST(GemmInt3Api, BadInputGetsAStatusAndWritesNothing) {
  std::mt19937_64 rng(11);
  Int4Matrix w = make_int3_matrix({16, 64, 32}, rng);
  std::vector<float> x(64, 1.0f), y(16, kPoison);
  ContextPtr ctx = make_context(default_isa(), 1);
  auto with = [&](auto&& edit) {
    qmoe_quant_matrix d = w.desc;
    edit(d);
    return qmoe_gemm(ctx.get(), &d, QMOE_ACCURACY_FAST, 1, x.data(), 64, y.data(), 16, 0, 16);
  };
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.block_size = 8; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("int3"), std::string::npos);
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.block_size = 256; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.k = 48; }), QMOE_STATUS_INVALID_ARGUMENT);
  for (qmoe_dtype byte_scale : {QMOE_DTYPE_E8M0, QMOE_DTYPE_F8_E4M3}) {
    EXPECT_EQ(with([&](qmoe_quant_matrix& d) { d.scale_dtype = byte_scale; }),
              QMOE_STATUS_UNSUPPORTED_FORMAT);
  }
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.global_scale = 2.0f; }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.codes = nullptr; }), QMOE_STATUS_INVALID_ARGUMENT);
  // Y over the INT3 codes (96 bytes a tile: the overlap check must use the format's size).
  EXPECT_EQ(qmoe_gemm(ctx.get(), &w.desc, QMOE_ACCURACY_FAST, 1, x.data(), 64,
                      reinterpret_cast<float*>(w.codes.data() + 2 * 96 - 8), 16, 0, 2),
            QMOE_STATUS_INVALID_ARGUMENT);
  for (float v : y) ASSERT_EQ(std::memcmp(&v, &kPoison, sizeof v), 0) << "a refused call wrote y";
  EXPECT_EQ(with([](qmoe_quant_matrix& d) { d.global_scale = 1.0f; }), QMOE_STATUS_OK);

  size_t bytes = 0;
  EXPECT_EQ(qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT3, 13, 96, &bytes), QMOE_STATUS_OK);
  EXPECT_EQ(bytes, 2u * 3u * 96u);
  EXPECT_EQ(qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT3, 8, 16, &bytes), QMOE_STATUS_OK);
  EXPECT_EQ(bytes, 96u);
  EXPECT_EQ(qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT3, 8, QMOE_MAX_MATRIX_DIM, &bytes),
            QMOE_STATUS_OK);
  EXPECT_EQ(bytes, size_t{QMOE_MAX_MATRIX_DIM} / 32 * 96);
  EXPECT_EQ(
      qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT3, 8, QMOE_MAX_MATRIX_DIM + 1, &bytes),
      QMOE_STATUS_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace qmoe::testing
