// The tiling every weight format's codes share: rows in groups of kGroupRows = 8, k in tiles of
// kChunkCodes = 32 codes, one group's tiles contiguous (docs/formats.md). A thread computing a
// group of 8 outputs reads one sequential stream, and the activations are prepared in the same
// 32-k chunks (FP32 rows padded to whole chunks; int8 rows with one scale per chunk).
//
// Constants only (no functions): included by translation units of every ISA's flags.
#ifndef QMOE_LIB_FORMATS_TILES_H_
#define QMOE_LIB_FORMATS_TILES_H_

#include <cstdint>

namespace qmoe {

constexpr uint32_t kGroupRows = 8;
constexpr uint32_t kChunkCodes = 32;

}  // namespace qmoe

#endif  // QMOE_LIB_FORMATS_TILES_H_
