// A weight matrix ready for the GEMM driver: validated once (per qmoe_gemm call, or once per
// expert when an expert set is created), with its format's traits and the constants every call
// on it needs. Holds the caller's pointers, never the weights themselves.
#ifndef QMOE_LIB_GEMM_GEMM_PLAN_H_
#define QMOE_LIB_GEMM_GEMM_PLAN_H_

#include <cstddef>
#include <cstdint>

#include "lib/formats/format_traits.h"
#include "qmoe/qmoe.h"

namespace qmoe {

struct GemmPlan {
  qmoe_quant_matrix w;         // validated copy, defaults filled for an older caller's struct
  const FormatTraits* format;  // w.format's traits
  uint32_t chunks;             // ceil(k / 32): tiles along k of one row group
  uint32_t tile_bytes;         // bytes of one tile (format)
  uint32_t panel_blocks;       // scale blocks of one group panel: ceil(chunks * 32 / block_size)
  bool direct_planes;          // full groups read scales and zero points in place (no panel)
};

/// Validate `in` (a failure message names `function`) and build its plan.
qmoe_status make_gemm_plan(const qmoe_quant_matrix* in, const char* function, GemmPlan* plan);

/// Bytes of per-thread scratch run_gemm_rows needs for `plan` (group panels); a multiple of 64.
size_t gemm_row_scratch_bytes(const GemmPlan& plan);

}  // namespace qmoe

#endif  // QMOE_LIB_GEMM_GEMM_PLAN_H_
