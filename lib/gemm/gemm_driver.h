// The dequant-GEMM driver shared by qmoe_gemm and the MoE layer.
//
// Three pieces, so a caller can schedule the work itself (qmoe_gemm splits one matrix's
// columns over threads; the MoE executor splits experts x row ranges):
//  - GemmPlan: a validated weight matrix and the constants every call on it needs, built once
//    (per qmoe_gemm call, or once per expert when an expert set is created).
//  - Activation rows: X prepared once for an accuracy level and a K (FP32 rows padded to whole
//    chunks for the exact level, int8 rows with per-chunk scales for the fast level), then read
//    by every matrix of that K. Rows can be gathered (copied) and written chunk by chunk.
//  - run_gemm_rows: any range of output rows of one matrix for any run of prepared rows, on the
//    calling thread (no parallel_for inside, so it is callable from a parallel task).
//
// The format switch lives here and only here: a new weight format adds a case to the plan and
// its kernels to the table; callers (qmoe_gemm, the MoE layer) do not change.
#ifndef QMOE_LIB_GEMM_GEMM_DRIVER_H_
#define QMOE_LIB_GEMM_GEMM_DRIVER_H_

#include <cstddef>
#include <cstdint>

#include "lib/cpu/kernel_table.h"
#include "lib/formats/int4_layout.h"
#include "qmoe/qmoe.h"

namespace qmoe {

/// A validated weight matrix. Holds the caller's pointers (never the weights themselves).
struct GemmPlan {
  qmoe_quant_matrix w;    // validated copy, defaults filled for an older caller's struct
  uint32_t chunks;        // ceil(k / 32)
  uint32_t panel_blocks;  // scale blocks of one group panel: ceil(chunks * 32 / block_size)
  bool direct_planes;     // full groups read scales and zero points in place (no panel)
};

/// Validate `in` (a failure message names `function`) and build its plan.
qmoe_status make_gemm_plan(const qmoe_quant_matrix* in, const char* function, GemmPlan* plan);

/// Bytes of per-thread scratch run_gemm_rows needs for `plan` (group panels); a multiple of 64.
size_t gemm_row_scratch_bytes(const GemmPlan& plan);

/// Read-only prepared activation rows of one accuracy level and K. Row r is, at the exact
/// level, chunks * 32 floats at x + r * x_stride, zero past K; at the fast level, chunks * 32
/// int8 at q + r * q_stride with scale and sum_q at + r * chunks (see Q8Activations).
struct ActivationView {
  qmoe_accuracy accuracy;
  uint32_t k;
  uint32_t chunks;
  const float* x;
  size_t x_stride;  // floats
  const int8_t* q;
  const float* scale;
  const float* sum_q;
  size_t q_stride;  // bytes
};

/// Writable storage for `capacity` prepared rows, carved from caller scratch.
struct ActivationRows {
  qmoe_accuracy accuracy;
  uint32_t k;
  uint32_t chunks;
  float* x;   // exact level
  int8_t* q;  // fast level
  float* scale;
  float* sum_q;
  size_t stride;  // chunks * 32: floats of an exact row, bytes of a fast row
};

/// Bytes of storage for `capacity` rows of (accuracy, k); a multiple of 64.
size_t activation_rows_bytes(qmoe_accuracy accuracy, uint32_t k, size_t capacity);

/// Lay out `capacity` rows in `storage` (64-byte aligned, activation_rows_bytes long).
ActivationRows carve_activation_rows(qmoe_accuracy accuracy, uint32_t k, size_t capacity,
                                     unsigned char* storage);

/// The caller's FP32 rows used in place: exact level with k a multiple of 32 only.
ActivationView direct_activation_view(const float* x, size_t ldx, uint32_t k);

ActivationView view_of(const ActivationRows& rows);

/// Prepare rows [first, first + m) of `rows` from X rows x + i * ldx (k floats each).
void prepare_activation_rows(const KernelTable& kernels, const ActivationRows& rows, size_t first,
                             uint32_t m, const float* x, size_t ldx);

/// prepare_activation_rows from X rows of `dtype` (F32, F16 or BF16) at x + i * ldx elements:
/// 16-bit rows are widened 32 values at a time and prepared chunk by chunk, which gives the
/// rows prepared from the widened X (see prepare_activation_chunk).
void prepare_activation_rows_typed(const KernelTable& kernels, const ActivationRows& rows,
                                   size_t first, uint32_t m, qmoe_dtype dtype, const void* x,
                                   size_t ldx);

/// Prepare chunk `chunk` (k in [32 * chunk, 32 * chunk + len), len <= 32 and the rest of the
/// row) of row `row` from `values`. Chunks of one row are independent: a row written chunk by
/// chunk equals the row prepared at once.
void prepare_activation_chunk(const KernelTable& kernels, const ActivationRows& rows, size_t row,
                              uint32_t chunk, const float* values, uint32_t len);

/// Copy prepared row `src_row` of `src` to row `dst_row` of `dst` (same accuracy and k).
void copy_activation_row(const ActivationView& src, size_t src_row, const ActivationRows& dst,
                         size_t dst_row);

/// Y[i, n] = sum_k X[first + i, k] * W[n, k] (+ bias[n]) for i < m and n in [n_begin, n_end),
/// Y row i at y + i * ldy; writes nothing else. Runs the groups that cover [n_begin, n_end) on
/// the calling thread with the kernel of acts.accuracy. `scratch` holds
/// gemm_row_scratch_bytes(plan) bytes, 64-byte aligned, private to the calling thread.
void run_gemm_rows(const GemmPlan& plan, const KernelTable& kernels, const ActivationView& acts,
                   size_t first, uint32_t m, float* y, size_t ldy, uint32_t n_begin, uint32_t n_end,
                   unsigned char* scratch);

/// With more than one thread, parallel phases split into up to this many tasks per thread:
/// the pool hands unstarted tasks to whichever thread is free (pthreadpool steals work), so a
/// worker the OS has descheduled (an oversubscribed host) delays a call by one small task, not
/// by its whole share, and a phase ends with a short tail however unevenly the threads' memory
/// streams ran. pthreadpool gives each thread a contiguous range of task indices, so a thread
/// still reads one sequential stream. Every output is still computed by one kernel call over
/// the whole K, so the split never changes a result. 16 rather than 4: 16-thread decode on the
/// device host moved 100 -> 107 GB/s (3 alternating runs each), 4 threads no change.
/// Overridable at build time (-DQMOE_TASKS_PER_THREAD=N) for tuning runs.
#ifndef QMOE_TASKS_PER_THREAD
#define QMOE_TASKS_PER_THREAD 16
#endif
inline constexpr uint32_t kTasksPerThread = QMOE_TASKS_PER_THREAD;

/// Tasks for a phase of `units` indivisible units and `work` cost: one per thread (times
/// kTasksPerThread when threads > 1), at most `units`, and at least `min_work` each.
inline uint32_t parallel_task_count(uint32_t threads, size_t units, size_t work, size_t min_work) {
  const size_t most = threads > 1 ? size_t{threads} * kTasksPerThread : 1;
  size_t tasks = work / min_work;
  if (tasks > most) tasks = most;
  if (tasks > units) tasks = units;
  return static_cast<uint32_t>(tasks > 1 ? tasks : 1);
}

/// Most tasks parallel_task_count gives on `threads` threads (sizes per-task scratch).
inline size_t max_parallel_tasks(uint32_t threads) {
  return threads > 1 ? size_t{threads} * kTasksPerThread : 1;
}

/// (value + 63) & ~63, for carving 64-byte aligned pieces.
constexpr size_t align64(size_t value) {
  return (value + 63) & ~size_t{63};
}

}  // namespace qmoe

#endif  // QMOE_LIB_GEMM_GEMM_DRIVER_H_
