// The E2M1 formats, MXFP4 and NVFP4 (docs/formats.md): 4-bit E2M1 codes in the canonical nibble
// layout of INT4 (lib/formats/int4_layout.h: the same 128-byte tiles, code k in the low nibble
// when k % 32 < 16 and in the high nibble otherwise), so that the kernels unpack them with the
// same AND and shift, and one byte scale per block (lib/formats/byte_scales.h).
//
// An E2M1 code (OCP MX v1.0, 5.3.3) is sign bit 3, exponent bits 2-1 (bias 1) and mantissa bit 0:
// codes 0-7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6 and codes 8-15 their negatives (8 is -0). Twice a
// value is an integer in [-12, 12], which is what the fast level's integer dot products use.
//
// Constants only (no functions): included by translation units of every ISA's flags.
#ifndef QMOE_LIB_FORMATS_E2M1_LAYOUT_H_
#define QMOE_LIB_FORMATS_E2M1_LAYOUT_H_

#include <cstdint>

#include "lib/formats/int4_layout.h"

namespace qmoe {

constexpr uint32_t kMxfp4BlockSize = 32;  // OCP MX: one E8M0 scale per 32 codes
constexpr uint32_t kNvfp4BlockSize = 16;  // one E4M3 scale per 16 codes

/// Twice the E2M1 value of each code.
inline constexpr int8_t kE2M1Doubled[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                            0, -1, -2, -3, -4, -6, -8, -12};

}  // namespace qmoe

#endif  // QMOE_LIB_FORMATS_E2M1_LAYOUT_H_
