// A context: the kernel table of one tier and the threads its calls run on.
//
// Handles: the qmoe_context the caller holds is a small shell {magic, Context*} that is never
// returned to the allocator. Destroy marks the shell dead and queues it for reuse only after
// HandlePool::kQuarantine (lib/handle_pool.h) other shells, so a destroyed handle is rejected with
// INVALID_CONTEXT (instead of a use-after-free) until that many contexts have been destroyed after
// it.
#ifndef QMOE_LIB_CONTEXT_H_
#define QMOE_LIB_CONTEXT_H_

#include <pthreadpool.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "lib/cpu/kernel_table.h"
#include "qmoe/qmoe.h"

namespace qmoe {

/// Scratch for one call, from Context::acquire_scratch (or a caller's workspace). While it
/// lives it holds one of: the context's buffer (its busy flag set), the calling thread's buffer
/// (that flag set), a buffer of its own, or nothing (caller memory); destroying it clears the
/// flag or frees its buffer. data() is nullptr when an allocation failed. Move-only.
class ScratchLease {
 public:
  ScratchLease(unsigned char* data, std::atomic<bool>* busy,
               std::unique_ptr<unsigned char[]> owned = nullptr)
      : data_(data), busy_(busy), owned_(std::move(owned)) {}
  ScratchLease(ScratchLease&& other) noexcept
      : data_(other.data_), busy_(other.busy_), owned_(std::move(other.owned_)) {
    other.busy_ = nullptr;
  }
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  ScratchLease& operator=(ScratchLease&&) = delete;
  ~ScratchLease() {
    // Release: the next holder's acquire (a compare-exchange) sees this call's writes done.
    if (busy_ != nullptr) busy_->store(false, std::memory_order_release);
  }
  unsigned char* data() const { return data_; }

 private:
  unsigned char* data_;
  std::atomic<bool>* busy_;                 // the flag of the buffer held, or nullptr
  std::unique_ptr<unsigned char[]> owned_;  // a buffer private to this call, or nullptr
};

class Context {
 public:
  Context(Isa isa, const KernelTable* kernels, uint32_t num_threads, pthreadpool_t pool,
          qmoe_parallel_for_fn caller_parallel_for, void* caller_parallel_for_state);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  Isa isa() const { return isa_; }
  const KernelTable& kernels() const { return *kernels_; }
  /// Workers a split should target (>= 1).
  uint32_t num_threads() const { return num_threads_; }

  /// task(task_state, i) for every i in [0, range), on the context's pool or the caller's
  /// parallel-for; inline on the calling thread when range <= 1 or there is one thread.
  /// Returns when every call has returned. Calls on one context are serialised by its pool.
  void parallel_for(qmoe_parallel_task_fn task, void* task_state, size_t range) const;

  /// At least `bytes` of 64-byte aligned scratch for the duration of one call: the context's
  /// own buffer (grown to the largest call, reused, freed with the context) when no other call
  /// on this context holds it; otherwise, so that concurrent calls through a caller's
  /// parallel-for never wait on each other, scratch private to the calling thread.
  ScratchLease acquire_scratch(size_t bytes);

 private:
  Isa isa_;
  const KernelTable* kernels_;
  uint32_t num_threads_;
  pthreadpool_t pool_;  // owned; nullptr when parallel_for_ is set or num_threads_ == 1
  qmoe_parallel_for_fn parallel_for_;
  void* parallel_for_state_;
  // Set while a call holds scratch_ (taken by compare-exchange, never waited on): guards
  // scratch_ and scratch_capacity_. A flag rather than a mutex, because a nested call on the
  // thread that holds it (a caller's parallel-for may run other work while it waits) must see
  // "busy", and try_lock on a mutex the thread owns is undefined.
  std::atomic<bool> scratch_busy_{false};
  std::unique_ptr<unsigned char[]> scratch_;
  size_t scratch_capacity_ = 0;
};

/// The live Context behind a handle, or a failure status (with message naming `function`).
qmoe_status resolve_context(const qmoe_context* handle, const char* function, Context** context);

}  // namespace qmoe

/// In an ABI function: `QMOE_RESOLVE_CONTEXT(ctx, handle);` declares `ctx` or returns.
#define QMOE_RESOLVE_CONTEXT(var, handle)                                              \
  ::qmoe::Context* var = nullptr;                                                      \
  if (qmoe_status resolve_status_ = ::qmoe::resolve_context((handle), __func__, &var); \
      resolve_status_ != QMOE_STATUS_OK)                                               \
  return resolve_status_

#endif  // QMOE_LIB_CONTEXT_H_
