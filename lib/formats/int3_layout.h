// The canonical INT3 layout (docs/formats.md, "INT3 weights"), in the tiling every format shares
// (lib/formats/tiles.h): a tile is 96 bytes, three 32-byte vectors v = 0, 1, 2 of two 16-byte
// lanes L = 0, 1. Byte 32v + 16L + j of a tile holds, for rows r = 2v + L (v < 3, rows 0-5):
//   bits 0-2: code k = j        bits 3-5: code k = 16 + j
// and for rows 6 + L (rows 6-7), whose codes are split:
//   bits 6-7 of vector 0: code j & 3       bits 6-7 of vector 1: code 16 + j & 3
//   bit 6 of vector 2:    code j >> 2      bit 7 of vector 2:    code 16 + j >> 2
// So every byte holds two whole codes and two bits of a third: one AND (and a shift) gives a
// 32-byte vector of two rows' codes in k order (rows 0-5, the INT4 kernels' pair form), and
// two shifts, two ANDs and an OR give rows 6-7; a GPU thread reads its row's 32 codes as one
// aligned 16-byte load (rows 0-5) or three (rows 6-7).
//
// Constants only (no functions): included by translation units of every ISA's flags.
#ifndef QMOE_LIB_FORMATS_INT3_LAYOUT_H_
#define QMOE_LIB_FORMATS_INT3_LAYOUT_H_

#include <cstdint>

#include "lib/formats/tiles.h"

namespace qmoe {

constexpr uint32_t kInt3TileRowBytes = 12;                           // 32 codes x 3 bits
constexpr uint32_t kInt3TileBytes = kGroupRows * kInt3TileRowBytes;  // 96
constexpr uint32_t kInt3VectorBytes = 32;                            // vectors 0, 1, 2 of a tile
constexpr uint32_t kInt3LaneBytes = 16;  // lane L of a vector: one row's 16 byte positions
constexpr uint32_t kInt3WholeRows = 6;   // rows 0-5 keep whole codes; rows 6-7 are split
constexpr uint32_t kInt3DefaultZeroPoint = 4;

}  // namespace qmoe

#endif  // QMOE_LIB_FORMATS_INT3_LAYOUT_H_
