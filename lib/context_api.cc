// The context ABI: qmoe_context_* and the handle shells behind them.
//
// Handles: the qmoe_context the caller holds is a small shell {magic, Context*} that is never
// returned to the allocator (lib/context.h).
#include <cpuinfo.h>

#include <atomic>
#include <cstring>
#include <new>
#include <thread>

#include "lib/abi_enum.h"
#include "lib/context.h"
#include "lib/dispatch.h"
#include "lib/error.h"
#include "lib/handle_pool.h"
#include "lib/struct_size.h"

struct qmoe_context {
  // kLiveMagic while the context exists, kDeadMagic after destroy. Atomic only so that a
  // caller's racy misuse is a rejected handle rather than a data race inside the library.
  std::atomic<uint64_t> magic{0};
  // Written only while the shell is not live (create, before the magic's release store), so a
  // racing resolve never reads it during a write: destroy leaves it as it is (the dead magic
  // already rejects the handle; clearing it here was a data race with a losing destroy).
  qmoe::Context* context = nullptr;
};

namespace qmoe {
namespace {

constexpr uint64_t kLiveMagic = 0x716d6f652d637478ull;  // "qmoe-ctx"
constexpr uint64_t kDeadMagic = 0x716d6f652d646561ull;  // "qmoe-dea"

uint32_t default_thread_count() {
  if (cpuinfo_initialize()) {
    const uint32_t cores = cpuinfo_get_cores_count();
    if (cores > 0) return cores;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? hw : 1;
}

}  // namespace

qmoe_status resolve_context(const qmoe_context* handle, const char* function, Context** context) {
  if (const qmoe_status s =
          check_handle(handle, &qmoe_context::context, kLiveMagic, kDeadMagic,
                       QMOE_STATUS_INVALID_CONTEXT, function, "context", "qmoe context");
      s != QMOE_STATUS_OK) {
    return s;
  }
  *context = handle->context;
  return QMOE_STATUS_OK;
}

}  // namespace qmoe

extern "C" {

QMOE_API void qmoe_context_options_init(qmoe_context_options* options) {
  if (options == nullptr) return;
  *options = qmoe_context_options{};
  options->struct_size = sizeof(qmoe_context_options);
  options->max_isa = QMOE_ISA_DEFAULT;
}

QMOE_API qmoe_status qmoe_context_create(const qmoe_context_options* options,
                                         qmoe_context** context) {
  using namespace qmoe;
  if (context == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "context out-pointer is NULL");
  *context = nullptr;

  // Read only the fields the caller's struct has; later fields keep their defaults.
  qmoe_context_options opts;
  qmoe_context_options_init(&opts);
  if (options != nullptr) {
    using O = qmoe_context_options;
    static constexpr FieldSpan kFields[] = {QMOE_FIELD(O, num_threads), QMOE_FIELD(O, parallel_for),
                                            QMOE_FIELD(O, parallel_for_state)};
    if (!struct_size_ok(options->struct_size, offsetof(O, num_threads), kFields)) {
      QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
                "options->struct_size is %zu, not the size of any version of the struct; set it "
                "to sizeof(qmoe_context_options) (%zu)",
                options->struct_size, sizeof(qmoe_context_options));
    }
    const size_t n = options->struct_size < sizeof(opts) ? options->struct_size : sizeof(opts);
    std::memcpy(&opts, options, n);
    opts.struct_size = sizeof(opts);
  }

  Isa isa;
  switch (const int32_t max_isa = enum_bits(opts.max_isa)) {
    case QMOE_ISA_DEFAULT:
      isa = default_isa();
      break;
    case QMOE_ISA_SCALAR:
    case QMOE_ISA_AVX2:
    case QMOE_ISA_AVX512:
      isa = static_cast<Isa>(opts.max_isa);
      break;
    default:
      QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "options->max_isa %d is not a qmoe_isa",
                static_cast<int>(max_isa));
  }
  const KernelTable* kernels = kernel_table_for_isa(isa);
  if (kernels == nullptr) {
    QMOE_FAIL(QMOE_STATUS_UNSUPPORTED_HARDWARE, "tier %s requested: %s", isa_name(isa),
              isa_unavailable_reason(isa));
  }

  uint32_t threads = opts.num_threads;
  // pthreadpool_create does not fail when it cannot start its workers: it waits for them
  // forever. Thousands of threads is no sensible request, and a cap keeps it from happening.
  if (threads > QMOE_MAX_THREADS) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "options->num_threads = %u exceeds %u", threads,
              QMOE_MAX_THREADS);
  }
  pthreadpool_t pool = nullptr;
  if (opts.parallel_for == nullptr) {
    if (threads == 0) threads = default_thread_count();
    if (threads > 1) {
      pool = pthreadpool_create(threads);
      if (pool == nullptr) {
        QMOE_FAIL(QMOE_STATUS_OUT_OF_MEMORY, "pthreadpool_create(%u) failed", threads);
      }
      threads = static_cast<uint32_t>(pthreadpool_get_threads_count(pool));
    }
  } else if (threads == 0) {
    threads = default_thread_count();
  }

  auto* impl = new (std::nothrow)
      Context(isa, kernels, threads, pool, opts.parallel_for, opts.parallel_for_state);
  qmoe_context* shell = impl != nullptr ? HandlePool<qmoe_context>::acquire() : nullptr;
  if (shell == nullptr) {
    if (impl != nullptr) {
      delete impl;
    } else if (pool != nullptr) {
      pthreadpool_destroy(pool);
    }
    QMOE_FAIL(QMOE_STATUS_OUT_OF_MEMORY, "allocating the context failed");
  }
  shell->context = impl;
  shell->magic.store(kLiveMagic, std::memory_order_release);
  *context = shell;
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_context_destroy(qmoe_context* context) {
  if (context == nullptr) return QMOE_STATUS_OK;
  QMOE_RESOLVE_CONTEXT(impl, context);
  if (!qmoe::HandlePool<qmoe_context>::claim_for_destroy(context, qmoe::kLiveMagic,
                                                         qmoe::kDeadMagic)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_CONTEXT, "context was destroyed");
  }
  delete impl;
  qmoe::HandlePool<qmoe_context>::release(context);
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_context_get_isa(const qmoe_context* context, qmoe_isa* isa) {
  QMOE_RESOLVE_CONTEXT(impl, context);
  if (isa == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "isa out-pointer is NULL");
  *isa = static_cast<qmoe_isa>(impl->isa());
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_context_get_num_threads(const qmoe_context* context,
                                                  uint32_t* num_threads) {
  QMOE_RESOLVE_CONTEXT(impl, context);
  if (num_threads == nullptr) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "num_threads out-pointer is NULL");
  }
  *num_threads = impl->num_threads();
  return QMOE_STATUS_OK;
}

}  // extern "C"
