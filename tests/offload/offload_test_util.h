// Helpers of the offload protocol tests: random layer calls, what the device side should do
// with them (computed here independently of the kernels), a handler that checks every request
// against that and answers with a result the device side can check in turn, and a thread that
// watches the ring's sequence words while the two sides run.
#ifndef QMOE_TESTS_OFFLOAD_OFFLOAD_TEST_UTIL_H_
#define QMOE_TESTS_OFFLOAD_OFFLOAD_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lib/offload/host_device.h"
#include "lib/offload/ring_layout.h"
#include "lib/offload/service.h"

namespace qmoe::offload::testing {

/// Whether this is a ThreadSanitizer build (long runs are cut short there).
constexpr bool kThreadSanitizer =
#if defined(__SANITIZE_THREAD__)
    true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
    true;
#else
    false;
#endif
#else
    false;
#endif

/// An environment variable as a count, or `fallback`.
inline uint64_t env_count(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// One layer call's inputs in host memory, and what the device side must make of them.
struct Call {
  uint32_t layer = 0;
  uint32_t m = 0;
  uint32_t k = 0;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<int32_t> residency;
  std::vector<float> x;  // [m_capacity, hidden], FP32
  std::vector<float> y;  // [m_capacity, hidden]
  // Expected, computed independently of the kernels:
  std::vector<int32_t> cold_ids;  // unique, ascending
  uint32_t selections = 0;
  std::vector<uint8_t> token_cold;  // [m]
  HostLayerCall view(uint32_t m_capacity, uint32_t num_experts, uint32_t num_slots) {
    HostLayerCall c;
    c.layer = layer;
    c.m_capacity = m_capacity;
    c.k = k;
    c.num_experts = num_experts;
    c.num_slots = num_slots;
    c.m = &m;
    c.ids = ids.data();
    c.weights = weights.data();
    c.residency = residency.data();
    c.x = x.data();
    c.ldx = x.size() / m_capacity;
    c.y = y.data();
    c.ldy = y.size() / m_capacity;
    return c;
  }
};

/// Fills the expected fields of `c` from its routing and residency.
inline void expect_classification(Call* c) {
  c->cold_ids.clear();
  c->selections = 0;
  c->token_cold.assign(c->m, 0);
  std::vector<bool> cold(c->residency.size(), false);
  for (uint32_t t = 0; t < c->m; ++t) {
    for (uint32_t j = 0; j < c->k; ++j) {
      const size_t i = size_t{t} * c->k + j;
      const int32_t e = c->ids[i];
      if (c->weights[i] != 0.0f && c->residency[e] < 0) {
        ++c->selections;
        c->token_cold[t] = 1;
        cold[e] = true;
      }
    }
  }
  for (size_t e = 0; e < cold.size(); ++e) {
    if (cold[e]) c->cold_ids.push_back(static_cast<int32_t>(e));
  }
}

/// A random call: m in [0, m_capacity] (m = 0 sometimes), k slots of random experts (repeats
/// allowed, as the layers allow), some weights 0, a residency with a random hot fraction
/// (sometimes all hot, so that calls with no cold selection come up), y filled with y0.
inline Call random_call(std::mt19937_64& rng, uint32_t layer, uint32_t m_capacity, uint32_t k,
                        uint32_t experts, uint32_t hidden, float y0) {
  Call c;
  c.layer = layer;
  c.k = k;
  c.m = std::uniform_int_distribution<uint32_t>(0, 7)(rng) == 0
            ? 0
            : std::uniform_int_distribution<uint32_t>(1, m_capacity)(rng);
  std::uniform_int_distribution<int32_t> expert(0, static_cast<int32_t>(experts) - 1);
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  for (uint32_t i = 0; i < m_capacity * k; ++i) {
    c.ids.push_back(expert(rng));
    c.weights.push_back(std::uniform_int_distribution<int>(0, 9)(rng) == 0 ? 0.0f : weight(rng));
  }
  static const double kHot[] = {0.0, 0.25, 0.5, 0.9, 1.0, 1.0};
  const double hot = kHot[std::uniform_int_distribution<size_t>(0, 5)(rng)];
  std::bernoulli_distribution is_hot(hot);
  int32_t slot = 0;
  for (uint32_t e = 0; e < experts; ++e) c.residency.push_back(is_hot(rng) ? slot++ : -1);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  for (uint32_t i = 0; i < m_capacity * hidden; ++i) c.x.push_back(value(rng));
  c.y.assign(size_t{m_capacity} * hidden, y0);
  expect_classification(&c);
  return c;
}

/// The result the checking handler writes for request `seq`, element (t, h): exact in FP32.
inline float result_value(uint64_t seq, uint32_t t, uint32_t h) {
  return static_cast<float>((seq * 131 + t * 17 + h) % 1024) * 0.25f - 64.0f;
}

/// A handler that compares every request with what the device side should have published
/// (registered before the call is launched), writes result_value, and can be slowed down or
/// made to fail. Mismatches are counted (gtest assertions are not made on the service thread).
class CheckingHandler : public RequestHandler {
 public:
  explicit CheckingHandler(uint32_t hidden) : hidden_(hidden) {}

  void expect(uint64_t seq, const Call* call) {
    std::lock_guard<std::mutex> lock(mutex_);
    expected_[seq] = call;
  }
  void set_delay(std::chrono::microseconds d) { delay_us_.store(d.count()); }
  void fail_next(bool f) { fail_.store(f); }
  bool require_cold = true;  // every request must have a cold expert (short circuit on)

  uint64_t mismatches() const { return mismatches_.load(); }
  uint64_t served() const { return served_.load(); }
  std::string first_mismatch() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return first_;
  }

  qmoe_status serve(const RequestView& r, char* why, size_t why_size) override {
    served_.fetch_add(1);
    if (const int64_t d = delay_us_.load(); d > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(d));
    }
    if (fail_.load()) {
      std::snprintf(why, why_size, "told to fail");
      return QMOE_STATUS_INTERNAL_ERROR;
    }
    const Call* c = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = expected_.find(r.seq);
      if (it != expected_.end()) {
        c = it->second;
        expected_.erase(it);
      }
    }
    check(c != nullptr, r.seq, "a request nobody expected");
    if (c == nullptr) return QMOE_STATUS_OK;
    const RequestMeta& m = r.meta;
    check(m.layer == c->layer && m.m == c->m && m.k == c->k, r.seq, "layer, m or k");
    check(m.selections == c->selections, r.seq, "selections");
    check(!require_cold || m.num_cold >= 1, r.seq, "a published request without a cold expert");
    check(m.num_cold == c->cold_ids.size() &&
              std::equal(c->cold_ids.begin(), c->cold_ids.end(), r.cold_ids),
          r.seq, "cold ids");
    const size_t slots = size_t{c->m} * c->k;
    check(std::equal(c->ids.begin(), c->ids.begin() + slots, r.ids), r.seq, "ids");
    check(std::memcmp(c->weights.data(), r.weights, slots * sizeof(float)) == 0, r.seq, "weights");
    for (uint32_t t = 0; t < c->m; ++t) {
      check(std::memcmp(c->x.data() + size_t{t} * hidden_,
                        static_cast<const float*>(r.x) + size_t{t} * hidden_,
                        hidden_ * sizeof(float)) == 0,
            r.seq, "x tile");
    }
    auto* out = static_cast<float*>(r.result);
    for (uint32_t t = 0; t < m.m; ++t) {
      for (uint32_t h = 0; h < hidden_; ++h)
        out[size_t{t} * hidden_ + h] = result_value(r.seq, t, h);
    }
    return QMOE_STATUS_OK;
  }

 private:
  void check(bool ok, uint64_t seq, const char* what) {
    if (ok) return;
    if (mismatches_.fetch_add(1) == 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      first_ = "request " + std::to_string(seq) + ": " + what;
    }
  }

  const uint32_t hidden_;
  mutable std::mutex mutex_;
  std::map<uint64_t, const Call*> expected_;
  std::string first_;
  std::atomic<uint64_t> mismatches_{0}, served_{0};
  std::atomic<int64_t> delay_us_{0};
  std::atomic<bool> fail_{false};
};

/// Watches every slot's req_seq and done_seq while the two sides run: per word, never
/// decreasing; over the ring, done <= req <= done + R, where req (done) is the largest req_seq
/// (done_seq) of any slot, each inequality read in the order that makes it exact.
class RingObserver {
 public:
  RingObserver(unsigned char* ring, const RingLayout& layout) : ring_(ring), layout_(layout) {
    thread_ = std::thread([this] { run(); });
  }
  ~RingObserver() { stop(); }
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  uint64_t observations() const { return observations_.load(); }
  uint64_t violations() const { return violations_.load(); }
  std::string first_violation() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return first_;
  }

 private:
  uint64_t word(uint32_t slot, uint64_t offset) const {
    return __atomic_load_n(entry_field<uint64_t>(ring_entry(ring_, layout_, slot), offset),
                           __ATOMIC_ACQUIRE);
  }
  uint64_t max_word(uint64_t offset, std::vector<uint64_t>* last, const char* name) {
    uint64_t most = 0;
    for (uint32_t s = 0; s < layout_.geometry.ring_size; ++s) {
      const uint64_t v = word(s, offset);
      if (v < (*last)[s])
        violate(std::string(name) + " of slot " + std::to_string(s) + " went down");
      (*last)[s] = v;
      most = std::max(most, v);
    }
    return most;
  }
  void violate(const std::string& what) {
    if (violations_.fetch_add(1) == 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      first_ = what;
    }
  }
  void run() {
    const uint32_t r = layout_.geometry.ring_size;
    std::vector<uint64_t> last_req(r, 0), last_done(r, 0);
    while (!stop_.load()) {
      // done first, then req: done read no later than req, so done <= req must hold.
      const uint64_t done1 = max_word(layout_.done, &last_done, "done_seq");
      const uint64_t req1 = max_word(layout_.req, &last_req, "req_seq");
      if (done1 > req1) violate("done " + std::to_string(done1) + " > req " + std::to_string(req1));
      // req first, then done: req read no later than done, so req <= done + R must hold.
      const uint64_t done2 = max_word(layout_.done, &last_done, "done_seq");
      if (req1 > done2 + r) {
        violate("req " + std::to_string(req1) + " > done " + std::to_string(done2) + " + R");
      }
      observations_.fetch_add(1);
      std::this_thread::yield();
    }
  }

  unsigned char* ring_;
  RingLayout layout_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> observations_{0}, violations_{0};
  mutable std::mutex mutex_;
  std::string first_;
};

}  // namespace qmoe::offload::testing

#endif  // QMOE_TESTS_OFFLOAD_OFFLOAD_TEST_UTIL_H_
