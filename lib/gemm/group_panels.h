// The small per-group panels the GEMM driver builds when it cannot hand a kernel the caller's
// planes in place (lib/gemm/group_args.h says when): a group's scales widened to FP32 and its
// zero points, each [block][8], and its bias as 8 FP32 values.
#ifndef QMOE_LIB_GEMM_GROUP_PANELS_H_
#define QMOE_LIB_GEMM_GROUP_PANELS_H_

#include <cstddef>
#include <cstdint>

#include "lib/cpu/kernel_table.h"
#include "lib/gemm/gemm_plan.h"
#include "qmoe/qmoe.h"

namespace qmoe {

/// Elements of one group panel: panel_blocks * 8.
size_t panel_elements(const GemmPlan& plan);

/// Scales (fp32; 16-bit and one-byte types decoded) and zero points of rows [n0, n0 + rows) for
/// blocks [0, blocks) as [block][8] panels; rows past `rows` and blocks past K / block_size get
/// scale 0 and the format's default zero point.
/// `zero_points` may be nullptr when the matrix has none. `staging` holds blocks * 8 elements
/// (16-bit scales are gathered there, then widened in one conversion call).
void build_group_panels(const GemmPlan& plan, const KernelTable& kernels, uint32_t n0,
                        uint32_t rows, uint32_t blocks, float* scales, uint16_t* staging,
                        uint8_t* zero_points);

/// bias[n0 + r] as fp32 for r < rows, 0 for r in [rows, 8).
void load_bias(const qmoe_quant_matrix& w, const KernelTable& kernels, uint32_t n0, uint32_t rows,
               float bias[8]);

}  // namespace qmoe

#endif  // QMOE_LIB_GEMM_GROUP_PANELS_H_
