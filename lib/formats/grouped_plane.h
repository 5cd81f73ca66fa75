// Rearranging a strided scale or zero-point plane into the grouped order the kernels stream best
// (docs/formats.md, "grouped order"): qmoe_group_plane and qmoe_grouped_plane_elements.
#ifndef QMOE_LIB_FORMATS_GROUPED_PLANE_H_
#define QMOE_LIB_FORMATS_GROUPED_PLANE_H_

#include <cstddef>
#include <cstdint>

#include "qmoe/qmoe.h"

namespace qmoe {

/// qmoe_grouped_plane_elements.
size_t grouped_plane_elements(uint32_t n, uint32_t blocks);
/// qmoe_group_plane, and also from a source plane with a group stride (element (r, b) at
/// (r / 8) * src_group_stride + (r % 8) * src_row_stride + b * src_block_stride; 0: none, the
/// public call's plane); failure messages name `function`.
qmoe_status group_plane(const char* function, const void* src, uint32_t n, uint32_t blocks,
                        size_t element_bytes, size_t src_row_stride, size_t src_block_stride,
                        size_t src_group_stride, void* dst, size_t dst_bytes);

}  // namespace qmoe

#endif  // QMOE_LIB_FORMATS_GROUPED_PLANE_H_
