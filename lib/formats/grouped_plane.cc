#include "lib/formats/grouped_plane.h"

#include <cstdint>
#include <cstring>

#include "lib/error.h"
#include "lib/formats/int4_layout.h"
#include "lib/formats/quant_matrix.h"
#include "lib/memory_ranges.h"

namespace qmoe {

size_t grouped_plane_elements(uint32_t n, uint32_t blocks) {
  if (n == 0 || blocks == 0) return 0;
  const size_t rows = size_t{qmoe::row_groups(n)} * qmoe::kGroupRows;
  if (rows > SIZE_MAX / blocks) return 0;
  return rows * blocks;
}

qmoe_status group_plane(const char* function, const void* src, uint32_t n, uint32_t blocks,
                        size_t element_bytes, size_t src_row_stride, size_t src_block_stride,
                        size_t src_group_stride, void* dst, size_t dst_bytes) {
  if (src == nullptr || dst == nullptr) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s is NULL",
                src == nullptr ? "src" : "dst");
  }
  if (n == 0 || blocks == 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "n = %u and blocks = %u must be >= 1", n,
                blocks);
  }
  if (element_bytes != 1 && element_bytes != 2 && element_bytes != 4) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "element_bytes = %zu is not 1, 2 or 4",
                element_bytes);
  }
  if (!grouped_plane_strides_fit(n, blocks, src_row_stride, src_block_stride, src_group_stride)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "src strides (row %zu, block %zu, group %zu) do not describe an [n=%u, blocks=%u] "
                "plane",
                src_row_stride, src_block_stride, src_group_stride, n, blocks);
  }
  const size_t elements = grouped_plane_elements(n, blocks);
  if (elements == 0 || elements > SIZE_MAX / element_bytes ||
      dst_bytes < elements * element_bytes) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "dst_bytes = %zu, the grouped plane needs %zu x %zu", dst_bytes, elements,
                element_bytes);
  }
  // plane_strides_fit bounds each stride by 2^48, not a stride times up to 2^32 rows.
  size_t src_extent = 0;
  if (!plane_bytes(src, n, blocks, src_row_stride, src_block_stride, src_group_stride,
                   element_bytes, &src_extent)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "src strides (row %zu, block %zu) for %u rows run past the end of the address "
                "space",
                src_row_stride, src_block_stride, n);
  }
  if (ranges_overlap(src, src_extent, dst, elements * element_bytes)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "src and dst overlap");
  }
  const auto* in = static_cast<const unsigned char*>(src);
  auto* out = static_cast<unsigned char*>(dst);
  std::memset(out, 0, elements * element_bytes);  // padding rows of the last group
  for (uint32_t r = 0; r < n; ++r) {
    const size_t group_base = size_t{r / kGroupRows} * kGroupRows * blocks + r % kGroupRows;
    for (uint32_t b = 0; b < blocks; ++b) {
      std::memcpy(out + (group_base + size_t{b} * kGroupRows) * element_bytes,
                  in + (plane_row_offset(r, src_row_stride, src_group_stride) +
                        size_t{b} * src_block_stride) *
                           element_bytes,
                  element_bytes);
    }
  }
  return QMOE_STATUS_OK;
}

}  // namespace qmoe
