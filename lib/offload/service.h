// The CPU service thread of an offload session: it answers the ring's requests in sequence
// order (lib/offload/ring_layout.h), running each through a RequestHandler (the CPU MoE layer
// in production, lib/offload/moe_handler.h), and keeps the host telemetry.
//
// Per request s (slot (s - 1) % R): acquire-load req_seq until it reads s; read and check the
// payload (RequestMeta, ids, weights, cold ids: validate_request); run the handler, which writes
// the result; store status; release-store done_seq = s. The thread touches nothing else of
// the ring, and makes no CUDA call: in production the ring is mapped pinned memory the GPU
// writes, and these are plain loads and stores to it.
//
// Spin, then park. After a request (or a wake() hint) the thread polls the ring continuously
// for spin_ns; then it parks on a condition variable. The GPU cannot notify a host thread, so
// a parked thread also wakes every park_ns to look at the ring once (and parks again if there
// is nothing); a request found that way, or a wake() from the host (qmoe_cuda_offload_forward
// calls it on every enqueue, qmoe_cuda_offload_wake before a graph launch), starts a new spin
// window. stop() ends the thread: it finishes the request it is running, if any, and answers
// nothing after it; a request left unanswered makes the device's wait time out, never hang.
#ifndef QMOE_LIB_OFFLOAD_SERVICE_H_
#define QMOE_LIB_OFFLOAD_SERVICE_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "lib/offload/ring_layout.h"
#include "qmoe/qmoe.h"

namespace qmoe::offload {

/// Buckets of the service-time histogram: bucket 0 holds times below 2 us, bucket b in
/// [1, 22] times in [2^b, 2^(b+1)) us, bucket 23 everything from 2^23 us (8.4 s) up.
constexpr uint32_t kHistogramBuckets = 24;
uint32_t histogram_bucket(uint64_t service_ns);

/// Host counters; each written by the service thread alone, read at any time.
struct HostTelemetry {
  uint64_t requests_served;    // answered, failures included
  uint64_t selections_served;  // cold selections of the answered requests (recounted here)
  uint64_t failed_requests;    // answered with a failure status
  uint64_t wakeups;            // parks that ended in a new spin window
  uint64_t parks;              // times the thread went from spinning to parked
  uint64_t service_ns;         // total time in validate + handler
  uint64_t histogram[kHistogramBuckets];
};

/// A request as the service hands it to a handler (pointers into the ring).
struct RequestView {
  uint64_t seq;
  RequestMeta meta;
  uint32_t hidden;
  const int32_t* ids;       // [m, k]
  const float* weights;     // [m, k]
  const int32_t* cold_ids;  // [num_cold], ascending
  const void* x;            // [m, hidden] elements of meta.dtype, rows hidden apart
  void* result;             // [m, hidden], rows hidden apart
};

class RequestHandler {
 public:
  virtual ~RequestHandler() = default;
  /// Compute the request's result. QMOE_STATUS_OK, or a failure status with a reason in `why`
  /// (NUL-terminated, at most why_size bytes). Called on the service thread only.
  virtual qmoe_status serve(const RequestView& request, char* why, size_t why_size) = 0;
};

/// The checks every request passes before a handler sees it (the device never publishes one
/// that fails them; they keep a corrupted ring from reaching the handler): m <= m_capacity;
/// 1 <= k <= k_max when m > 0; a known dtype and accuracy; cold ids ascending (so unique), in
/// [0, E_max) and at most min(E_max, m * k); ids in [0, E_max); and `selections` equal to the
/// slots whose expert is in the cold set with a finite nonzero weight, which *recount receives.
bool validate_request(const RequestView& r, const RingGeometry& g, uint32_t* recount, char* why,
                      size_t why_size);

struct ServiceOptions {
  uint64_t spin_ns = 2000000;  // poll this long after the last request or wake()
  uint64_t park_ns = 100000;   // a parked thread looks at the ring this often
};

class OffloadService {
 public:
  /// `ring` (as the host addresses it) and `handler` must outlive the service.
  OffloadService(unsigned char* ring, const RingLayout& layout, RequestHandler* handler,
                 const ServiceOptions& options);
  ~OffloadService();  // stop()
  OffloadService(const OffloadService&) = delete;
  OffloadService& operator=(const OffloadService&) = delete;

  /// Starts the thread; QMOE_STATUS_OUT_OF_MEMORY (message naming `function`) if it cannot.
  qmoe_status start(const char* function);
  /// Stops and joins the thread (idempotent; any thread but the service's own).
  void stop();
  /// Requests may come soon: a parked thread wakes and spins (cheap when it is not parked).
  void wake();

  HostTelemetry telemetry() const;
  /// Requests answered so far (the last done_seq written).
  uint64_t served() const { return served_.load(std::memory_order_acquire); }
  /// The reason of the last failed request ("" when none).
  std::string last_failure() const;

 private:
  void run();
  bool serve_next();
  void add(std::atomic<uint64_t>& counter, uint64_t v) {
    counter.store(counter.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  }

  unsigned char* const ring_;
  const RingLayout layout_;
  RequestHandler* const handler_;
  const ServiceOptions options_;
  std::thread thread_;
  std::atomic<uint64_t> served_{0};  // writer: the service thread
  std::atomic<bool> stop_{false};
  std::atomic<bool> wake_pending_{false};
  std::atomic<bool> parked_{false};
  std::mutex park_mutex_;
  std::condition_variable park_cv_;
  std::mutex stop_mutex_;  // serialises stop()
  // Host telemetry: writer the service thread.
  std::atomic<uint64_t> requests_served_{0}, selections_served_{0}, failed_requests_{0};
  std::atomic<uint64_t> wakeups_{0}, parks_{0}, service_ns_{0};
  std::atomic<uint64_t> histogram_[kHistogramBuckets] = {};
  mutable std::mutex failure_mutex_;
  std::string last_failure_;  // guarded by failure_mutex_
};

}  // namespace qmoe::offload

#endif  // QMOE_LIB_OFFLOAD_SERVICE_H_
