// The GEMM driver's one entry: any range of output rows of one matrix for any run of prepared
// activation rows, on the calling thread (no parallel_for inside, so qmoe_gemm's column split
// and the MoE executor's expert x row split both call it from their parallel tasks). The
// format and accuracy pick the kernel; callers do not change when a format is added.
#ifndef QMOE_LIB_GEMM_GEMM_ROWS_H_
#define QMOE_LIB_GEMM_GEMM_ROWS_H_

#include <cstddef>
#include <cstdint>

#include "lib/cpu/kernel_table.h"
#include "lib/gemm/activation_rows.h"
#include "lib/gemm/gemm_plan.h"

namespace qmoe {

/// Y[i, n] = sum_k X[first + i, k] * W[n, k] (+ bias[n]) for i < m and n in [n_begin, n_end),
/// Y row i at y + i * ldy; writes nothing else. Runs the groups that cover [n_begin, n_end) on
/// the calling thread with the kernel of acts.accuracy. `scratch` holds
/// gemm_row_scratch_bytes(plan) bytes, 64-byte aligned, private to the calling thread.
void run_gemm_rows(const GemmPlan& plan, const KernelTable& kernels, const ActivationView& acts,
                   size_t first, uint32_t m, float* y, size_t ldy, uint32_t n_begin, uint32_t n_end,
                   unsigned char* scratch);

}  // namespace qmoe

#endif  // QMOE_LIB_GEMM_GEMM_ROWS_H_
