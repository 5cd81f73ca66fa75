// Importers into the canonical MXFP4 layout. Both keep every weight's value bit for bit: the
// codes are E2M1 nibbles in every source, only their order differs, and the scales are E8M0
// bytes read with the same meaning (docs/formats.md cites each source's dequantisation code).
#include "lib/formats/mxfp4_import.h"

#include <cstring>

#include "lib/error.h"
#include "lib/formats/byte_scales.h"
#include "lib/formats/e2m1_layout.h"
#include "lib/formats/format_traits.h"
#include "lib/formats/nibble_codes.h"
#include "lib/formats/quant_matrix.h"
#include "lib/memory_ranges.h"

namespace qmoe {

qmoe_status import_mxfp4_gpt_oss(const char* function, const uint8_t* blocks, uint32_t n,
                                 uint32_t k, void* dst, size_t dst_bytes) {
  // gpt-oss's "<name>.blocks" tensor, uint8 [N, K/32, 16], is the packed layout: byte j of block
  // b holds k = 32b + 2j in its low nibble and 32b + 2j + 1 in its high one (gpt_oss/torch/
  // weights.py, _get_mxfp4_tensor: out[:, 0::2] = lut[blk & 0x0F], out[:, 1::2] = lut[blk >> 4]).
  return import_nibble_pairs(function, kMxfp4Format, blocks, n, k, kMxfp4BlockSize, dst, dst_bytes);
}

namespace {

// e = 0xFF: ggml reads it as 2^127 times the doubled code (finite for codes +-0.5, infinite
// above), a value no E8M0 byte holds (OCP reserves 0xFF for NaN); ggml's quantizer never writes
// it. Refused before anything is written.
const char* refuse_ggml_e8m0(const uint8_t* scale) {
  return *scale == kE8M0NaN ? "has e = 0xFF, which ggml reads as a finite scale and E8M0 as NaN"
                            : nullptr;
}

}  // namespace

qmoe_status import_mxfp4_ggml(const char* function, const void* src, uint32_t n, uint32_t k,
                              void* dst_codes, size_t dst_bytes, uint8_t* scales,
                              size_t scale_row_stride, size_t scale_block_stride) {
  // block_mxfp4: { uint8_t e; uint8_t qs[16]; } = 17 bytes, no padding (ggml-common.h). ggml
  // reads e as 2^(e - 128) times codes doubled (kvalues_mxfp4 = 0, 1, 2, 3, 4, 6, 8, 12, ...;
  // ggml_e8m0_to_fp32_half), which is 2^(e - 127) times the E2M1 value: the E8M0 byte as it
  // is, for every e but 0xFF.
  return import_ggml_nibble_blocks(function, kMxfp4Format, src, n, k, dst_codes, dst_bytes, scales,
                                   1, scale_row_stride, scale_block_stride, refuse_ggml_e8m0);
}

}  // namespace qmoe
