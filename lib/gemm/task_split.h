// How a parallel phase (qmoe_gemm's columns, the MoE layer's FC1, FC2 and combine) is cut
// into tasks for the context's threads.
#ifndef QMOE_LIB_GEMM_TASK_SPLIT_H_
#define QMOE_LIB_GEMM_TASK_SPLIT_H_

#include <cstddef>
#include <cstdint>

namespace qmoe {

/// With more than one thread, parallel phases split into up to this many tasks per thread:
/// the pool hands unstarted tasks to whichever thread is free (pthreadpool steals work), so a
/// worker the OS has descheduled (an oversubscribed host) delays a call by one small task, not
/// by its whole share, and a phase ends with a short tail however unevenly the threads' memory
/// streams ran. pthreadpool gives each thread a contiguous range of task indices, so a thread
/// still reads one sequential stream. Every output is still computed by one kernel call over
/// the whole K, so the split never changes a result. 16 rather than 4: the finer split shortens
/// the last thread's tail at no measurable cost (docs/results/2026-11-30-moe-layer-and-decode.md
/// and docs/results/2026-11-30-int4-gemm-limits.md have the measurements).
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

}  // namespace qmoe

#endif  // QMOE_LIB_GEMM_TASK_SPLIT_H_
