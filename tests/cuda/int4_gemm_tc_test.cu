// The tensor-core INT4 GEMM (lib/cuda/int4_gemm_tc.cuh) on the device: against an FP64
// reference computed from the X values the kernel multiplies, and against the CPU library's
// qmoe_gemm_typed on the same bytes, within the documented bounds. Every tile, block size, X and
// Y type, scale type and plane order, zero points and bias; row, column and K tails; column
// sub-ranges; the device row count inside a captured graph; bad arguments. Outputs are poisoned
// first and every element outside the written ones (and guard elements past the buffer) must
// keep its poison; every case runs twice and must give the same bits.
//
// Without a usable CUDA device every test that needs one skips and says why;
// QMOE_REQUIRE_CUDA=1 (on a GPU host) turns that into a failure.
#include <cuda_runtime_api.h>
#include <fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "lib/cuda/int4_gemm_tc.cuh"
#include "tests/activation_dtype_util.h"
#include "tests/cpu/isa_test_util.h"
#include "tests/cuda/int4_gemm_tc_test_util.h"
#include "tests/gemm/int4_reference.h"

namespace qmoe::testing {
namespace {

using cuda::DeviceQuantMatrix;
using cuda::Int4GemmTcTile;

#define QMOE_CUDA_ASSERT(expr)                                                                     \
  do {                                                                                             \
    const cudaError_t error_ = (expr);                                                             \
    ASSERT_EQ(error_, cudaSuccess)                                                                 \
        << #expr << ": " << cudaGetErrorName(error_) << " (" << cudaGetErrorString(error_) << ")"; \
  } while (0)

constexpr unsigned char kPoison = 0xFF;  // a NaN in FP32, FP16 and BF16 alike
constexpr size_t kGuardElements = 64;

const char* tile_name(int tile) {
  switch (tile) {
    case 0:
      return "128x128";
    case 1:
      return "64x128";
    case 2:
      return "64x96";
    case 3:
      return "64x64";
    case 4:
      return "wgmma 128x64";
    case 5:
      return "wgmma 128x128";
    case 6:
      return "wgmma 128x64 split K";
    case 7:
      return "wgmma 256x128";
  }
  return "auto";
}

// A device allocation owned by the test.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  cudaError_t allocate(size_t bytes) { return cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes); }
  cudaError_t upload(const void* src, size_t bytes) {
    const cudaError_t error = allocate(bytes);
    return error != cudaSuccess ? error : cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice);
  }
  template <class T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

// The matrix's buffers copied as they are, and the device view of them.
struct DeviceMatrix {
  DeviceBuffer codes, scales, zero_points, bias;
  DeviceQuantMatrix view{};
};

// scale_offset: the scale plane placed that many bytes into its allocation (which ends with the
// plane), so that a 16-bit plane can start at 2 mod 4.
cudaError_t upload_matrix(const Int4Matrix& w, DeviceMatrix* d, size_t scale_offset = 0) {
  cudaError_t e = d->codes.upload(w.codes.data(), w.codes.size());
  if (e == cudaSuccess) e = d->scales.allocate(scale_offset + w.scales.size());
  if (e == cudaSuccess) {
    e = cudaMemcpy(d->scales.get<uint8_t>() + scale_offset, w.scales.data(), w.scales.size(),
                   cudaMemcpyHostToDevice);
  }
  if (e == cudaSuccess && w.desc.zero_points != nullptr) {
    e = d->zero_points.upload(w.zero_points.data(), w.zero_points.size());
  }
  if (e == cudaSuccess && w.desc.bias != nullptr) e = d->bias.upload(w.bias.data(), w.bias.size());
  DeviceQuantMatrix& v = d->view;
  v.n = w.desc.n;
  v.k = w.desc.k;
  v.block_size = w.desc.block_size;
  v.chunks = (w.desc.k + 31) / 32;
  v.codes = d->codes.get<const uint8_t>();
  v.scale_dtype = w.desc.scale_dtype;
  v.scales = d->scales.get<uint8_t>() + scale_offset;
  v.scale_row_stride = w.desc.scale_row_stride;
  v.scale_block_stride = w.desc.scale_block_stride;
  v.scale_group_stride = w.desc.scale_group_stride;
  v.zero_points = w.desc.zero_points != nullptr ? d->zero_points.get<const uint8_t>() : nullptr;
  v.zero_point_row_stride = w.desc.zero_point_row_stride;
  v.zero_point_block_stride = w.desc.zero_point_block_stride;
  v.zero_point_group_stride = w.desc.zero_point_group_stride;
  v.bias_dtype = w.desc.bias_dtype;
  v.bias = w.desc.bias != nullptr ? d->bias.get() : nullptr;
  return e;
}

struct Case {
  Int4Options w;
  uint32_t m = 17;
  uint32_t n_begin = 0, n_end = 0;  // n_end 0: all columns
  qmoe_dtype xd = QMOE_DTYPE_BF16, yd = QMOE_DTYPE_F32;
  int tile = -1;              // -1: the launcher's choice
  bool even_ldy = true;       // an even ldy allows paired stores, an odd one forces single ones
  uint32_t scale_offset = 0;  // bytes into the scale plane's allocation (upload_matrix)
  qmoe_accuracy accuracy = QMOE_ACCURACY_EXACT;
  uint32_t k_splits = 0;  // a forced tile's split over K; 0: the launcher's choice
};

// Whether the case runs on scaled weights for certain (a forced tile; the launcher's choice may
// or may not): then the kernel's own rounding of every weight is checked too.
bool runs_scaled(const Case& c) {
  return c.tile >= 0 && cuda::int4_gemm_tc_scaled_weights(static_cast<Int4GemmTcTile>(c.tile),
                                                          c.accuracy, c.xd, c.w.scale_dtype);
}

std::string describe(const Case& c, uint64_t seed) {
  return c.w.describe() + " m=" + std::to_string(c.m) + " cols [" + std::to_string(c.n_begin) +
         "," + std::to_string(c.n_end) + ") x " + dtype_name(c.xd) + " y " + dtype_name(c.yd) +
         " tile " + tile_name(c.tile) + (c.even_ldy ? "" : " odd-ldy") + " scale offset " +
         std::to_string(c.scale_offset) + (c.accuracy == QMOE_ACCURACY_FAST ? " fast" : " exact") +
         " k splits " + std::to_string(c.k_splits) + " seed=" + std::to_string(seed);
}

class CudaInt4GemmTc : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t error = cudaGetDeviceCount(&count);
    std::string why;
    if (error != cudaSuccess) {
      cudaGetLastError();
      why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(error) + " (" +
            cudaGetErrorString(error) + ")";
    } else if (count == 0) {
      why = "cudaGetDeviceCount reports no device";
    } else {
      cudaDeviceProp prop;
      QMOE_CUDA_ASSERT(cudaGetDeviceProperties(&prop, 0));
      if (prop.major < 8)
        why = "device 0 is sm_" + std::to_string(prop.major * 10 + prop.minor) +
              ": the kernels need sm_80 or newer";
    }
    if (!why.empty()) {
      const char* require = std::getenv("QMOE_REQUIRE_CUDA");
      if (require != nullptr && std::string(require) == "1") {
        FAIL() << "QMOE_REQUIRE_CUDA=1 but no usable CUDA device: " << why;
      }
      GTEST_SKIP() << "no usable CUDA device: " << why;
    }
    QMOE_CUDA_ASSERT(cudaSetDevice(0));
    QMOE_CUDA_ASSERT(cudaStreamCreate(&stream_));
    ctx_ = default_context();
    ASSERT_NE(ctx_, nullptr);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Builds the case's matrix and activations, runs the kernel twice into poisoned outputs and
  // checks everything the file header promises.
  void run_case(const Case& c, uint64_t seed) {
    const std::string where = describe(c, seed);
    SCOPED_TRACE(where);
    std::mt19937_64 rng(seed);
    const Int4Matrix w = make_int4_matrix(c.w, rng);
    const uint32_t n = c.w.n, k = c.w.k, m = c.m;
    const uint32_t n_begin = c.n_begin, n_end = c.n_end == 0 ? n : c.n_end;
    // ldx: K plus 8 elements, so rows stay 16-byte aligned in every X type and the gap (random
    // values the kernel must not read) is there; ldy: odd or even on request.
    const size_t ldx = k + 8, ldy = n + (c.even_ldy ? 6 : 5);

    const std::vector<float> x_values = random_activations(m, static_cast<uint32_t>(ldx), rng);
    const std::vector<unsigned char> x = narrow(ctx_.get(), c.xd, x_values.data(), x_values.size());
    const std::vector<float> x_widened = widen(ctx_.get(), c.xd, x);
    const std::vector<float> x_true = dense_rows(x_widened, m, k, ldx);
    // The X the kernel multiplies: BF16 and FP16 as given, FP32 as hi + lo.
    const std::vector<float> x_used =
        c.xd == QMOE_DTYPE_F32 ? split_bf16_sum(ctx_.get(), x_true) : x_true;
    const Reference ref = reference_gemm(w, x_used, m);
    const Reference ref_true = c.xd == QMOE_DTYPE_F32 ? reference_gemm(w, x_true, m) : Reference{};

    // The CPU library on the same bytes (exact level, FP32 out).
    std::vector<float> y_cpu(size_t{m} * n, 0.0f);
    ASSERT_EQ(qmoe_gemm_typed(ctx_.get(), &w.desc, QMOE_ACCURACY_EXACT, m, c.xd, x.data(), ldx,
                              QMOE_DTYPE_F32, y_cpu.data(), n, 0, n),
              QMOE_STATUS_OK)
        << qmoe_last_error_message();

    DeviceMatrix dw;
    QMOE_CUDA_ASSERT(upload_matrix(w, &dw, c.scale_offset));
    DeviceBuffer dx;
    QMOE_CUDA_ASSERT(dx.upload(x.data(), x.size()));
    const size_t es = element_size(c.yd);
    const size_t y_bytes = (size_t{m} * ldy + kGuardElements) * es;
    DeviceBuffer dy;
    QMOE_CUDA_ASSERT(dy.allocate(y_bytes));

    std::vector<unsigned char> first;
    for (int run = 0; run < 2; ++run) {
      QMOE_CUDA_ASSERT(cudaMemset(dy.get(), kPoison, y_bytes));
      const cudaError_t launched =
          c.tile < 0
              ? cuda::launch_int4_gemm_tc(dw.view, m, c.xd, dx.get(), ldx, c.yd, dy.get(), ldy,
                                          n_begin, n_end, stream_, c.accuracy)
              : cuda::launch_int4_gemm_tc_tile(static_cast<Int4GemmTcTile>(c.tile), dw.view, m,
                                               nullptr, c.xd, dx.get(), ldx, c.yd, dy.get(), ldy,
                                               n_begin, n_end, stream_, c.accuracy, c.k_splits);
      QMOE_CUDA_ASSERT(launched);
      QMOE_CUDA_ASSERT(cudaStreamSynchronize(stream_));
      std::vector<unsigned char> y(y_bytes);
      QMOE_CUDA_ASSERT(cudaMemcpy(y.data(), dy.get(), y_bytes, cudaMemcpyDeviceToHost));
      if (run == 1) {
        EXPECT_EQ(std::memcmp(first.data(), y.data(), y_bytes), 0) << "a rerun changed bits";
        break;
      }
      first = std::move(y);
    }
    const Reference ref_scaled =
        runs_scaled(c) ? scaled_weight_reference(w, x_used, m) : Reference{};
    check_outputs(c, w, first, m, n_begin, n_end, ldy, ref, ref_true, ref_scaled, y_cpu);
  }

  void check_outputs(const Case& c, const Int4Matrix& w, const std::vector<unsigned char>& y,
                     uint32_t m, uint32_t n_begin, uint32_t n_end, size_t ldy, const Reference& ref,
                     const Reference& ref_true, const Reference& ref_scaled,
                     const std::vector<float>& y_cpu) {
    const uint32_t n = c.w.n;
    const size_t es = element_size(c.yd);
    // The fast level's bound covers either kind of weights (the exact one is below it).
    const bool fast = c.accuracy == QMOE_ACCURACY_FAST;
    const double acc_bound =
        fast ? cuda::int4_gemm_tc_fast_bound(c.w.k)
             : cuda::int4_gemm_tc_accumulation_bound(c.w.k, c.w.block_size, c.xd);
    const double scaled_bound = cuda::int4_gemm_tc_scaled_accumulation_bound(c.w.k);
    const double split_bound = cuda::int4_gemm_tc_x_split_bound(c.xd);
    int reported = 0;
    auto report = [&](const std::string& what) {
      if (reported++ < 5) ADD_FAILURE() << what;
    };
    for (size_t e = 0; e < y.size() / es; ++e) {
      const unsigned char* p = y.data() + e * es;
      const size_t i = e / ldy, col = e % ldy;
      const bool written = i < m && col >= n_begin && col < n_end;
      if (!written) {
        for (size_t b = 0; b < es; ++b) {
          if (p[b] != kPoison) {
            report("element " + std::to_string(e) + " (row " + std::to_string(i) + ", col " +
                   std::to_string(col) + ") outside the output changed");
            break;
          }
        }
        continue;
      }
      const size_t o = i * n + col;
      const double got = element_value(c.yd, p);
      const double scale = ref.abs_sum[o] + std::fabs(w.bias_values[col]);
      const double tol = output_tolerance(c.yd, ref.y[o], acc_bound * scale);
      const double tol_cpu = output_tolerance(
          c.yd, ref.y[o], acc_bound * scale + 1e-5 * scale + split_bound * ref.abs_sum[o]);
      std::string at =
          "y[" + std::to_string(i) + "][" + std::to_string(col) + "] = " + std::to_string(got);
      if (!std::isfinite(got) || std::fabs(got - ref.y[o]) > tol) {
        report(at + ", FP64 reference " + std::to_string(ref.y[o]) + ", bound " +
               std::to_string(tol));
      }
      if (std::fabs(got - y_cpu[o]) > tol_cpu) {
        report(at + ", CPU qmoe_gemm_typed " + std::to_string(y_cpu[o]) + ", bound " +
               std::to_string(tol_cpu));
      }
      if (runs_scaled(c)) {
        const double tol_scaled = output_tolerance(
            c.yd, ref_scaled.y[o],
            scaled_bound * (ref_scaled.abs_sum[o] + std::fabs(w.bias_values[col])));
        if (!std::isfinite(got) || std::fabs(got - ref_scaled.y[o]) > tol_scaled) {
          report(at + ", FP64 reference on the BF16-rounded weights " +
                 std::to_string(ref_scaled.y[o]) + ", bound " + std::to_string(tol_scaled));
        }
      }
      if (c.xd == QMOE_DTYPE_F32) {
        const double tol_true = output_tolerance(
            c.yd, ref_true.y[o], acc_bound * scale + split_bound * ref_true.abs_sum[o]);
        if (std::fabs(got - ref_true.y[o]) > tol_true) {
          report(at + ", FP64 reference on the unsplit X " + std::to_string(ref_true.y[o]) +
                 ", bound " + std::to_string(tol_true));
        }
      }
    }
  }

  cudaStream_t stream_ = nullptr;
  ContextPtr ctx_;
};

const qmoe_dtype kTypes[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
const ScaleOrder kOrders[] = {ScaleOrder::kGrouped, ScaleOrder::kBlockMajor, ScaleOrder::kRowMajor,
                              ScaleOrder::kPaddedRowMajor};

// Every tile (forced) x block size x X type, with N and K tails: N = 70 (a 6-row last group),
// K with a partial last k-tile of 64 (and, for block 16, a half-filled last 32-code chunk).
TEST_F(CudaInt4GemmTc, EveryTileBlockSizeAndXType) {
  const uint32_t blocks[] = {16, 32, 64, 128};
  const uint32_t ks[] = {208, 224, 320, 384};
  int index = 0;
  for (int tile = 0; tile < cuda::kInt4GemmTcTileCount; ++tile) {
    for (int b = 0; b < 4; ++b) {
      for (qmoe_dtype xd : {QMOE_DTYPE_BF16, QMOE_DTYPE_F16, QMOE_DTYPE_F32}) {
        const auto t = static_cast<Int4GemmTcTile>(tile);
        if (!cuda::int4_gemm_tc_tile_available(t, xd)) continue;
        Case c;
        c.w.n = 70;
        c.w.k = ks[b];
        c.w.block_size = blocks[b];
        // A tile that runs scaled weights only: FP16 scales at the fast level.
        c.w.scale_dtype =
            cuda::int4_gemm_tc_tile_scaled_only(t) ? QMOE_DTYPE_F16 : kTypes[index % 3];
        c.accuracy =
            cuda::int4_gemm_tc_tile_scaled_only(t) ? QMOE_ACCURACY_FAST : QMOE_ACCURACY_EXACT;
        c.w.scale_order = kOrders[index % 4];
        c.w.zero_points = index % 2 == 0;
        c.w.zero_point_order = kOrders[(index + 1) % 4];
        c.w.bias = index % 3 != 0;
        c.w.bias_dtype = kTypes[(index + 1) % 3];
        c.m = 17;
        c.xd = xd;
        c.yd = kTypes[(index / 3) % 3];
        c.tile = tile;
        c.even_ldy = index % 2 == 0;
        ++index;
        ASSERT_NO_FATAL_FAILURE(run_case(c, fresh_seed()));
      }
    }
  }
}

// M = 16, 17, 64 and 512 with the launcher's own tile, on a column range that starts and ends
// inside an 8-row group.
TEST_F(CudaInt4GemmTc, RowTails) {
  for (uint32_t m : {16u, 17u, 64u, 512u}) {
    for (qmoe_dtype xd : {QMOE_DTYPE_BF16, QMOE_DTYPE_F32}) {
      Case c;
      c.w.n = 136;
      c.w.k = 256;
      c.w.block_size = 32;
      c.w.scale_dtype = QMOE_DTYPE_F16;
      c.w.scale_order = ScaleOrder::kGrouped;
      c.w.zero_points = true;
      c.w.zero_point_order = ScaleOrder::kGrouped;
      c.w.bias = true;
      c.m = m;
      c.n_begin = 5;
      c.n_end = 131;
      c.xd = xd;
      c.yd = QMOE_DTYPE_F32;
      ASSERT_NO_FATAL_FAILURE(run_case(c, fresh_seed()));
      c.accuracy = QMOE_ACCURACY_FAST;  // scaled weights where the launcher picks a wgmma tile
      ASSERT_NO_FATAL_FAILURE(run_case(c, fresh_seed()));
    }
  }
}

// The warpgroup-MMA tile where it runs (compute capability 9.0): several CTAs each way, a K
// of 24 k-tiles (the stages wrap), every block size, against the FP64 reference and the CPU
// library like every case; FP32 X is refused with cudaErrorInvalidValue.
TEST_F(CudaInt4GemmTc, WgmmaTiles) {
  if (!cuda::int4_gemm_tc_tile_available(Int4GemmTcTile::kWgmma128x64, QMOE_DTYPE_BF16)) {
    GTEST_SKIP() << "the wgmma tiles need a compute capability 9.0 device and an sm_90 build";
  }
  const uint32_t blocks[] = {16, 32, 64, 128};
  int index = 0;
  for (const auto tile : {Int4GemmTcTile::kWgmma128x64, Int4GemmTcTile::kWgmma128x128,
                          Int4GemmTcTile::kWgmma128x64SplitK}) {
    EXPECT_TRUE(cuda::int4_gemm_tc_tile_available(tile, QMOE_DTYPE_F16));
    EXPECT_FALSE(cuda::int4_gemm_tc_tile_available(tile, QMOE_DTYPE_F32));
    for (uint32_t block : blocks) {
      for (qmoe_dtype xd : {QMOE_DTYPE_BF16, QMOE_DTYPE_F16}) {
        Case c;
        c.w.n = 200;
        c.w.k = 1536;
        c.w.block_size = block;
        c.w.scale_dtype = kTypes[index % 3];
        c.w.scale_order = kOrders[index % 4];
        c.w.zero_points = index % 2 == 1;
        c.w.zero_point_order = kOrders[(index + 2) % 4];
        c.w.bias = index % 3 != 2;
        c.w.bias_dtype = kTypes[(index + 2) % 3];
        c.m = index % 2 == 0 ? 300 : 129;
        c.n_begin = index % 4 == 3 ? 9 : 0;
        c.xd = xd;
        c.yd = kTypes[index % 3];
        c.tile = static_cast<int>(tile);
        c.even_ldy = index % 2 == 0;
        ++index;
        ASSERT_NO_FATAL_FAILURE(run_case(c, fresh_seed()));
      }
    }
  }
  const auto tile = Int4GemmTcTile::kWgmma128x128;
  Case c;
  c.w.n = 64;
  c.w.k = 64;
  c.xd = QMOE_DTYPE_F32;
  std::mt19937_64 rng(fresh_seed());
  const Int4Matrix w = make_int4_matrix(c.w, rng);
  DeviceMatrix dw;
  QMOE_CUDA_ASSERT(upload_matrix(w, &dw, 0));
  DeviceBuffer dx, dy;
  QMOE_CUDA_ASSERT(dx.allocate(64 * 64 * 4));
  QMOE_CUDA_ASSERT(dy.allocate(64 * 64 * 4));
  EXPECT_EQ(cuda::launch_int4_gemm_tc_tile(tile, dw.view, 64, nullptr, QMOE_DTYPE_F32, dx.get(), 64,
                                           QMOE_DTYPE_F32, dy.get(), 64, 0, 64, stream_),
            cudaErrorInvalidValue);
}

// The split over K across a cluster of 2 to 8 CTAs on every wgmma tile: unequal K slices (24
// k-tiles over 5), row and column tails, a column range, both X types and levels, every scale
// type; run twice for the same bits (run_case). A split the tile cannot take is refused.
TEST_F(CudaInt4GemmTc, SplitOverKAcrossACluster) {
  if (!cuda::int4_gemm_tc_tile_available(Int4GemmTcTile::kWgmma128x64, QMOE_DTYPE_BF16)) {
    GTEST_SKIP() << "the wgmma tiles need a compute capability 9.0 device and an sm_90 build";
  }
  int index = 0;
  for (const auto tile : {Int4GemmTcTile::kWgmma128x64, Int4GemmTcTile::kWgmma128x128,
                          Int4GemmTcTile::kWgmma128x64SplitK, Int4GemmTcTile::kWgmma256x128}) {
    const bool scaled_only = cuda::int4_gemm_tc_tile_scaled_only(tile);
    for (uint32_t splits : {2u, 3u, 5u, 8u}) {
      Case c;
      c.w.n = 200;
      c.w.k = 1536;
      c.w.block_size = index % 2 == 0 ? 32 : 16;
      c.w.scale_dtype = index % 4 < 2 || scaled_only ? QMOE_DTYPE_F16 : kTypes[index % 3];
      c.w.scale_order = kOrders[index % 4];
      c.w.zero_points = index % 2 == 1;
      c.w.zero_point_order = kOrders[(index + 2) % 4];
      c.w.bias = index % 3 != 2;
      c.w.bias_dtype = kTypes[(index + 2) % 3];
      c.m = index % 2 == 0 ? 300 : 17;
      c.n_begin = index % 4 == 3 ? 9 : 0;
      c.xd = index % 3 == 2 && !scaled_only ? QMOE_DTYPE_F16 : QMOE_DTYPE_BF16;
      c.yd = kTypes[index % 3];
      c.tile = static_cast<int>(tile);
      c.accuracy = index % 2 == 0 || scaled_only ? QMOE_ACCURACY_FAST : QMOE_ACCURACY_EXACT;
      c.k_splits = splits;
      ++index;
      ASSERT_NO_FATAL_FAILURE(run_case(c, fresh_seed()));
    }
  }
  Case c;
  c.w.n = 64;
  c.w.k = 128;  // two k-tiles
  std::mt19937_64 rng(fresh_seed());
  const Int4Matrix w = make_int4_matrix(c.w, rng);
  DeviceMatrix dw;
  QMOE_CUDA_ASSERT(upload_matrix(w, &dw, 0));
  DeviceBuffer dx, dy;
  QMOE_CUDA_ASSERT(dx.allocate(64 * 128 * 2));
  QMOE_CUDA_ASSERT(dy.allocate(64 * 64 * 4));
  const struct {
    Int4GemmTcTile tile;
    uint32_t splits;
    const char* what;
  } refused[] = {{Int4GemmTcTile::kWgmma128x64, 3, "more splits than k-tiles"},
                 {Int4GemmTcTile::kWgmma128x64, 9, "more than 8 splits"},
                 {Int4GemmTcTile::kWgmma256x128, 3, "more splits than k-tiles"},
                 {Int4GemmTcTile::k64x64, 2, "a split on an mma.sync tile"}};
  for (const auto& r : refused) {
    EXPECT_EQ(cuda::launch_int4_gemm_tc_tile(r.tile, dw.view, 64, nullptr, QMOE_DTYPE_BF16,
                                             dx.get(), 128, QMOE_DTYPE_F32, dy.get(), 64, 0, 64,
                                             stream_, QMOE_ACCURACY_EXACT, r.splits),
              cudaErrorInvalidValue)
        << r.what;
  }
}

// The fast level's scaled weights on every wgmma tile (BF16 X, FP16 scales): every block size,
// with and without zero points, every plane order, K up to 4096, against the FP64 reference on
// the weights as the kernel rounds them (the accumulation bound alone) and against the exact
// weights' reference (int4_gemm_tc_fast_bound).
TEST_F(CudaInt4GemmTc, WgmmaScaledWeights) {
  if (!cuda::int4_gemm_tc_tile_available(Int4GemmTcTile::kWgmma128x64, QMOE_DTYPE_BF16)) {
    GTEST_SKIP() << "the wgmma tiles need a compute capability 9.0 device and an sm_90 build";
  }
  int index = 0;
  for (const auto tile : {Int4GemmTcTile::kWgmma128x64, Int4GemmTcTile::kWgmma128x128,
                          Int4GemmTcTile::kWgmma128x64SplitK, Int4GemmTcTile::kWgmma256x128}) {
    for (uint32_t block : {16u, 32u, 64u, 128u}) {
      Case c;
      c.w.n = 200;
      c.w.k = block == 64 ? 4096 : 1536;
      c.w.block_size = block;
      c.w.scale_dtype = QMOE_DTYPE_F16;
      c.w.scale_order = kOrders[index % 4];
      c.w.zero_points = index % 2 == 0;
      c.w.zero_point_order = kOrders[(index + 1) % 4];
      c.w.bias = index % 3 != 2;
      c.w.bias_dtype = kTypes[index % 3];
      c.m = index % 2 == 0 ? 300 : 129;
      if (cuda::int4_gemm_tc_tile_scaled_only(tile) && block == 128) c.m = 600;  // 3 row tiles
      c.n_begin = index % 4 == 3 ? 9 : 0;
      c.xd = QMOE_DTYPE_BF16;
      c.yd = kTypes[index % 3];
      c.tile = static_cast<int>(tile);
      c.accuracy = QMOE_ACCURACY_FAST;
      ++index;
      ASSERT_TRUE(runs_scaled(c));
      ASSERT_NO_FATAL_FAILURE(run_case(c, fresh_seed()));
    }
  }
}

// Where the weights are not scaled (FP16 X; BF16 or FP32 scales) the fast level runs the exact
// weights: the same bits as the exact level.
TEST_F(CudaInt4GemmTc, FastLevelKeepsExactWeightsElsewhere) {
  if (!cuda::int4_gemm_tc_tile_available(Int4GemmTcTile::kWgmma128x64, QMOE_DTYPE_BF16)) {
    GTEST_SKIP() << "the wgmma tiles need a compute capability 9.0 device and an sm_90 build";
  }
  const std::pair<qmoe_dtype, qmoe_dtype> cases[] = {{QMOE_DTYPE_F16, QMOE_DTYPE_F16},
                                                     {QMOE_DTYPE_BF16, QMOE_DTYPE_BF16},
                                                     {QMOE_DTYPE_BF16, QMOE_DTYPE_F32}};
  for (const auto& [xd, scale_dtype] : cases) {
    SCOPED_TRACE(std::string("x ") + dtype_name(xd) + " scales " + dtype_name(scale_dtype));
    const auto tile = Int4GemmTcTile::kWgmma128x64;
    ASSERT_FALSE(cuda::int4_gemm_tc_scaled_weights(tile, QMOE_ACCURACY_FAST, xd, scale_dtype));
    Int4Options o;
    o.n = 128;
    o.k = 512;
    o.scale_dtype = scale_dtype;
    o.zero_points = true;
    std::mt19937_64 rng(fresh_seed());
    const Int4Matrix w = make_int4_matrix(o, rng);
    const uint32_t m = 130;
    const std::vector<float> x_values = random_activations(m, o.k, rng);
    const std::vector<unsigned char> x = narrow(ctx_.get(), xd, x_values.data(), x_values.size());
    DeviceMatrix dw;
    QMOE_CUDA_ASSERT(upload_matrix(w, &dw));
    DeviceBuffer dx, dy;
    QMOE_CUDA_ASSERT(dx.upload(x.data(), x.size()));
    const size_t y_bytes = size_t{m} * o.n * 4;
    QMOE_CUDA_ASSERT(dy.allocate(y_bytes));
    std::vector<unsigned char> y[2];
    for (int level = 0; level < 2; ++level) {
      QMOE_CUDA_ASSERT(cudaMemset(dy.get(), kPoison, y_bytes));
      QMOE_CUDA_ASSERT(cuda::launch_int4_gemm_tc_tile(
          tile, dw.view, m, nullptr, xd, dx.get(), o.k, QMOE_DTYPE_F32, dy.get(), o.n, 0, o.n,
          stream_, level == 0 ? QMOE_ACCURACY_EXACT : QMOE_ACCURACY_FAST));
      QMOE_CUDA_ASSERT(cudaStreamSynchronize(stream_));
      y[level].resize(y_bytes);
      QMOE_CUDA_ASSERT(cudaMemcpy(y[level].data(), dy.get(), y_bytes, cudaMemcpyDeviceToHost));
    }
    EXPECT_EQ(std::memcmp(y[0].data(), y[1].data(), y_bytes), 0);
  }
}

// 256 x 128 runs scaled weights only: BF16 X (it is not available for FP16 or FP32 X), the fast
// level and FP16 scales; a launch that would not run them is refused and writes nothing. Through
// the launcher's choice at the fast level, a shape that fills the device with 256-row tiles.
TEST_F(CudaInt4GemmTc, WideTileRunsScaledWeightsOnly) {
  const auto tile = Int4GemmTcTile::kWgmma256x128;
  if (!cuda::int4_gemm_tc_tile_available(tile, QMOE_DTYPE_BF16)) {
    GTEST_SKIP() << "the wgmma tiles need a compute capability 9.0 device and an sm_90 build";
  }
  EXPECT_FALSE(cuda::int4_gemm_tc_tile_available(tile, QMOE_DTYPE_F16));
  EXPECT_FALSE(cuda::int4_gemm_tc_tile_available(tile, QMOE_DTYPE_F32));
  const struct {
    qmoe_dtype xd, scale_dtype;
    qmoe_accuracy accuracy;
    const char* what;
  } refused[] = {{QMOE_DTYPE_BF16, QMOE_DTYPE_F16, QMOE_ACCURACY_EXACT, "the exact level"},
                 {QMOE_DTYPE_F16, QMOE_DTYPE_F16, QMOE_ACCURACY_FAST, "FP16 X"},
                 {QMOE_DTYPE_BF16, QMOE_DTYPE_BF16, QMOE_ACCURACY_FAST, "BF16 scales"},
                 {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_ACCURACY_FAST, "FP32 X"}};
  for (const auto& r : refused) {
    Int4Options o;
    o.n = 128;
    o.k = 256;
    o.scale_dtype = r.scale_dtype;
    std::mt19937_64 rng(fresh_seed());
    const Int4Matrix w = make_int4_matrix(o, rng);
    DeviceMatrix dw;
    QMOE_CUDA_ASSERT(upload_matrix(w, &dw));
    DeviceBuffer dx, dy;
    QMOE_CUDA_ASSERT(dx.allocate(size_t{256} * o.k * 4));
    QMOE_CUDA_ASSERT(dy.allocate(size_t{256} * o.n * 4));
    QMOE_CUDA_ASSERT(cudaMemset(dy.get(), kPoison, size_t{256} * o.n * 4));
    EXPECT_EQ(
        cuda::launch_int4_gemm_tc_tile(tile, dw.view, 256, nullptr, r.xd, dx.get(), o.k,
                                       QMOE_DTYPE_F32, dy.get(), o.n, 0, o.n, stream_, r.accuracy),
        cudaErrorInvalidValue)
        << r.what;
    QMOE_CUDA_ASSERT(cudaStreamSynchronize(stream_));
    std::vector<unsigned char> y(size_t{256} * o.n * 4);
    QMOE_CUDA_ASSERT(cudaMemcpy(y.data(), dy.get(), y.size(), cudaMemcpyDeviceToHost));
    EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](unsigned char b) { return b == kPoison; }))
        << r.what << ": the output was written";
  }
  Case c;
  c.w.n = 1536;
  c.w.k = 1024;
  c.w.block_size = 32;
  c.w.scale_dtype = QMOE_DTYPE_F16;
  c.w.zero_points = true;
  c.m = 2000;
  c.xd = QMOE_DTYPE_BF16;
  c.yd = QMOE_DTYPE_BF16;
  c.accuracy = QMOE_ACCURACY_FAST;
  ASSERT_NO_FATAL_FAILURE(run_case(c, fresh_seed()));
}

// Column sub-ranges on every tile: only [n_begin, n_end) of each row is written.
TEST_F(CudaInt4GemmTc, ColumnSubRanges) {
  const std::pair<uint32_t, uint32_t> ranges[] = {{0, 70},  {3, 61},  {8, 16}, {13, 14},
                                                  {69, 70}, {64, 70}, {0, 1}};
  for (int tile = 0; tile < cuda::kInt4GemmTcTileCount; ++tile) {
    if (!cuda::int4_gemm_tc_tile_available(static_cast<Int4GemmTcTile>(tile), QMOE_DTYPE_F16)) {
      continue;
    }
    for (const auto& range : ranges) {
      Case c;
      c.w.n = 70;
      c.w.k = 128;
      c.w.block_size = 32;
      c.w.scale_dtype = QMOE_DTYPE_BF16;
      c.w.scale_order = ScaleOrder::kBlockMajor;
      c.w.bias = true;
      c.w.bias_dtype = QMOE_DTYPE_F16;
      c.m = 33;
      c.n_begin = range.first;
      c.n_end = range.second;
      c.xd = QMOE_DTYPE_F16;
      c.yd = QMOE_DTYPE_BF16;
      c.tile = tile;
      c.even_ldy = range.first % 2 == 0;
      ASSERT_NO_FATAL_FAILURE(run_case(c, fresh_seed()));
    }
  }
}

// Every scale type and order, zero points absent or in every order, every bias type; 16-bit
// scale planes also at 2 mod 4 (their first element's word starts before the plane) and every
// plane ending exactly at its allocation's end (each element is staged by a 4-byte cp.async of
// the word that holds it, which must not read past the element).
TEST_F(CudaInt4GemmTc, ScaleAndZeroPointPlanes) {
  int index = 0;
  for (qmoe_dtype sd : kTypes) {
    for (ScaleOrder so : kOrders) {
      for (int zo = -1; zo < 4; ++zo) {
        Case c;
        c.w.n = 41;
        c.w.k = 192;
        c.w.block_size = index % 2 == 0 ? 64 : 16;
        c.w.scale_dtype = sd;
        c.w.scale_order = so;
        c.w.zero_points = zo >= 0;
        c.w.zero_point_order = kOrders[zo < 0 ? 0 : zo];
        c.w.bias = index % 4 != 3;
        c.w.bias_dtype = kTypes[index % 3];
        c.m = 19;
        c.xd = kTypes[(index / 2) % 3];
        c.yd = kTypes[(index / 5) % 3];
        c.scale_offset = sd == QMOE_DTYPE_F32 ? 4 * (index % 2) : 2 * (index % 4);
        ++index;
        ASSERT_NO_FATAL_FAILURE(run_case(c, fresh_seed()));
      }
    }
  }
}

// K from one block up, with every remainder of K modulo 64 and a half-filled last chunk.
TEST_F(CudaInt4GemmTc, KTails) {
  const std::pair<uint32_t, uint32_t> shapes[] = {
      {16, 16}, {16, 48}, {16, 80}, {16, 112}, {32, 32}, {32, 96}, {64, 64}, {64, 192}, {128, 128}};
  for (const auto& shape : shapes) {
    Case c;
    c.w.n = 9;
    c.w.block_size = shape.first;
    c.w.k = shape.second;
    c.w.scale_dtype = QMOE_DTYPE_F32;
    c.w.scale_order = ScaleOrder::kRowMajor;
    c.w.zero_points = true;
    c.m = 17;
    c.xd = QMOE_DTYPE_BF16;
    ASSERT_NO_FATAL_FAILURE(run_case(c, fresh_seed()));
  }
}

// A long K (the Qwen3 FC1 depth) at M = 512, and M = 2048 once.
TEST_F(CudaInt4GemmTc, LargeShapes) {
  Case c;
  c.w.n = 200;
  c.w.k = 2048;
  c.w.block_size = 32;
  c.w.scale_dtype = QMOE_DTYPE_F16;
  c.w.scale_order = ScaleOrder::kGrouped;
  c.m = 512;
  c.xd = QMOE_DTYPE_BF16;
  c.yd = QMOE_DTYPE_BF16;
  ASSERT_NO_FATAL_FAILURE(run_case(c, fresh_seed()));
  c.w.n = 72;
  c.w.k = 256;
  c.m = 2048;
  c.yd = QMOE_DTYPE_F32;
  ASSERT_NO_FATAL_FAILURE(run_case(c, fresh_seed()));
}

// A graph captured once for 96 rows and replayed with the row count changed in device memory
// between replays: rows below min(count, 96) are written, the others keep their poison.
TEST_F(CudaInt4GemmTc, DeviceRowCountInCapturedGraph) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Int4Options o;
  o.n = 40;
  o.k = 128;
  o.block_size = 32;
  o.zero_points = true;
  o.bias = true;
  const Int4Matrix w = make_int4_matrix(o, rng);
  constexpr uint32_t kCapacity = 96;
  const size_t ldx = o.k, ldy = o.n;
  const std::vector<float> x_values = random_activations(kCapacity, o.k, rng);
  const std::vector<unsigned char> x =
      narrow(ctx_.get(), QMOE_DTYPE_BF16, x_values.data(), x_values.size());
  const Reference ref = reference_gemm(w, widen(ctx_.get(), QMOE_DTYPE_BF16, x), kCapacity);

  DeviceMatrix dw;
  QMOE_CUDA_ASSERT(upload_matrix(w, &dw));
  DeviceBuffer dx, dy, dm;
  QMOE_CUDA_ASSERT(dx.upload(x.data(), x.size()));
  const size_t y_bytes = size_t{kCapacity} * ldy * sizeof(float);
  QMOE_CUDA_ASSERT(dy.allocate(y_bytes));
  QMOE_CUDA_ASSERT(dm.allocate(sizeof(uint32_t)));

  QMOE_CUDA_ASSERT(cuda::prepare_int4_gemm_tc());
  cudaGraph_t graph = nullptr;
  QMOE_CUDA_ASSERT(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
  const cudaError_t launched = cuda::launch_int4_gemm_tc_device_m(
      dw.view, kCapacity, dm.get<const uint32_t>(), QMOE_DTYPE_BF16, dx.get(), ldx, QMOE_DTYPE_F32,
      dy.get(), ldy, 0, o.n, stream_);
  const cudaError_t captured = cudaStreamEndCapture(stream_, &graph);
  QMOE_CUDA_ASSERT(launched);
  QMOE_CUDA_ASSERT(captured);
  cudaGraphExec_t exec = nullptr;
  QMOE_CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));

  const double acc_bound =
      cuda::int4_gemm_tc_accumulation_bound(o.k, o.block_size, QMOE_DTYPE_BF16);
  for (uint32_t rows : {17u, 96u, 0u, 64u, 200u}) {
    SCOPED_TRACE("device row count " + std::to_string(rows));
    QMOE_CUDA_ASSERT(cudaMemsetAsync(dy.get(), kPoison, y_bytes, stream_));
    QMOE_CUDA_ASSERT(
        cudaMemcpyAsync(dm.get(), &rows, sizeof(rows), cudaMemcpyHostToDevice, stream_));
    QMOE_CUDA_ASSERT(cudaGraphLaunch(exec, stream_));
    QMOE_CUDA_ASSERT(cudaStreamSynchronize(stream_));
    std::vector<float> y(size_t{kCapacity} * ldy);
    QMOE_CUDA_ASSERT(cudaMemcpy(y.data(), dy.get(), y_bytes, cudaMemcpyDeviceToHost));
    const uint32_t expected_rows = std::min(rows, kCapacity);
    int reported = 0;
    for (uint32_t i = 0; i < kCapacity; ++i) {
      for (uint32_t col = 0; col < o.n; ++col) {
        const float got = y[size_t{i} * ldy + col];
        uint32_t bits;
        std::memcpy(&bits, &got, 4);
        const size_t e = size_t{i} * o.n + col;
        const bool ok = i < expected_rows
                            ? std::fabs(got - ref.y[e]) <=
                                  acc_bound * (ref.abs_sum[e] + std::fabs(w.bias_values[col]))
                            : bits == 0xFFFFFFFFu;
        if (!ok && reported++ < 5) {
          ADD_FAILURE() << "y[" << i << "][" << col << "] = " << got << " reference "
                        << (i < expected_rows ? ref.y[e] : NAN);
        }
      }
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// Bad arguments are refused before anything runs: cudaErrorInvalidValue, the output untouched
// and no error left behind for the next CUDA call. m = 0 and an empty column range succeed and
// write nothing.
TEST_F(CudaInt4GemmTc, RejectsBadArgumentsWithoutLaunching) {
  std::mt19937_64 rng(fresh_seed());
  Int4Options o;
  o.n = 24;
  o.k = 64;
  const Int4Matrix w = make_int4_matrix(o, rng);
  DeviceMatrix dw;
  QMOE_CUDA_ASSERT(upload_matrix(w, &dw));
  const uint32_t m = 16;
  DeviceBuffer dx, dy;
  QMOE_CUDA_ASSERT(dx.allocate(size_t{m} * 80 * 2 + 64));
  QMOE_CUDA_ASSERT(cudaMemset(dx.get(), 0, size_t{m} * 80 * 2 + 64));
  const size_t y_bytes = size_t{m} * o.n * 4;
  QMOE_CUDA_ASSERT(dy.allocate(y_bytes));
  QMOE_CUDA_ASSERT(cudaMemset(dy.get(), kPoison, y_bytes));
  const auto* x = dx.get<const unsigned char>();

  struct Bad {
    const char* what;
    DeviceQuantMatrix w;
    const void* x;
    size_t ldx;
    qmoe_dtype xd;
    uint32_t n_begin, n_end;
  };
  DeviceQuantMatrix odd_block = dw.view, short_chunks = dw.view, no_scales = dw.view,
                    odd_codes = dw.view, bad_scale_type = dw.view, odd_scales = dw.view;
  odd_block.block_size = 8;
  short_chunks.chunks = 1;
  no_scales.scales = nullptr;
  odd_codes.codes = dw.view.codes + 8;
  bad_scale_type.scale_dtype = static_cast<qmoe_dtype>(7);
  odd_scales.scales = static_cast<const uint8_t*>(dw.view.scales) + 1;  // FP16 at an odd address
  const Bad cases[] = {
      {"x not 16-byte aligned", dw.view, x + 2, 64, QMOE_DTYPE_BF16, 0, o.n},
      {"X rows not 16-byte aligned", dw.view, x, 68, QMOE_DTYPE_BF16, 0, o.n},
      {"ldx < K", dw.view, x, 56, QMOE_DTYPE_BF16, 0, o.n},
      {"n_end > N", dw.view, x, 64, QMOE_DTYPE_BF16, 0, o.n + 1},
      {"n_begin > n_end", dw.view, x, 64, QMOE_DTYPE_BF16, 9, 8},
      {"unknown X type", dw.view, x, 64, static_cast<qmoe_dtype>(9), 0, o.n},
      {"block size 8", odd_block, x, 64, QMOE_DTYPE_BF16, 0, o.n},
      {"chunks != ceil(K / 32)", short_chunks, x, 64, QMOE_DTYPE_BF16, 0, o.n},
      {"no scales", no_scales, x, 64, QMOE_DTYPE_BF16, 0, o.n},
      {"codes not 16-byte aligned", odd_codes, x, 64, QMOE_DTYPE_BF16, 0, o.n},
      {"unknown scale type", bad_scale_type, x, 64, QMOE_DTYPE_BF16, 0, o.n},
      {"scales not aligned to their element", odd_scales, x, 64, QMOE_DTYPE_BF16, 0, o.n},
  };
  for (const Bad& b : cases) {
    EXPECT_EQ(cuda::launch_int4_gemm_tc(b.w, m, b.xd, b.x, b.ldx, QMOE_DTYPE_F32, dy.get(), o.n,
                                        b.n_begin, b.n_end, stream_),
              cudaErrorInvalidValue)
        << b.what;
  }
  EXPECT_EQ(cuda::launch_int4_gemm_tc(dw.view, m, QMOE_DTYPE_BF16, x, 64, QMOE_DTYPE_F32, dy.get(),
                                      o.n - 1, 0, o.n, stream_),
            cudaErrorInvalidValue)
      << "ldy < n_end";
  EXPECT_EQ(cuda::launch_int4_gemm_tc(dw.view, m, QMOE_DTYPE_BF16, x, 64, QMOE_DTYPE_F32, dy.get(),
                                      o.n, 0, o.n, stream_, static_cast<qmoe_accuracy>(5)),
            cudaErrorInvalidValue)
      << "unknown accuracy level";
  EXPECT_EQ(cuda::launch_int4_gemm_tc_device_m(dw.view, m, nullptr, QMOE_DTYPE_BF16, x, 64,
                                               QMOE_DTYPE_F32, dy.get(), o.n, 0, o.n, stream_),
            cudaErrorInvalidValue)
      << "no device row count";
  EXPECT_EQ(cuda::launch_int4_gemm_tc(dw.view, 0, QMOE_DTYPE_BF16, x, 64, QMOE_DTYPE_F32, dy.get(),
                                      o.n, 0, o.n, stream_),
            cudaSuccess)
      << "m = 0";
  EXPECT_EQ(cuda::launch_int4_gemm_tc(dw.view, m, QMOE_DTYPE_BF16, x, 64, QMOE_DTYPE_F32, dy.get(),
                                      o.n, 5, 5, stream_),
            cudaSuccess)
      << "empty column range";
  QMOE_CUDA_ASSERT(cudaStreamSynchronize(stream_));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<unsigned char> y(y_bytes);
  QMOE_CUDA_ASSERT(cudaMemcpy(y.data(), dy.get(), y_bytes, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < y_bytes; ++i) {
    ASSERT_EQ(y[i], kPoison) << "byte " << i << " written";
  }
}

// The wgmma tiles and splits by grid size (132 multiprocessors, Hopper's shared memory; the
// model of int4_gemm_tc.cu, fitted to the H200): 128 x 64 by default, split across a cluster
// where its grid leaves most multiprocessors idle and the split grid is one wave, the in-CTA
// split tile where the grid fits one CTA a multiprocessor and a split does not pay, never
// 128 x 128; an
// mma.sync tile for FP32 X, where the device has no wgmma, or where 128 x 64's stages do not fit.
TEST(CudaInt4GemmTcTiles, WgmmaTilesByGridSize) {
  struct Row {
    uint32_t m, n, k;
    Int4GemmTcTile want;
    uint32_t splits;
  };
  using T = Int4GemmTcTile;
  const Row rows[] = {{2048, 1536, 2048, T::kWgmma128x64, 1},       // 384 tiles of 128 x 64
                      {1024, 1536, 2048, T::kWgmma128x64, 1},       // 192
                      {256, 5760, 2880, T::kWgmma128x64, 1},        // 180
                      {2048, 2048, 768, T::kWgmma128x64, 1},        // 512
                      {2048, 5760, 2880, T::kWgmma128x64, 1},       // 1440
                      {512, 5760, 2880, T::kWgmma128x64, 1},        // 360
                      {512, 1536, 2048, T::kWgmma128x64SplitK, 1},  // 96
                      {128, 5760, 2880, T::kWgmma128x64SplitK, 1},  // 90
                      {512, 2048, 768, T::kWgmma128x64SplitK, 1},   // 128
                      {512, 2112, 768, T::kWgmma128x64SplitK, 1},   // 132
                      {512, 2120, 768, T::kWgmma128x64, 1},         // 136
                      {512, 3072, 768, T::kWgmma128x64, 1},         // 192
                      {128, 1536, 2048, T::kWgmma128x64, 4},        // 24
                      {16, 2048, 768, T::kWgmma128x64, 4},          // 32
                      {16, 64, 2048, T::kWgmma128x64, 8},           // 1
                      {16, 64, 64, T::kWgmma128x64SplitK, 1}};      // 1, one k-tile
  for (const Row& r : rows) {
    for (qmoe_dtype xd : {QMOE_DTYPE_BF16, QMOE_DTYPE_F16}) {
      Int4GemmTcTile tile;
      uint32_t splits = 0;
      ASSERT_TRUE(cuda::choose_int4_gemm_tc_tile(r.m, 0, r.n, r.k, 132, 232448, xd, 32, &tile, true,
                                                 &splits));
      EXPECT_EQ(tile, r.want) << "m=" << r.m << " n=" << r.n << " k=" << r.k;
      EXPECT_EQ(splits, r.splits) << "m=" << r.m << " n=" << r.n << " k=" << r.k;
      if (tile == T::kWgmma128x64) {
        EXPECT_EQ(cuda::choose_int4_gemm_tc_k_splits(tile, r.m, 0, r.n, r.k, 132), r.splits);
      }
      ASSERT_TRUE(cuda::choose_int4_gemm_tc_tile(r.m, 0, r.n, r.k, 132, 232448, xd, 32, &tile,
                                                 false, &splits));
      EXPECT_FALSE(cuda::int4_gemm_tc_tile_is_wgmma(tile));
      EXPECT_EQ(splits, 1u);
    }
    Int4GemmTcTile tile;
    ASSERT_TRUE(cuda::choose_int4_gemm_tc_tile(r.m, 0, r.n, r.k, 132, 232448, QMOE_DTYPE_F32, 32,
                                               &tile, true));
    EXPECT_FALSE(cuda::int4_gemm_tc_tile_is_wgmma(tile));
  }
  // At the fast level's scaled weights (BF16 X), 256 x 128 where its grid fills the device, never
  // split; with FP16 X (no scaled weights) or where its shared memory does not fit, never.
  const Row wide_rows[] = {{2048, 1536, 2048, T::kWgmma256x128, 1},      // 96 tiles of 256 x 128
                           {512, 5760, 2880, T::kWgmma256x128, 1},       // 90
                           {1024, 5760, 2880, T::kWgmma256x128, 1},      // 180
                           {2048, 2048, 768, T::kWgmma256x128, 1},       // 128
                           {256, 5760, 2880, T::kWgmma128x64, 1},        // 45: 180 of 128 x 64
                           {1024, 1536, 2048, T::kWgmma128x64, 1},       // 48: 192 of 128 x 64
                           {512, 1536, 2048, T::kWgmma128x64SplitK, 1},  // 24: 96 of 128 x 64
                           {512, 2048, 768, T::kWgmma128x64SplitK, 1}};
  for (const Row& r : wide_rows) {
    Int4GemmTcTile tile;
    uint32_t splits = 0;
    ASSERT_TRUE(cuda::choose_int4_gemm_tc_tile(r.m, 0, r.n, r.k, 132, 232448, QMOE_DTYPE_BF16, 32,
                                               &tile, true, &splits, true));
    EXPECT_EQ(tile, r.want) << "scaled weights, m=" << r.m << " n=" << r.n << " k=" << r.k;
    EXPECT_EQ(splits, r.splits) << "scaled weights, m=" << r.m << " n=" << r.n << " k=" << r.k;
    ASSERT_TRUE(cuda::choose_int4_gemm_tc_tile(r.m, 0, r.n, r.k, 132, 232448, QMOE_DTYPE_F16, 32,
                                               &tile, true, &splits, true));
    EXPECT_NE(tile, T::kWgmma256x128) << "FP16 X";
    const size_t below_wide =
        cuda::int4_gemm_tc_shared_bytes(T::kWgmma256x128, QMOE_DTYPE_BF16, 32) - 1;
    ASSERT_TRUE(cuda::choose_int4_gemm_tc_tile(r.m, 0, r.n, r.k, 132, below_wide, QMOE_DTYPE_BF16,
                                               32, &tile, true, &splits, true));
    EXPECT_NE(tile, T::kWgmma256x128) << "its shared memory does not fit";
    EXPECT_EQ(cuda::choose_int4_gemm_tc_k_splits(T::kWgmma256x128, r.m, 0, r.n, r.k, 132), 1u);
  }
  Int4GemmTcTile tile;
  const size_t below_128x64 =
      cuda::int4_gemm_tc_shared_bytes(Int4GemmTcTile::kWgmma128x64, QMOE_DTYPE_BF16, 32) - 1;
  ASSERT_TRUE(cuda::choose_int4_gemm_tc_tile(2048, 0, 1536, 2048, 132, below_128x64,
                                             QMOE_DTYPE_BF16, 32, &tile, true));
  EXPECT_FALSE(cuda::int4_gemm_tc_tile_is_wgmma(tile)) << "128 x 64 does not fit";
}

// The split over K for a forced tile (132 multiprocessors): 128 x 64 splits 2, 4 or 8 ways
// where its grid leaves most multiprocessors idle and keeps at least 2 k-tiles a CTA, not where
// the grid fills the device; the other tiles never split.
TEST(CudaInt4GemmTcTiles, SplitOverKByGridSize) {
  using T = Int4GemmTcTile;
  const auto splits = [](T tile, uint32_t m, uint32_t n, uint32_t k) {
    return cuda::choose_int4_gemm_tc_k_splits(tile, m, 0, n, k, 132);
  };
  EXPECT_EQ(splits(T::kWgmma128x64, 128, 1536, 2048), 4u) << "24 CTAs";
  EXPECT_EQ(splits(T::kWgmma128x64, 16, 64, 256), 2u) << "1 CTA, 4 k-tiles";
  EXPECT_EQ(splits(T::kWgmma128x64, 2048, 2048, 768), 1u) << "512 CTAs";
  EXPECT_EQ(splits(T::kWgmma128x64, 1024, 1536, 2048), 1u) << "192 CTAs: a split is two waves";
  EXPECT_EQ(splits(T::kWgmma128x64, 16, 64, 64), 1u) << "one k-tile";
  EXPECT_EQ(splits(T::kWgmma128x64SplitK, 128, 1536, 2048), 1u) << "in-CTA split tile";
  EXPECT_EQ(splits(T::kWgmma128x128, 128, 1536, 2048), 1u);
  EXPECT_EQ(splits(T::k64x64, 16, 1536, 2048), 1u) << "mma.sync";
  for (uint32_t m : {1u, 16u, 128u, 512u, 2048u}) {
    for (uint32_t n : {64u, 1536u, 2880u}) {
      for (uint32_t k : {64u, 128u, 256u, 512u, 2048u, 2880u, 16384u}) {
        const uint32_t s = splits(T::kWgmma128x64, m, n, k);
        EXPECT_TRUE(s == 1 || s == 2 || s == 4 || s == 8);
        EXPECT_TRUE(s == 1 || (k + 63) / 64 / s >= 2) << "m=" << m << " n=" << n << " k=" << k;
        const uint64_t tiles = (m + 127) / 128 * ((n + 63) / 64);
        EXPECT_TRUE(s == 1 || tiles * s <= 264) << "m=" << m << " n=" << n << " k=" << k;
      }
    }
  }
}

// The tile choice is host logic and runs without a device: tiles that do not fit the shared
// memory are never picked, and with none fitting the choice fails.
TEST(CudaInt4GemmTcTiles, ChoiceRespectsSharedMemory) {
  Int4GemmTcTile tile;
  for (qmoe_dtype xd : kTypes) {
    for (uint32_t block : {16u, 32u}) {
      for (uint32_t m : {16u, 128u, 512u, 2048u}) {
        for (bool wgmma : {false, true}) {
          // The wgmma tile is a candidate only where it runs, and for 16-bit X.
          const bool wgmma_candidate = wgmma && xd != QMOE_DTYPE_F32;
          size_t smallest = SIZE_MAX;
          for (int t = 0; t < cuda::kInt4GemmTcTileCount; ++t) {
            const auto candidate = static_cast<Int4GemmTcTile>(t);
            if (cuda::int4_gemm_tc_tile_is_wgmma(candidate) && !wgmma_candidate) continue;
            smallest = std::min(smallest, cuda::int4_gemm_tc_shared_bytes(candidate, xd, block));
          }
          for (size_t limit : {smallest - 1, smallest, size_t{232448}}) {
            const bool found = cuda::choose_int4_gemm_tc_tile(m, 0, 1536, 2048, 132, limit, xd,
                                                              block, &tile, wgmma);
            EXPECT_EQ(found, limit >= smallest) << dtype_name(xd) << " m=" << m;
            if (found) {
              EXPECT_LE(cuda::int4_gemm_tc_shared_bytes(tile, xd, block), limit);
              EXPECT_TRUE(wgmma_candidate || !cuda::int4_gemm_tc_tile_is_wgmma(tile));
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(
      cuda::int4_gemm_tc_shared_bytes(Int4GemmTcTile::k128x128, static_cast<qmoe_dtype>(9), 32),
      0u);
}

}  // namespace
}  // namespace qmoe::testing
