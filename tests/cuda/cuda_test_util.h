// Helpers of the CUDA kernel tests: the skip when no device is usable, device buffers, and the
// upload of a test-side INT4 matrix (tests/int4_reference.h) as a DeviceQuantMatrix.
#ifndef QMOE_TESTS_CUDA_CUDA_TEST_UTIL_H_
#define QMOE_TESTS_CUDA_CUDA_TEST_UTIL_H_

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lib/cuda/device_quant_matrix.cuh"
#include "tests/cuda/output_rounding.h"
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

/// A matrix's planes copied to the device with plain cudaMemcpy, and its device description.
struct DeviceInt4Matrix {
  DeviceBuffer codes, scales, zero_points, bias;
  cuda::DeviceQuantMatrix desc{};
};

/// Uploads `w` (codes, scale plane, zero points, bias) as they are: no repack.
std::unique_ptr<DeviceInt4Matrix> upload_matrix(const Int4Matrix& w);

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
