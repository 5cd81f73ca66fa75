// What the format-neutral code needs to know about a weight format: one traits row per format
// (ggml's type_traits, MLAS's QNBit availability), looked up once when a matrix is validated.
//
// Every format stores its codes in the same tiling (lib/formats/tiles.h): 8-row groups, 32
// codes of k per tile, a group's tiles contiguous. Formats differ in the bytes of one row of a
// tile (code bits x 32 / 8), in the block sizes and scale types they allow, and in whether a
// zero-point plane means anything. The byte layout inside a tile is the format's own
// (docs/formats.md), known only to its kernels and importers.
#ifndef QMOE_LIB_FORMATS_FORMAT_TRAITS_H_
#define QMOE_LIB_FORMATS_FORMAT_TRAITS_H_

#include <cstddef>
#include <cstdint>

#include "qmoe/qmoe.h"

namespace qmoe {

struct FormatTraits {
  qmoe_weight_format format;
  const char* name;             // "int4"
  uint32_t code_bits;           // bits of one code
  uint32_t tile_row_bytes;      // bytes of one row of a 32-code tile: code_bits * 4
  uint32_t block_sizes;         // bit b set: block size 2^b is accepted
  uint32_t scale_dtypes;        // bit d set: qmoe_dtype d is accepted for scales
  bool zero_points;             // whether a zero-point plane is accepted
  uint32_t default_zero_point;  // what a matrix without a zero-point plane subtracts
  bool global_scale;            // whether qmoe_quant_matrix::global_scale may be other than 0 or 1
};

/// Bytes of one tile (8 rows of tile_row_bytes).
uint32_t tile_bytes(const FormatTraits& format);

/// The traits of `format`, or nullptr when this build does not implement it (the value read
/// as the caller passed it: any 32-bit pattern is safe here).
const FormatTraits* find_format(int32_t format);

/// Number of formats the build implements, and the i-th of them (i < count), in
/// qmoe_weight_format order.
uint32_t format_count();
const FormatTraits& format_at(uint32_t i);

/// Index of a format in tables sized for the formats of the build: its row's position in
/// format_list.inc. The list holds values in ascending order but need not hold every value (a
/// format another branch adds, or one a build leaves out, leaves a gap), so the slot is the
/// position, not value - 1. For a value without a row it is format_count(): callers index tables
/// only with formats validation has accepted.
constexpr uint32_t format_slot(qmoe_weight_format format) {
  uint32_t slot = 0;
#define QMOE_FORMAT(token, value, traits) \
  if (format == (value)) return slot;     \
  ++slot;
#include "lib/formats/format_list.inc"
#undef QMOE_FORMAT
  return slot;
}

/// Whether the traits accept `block_size` and `scale_dtype` (read as 32-bit patterns).
bool format_accepts_block_size(const FormatTraits& format, uint32_t block_size);
bool format_accepts_scale_dtype(const FormatTraits& format, int32_t scale_dtype);

/// Bytes of the canonical codes of an n x k matrix: ceil(n / 8) * ceil(k / 32) tiles.
size_t codes_size(const FormatTraits& format, uint32_t n, uint32_t k);

#define QMOE_FORMAT(token, value, traits) extern const FormatTraits traits;
#include "lib/formats/format_list.inc"
#undef QMOE_FORMAT

}  // namespace qmoe

#endif  // QMOE_LIB_FORMATS_FORMAT_TRAITS_H_
