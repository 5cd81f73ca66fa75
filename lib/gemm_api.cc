// qmoe_gemm and qmoe_gemm_typed: argument checks, then the shared driver (lib/gemm/gemm_rows.h):
// activations prepared once per call, the output columns split over the context's threads by
// 8-row groups. A 16-bit X is widened to FP32 chunk by chunk as it is prepared, and a 16-bit Y
// is computed into FP32 staging rows and rounded by each task, so the typed call gives the bits
// of qmoe_convert_*_to_f32, qmoe_gemm and qmoe_convert_f32_to_* in turn.
#include <algorithm>
#include <cstdint>

#include "lib/context.h"
#include "lib/error.h"
#include "lib/formats/quant_matrix.h"
#include "lib/gemm/activation_dtype.h"
#include "lib/gemm/activation_rows.h"
#include "lib/gemm/gemm_plan.h"
#include "lib/gemm/gemm_rows.h"
#include "lib/gemm/task_split.h"
#include "lib/memory_ranges.h"

namespace qmoe {
namespace {

struct GemmTask {
  const GemmPlan* plan;
  const KernelTable* kernels;
  ActivationView acts;
  uint32_t m;
  float* y;  // Y[0, 0] in FP32: the caller's Y, or the staging rows when y_dtype is 16-bit
  size_t ldy;
  qmoe_dtype y_dtype;
  void* y_out;  // the caller's 16-bit Y (y_dtype F16 or BF16), rows ldy_out elements apart
  size_t ldy_out;
  uint32_t n_begin, n_end;
  uint32_t group_begin, group_count;
  uint32_t tasks;
  unsigned char* scratch;  // tasks slices of scratch_stride bytes
  size_t scratch_stride;

  // Task t computes a contiguous run of groups: each thread reads one sequential stream. With
  // a 16-bit Y it then rounds its own columns out of the staging rows while they are in cache.
  static void run(void* state, size_t t) {
    const auto* task = static_cast<const GemmTask*>(state);
    const uint32_t first =
        task->group_begin + static_cast<uint32_t>(size_t{task->group_count} * t / task->tasks);
    const uint32_t last = task->group_begin +
                          static_cast<uint32_t>(size_t{task->group_count} * (t + 1) / task->tasks);
    if (first == last) return;
    const auto n0 =
        static_cast<uint32_t>(std::max<size_t>(task->n_begin, size_t{first} * kGroupRows));
    const auto n1 = static_cast<uint32_t>(std::min<size_t>(task->n_end, size_t{last} * kGroupRows));
    run_gemm_rows(*task->plan, *task->kernels, task->acts, 0, task->m, task->y, task->ldy, n0, n1,
                  task->scratch + t * task->scratch_stride);
    if (task->y_dtype == QMOE_DTYPE_F32) return;
    for (uint32_t i = 0; i < task->m; ++i) {
      narrow_activations(*task->kernels, task->y_dtype, task->y + i * task->ldy + n0,
                         activation_at(task->y_out, task->y_dtype, i * task->ldy_out + n0),
                         n1 - n0);
    }
  }
};

// qmoe_gemm and qmoe_gemm_typed; `function` names the entry point in failure messages.
qmoe_status gemm(const char* function, qmoe_context* context, const qmoe_quant_matrix* weights,
                 qmoe_accuracy accuracy, uint32_t m, qmoe_dtype x_dtype, const void* x, size_t ldx,
                 qmoe_dtype y_dtype, void* y, size_t ldy, uint32_t n_begin, uint32_t n_end) {
  Context* ctx = nullptr;
  if (qmoe_status s = resolve_context(context, function, &ctx); s != QMOE_STATUS_OK) return s;
  GemmPlan plan;
  if (qmoe_status s = make_gemm_plan(weights, function, &plan); s != QMOE_STATUS_OK) return s;
  const qmoe_quant_matrix& w = plan.w;
  if (accuracy != QMOE_ACCURACY_EXACT && accuracy != QMOE_ACCURACY_FAST) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "accuracy %d is not a qmoe_accuracy",
                static_cast<int>(accuracy));
  }
  if (!is_activation_dtype(x_dtype) || !is_activation_dtype(y_dtype)) {
    const bool bad_x = !is_activation_dtype(x_dtype);
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s %d is not a qmoe_dtype",
                bad_x ? "x_dtype" : "y_dtype", static_cast<int>(bad_x ? x_dtype : y_dtype));
  }
  if (m == 0) return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "m is 0");
  if (x == nullptr || y == nullptr) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s is NULL", x == nullptr ? "x" : "y");
  }
  if (n_begin >= n_end || n_end > w.n) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "column range [%u, %u) is empty or outside [0, %u)", n_begin, n_end, w.n);
  }
  if (m > 1 && (ldx < w.k || ldy < n_end)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "ldx = %zu must be >= k = %u and ldy = %zu >= n_end = %u", ldx, w.k, ldy, n_end);
  }
  const size_t x_elems = size_t{m - 1} * ldx + w.k;
  const size_t y_elems = size_t{m - 1} * ldy + n_end;
  if (m > 1 && (ldx > SIZE_MAX / sizeof(float) / m || ldy > SIZE_MAX / sizeof(float) / m)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "m * ld overflows");
  }
  // Y's written span starts at column n_begin of row 0.
  const size_t x_size = dtype_size(x_dtype), y_size = dtype_size(y_dtype);
  if (ranges_overlap(x, x_elems * x_size, static_cast<unsigned char*>(y) + n_begin * y_size,
                     (y_elems - n_begin) * y_size)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "x and y overlap");
  }
  if (matrix_overlaps(w, static_cast<unsigned char*>(y) + n_begin * y_size,
                      (y_elems - n_begin) * y_size)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "y overlaps the weights (codes, scales, zero points or bias)");
  }

  // A few tasks per thread (parallel_task_count), each a contiguous run of groups; small
  // problems stay on one thread.
  GemmTask task{};
  task.group_begin = n_begin / kGroupRows;
  task.group_count = row_groups(n_end) - task.group_begin;
  const uint32_t threads = ctx->num_threads();
  const size_t work = size_t{task.group_count} * plan.chunks * m;
  constexpr size_t kMinChunksPerTask = 64;  // ~8 KiB of codes: below that, waking costs more
  task.tasks = parallel_task_count(threads, task.group_count, work, kMinChunksPerTask);

  // Scratch of the context: prepared activations (unless FP32 X is used in place), FP32 staging
  // rows for a 16-bit Y (columns [0, n_end) of each row; a task writes and rounds only its
  // own), then one panel slice per task.
  const bool x_f32 = x_dtype == QMOE_DTYPE_F32, y_f32 = y_dtype == QMOE_DTYPE_F32;
  const bool direct = accuracy == QMOE_ACCURACY_EXACT && w.k % kChunkCodes == 0 && x_f32;
  const size_t act_bytes = direct ? 0 : activation_rows_bytes(accuracy, w.k, m);
  const size_t stage_ldy = m > 1 ? n_end : 0;
  const size_t stage_bytes = y_f32 ? 0 : align64(size_t{m} * n_end * sizeof(float));
  task.scratch_stride = gemm_row_scratch_bytes(plan);
  const ScratchLease lease =
      ctx->acquire_scratch(act_bytes + stage_bytes + task.tasks * task.scratch_stride);
  unsigned char* scratch = lease.data();
  if (scratch == nullptr) {
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "scratch allocation failed");
  }
  if (direct) {
    task.acts = direct_activation_view(static_cast<const float*>(x), ldx, w.k);
  } else {
    const ActivationRows rows = carve_activation_rows(accuracy, w.k, m, scratch);
    prepare_activation_rows_typed(ctx->kernels(), rows, 0, m, x_dtype, x, ldx);
    task.acts = view_of(rows);
  }
  task.plan = &plan;
  task.kernels = &ctx->kernels();
  task.m = m;
  task.y_dtype = y_dtype;
  if (y_f32) {
    task.y = static_cast<float*>(y);
    task.ldy = ldy;
  } else {
    task.y = reinterpret_cast<float*>(scratch + act_bytes);
    task.ldy = stage_ldy;
    task.y_out = y;
    task.ldy_out = ldy;
  }
  task.n_begin = n_begin;
  task.n_end = n_end;
  task.scratch = scratch + act_bytes + stage_bytes;
  ctx->parallel_for(&GemmTask::run, &task, task.tasks);
  return QMOE_STATUS_OK;
}

}  // namespace
}  // namespace qmoe

extern "C" {

QMOE_API qmoe_status qmoe_gemm(qmoe_context* context, const qmoe_quant_matrix* weights,
                               qmoe_accuracy accuracy, uint32_t m, const float* x, size_t ldx,
                               float* y, size_t ldy, uint32_t n_begin, uint32_t n_end) {
  return qmoe::gemm(__func__, context, weights, accuracy, m, QMOE_DTYPE_F32, x, ldx, QMOE_DTYPE_F32,
                    y, ldy, n_begin, n_end);
}

QMOE_API qmoe_status qmoe_gemm_typed(qmoe_context* context, const qmoe_quant_matrix* weights,
                                     qmoe_accuracy accuracy, uint32_t m, qmoe_dtype x_dtype,
                                     const void* x, size_t ldx, qmoe_dtype y_dtype, void* y,
                                     size_t ldy, uint32_t n_begin, uint32_t n_end) {
  return qmoe::gemm(__func__, context, weights, accuracy, m, x_dtype, x, ldx, y_dtype, y, ldy,
                    n_begin, n_end);
}

}  // extern "C"
