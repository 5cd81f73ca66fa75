// The decode GEMV's own code (lib/cuda/int4_gemv.cu) run on the host by
// tests/cuda/cuda_host_emulator.h, so that CI, which has no GPU, executes it: the launcher's
// split and grid, the round-major persistent loop, the staging, the walks with two batches in
// flight and the cross-warp sums, on emulated devices of 1 to 3 multiprocessors (many rounds per
// block), for INT4, INT3, MXFP4 and NVFP4 weights. Against the FP64 references within the device
// test's bounds (and, for INT3 and the E2M1 formats, against the CPU library's qmoe_gemm), with
// poisoned outputs and guards. The device tests (int4_gemv_test.cu, fp4_gemv_test.cu) cover the
// hardware's own arithmetic and order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "qmoe/qmoe.h"
#include "tests/cuda/decode_emulation_util.h"
#include "tests/gemm/fp4_reference.h"
#include "tests/gemm/int3_reference.h"
#include "tests/gemm/int4_reference.h"
// The kernel source with its namespace renamed (the library linked into this binary defines the
// real one).
#define qmoe qmoe_gemv_emulation
#include "lib/cuda/int4_gemv.cu"  // NOLINT(build/include)
#undef qmoe

namespace qmoe::testing {
namespace {

namespace emu = ::qmoe_gemv_emulation::cuda;

// ---- GEMV ------------------------------------------------------------------------------------

struct GemvCase {
  qmoe_accuracy accuracy;
  uint32_t m;
  qmoe_dtype xd, yd;
  size_t ldx, ldy;
  uint32_t n_begin, n_end;
};

std::string describe_case(const Int4Matrix& w, const GemvCase& c, int sms,
                          const emu::Int4GemvConfig* config) {
  std::ostringstream s;
  s << w.options.describe() << (c.accuracy == QMOE_ACCURACY_EXACT ? " exact" : " fast")
    << " m=" << c.m << " x=" << label(c.xd) << " y=" << label(c.yd) << " ldx=" << c.ldx
    << " ldy=" << c.ldy << " cols=[" << c.n_begin << "," << c.n_end << ") sms=" << sms;
  if (config != nullptr) {
    s << " kw=" << config->k_warps << " rounds=" << config->rounds
      << " tile=" << config->tile_chunks;
  }
  return s.str();
}

// One GEMV launch on the emulated device: X values ([m][k]) staged in c.xd at ldx, y between
// two guards of kGuard poisoned elements, and the widened X the kernel reads ([m][k]: what the
// references take).
struct GemvLaunch {
  static constexpr size_t kGuard = 16;
  std::vector<unsigned char> y;
  std::vector<float> xw;
  cudaError_t error = cudaSuccess;
};

template <class Matrix>
GemvLaunch launch_gemv(const Matrix& w, const GemvCase& c, const std::vector<float>& x_values,
                       int sms, const emu::Int4GemvConfig* config) {
  qmoe_emu::device().sm_count = sms;
  const uint32_t k = w.options.k;
  std::vector<float> xs(size_t{c.m} * c.ldx, 0.0f);
  for (uint32_t i = 0; i < c.m; ++i) {
    for (uint32_t j = 0; j < k; ++j) xs[i * c.ldx + j] = x_values[size_t{i} * k + j];
  }
  const std::vector<unsigned char> xb = to_bytes(c.xd, xs);
  GemvLaunch l;
  l.y.assign((2 * GemvLaunch::kGuard + size_t{c.m} * c.ldy) * dsize(c.yd), kPoison);
  void* y0 = l.y.data() + GemvLaunch::kGuard * dsize(c.yd);
  const emu::DeviceQuantMatrix d = describe_host<emu::DeviceQuantMatrix>(w);
  l.error = config == nullptr ? emu::launch_int4_gemv(d, c.accuracy, c.m, c.xd, xb.data(), c.ldx,
                                                      c.yd, y0, c.ldy, c.n_begin, c.n_end, nullptr)
                              : emu::launch_int4_gemv_with_config(
                                    d, c.accuracy, c.m, c.xd, xb.data(), c.ldx, c.yd, y0, c.ldy,
                                    c.n_begin, c.n_end, *config, nullptr);
  l.xw.resize(size_t{c.m} * k);
  for (uint32_t i = 0; i < c.m; ++i) {
    for (uint32_t j = 0; j < k; ++j)
      l.xw[size_t{i} * k + j] = element(c.xd, xb.data(), i * c.ldx + j);
  }
  return l;
}

// Walks every element of the launch's y: one the case writes (row i, column col in
// [n_begin, n_end)) goes to check(i, col, got); any other must still be the poison (a failure,
// counted in *bad, otherwise).
template <class Check>
void check_gemv_outputs(const GemvLaunch& l, const GemvCase& c, const std::string& what,
                        size_t* bad, Check check) {
  const size_t es = dsize(c.yd);
  for (size_t el = 0; el < l.y.size() / es; ++el) {
    const size_t g = GemvLaunch::kGuard;
    if (el >= g && el < g + size_t{c.m} * c.ldy) {
      const uint32_t i = static_cast<uint32_t>((el - g) / c.ldy);
      const uint32_t col = static_cast<uint32_t>((el - g) % c.ldy);
      if (col >= c.n_begin && col < c.n_end) {
        check(i, col, element(c.yd, l.y.data(), el));
        continue;
      }
    }
    for (size_t b = 0; b < es; ++b) {
      if (l.y[el * es + b] != kPoison && (*bad)++ < 5) {
        ADD_FAILURE() << "element " << el << " outside the written columns changed; " << what;
      }
    }
  }
}

// The CPU library's qmoe_gemm of `w` on X [m][k] (FP32), every column.
std::vector<float> cpu_gemm(const qmoe_quant_matrix& w, qmoe_accuracy accuracy, uint32_t m,
                            const std::vector<float>& x, const std::string& what) {
  qmoe_context* ctx = nullptr;
  EXPECT_EQ(qmoe_context_create(nullptr, &ctx), QMOE_STATUS_OK);
  std::vector<float> y(size_t{m} * w.n, 0.0f);
  EXPECT_EQ(qmoe_gemm(ctx, &w, accuracy, m, x.data(), w.k, y.data(), w.n, 0, w.n), QMOE_STATUS_OK)
      << qmoe_last_error_message() << "; " << what;
  qmoe_context_destroy(ctx);
  return y;
}

// Runs the GEMV (auto split or `config`) on X values `x` ([m][k]) and checks every output
// against the FP64 reference within the device test's bounds (the level's bound plus the output
// dtype's rounding), and the poison elsewhere. An INT3 matrix (tests/gemm/int3_reference.h: the
// INT4 model with codes 0..7, packed by the test's own implementation of docs/formats.md) also
// against the CPU library's qmoe_gemm on the same widened X (both within their bounds of the
// reference: within the sum of the two).
void run_gemv(const Int4Matrix& w, const GemvCase& c, const std::vector<float>& x_values, int sms,
              const emu::Int4GemvConfig* config = nullptr) {
  const uint32_t n = w.options.n;
  const bool int3 = w.desc.format == QMOE_WEIGHT_FORMAT_INT3;
  const GemvLaunch l = launch_gemv(w, c, x_values, sms, config);
  const std::string what = (int3 ? "int3 " : "") + describe_case(w, c, sms, config);
  ASSERT_EQ(l.error, cudaSuccess) << what;
  const Reference ref = reference_gemm(w, l.xw, c.m);
  const std::vector<float> cpu =
      int3 ? cpu_gemm(w.desc, c.accuracy, c.m, l.xw, what) : std::vector<float>{};
  size_t bad = 0;
  check_gemv_outputs(l, c, what, &bad, [&](uint32_t i, uint32_t col, double got) {
    const size_t o = size_t{i} * n + col;
    const double tol =
        (c.accuracy == QMOE_ACCURACY_EXACT ? 1e-5 * ref.abs_sum[o] : ref.fast_bound[o]) + 1e-30;
    if (!output_matches(c.yd, got, ref.y[o], tol) && bad++ < 5) {
      ADD_FAILURE() << "y[" << i << "," << col << "] = " << got << ", FP64 reference " << ref.y[o]
                    << " +- " << tol << " (row " << col % 8 << " of its group); " << what;
    }
    if (int3 && !output_matches(c.yd, got, cpu[o], 2 * tol) && bad++ < 5) {
      ADD_FAILURE() << "y[" << i << "," << col << "] = " << got << ", CPU library " << cpu[o]
                    << " +- " << 2 * tol << " (row " << col % 8 << " of its group); " << what;
    }
  });
  EXPECT_EQ(bad, 0u) << what;
}

// A random matrix of `format` (INT4, or INT3: tests/gemm/int3_reference.h) with options `o`.
Int4Matrix make_matrix(qmoe_weight_format format, const Int4Options& o, std::mt19937_64& rng) {
  Int4Matrix w =
      format == QMOE_WEIGHT_FORMAT_INT3 ? make_int3_matrix(o, rng) : make_int4_matrix(o, rng);
  EXPECT_EQ(w.desc.format, format);
  return w;
}

// The part of a random case that every random test draws alike: leading dimensions 0 to 4 past
// K and N and, one time in three each, the columns from a random first one and to a random last.
void draw_strides_and_columns(GemvCase* c, uint32_t n, uint32_t k, std::mt19937_64& rng) {
  c->ldx = k + rng() % 5;
  c->ldy = n + rng() % 5;
  c->n_begin = rng() % 3 == 0 ? static_cast<uint32_t>(rng() % n) : 0;
  c->n_end = rng() % 3 == 0 ? c->n_begin + 1 + static_cast<uint32_t>(rng() % (n - c->n_begin)) : n;
}

// A model-size K with the launcher's own split on a 2-SM device: N x K at M, block 32, FP16
// scales (and zero points where asked) in the grouped order, a bias where N is 96.
struct ModelKShape {
  uint32_t n, k;
  qmoe_accuracy acc;
  uint32_t m;
  bool zero_points;
};

void check_model_k_auto_split(qmoe_weight_format format, const std::vector<ModelKShape>& shapes,
                              std::mt19937_64& rng) {
  for (const ModelKShape& s : shapes) {
    Int4Options o = grouped_int4_options(s.n, s.k, s.zero_points, s.n == 96);
    o.zero_point_order = ScaleOrder::kGrouped;
    const Int4Matrix w = make_matrix(format, o, rng);
    GemvCase c{s.acc, s.m, QMOE_DTYPE_F32, QMOE_DTYPE_F32, s.k, s.n, 0, s.n};
    run_gemv(w, c, random_activations(s.m, s.k, rng), 2);
    if (::testing::Test::HasFailure()) return;
  }
}

// Every split kind forced on one problem of `format` (33 chunks: a partial last quad; N = 61:
// rows 5..7 of the last group are padding).
void check_forced_splits(qmoe_weight_format format, std::mt19937_64& rng) {
  const Int4Options o = grouped_int4_options(61, 1056, true, true);
  const Int4Matrix w = make_matrix(format, o, rng);
  for (qmoe_accuracy acc : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    for (uint32_t kw : {1u, 2u, 4u, 8u}) {
      for (uint32_t rounds : {1u, 3u}) {
        const uint32_t m = rounds == 1 ? 1 : 5;
        const uint32_t tc = kw == 2 ? 4 : kw == 4 ? 12 : 36;
        const emu::Int4GemvConfig config{kw, rounds, tc};
        GemvCase c{acc, m, QMOE_DTYPE_F32, QMOE_DTYPE_F32, o.k, o.n, 5, 59};
        run_gemv(w, c, random_activations(m, o.k, rng), 2, &config);
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

// What the launcher does with description `d`: the GEMV at the fast level, M = 1, FP32 X (ones)
// and Y, every column. Its answer and the number of kernels it launched.
std::pair<cudaError_t, uint64_t> launch_count(const emu::DeviceQuantMatrix& d) {
  std::vector<float> x(d.k, 1.0f), y(d.n, 0.0f);
  const uint64_t before = qmoe_emu::device().launches;
  const cudaError_t e = emu::launch_int4_gemv(d, QMOE_ACCURACY_FAST, 1, QMOE_DTYPE_F32, x.data(),
                                              d.k, QMOE_DTYPE_F32, y.data(), d.n, 0, d.n, nullptr);
  return std::make_pair(e, qmoe_emu::device().launches - before);
}

TEST_F(EmulatedDevice, GemvRandomShapesMeetBothLevelsBounds) {
  for (int iter = 0; iter < 24 && !HasFailure(); ++iter) {
    const Int4Options o = random_int4_options(rng_, 320);
    const Int4Matrix w = make_int4_matrix(o, rng_);
    const qmoe_dtype dtypes[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
    GemvCase c;
    c.accuracy = iter % 2 ? QMOE_ACCURACY_FAST : QMOE_ACCURACY_EXACT;
    c.m = 1 + static_cast<uint32_t>(rng_() % 8);
    c.xd = dtypes[rng_() % 3];
    c.yd = dtypes[rng_() % 3];
    draw_strides_and_columns(&c, o.n, o.k, rng_);
    run_gemv(w, c, random_activations(c.m, o.k, rng_), 1 + iter % 3, nullptr);
  }
}

// The model-size K (gpt-oss 2880, Qwen3 FC1 2048) with the launcher's own split on a 2-SM device:
// several rounds per block, the K split the cost model picks, and (exact, m = 8) K in tiles.
TEST_F(EmulatedDevice, GemvModelKAutoSplit) {
  check_model_k_auto_split(QMOE_WEIGHT_FORMAT_INT4,
                           {{96, 2880, QMOE_ACCURACY_FAST, 1, false},
                            {40, 2048, QMOE_ACCURACY_FAST, 4, false},
                            {24, 2880, QMOE_ACCURACY_EXACT, 8, false},
                            {72, 768, QMOE_ACCURACY_EXACT, 2, false}},
                           rng_);
}

// Every split kind forced on one problem (33 chunks: a partial last quad).
TEST_F(EmulatedDevice, GemvForcedSplitsMeetTheBounds) {
  check_forced_splits(QMOE_WEIGHT_FORMAT_INT4, rng_);
}

// ---- INT3 --------------------------------------------------------------------------------------

// Random shapes over the whole option space (block sizes 16..128, FP32/FP16/BF16 scales in every
// plane order, zero points 0..7 in any order or the default 4, bias of any dtype), both levels,
// every M from 1 to 8 and every activation/output dtype pair in turn, leading dimensions, column
// ranges, 1 to 3 multiprocessors. Three iterations in four have N % 8 = 1..7 (each in turn), so
// the last group's rows 6 and 7, whose codes lie split over the tile's three vectors, are
// sometimes padding. Against the FP64 reference and the CPU library (run_gemv).
TEST_F(EmulatedDevice, GemvInt3RandomShapesMeetBothLevelsBoundsAndCpu) {
  const qmoe_dtype dtypes[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
  int tail = 0;
  for (int iter = 0; iter < 36 && !HasFailure(); ++iter) {
    Int4Options o = random_int4_options(rng_, 320);
    if (iter % 4 != 0) o.n = 8 * static_cast<uint32_t>(rng_() % 8) + 1 + tail++ % 7;
    const Int4Matrix w = make_matrix(QMOE_WEIGHT_FORMAT_INT3, o, rng_);
    GemvCase c;
    c.accuracy = iter % 2 ? QMOE_ACCURACY_FAST : QMOE_ACCURACY_EXACT;
    c.m = 1 + static_cast<uint32_t>(iter / 2 % 8);
    c.xd = dtypes[iter % 3];
    c.yd = dtypes[iter / 3 % 3];
    draw_strides_and_columns(&c, o.n, o.k, rng_);
    const int sms = 1 + static_cast<int>(rng_() % 3);
    run_gemv(w, c, random_activations(c.m, o.k, rng_), sms);
  }
}

// The model-size K (gpt-oss 2880, Qwen3 FC1 2048, FC2 768) with the launcher's own split on a
// 2-SM device, N with and without a tail, zero points in the grouped order on one.
TEST_F(EmulatedDevice, GemvInt3ModelKAutoSplit) {
  check_model_k_auto_split(QMOE_WEIGHT_FORMAT_INT3,
                           {{96, 2880, QMOE_ACCURACY_FAST, 1, false},
                            {38, 2048, QMOE_ACCURACY_FAST, 4, true},
                            {23, 2880, QMOE_ACCURACY_EXACT, 8, false},
                            {72, 768, QMOE_ACCURACY_EXACT, 2, false}},
                           rng_);
}

// Every split kind forced on one problem (33 chunks: a partial last quad; N = 61: rows 5..7 of the
// last group are padding).
TEST_F(EmulatedDevice, GemvInt3ForcedSplitsMeetTheBounds) {
  check_forced_splits(QMOE_WEIGHT_FORMAT_INT3, rng_);
}

// A copy of `w` with every code of the rows whose n % 8 is not in [first, last] set to 0,
// repacked, its description pointing at its own buffers.
Int4Matrix int3_with_rows_only(const Int4Matrix& full, uint32_t first, uint32_t last) {
  Int4Matrix w = full;
  const uint32_t n = w.options.n, k = w.options.k;
  for (uint32_t row = 0; row < n; ++row) {
    if (row % 8 >= first && row % 8 <= last) continue;
    std::fill_n(w.code_values.begin() + size_t{row} * k, k, uint8_t{0});
  }
  w.codes = pack_int3_canonical(w.code_values, n, k);
  w.desc.codes = w.codes.data();
  w.desc.scales = w.scales.data();
  if (w.desc.zero_points != nullptr) w.desc.zero_points = w.zero_points.data();
  if (w.desc.bias != nullptr) w.desc.bias = w.bias.data();
  return w;
}

// Nonzero codes only in rows 6 and 7 of each 8-row group (their two low bits are bits 6-7 of
// vectors 0 and 1, their high bits bits 6-7 of vector 2: every byte's bits 0-5 are zero), and
// then only in rows 0-5 (whole codes in bits 0-5, bits 6-7 zero): a decode that takes a row's
// bits from the other rows' places, or lets them leak into its codes, is seen in the rows whose
// codes are 0 (weight -zero_point * scale) as much as in the others. N tails that end the last
// group at row 6 (row 7 padding), at row 7, and before row 6; both levels, M 1, 3 and 8, block
// sizes 16 to 128, zero points or the default 4.
TEST_F(EmulatedDevice, GemvInt3RowsSixAndSevenApartFromRowsZeroToFive) {
  struct Shape {
    uint32_t n, k, block;
    bool zero_points;
    qmoe_dtype scale_dtype;
  };
  const Shape shapes[] = {{23, 96, 16, true, QMOE_DTYPE_F16},
                          {32, 160, 32, false, QMOE_DTYPE_BF16},
                          {15, 256, 64, true, QMOE_DTYPE_F32},
                          {29, 128, 128, false, QMOE_DTYPE_F16}};
  int index = 0, shape_index = 0;
  for (const Shape& s : shapes) {
    Int4Options o;
    o.n = s.n;
    o.k = s.k;
    o.block_size = s.block;
    o.scale_dtype = s.scale_dtype;
    o.scale_order = shape_index % 2 ? ScaleOrder::kGrouped : ScaleOrder::kRowMajor;
    o.zero_points = s.zero_points;
    o.zero_point_order = ScaleOrder::kGrouped;
    o.bias = shape_index++ == 1;
    const Int4Matrix full = make_int3_matrix(o, rng_);
    ASSERT_EQ(full.desc.format, QMOE_WEIGHT_FORMAT_INT3);
    for (const bool high_rows : {true, false}) {
      const Int4Matrix w =
          high_rows ? int3_with_rows_only(full, 6, 7) : int3_with_rows_only(full, 0, 5);
      // The packing has the property the test is about.
      const uint8_t unused_bits = high_rows ? 0x3F : 0xC0;
      for (size_t b = 0; b < w.codes.size(); ++b) {
        ASSERT_EQ(w.codes[b] & unused_bits, 0) << "byte " << b;
      }
      ASSERT_TRUE(std::any_of(w.codes.begin(), w.codes.end(), [](uint8_t v) { return v != 0; }));
      for (qmoe_accuracy acc : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        for (uint32_t m : {1u, 3u, 8u}) {
          const qmoe_dtype yd = index++ % 4 == 3 ? QMOE_DTYPE_BF16 : QMOE_DTYPE_F32;
          GemvCase c{acc, m, QMOE_DTYPE_F32, yd, o.k, o.n, 0, o.n};
          run_gemv(w, c, random_activations(m, o.k, rng_), 1 + index % 3);
          if (HasFailure()) {
            std::printf("nonzero codes only in rows %s of each group\n", high_rows ? "6-7" : "0-5");
            return;
          }
        }
      }
    }
  }
}

// An INT3 description the kernels cannot read is refused before anything is launched; the
// matrix itself launches.
TEST_F(EmulatedDevice, GemvInt3InvalidDescriptionsLaunchNothing) {
  Int4Options o;
  o.n = 16;
  o.k = 64;
  const Int4Matrix w = make_matrix(QMOE_WEIGHT_FORMAT_INT3, o, rng_);
  const emu::DeviceQuantMatrix good = describe_host<emu::DeviceQuantMatrix>(w);
  EXPECT_EQ(launch_count(good), std::make_pair(cudaSuccess, uint64_t{1}));
  for (qmoe_dtype byte_scale : {QMOE_DTYPE_E8M0, QMOE_DTYPE_F8_E4M3}) {
    emu::DeviceQuantMatrix bad = good;
    bad.scale_dtype = byte_scale;  // the E2M1 formats' scale types
    EXPECT_EQ(launch_count(bad), std::make_pair(cudaErrorInvalidValue, uint64_t{0})) << byte_scale;
  }
  for (uint32_t block : {8u, 256u}) {
    emu::DeviceQuantMatrix bad = good;
    bad.block_size = block;
    EXPECT_EQ(launch_count(bad), std::make_pair(cudaErrorInvalidValue, uint64_t{0})) << block;
  }
}

// ---- MXFP4 and NVFP4 ---------------------------------------------------------------------------

constexpr qmoe_weight_format kFp4Formats[] = {QMOE_WEIGHT_FORMAT_MXFP4, QMOE_WEIGHT_FORMAT_NVFP4};

std::string describe_fp4_case(const Fp4Matrix& w, const GemvCase& c, int sms) {
  std::ostringstream s;
  s << w.options.describe() << (c.accuracy == QMOE_ACCURACY_EXACT ? " exact" : " fast")
    << " m=" << c.m << " x=" << label(c.xd) << " y=" << label(c.yd) << " ldx=" << c.ldx
    << " ldy=" << c.ldy << " cols=[" << c.n_begin << "," << c.n_end << ") sms=" << sms;
  return s.str();
}

// Runs the GEMV on an E2M1 matrix and checks every written output against the FP64 reference
// (tests/gemm/fp4_reference.h, decoders written from the OCP specifications) within the level's
// bound plus the output dtype's rounding, against the CPU library's qmoe_gemm on the same
// widened X (both within their bounds of the reference: within the sum of the two), NaN where
// and only where the CPU has NaN, and the poison everywhere else. Returns the outputs ([m][n]
// FP32 values of the written columns, NaN elsewhere).
std::vector<float> run_fp4_gemv(const Fp4Matrix& w, const GemvCase& c,
                                const std::vector<float>& x_values, int sms,
                                const emu::Int4GemvConfig* config = nullptr) {
  const uint32_t n = w.options.n;
  const GemvLaunch l = launch_gemv(w, c, x_values, sms, config);
  const std::string what = describe_fp4_case(w, c, sms);
  std::vector<float> out(size_t{c.m} * n, NAN);
  EXPECT_EQ(l.error, cudaSuccess) << what;
  if (l.error != cudaSuccess) return out;
  const Fp4Reference ref = reference_gemm(w, l.xw, c.m);
  const std::vector<float> cpu = cpu_gemm(w.desc, c.accuracy, c.m, l.xw, what);
  size_t bad = 0;
  check_gemv_outputs(l, c, what, &bad, [&](uint32_t i, uint32_t col, float got) {
    const size_t o = size_t{i} * n + col;
    out[o] = got;
    const double cpu_y = cpu[o];
    if (std::isnan(cpu_y) || std::isnan(ref.y[o])) {
      if (!std::isnan(got) && bad++ < 5) {
        ADD_FAILURE() << "y[" << i << "," << col << "] = " << got << ", want NaN; " << what;
      }
      return;
    }
    // Within the level's bound and the output's rounding, or, where that reaches the output
    // dtype's overflow threshold, its infinity (the CPU's FP32 output is finite there).
    const double tol = ref.tol(c.accuracy, o) + 1e-30;
    if (!output_matches(c.yd, got, ref.y[o], tol) && bad++ < 5) {
      ADD_FAILURE() << "y[" << i << "," << col << "] = " << got << ", FP64 reference " << ref.y[o]
                    << " +- " << tol << "; " << what;
    }
    if (!output_matches(c.yd, got, cpu_y, 2 * tol) && bad++ < 5) {
      ADD_FAILURE() << "y[" << i << "," << col << "] = " << got << ", CPU library " << cpu_y << "; "
                    << what;
    }
  });
  EXPECT_EQ(bad, 0u) << what;
  return out;
}

GemvCase full_case(const Fp4Options& o, qmoe_accuracy accuracy, uint32_t m) {
  return {accuracy, m, QMOE_DTYPE_F32, QMOE_DTYPE_F32, o.k, o.n, 0, o.n};
}

// Both formats over random shapes (N and K tails, NVFP4's K % 32 == 16 included), scale orders,
// bias, global scales, every activation and output dtype, leading dimensions and column ranges.
TEST_F(EmulatedDevice, GemvFp4RandomShapesMeetBothLevelsBoundsAndCpu) {
  for (int iter = 0; iter < 32 && !HasFailure(); ++iter) {
    Fp4Options o = random_fp4_options(rng_, 320);
    o.format = kFp4Formats[iter % 2];
    if (o.format == QMOE_WEIGHT_FORMAT_MXFP4) {
      o.k = (o.k + 31) / 32 * 32;
      o.global_scale = 0.0f;
    }
    const Fp4Matrix w = make_fp4_matrix(o, rng_);
    const qmoe_dtype dtypes[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
    GemvCase c;
    c.accuracy = (iter / 2) % 2 ? QMOE_ACCURACY_FAST : QMOE_ACCURACY_EXACT;
    c.m = 1 + static_cast<uint32_t>(rng_() % 8);
    c.xd = dtypes[rng_() % 3];
    c.yd = dtypes[rng_() % 3];
    draw_strides_and_columns(&c, o.n, o.k, rng_);
    run_fp4_gemv(w, c, random_activations(c.m, o.k, rng_), 1 + iter % 3);
  }
}

// Model K with the launcher's own split: gpt-oss (MXFP4, K = 2880), Qwen3-30B-A3B's FC1 and FC2
// (NVFP4, K = 2048 and 768), and a half-filled last chunk (NVFP4, K = 2064), at every M class.
TEST_F(EmulatedDevice, GemvFp4ModelKAutoSplit) {
  struct Shape {
    qmoe_weight_format format;
    uint32_t n, k;
    qmoe_accuracy acc;
    uint32_t m;
  };
  for (const Shape s : {Shape{QMOE_WEIGHT_FORMAT_MXFP4, 96, 2880, QMOE_ACCURACY_FAST, 1},
                        Shape{QMOE_WEIGHT_FORMAT_MXFP4, 24, 2880, QMOE_ACCURACY_EXACT, 8},
                        Shape{QMOE_WEIGHT_FORMAT_NVFP4, 40, 2048, QMOE_ACCURACY_FAST, 4},
                        Shape{QMOE_WEIGHT_FORMAT_NVFP4, 72, 768, QMOE_ACCURACY_EXACT, 2},
                        Shape{QMOE_WEIGHT_FORMAT_NVFP4, 33, 2064, QMOE_ACCURACY_FAST, 3},
                        Shape{QMOE_WEIGHT_FORMAT_NVFP4, 17, 2064, QMOE_ACCURACY_EXACT, 5}}) {
    Fp4Options o;
    o.format = s.format;
    o.n = s.n;
    o.k = s.k;
    o.bias = s.n % 2 == 0;
    o.global_scale = s.format == QMOE_WEIGHT_FORMAT_NVFP4 ? 0.0078125f * 3 : 0.0f;
    const Fp4Matrix w = make_fp4_matrix(o, rng_);
    run_fp4_gemv(w, full_case(o, s.acc, s.m), random_activations(s.m, s.k, rng_), 2);
    if (HasFailure()) return;
  }
}

// Every split kind forced on one problem per format (33 chunks: a partial last quad; NVFP4 with
// a half-filled last chunk besides).
TEST_F(EmulatedDevice, GemvFp4ForcedSplitsMeetTheBounds) {
  for (qmoe_weight_format format : kFp4Formats) {
    Fp4Options o;
    o.format = format;
    o.n = 61;
    o.k = format == QMOE_WEIGHT_FORMAT_MXFP4 ? 1056 : 1040;
    o.bias = true;
    o.global_scale = format == QMOE_WEIGHT_FORMAT_NVFP4 ? 2.5f : 0.0f;
    const Fp4Matrix w = make_fp4_matrix(o, rng_);
    for (qmoe_accuracy acc : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      for (uint32_t kw : {1u, 2u, 4u, 8u}) {
        for (uint32_t rounds : {1u, 3u}) {
          const uint32_t m = rounds == 1 ? 1 : 6;
          const uint32_t tc = kw == 2 ? 4 : kw == 4 ? 12 : 36;
          const emu::Int4GemvConfig config{kw, rounds, tc};
          GemvCase c{acc, m, QMOE_DTYPE_F32, QMOE_DTYPE_F32, o.k, o.n, 5, 59};
          run_fp4_gemv(w, c, random_activations(m, o.k, rng_), 2, &config);
          if (HasFailure()) return;
        }
      }
    }
  }
}

// A NaN scale byte (E8M0 0xFF; E4M3 0x7F and 0xFF) makes every output of its row NaN at both
// levels, also when the block's codes are all zero; the other rows are unaffected.
TEST_F(EmulatedDevice, GemvFp4NanScalesMakeTheirRowsNan) {
  for (qmoe_weight_format format : kFp4Formats) {
    const std::vector<uint8_t> nans = format == QMOE_WEIGHT_FORMAT_MXFP4
                                          ? std::vector<uint8_t>{0xFF}
                                          : std::vector<uint8_t>{0x7F, 0xFF};
    for (uint8_t nan : nans) {
      Fp4Options o;
      o.format = format;
      o.n = 21;
      o.k = format == QMOE_WEIGHT_FORMAT_MXFP4 ? 160 : 176;
      Fp4Matrix w = make_fp4_matrix(o, rng_);
      const uint32_t block = fp4_block_size(format), blocks = o.k / block;
      const uint32_t nan_rows[] = {0, 9, 20};
      w.set_scale(0, 0, nan);
      w.set_scale(9, blocks - 1, nan);  // NVFP4: the half-filled last chunk's block
      w.set_scale(20, blocks / 2, nan);
      for (uint32_t k = 0; k < block; ++k) w.set_code(20, blocks / 2 * block + k, 0);
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        for (uint32_t m : {1u, 3u}) {
          const std::vector<float> y =
              run_fp4_gemv(w, full_case(o, level, m), random_activations(m, o.k, rng_), 2);
          for (uint32_t i = 0; i < m; ++i) {
            for (uint32_t j = 0; j < o.n; ++j) {
              const bool nan_row =
                  std::find(std::begin(nan_rows), std::end(nan_rows), j) != std::end(nan_rows);
              EXPECT_EQ(std::isnan(y[size_t{i} * o.n + j]), nan_row)
                  << fp4_format_name(format) << " scale 0x" << std::hex << int{nan} << std::dec
                  << " m=" << m << " y[" << i << "," << j << "]";
            }
          }
          if (HasFailure()) return;
        }
      }
    }
  }
}

// Scales at the ends of their types: E8M0 0xFE (2^127, weights beyond FP32) with small
// activations and 0x00 (2^-127, an FP32 subnormal) with large ones; E4M3 subnormals, negative
// scales and -0, with an NVFP4 global scale.
TEST_F(EmulatedDevice, GemvFp4ExtremeSubnormalAndNegativeScales) {
  for (qmoe_weight_format format : kFp4Formats) {
    for (int variant = 0; variant < 3; ++variant) {
      Fp4Options o;
      o.format = format;
      o.n = 19;
      o.k = 256;
      o.global_scale = format == QMOE_WEIGHT_FORMAT_NVFP4 ? 0.3f : 0.0f;
      Fp4Matrix w = make_fp4_matrix(o, rng_);
      const uint32_t blocks = o.k / fp4_block_size(format);
      // E4M3: subnormals 0x01..0x07 and their negatives, -0 (0x80), -1 (0xB8), -448 (0xFE).
      const uint8_t e4m3[] = {0x01, 0x02, 0x05, 0x07, 0x81, 0x83, 0x87, 0x80, 0xB8, 0xFE, 0x7E};
      int shift = 0;
      for (uint32_t n = 0; n < o.n; ++n) {
        for (uint32_t b = 0; b < blocks; ++b) {
          uint8_t byte;
          if (format == QMOE_WEIGHT_FORMAT_MXFP4) {
            byte = variant == 0 ? 0xFE : variant == 1 ? 0x00 : static_cast<uint8_t>(rng_() % 255);
          } else {
            byte = variant == 2 ? static_cast<uint8_t>(rng_() % 256 & 0x87u)
                                : e4m3[(n * blocks + b) % (sizeof e4m3)];
            if ((byte & 0x7F) == 0x7F) byte = 0x06;
          }
          w.set_scale(n, b, byte);
        }
      }
      if (format == QMOE_WEIGHT_FORMAT_MXFP4) shift = variant == 0 ? -20 : variant == 1 ? 100 : 0;
      for (uint32_t m : {1u, 4u}) {
        std::vector<float> x = random_activations(m, o.k, rng_);
        // MXFP4's random scales reach 2^127: activations small enough that no output overflows.
        if (format == QMOE_WEIGHT_FORMAT_MXFP4 && variant == 2) shift = -20;
        for (float& v : x) v = std::ldexp(v, shift);
        for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
          run_fp4_gemv(w, full_case(o, level, m), x, 2);
          if (HasFailure()) return;
        }
      }
    }
  }
}

// A description the E2M1 kernels cannot read is refused before anything is launched.
TEST_F(EmulatedDevice, GemvFp4InvalidDescriptionsLaunchNothing) {
  for (qmoe_weight_format format : kFp4Formats) {
    Fp4Options o;
    o.format = format;
    o.n = 16;
    o.k = 64;
    const Fp4Matrix w = make_fp4_matrix(o, rng_);
    const emu::DeviceQuantMatrix good = describe_host<emu::DeviceQuantMatrix>(w);
    EXPECT_EQ(launch_count(good), std::make_pair(cudaSuccess, uint64_t{1}));
    emu::DeviceQuantMatrix bad = good;
    bad.scale_dtype = QMOE_DTYPE_F16;  // INT4's scale type under an E2M1 format
    EXPECT_EQ(launch_count(bad), std::make_pair(cudaErrorInvalidValue, uint64_t{0}));
    bad = good;
    bad.block_size = format == QMOE_WEIGHT_FORMAT_MXFP4 ? 16 : 32;
    EXPECT_EQ(launch_count(bad), std::make_pair(cudaErrorInvalidValue, uint64_t{0}));
    bad = good;
    bad.format = QMOE_WEIGHT_FORMAT_INT3;
    EXPECT_EQ(launch_count(bad), std::make_pair(cudaErrorInvalidValue, uint64_t{0}));
    if (format == QMOE_WEIGHT_FORMAT_NVFP4) {
      for (float g : {0.0f, -1.0f, INFINITY, NAN}) {
        bad = good;
        bad.global_scale = g;
        EXPECT_EQ(launch_count(bad), std::make_pair(cudaErrorInvalidValue, uint64_t{0})) << g;
      }
    }
  }
}

}  // namespace
}  // namespace qmoe::testing
