// INT3 on the GPU through the C ABI (include/qmoe/qmoe_cuda.h): qmoe_cuda_gemm (the decode GEMV
// for M <= 8, and 8 rows at a time above) against the FP64 reference of
// tests/gemm/int3_reference.h and the CPU library's qmoe_gemm, M = 1..8, 9 and 17, both levels,
// every activation and output dtype, every N % 8 (rows 6 and 7 of a tile are split across it)
// and K % 32 == 16, every block size, scale dtype and plane order, zero points, bias, column
// ranges with poisoned outputs and guards, and power-of-two cases that must be exact bit for
// bit; the resident MoE layer (qmoe_cuda_expert_set_create, qmoe_cuda_moe_forward) with INT3
// experts at Qwen3-30B-A3B's layer shape (fewer experts) and small shapes, all-resident and
// partial residency, against the FP64 layer and the CPU layer; a captured CUDA graph replayed
// with new routing, token counts and residency equal to eager calls bit for bit; the offload
// session's hybrid layer; and the one-format rule (a set mixing INT3 and INT4 experts is
// UNSUPPORTED_FORMAT). Every result is also computed twice and must match bit for bit. Every
// test skips, naming the reason, without a usable device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "qmoe/qmoe.h"
#include "qmoe/qmoe_cuda.h"
#include "tests/cuda/cuda_set_util.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/layer_call_util.h"
#include "tests/gemm/int3_reference.h"
#include "tests/gemm/int4_reference.h"
#include "tests/moe/moe_call.h"
#include "tests/moe/moe_reference.h"

namespace qmoe::testing {
namespace {

constexpr unsigned char kPoison = 0x7F;
constexpr size_t kGuard = 32;  // elements of Y before and after the rows

const qmoe_dtype kDtypes[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
const ScaleOrder kOrders[] = {ScaleOrder::kRowMajor, ScaleOrder::kBlockMajor,
                              ScaleOrder::kPaddedRowMajor, ScaleOrder::kGrouped};

const char* level_name(qmoe_accuracy a) {
  return a == QMOE_ACCURACY_EXACT ? "exact" : "fast";
}

// One qmoe_cuda_gemm call's shape: rows, level, dtypes, strides (elements) and columns.
struct GemmCall {
  uint32_t m = 1;
  qmoe_accuracy level = QMOE_ACCURACY_EXACT;
  qmoe_dtype xd = QMOE_DTYPE_F32, yd = QMOE_DTYPE_F32;
  size_t ldx = 0, ldy = 0;          // 0: k and n
  uint32_t n_begin = 0, n_end = 0;  // n_end 0: n

  std::string describe(const Int4Matrix& w) const {
    std::ostringstream s;
    s << "INT3 " << w.options.describe() << " " << level_name(level) << " m=" << m
      << " x=" << dtype_label(xd) << " y=" << dtype_label(yd) << " ldx=" << ldx << " ldy=" << ldy
      << " cols=[" << n_begin << "," << n_end << ")";
    return s.str();
  }
};

// The row stride of X a call may use: rows of m > 8 calls 16-byte aligned (the ABI's rule for
// them), any stride >= k otherwise.
size_t pick_ldx(uint32_t m, uint32_t k, qmoe_dtype xd, uint32_t extra) {
  if (m <= 8) return k + extra;
  const size_t per16 = 16 / dtype_size(xd);
  return (k + extra + per16 - 1) / per16 * per16;
}

class CudaInt3Decode : public CudaAbiTest {
 protected:
  // qmoe_cuda_gemm on X [m][k] (values; stored at stride ldx in xd) into Y of dtype yd at stride
  // ldy, between guards, everything poisoned first: the columns [n_begin, n_end) of each row
  // within the FP64 reference's bound (plus yd's rounding) and within twice it of the CPU's
  // qmoe_gemm, every other byte still poison; a second call gives the same bits. Returns the
  // outputs [m][n] widened to FP32 (NaN outside the columns).
  std::vector<float> check_gemm(const Int4Matrix& w, GemmCall c, const std::vector<float>& x,
                                const std::string& what_prefix = "") {
    const uint32_t n = w.options.n, k = w.options.k, m = c.m;
    if (c.ldx == 0) c.ldx = k;
    if (c.ldy == 0) c.ldy = n;
    if (c.n_end == 0) c.n_end = n;
    const std::string what = what_prefix + c.describe(w);
    const std::unique_ptr<DeviceAbiMatrix> dw = upload_abi_matrix(w);
    std::vector<float> xs(size_t{m} * c.ldx, 0.0f);
    for (uint32_t i = 0; i < m; ++i) {
      std::copy_n(x.begin() + size_t{i} * k, k, xs.begin() + size_t{i} * c.ldx);
    }
    const std::vector<unsigned char> xb = to_dtype(c.xd, xs);
    const std::vector<float> xw_strided = from_dtype(c.xd, xb);
    std::vector<float> xw(size_t{m} * k);  // the values the device reads, dense
    for (uint32_t i = 0; i < m; ++i) {
      std::copy_n(xw_strided.begin() + size_t{i} * c.ldx, k, xw.begin() + size_t{i} * k);
    }
    const DeviceBuffer dx = to_device(xb);
    const size_t es = dtype_size(c.yd), y_elems = 2 * kGuard + size_t{m} * c.ldy;
    DeviceBuffer dy(y_elems * es);
    std::vector<unsigned char> runs[2];
    for (auto& run : runs) {
      EXPECT_TRUE(dy.fill(kPoison));
      EXPECT_EQ(
          qmoe_cuda_gemm(&dw->desc, c.level, m, c.xd, dx.data(), c.ldx, c.yd,
                         dy.as<unsigned char>() + kGuard * es, c.ldy, c.n_begin, c.n_end, nullptr),
          QMOE_STATUS_OK)
          << what << ": " << qmoe_last_error_message();
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      run.resize(y_elems * es);
      EXPECT_TRUE(dy.download(run.data(), run.size()));
    }
    EXPECT_TRUE(runs[0] == runs[1]) << what << ": two runs differ";
    // Nothing written outside rows [0, m) x columns [n_begin, n_end).
    size_t touched = 0, first = 0;
    for (size_t e = 0; e < y_elems; ++e) {
      if (e >= kGuard && e < kGuard + size_t{m} * c.ldy) {
        const size_t col = (e - kGuard) % c.ldy;
        if (col >= c.n_begin && col < c.n_end) continue;
      }
      for (size_t b = 0; b < es; ++b) {
        if (runs[0][e * es + b] != kPoison) {
          if (touched++ == 0) first = e;
          break;
        }
      }
    }
    EXPECT_EQ(touched, 0u) << what << ": elements written outside the rows and columns, first "
                           << first;
    const std::vector<float> all = from_dtype(c.yd, runs[0]);
    const Reference ref = reference_gemm(w, xw, m);
    std::vector<float> cpu(size_t{m} * n);
    EXPECT_EQ(qmoe_gemm(ctx_, &w.desc, c.level, m, xw.data(), k, cpu.data(), n, 0, n),
              QMOE_STATUS_OK)
        << qmoe_last_error_message();
    std::vector<float> got(size_t{m} * n, NAN);
    size_t bad = 0;
    for (uint32_t i = 0; i < m; ++i) {
      for (uint32_t j = c.n_begin; j < c.n_end; ++j) {
        const size_t o = size_t{i} * n + j;
        const float g = all[kGuard + size_t{i} * c.ldy + j];
        got[o] = g;
        const double tol =
            (c.level == QMOE_ACCURACY_EXACT ? 1e-5 * ref.abs_sum[o] : ref.fast_bound[o]) + 1e-30;
        if (!output_matches(c.yd, g, ref.y[o], tol) && bad++ < 5) {
          ADD_FAILURE() << what << ": y[" << i << "," << j << "] = " << g << ", FP64 " << ref.y[o]
                        << " +- " << tol << " and the output's rounding";
        }
        if (!output_matches(c.yd, g, cpu[o], 2 * tol) && bad++ < 5) {
          ADD_FAILURE() << what << ": y[" << i << "," << j << "] = " << g << ", CPU " << cpu[o];
        }
      }
    }
    EXPECT_EQ(bad, 0u) << what;
    return got;
  }
};

// ---------------------------------------------------------------------------------------------
// qmoe_cuda_gemm

// Random matrices from the whole option space (every block size, K up to 640, N 1..70, every
// scale dtype and plane order, zero points or not, bias or not) at M = 1..8, 9 and 17, both
// levels, every pair of activation and output dtypes, row strides past K and N, sometimes a
// column sub-range.
TEST_F(CudaInt3Decode, GemmEveryRowCountLevelAndDtype) {
  int index = 0;
  for (int round = 0; round < 2; ++round) {
    for (uint32_t m : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 9u, 17u}) {
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        const Int4Options o = random_int4_options(rng_, 640);
        const Int4Matrix w = make_int3_matrix(o, rng_);
        GemmCall c;
        c.m = m;
        c.level = level;
        c.xd = kDtypes[index % 3];
        c.yd = kDtypes[(index / 3) % 3];
        c.ldx = pick_ldx(m, o.k, c.xd, static_cast<uint32_t>(rng_() % 5));
        c.ldy = o.n + rng_() % 4;
        if (index % 3 == 2 && o.n > 1) {
          c.n_begin = static_cast<uint32_t>(rng_() % o.n);
          c.n_end = c.n_begin + 1 + static_cast<uint32_t>(rng_() % (o.n - c.n_begin));
        }
        ++index;
        check_gemm(w, c, random_activations(m, o.k, rng_));
        if (HasFailure()) return;
      }
    }
  }
}

// Every N % 8 (a partial last group: rows 6 and 7 of a tile take bits of vectors 0-1 and of
// vector 2, so a tail that ends at or inside them matters), with and without full groups before
// it, at every block size, K % 32 == 16 where block 16 allows it, each scale dtype, zero points
// and bias in turn, M = 1, 8 (one GEMV) and 11 (two), both levels.
TEST_F(CudaInt3Decode, GemmNAndKTailsEveryBlockSize) {
  int v = 0;
  for (uint32_t block : {16u, 32u, 64u, 128u}) {
    for (uint32_t r = 0; r < 8; ++r) {
      for (uint32_t groups : {0u, 2u}) {
        const uint32_t n = 8 * groups + r;
        if (n == 0) continue;
        const uint32_t k = block == 16 ? 16 * (1 + 2 * (v % 4)) : block * (1 + v % 3);
        const Int4Options o = tail_variant_options(n, k, block, v, v % 3 != 1);
        const Int4Matrix w = make_int3_matrix(o, rng_);
        for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
          for (uint32_t m : {1u, 8u, 11u}) {
            GemmCall c;
            c.m = m;
            c.level = level;
            c.xd = kDtypes[(v + m) % 3];
            c.yd = kDtypes[(v + 2 * m + 1) % 3];
            c.ldx = pick_ldx(m, o.k, c.xd, v % 3);
            c.ldy = n + 3;
            check_gemm(w, c, random_activations(m, o.k, rng_));
            if (HasFailure()) return;
          }
        }
        ++v;
      }
    }
  }
}

// Every scale dtype, plane order, zero points or not and bias (each dtype) or not, at every
// block size, both levels.
TEST_F(CudaInt3Decode, GemmScaleDtypesOrdersZeroPointsAndBias) {
  int v = 0;
  for (uint32_t block : {16u, 32u, 64u, 128u}) {
    for (qmoe_dtype sd : kDtypes) {
      for (ScaleOrder order : kOrders) {
        for (bool zeros : {false, true}) {
          Int4Options o;
          o.n = 21 + v % 8;
          o.block_size = block;
          o.k = block * (block >= 64 ? 2 : 3);
          o.scale_dtype = sd;
          o.scale_order = order;
          o.zero_points = zeros;
          o.zero_point_order = kOrders[(v + 2) % 4];
          o.bias = v % 4 != 0;
          o.bias_dtype = kDtypes[v % 3];
          const Int4Matrix w = make_int3_matrix(o, rng_);
          for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
            GemmCall c;
            c.m = 1 + static_cast<uint32_t>(v % 8);
            c.level = level;
            c.xd = kDtypes[(v + 1) % 3];
            c.yd = kDtypes[v % 3];
            check_gemm(w, c, random_activations(c.m, o.k, rng_));
            if (HasFailure()) return;
          }
          ++v;
        }
      }
    }
  }
}

// Column sub-ranges starting and ending inside a group, on rows 6 and 7 among others: only
// their columns are written (check_gemm's poison check), with the reference's values.
TEST_F(CudaInt3Decode, GemmColumnRangesWriteOnlyTheirColumns) {
  const Int4Options o = grouped_int4_options(37, 96, true, true);
  const Int4Matrix w = make_int3_matrix(o, rng_);
  struct Range {
    uint32_t begin, end;
  };
  int v = 0;
  for (const Range r : {Range{0, 1}, Range{5, 6}, Range{6, 7}, Range{7, 8}, Range{6, 14},
                        Range{8, 16}, Range{13, 37}, Range{30, 37}, Range{36, 37}, Range{1, 36}}) {
    for (uint32_t m : {1u, 4u, 9u}) {
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        GemmCall c;
        c.m = m;
        c.level = level;
        c.xd = kDtypes[v % 3];
        c.yd = kDtypes[(v / 3) % 3];
        c.ldy = o.n + 2;
        c.n_begin = r.begin;
        c.n_end = r.end;
        ++v;
        check_gemm(w, c, random_activations(m, o.k, rng_));
        if (HasFailure()) return;
      }
    }
  }
}

// Power-of-two scales and half-integer activations whose 32-k chunks have max |x| = 127: the
// fast level's activation scale is 1 and q = round-half-even(x), so both levels' results are
// exact in FP32 and must equal the integer reference bit for bit (every code of every row of
// the tile counts, so a misplaced bit of rows 6-7 cannot hide in a bound).
TEST_F(CudaInt3Decode, GemmIntegerPartsAreExact) {
  for (uint32_t block : {16u, 32u, 64u, 128u}) {
    for (int v = 0; v < 6 && !HasFailure(); ++v) {
      const Int4Matrix w = integer_part_matrix(block, v, make_int3_matrix, rng_);
      const Int4Options& o = w.options;
      const std::unique_ptr<DeviceAbiMatrix> dw = upload_abi_matrix(w);
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        const uint32_t m = v == 5 ? 17 : 1 + static_cast<uint32_t>(rng_() % 8);
        const qmoe_dtype xd = kDtypes[(v + block / 16) % 3];
        const std::vector<float> x = integer_part_activations(m, o.k, rng_);
        const std::vector<unsigned char> xb = to_dtype(xd, x);
        ASSERT_TRUE(from_dtype(xd, xb) == x) << "the activations are exact in every dtype";
        const DeviceBuffer dx = to_device(xb);
        DeviceBuffer dy(size_t{m} * o.n * 4);
        ASSERT_TRUE(dy.fill(kPoison));
        ASSERT_EQ(qmoe_cuda_gemm(&dw->desc, level, m, xd, dx.data(), o.k, QMOE_DTYPE_F32, dy.data(),
                                 o.n, 0, o.n, nullptr),
                  QMOE_STATUS_OK)
            << qmoe_last_error_message();
        QMOE_CUDA_OK(cudaDeviceSynchronize());
        std::vector<float> y(size_t{m} * o.n);
        ASSERT_TRUE(dy.download(y.data(), y.size() * 4));
        for (uint32_t i = 0; i < m; ++i) {
          for (uint32_t n = 0; n < o.n; ++n) {
            ASSERT_EQ(y[size_t{i} * o.n + n],
                      integer_parts_output(w, x.data() + size_t{i} * o.k, n, level))
                << "y[" << i << "," << n << "] INT3 " << o.describe() << " " << level_name(level)
                << " m=" << m << " x=" << dtype_label(xd);
          }
        }
      }
    }
  }
}

// The model shapes of the benchmarks: Qwen3-30B-A3B's expert projections (FC1 [1536, 2048],
// FC2 [2048, 768]) and gpt-oss's FC1 shape [5760, 2880] with a bias; block 32, FP16 scales in
// the grouped order.
TEST_F(CudaInt3Decode, GemmModelShapes) {
  for (const Int4Options& o : benchmark_gemm_shapes()) {
    const Int4Matrix w = make_int3_matrix(o, rng_);
    for (uint32_t m : {1u, 4u, 8u, 17u}) {
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        GemmCall c;
        c.m = m;
        c.level = level;
        c.xd = m == 4 ? QMOE_DTYPE_BF16 : QMOE_DTYPE_F32;
        c.yd = m == 8 ? QMOE_DTYPE_F16 : QMOE_DTYPE_F32;
        check_gemm(w, c, random_activations(m, o.k, rng_));
        if (HasFailure()) return;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The resident MoE layer

std::vector<float> round_trip(qmoe_dtype d, const std::vector<float>& v) {
  return from_dtype(d, to_dtype(d, v));
}

size_t abi_workspace_bytes(const qmoe_cuda_expert_set* set, qmoe_accuracy level, uint32_t capacity,
                           uint32_t k) {
  size_t bytes = 0;
  EXPECT_EQ(qmoe_cuda_moe_workspace_size(set, level, capacity, k, &bytes), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  return bytes;
}

// Layer calls through the ABI of up to `capacity` tokens on `set` (tests/cuda/layer_call_util.h:
// X and Y at strides past H, Y between guards, the workspace the set asks for), and the host
// values of the call last written.
struct LayerIo : LayerBuffers {
  // The call: m tokens, x and y0 (values exact in dtype), the routing (given, or derived on
  // the host from the logits by qmoe_moe_route_topk).
  uint32_t m = 0;
  std::vector<float> x, y0, logits, weights;
  std::vector<int32_t> ids;

  LayerIo(const qmoe_cuda_expert_set* set, qmoe_accuracy level, qmoe_dtype d, uint32_t cap,
          uint32_t h, uint32_t e, uint32_t k_)
      : LayerBuffers(d, cap, h, e, k_, abi_workspace_bytes(set, level, cap, k_)) {}

  // New random inputs for m tokens: x, y0, routing (ids and weights, or logits routed on the
  // host with `renormalize`).
  void randomize(uint32_t m_, bool with_logits, bool renormalize, std::mt19937_64& rng) {
    m = m_;
    x = round_trip(dtype, random_activations(m, hidden, rng));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    y0.resize(size_t{m} * hidden);
    for (float& v : y0) v = u(rng);
    y0 = round_trip(dtype, y0);
    if (with_logits) {
      std::normal_distribution<float> normal(0.0f, 2.0f);
      logits.resize(size_t{m} * experts);
      for (float& v : logits) v = normal(rng);
      logits = round_trip(dtype, logits);
      ids.assign(size_t{m} * k, 0);
      weights.assign(size_t{m} * k, 0.0f);
      if (m > 0) {
        ASSERT_EQ(qmoe_moe_route_topk(logits.data(), m, experts, k, renormalize ? 1 : 0, ids.data(),
                                      weights.data()),
                  QMOE_STATUS_OK)
            << qmoe_last_error_message();
      }
    } else {
      logits.clear();
      random_routing(m, experts, k, rng, &ids, &weights);
      for (size_t i = 0; i < weights.size(); i += 5) weights[i] = 0.0f;  // skipped slots
    }
  }

  // Writes the call into the device buffers: m, X, the routing, and Y (y0 rows for accumulate,
  // poison everywhere else).
  void write(bool accumulate) { LayerBuffers::write(m, x, y0, accumulate, ids, weights, logits); }

  qmoe_cuda_moe_params params(qmoe_accuracy level, bool with_logits, bool renormalize,
                              bool accumulate) const {
    qmoe_cuda_moe_params p;
    qmoe_cuda_moe_params_init(&p);
    fill_params(&p, level, with_logits, renormalize, accumulate);
    p.k = k;
    return p;
  }

  // Bytes other than rows [0, m) x columns [0, H) that no longer hold the poison.
  size_t touched_outside(const std::vector<unsigned char>& yb) const {
    return LayerBuffers::touched_outside(yb, m);
  }
};

// The CPU library's layer on the call's widened values (FP32 in and out), `run_mask` as given.
std::vector<float> cpu_layer(qmoe_context* ctx, const qmoe_expert_set* host, qmoe_accuracy level,
                             const LayerIo& io, bool accumulate, const uint8_t* run_mask) {
  std::vector<float> y = accumulate ? io.y0 : std::vector<float>(size_t{io.m} * io.hidden, 0.0f);
  MoeCallOptions options;
  options.run_mask = run_mask;
  options.accumulate = accumulate ? 1 : 0;
  EXPECT_EQ(moe_forward(ctx, host, level, io.m, io.x.data(), io.hidden, io.ids.data(),
                        io.weights.data(), io.k, y.data(), io.hidden, &options),
            QMOE_STATUS_OK)
      << qmoe_last_error_message();
  return y;
}

std::vector<uint8_t> mask_of(uint32_t experts, const std::vector<uint32_t>& resident) {
  std::vector<uint8_t> mask(experts, resident.empty() ? 1 : 0);
  for (uint32_t e : resident) mask[e] = 1;
  return mask;
}

// The layer of `model` on a GPU set of its experts (every one, or `resident`) through the ABI,
// for each m of `ms` in a call of capacity `capacity` (0: m) at both levels: twice (the same
// bits), nothing written outside the rows, no device error, within the bounds of the FP64 layer
// and of the CPU layer with the residency as the run mask.
void check_layer(qmoe_context* ctx, const MoeModel& model, uint32_t k, qmoe_dtype dtype,
                 const std::vector<uint32_t>& resident, const std::vector<uint32_t>& ms,
                 uint32_t capacity, bool accumulate, std::mt19937_64& rng) {
  const MoeOptions& o = model.options;
  const HostSet host = make_host_set(model.desc);
  ASSERT_TRUE(host);
  const GpuSet set = make_gpu_set(host.get(), resident);
  ASSERT_TRUE(set);
  const std::vector<uint8_t> mask = mask_of(o.experts, resident);
  for (uint32_t m : ms) {
    for (qmoe_accuracy level : {QMOE_ACCURACY_FAST, QMOE_ACCURACY_EXACT}) {
      std::ostringstream s;
      s << "INT3 layer " << o.describe() << " k=" << k << " " << level_name(level) << " m=" << m
        << " capacity=" << (capacity ? capacity : m) << " " << dtype_label(dtype)
        << (accumulate ? " accumulate" : "")
        << (resident.empty() ? " all-resident" : " partial-residency");
      const std::string what = s.str();
      LayerIo io(set.get(), level, dtype, capacity ? capacity : m, o.hidden, o.experts, k);
      io.randomize(m, false, false, rng);
      const qmoe_cuda_moe_params p = io.params(level, false, false, accumulate);
      std::vector<unsigned char> runs[2];
      for (auto& run : runs) {
        io.write(accumulate);
        ASSERT_EQ(qmoe_cuda_moe_forward(set.get(), &p, nullptr), QMOE_STATUS_OK)
            << what << ": " << qmoe_last_error_message();
        ASSERT_EQ(qmoe_cuda_moe_check(io.d_workspace.data(), nullptr), QMOE_STATUS_OK)
            << what << ": " << qmoe_last_error_message();
        run = io.read_y();
      }
      EXPECT_TRUE(runs[0] == runs[1]) << what << ": two runs differ";
      EXPECT_EQ(io.touched_outside(runs[0]), 0u) << what << ": bytes outside rows [0, m) x [0, H)";
      const MoeReference ref =
          reference_moe(model, level, io.x, m, io.ids, io.weights, k, mask.data(),
                        accumulate ? io.y0 : std::vector<float>{});
      const std::vector<float> cpu = cpu_layer(ctx, host.get(), level, io, accumulate, mask.data());
      check_layer_outputs(io, runs[0], io.m, ref, cpu, false, what);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// Qwen3-30B-A3B's layer shape (H 2048, I 768, top-8, block 32, FP16 scales in the grouped
// order, Qwen3's SwiGLU) with 16 experts rather than 128 (the walks and tiles are the model's;
// the expert count only sizes the routing): all resident, then 11 of 16 resident; the
// concatenated gate/up order at M = 1 and 4.
TEST_F(CudaInt3Decode, MoeLayerQwen3ShapeFewerExperts) {
  MoeOptions o = qwen3_layer(16);
  const auto model = make_moe_model(o, rng_, make_int3_matrix);
  check_layer(ctx_, *model, 8, QMOE_DTYPE_BF16, {}, {1u, 4u}, 0, false, rng_);
  if (HasFailure()) return;
  check_layer(ctx_, *model, 8, QMOE_DTYPE_F16, {3, 14, 0, 7, 9, 1, 12, 5, 10, 15, 6}, {1u, 4u}, 8,
              false, rng_);
  if (HasFailure()) return;
  // The same experts with FC1's gate and up rows concatenated (a fusion is a property of the
  // set, so a second model of the other order).
  o.fusion = QMOE_SWIGLU_CONCATENATED;
  const auto concatenated = make_moe_model(o, rng_, make_int3_matrix);
  check_layer(ctx_, *concatenated, 8, QMOE_DTYPE_BF16, {}, {1u, 4u}, 0, false, rng_);
}

// Small layers over the layout options: H % 32 == 16 with block 16 (half-filled last tiles),
// zero points, bias, BF16 scales, gpt-oss's clamped SwiGLU, FP16 and FP32 activations; and
// blocks 128 and 64 with FP32 scales and the concatenated order; all resident and partial
// residency, capacities above m, accumulate, and an M = 12 call (experts with more than 8 tokens).
TEST_F(CudaInt3Decode, MoeLayerSmallShapesEveryOption) {
  MoeOptions a = small_layer_a();
  use_gpt_oss_swiglu(&a);
  const auto ma = make_moe_model(a, rng_, make_int3_matrix);
  check_layer(ctx_, *ma, 3, QMOE_DTYPE_F16, {}, {1u, 3u, 12u}, 0, false, rng_);
  if (HasFailure()) return;
  check_layer(ctx_, *ma, 2, QMOE_DTYPE_F32, {5, 0, 2, 3}, {1u, 4u}, 6, true, rng_);
  if (HasFailure()) return;

  MoeOptions b = moe_shape(5, 128, 64);
  b.fusion = QMOE_SWIGLU_CONCATENATED;
  use_qwen3_swiglu(&b);
  b.fc1.block_size = 128;
  b.fc1.scale_dtype = QMOE_DTYPE_F32;
  b.fc1.scale_order = ScaleOrder::kBlockMajor;
  b.fc2.block_size = 64;
  b.fc2.scale_dtype = QMOE_DTYPE_F32;
  b.fc2.scale_order = ScaleOrder::kPaddedRowMajor;
  b.fc2.zero_points = true;
  b.fc2.zero_point_order = ScaleOrder::kGrouped;
  b.fc2.bias = true;
  b.fc2.bias_dtype = QMOE_DTYPE_BF16;
  const auto mb = make_moe_model(b, rng_, make_int3_matrix);
  check_layer(ctx_, *mb, 2, QMOE_DTYPE_BF16, {}, {1u, 8u}, 0, true, rng_);
  if (HasFailure()) return;
  check_layer(ctx_, *mb, 3, QMOE_DTYPE_F32, {4, 1}, {2u, 5u}, 5, false, rng_);
}

// A captured graph of qmoe_cuda_moe_forward replayed 6 times with new routing (given, or router
// logits routed on the device), token counts (0 included), X and residency (an update between
// replays, of a set with more slots than resident experts) written between replays gives the
// bits of eager calls; each eager call within the bounds of the FP64 and CPU layers with the
// new residency as the run mask.
TEST_F(CudaInt3Decode, GraphReplayWithNewRoutingEqualsEager) {
  const MoeOptions o = graph_replay_layer();
  const auto model = make_moe_model(o, rng_, make_int3_matrix);
  const HostSet host = make_host_set(model->desc);
  ASSERT_TRUE(host);
  constexpr uint32_t kCapacity = 6, kTopK = 3, kSlots = 6;
  const std::vector<uint32_t> first = {6, 1, 3, 0, 4};
  const GpuSet set = make_gpu_set(host.get(), first, kSlots);
  ASSERT_TRUE(set);
  const qmoe_dtype dtype = QMOE_DTYPE_BF16;
  cudaStream_t stream = nullptr;
  QMOE_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // The residency of each replay: slots kept, swapped, emptied, all filled.
  const std::vector<std::vector<uint32_t>> steps = {{6, 1, 3, 0, 4},    {1, 3, 5}, {7, 2, 0, 4},
                                                    {0, 1, 2, 3, 4, 5}, {7},       {2, 5, 6, 7}};
  for (qmoe_accuracy level : {QMOE_ACCURACY_FAST, QMOE_ACCURACY_EXACT}) {
    for (bool with_logits : {false, true}) {
      const bool renormalize = level == QMOE_ACCURACY_FAST;
      LayerIo io(set.get(), level, dtype, kCapacity, o.hidden, o.experts, kTopK);
      const qmoe_cuda_moe_params p = io.params(level, with_logits, renormalize, true);
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      QMOE_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      const qmoe_status captured = qmoe_cuda_moe_forward(set.get(), &p, stream);
      QMOE_CUDA_OK(cudaStreamEndCapture(stream, &graph));
      ASSERT_EQ(captured, QMOE_STATUS_OK) << qmoe_last_error_message();
      QMOE_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      for (uint32_t replay = 0; replay < steps.size(); ++replay) {
        const std::vector<uint32_t>& now = steps[replay];
        ASSERT_EQ(qmoe_cuda_expert_set_update_residency(set.get(), host.get(), now.data(),
                                                        static_cast<uint32_t>(now.size()), stream,
                                                        nullptr),
                  QMOE_STATUS_OK)
            << qmoe_last_error_message();
        QMOE_CUDA_OK(cudaStreamSynchronize(stream));
        const uint32_t m = replay == 3 ? 0 : 1 + (replay * 5) % kCapacity;
        io.randomize(m, with_logits, renormalize, rng_);
        const std::string what = std::string(level_name(level)) +
                                 (with_logits ? " logits" : " ids") + " replay " +
                                 std::to_string(replay) + " m " + std::to_string(m);
        io.write(true);
        QMOE_CUDA_OK(cudaGraphLaunch(exec, stream));
        ASSERT_EQ(qmoe_cuda_moe_check(io.d_workspace.data(), stream), QMOE_STATUS_OK)
            << what << ": " << qmoe_last_error_message();
        const std::vector<unsigned char> replayed = io.read_y();
        io.write(true);
        ASSERT_EQ(qmoe_cuda_moe_forward(set.get(), &p, stream), QMOE_STATUS_OK)
            << what << ": " << qmoe_last_error_message();
        ASSERT_EQ(qmoe_cuda_moe_check(io.d_workspace.data(), stream), QMOE_STATUS_OK)
            << what << ": " << qmoe_last_error_message();
        const std::vector<unsigned char> eager = io.read_y();
        EXPECT_TRUE(replayed == eager) << what << ": the replay's bits differ from eager";
        EXPECT_EQ(io.touched_outside(eager), 0u) << what;
        if (m > 0) {
          const std::vector<uint8_t> mask = mask_of(o.experts, now);
          const MoeReference ref =
              reference_moe(*model, level, io.x, m, io.ids, io.weights, kTopK, mask.data(), io.y0);
          const std::vector<float> cpu = cpu_layer(ctx_, host.get(), level, io, true, mask.data());
          check_layer_outputs(io, eager, io.m, ref, cpu, with_logits, what);
        }
        if (HasFailure()) break;
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      if (HasFailure()) break;
    }
    if (HasFailure()) break;
  }
  cudaStreamDestroy(stream);
}

// A GPU set takes one format for all its projections: INT3 experts alone are a set; one INT4
// FC1 or FC2 among them (which the CPU runs) is UNSUPPORTED_FORMAT, resident or not, whichever
// expert it is; a residency update from a host set of INT4 experts into an INT3 set is refused,
// one from INT3 experts goes through.
TEST_F(CudaInt3Decode, SetMixingInt3AndInt4IsUnsupportedFormat) {
  const MoeOptions o = moe_shape(3, 64, 32);
  const auto int3 = make_moe_model(o, rng_, make_int3_matrix);
  const auto int4 = make_moe_model(o, rng_);
  const HostSet host3 = make_host_set(int3->desc), host4 = make_host_set(int4->desc);
  ASSERT_TRUE(host3 && host4);
  const GpuSet set = make_gpu_set(host3.get());
  ASSERT_TRUE(set);
  for (uint32_t odd : {0u, 2u}) {
    for (bool fc2 : {false, true}) {
      const HostSet mixed = host_set_replacing(int3->desc, odd, fc2,
                                               fc2 ? &int4->fc2[odd].desc : &int4->fc1[odd].desc);
      ASSERT_TRUE(mixed);
      const std::string what =
          "INT4 " + std::string(fc2 ? "fc2" : "fc1") + " of expert " + std::to_string(odd);
      EXPECT_EQ(gpu_set_status(mixed.get(), nullptr, 0), QMOE_STATUS_UNSUPPORTED_FORMAT) << what;
      if (odd != 0) {
        EXPECT_NE(std::string(qmoe_last_error_message())
                      .find("expert " + std::to_string(odd) + (fc2 ? " fc2" : " fc1")),
                  std::string::npos)
            << what << ": " << qmoe_last_error_message();
      }
      const uint32_t others[] = {(odd + 1) % 3, (odd + 2) % 3};  // the odd expert not resident
      EXPECT_EQ(gpu_set_status(mixed.get(), others, 2), QMOE_STATUS_UNSUPPORTED_FORMAT) << what;
      // Into the INT3 set: refused before anything is copied.
      uint32_t copied = 99;
      EXPECT_EQ(qmoe_cuda_expert_set_update_residency(set.get(), mixed.get(), others, 2, nullptr,
                                                      &copied),
                QMOE_STATUS_UNSUPPORTED_FORMAT)
          << what << ": " << qmoe_last_error_message();
    }
  }
  const uint32_t resident[] = {2, 0};
  uint32_t copied = 0;
  EXPECT_EQ(
      qmoe_cuda_expert_set_update_residency(set.get(), host4.get(), resident, 2, nullptr, &copied),
      QMOE_STATUS_UNSUPPORTED_FORMAT)
      << qmoe_last_error_message();
  EXPECT_EQ(
      qmoe_cuda_expert_set_update_residency(set.get(), host3.get(), resident, 2, nullptr, &copied),
      QMOE_STATUS_OK)
      << qmoe_last_error_message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // An INT4 set is still an INT4 set (the check is of the one format, not of INT3).
  const GpuSet set4 = make_gpu_set(host4.get());
  EXPECT_TRUE(set4);
}

// ---------------------------------------------------------------------------------------------
// The offload session

// The hybrid layer of INT3 experts (4 of 8 resident): y is bit for bit the resident layer's
// output plus the CPU layer with the cold run mask (rounded once to the dtype) on the rows with
// a cold selection, and, in FP32, within the FP64 reference's bound.
TEST_F(CudaInt3Decode, OffloadHybridLayerIsTheResidentLayerPlusTheCpuColdPart) {
  const MoeOptions o = moe_shape(8, 320, 64);
  const auto model = make_moe_model(o, rng_, make_int3_matrix);
  const HostSet host = make_host_set(model->desc);
  ASSERT_TRUE(host);
  const std::vector<uint32_t> resident = {0, 2, 5, 7};
  const GpuSet set = make_gpu_set(host.get(), resident);
  ASSERT_TRUE(set);
  std::vector<uint8_t> cold(o.experts, 1);
  for (uint32_t e : resident) cold[e] = 0;
  constexpr uint32_t kCapacity = 4, kTopK = 3;
  const Session session = make_session(ctx_, {host.get()}, {set.get()}, kCapacity, kTopK, 5000000);
  ASSERT_TRUE(session);
  const uint32_t hidden = o.hidden;
  uint64_t calls = 0;
  for (qmoe_dtype dtype : {QMOE_DTYPE_F32, QMOE_DTYPE_BF16}) {
    for (qmoe_accuracy level : {QMOE_ACCURACY_FAST, QMOE_ACCURACY_EXACT}) {
      for (uint32_t m : {1u, kCapacity}) {
        const std::string what =
            std::string(dtype_label(dtype)) + " " + level_name(level) + " m " + std::to_string(m);
        LayerIo io(set.get(), level, dtype, kCapacity, hidden, o.experts, kTopK);
        io.randomize(m, false, false, rng_);
        io.write(false);
        // The resident part alone, into its own buffer (io's workspace).
        const size_t es = dtype_size(dtype);
        DeviceBuffer y_hot(size_t{kCapacity} * io.ldy * es);
        qmoe_cuda_moe_params hot = io.params(level, false, false, false);
        hot.y = y_hot.data();
        ASSERT_EQ(qmoe_cuda_moe_forward(set.get(), &hot, nullptr), QMOE_STATUS_OK)
            << what << ": " << qmoe_last_error_message();
        // The hybrid layer (the session's own workspace).
        qmoe_cuda_moe_params p = io.params(level, false, false, false);
        p.workspace = nullptr;
        p.workspace_bytes = 0;
        ASSERT_EQ(qmoe_cuda_offload_forward(session.get(), 0, &p, nullptr), QMOE_STATUS_OK)
            << what << ": " << qmoe_last_error_message();
        ASSERT_EQ(qmoe_cuda_offload_check(session.get(), nullptr), QMOE_STATUS_OK)
            << what << ": " << qmoe_last_error_message();
        ++calls;
        // The cold part on the CPU, in the dtype: the layer with the cold run mask.
        const std::vector<unsigned char> xb = to_dtype(dtype, io.x);
        std::vector<unsigned char> y_cold(xb.size(), 0);
        MoeCallOptions cold_part;
        cold_part.run_mask = cold.data();
        ASSERT_EQ(
            moe_forward_typed(ctx_, host.get(), level, m, dtype, xb.data(), hidden, io.ids.data(),
                              io.weights.data(), kTopK, y_cold.data(), hidden, &cold_part),
            QMOE_STATUS_OK)
            << qmoe_last_error_message();
        std::vector<unsigned char> hot_bytes(y_hot.bytes());
        ASSERT_TRUE(y_hot.download(hot_bytes.data(), hot_bytes.size()));
        const std::vector<float> hot_values = from_dtype(dtype, hot_bytes);
        const std::vector<float> cold_values = from_dtype(dtype, y_cold);
        const std::vector<unsigned char> yb = io.read_y();
        EXPECT_EQ(io.touched_outside(yb), 0u) << what;
        expect_resident_plus_cold(
            dtype, m, hidden, kTopK, cold, io.ids, io.weights,
            [&](uint32_t t, uint32_t h) { return io.y_bytes_at(yb, t, h); },
            [&](uint32_t t, uint32_t h) { return hot_values[size_t{t} * io.ldy + h]; },
            [&](uint32_t t, uint32_t h) { return cold_values[size_t{t} * hidden + h]; }, what);
        if (dtype == QMOE_DTYPE_F32) {
          const MoeReference ref =
              reference_moe(*model, level, io.x, m, io.ids, io.weights, kTopK, nullptr, {});
          expect_within_layer_reference(
              m, hidden, [&](uint32_t t, uint32_t h) { return io.y_at(yb, t, h); }, ref, what);
        }
        if (HasFailure()) return;
      }
    }
  }
  qmoe_cuda_offload_telemetry t{};
  t.struct_size = sizeof t;
  ASSERT_EQ(qmoe_cuda_offload_get_telemetry(session.get(), nullptr, &t), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  EXPECT_EQ(t.classify_calls, calls);
  EXPECT_EQ(t.published_requests + t.short_circuits + t.refused_calls, t.classify_calls);
  EXPECT_EQ(t.published_requests, t.requests_served);
  EXPECT_EQ(t.cold_selections, t.selections_served);
  EXPECT_EQ(t.failed_requests, 0u);
}

}  // namespace
}  // namespace qmoe::testing
