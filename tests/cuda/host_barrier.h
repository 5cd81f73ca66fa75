// A reusable barrier for host threads that stand in for GPU threads, in the tensor-core GEMM's
// host emulation (int4_gemm_tc_emulation_test.cu; the decode kernels' emulation runs its
// threads as fibers, host_fibers.h, whose barrier has the same rules): it releases when every
// expected participant has arrived, and a participant that exits (leave) no longer counts, as
// __syncthreads and barrier.cluster count only threads that have not exited. A wait that never
// completes is a kernel bug: it aborts after 120 s instead of hanging the test run.
#ifndef QMOE_TESTS_CUDA_HOST_BARRIER_H_
#define QMOE_TESTS_CUDA_HOST_BARRIER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace qmoe::testing {

class HostBarrier {
 public:
  explicit HostBarrier(uint32_t count = 0) : expected_(count) {}
  void reset(uint32_t count) {
    std::lock_guard<std::mutex> lock(mutex_);
    expected_ = count;
    arrived_ = 0;
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++arrived_ >= expected_) {
      release();
      return;
    }
    if (!done_.wait_for(lock, std::chrono::seconds(120),
                        [&] { return generation_ != generation; })) {
      std::fprintf(stderr, "host barrier: waited 120 s (%u of %u arrived)\n", arrived_, expected_);
      std::abort();
    }
  }
  void leave() {
    std::lock_guard<std::mutex> lock(mutex_);
    --expected_;
    if (arrived_ > 0 && arrived_ >= expected_) release();
  }

 private:
  void release() {
    arrived_ = 0;
    ++generation_;
    done_.notify_all();
  }
  std::mutex mutex_;
  std::condition_variable done_;
  uint32_t expected_ = 0, arrived_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_CUDA_HOST_BARRIER_H_
