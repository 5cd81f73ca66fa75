// Helpers of the CUDA kernel tests: the skip when no device is usable, the device tests'
// fixture, device buffers, the upload of a test-side matrix (tests/gemm/int4_reference.h,
// fp4_reference.h) as a DeviceQuantMatrix or as the qmoe_quant_matrix the C ABI takes, and the
// integer-exact GEMV problems of the INT4 and INT3 tests.
#ifndef QMOE_TESTS_CUDA_CUDA_TEST_UTIL_H_
#define QMOE_TESTS_CUDA_CUDA_TEST_UTIL_H_

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lib/cuda/device_quant_matrix.cuh"
#include "qmoe/qmoe.h"
#include "tests/cuda/output_rounding.h"
#include "tests/gemm/fp4_reference.h"
#include "tests/gemm/int4_reference.h"

namespace qmoe::testing {

/// Empty when a CUDA device is usable, otherwise why not (the runtime's error, or no device).
/// Clears the runtime's last error.
std::string cuda_unavailable_reason();

/// Skips the current test, naming the reason, when no device is usable.
#define QMOE_SKIP_WITHOUT_CUDA()                                                \
  do {                                                                          \
    const std::string qmoe_reason = ::qmoe::testing::cuda_unavailable_reason(); \
    if (!qmoe_reason.empty()) GTEST_SKIP() << qmoe_reason;                      \
  } while (0)

#define QMOE_CUDA_OK(expr)                                                                 \
  do {                                                                                     \
    const cudaError_t qmoe_e = (expr);                                                     \
    ASSERT_EQ(qmoe_e, cudaSuccess)                                                         \
        << #expr << ": " << cudaGetErrorName(qmoe_e) << " " << cudaGetErrorString(qmoe_e); \
  } while (0)

/// A device allocation (cudaMalloc, 256-byte aligned), freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_) {
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  /// Host -> device (bytes from the start); false on a CUDA error (the test should assert).
  bool upload(const void* src, size_t bytes, size_t offset = 0);
  bool download(void* dst, size_t bytes, size_t offset = 0) const;
  bool fill(int byte);

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

/// A device copy of `v` (a failure if the copy fails).
template <typename V>
DeviceBuffer to_device(const std::vector<V>& v) {
  DeviceBuffer b(v.size() * sizeof(V));
  EXPECT_TRUE(b.upload(v.data(), v.size() * sizeof(V)))
      << "cudaMemcpy of " << b.bytes() << " bytes";
  return b;
}

/// A matrix's planes copied to the device with plain cudaMemcpy, and its device description.
struct DeviceInt4Matrix {
  DeviceBuffer codes, scales, zero_points, bias;
  cuda::DeviceQuantMatrix desc{};
};

/// Uploads `w` (codes, scale plane, zero points, bias) as they are: no repack.
std::unique_ptr<DeviceInt4Matrix> upload_matrix(const Int4Matrix& w);

/// A matrix's planes on the device and its qmoe_quant_matrix there (the host's strides): what
/// qmoe_cuda_gemm takes.
struct DeviceAbiMatrix {
  DeviceBuffer codes, scales, zero_points, bias;
  qmoe_quant_matrix desc{};
};

/// Uploads an INT4 or INT3 matrix (zero points and bias where it has them), or an E2M1 one.
std::unique_ptr<DeviceAbiMatrix> upload_abi_matrix(const Int4Matrix& w);
std::unique_ptr<DeviceAbiMatrix> upload_abi_matrix(const Fp4Matrix& w);

/// The fixture of the device tests through the C ABI: skips, naming the reason, without a
/// usable device; a fresh seed for rng_ (printed after a failure) and a CPU context ctx_ for the
/// comparisons with the CPU library.
class CudaAbiTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  qmoe_context* ctx_ = nullptr;
};

/// Layout variant v of the tails tests (INT4 and INT3): N x K in blocks of `block_size`, scales
/// of dtype v % 3 (FP32, FP16, BF16) in order v % 4 (row-major, block-major, padded row-major,
/// grouped), zero points on odd v in the next order, a bias (of dtype (v + 2) % 3) where asked.
Int4Options tail_variant_options(uint32_t n, uint32_t k, uint32_t block_size, int v, bool bias);

// Integer-exact GEMV problems (INT4 and INT3): with every scale 0.5, 1 or 2 (with a sign) and
// half-integer activations whose 32-k chunks each hold a +-127, the fast level's activation
// scale is 1 and q = round-half-even(x) (ties 2.5 -> 2, 3.5 -> 4 included), so both levels'
// results are exact in FP32 and must equal integer_parts_output bit for bit.

/// The matrix of variant v (0..5) at a block size, made by `make_matrix`: N = 11 + v, K a
/// multiple of the block (K % 32 == 16 at block 16), FP32, FP16 or BF16 scales in the row-major,
/// block-major or grouped order by v, zero points on even v; then set_power_of_two_scales.
Int4Matrix integer_part_matrix(uint32_t block_size, int v, Int4MatrixMaker make_matrix,
                               std::mt19937_64& rng);

/// Rewrites every scale of `w` to 0.5, 1 or 2 with a random sign (values and plane, written
/// through the plane's own strides).
void set_power_of_two_scales(Int4Matrix* w, std::mt19937_64& rng);

/// Activations [m][k]: halves in [-126.5, 126.5], one element of each 32-k chunk of each row
/// +-127 (exact in FP32, FP16 and BF16).
std::vector<float> integer_part_activations(uint32_t m, uint32_t k, std::mt19937_64& rng);

/// Output n of the row `x` ([k]): bias + sum_k q w(n, k), q = x at the exact level and
/// round-half-even(x) at the fast level, in FP64 (exact for such problems).
double integer_parts_output(const Int4Matrix& w, const float* x, uint32_t n, qmoe_accuracy level);

/// Element size of an activation dtype.
inline size_t dtype_size(qmoe_dtype d) {
  return d == QMOE_DTYPE_F32 ? 4 : 2;
}

/// FP32 -> dtype bits (round to nearest even, via fp16.h for FP16 and the BF16 identity), and
/// back (exact).
std::vector<unsigned char> to_dtype(qmoe_dtype d, const std::vector<float>& v);
std::vector<float> from_dtype(qmoe_dtype d, const std::vector<unsigned char>& bytes);

const char* dtype_label(qmoe_dtype d);

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_CUDA_CUDA_TEST_UTIL_H_
