// The canonical INT4 layout (docs/formats.md), in the tiling every format shares
// (lib/formats/tiles.h): a tile holds the 8 rows' 16-byte slices of 32 codes,
//   byte((n, k)) = ((n / 8) * chunks + k / 32) * 128 + (n % 8) * 16 + (k % 16)
//   code k is the low nibble when k % 32 < 16, the high nibble otherwise.
// So one 16-byte load unpacks to the 32 codes of a row's tile in k order (low nibbles then high
// nibbles) with an AND and a shift, and a GPU warp reads 4 tiles = 512 contiguous bytes.
//
// Constants only (no functions): included by translation units of every ISA's flags.
#ifndef QMOE_LIB_FORMATS_INT4_LAYOUT_H_
#define QMOE_LIB_FORMATS_INT4_LAYOUT_H_

#include <cstdint>

#include "lib/formats/tiles.h"

namespace qmoe {

constexpr uint32_t kChunkRowBytes = 16;                        // one row's codes of one tile
constexpr uint32_t kChunkBytes = kGroupRows * kChunkRowBytes;  // 128
constexpr uint32_t kInt4DefaultZeroPoint = 8;

}  // namespace qmoe

#endif  // QMOE_LIB_FORMATS_INT4_LAYOUT_H_
