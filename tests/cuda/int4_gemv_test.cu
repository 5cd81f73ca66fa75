// The CUDA INT4 GEMV (lib/cuda/int4_gemv.cuh) against an FP64 reference, the fast level's
// integer parts against the test's own int8 quantization (written from docs/formats.md), and
// the CPU library's qmoe_gemm_typed: every block size, scale dtype and plane order, zero points,
// bias, M = 1..8, N and K tails, column sub-ranges, forced work splits; outputs poisoned and
// guard elements checked. Every test skips, naming the reason, without a usable device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "lib/cuda/int4_gemv.cuh"
#include "qmoe/qmoe.h"
#include "tests/cpu/isa_test_util.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/gemm/int4_reference.h"

namespace qmoe::testing {
namespace {

constexpr unsigned char kPoison = 0x7F;
constexpr size_t kGuard = 64;  // elements of Y before and after the rows

// One GEMV problem on the host and its device copies.
struct Problem {
  const Int4Matrix* w;
  std::unique_ptr<DeviceInt4Matrix> dw;
  qmoe_accuracy accuracy;
  uint32_t m;
  qmoe_dtype xd, yd;
  size_t ldx, ldy;
  uint32_t n_begin, n_end;
  std::vector<float> x;          // [m][ldx] widened values (exactly what the device reads)
  std::vector<unsigned char> y;  // the whole device buffer after the call, guards included

  std::string describe() const {
    std::ostringstream s;
    s << w->options.describe() << " " << (accuracy == QMOE_ACCURACY_EXACT ? "exact" : "fast")
      << " m=" << m << " x=" << dtype_label(xd) << " y=" << dtype_label(yd) << " ldx=" << ldx
      << " ldy=" << ldy << " cols=[" << n_begin << "," << n_end << ")";
    return s.str();
  }
  double y_at(uint32_t i, uint32_t n) const {
    const size_t e = kGuard + size_t{i} * ldy + n, es = dtype_size(yd);
    std::vector<unsigned char> one(y.begin() + e * es, y.begin() + (e + 1) * es);
    return from_dtype(yd, one)[0];
  }
};

// X rows of `values` ([m][k]) at stride ldx in dtype xd; p.x gets the widened values.
std::vector<unsigned char> make_x(Problem& p, const std::vector<float>& values) {
  const uint32_t k = p.w->options.k;
  std::vector<float> padded(p.m * p.ldx, 0.0f);
  for (uint32_t i = 0; i < p.m; ++i) {
    for (uint32_t j = 0; j < k; ++j) padded[i * p.ldx + j] = values[size_t{i} * k + j];
  }
  std::vector<unsigned char> bytes = to_dtype(p.xd, padded);
  p.x = from_dtype(p.xd, bytes);
  return bytes;
}

// Runs the GEMV (auto split, or `config`) with Y poisoned, guards around it; fills p.y.
void run(Problem& p, const std::vector<unsigned char>& x_bytes,
         const cuda::Int4GemvConfig* config = nullptr) {
  DeviceBuffer x(x_bytes.size());
  ASSERT_TRUE(x.upload(x_bytes.data(), x_bytes.size()));
  const size_t y_elems = 2 * kGuard + size_t{p.m} * p.ldy;
  DeviceBuffer y(y_elems * dtype_size(p.yd));
  ASSERT_TRUE(y.fill(kPoison));
  void* y0 = y.as<unsigned char>() + kGuard * dtype_size(p.yd);
  const cudaError_t e =
      config == nullptr ? cuda::launch_int4_gemv(p.dw->desc, p.accuracy, p.m, p.xd, x.data(), p.ldx,
                                                 p.yd, y0, p.ldy, p.n_begin, p.n_end, nullptr)
                        : cuda::launch_int4_gemv_with_config(p.dw->desc, p.accuracy, p.m, p.xd,
                                                             x.data(), p.ldx, p.yd, y0, p.ldy,
                                                             p.n_begin, p.n_end, *config, nullptr);
  QMOE_CUDA_OK(e);
  QMOE_CUDA_OK(cudaDeviceSynchronize());
  p.y.resize(y_elems * dtype_size(p.yd));
  ASSERT_TRUE(y.download(p.y.data(), p.y.size()));
}

// Every byte outside the written elements is still poison.
void expect_untouched(const Problem& p) {
  const size_t es = dtype_size(p.yd);
  size_t bad = 0, first = 0;
  for (size_t e = 0; e < p.y.size() / es; ++e) {
    bool written = false;
    if (e >= kGuard && e < kGuard + size_t{p.m} * p.ldy) {
      const size_t off = e - kGuard, n = off % p.ldy;
      written = n >= p.n_begin && n < p.n_end;
    }
    if (written) continue;
    for (size_t b = 0; b < es; ++b) {
      if (p.y[e * es + b] != kPoison) {
        if (bad++ == 0) first = e;
        break;
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "elements written outside rows x [n_begin, n_end) or in the guards; "
                        "first at element "
                     << first << " " << p.describe();
}

// The fast level from the test's own reading of docs/formats.md: q, scale and sums per 32 k of
// one row (FP32 operations as specified), then per block the exact integer (dot - z sum_q)
// times FP32 (scale * x_scale), summed in FP64. `terms` gets sum |term| for the tolerance.
struct FastRow {
  std::vector<int> q;
  std::vector<float> scale;
};
FastRow quantize_row(const float* x, uint32_t k) {
  const uint32_t chunks = (k + 31) / 32;
  FastRow r;
  r.q.assign(chunks * 32, 0);
  r.scale.assign(chunks, 0.0f);
  for (uint32_t c = 0; c < chunks; ++c) {
    const uint32_t k1 = std::min(k, c * 32 + 32);
    float amax = 0.0f;
    for (uint32_t j = c * 32; j < k1; ++j) {
      if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]);  // a NaN never compares greater
    }
    if (amax < 0x1p-119f) continue;  // flushed: q = 0, scale 0
    const float inv = 127.0f / amax;
    r.scale[c] = amax / 127.0f;
    for (uint32_t j = c * 32; j < k1; ++j) {
      const float t = x[j] * inv;
      float v = std::nearbyint(t);  // round half to even (default rounding mode)
      v = std::min(127.0f, std::max(-127.0f, v));
      r.q[j] = v == v ? static_cast<int>(v) : 0;
    }
  }
  return r;
}

double fast_reference(const Int4Matrix& w, const FastRow& xr, uint32_t n, double* terms) {
  const Int4Options& o = w.options;
  const uint32_t blocks = o.k / o.block_size, chunks = (o.k + 31) / 32;
  const uint32_t sub = o.block_size == 16 ? 2 : 1, len = 32 / sub;
  double y = 0.0;
  *terms = 0.0;
  for (uint32_t c = 0; c < chunks; ++c) {
    for (uint32_t s = 0; s < sub; ++s) {
      const uint32_t k0 = c * 32 + s * len;
      if (k0 >= o.k) continue;
      const uint32_t b = k0 / o.block_size;
      int64_t dot = 0, sum_q = 0;
      for (uint32_t j = k0; j < k0 + len; ++j) {
        dot += int64_t{w.code_values[size_t{n} * o.k + j]} * xr.q[j];
        sum_q += xr.q[j];
      }
      const int64_t v = dot - int64_t{w.zero_values[size_t{n} * blocks + b]} * sum_q;
      const float scale = static_cast<float>(w.scale_values[size_t{n} * blocks + b]);
      const double term = static_cast<double>(v) * static_cast<double>(scale * xr.scale[c]);
      y += term;
      *terms += std::fabs(term);
    }
  }
  return y + w.bias_values[n];
}

// Checks every written output against its bounds: exact 1e-5 * sum |x w| from FP64; fast the
// documented bound from FP64 and, tighter, the integer-exact reference within FP32 rounding.
void check_outputs(const Problem& p) {
  const Int4Matrix& w = *p.w;
  const uint32_t k = w.options.k;
  std::vector<float> xs(size_t{p.m} * k);
  for (uint32_t i = 0; i < p.m; ++i) {
    for (uint32_t j = 0; j < k; ++j) xs[size_t{i} * k + j] = p.x[i * p.ldx + j];
  }
  const Reference ref = reference_gemm(w, xs, p.m);
  const double fp32_depth = ((k + 31) / 32 / 4 + 16) * 0x1p-23;
  size_t failures = 0;
  for (uint32_t i = 0; i < p.m; ++i) {
    const FastRow xr = quantize_row(xs.data() + size_t{i} * k, k);
    for (uint32_t n = p.n_begin; n < p.n_end; ++n) {
      const double got = p.y_at(i, n);
      const size_t o = size_t{i} * w.options.n + n;
      const double want = ref.y[o];
      // The output's rounding, taken at the larger magnitude (a value near a power of two
      // may round into the next binade).
      const double round_out =
          dtype_half_ulp(p.yd, std::max(std::fabs(want), std::fabs(got))) * 1.01;
      double tol;
      if (p.accuracy == QMOE_ACCURACY_EXACT) {
        tol = 1e-5 * ref.abs_sum[o] + round_out + 1e-30;
      } else {
        tol = ref.fast_bound[o] + round_out + 1e-30;
        double terms = 0.0;
        const double want_q = fast_reference(w, xr, n, &terms);
        const double tol_q =
            fp32_depth * (terms + std::fabs(w.bias_values[n])) +
            dtype_half_ulp(p.yd, std::max(std::fabs(want_q), std::fabs(got))) * 1.01 + 1e-30;
        if (!(std::fabs(got - want_q) <= tol_q) && failures++ < 5) {
          ADD_FAILURE() << "fast integer reference: y[" << i << "," << n << "] = " << got
                        << ", want " << want_q << " +- " << tol_q << "; " << p.describe();
        }
      }
      if (!(std::fabs(got - want) <= tol) && failures++ < 5) {
        ADD_FAILURE() << "FP64 reference: y[" << i << "," << n << "] = " << got << ", want " << want
                      << " +- " << tol << "; " << p.describe();
      }
    }
  }
  EXPECT_EQ(failures, 0u);
}

class CudaInt4Gemv : public ::testing::Test {
 protected:
  void SetUp() override {
    QMOE_SKIP_WITHOUT_CUDA();
    seed_ = fresh_seed();
    rng_.seed(seed_);
  }
  void TearDown() override {
    if (HasFailure()) std::printf("seed %llu\n", static_cast<unsigned long long>(seed_));
  }
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

qmoe_dtype any_dtype(std::mt19937_64& rng) {
  const qmoe_dtype d[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
  return d[rng() % 3];
}

TEST_F(CudaInt4Gemv, RandomShapesMeetBothLevelsBounds) {
  for (int iter = 0; iter < 80 && !HasFailure(); ++iter) {
    Int4Options o = random_int4_options(rng_, 416);
    const Int4Matrix w = make_int4_matrix(o, rng_);
    Problem p;
    p.w = &w;
    p.dw = upload_matrix(w);
    p.accuracy = iter % 2 ? QMOE_ACCURACY_FAST : QMOE_ACCURACY_EXACT;
    p.m = 1 + static_cast<uint32_t>(rng_() % 8);
    p.xd = any_dtype(rng_);
    p.yd = any_dtype(rng_);
    p.ldx = o.k + rng_() % 5;
    p.n_begin = rng_() % 3 == 0 ? static_cast<uint32_t>(rng_() % o.n) : 0;
    p.n_end =
        rng_() % 3 == 0 ? p.n_begin + 1 + static_cast<uint32_t>(rng_() % (o.n - p.n_begin)) : o.n;
    p.ldy = o.n + rng_() % 5;
    const std::vector<unsigned char> xb = make_x(p, random_activations(p.m, o.k, rng_));
    run(p, xb);
    expect_untouched(p);
    check_outputs(p);
  }
}

TEST_F(CudaInt4Gemv, TailsEveryBlockSizeAndPlaneOrder) {
  const qmoe_dtype dtypes[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
  for (uint32_t block : {16u, 32u, 64u, 128u}) {
    for (int v = 0; v < 8 && !HasFailure(); ++v) {
      // N % 8 != 0; K % 32 == 16 where the block size allows it (16 only).
      const uint32_t k = block == 16 ? 16 * (5 + 2 * v) : block * (1 + v % 4);
      const Int4Options o = tail_variant_options(13 + 8 * (v % 3), k, block, v, v % 3 != 0);
      const Int4Matrix w = make_int4_matrix(o, rng_);
      for (qmoe_accuracy acc : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        for (uint32_t m : {1u, 3u, 8u}) {
          Problem p;
          p.w = &w;
          p.dw = upload_matrix(w);
          p.accuracy = acc;
          p.m = m;
          p.xd = dtypes[(v + m) % 3];
          p.yd = dtypes[(v + 2 * m) % 3];
          p.ldx = o.k;
          p.ldy = o.n + 3;
          p.n_begin = v % 2 ? 3 : 0;
          p.n_end = o.n - (v % 3 == 2 ? 2 : 0);
          const std::vector<unsigned char> xb = make_x(p, random_activations(m, o.k, rng_));
          run(p, xb);
          expect_untouched(p);
          check_outputs(p);
        }
      }
    }
  }
}

// Power-of-two scales and half-integer activations whose chunks have max |x| = 127: the fast
// level's x_scale is 1 and q = round-half-even(x), so both levels' results are exact in FP32
// and must equal the integer reference bit for bit (ties 2.5 -> 2, 3.5 -> 4 included).
TEST_F(CudaInt4Gemv, IntegerPartsAreExact) {
  const qmoe_dtype dtypes[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
  for (uint32_t block : {16u, 32u, 64u, 128u}) {
    for (int v = 0; v < 6 && !HasFailure(); ++v) {
      const Int4Matrix w = integer_part_matrix(block, v, make_int4_matrix, rng_);
      const Int4Options& o = w.options;
      for (qmoe_accuracy acc : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        const uint32_t m = 1 + static_cast<uint32_t>(rng_() % 8);
        const std::vector<float> x = integer_part_activations(m, o.k, rng_);
        Problem p;
        p.w = &w;
        p.dw = upload_matrix(w);
        p.accuracy = acc;
        p.m = m;
        p.xd = dtypes[v % 3];
        p.yd = QMOE_DTYPE_F32;
        p.ldx = o.k;
        p.ldy = o.n;
        p.n_begin = 0;
        p.n_end = o.n;
        const std::vector<unsigned char> xb = make_x(p, x);
        run(p, xb);
        expect_untouched(p);
        for (uint32_t i = 0; i < m; ++i) {
          for (uint32_t n = 0; n < o.n; ++n) {
            ASSERT_EQ(p.y_at(i, n), integer_parts_output(w, p.x.data() + i * p.ldx, n, acc))
                << "y[" << i << "," << n << "] " << p.describe();
          }
        }
      }
    }
  }
}

// Each split the launcher may pick, forced on the same problem: all meet the bounds.
TEST_F(CudaInt4Gemv, ForcedSplitsMeetTheBounds) {
  // 33 chunks: a partial last quad.
  const Int4Options o = grouped_int4_options(61, 1056, true, true);
  const Int4Matrix w = make_int4_matrix(o, rng_);
  for (qmoe_accuracy acc : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    for (uint32_t m : {1u, 5u}) {
      for (uint32_t kw : {1u, 2u, 4u, 8u}) {
        for (uint32_t rounds : {1u, 3u}) {
          for (uint32_t tc : {4u, 12u, 32u}) {  // 32: the exact level's largest at m = 5
            Problem p;
            p.w = &w;
            p.dw = upload_matrix(w);
            p.accuracy = acc;
            p.m = m;
            p.xd = QMOE_DTYPE_F32;
            p.yd = QMOE_DTYPE_F32;
            p.ldx = o.k;
            p.ldy = o.n;
            p.n_begin = 5;
            p.n_end = 59;
            const std::vector<unsigned char> xb = make_x(p, random_activations(m, o.k, rng_));
            const cuda::Int4GemvConfig config{kw, rounds, tc};
            run(p, xb, &config);
            expect_untouched(p);
            check_outputs(p);
            if (HasFailure()) {
              FAIL() << "k_warps " << kw << " rounds " << rounds << " tile " << tc;
            }
          }
        }
      }
    }
  }
}

// The model shapes of the benchmarks, against the FP64 reference and the CPU library.
TEST_F(CudaInt4Gemv, ModelShapesMatchCpuLibrary) {
  qmoe_context* ctx = nullptr;
  ASSERT_EQ(qmoe_context_create(nullptr, &ctx), QMOE_STATUS_OK);
  for (const Int4Options& o : benchmark_gemm_shapes()) {
    const Int4Matrix w = make_int4_matrix(o, rng_);
    auto dw = upload_matrix(w);
    for (qmoe_accuracy acc : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      for (uint32_t m : {1u, 4u, 8u}) {
        Problem p;
        p.w = &w;
        p.dw = std::move(dw);
        p.accuracy = acc;
        p.m = m;
        p.xd = m == 4 ? QMOE_DTYPE_BF16 : QMOE_DTYPE_F32;
        p.yd = QMOE_DTYPE_F32;
        p.ldx = o.k;
        p.ldy = o.n;
        p.n_begin = 0;
        p.n_end = o.n;
        const std::vector<unsigned char> xb = make_x(p, random_activations(m, o.k, rng_));
        run(p, xb);
        dw = std::move(p.dw);
        expect_untouched(p);
        check_outputs(p);
        std::vector<float> cpu(size_t{m} * o.n);
        ASSERT_EQ(qmoe_gemm(ctx, &w.desc, acc, m, p.x.data(), p.ldx, cpu.data(), o.n, 0, o.n),
                  QMOE_STATUS_OK)
            << qmoe_last_error_message();
        std::vector<float> xs(size_t{m} * o.k);
        for (uint32_t i = 0; i < m; ++i) {
          for (uint32_t j = 0; j < o.k; ++j) xs[size_t{i} * o.k + j] = p.x[i * p.ldx + j];
        }
        const Reference ref = reference_gemm(w, xs, m);
        size_t bad = 0;
        for (uint32_t i = 0; i < m; ++i) {
          for (uint32_t n = 0; n < o.n; ++n) {
            const size_t at = size_t{i} * o.n + n;
            // Both are within their level's bound of the FP64 value, so within twice of each
            // other; at the fast level both quantize X identically, so the FP32 rounding of
            // the epilogue is all that differs (far inside the documented bound).
            const double tol = acc == QMOE_ACCURACY_EXACT ? 2e-5 * ref.abs_sum[at]
                                                          : 2e-5 * (ref.abs_sum[at] + 1.0);
            if (!(std::fabs(p.y_at(i, n) - cpu[at]) <= tol) && bad++ < 5) {
              ADD_FAILURE() << "GPU " << p.y_at(i, n) << " vs CPU " << cpu[at] << " at [" << i
                            << "," << n << "] " << p.describe();
            }
          }
        }
        EXPECT_EQ(bad, 0u);
      }
    }
  }
  qmoe_context_destroy(ctx);
}

TEST_F(CudaInt4Gemv, InvalidArgumentsLaunchNothing) {
  Int4Options o;
  o.n = 16;
  o.k = 64;
  const Int4Matrix w = make_int4_matrix(o, rng_);
  auto dw = upload_matrix(w);
  DeviceBuffer x(64 * 8 * 4), y(16 * 8 * 4);
  const cuda::DeviceQuantMatrix& d = dw->desc;
  const auto call = [&](const cuda::DeviceQuantMatrix& m, uint32_t rows, uint32_t n0, uint32_t n1) {
    return cuda::launch_int4_gemv(m, QMOE_ACCURACY_EXACT, rows, QMOE_DTYPE_F32, x.data(), 64,
                                  QMOE_DTYPE_F32, y.data(), 16, n0, n1, nullptr);
  };
  EXPECT_EQ(call(d, 0, 0, 16), cudaErrorInvalidValue);
  EXPECT_EQ(call(d, 9, 0, 16), cudaErrorInvalidValue);
  EXPECT_EQ(call(d, 1, 0, 17), cudaErrorInvalidValue);
  EXPECT_EQ(call(d, 1, 5, 4), cudaErrorInvalidValue);
  cuda::DeviceQuantMatrix bad = d;
  bad.block_size = 48;
  EXPECT_EQ(call(bad, 1, 0, 16), cudaErrorInvalidValue);
  bad = d;
  bad.codes = d.codes + 4;  // not 16-byte aligned
  EXPECT_EQ(call(bad, 1, 0, 16), cudaErrorInvalidValue);
  bad = d;
  bad.chunks = 3;
  EXPECT_EQ(call(bad, 1, 0, 16), cudaErrorInvalidValue);
  EXPECT_EQ(call(d, 1, 4, 4), cudaSuccess);  // empty range: nothing to do
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace qmoe::testing
