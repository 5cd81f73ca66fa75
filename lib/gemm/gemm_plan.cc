#include "lib/gemm/gemm_plan.h"

#include "lib/formats/quant_matrix.h"
#include "lib/gemm/group_panels.h"
#include "lib/memory_ranges.h"

namespace qmoe {

qmoe_status make_gemm_plan(const qmoe_quant_matrix* in, const char* function, GemmPlan* plan) {
  GemmPlan p{};
  if (qmoe_status s = validate_quant_matrix(in, function, &p.w); s != QMOE_STATUS_OK) return s;
  p.format = find_format(p.w.format);  // validated: a format this build implements
  p.chunks = chunk_count(p.w.k);
  p.tile_bytes = tile_bytes(*p.format);
  const size_t padded_k = size_t{p.chunks} * kChunkCodes;
  p.panel_blocks = static_cast<uint32_t>((padded_k + p.w.block_size - 1) / p.w.block_size);
  // Direct plane access needs 8 consecutive rows per block in the caller's planes, and no
  // half-filled last chunk (whose missing block must read as scale 0).
  const bool scales_direct = p.w.scale_row_stride == 1;
  const bool zeros_direct = p.w.zero_points == nullptr || p.w.zero_point_row_stride == 1;
  p.direct_planes = scales_direct && zeros_direct && padded_k == p.w.k;
  *plan = p;
  return QMOE_STATUS_OK;
}

size_t gemm_row_scratch_bytes(const GemmPlan& plan) {
  // Every group full and read in place (run_gemm_rows): no panel, so no scratch. At a large K
  // the panels are big (56 bytes per block of 8 rows, per task), and reserving them for planes
  // that never need them once made such calls fail with QMOE_STATUS_OUT_OF_MEMORY.
  if (plan.direct_planes && plan.w.n % kGroupRows == 0) return 0;
  const size_t n = panel_elements(plan);
  return align64(n * sizeof(float)) + align64(n) + align64(n * sizeof(uint16_t));
}

}  // namespace qmoe
