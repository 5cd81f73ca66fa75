// A parallel-for of the tests' own, for contexts on a caller's parallel_for, and the set of
// thread configurations the reference tests run every call on.
//
// TestPool: persistent workers; the calling thread is worker 0. A call hands worker w the
// indices i with i % workers == w (descending on odd workers, so no order is assumed), after a
// start barrier that every worker passes before any task runs; between tasks no lock or atomic
// is shared. So two tasks on different workers are concurrent as far as ThreadSanitizer can
// tell (a task that shares another's scratch is a race it reports however the OS schedules
// them), every task happens before the call returns (a library that returned before its tasks
// ended would show it), and the instrumented code is the test's, not Debian's uninstrumented
// pthreadpool (which TSan cannot see synchronise: tests/tsan_pthreadpool.cc).
#ifndef QMOE_TESTS_TEST_POOL_H_
#define QMOE_TESTS_TEST_POOL_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "qmoe/qmoe.h"

namespace qmoe::testing {

class TestPool {
 public:
  /// `workers` >= 1 threads of work, the caller's included.
  explicit TestPool(uint32_t workers) : workers_(workers < 1 ? 1 : workers) {
    for (uint32_t w = 1; w < workers_; ++w) threads_.emplace_back([this, w] { worker(w); });
  }
  ~TestPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  TestPool(const TestPool&) = delete;
  TestPool& operator=(const TestPool&) = delete;

  uint32_t workers() const { return workers_; }
  /// Calls whose range had more than one task (a test that means to run the parallel path
  /// checks that it did).
  size_t split_calls() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return split_calls_;
  }

  /// A qmoe_parallel_for_fn; `pool` is a TestPool*. One call at a time per pool (a second
  /// concurrent or nested call runs its tasks inline on its own thread, as a runtime's pool
  /// may).
  static void parallel_for(void* pool, qmoe_parallel_task_fn task, void* task_state, size_t range) {
    static_cast<TestPool*>(pool)->run(task, task_state, range);
  }

  void run(qmoe_parallel_task_fn task, void* task_state, size_t range) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (busy_ || workers_ == 1) {
      if (range > 1) ++split_calls_;
      lock.unlock();
      for (size_t i = range; i-- > 0;) task(task_state, i);
      return;
    }
    busy_ = true;
    if (range > 1) ++split_calls_;
    task_ = task;
    task_state_ = task_state;
    range_ = range;
    arrived_ = 0;
    remaining_ = workers_;
    ++generation_;
    lock.unlock();
    start_.notify_all();
    share(0);
    lock.lock();
    done_.wait(lock, [this] { return remaining_ == 0; });
    busy_ = false;
  }

 private:
  void worker(uint32_t w) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      lock.unlock();
      share(w);
      lock.lock();
    }
  }

  // Worker w's share of the current call: the barrier, its tasks, then the count down.
  void share(uint32_t w) {
    qmoe_parallel_task_fn task;
    void* state;
    size_t range;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      task = task_;
      state = task_state_;
      range = range_;
      if (++arrived_ == workers_) {
        barrier_.notify_all();
      } else {
        const uint64_t generation = generation_;
        barrier_.wait(lock, [&] { return arrived_ == workers_ || generation_ != generation; });
      }
    }
    if (w % 2 == 0) {
      for (size_t i = w; i < range; i += workers_) task(state, i);
    } else if (w < range) {
      const size_t last = w + (range - 1 - w) / workers_ * workers_;
      for (size_t i = last + workers_; i > w;) {
        i -= workers_;
        task(state, i);
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (--remaining_ == 0) done_.notify_one();
  }

  const uint32_t workers_;
  std::vector<std::thread> threads_;
  mutable std::mutex mutex_;
  std::condition_variable start_, barrier_, done_;
  bool stop_ = false, busy_ = false;
  uint64_t generation_ = 0;
  uint32_t arrived_ = 0, remaining_ = 0;
  qmoe_parallel_task_fn task_ = nullptr;
  void* task_state_ = nullptr;
  size_t range_ = 0;
  size_t split_calls_ = 0;
};

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_TEST_POOL_H_
