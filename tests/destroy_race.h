// Two threads destroying one live handle at the same moment, many times over: a helper for the
// context and expert-set tests. Each round the main thread creates a handle, publishes it and
// destroys it while a second thread, released by the same store, destroys it too; both spin
// (briefly, then yield) rather than sleep, so that the two calls overlap. A destroy that is
// not a single live -> dead step lets both calls through (both OK, and a double free that
// ASan reports); done right, every round has exactly one OK and one rejection.
#ifndef QMOE_TESTS_DESTROY_RACE_H_
#define QMOE_TESTS_DESTROY_RACE_H_

#include <atomic>
#include <thread>

#include "qmoe/qmoe.h"

namespace qmoe_test {

struct DestroyRaceCounts {
  int ok = 0;        // destroys that returned OK
  int rejected = 0;  // destroys that returned the "destroyed handle" status
  int other = 0;     // anything else, including a failed create
};

// Spin on `ready` a while before yielding: a racer that yields at once is usually too late.
template <typename Ready>
void wait_for(Ready ready) {
  for (int spins = 0; !ready(); ++spins) {
    if (spins > 4096) std::this_thread::yield();
  }
}

// create() returns a live handle or nullptr; destroy(handle) returns its status.
template <typename Handle, typename Create, typename Destroy>
DestroyRaceCounts race_destroys(int rounds, Create create, Destroy destroy,
                                qmoe_status rejected_status) {
  std::atomic<Handle*> handle{nullptr};
  std::atomic<int> released{0}, finished{0};
  std::atomic<int> ok{0}, rejected{0}, other{0};
  auto count = [&](qmoe_status s) {
    (s == QMOE_STATUS_OK ? ok : s == rejected_status ? rejected : other)++;
  };
  std::thread second([&] {
    for (int r = 1; r <= rounds; ++r) {
      wait_for([&] { return released.load(std::memory_order_acquire) >= r; });
      if (Handle* h = handle.load(std::memory_order_acquire)) count(destroy(h));
      finished.store(r, std::memory_order_release);
    }
  });
  for (int r = 1; r <= rounds; ++r) {
    Handle* h = create();
    if (h == nullptr) ++other;
    handle.store(h, std::memory_order_release);
    released.store(r, std::memory_order_release);
    if (h != nullptr) count(destroy(h));
    wait_for([&] { return finished.load(std::memory_order_acquire) >= r; });
  }
  second.join();
  return {ok.load(), rejected.load(), other.load()};
}

}  // namespace qmoe_test

#endif  // QMOE_TESTS_DESTROY_RACE_H_
