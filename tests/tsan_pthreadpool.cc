// ThreadSanitizer builds only (tests/CMakeLists.txt): the four pthreadpool functions libqmoe
// calls, defined in the test binary over TestPool (tests/test_pool.h). Debian's libpthreadpool
// is not instrumented, so TSan cannot see its workers' hand-offs and would report every task's
// output as a race with the caller's read; linked statically into qmoe_tests, these
// definitions take the place of the shared library's, and every context with a pool of its
// own (the library's path through pthreadpool_parallelize_1d included) runs on instrumented
// code in which tasks on different workers are concurrent: a task that shares another's
// scratch is reported however the two were scheduled.
#include <pthreadpool.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <thread>

#include "tests/test_pool.h"

struct pthreadpool {
  explicit pthreadpool(uint32_t threads) : pool(threads) {}
  qmoe::testing::TestPool pool;
};

extern "C" {

pthreadpool_t pthreadpool_create(size_t threads_count) {
  if (threads_count == 0) threads_count = std::thread::hardware_concurrency();
  if (threads_count == 0) threads_count = 1;
  return new (std::nothrow) pthreadpool(static_cast<uint32_t>(threads_count));
}

size_t pthreadpool_get_threads_count(pthreadpool_t threadpool) {
  return threadpool != nullptr ? threadpool->pool.workers() : 1;
}

void pthreadpool_parallelize_1d(pthreadpool_t threadpool, pthreadpool_task_1d_t function,
                                void* context, size_t range, uint32_t /*flags*/) {
  if (threadpool == nullptr) {
    for (size_t i = 0; i < range; ++i) function(context, i);
    return;
  }
  threadpool->pool.run(function, context, range);
}

void pthreadpool_destroy(pthreadpool_t threadpool) {
  delete threadpool;
}

}  // extern "C"
