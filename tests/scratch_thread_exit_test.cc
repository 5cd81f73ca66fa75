// A libqmoe call from a caller's thread_local destructor, on a context whose scratch another
// call holds (docs/abi.md: such a call uses scratch private to its thread).
//
// Why: the thread-private scratch is itself a thread_local, destroyed at thread exit in reverse
// order of construction. A caller's thread_local object built before the thread's first
// contended call is destroyed after it, and a call from its destructor used the freed buffer
// (a review crashed it in a release build; ASan reports a heap-use-after-free). Such calls now
// get a buffer of their own. Here a holder thread keeps the context's scratch inside a caller
// parallel-for that waits, while worker threads each make one contended call and another from
// a thread_local destructor; every result must equal the uncontended one.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "qmoe/qmoe.h"
#include "tests/gemm/int4_reference.h"

namespace qmoe::testing {
namespace {

// The shared state of one run (a destructor has no arguments).
struct ContendedRun {
  qmoe_context* context = nullptr;
  const Int4Matrix* w = nullptr;
  const std::vector<float>* x = nullptr;
  // Uncontended results for 1 and for 8 rows (a row's bits may depend on M: docs/abi.md).
  const std::vector<float>* expected_one = nullptr;
  const std::vector<float>* expected_eight = nullptr;
  std::atomic<std::thread::id> holder{};
  std::atomic<bool> holding{false}, release{false};
  std::atomic<int> mismatches{0}, calls_from_destructors{0};
};
ContendedRun* g_run = nullptr;

// Y for the first 1 or 8 rows of x, compared with the uncontended call of the same M. Eight
// rows need more scratch than one: a call from a destructor asks for more than the thread's
// earlier call grew its buffer to, so a destroyed buffer would be freed a second time (glibc
// aborts) rather than reused quietly.
bool gemm_matches(const ContendedRun& r, uint32_t rows) {
  const uint32_t n = r.w->options.n, k = r.w->options.k;
  std::vector<float> y(size_t{rows} * n, -1.0f);
  if (qmoe_gemm(r.context, &r.w->desc, QMOE_ACCURACY_FAST, rows, r.x->data(), k, y.data(), n, 0,
                n) != QMOE_STATUS_OK) {
    return false;
  }
  const std::vector<float>& expected = rows == 1 ? *r.expected_one : *r.expected_eight;
  return std::memcmp(y.data(), expected.data(), y.size() * sizeof(float)) == 0;
}

// The caller's parallel-for: tasks inline; on the holder thread it first signals that the
// context's scratch is held and waits to be released.
void holding_parallel_for(void* /*state*/, qmoe_parallel_task_fn task, void* task_state,
                          size_t range) {
  if (g_run != nullptr && std::this_thread::get_id() == g_run->holder.load()) {
    g_run->holding.store(true);
    while (!g_run->release.load()) std::this_thread::yield();
  }
  for (size_t i = 0; i < range; ++i) task(task_state, i);
}

struct FlushAtThreadExit {
  bool armed = false;
  ~FlushAtThreadExit() {
    if (!armed) return;
    g_run->calls_from_destructors.fetch_add(1);
    if (!gemm_matches(*g_run, 8)) g_run->mismatches.fetch_add(1);
  }
};
thread_local FlushAtThreadExit t_flush;

TEST(ScratchAtThreadExit, CallsFromThreadLocalDestructorsGetScratchOfTheirOwn) {
  std::mt19937_64 rng(20261130);
  const Int4Matrix w =
      make_int4_matrix(Int4Options{256, 512, 32, QMOE_DTYPE_F16, ScaleOrder::kGrouped, false}, rng);
  // Eight copies of one activation row (the M = 8 call reads them all).
  const std::vector<float> row = random_activations(1, 512, rng);
  std::vector<float> x;
  for (int i = 0; i < 8; ++i) x.insert(x.end(), row.begin(), row.end());

  qmoe_context_options o;
  qmoe_context_options_init(&o);
  o.num_threads = 4;
  o.parallel_for = &holding_parallel_for;
  qmoe_context* ctx = nullptr;
  ASSERT_EQ(qmoe_context_create(&o, &ctx), QMOE_STATUS_OK) << qmoe_last_error_message();
  std::vector<float> expected_one(w.options.n, -2.0f), expected_eight(8 * w.options.n, -2.0f);
  ASSERT_EQ(qmoe_gemm(ctx, &w.desc, QMOE_ACCURACY_FAST, 1, x.data(), 512, expected_one.data(),
                      w.options.n, 0, w.options.n),
            QMOE_STATUS_OK);
  ASSERT_EQ(qmoe_gemm(ctx, &w.desc, QMOE_ACCURACY_FAST, 8, x.data(), 512, expected_eight.data(),
                      w.options.n, 0, w.options.n),
            QMOE_STATUS_OK);

  ContendedRun run;
  run.context = ctx;
  run.w = &w;
  run.x = &x;
  run.expected_one = &expected_one;
  run.expected_eight = &expected_eight;
  g_run = &run;
  std::thread holder([&run] {
    run.holder.store(std::this_thread::get_id());
    if (!gemm_matches(run, 1)) run.mismatches.fetch_add(1);
  });
  // The holder's call must reach the parallel-for (it splits 32 row groups); give up rather
  // than hang if it ever stops doing so.
  for (int spin = 0; !run.holding.load() && spin < 20000; ++spin) {
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  if (!run.holding.load()) {
    run.release.store(true);
    holder.join();
    g_run = nullptr;
    qmoe_context_destroy(ctx);
    FAIL() << "the holder's qmoe_gemm never called the parallel-for";
  }
  constexpr int kWorkers = 200;
  for (int t = 0; t < kWorkers; ++t) {
    std::thread worker([&run] {
      t_flush.armed = true;  // constructed before this thread's thread-private scratch
      if (!gemm_matches(run, 1)) run.mismatches.fetch_add(1);
    });
    worker.join();
  }
  run.release.store(true);
  holder.join();
  g_run = nullptr;
  qmoe_context_destroy(ctx);
  EXPECT_EQ(run.calls_from_destructors.load(), kWorkers);
  EXPECT_EQ(run.mismatches.load(), 0);
}

}  // namespace
}  // namespace qmoe::testing
