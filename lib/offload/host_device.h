// The device side of the offload protocol on host threads: the offload kernels' own code
// (lib/offload/kernels.h) run by a team of host threads that stands in for a CTA, over ordinary
// memory standing in for the device memory and the mapped ring. Tests on machines without a
// GPU drive the CPU service thread (lib/offload/service.h) with it, and ThreadSanitizer sees
// every access: the ring's words through __atomic builtins, the payload as plain accesses
// ordered by them, a CTA's shared memory through its barrier.
//
// Emulation: a launch runs its blocks one after another (a schedule CUDA allows: blocks are
// not promised to run at once), each block on all of the team's threads; a barrier is a mutex
// and condition variable, sync_count and sync_or reduce under it; system-scope acquire and
// release are __atomic acquire loads and release stores, fence_system a sequentially
// consistent fence; shared memory is poisoned (0xCD) before every block, as a GPU leaves it
// uninitialised. now_ns is std::chrono::steady_clock.
#ifndef QMOE_LIB_OFFLOAD_HOST_DEVICE_H_
#define QMOE_LIB_OFFLOAD_HOST_DEVICE_H_

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "lib/offload/device_state.h"
#include "lib/offload/host_memory_ops.h"
#include "lib/offload/kernels.h"
#include "lib/offload/ring_layout.h"
#include "qmoe/qmoe.h"

namespace qmoe::offload {

class HostGrid;

/// One thread of an emulated CTA (the Cta of lib/offload/kernels.h).
class HostCta : public HostMemoryOps {
 public:
  HostCta(HostGrid* grid, uint32_t thread) : grid_(grid), thread_(thread) {}
  uint32_t thread() const { return thread_; }
  uint32_t threads() const;
  uint32_t block() const { return block_; }
  uint32_t blocks() const { return blocks_; }

  void sync();
  int sync_count(int predicate);
  int sync_or(int predicate);

  static void atomic_or(uint32_t* p, uint32_t v) { __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
  static void shared_or(uint32_t* p, uint32_t v) { __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
  /// A waiting thread gives its core away now and then: the machine running the tests may
  /// have fewer cores than threads.
  static void relax(uint32_t spins) {
    if (spins % 64 == 63) std::this_thread::yield();
  }
  static float load_element(uint32_t dtype, const void* p, uint64_t i);
  static float load_result(uint32_t dtype, const void* p, uint64_t i) {
    return load_element(dtype, p, i);
  }
  static void store_element(uint32_t dtype, void* p, uint64_t i, float v);

 private:
  friend class HostGrid;
  HostGrid* grid_;
  uint32_t thread_;
  uint32_t block_ = 0;
  uint32_t blocks_ = 0;
};

/// A team of host threads that runs launches: each block of a launch on every thread.
class HostGrid {
 public:
  /// Starts `threads` threads (>= 1); throws std::system_error when it cannot.
  explicit HostGrid(uint32_t threads);
  ~HostGrid();
  HostGrid(const HostGrid&) = delete;
  HostGrid& operator=(const HostGrid&) = delete;

  uint32_t threads() const { return threads_; }

  /// Runs body(cta, shared of the block) for every block in [0, blocks) on every thread, one
  /// block at a time, and returns when all have returned. Shared is a trivially copyable
  /// struct; each block gets a fresh one, poisoned.
  template <typename Shared, typename Body>
  void launch(uint32_t blocks, Body body) {
    Shared shared;
    run(blocks, [&](HostCta& cta) {
      if (cta.thread() == 0) std::memset(static_cast<void*>(&shared), 0xCD, sizeof shared);
      cta.sync();
      body(cta, shared);
      cta.sync();  // the block's end: the next block's poisoning waits for every thread
    });
  }

 private:
  friend class HostCta;
  void run(uint32_t blocks, const std::function<void(HostCta&)>& body);
  void worker(uint32_t thread);
  int barrier(int value, bool count);

  const uint32_t threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_, finish_, barrier_cv_;
  // Guarded by mutex_.
  const std::function<void(HostCta&)>* body_ = nullptr;
  uint32_t blocks_ = 0;
  uint64_t launch_ = 0;  // launches started
  uint32_t finished_ = 0;
  bool stop_ = false;
  uint64_t barrier_generation_ = 0;
  uint32_t barrier_arrived_ = 0;
  int barrier_accumulator_ = 0;
  int barrier_result_ = 0;
};

/// One layer call's device-side inputs, in memory standing in for device memory.
struct HostLayerCall {
  uint32_t layer = 0;
  uint32_t m_capacity = 0;
  uint32_t k = 0;
  uint32_t num_experts = 0;
  uint32_t num_slots = 0;
  const uint32_t* m = nullptr;
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  const int32_t* residency = nullptr;
  qmoe_dtype dtype = QMOE_DTYPE_F32;
  qmoe_accuracy accuracy = QMOE_ACCURACY_FAST;
  const void* x = nullptr;
  size_t ldx = 0;
  void* y = nullptr;
  size_t ldy = 0;
};

/// The device side of one offload session on host threads: its state, per-layer records,
/// the ring (ordinary memory, 128-byte aligned, zeroed) and the two kernels.
class HostDevice {
 public:
  struct Options {
    RingGeometry geometry{};
    uint32_t num_records = 1;  // layers
    uint32_t threads = 4;      // per emulated block
    uint32_t wait_blocks = 2;
    uint64_t timeout_ns = 1000000000;
    bool short_circuit = true;
  };

  /// Throws std::bad_alloc or std::system_error when it cannot allocate or start its team;
  /// the geometry must pass ring_geometry_ok.
  explicit HostDevice(const Options& options);
  ~HostDevice();

  unsigned char* ring() const { return ring_; }
  const RingLayout& layout() const { return layout_; }

  /// The classify-publish kernel for `call` into layer record `call.layer`.
  void classify_publish(const HostLayerCall& call);
  /// The wait-accumulate kernel for the layer's last classified call.
  void wait_accumulate(const HostLayerCall& call);

  /// Copies of the device-side memory, for the thread that launches (between launches).
  OffloadDeviceState state() const { return state_; }
  OffloadCallRecord record(uint32_t layer) const { return records_[layer]; }
  const uint8_t* token_cold(uint32_t layer) const {
    return token_cold_.data() + size_t{layer} * layout_.geometry.m_capacity;
  }
  /// The sticky error, from any thread.
  uint32_t error() const { return __atomic_load_n(&state_.error, __ATOMIC_RELAXED); }

 private:
  Options options_;
  RingLayout layout_;
  unsigned char* ring_ = nullptr;  // aligned_alloc'd
  OffloadDeviceState state_{};
  std::vector<OffloadCallRecord> records_;
  std::vector<uint8_t> token_cold_;
  HostGrid grid_;
};

}  // namespace qmoe::offload

#endif  // QMOE_LIB_OFFLOAD_HOST_DEVICE_H_
