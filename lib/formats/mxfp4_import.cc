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

qmoe_status import_mxfp4_ggml(const char* function, const void* src, uint32_t n, uint32_t k,
                              void* dst_codes, size_t dst_bytes, uint8_t* scales,
                              size_t scale_row_stride, size_t scale_block_stride) {
  if (qmoe_status s = check_nibble_dst(function, kMxfp4Format, n, k, dst_codes, dst_bytes);
      s != QMOE_STATUS_OK) {
    return s;
  }
  if (src == nullptr || scales == nullptr) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s is NULL",
                src == nullptr ? "src" : "scales");
  }
  if (k % kMxfp4BlockSize != 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "k = %u is not a multiple of 32", k);
  }
  const uint32_t blocks = k / kMxfp4BlockSize;
  if (!plane_strides_fit(n, blocks, scale_row_stride, scale_block_stride)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "scale strides (row %zu, block %zu) alias",
                scale_row_stride, scale_block_stride);
  }
  // block_mxfp4: { uint8_t e; uint8_t qs[16]; } = 17 bytes, no padding (ggml-common.h). Byte j
  // of qs holds code j (low nibble) and code j + 16 (high nibble): the canonical chunk-row bytes,
  // as Q4_0's. ggml reads e as 2^(e - 128) times codes doubled (kvalues_mxfp4 = 0, 1, 2, 3, 4,
  // 6, 8, 12, ...; ggml_e8m0_to_fp32_half), which is 2^(e - 127) times the E2M1 value: the E8M0
  // byte as it is, for every e but 0xFF.
  constexpr size_t kBlockBytes = 1 + kChunkRowBytes;
  const size_t src_bytes = size_t{n} * blocks * kBlockBytes;
  const size_t codes_bytes = codes_size(kMxfp4Format, n, k);
  size_t scale_bytes = 0;
  if (!plane_bytes(scales, n, blocks, scale_row_stride, scale_block_stride, 0, 1, &scale_bytes)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "scale strides (row %zu, block %zu) run past the end of the address space",
                scale_row_stride, scale_block_stride);
  }
  if (ranges_overlap(src, src_bytes, dst_codes, codes_bytes) ||
      ranges_overlap(src, src_bytes, scales, scale_bytes) ||
      ranges_overlap(dst_codes, codes_bytes, scales, scale_bytes)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "src, dst_codes and scales must not overlap");
  }
  const auto* in = static_cast<const uint8_t*>(src);
  // e = 0xFF: ggml reads it as 2^127 times the doubled code (finite for codes +-0.5, infinite
  // above), a value no E8M0 byte holds (OCP reserves 0xFF for NaN); ggml's quantizer never
  // writes it. Refused before anything is written.
  for (size_t i = 0; i < size_t{n} * blocks; ++i) {
    if (in[i * kBlockBytes] == kE8M0NaN) {
      return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                  "block %zu (row %zu) has e = 0xFF, which ggml reads as a finite scale and E8M0 "
                  "as NaN",
                  i % blocks, i / blocks);
    }
  }
  auto* out = static_cast<uint8_t*>(dst_codes);
  std::memset(out, 0, codes_bytes);
  for (uint32_t row = 0; row < n; ++row) {
    for (uint32_t b = 0; b < blocks; ++b) {
      const uint8_t* block = in + (size_t{row} * blocks + b) * kBlockBytes;
      scales[row * scale_row_stride + b * scale_block_stride] = block[0];
      std::memcpy(out + nibble_offset(row, b * kMxfp4BlockSize, blocks), block + 1, kChunkRowBytes);
    }
  }
  return QMOE_STATUS_OK;
}

}  // namespace qmoe
