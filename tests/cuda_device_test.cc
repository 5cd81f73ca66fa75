// The CUDA entry points: a CUDA build reports the devices the runtime sees (or says why it
// cannot), a build without CUDA says so; bad pointers get a status either way. On a GPU host,
// QMOE_REQUIRE_CUDA=1 turns "no usable device" into a failure instead of a skip.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "qmoe/qmoe.h"

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

TEST(CudaDevice, NullOutputIsRejected) {
  const qmoe_status status = qmoe_cuda_get_device_count(nullptr);
#if defined(QMOE_HAVE_CUDA)
  EXPECT_EQ(status, QMOE_STATUS_INVALID_ARGUMENT);
#else
  EXPECT_EQ(status, QMOE_STATUS_CUDA_UNAVAILABLE);
#endif
}

}  // namespace
