// The decode GEMV's own code (lib/cuda/int4_gemv.cu) run on host threads by
// tests/cuda/cuda_host_emulator.h, so that CI, which has no GPU, executes it: the launcher's
// split and grid, the round-major persistent loop, the staging, the walks with two batches in
// flight and the cross-warp sums, on emulated devices of 1 to 3 multiprocessors (many rounds per
// block). Against the FP64 reference within the device test's bounds, with poisoned outputs and
// guards. The device test (int4_gemv_test.cu) covers the hardware's own arithmetic and order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cuda/decode_emulation_util.h"
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

// Runs the GEMV (auto split or `config`) on X values `x` ([m][k]) and checks every output
// against the FP64 reference within the device test's bounds, and the poison elsewhere.
void run_gemv(const Int4Matrix& w, const GemvCase& c, const std::vector<float>& x_values, int sms,
              const emu::Int4GemvConfig* config) {
  qmoe_emu::device().sm_count = sms;
  const uint32_t k = w.options.k, n = w.options.n;
  std::vector<float> xs(size_t{c.m} * c.ldx, 0.0f);
  for (uint32_t i = 0; i < c.m; ++i) {
    for (uint32_t j = 0; j < k; ++j) xs[i * c.ldx + j] = x_values[size_t{i} * k + j];
  }
  const std::vector<unsigned char> xb = to_bytes(c.xd, xs);
  constexpr size_t kGuard = 16;
  std::vector<unsigned char> y((2 * kGuard + size_t{c.m} * c.ldy) * dsize(c.yd), kPoison);
  void* y0 = y.data() + kGuard * dsize(c.yd);
  const emu::DeviceQuantMatrix d = describe_host<emu::DeviceQuantMatrix>(w);
  const cudaError_t e =
      config == nullptr
          ? emu::launch_int4_gemv(d, c.accuracy, c.m, c.xd, xb.data(), c.ldx, c.yd, y0, c.ldy,
                                  c.n_begin, c.n_end, nullptr)
          : emu::launch_int4_gemv_with_config(d, c.accuracy, c.m, c.xd, xb.data(), c.ldx, c.yd, y0,
                                              c.ldy, c.n_begin, c.n_end, *config, nullptr);
  const std::string what = describe_case(w, c, sms, config);
  ASSERT_EQ(e, cudaSuccess) << what;
  // The widened X the kernel reads, and the reference from it.
  std::vector<float> xw(size_t{c.m} * k);
  for (uint32_t i = 0; i < c.m; ++i) {
    for (uint32_t j = 0; j < k; ++j)
      xw[size_t{i} * k + j] = element(c.xd, xb.data(), i * c.ldx + j);
  }
  const Reference ref = reference_gemm(w, xw, c.m);
  size_t bad = 0;
  const size_t es = dsize(c.yd);
  for (size_t el = 0; el < y.size() / es; ++el) {
    bool written = false;
    uint32_t i = 0, col = 0;
    if (el >= kGuard && el < kGuard + size_t{c.m} * c.ldy) {
      i = static_cast<uint32_t>((el - kGuard) / c.ldy);
      col = static_cast<uint32_t>((el - kGuard) % c.ldy);
      written = col >= c.n_begin && col < c.n_end;
    }
    if (!written) {
      for (size_t b = 0; b < es; ++b) {
        if (y[el * es + b] != kPoison && bad++ < 5) {
          ADD_FAILURE() << "element " << el << " outside the written columns changed; " << what;
        }
      }
      continue;
    }
    const double got = element(c.yd, y.data(), el);
    const size_t o = size_t{i} * n + col;
    const double want = ref.y[o];
    const double out_round = half_ulp(c.yd, std::max(std::fabs(want), std::fabs(got))) * 1.01;
    const double tol =
        (c.accuracy == QMOE_ACCURACY_EXACT ? 1e-5 * ref.abs_sum[o] : ref.fast_bound[o]) +
        out_round + 1e-30;
    if (!(std::fabs(got - want) <= tol) && bad++ < 5) {
      ADD_FAILURE() << "y[" << i << "," << col << "] = " << got << ", want " << want << " +- "
                    << tol << "; " << what;
    }
  }
  EXPECT_EQ(bad, 0u) << what;
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
    c.ldx = o.k + rng_() % 5;
    c.ldy = o.n + rng_() % 5;
    c.n_begin = rng_() % 3 == 0 ? static_cast<uint32_t>(rng_() % o.n) : 0;
    c.n_end =
        rng_() % 3 == 0 ? c.n_begin + 1 + static_cast<uint32_t>(rng_() % (o.n - c.n_begin)) : o.n;
    run_gemv(w, c, random_activations(c.m, o.k, rng_), 1 + iter % 3, nullptr);
  }
}

// The model-size K (gpt-oss 2880, Qwen3 FC1 2048) with the launcher's own split on a 2-SM device:
// several rounds per block, the K split the cost model picks, and (exact, m = 8) K in tiles.
TEST_F(EmulatedDevice, GemvModelKAutoSplit) {
  struct Shape {
    uint32_t n, k;
    qmoe_accuracy acc;
    uint32_t m;
  };
  for (const Shape s :
       {Shape{96, 2880, QMOE_ACCURACY_FAST, 1}, Shape{40, 2048, QMOE_ACCURACY_FAST, 4},
        Shape{24, 2880, QMOE_ACCURACY_EXACT, 8}, Shape{72, 768, QMOE_ACCURACY_EXACT, 2}}) {
    Int4Options o;
    o.n = s.n;
    o.k = s.k;
    o.block_size = 32;
    o.scale_dtype = QMOE_DTYPE_F16;
    o.scale_order = ScaleOrder::kGrouped;
    o.bias = s.n == 96;
    const Int4Matrix w = make_int4_matrix(o, rng_);
    GemvCase c{s.acc, s.m, QMOE_DTYPE_F32, QMOE_DTYPE_F32, s.k, s.n, 0, s.n};
    run_gemv(w, c, random_activations(s.m, s.k, rng_), 2, nullptr);
    if (HasFailure()) return;
  }
}

// Every split kind forced on one problem (33 chunks: a partial last quad).
TEST_F(EmulatedDevice, GemvForcedSplitsMeetTheBounds) {
  Int4Options o;
  o.n = 61;
  o.k = 1056;
  o.block_size = 32;
  o.scale_order = ScaleOrder::kGrouped;
  o.zero_points = true;
  o.bias = true;
  const Int4Matrix w = make_int4_matrix(o, rng_);
  for (qmoe_accuracy acc : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    for (uint32_t kw : {1u, 2u, 4u, 8u}) {
      for (uint32_t rounds : {1u, 3u}) {
        const uint32_t m = rounds == 1 ? 1 : 5;
        const uint32_t tc = kw == 2 ? 4 : kw == 4 ? 12 : 36;
        const emu::Int4GemvConfig config{kw, rounds, tc};
        GemvCase c{acc, m, QMOE_DTYPE_F32, QMOE_DTYPE_F32, o.k, o.n, 5, 59};
        run_gemv(w, c, random_activations(m, o.k, rng_), 2, &config);
        if (HasFailure()) return;
      }
    }
  }
}

}  // namespace
}  // namespace qmoe::testing
