// The CUDA entry points: a CUDA build reports the devices the runtime sees (or says why it
// cannot), a build without CUDA says so; bad pointers get a status either way. On a GPU host,
// QMOE_REQUIRE_CUDA=1 turns "no usable device" into a failure instead of a skip.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "qmoe/qmoe_cuda.h"

namespace {

TEST(CudaDevice, CountOrAClearReason) {
  int count = -1;
  const qmoe_status status = qmoe_cuda_get_device_count(&count);
#if defined(QMOE_HAVE_CUDA)
  const char* require = std::getenv("QMOE_REQUIRE_CUDA");
  if (status != QMOE_STATUS_OK && !(require != nullptr && std::string(require) == "1")) {
    EXPECT_TRUE(status == QMOE_STATUS_CUDA_UNAVAILABLE || status == QMOE_STATUS_CUDA_ERROR)
        << qmoe_status_string(status);
    EXPECT_NE(std::string(qmoe_last_error_message()).find("cudaGetDeviceCount"), std::string::npos);
    EXPECT_EQ(count, -1);  // nothing written on failure
    GTEST_SKIP() << "no usable CUDA device here: " << qmoe_last_error_message();
  }
  ASSERT_EQ(status, QMOE_STATUS_OK) << qmoe_last_error_message();
  EXPECT_GE(count, 1);
#else
  EXPECT_EQ(status, QMOE_STATUS_CUDA_UNAVAILABLE);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("without CUDA"), std::string::npos);
  EXPECT_EQ(count, -1);
#endif
}

// Run by ctest's cuda.stub_driver_is_unavailable (tests/CMakeLists.txt) with LD_LIBRARY_PATH
// at the toolkit's stub libcuda.so: a stub driver is "no usable driver", CUDA_UNAVAILABLE as
// docs/abi.md says (it used to map to CUDA_ERROR). Elsewhere it skips and says why.
TEST(CudaDevice, StubDriverIsUnavailable) {
  if (std::getenv("QMOE_EXPECT_CUDA_STUB") == nullptr) {
    GTEST_SKIP() << "runs under ctest's cuda.stub_driver_is_unavailable, with the stub driver";
  }
#if defined(QMOE_HAVE_CUDA)
  int count = -1;
  EXPECT_EQ(qmoe_cuda_get_device_count(&count), QMOE_STATUS_CUDA_UNAVAILABLE)
      << qmoe_last_error_message();
  EXPECT_EQ(count, -1);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// Host-side arguments are checked first, in every build (docs/abi.md): a build without CUDA
// answers a NULL output with INVALID_ARGUMENT too, as tests/c_abi_test.c expects.
TEST(CudaDevice, NullOutputIsRejected) {
  EXPECT_EQ(qmoe_cuda_get_device_count(nullptr), QMOE_STATUS_INVALID_ARGUMENT);
}

}  // namespace
