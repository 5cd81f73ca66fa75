// qmoe_measure_read_bandwidth: the roof every memory-bound kernel is measured against, over a
// private buffer; qmoe_measure_read_bandwidth_over: the same passes over the caller's memory
// (the pages its expert weights live in), which the read kernel never writes.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "lib/context.h"
#include "lib/error.h"
#include "lib/weight_memory.h"
#include "qmoe/qmoe_experimental.h"

namespace qmoe {
namespace {

constexpr size_t kMinBufferBytes = 4096;

// `slices` slices of slice_bytes each, the last one taking the lines left over as well, so
// that the slices cover all `bytes` (a multiple of 64).
struct ReadSlices {
  ReadBandwidthFn read;
  const unsigned char* base;
  size_t bytes;        // multiple of 64
  size_t slices;       // 1 .. bytes / 64
  size_t slice_bytes;  // bytes / slices rounded down to a multiple of 64
  std::atomic<uint64_t> checksum{0};

  ReadSlices(ReadBandwidthFn fn, const unsigned char* start, size_t total, size_t count)
      : read(fn), base(start), bytes(total), slices(count), slice_bytes(total / count / 64 * 64) {}
  size_t size_of(size_t index) const {
    return index + 1 == slices ? bytes - index * slice_bytes : slice_bytes;
  }
  static void fill(void* state, size_t index) {
    auto* s = static_cast<ReadSlices*>(state);
    // First touch by the thread that later reads the slice (NUMA-local pages).
    std::memset(const_cast<unsigned char*>(s->base) + index * s->slice_bytes,
                static_cast<int>(index * 37 + 1), s->size_of(index));
  }
  static void read_slice(void* state, size_t index) {
    auto* s = static_cast<ReadSlices*>(state);
    const uint64_t x = s->read(s->base + index * s->slice_bytes, s->size_of(index));
    s->checksum.fetch_xor(x, std::memory_order_relaxed);
  }
};

// Best of `repetitions` timed passes of work.read over its slices, in bytes per second.
double best_pass(const Context& ctx, ReadSlices& work, uint32_t repetitions) {
  double best_seconds = 0.0;
  for (uint32_t r = 0; r < repetitions; ++r) {
    const auto start = std::chrono::steady_clock::now();
    ctx.parallel_for(&ReadSlices::read_slice, &work, work.slices);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r == 0 || seconds < best_seconds) best_seconds = seconds;
  }
  // Keep the reads observable without publishing the checksum.
  __asm__ volatile("" : : "r"(work.checksum.load(std::memory_order_relaxed)) : "memory");
  return best_seconds > 0.0 ? static_cast<double>(work.bytes) / best_seconds : 0.0;
}

// With all threads, kSlicesPerThread slices per thread, so that a thread slowed by another
// tenant does not set the pass's time alone: the pool hands the slices a slow thread has not
// started to the threads that are done (pthreadpool steals work within a parallel_for), as the
// executor's many tasks balance the same way. One slice on one thread. At least one 64-byte
// line a slice, so any range of at least kMinBufferBytes works on any thread count: a small one
// simply uses fewer slices. (With one slice per thread, the H200 host's executor read its cold
// experts faster than every roof measured in the same process.)
constexpr size_t kSlicesPerThread = 8;
size_t slice_count(const Context& ctx, size_t bytes, int use_all_threads) {
  size_t slices =
      use_all_threads && ctx.num_threads() > 1 ? ctx.num_threads() * kSlicesPerThread : 1;
  if (slices > bytes / 64) slices = bytes / 64;
  return slices;
}

}  // namespace
}  // namespace qmoe

extern "C" {

QMOE_API qmoe_status qmoe_measure_read_bandwidth(qmoe_context* context, size_t buffer_bytes,
                                                 uint32_t repetitions, int use_all_threads,
                                                 double* bytes_per_second) {
  using namespace qmoe;
  QMOE_RESOLVE_CONTEXT(ctx, context);
  if (bytes_per_second == nullptr) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "bytes_per_second out-pointer is NULL");
  }
  if (buffer_bytes < kMinBufferBytes || buffer_bytes > (size_t{1} << 40)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "buffer_bytes = %zu is outside [%zu, 2^40]",
              buffer_bytes, kMinBufferBytes);
  }
  if (repetitions == 0) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "repetitions is 0");

  const size_t total = buffer_bytes / 64 * 64;
  // Pages of the kind qmoe_alloc_weight_memory gives (huge where the OS allows): the roof is
  // then a property of DRAM, not of page walks, and matches what weights are read from.
  void* buffer = allocate_streaming_memory(total);
  if (buffer == nullptr) QMOE_FAIL(QMOE_STATUS_OUT_OF_MEMORY, "allocating %zu bytes failed", total);

  ReadSlices work(ctx->kernels().read_bandwidth.fn, static_cast<const unsigned char*>(buffer),
                  total, slice_count(*ctx, total, use_all_threads));
  // With one slice the work runs inline on this thread.
  ctx->parallel_for(&ReadSlices::fill, &work, work.slices);
  *bytes_per_second = best_pass(*ctx, work, repetitions);
  free_streaming_memory(buffer);
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_measure_read_bandwidth_over(qmoe_context* context, const void* data,
                                                      size_t bytes, uint32_t repetitions,
                                                      int use_all_threads,
                                                      double* bytes_per_second) {
  using namespace qmoe;
  QMOE_RESOLVE_CONTEXT(ctx, context);
  if (bytes_per_second == nullptr) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "bytes_per_second out-pointer is NULL");
  }
  if (data == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "data is NULL");
  const auto address = reinterpret_cast<uintptr_t>(data);
  if (bytes > UINTPTR_MAX - address) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "data + bytes (%zu) wraps around the address space",
              bytes);
  }
  if (repetitions == 0) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "repetitions is 0");
  // The read kernel takes whole 64-byte lines: the ones inside [data, data + bytes). (lead
  // counts the bytes before the first one; no sum below can wrap.)
  const size_t lead = (64 - (address & 63)) & 63;
  const size_t lines_bytes = bytes > lead ? (bytes - lead) & ~size_t{63} : 0;
  if (lines_bytes < kMinBufferBytes) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
              "[data, data + %zu) holds %zu bytes of whole 64-byte lines; at least %zu needed",
              bytes, lines_bytes, kMinBufferBytes);
  }

  ReadSlices work(ctx->kernels().read_bandwidth.fn, static_cast<const unsigned char*>(data) + lead,
                  lines_bytes, slice_count(*ctx, lines_bytes, use_all_threads));
  *bytes_per_second = best_pass(*ctx, work, repetitions);
  return QMOE_STATUS_OK;
}

}  // extern "C"
