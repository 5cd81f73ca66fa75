// Validation of qmoe_quant_matrix descriptions, format-neutral: the format's traits row
// (lib/formats/format_traits.h) says which block sizes, scale types and planes it accepts, and
// how many bytes its codes take.
#ifndef QMOE_LIB_FORMATS_QUANT_MATRIX_H_
#define QMOE_LIB_FORMATS_QUANT_MATRIX_H_

#include <cstddef>
#include <cstdint>

#include "lib/formats/tiles.h"
#include "qmoe/qmoe.h"

namespace qmoe {

/// Bytes of one element of `dtype` (0 for an unknown value).
size_t dtype_size(qmoe_dtype dtype);

/// Row groups covering rows [0, n) and chunks covering codes [0, k), rounded up in 64 bits:
/// right for every n and k up to 2^32 - 1, where the same sum in 32 bits wraps (it once sized
/// buffers to 0 and skipped columns near 2^32). The results fit uint32_t.
inline uint32_t row_groups(size_t n) {
  return static_cast<uint32_t>((n + kGroupRows - 1) / kGroupRows);
}
inline uint32_t chunk_count(size_t k) {
  return static_cast<uint32_t>((k + kChunkCodes - 1) / kChunkCodes);
}

/// OK when n and k are each in [1, QMOE_MAX_MATRIX_DIM], INVALID_ARGUMENT (naming `function`)
/// otherwise. In range, n rounded up to whole row groups and k to whole chunks, and every group
/// or chunk index times its size, stay below 2^32, so 32-bit group and chunk arithmetic is
/// exact. Every entry point that takes a matrix's n and k checks them here.
qmoe_status check_matrix_dims(const char* function, uint32_t n, uint32_t k);

/// Whether a plane of n x blocks elements at row * row_stride + block * block_stride maps
/// distinct (row, block) pairs to distinct elements without overflow: row-major
/// (block_stride >= 1, row_stride >= blocks * block_stride) or block-major (row_stride >= 1,
/// block_stride >= n * row_stride). Anything else aliases.
bool plane_strides_fit(uint32_t n, uint32_t blocks, size_t row_stride, size_t block_stride);

/// Whether a plane with a group stride (element (n, b) at (n / 8) * group_stride +
/// (n % 8) * row_stride + b * block_stride) maps distinct pairs to distinct elements: each
/// group's 8 x blocks block fits (plane_strides_fit) and groups do not overlap
/// (group_stride >= one group's extent). group_stride 0 is the plain plane_strides_fit.
bool grouped_plane_strides_fit(uint32_t n, uint32_t blocks, size_t row_stride, size_t block_stride,
                               size_t group_stride);

/// The bytes from a plane's first element to its last (the last row's last block: row offsets
/// grow with the row, since a group stride covers a whole group) in *bytes; false when that does
/// not fit in size_t or when [base, base + bytes) would run past the top of the address space. The
/// strides checks bound each stride, not a stride times up to 2^32 rows, so every entry point that
/// takes a plane asks this before it reads one.
bool plane_bytes(const void* base, uint32_t n, uint32_t blocks, size_t row_stride,
                 size_t block_stride, size_t group_stride, size_t element_bytes, size_t* bytes);

/// One piece of caller memory a matrix reads.
struct MemorySpan {
  const void* data;
  size_t bytes;
};

/// The memory a matrix reads: its codes, scale plane, and zero-point plane and bias where it has
/// them (2 to 4 spans, written to `spans`; the count is returned). 0 when a span's size does
/// not fit in size_t or runs past the end of the address space (validate_quant_matrix refuses
/// such a matrix, so for a validated one the count is never 0). Needs valid dtypes.
size_t matrix_spans(const qmoe_quant_matrix& w, MemorySpan spans[4]);

/// Whether [p, p + bytes) shares a byte with any span of matrix_spans(w).
bool matrix_overlaps(const qmoe_quant_matrix& w, const void* p, size_t bytes);

/// Element offset of row n's block 0 in a plane (group_stride 0: n * row_stride).
inline size_t plane_row_offset(uint32_t n, size_t row_stride, size_t group_stride) {
  return group_stride == 0 ? size_t{n} * row_stride
                           : size_t{n / 8} * group_stride + size_t{n % 8} * row_stride;
}

/// Check a caller's description (struct size, format, sizes, block size, pointers, dtypes,
/// strides) against its format's traits and copy it, defaults filled for fields an older
/// caller's struct lacks.
qmoe_status validate_quant_matrix(const qmoe_quant_matrix* in, const char* function,
                                  qmoe_quant_matrix* out);

}  // namespace qmoe

#endif  // QMOE_LIB_FORMATS_QUANT_MATRIX_H_
