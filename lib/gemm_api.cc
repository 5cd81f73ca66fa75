// qmoe_gemm: argument checks, activation preparation, and the split of the output columns over
// the context's threads. The per-ISA kernels compute one 8-row group at a time.
#include <algorithm>
#include <cstring>
#include <vector>

#include "lib/context.h"
#include "lib/error.h"
#include "lib/quant_layout.h"
#include "lib/quant_matrix.h"

namespace qmoe {
namespace {

// Reusable per-thread scratch (the calling thread for activations, each worker for panels):
// grows to the largest call seen and is never shrunk, so steady-state calls do not allocate.
template <typename T>
T* scratch(std::vector<T>& buffer, size_t count) {
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

thread_local std::vector<float> t_x_padded;
thread_local std::vector<int8_t> t_xq;
thread_local std::vector<float> t_x_scale;
thread_local std::vector<float> t_x_sum;
thread_local std::vector<float> t_scale_panel;
thread_local std::vector<uint8_t> t_zero_panel;
thread_local std::vector<uint16_t> t_scale_staging;

struct GemmTask {
  const qmoe_quant_matrix* w;
  const KernelTable* kernels;
  GemmInt4GroupFn kernel;
  uint32_t chunks;
  uint32_t panel_blocks;
  bool direct_planes;  // full groups read scales/zero points in place (see Int4GroupArgs)
  uint32_t n_begin, n_end;
  uint32_t group_begin, group_count;
  uint32_t tasks;
  Int4GroupArgs base;  // the per-call fields (m, x, xq, ldy, dtype)
  float* y;            // Y[0, 0]

  void run_group(uint32_t g) const {
    const uint32_t n0 = g * kGroupRows;
    const uint32_t rows = std::min(kGroupRows, w->n - n0);
    Int4GroupArgs a = base;
    a.codes = static_cast<const uint8_t*>(w->codes) + size_t{g} * chunks * kChunkBytes;
    a.row_begin = n_begin > n0 ? n_begin - n0 : 0;
    a.row_end = std::min(n_end - n0, kGroupRows);
    a.y = y + n0;
    if (direct_planes && rows == kGroupRows) {
      a.scales =
          static_cast<const unsigned char*>(w->scales) + size_t{n0} * dtype_size(w->scale_dtype);
      a.scale_block_stride = w->scale_block_stride;
      a.zero_points = w->zero_points != nullptr ? w->zero_points + n0 : nullptr;
      a.zero_point_block_stride = w->zero_point_block_stride;
    } else {
      float* scales = scratch(t_scale_panel, size_t{panel_blocks} * kGroupRows);
      uint8_t* zeros = w->zero_points != nullptr
                           ? scratch(t_zero_panel, size_t{panel_blocks} * kGroupRows)
                           : nullptr;
      uint16_t* staging = scratch(t_scale_staging, size_t{panel_blocks} * kGroupRows);
      build_group_panels(*w, *kernels, n0, rows, panel_blocks, scales, staging, zeros);
      a.scale_dtype = QMOE_DTYPE_F32;
      a.scales = scales;
      a.scale_block_stride = kGroupRows;
      a.zero_points = zeros;
      a.zero_point_block_stride = kGroupRows;
    }
    float bias[kGroupRows];
    if (w->bias != nullptr) {
      load_bias(*w, *kernels, n0, rows, bias);
      a.bias = bias;
    }
    kernel(a);
  }

  // Task t computes a contiguous run of groups: each thread reads one sequential stream.
  static void run(void* state, size_t t) {
    const auto* task = static_cast<const GemmTask*>(state);
    const uint32_t first =
        task->group_begin + static_cast<uint32_t>(size_t{task->group_count} * t / task->tasks);
    const uint32_t last = task->group_begin +
                          static_cast<uint32_t>(size_t{task->group_count} * (t + 1) / task->tasks);
    for (uint32_t g = first; g < last; ++g) task->run_group(g);
  }
};

}  // namespace
}  // namespace qmoe

extern "C" {

QMOE_API qmoe_status qmoe_gemm(qmoe_context* context, const qmoe_quant_matrix* weights,
                               qmoe_accuracy accuracy, uint32_t m, const float* x, size_t ldx,
                               float* y, size_t ldy, uint32_t n_begin, uint32_t n_end) {
  using namespace qmoe;
  QMOE_RESOLVE_CONTEXT(ctx, context);
  qmoe_quant_matrix w;
  if (qmoe_status s = validate_quant_matrix(weights, __func__, &w); s != QMOE_STATUS_OK) {
    return s;
  }
  if (accuracy != QMOE_ACCURACY_EXACT && accuracy != QMOE_ACCURACY_FAST) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "accuracy %d is not a qmoe_accuracy",
              static_cast<int>(accuracy));
  }
  if (m == 0) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "m is 0");
  if (x == nullptr || y == nullptr) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "%s is NULL", x == nullptr ? "x" : "y");
  }
  if (n_begin >= n_end || n_end > w.n) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "column range [%u, %u) is empty or outside [0, %u)",
              n_begin, n_end, w.n);
  }
  if (m > 1 && (ldx < w.k || ldy < n_end)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
              "ldx = %zu must be >= k = %u and ldy = %zu >= n_end = %u", ldx, w.k, ldy, n_end);
  }
  const size_t x_elems = size_t{m - 1} * ldx + w.k;
  const size_t y_elems = size_t{m - 1} * ldy + n_end;
  if (m > 1 && (ldx > SIZE_MAX / sizeof(float) / m || ldy > SIZE_MAX / sizeof(float) / m)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "m * ld overflows");
  }
  {
    const auto x0 = reinterpret_cast<uintptr_t>(x), y0 = reinterpret_cast<uintptr_t>(y + n_begin);
    const uintptr_t x1 = x0 + x_elems * sizeof(float),
                    y1 = reinterpret_cast<uintptr_t>(y + y_elems);
    if (x0 < y1 && y0 < x1) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "x and y overlap");
  }

  const uint32_t chunks = (w.k + kChunkCodes - 1) / kChunkCodes;
  const size_t padded_k = size_t{chunks} * kChunkCodes;
  GemmTask task{};
  task.w = &w;
  task.kernels = &ctx->kernels();
  task.chunks = chunks;
  task.panel_blocks = static_cast<uint32_t>((padded_k + w.block_size - 1) / w.block_size);
  task.n_begin = n_begin;
  task.n_end = n_end;
  task.group_begin = n_begin / kGroupRows;
  task.group_count = (n_end + kGroupRows - 1) / kGroupRows - task.group_begin;
  task.y = y;
  Int4GroupArgs& a = task.base;
  a.chunks = chunks;
  a.block_size = w.block_size;
  a.scale_dtype = w.scale_dtype;
  a.m = m;
  a.ldy = m > 1 ? ldy : 0;

  if (accuracy == QMOE_ACCURACY_EXACT) {
    task.kernel = ctx->kernels().gemm_int4_exact.fn;
    if (padded_k == w.k) {
      a.x = x;
      a.ldx = m > 1 ? ldx : 0;
    } else {
      // Kernels read whole chunks: copy X with a zero tail (only when K % 32 != 0).
      float* padded = scratch(t_x_padded, m * padded_k);
      for (uint32_t i = 0; i < m; ++i) {
        std::memcpy(padded + i * padded_k, x + i * ldx, w.k * sizeof(float));
        std::memset(padded + i * padded_k + w.k, 0, (padded_k - w.k) * sizeof(float));
      }
      a.x = padded;
      a.ldx = padded_k;
    }
  } else {
    task.kernel = ctx->kernels().gemm_int4_fast.fn;
    int8_t* q = scratch(t_xq, m * padded_k);
    float* scale = scratch(t_x_scale, size_t{m} * chunks);
    float* sum = scratch(t_x_sum, size_t{m} * chunks);
    const QuantizeActivationsQ8Fn quantize = ctx->kernels().quantize_activations_q8.fn;
    for (uint32_t i = 0; i < m; ++i) {
      quantize(x + i * ldx, w.k, q + i * padded_k, scale + size_t{i} * chunks,
               sum + size_t{i} * chunks);
    }
    a.xq = Q8Activations{q, scale, sum, padded_k, chunks};
  }

  // Direct plane access needs 8 consecutive rows per block in the caller's planes.
  const bool scales_direct = w.scale_row_stride == 1;
  const bool zeros_direct = w.zero_points == nullptr || w.zero_point_row_stride == 1;
  task.direct_planes = scales_direct && zeros_direct && padded_k == w.k;

  // One task per thread, each a contiguous run of groups; small problems stay on one thread.
  const uint32_t threads = ctx->num_threads();
  const size_t work = size_t{task.group_count} * chunks * m;
  constexpr size_t kMinChunksPerTask = 64;  // ~8 KiB of codes: below that, waking costs more
  task.tasks = static_cast<uint32_t>(
      std::max<size_t>(1, std::min<size_t>({threads, task.group_count, work / kMinChunksPerTask})));
  ctx->parallel_for(&GemmTask::run, &task, task.tasks);
  return QMOE_STATUS_OK;
}

}  // extern "C"
