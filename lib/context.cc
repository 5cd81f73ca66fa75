#include "lib/context.h"

#include <cpuinfo.h>

#include <atomic>
#include <cstring>
#include <new>
#include <thread>

#include "lib/abi_enum.h"
#include "lib/dispatch.h"
#include "lib/error.h"
#include "lib/handle_pool.h"
#include "lib/memory_ranges.h"
#include "lib/struct_size.h"

namespace qmoe {

Context::Context(Isa isa, const KernelTable* kernels, uint32_t num_threads, pthreadpool_t pool,
                 qmoe_parallel_for_fn caller_parallel_for, void* caller_parallel_for_state)
    : isa_(isa),
      kernels_(kernels),
      num_threads_(num_threads),
      pool_(pool),
      parallel_for_(caller_parallel_for),
      parallel_for_state_(caller_parallel_for_state) {}

Context::~Context() {
  if (pool_ != nullptr) pthreadpool_destroy(pool_);
}

void Context::parallel_for(qmoe_parallel_task_fn task, void* task_state, size_t range) const {
  if (range == 0) return;
  if (range == 1 || num_threads_ == 1 || (pool_ == nullptr && parallel_for_ == nullptr)) {
    for (size_t i = 0; i < range; ++i) task(task_state, i);
    return;
  }
  if (parallel_for_ != nullptr) {
    parallel_for_(parallel_for_state_, task, task_state, range);
  } else {
    pthreadpool_parallelize_1d(pool_, task, task_state, range, /*flags=*/0);
  }
}

namespace {

// `buffer` grown to at least `bytes` (+ 64 for the alignment), by a whole new allocation (no
// copy: contents are scratch); its 64-byte aligned start, or nullptr when that fails.
unsigned char* grow_scratch(std::unique_ptr<unsigned char[]>* buffer, size_t* capacity,
                            size_t bytes) {
  if (bytes > *capacity || *buffer == nullptr) {
    buffer->reset();
    *capacity = 0;
    if (bytes > SIZE_MAX - 64) return nullptr;
    buffer->reset(new (std::nothrow) unsigned char[bytes + 64]);
    if (*buffer == nullptr) return nullptr;
    *capacity = bytes;
  }
  const auto address = reinterpret_cast<uintptr_t>(buffer->get());
  return buffer->get() + (align64(address) - address);
}

// A buffer of the lease's own, freed with it.
ScratchLease owned_scratch_lease(size_t bytes) {
  std::unique_ptr<unsigned char[]> own;
  size_t capacity = 0;
  unsigned char* data = grow_scratch(&own, &capacity, bytes);
  return ScratchLease(data, nullptr, std::move(own));
}

// Set when this thread's ThreadScratch has been destroyed (thread exit). Trivially
// destructible, so it stays readable from thread_local destructors that run later.
thread_local bool t_thread_scratch_gone = false;

// Scratch for a call that found its context's buffer held: the calling thread's own buffer
// (kept until the thread exits), or, when a call on this thread already holds that one (a call
// nested inside a caller's parallel-for) or the thread is exiting and has destroyed it, a
// buffer of the lease's own, freed with it. (A caller's thread_local object constructed before
// this thread's first contended call is destroyed after `mine`; a libqmoe call from its
// destructor used the freed buffer.)
ScratchLease thread_scratch_lease(size_t bytes) {
  struct ThreadScratch {
    std::unique_ptr<unsigned char[]> buffer;
    size_t capacity = 0;
    std::atomic<bool> busy{false};  // only this thread reads or writes it
    ~ThreadScratch() { t_thread_scratch_gone = true; }
  };
  if (t_thread_scratch_gone) return owned_scratch_lease(bytes);
  thread_local ThreadScratch mine;
  if (!mine.busy.load(std::memory_order_relaxed)) {
    unsigned char* data = grow_scratch(&mine.buffer, &mine.capacity, bytes);
    if (data == nullptr) return ScratchLease(nullptr, nullptr);
    mine.busy.store(true, std::memory_order_relaxed);
    return ScratchLease(data, &mine.busy);
  }
  return owned_scratch_lease(bytes);
}

}  // namespace

ScratchLease Context::acquire_scratch(size_t bytes) {
  bool expected = false;
  if (!scratch_busy_.compare_exchange_strong(expected, true, std::memory_order_acquire,
                                             std::memory_order_relaxed)) {
    return thread_scratch_lease(bytes);
  }
  unsigned char* data = grow_scratch(&scratch_, &scratch_capacity_, bytes);
  if (data == nullptr) {
    scratch_busy_.store(false, std::memory_order_release);
    return ScratchLease(nullptr, nullptr);
  }
  return ScratchLease(data, &scratch_busy_);
}

}  // namespace qmoe
