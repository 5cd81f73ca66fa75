// qmoe_gemm: argument checks, then the shared driver (lib/gemm_driver.h): activations prepared
// once per call, the output columns split over the context's threads by 8-row groups.
#include <algorithm>

#include "lib/context.h"
#include "lib/error.h"
#include "lib/gemm_driver.h"
#include "lib/memory_ranges.h"

namespace qmoe {
namespace {

struct GemmTask {
  const GemmPlan* plan;
  const KernelTable* kernels;
  ActivationView acts;
  uint32_t m;
  float* y;  // Y[0, 0]
  size_t ldy;
  uint32_t n_begin, n_end;
  uint32_t group_begin, group_count;
  uint32_t tasks;
  unsigned char* scratch;  // tasks slices of scratch_stride bytes
  size_t scratch_stride;

  // Task t computes a contiguous run of groups: each thread reads one sequential stream.
  static void run(void* state, size_t t) {
    const auto* task = static_cast<const GemmTask*>(state);
    const uint32_t first =
        task->group_begin + static_cast<uint32_t>(size_t{task->group_count} * t / task->tasks);
    const uint32_t last = task->group_begin +
                          static_cast<uint32_t>(size_t{task->group_count} * (t + 1) / task->tasks);
    if (first == last) return;
    const uint32_t n0 = std::max(task->n_begin, first * kGroupRows);
    const uint32_t n1 = std::min(task->n_end, last * kGroupRows);
    run_gemm_rows(*task->plan, *task->kernels, task->acts, 0, task->m, task->y, task->ldy, n0, n1,
                  task->scratch + t * task->scratch_stride);
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
  GemmPlan plan;
  if (qmoe_status s = make_gemm_plan(weights, __func__, &plan); s != QMOE_STATUS_OK) return s;
  const qmoe_quant_matrix& w = plan.w;
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
  // Y's written span starts at column n_begin of row 0.
  if (ranges_overlap(x, x_elems * sizeof(float), y + n_begin,
                     (y_elems - n_begin) * sizeof(float))) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "x and y overlap");
  }

  // A few tasks per thread (parallel_task_count), each a contiguous run of groups; small
  // problems stay on one thread.
  GemmTask task{};
  task.group_begin = n_begin / kGroupRows;
  task.group_count = (n_end + kGroupRows - 1) / kGroupRows - task.group_begin;
  const uint32_t threads = ctx->num_threads();
  const size_t work = size_t{task.group_count} * plan.chunks * m;
  constexpr size_t kMinChunksPerTask = 64;  // ~8 KiB of codes: below that, waking costs more
  task.tasks = parallel_task_count(threads, task.group_count, work, kMinChunksPerTask);

  // Scratch of the context: prepared activations (unless X is used in place), then one
  // panel slice per task.
  const bool direct = accuracy == QMOE_ACCURACY_EXACT && w.k % kChunkCodes == 0;
  const size_t act_bytes = direct ? 0 : activation_rows_bytes(accuracy, w.k, m);
  task.scratch_stride = gemm_row_scratch_bytes(plan);
  const ScratchLease lease = ctx->acquire_scratch(act_bytes + task.tasks * task.scratch_stride);
  unsigned char* scratch = lease.data();
  if (scratch == nullptr) QMOE_FAIL(QMOE_STATUS_OUT_OF_MEMORY, "scratch allocation failed");
  if (direct) {
    task.acts = direct_activation_view(x, ldx, w.k);
  } else {
    const ActivationRows rows = carve_activation_rows(accuracy, w.k, m, scratch);
    prepare_activation_rows(ctx->kernels(), rows, 0, m, x, ldx);
    task.acts = view_of(rows);
  }
  task.plan = &plan;
  task.kernels = &ctx->kernels();
  task.m = m;
  task.y = y;
  task.ldy = ldy;
  task.n_begin = n_begin;
  task.n_end = n_end;
  task.scratch = scratch + act_bytes;
  ctx->parallel_for(&GemmTask::run, &task, task.tasks);
  return QMOE_STATUS_OK;
}

}  // extern "C"
