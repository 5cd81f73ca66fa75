// MXFP4 and NVFP4 on the GPU through the C ABI (include/qmoe/qmoe_cuda.h): qmoe_cuda_gemm (the
// decode GEMV for M <= 8, and 8 rows at a time above) against the FP64 reference of
// tests/gemm/fp4_reference.h and the CPU library's qmoe_gemm, M = 1..8 (and 13), both levels,
// every activation and output dtype, N and K tails (NVFP4's K % 32 == 16), bias and global
// scales, NaN scale rows; and the resident MoE layer (qmoe_cuda_expert_set_create,
// qmoe_cuda_moe_forward) with gpt-oss's layer shape in MXFP4 (H = I = 2880, k = 4, fewer
// experts) and a small NVFP4 layer, against the FP64 layer and the CPU layer. Every result is
// also computed twice and must match bit for bit. Every test skips, naming the reason, without
// a usable device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "qmoe/qmoe.h"
#include "qmoe/qmoe_cuda.h"
#include "tests/cuda/cuda_set_util.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/gemm/fp4_reference.h"
#include "tests/moe/moe_call.h"
#include "tests/moe/moe_fp4_reference.h"

namespace qmoe::testing {
namespace {

constexpr qmoe_weight_format kFormats[] = {QMOE_WEIGHT_FORMAT_MXFP4, QMOE_WEIGHT_FORMAT_NVFP4};

class CudaFp4Decode : public CudaAbiTest {
 protected:
  // qmoe_cuda_gemm on X [m][k] (exactly representable in xd) into Y of dtype yd: every output
  // within the FP64 reference's bound (plus yd's rounding; infinity where that overflows yd),
  // within both bounds of the CPU's qmoe_gemm, NaN exactly where the CPU's is; a second call gives
  // the same bits. Returns the outputs widened to FP32.
  std::vector<float> check_gemm(const Fp4Matrix& w, qmoe_accuracy level, uint32_t m, qmoe_dtype xd,
                                qmoe_dtype yd, const std::vector<float>& x,
                                const std::string& what) {
    const uint32_t n = w.options.n, k = w.options.k;
    const std::unique_ptr<DeviceAbiMatrix> dw = upload_abi_matrix(w);
    const DeviceBuffer dx = to_device(to_dtype(xd, x));
    const size_t y_bytes = size_t{m} * n * dtype_size(yd);
    DeviceBuffer dy(y_bytes);
    std::vector<unsigned char> runs[2];
    for (auto& run : runs) {
      EXPECT_TRUE(dy.fill(0x7F));
      EXPECT_EQ(
          qmoe_cuda_gemm(&dw->desc, level, m, xd, dx.data(), k, yd, dy.data(), n, 0, n, nullptr),
          QMOE_STATUS_OK)
          << what << ": " << qmoe_last_error_message();
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      run.resize(y_bytes);
      EXPECT_TRUE(dy.download(run.data(), y_bytes));
    }
    EXPECT_TRUE(runs[0] == runs[1]) << what << ": two runs differ";
    const std::vector<float> got = from_dtype(yd, runs[0]);
    const std::vector<float> xw = from_dtype(xd, to_dtype(xd, x));
    const Fp4Reference ref = reference_gemm(w, xw, m);
    std::vector<float> cpu(size_t{m} * n);
    EXPECT_EQ(qmoe_gemm(ctx_, &w.desc, level, m, xw.data(), k, cpu.data(), n, 0, n),
              QMOE_STATUS_OK);
    size_t bad = 0;
    for (size_t o = 0; o < got.size(); ++o) {
      if (std::isnan(cpu[o]) || std::isnan(got[o])) {
        if (std::isnan(cpu[o]) != std::isnan(got[o]) && bad++ < 5) {
          ADD_FAILURE() << what << ": y[" << o << "] = " << got[o] << ", CPU " << cpu[o];
        }
        continue;
      }
      const double tol = ref.tol(level, o) + 1e-30;
      if (!output_matches(yd, got[o], ref.y[o], tol) && bad++ < 5) {
        ADD_FAILURE() << what << ": y[" << o << "] = " << got[o] << ", FP64 " << ref.y[o] << " +- "
                      << tol << " and the output's rounding";
      }
      if (!output_matches(yd, got[o], cpu[o], 2 * tol) && bad++ < 5) {
        ADD_FAILURE() << what << ": y[" << o << "] = " << got[o] << ", CPU " << cpu[o];
      }
    }
    EXPECT_EQ(bad, 0u) << what;
    return got;
  }
};

const qmoe_dtype kDtypes[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};

// The comparison the tests below make of a 16-bit output (host only: runs without a device).
// An NVFP4 row's sum can exceed FP16's range (a global scale of 4 times E4M3 scales up to 448),
// and its FP16 output is then infinity, as the conversion rules say; the infinity matches only
// where the exact value's interval reaches the overflow threshold, with its sign.
TEST(CudaOutputCheck, InfinityMatchesOnlyWhereTheValueOverflows) {
  const double inf = HUGE_VAL;
  EXPECT_TRUE(output_matches(QMOE_DTYPE_F16, inf, 83226.2, 1.0));
  EXPECT_TRUE(output_matches(QMOE_DTYPE_F16, -inf, -83226.2, 1.0));
  EXPECT_FALSE(output_matches(QMOE_DTYPE_F16, -inf, 83226.2, 1.0));
  EXPECT_TRUE(output_matches(QMOE_DTYPE_F16, inf, 65519.5, 1.0));
  EXPECT_FALSE(output_matches(QMOE_DTYPE_F16, inf, 65510.0, 1.0));
  EXPECT_TRUE(output_matches(QMOE_DTYPE_F16, 65504.0, 65510.0, 1.0));
  EXPECT_FALSE(output_matches(QMOE_DTYPE_F16, 65504.0, 83226.2, 1.0));
  EXPECT_FALSE(output_matches(QMOE_DTYPE_BF16, inf, 83226.2, 1.0));
  EXPECT_TRUE(output_matches(QMOE_DTYPE_BF16, inf, 0x1.ffp127, 0.0));
  EXPECT_FALSE(output_matches(QMOE_DTYPE_F32, inf, 1e38, 1e30));
  EXPECT_FALSE(output_matches(QMOE_DTYPE_F16, std::nan(""), 1.0, 1.0));
  // Finite values: the bound plus the output's rounding at the larger magnitude.
  EXPECT_TRUE(output_matches(QMOE_DTYPE_F16, 1024.0, 1023.0, 0.5));
  EXPECT_FALSE(output_matches(QMOE_DTYPE_F16, 1025.0, 1023.0, 0.5));
  EXPECT_FALSE(output_matches(QMOE_DTYPE_F32, 1.0 + 0x1p-20, 1.0, 0x1p-21));
}

TEST_F(CudaFp4Decode, GemmEveryRowCountLevelAndDtype) {
  int index = 0;
  for (qmoe_weight_format format : kFormats) {
    for (uint32_t m : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 13u}) {
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        Fp4Options o = random_fp4_options(rng_, 1200);
        o.format = format;
        if (format == QMOE_WEIGHT_FORMAT_MXFP4) {
          o.k = (o.k + 31) / 32 * 32;
          o.global_scale = 0.0f;
        }
        const Fp4Matrix w = make_fp4_matrix(o, rng_);
        const qmoe_dtype xd = kDtypes[index % 3], yd = kDtypes[(index / 3) % 3];
        ++index;
        check_gemm(w, level, m, xd, yd, random_activations(m, o.k, rng_),
                   o.describe() + (level == QMOE_ACCURACY_EXACT ? " exact" : " fast") + " m=" +
                       std::to_string(m) + " x=" + dtype_label(xd) + " y=" + dtype_label(yd));
        if (HasFailure()) return;
      }
    }
  }
}

// The model shapes: gpt-oss-20b's expert projections (MXFP4, K = 2880) and Qwen3-30B-A3B's
// (NVFP4, K = 2048 and 768), and a half-filled last chunk (NVFP4, K = 2064).
TEST_F(CudaFp4Decode, GemmModelShapes) {
  struct Shape {
    qmoe_weight_format format;
    uint32_t n, k;
  };
  for (const Shape s :
       {Shape{QMOE_WEIGHT_FORMAT_MXFP4, 5760, 2880}, Shape{QMOE_WEIGHT_FORMAT_MXFP4, 2880, 2880},
        Shape{QMOE_WEIGHT_FORMAT_NVFP4, 1536, 2048}, Shape{QMOE_WEIGHT_FORMAT_NVFP4, 2048, 768},
        Shape{QMOE_WEIGHT_FORMAT_NVFP4, 333, 2064}}) {
    Fp4Options o;
    o.format = s.format;
    o.n = s.n;
    o.k = s.k;
    o.bias = s.format == QMOE_WEIGHT_FORMAT_MXFP4;
    o.global_scale = s.format == QMOE_WEIGHT_FORMAT_NVFP4 ? 0.01171875f : 0.0f;
    const Fp4Matrix w = make_fp4_matrix(o, rng_);
    for (uint32_t m : {1u, 4u, 8u}) {
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        check_gemm(w, level, m, QMOE_DTYPE_BF16, QMOE_DTYPE_F32, random_activations(m, o.k, rng_),
                   o.describe() + (level == QMOE_ACCURACY_EXACT ? " exact" : " fast") +
                       " m=" + std::to_string(m));
        if (HasFailure()) return;
      }
    }
  }
}

// NaN scale bytes: their rows NaN, every other row as the CPU's.
TEST_F(CudaFp4Decode, GemmNanScalesMakeTheirRowsNan) {
  for (qmoe_weight_format format : kFormats) {
    Fp4Options o;
    o.format = format;
    o.n = 21;
    o.k = format == QMOE_WEIGHT_FORMAT_MXFP4 ? 160 : 176;
    Fp4Matrix w = make_fp4_matrix(o, rng_);
    const uint32_t blocks = o.k / fp4_block_size(format);
    w.set_scale(3, 0, 0xFF);
    w.set_scale(17, blocks - 1, format == QMOE_WEIGHT_FORMAT_MXFP4 ? 0xFF : 0x7F);
    for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      const uint32_t m = 3;
      const std::vector<float> y =
          check_gemm(w, level, m, QMOE_DTYPE_F32, QMOE_DTYPE_F32, random_activations(m, o.k, rng_),
                     fp4_format_name(format));
      for (uint32_t i = 0; i < m; ++i) {
        for (uint32_t j = 0; j < o.n; ++j) {
          EXPECT_EQ(std::isnan(y[size_t{i} * o.n + j]), j == 3 || j == 17) << i << "," << j;
        }
      }
    }
  }
}

// One layer on the GPU through the ABI against the FP64 layer and the CPU layer, twice (the
// same bits), for m = 1 and 4 at both levels.
void check_layer(qmoe_context* ctx, const Fp4Experts& e, uint32_t k, qmoe_dtype dtype,
                 std::mt19937_64& rng) {
  const GpuSet set = make_gpu_set(e.set.get());
  ASSERT_TRUE(set);
  const uint32_t H = e.hidden;
  for (uint32_t m : {1u, 4u}) {
    for (qmoe_accuracy level : {QMOE_ACCURACY_FAST, QMOE_ACCURACY_EXACT}) {
      const std::string what = std::string(fp4_format_name(e.fc1[0].options.format)) +
                               " H=" + std::to_string(H) + " I=" + std::to_string(e.inter) +
                               " E=" + std::to_string(e.experts) + " k=" + std::to_string(k) +
                               (level == QMOE_ACCURACY_EXACT ? " exact" : " fast") +
                               " m=" + std::to_string(m) + " " + dtype_label(dtype);
      const std::vector<float> x =
          from_dtype(dtype, to_dtype(dtype, random_activations(m, H, rng)));
      std::vector<int32_t> ids(size_t{m} * k);
      std::vector<float> weights(size_t{m} * k);
      for (uint32_t t = 0; t < m; ++t) {
        std::vector<int32_t> order(e.experts);
        for (uint32_t i = 0; i < e.experts; ++i) order[i] = static_cast<int32_t>(i);
        std::shuffle(order.begin(), order.end(), rng);
        for (uint32_t j = 0; j < k; ++j) {
          ids[t * k + j] = order[j];
          weights[t * k + j] = 0.4f - 0.05f * static_cast<float>(j);
        }
      }
      std::vector<double> y_ref, tol;
      reference_fp4_moe(e, x, m, ids, weights, k, level, &y_ref, &tol);
      std::vector<float> cpu(size_t{m} * H);
      ASSERT_EQ(moe_forward(ctx, e.set.get(), level, m, x.data(), H, ids.data(), weights.data(), k,
                            cpu.data(), H, nullptr),
                QMOE_STATUS_OK);
      size_t ws = 0;
      ASSERT_EQ(qmoe_cuda_moe_workspace_size(set.get(), level, m, k, &ws), QMOE_STATUS_OK);
      DeviceBuffer dws(ws), dm = to_device(std::vector<uint32_t>{m});
      DeviceBuffer dx = to_device(to_dtype(dtype, x)), dids = to_device(ids),
                   dw = to_device(weights), dy(size_t{m} * H * dtype_size(dtype));
      qmoe_cuda_moe_params p;
      qmoe_cuda_moe_params_init(&p);
      p.accuracy = level;
      p.dtype = dtype;
      p.m_capacity = m;
      p.m = dm.as<const uint32_t>();
      p.x = dx.data();
      p.ldx = H;
      p.y = dy.data();
      p.ldy = H;
      p.k = k;
      p.ids = dids.as<const int32_t>();
      p.weights = dw.as<const float>();
      p.workspace = dws.data();
      p.workspace_bytes = ws;
      std::vector<unsigned char> runs[2];
      for (auto& run : runs) {
        ASSERT_TRUE(dy.fill(0x7F));
        ASSERT_EQ(qmoe_cuda_moe_forward(set.get(), &p, nullptr), QMOE_STATUS_OK)
            << qmoe_last_error_message();
        ASSERT_EQ(qmoe_cuda_moe_check(dws.data(), nullptr), QMOE_STATUS_OK)
            << qmoe_last_error_message();
        run.resize(size_t{m} * H * dtype_size(dtype));
        ASSERT_TRUE(dy.download(run.data(), run.size()));
      }
      EXPECT_TRUE(runs[0] == runs[1]) << what << ": two runs differ";
      const std::vector<float> got = from_dtype(dtype, runs[0]);
      size_t bad = 0;
      for (size_t o = 0; o < got.size(); ++o) {
        if (!output_matches(dtype, got[o], y_ref[o], tol[o]) && bad++ < 5) {
          ADD_FAILURE() << what << ": y[" << o << "] = " << got[o] << ", FP64 " << y_ref[o]
                        << " +- " << tol[o] << " and the output's rounding";
        }
        if (!output_matches(dtype, got[o], cpu[o], 2 * tol[o]) && bad++ < 5) {
          ADD_FAILURE() << what << ": y[" << o << "] = " << got[o] << ", CPU " << cpu[o];
        }
      }
      EXPECT_EQ(bad, 0u) << what;
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// gpt-oss-20b's layer shape (H = I = 2880, interleaved SwiGLU with its alpha, beta and limit,
// biases, k = 4) in MXFP4 with 8 experts rather than 32 (the walks and tiles are the model's;
// the expert count only sizes the routing).
TEST_F(CudaFp4Decode, MoeLayerGptOssShapeMxfp4) {
  const std::unique_ptr<Fp4Experts> e =
      make_fp4_experts(QMOE_WEIGHT_FORMAT_MXFP4, 8, 2880, 2880, rng_);
  ASSERT_NE(e->set, nullptr);
  check_layer(ctx_, *e, 4, QMOE_DTYPE_BF16, rng_);
}

// A small NVFP4 layer (FC1's K = H = 80: a half-filled last chunk; global scales), FP16 and
// FP32 activations.
TEST_F(CudaFp4Decode, MoeLayerNvfp4) {
  const std::unique_ptr<Fp4Experts> e = make_fp4_experts(QMOE_WEIGHT_FORMAT_NVFP4, 6, 80, 64, rng_);
  ASSERT_NE(e->set, nullptr);
  check_layer(ctx_, *e, 3, QMOE_DTYPE_F16, rng_);
  if (HasFailure()) return;
  check_layer(ctx_, *e, 2, QMOE_DTYPE_F32, rng_);
}

// A GPU set's kernels are chosen for its one format: a residency update from a host set of
// another format is refused before anything is copied, and one of the same format goes through.
TEST_F(CudaFp4Decode, ResidencyUpdateKeepsTheSetsFormat) {
  const std::unique_ptr<Fp4Experts> mx =
      make_fp4_experts(QMOE_WEIGHT_FORMAT_MXFP4, 4, 64, 32, rng_);
  const std::unique_ptr<Fp4Experts> nv =
      make_fp4_experts(QMOE_WEIGHT_FORMAT_NVFP4, 4, 64, 32, rng_);
  ASSERT_NE(mx->set, nullptr);
  ASSERT_NE(nv->set, nullptr);
  const GpuSet set = make_gpu_set(mx->set.get());
  ASSERT_TRUE(set);
  const uint32_t resident[] = {3, 1};
  uint32_t copied = 0;
  EXPECT_EQ(qmoe_cuda_expert_set_update_residency(set.get(), nv->set.get(), resident, 2, nullptr,
                                                  &copied),
            QMOE_STATUS_UNSUPPORTED_FORMAT)
      << qmoe_last_error_message();
  EXPECT_EQ(qmoe_cuda_expert_set_update_residency(set.get(), mx->set.get(), resident, 2, nullptr,
                                                  &copied),
            QMOE_STATUS_OK)
      << qmoe_last_error_message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace qmoe::testing
