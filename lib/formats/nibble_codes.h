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

/// Says why a ggml block's scale (its `scale_bytes` bytes) cannot be imported, or nullptr.
using GgmlScaleRefusal = const char* (*)(const uint8_t* scale);

/// Imports ggml's 32-code blocks, row-major [N][K/32], each {scale (scale_bytes: 2 for Q4_0's
/// FP16 bits, 1 for MXFP4's E8M0 byte), qs[16]}, where byte j of qs holds code j (low nibble)
/// and j + 16 (high nibble): the canonical chunk-row bytes, copied as they are into `format`'s
/// codes (padding zeroed), and each scale into `scales` at (row, block) elements of
/// scale_bytes. Checks first (nothing written on failure): the destination, K a multiple of 32,
/// the strides, 2-byte scales aligned, no overlap among src, the codes and the scale plane, and
/// `refuse` (when not null) on every block's scale.
qmoe_status import_ggml_nibble_blocks(const char* function, const FormatTraits& format,
                                      const void* src, uint32_t n, uint32_t k, void* dst_codes,
                                      size_t dst_bytes, void* scales, size_t scale_bytes,
                                      size_t scale_row_stride, size_t scale_block_stride,
                                      GgmlScaleRefusal refuse);

}  // namespace qmoe

#endif  // QMOE_LIB_FORMATS_NIBBLE_CODES_H_
