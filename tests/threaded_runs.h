// The thread configurations a reference test runs each call on: the library's own pool with 1,
// 2 and 3 threads (3: an odd count, so splits do not divide evenly), and the caller's
// parallel-for (TestPool, 3 workers). Each must meet the reference, and since the docs promise
// the same bits for any thread count (docs/abi.md), all must equal the one-thread result bit
// for bit. On a 2-core host a race between tasks shows only sometimes in the numbers; the
// ThreadSanitizer suite (scripts/test.sh --tsan) runs the same tests and reports it every time.
#ifndef QMOE_TESTS_THREADED_RUNS_H_
#define QMOE_TESTS_THREADED_RUNS_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/cpu/isa_test_util.h"
#include "tests/test_pool.h"

namespace qmoe::testing {

/// A context on `pool` (the caller's parallel-for), capped at `isa`; checked as make_context's.
inline ContextPtr make_pool_context(Isa isa, TestPool& pool) {
  qmoe_context_options o;
  qmoe_context_options_init(&o);
  o.max_isa = static_cast<qmoe_isa>(isa);
  o.num_threads = pool.workers();
  o.parallel_for = &TestPool::parallel_for;
  o.parallel_for_state = &pool;
  qmoe_context* raw = nullptr;
  EXPECT_EQ(qmoe_context_create(&o, &raw), QMOE_STATUS_OK) << qmoe_last_error_message();
  if (raw != nullptr) check_context_kernels(raw, isa, "make_pool_context");
  return ContextPtr(raw);
}

struct ThreadedRun {
  std::string label;  // "1 thread", "2 threads", "3 threads", "caller pool (3)"
  qmoe_context* ctx;
};

/// The contexts of every configuration on one tier, made once; the first is the one-thread
/// context the others are compared with.
class ThreadedRuns {
 public:
  explicit ThreadedRuns(Isa isa) : pool_(3) {
    for (uint32_t threads : {1u, 2u, 3u}) {
      owned_.push_back(make_context(isa, threads));
      runs_.push_back(
          {std::to_string(threads) + (threads == 1 ? " thread" : " threads"), owned_.back().get()});
    }
    owned_.push_back(make_pool_context(isa, pool_));
    runs_.push_back({"caller pool (3)", owned_.back().get()});
  }
  const std::vector<ThreadedRun>& runs() const { return runs_; }
  TestPool& pool() { return pool_; }

 private:
  TestPool pool_;  // outlives the contexts on it (destroyed after owned_)
  std::vector<ContextPtr> owned_;
  std::vector<ThreadedRun> runs_;
};

/// The first index where two equally long float arrays differ bitwise, or -1.
inline long first_bit_difference(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t x, y;
    std::memcpy(&x, a + i, 4);
    std::memcpy(&y, b + i, 4);
    if (x != y) return static_cast<long>(i);
  }
  return -1;
}

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_THREADED_RUNS_H_
