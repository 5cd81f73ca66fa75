// The C ABI of the row conversions: argument checks, then the context's kernel, split over
// its threads for long rows.
#include <cstdint>

#include "lib/context.h"
#include "lib/error.h"
#include "lib/memory_ranges.h"

namespace qmoe {
namespace {

// Rows shorter than this run on the calling thread: waking workers costs more than the
// conversion. Chunks are multiples of 64 elements so no two threads share a cache line of
// the destination.
constexpr size_t kMinElementsPerTask = 32 * 1024;
constexpr size_t kChunkAlignment = 64;

template <typename Src, typename Dst>
struct ConversionTask {
  void (*kernel)(const Src*, Dst*, size_t);
  const Src* src;
  Dst* dst;
  size_t n;
  size_t chunk;

  static void run(void* state, size_t index) {
    const auto* t = static_cast<const ConversionTask*>(state);
    const size_t begin = index * t->chunk;
    const size_t count = t->n - begin < t->chunk ? t->n - begin : t->chunk;
    t->kernel(t->src + begin, t->dst + begin, count);
  }
};

template <typename Src, typename Dst, typename Entry>
qmoe_status run_conversion(const char* function, qmoe_context* handle, const Src* src, Dst* dst,
                           size_t n, Entry KernelTable::*entry) {
  Context* ctx = nullptr;
  if (qmoe_status s = resolve_context(handle, function, &ctx); s != QMOE_STATUS_OK) return s;
  if (n == 0) return QMOE_STATUS_OK;
  if (src == nullptr || dst == nullptr) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s is NULL with n = %zu",
                src == nullptr ? "src" : "dst", n);
  }
  if (n > SIZE_MAX / sizeof(float)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "n = %zu is too large", n);
  }
  if (ranges_overlap(src, n * sizeof(Src), dst, n * sizeof(Dst))) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "src and dst overlap");
  }

  ConversionTask<Src, Dst> task{(ctx->kernels().*entry).fn, src, dst, n, n};
  const size_t threads = ctx->num_threads();
  if (threads > 1 && n >= 2 * kMinElementsPerTask) {
    size_t chunk = (n + threads - 1) / threads;
    if (chunk < kMinElementsPerTask) chunk = kMinElementsPerTask;
    task.chunk = (chunk + kChunkAlignment - 1) / kChunkAlignment * kChunkAlignment;
  }
  ctx->parallel_for(&ConversionTask<Src, Dst>::run, &task, (n + task.chunk - 1) / task.chunk);
  return QMOE_STATUS_OK;
}

}  // namespace
}  // namespace qmoe

extern "C" {

QMOE_API qmoe_status qmoe_convert_f16_to_f32(qmoe_context* context, const uint16_t* src, float* dst,
                                             size_t n) {
  return qmoe::run_conversion(__func__, context, src, dst, n,
                              &qmoe::KernelTable::convert_f16_to_f32);
}

QMOE_API qmoe_status qmoe_convert_f32_to_f16(qmoe_context* context, const float* src, uint16_t* dst,
                                             size_t n) {
  return qmoe::run_conversion(__func__, context, src, dst, n,
                              &qmoe::KernelTable::convert_f32_to_f16);
}

QMOE_API qmoe_status qmoe_convert_bf16_to_f32(qmoe_context* context, const uint16_t* src,
                                              float* dst, size_t n) {
  return qmoe::run_conversion(__func__, context, src, dst, n,
                              &qmoe::KernelTable::convert_bf16_to_f32);
}

QMOE_API qmoe_status qmoe_convert_f32_to_bf16(qmoe_context* context, const float* src,
                                              uint16_t* dst, size_t n) {
  return qmoe::run_conversion(__func__, context, src, dst, n,
                              &qmoe::KernelTable::convert_f32_to_bf16);
}

}  // extern "C"
