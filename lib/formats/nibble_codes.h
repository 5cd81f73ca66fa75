// The canonical nibble layout that INT4, MXFP4 and NVFP4 codes share (docs/formats.md,
// "Canonical code layout"), for their importers: where a code goes, and the import of the common
// packed layout, uint8 [N, K/2] per row with even k in the low nibble and odd k in the high one
// (ONNX Runtime's MatMulNBits/QMoE INT4, gpt-oss's MXFP4 blocks, NVIDIA ModelOpt's NVFP4
// weights: the same bytes, read as different codes).
#ifndef QMOE_LIB_FORMATS_NIBBLE_CODES_H_
#define QMOE_LIB_FORMATS_NIBBLE_CODES_H_

#include <cstddef>
#include <cstdint>

#include "lib/formats/format_traits.h"
#include "qmoe/qmoe.h"

namespace qmoe {

/// The canonical byte holding (n, k) of a matrix with `chunks` tiles per row group; code k is
/// its low nibble when k % 32 < 16, its high nibble otherwise.
size_t nibble_offset(uint32_t n, uint32_t k, uint32_t chunks);

/// One row's 32 codes of chunk c (k order, 0..15 each) into the canonical bytes of (n, c).
void store_nibble_chunk_row(uint8_t* dst, uint32_t n, uint32_t c, uint32_t chunks,
                            const uint8_t codes[32]);

/// Checks an importer's n, k and destination: OK, or INVALID_ARGUMENT naming `function` and
/// `format`'s name when n or k is out of range, dst is NULL or dst_bytes is below the codes
/// size.
qmoe_status check_nibble_dst(const char* function, const FormatTraits& format, uint32_t n,
                             uint32_t k, const void* dst, size_t dst_bytes);

/// Imports uint8 [N, K/2] rows (byte i: k = 2i low nibble, k = 2i + 1 high nibble) into the
/// canonical layout of `format` (a 4-bit format), padding zeroed. K must be a multiple of
/// `k_multiple` (2 at least); src and dst must not overlap.
qmoe_status import_nibble_pairs(const char* function, const FormatTraits& format,
                                const uint8_t* src, uint32_t n, uint32_t k, uint32_t k_multiple,
                                void* dst, size_t dst_bytes);

}  // namespace qmoe

#endif  // QMOE_LIB_FORMATS_NIBBLE_CODES_H_
