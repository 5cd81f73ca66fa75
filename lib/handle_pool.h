// Storage for the shells behind opaque ABI handles (qmoe_context, qmoe_expert_set).
//
// A handle the caller holds points at a small shell {magic, implementation*}. Shells are never
// returned to the allocator: destroy marks a shell dead and queues it here, and a dead shell is
// handed out again only after kQuarantine others have been queued after it. So a destroyed
// handle (a double destroy, a use after destroy) reads a dead magic and is rejected with a
// status instead of being a use-after-free, for at least that many later destroys. The pool
// is reachable from a never-destroyed static, so shells stay valid during process exit too.
#ifndef QMOE_LIB_HANDLE_POOL_H_
#define QMOE_LIB_HANDLE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <new>

#include "lib/error.h"
#include "qmoe/qmoe.h"

namespace qmoe {

/// The check every ABI call makes of a handle argument: OK when `shell` is live (magic `live`,
/// read with acquire so that the implementation pointer stored before it is seen, and that
/// pointer set); else `bad`, with "<noun> is NULL", "<noun> was destroyed" or "not a <kind>"
/// recorded for `function`.
template <typename Shell, typename Impl>
qmoe_status check_handle(const Shell* shell, Impl* Shell::*impl, uint64_t live, uint64_t dead,
                         qmoe_status bad, const char* function, const char* noun,
                         const char* kind) {
  if (shell == nullptr) return fail(bad, function, "%s is NULL", noun);
  const uint64_t magic = shell->magic.load(std::memory_order_acquire);
  if (magic == dead) return fail(bad, function, "%s was destroyed", noun);
  if (magic != live || shell->*impl == nullptr) return fail(bad, function, "not a %s", kind);
  return QMOE_STATUS_OK;
}

template <typename Shell>
class HandlePool {
 public:
  static constexpr size_t kQuarantine = 64;

  /// A fresh shell, or the oldest dead one past quarantine; nullptr when out of memory.
  static Shell* acquire() {
    HandlePool& pool = instance();
    std::lock_guard<std::mutex> lock(pool.mutex_);
    if (pool.dead_.size() > kQuarantine) {
      Shell* shell = pool.dead_.front();
      pool.dead_.pop_front();
      return shell;
    }
    return new (std::nothrow) Shell;
  }

  /// Turn a shell's magic from `live` to `dead` in one step; true for the one caller that did,
  /// which then frees the implementation and releases the shell. Of two racing destroys of
  /// the same handle only one wins (a plain store let both through: a double free).
  static bool claim_for_destroy(Shell* shell, uint64_t live, uint64_t dead) {
    return shell->magic.compare_exchange_strong(live, dead, std::memory_order_acq_rel);
  }

  /// A live shell holding `impl` in its `field` (stored before the magic, which publishes it
  /// with release: check_handle's acquire load sees the pointer), or nullptr when out of memory
  /// (`impl` untouched: the caller frees it and fails).
  template <typename Impl>
  static Shell* publish(Impl* Shell::*field, Impl* impl, uint64_t live) {
    Shell* shell = acquire();
    if (shell == nullptr) return nullptr;
    shell->*field = impl;
    shell->magic.store(live, std::memory_order_release);
    return shell;
  }

  /// Queue a shell the caller has already marked dead.
  static void release(Shell* shell) {
    HandlePool& pool = instance();
    std::lock_guard<std::mutex> lock(pool.mutex_);
    try {
      pool.dead_.push_back(shell);
    } catch (const std::bad_alloc&) {
      // Out of memory: the shell stays dead and is never reused (a few bytes leak).
    }
  }

 private:
  static HandlePool& instance() {
    static HandlePool* pool = new HandlePool;
    return *pool;
  }

  std::mutex mutex_;
  std::deque<Shell*> dead_;  // FIFO: the oldest dead shell is reused first
};

}  // namespace qmoe

#endif  // QMOE_LIB_HANDLE_POOL_H_
