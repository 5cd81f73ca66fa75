#include "lib/offload/service.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <system_error>

#include "lib/error.h"

namespace qmoe::offload {
namespace {

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

bool finite_nonzero(float w) {
  uint32_t b;
  std::memcpy(&b, &w, sizeof b);
  return (b & 0x7F800000u) != 0x7F800000u && (b & 0x7FFFFFFFu) != 0;
}

}  // namespace

uint32_t histogram_bucket(uint64_t service_ns) {
  const uint64_t us = service_ns / 1000;
  if (us < 2) return 0;
  const uint32_t log2 = 63u - static_cast<uint32_t>(__builtin_clzll(us));
  return std::min(log2, kHistogramBuckets - 1);
}

bool validate_request(const RequestView& r, const RingGeometry& g, uint32_t* recount, char* why,
                      size_t why_size) {
  const RequestMeta& m = r.meta;
  *recount = 0;
  if (m.m > g.m_capacity) {
    std::snprintf(why, why_size, "m = %u above the ring's capacity %u", m.m, g.m_capacity);
    return false;
  }
  if (m.m > 0 && (m.k < 1 || m.k > g.k_max)) {
    std::snprintf(why, why_size, "k = %u outside [1, %u]", m.k, g.k_max);
    return false;
  }
  if (m.dtype != QMOE_DTYPE_F32 && m.dtype != QMOE_DTYPE_F16 && m.dtype != QMOE_DTYPE_BF16) {
    std::snprintf(why, why_size, "dtype %u is not F32, F16 or BF16", m.dtype);
    return false;
  }
  if (m.accuracy != QMOE_ACCURACY_EXACT && m.accuracy != QMOE_ACCURACY_FAST) {
    std::snprintf(why, why_size, "accuracy %u is not EXACT or FAST", m.accuracy);
    return false;
  }
  const uint32_t slots = m.m * m.k;
  if (m.num_cold > std::min(slots, g.num_experts_max)) {
    std::snprintf(why, why_size, "%u cold experts for %u slots", m.num_cold, slots);
    return false;
  }
  for (uint32_t i = 0; i < m.num_cold; ++i) {
    const int32_t e = r.cold_ids[i];
    if (e < 0 || static_cast<uint32_t>(e) >= g.num_experts_max ||
        (i > 0 && e <= r.cold_ids[i - 1])) {
      std::snprintf(why, why_size, "cold id %d at %u is out of range or not ascending", e, i);
      return false;
    }
  }
  uint32_t count = 0;
  for (uint32_t i = 0; i < slots; ++i) {
    const int32_t e = r.ids[i];
    if (e < 0 || static_cast<uint32_t>(e) >= g.num_experts_max) {
      std::snprintf(why, why_size, "ids[%u] = %d is out of range", i, e);
      return false;
    }
    if (finite_nonzero(r.weights[i]) &&
        std::binary_search(r.cold_ids, r.cold_ids + m.num_cold, e)) {
      ++count;
    }
  }
  if (count != m.selections) {
    std::snprintf(why, why_size, "the device counted %u cold selections, the payload has %u",
                  m.selections, count);
    return false;
  }
  *recount = count;
  return true;
}

OffloadService::OffloadService(unsigned char* ring, const RingLayout& layout,
                               RequestHandler* handler, const ServiceOptions& options)
    : ring_(ring), layout_(layout), handler_(handler), options_(options) {
  for (std::atomic<uint64_t>& h : histogram_) h.store(0, std::memory_order_relaxed);
}

OffloadService::~OffloadService() {
  stop();
}

qmoe_status OffloadService::start(const char* function) {
  try {
    thread_ = std::thread([this] { run(); });
  } catch (const std::system_error& e) {
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "starting the service thread: %s", e.what());
  }
  pthread_setname_np(thread_.native_handle(), "qmoe-offload");
  return QMOE_STATUS_OK;
}

void OffloadService::stop() {
  std::lock_guard<std::mutex> serial(stop_mutex_);
  stop_.store(true, std::memory_order_seq_cst);
  {
    std::lock_guard<std::mutex> lock(park_mutex_);
    park_cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void OffloadService::wake() {
  // Dekker with the thread's park: it stores parked_ then reads wake_pending_ (under the lock);
  // we store wake_pending_ then read parked_. With both sequentially consistent, either it sees
  // our flag and does not sleep, or we see it parked and notify.
  wake_pending_.store(true, std::memory_order_seq_cst);
  if (parked_.load(std::memory_order_seq_cst)) {
    std::lock_guard<std::mutex> lock(park_mutex_);
    park_cv_.notify_one();
  }
}

HostTelemetry OffloadService::telemetry() const {
  HostTelemetry t{};
  t.requests_served = requests_served_.load(std::memory_order_relaxed);
  t.selections_served = selections_served_.load(std::memory_order_relaxed);
  t.failed_requests = failed_requests_.load(std::memory_order_relaxed);
  t.wakeups = wakeups_.load(std::memory_order_relaxed);
  t.parks = parks_.load(std::memory_order_relaxed);
  t.service_ns = service_ns_.load(std::memory_order_relaxed);
  for (uint32_t b = 0; b < kHistogramBuckets; ++b) {
    t.histogram[b] = histogram_[b].load(std::memory_order_relaxed);
  }
  return t;
}

std::string OffloadService::last_failure() const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return last_failure_;
}

// One request, if the next one is published: false when it is not (yet).
bool OffloadService::serve_next() {
  const uint64_t seq = served_.load(std::memory_order_relaxed) + 1;
  unsigned char* entry = ring_entry(ring_, layout_, slot_of(seq, layout_.geometry.ring_size));
  // Acquire: the device wrote the payload before its release of req_seq.
  if (__atomic_load_n(entry_field<uint64_t>(entry, layout_.req), __ATOMIC_ACQUIRE) != seq) {
    return false;
  }
  const uint64_t t0 = now_ns();
  RequestView r{};
  r.seq = seq;
  std::memcpy(&r.meta, entry + layout_.meta, sizeof r.meta);
  r.hidden = layout_.geometry.hidden;
  r.ids = entry_field<const int32_t>(entry, layout_.ids);
  r.weights = entry_field<const float>(entry, layout_.weights);
  r.cold_ids = entry_field<const int32_t>(entry, layout_.cold_ids);
  r.x = entry + layout_.x;
  r.result = entry + layout_.result;
  char why[256] = "";
  uint32_t selections = 0;
  qmoe_status status = QMOE_STATUS_INTERNAL_ERROR;
  if (validate_request(r, layout_.geometry, &selections, why, sizeof why)) {
    status = handler_->serve(r, why, sizeof why);
  }
  // The answer: status, then (release) done_seq with the failure bit; the result the handler
  // wrote comes before both.
  *entry_field<uint32_t>(entry, layout_.status) = static_cast<uint32_t>(status);
  __atomic_store_n(entry_field<uint64_t>(entry, layout_.done),
                   seq | (status != QMOE_STATUS_OK ? kDoneFailed : 0), __ATOMIC_RELEASE);
  served_.store(seq, std::memory_order_release);
  const uint64_t took = now_ns() - t0;
  add(requests_served_, 1);
  add(selections_served_, selections);
  add(service_ns_, took);
  add(histogram_[histogram_bucket(took)], 1);
  if (status != QMOE_STATUS_OK) {
    add(failed_requests_, 1);
    std::lock_guard<std::mutex> lock(failure_mutex_);
    char line[320];
    std::snprintf(line, sizeof line, "request %llu (layer %u): %s",
                  static_cast<unsigned long long>(seq), r.meta.layer, why);
    last_failure_ = line;
  }
  return true;
}

void OffloadService::run() {
  uint64_t spin_from = now_ns();
  while (!stop_.load(std::memory_order_acquire)) {
    if (serve_next()) {
      spin_from = now_ns();
      continue;
    }
    if (wake_pending_.exchange(false, std::memory_order_acq_rel)) spin_from = now_ns();
    if (now_ns() - spin_from < options_.spin_ns) {
      cpu_relax();
      continue;
    }
    // Park until a wake(), stop() or the next look at the ring.
    add(parks_, 1);
    bool woken = false;
    while (!woken) {
      {
        std::unique_lock<std::mutex> lock(park_mutex_);
        parked_.store(true, std::memory_order_seq_cst);
        park_cv_.wait_for(lock, std::chrono::nanoseconds(options_.park_ns), [&] {
          return stop_.load(std::memory_order_seq_cst) ||
                 wake_pending_.load(std::memory_order_seq_cst);
        });
        parked_.store(false, std::memory_order_seq_cst);
      }
      if (stop_.load(std::memory_order_acquire)) return;
      if (wake_pending_.exchange(false, std::memory_order_acq_rel)) {
        woken = true;
      } else if (serve_next()) {
        woken = true;  // found by the periodic look
      }
    }
    add(wakeups_, 1);
    spin_from = now_ns();
  }
}

}  // namespace qmoe::offload
