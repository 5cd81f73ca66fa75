#include "parallel_items.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

std::string run_items_in_parallel(
    uint32_t begin, uint32_t end, unsigned threads,
    const std::function<bool(uint32_t item, unsigned thread, std::string* why)>& work,
    const std::function<void(uint32_t finished)>& on_done) {
  std::atomic<uint32_t> next{begin}, finished{0};
  std::atomic<bool> failed{false};
  std::mutex failure_mutex;
  std::string failure;
  auto run = [&](unsigned thread) {
    for (uint32_t item = next.fetch_add(1); item < end && !failed.load();
         item = next.fetch_add(1)) {
      std::string why;
      if (!work(item, thread, &why)) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failed.exchange(true)) failure = why;
        return;
      }
      const uint32_t done = finished.fetch_add(1) + 1;
      if (thread == 0 && on_done) on_done(done);
    }
  };
  std::vector<std::thread> helpers;
  for (unsigned t = 1; t < std::max(1u, threads); ++t) helpers.emplace_back(run, t);
  run(0);
  for (std::thread& helper : helpers) helper.join();
  return failure;
}
