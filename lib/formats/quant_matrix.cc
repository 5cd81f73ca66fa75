#include "lib/formats/quant_matrix.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "lib/abi_enum.h"
#include "lib/error.h"
#include "lib/formats/format_traits.h"
#include "lib/memory_ranges.h"
#include "lib/struct_size.h"

namespace qmoe {
namespace {

// A qmoe_dtype value at all (scales: the format's traits say which it takes).
bool valid_dtype(int32_t d) {
  return d >= QMOE_DTYPE_F32 && d <= QMOE_DTYPE_F8_E4M3;
}

// A dtype a bias may have.
bool valid_bias_dtype(int32_t d) {
  return d == QMOE_DTYPE_F32 || d == QMOE_DTYPE_F16 || d == QMOE_DTYPE_BF16;
}

// " (16, 32, 64 or 128)": the block sizes a format accepts, for messages.
std::string block_size_list(const FormatTraits& format) {
  std::string out;
  for (uint32_t size = 1; size != 0 && size <= format.block_sizes; size <<= 1) {
    if ((format.block_sizes & size) == 0) continue;
    out += out.empty() ? " (" : ", ";
    out += std::to_string(size);
  }
  return out.empty() ? out : out + ")";
}

// Whether stride >= count * other, false when the product does not fit in 64 bits (a
// stride below 2^48 cannot reach it then).
bool at_least_product(size_t stride, size_t count, size_t other) {
  size_t product = 0;
  return !__builtin_mul_overflow(count, other, &product) && stride >= product;
}

}  // namespace

bool plane_strides_fit(uint32_t n, uint32_t blocks, size_t row_stride, size_t block_stride) {
  constexpr size_t kLimit = size_t{1} << 48;
  if (row_stride >= kLimit || block_stride >= kLimit) return false;
  const bool row_major =
      block_stride >= 1 && (n == 1 || at_least_product(row_stride, blocks, block_stride));
  const bool block_major =
      row_stride >= 1 && (blocks == 1 || at_least_product(block_stride, n, row_stride));
  return row_major || block_major;
}

bool grouped_plane_strides_fit(uint32_t n, uint32_t blocks, size_t row_stride, size_t block_stride,
                               size_t group_stride) {
  if (group_stride == 0) return plane_strides_fit(n, blocks, row_stride, block_stride);
  constexpr size_t kLimit = size_t{1} << 48;
  const uint32_t group_rows = std::min<uint32_t>(n, kGroupRows);
  if (group_stride >= kLimit || !plane_strides_fit(group_rows, blocks, row_stride, block_stride)) {
    return false;
  }
  // (group_rows - 1) * row_stride < 2^51, but (blocks - 1) * block_stride can reach 2^80:
  // checked, and a group stride below 2^48 cannot cover an extent that does not fit.
  size_t block_extent = 0, extent = 0;
  if (__builtin_mul_overflow(size_t{blocks - 1}, block_stride, &block_extent) ||
      __builtin_add_overflow(block_extent, (group_rows - 1) * row_stride + 1, &extent)) {
    return false;
  }
  const size_t groups = row_groups(n);
  return group_stride >= extent && groups <= (size_t{1} << 62) / group_stride;
}

bool plane_bytes(const void* base, uint32_t n, uint32_t blocks, size_t row_stride,
                 size_t block_stride, size_t group_stride, size_t element_bytes, size_t* bytes) {
  const size_t last_row = n - 1;
  size_t row_offset, block_offset, last, total;
  const bool overflow =
      (group_stride == 0
           ? __builtin_mul_overflow(last_row, row_stride, &row_offset)
           : (__builtin_mul_overflow(last_row / kGroupRows, group_stride, &row_offset) ||
              __builtin_add_overflow(row_offset, (last_row % kGroupRows) * row_stride,
                                     &row_offset))) ||
      __builtin_mul_overflow(size_t{blocks - 1}, block_stride, &block_offset) ||
      __builtin_add_overflow(row_offset, block_offset, &last) ||
      __builtin_add_overflow(last, size_t{1}, &last) ||
      __builtin_mul_overflow(last, element_bytes, &total);
  if (overflow || range_wraps(base, total)) return false;
  *bytes = total;
  return true;
}

size_t matrix_spans(const qmoe_quant_matrix& w, MemorySpan spans[4]) {
  const uint32_t blocks = w.k / w.block_size;
  size_t count = 0;
  spans[count++] = {w.codes, codes_size(*find_format(w.format), w.n, w.k)};
  size_t bytes = 0;
  if (!plane_bytes(w.scales, w.n, blocks, w.scale_row_stride, w.scale_block_stride,
                   w.scale_group_stride, dtype_size(w.scale_dtype), &bytes)) {
    return 0;
  }
  spans[count++] = {w.scales, bytes};
  if (w.zero_points != nullptr) {
    if (!plane_bytes(w.zero_points, w.n, blocks, w.zero_point_row_stride, w.zero_point_block_stride,
                     w.zero_point_group_stride, 1, &bytes)) {
      return 0;
    }
    spans[count++] = {w.zero_points, bytes};
  }
  if (w.bias != nullptr) spans[count++] = {w.bias, size_t{w.n} * dtype_size(w.bias_dtype)};
  for (size_t i = 0; i < count; ++i) {
    if (range_wraps(spans[i].data, spans[i].bytes)) return 0;
  }
  return count;
}

bool matrix_overlaps(const qmoe_quant_matrix& w, const void* p, size_t bytes) {
  MemorySpan spans[4];
  const size_t count = matrix_spans(w, spans);
  for (size_t i = 0; i < count; ++i) {
    if (ranges_overlap(p, bytes, spans[i].data, spans[i].bytes)) return true;
  }
  return false;
}

size_t dtype_size(qmoe_dtype dtype) {
  switch (dtype) {
    case QMOE_DTYPE_F32:
      return 4;
    case QMOE_DTYPE_F16:
    case QMOE_DTYPE_BF16:
      return 2;
    case QMOE_DTYPE_E8M0:
    case QMOE_DTYPE_F8_E4M3:
      return 1;
  }
  return 0;
}

qmoe_status check_matrix_dims(const char* function, uint32_t n, uint32_t k) {
  if (n >= 1 && k >= 1 && n <= QMOE_MAX_MATRIX_DIM && k <= QMOE_MAX_MATRIX_DIM) {
    return QMOE_STATUS_OK;
  }
  return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
              "n = %u and k = %u must be in [1, 2^31] (QMOE_MAX_MATRIX_DIM)", n, k);
}

qmoe_status validate_quant_matrix(const qmoe_quant_matrix* in, const char* function,
                                  qmoe_quant_matrix* out) {
  if (in == nullptr) return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "weights is NULL");
  using M = qmoe_quant_matrix;
  static constexpr FieldSpan kFields[] = {QMOE_FIELD(M, zero_points),
                                          QMOE_FIELD(M, zero_point_row_stride),
                                          QMOE_FIELD(M, zero_point_block_stride),
                                          QMOE_FIELD(M, bias_dtype),
                                          QMOE_FIELD(M, bias),
                                          QMOE_FIELD(M, scale_group_stride),
                                          QMOE_FIELD(M, zero_point_group_stride),
                                          QMOE_FIELD(M, global_scale)};
  if (!struct_size_ok(in->struct_size, offsetof(M, zero_points), kFields)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "weights->struct_size is %zu, not the size of any version of the struct; set it "
                "to sizeof(qmoe_quant_matrix) (%zu)",
                in->struct_size, sizeof(qmoe_quant_matrix));
  }
  qmoe_quant_matrix w{};
  std::memcpy(&w, in, in->struct_size < sizeof(w) ? in->struct_size : sizeof(w));
  w.struct_size = sizeof(w);

  const FormatTraits* format = find_format(enum_bits(w.format));
  if (format == nullptr) {
    return fail(QMOE_STATUS_UNSUPPORTED_FORMAT, function, "weight format %d is not supported",
                enum_bits(w.format));
  }
  if (qmoe_status s = check_matrix_dims(function, w.n, w.k); s != QMOE_STATUS_OK) return s;
  if (!format_accepts_block_size(*format, w.block_size)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "block_size %u is not one %s accepts%s",
                w.block_size, format->name, block_size_list(*format).c_str());
  }
  if (w.k % w.block_size != 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "k = %u is not a multiple of block_size %u",
                w.k, w.block_size);
  }
  if (w.codes == nullptr || w.scales == nullptr) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "weights->%s is NULL",
                w.codes == nullptr ? "codes" : "scales");
  }
  if (!valid_dtype(enum_bits(w.scale_dtype))) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "scale_dtype %d is not a qmoe_dtype",
                enum_bits(w.scale_dtype));
  }
  if (!format_accepts_scale_dtype(*format, enum_bits(w.scale_dtype))) {
    return fail(QMOE_STATUS_UNSUPPORTED_FORMAT, function, "%s takes no scales of dtype %d",
                format->name, enum_bits(w.scale_dtype));
  }
  if (w.zero_points != nullptr && !format->zero_points) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s takes no zero points", format->name);
  }
  const uint32_t blocks = w.k / w.block_size;
  if (!grouped_plane_strides_fit(w.n, blocks, w.scale_row_stride, w.scale_block_stride,
                                 w.scale_group_stride)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "scale strides (row %zu, block %zu, group %zu) do not describe an [N=%u, "
                "blocks=%u] plane",
                w.scale_row_stride, w.scale_block_stride, w.scale_group_stride, w.n, blocks);
  }
  if (w.zero_points != nullptr &&
      !grouped_plane_strides_fit(w.n, blocks, w.zero_point_row_stride, w.zero_point_block_stride,
                                 w.zero_point_group_stride)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "zero-point strides (row %zu, block %zu, group %zu) do not describe an [N=%u, "
                "blocks=%u] plane",
                w.zero_point_row_stride, w.zero_point_block_stride, w.zero_point_group_stride, w.n,
                blocks);
  }
  if (w.bias != nullptr && !valid_bias_dtype(enum_bits(w.bias_dtype))) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "bias_dtype %d is not F32, F16 or BF16",
                enum_bits(w.bias_dtype));
  }
  // 0 is "none"; a format without a global scale takes only the neutral 1 besides.
  if (w.global_scale != 0.0f && (!(w.global_scale > 0.0f) || !std::isfinite(w.global_scale) ||
                                 (!format->global_scale && w.global_scale != 1.0f))) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "global_scale = %g: %s takes %s",
                static_cast<double>(w.global_scale), format->name,
                format->global_scale ? "a finite value > 0, or 0 for none" : "none (0 or 1)");
  }
  // Sizes: each plane's span must fit in size_t and in the address space (strides are bounded
  // one by one, not times 2^32 rows), and 16/32-bit elements must be aligned to their size
  // (the kernels and panel builders read them as such).
  MemorySpan spans[4];
  const size_t scale_size = dtype_size(w.scale_dtype);
  if (matrix_spans(w, spans) == 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "a plane of this [N=%u, K=%u] matrix with these strides runs past the end of "
                "the address space",
                w.n, w.k);
  }
  if (reinterpret_cast<uintptr_t>(w.scales) % scale_size != 0 ||
      (w.bias != nullptr && reinterpret_cast<uintptr_t>(w.bias) % dtype_size(w.bias_dtype) != 0)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "weights->%s is not aligned to its element size",
                reinterpret_cast<uintptr_t>(w.scales) % scale_size != 0 ? "scales" : "bias");
  }
  *out = w;
  return QMOE_STATUS_OK;
}

}  // namespace qmoe
