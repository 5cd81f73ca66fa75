// The canonical nibble layout's importer helpers. Import runs once per weight load, so clarity
// wins over speed here.
#include "lib/formats/nibble_codes.h"

#include <cstring>

#include "lib/error.h"
#include "lib/formats/int4_layout.h"
#include "lib/formats/quant_matrix.h"
#include "lib/memory_ranges.h"

namespace qmoe {

size_t nibble_offset(uint32_t n, uint32_t k, uint32_t chunks) {
  return ((size_t{n} / kGroupRows) * chunks + k / kChunkCodes) * kChunkBytes +
         (n % kGroupRows) * kChunkRowBytes + (k % kChunkRowBytes);
}

void store_nibble_chunk_row(uint8_t* dst, uint32_t n, uint32_t c, uint32_t chunks,
                            const uint8_t codes[32]) {
  uint8_t* bytes = dst + nibble_offset(n, c * kChunkCodes, chunks);
  for (uint32_t j = 0; j < kChunkRowBytes; ++j) {
    bytes[j] = static_cast<uint8_t>(codes[j] | (codes[j + 16] << 4));
  }
}

qmoe_status check_nibble_dst(const char* function, const FormatTraits& format, uint32_t n,
                             uint32_t k, const void* dst, size_t dst_bytes) {
  if (qmoe_status s = check_matrix_dims(function, n, k); s != QMOE_STATUS_OK) return s;
  if (dst == nullptr) return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "dst is NULL");
  const size_t need = codes_size(format, n, k);
  if (dst_bytes < need) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "dst_bytes = %zu but an %u x %u %s matrix needs %zu", dst_bytes, n, k, format.name,
                need);
  }
  return QMOE_STATUS_OK;
}

qmoe_status import_nibble_pairs(const char* function, const FormatTraits& format,
                                const uint8_t* src, uint32_t n, uint32_t k, uint32_t k_multiple,
                                void* dst, size_t dst_bytes) {
  if (qmoe_status s = check_nibble_dst(function, format, n, k, dst, dst_bytes);
      s != QMOE_STATUS_OK) {
    return s;
  }
  if (src == nullptr) return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "src is NULL");
  if (k % k_multiple != 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "k = %u is not a multiple of %u", k,
                k_multiple);
  }
  // dst is cleared before src is read: an import in place would read zeros.
  const size_t codes_bytes = codes_size(format, n, k);
  if (ranges_overlap(src, size_t{n} * (k / 2), dst, codes_bytes)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "src and dst overlap");
  }
  const uint32_t chunks = chunk_count(k);
  auto* out = static_cast<uint8_t*>(dst);
  std::memset(out, 0, codes_bytes);
  const size_t row_bytes = k / 2;
  for (uint32_t row = 0; row < n; ++row) {
    const uint8_t* in = src + row * row_bytes;
    for (uint32_t c = 0; c < chunks; ++c) {
      uint8_t codes[kChunkCodes] = {};
      for (uint32_t j = 0; j < kChunkCodes && c * kChunkCodes + j < k; ++j) {
        const uint32_t kk = c * kChunkCodes + j;
        codes[j] = (in[kk / 2] >> (4 * (kk % 2))) & 0x0F;
      }
      store_nibble_chunk_row(out, row, c, chunks, codes);
    }
  }
  return QMOE_STATUS_OK;
}

qmoe_status import_ggml_nibble_blocks(const char* function, const FormatTraits& format,
                                      const void* src, uint32_t n, uint32_t k, void* dst_codes,
                                      size_t dst_bytes, void* scales, size_t scale_bytes,
                                      size_t scale_row_stride, size_t scale_block_stride,
                                      GgmlScaleRefusal refuse) {
  if (qmoe_status s = check_nibble_dst(function, format, n, k, dst_codes, dst_bytes);
      s != QMOE_STATUS_OK) {
    return s;
  }
  if (src == nullptr || scales == nullptr) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s is NULL",
                src == nullptr ? "src" : "scales");
  }
  if (k % kChunkCodes != 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "k = %u is not a multiple of 32", k);
  }
  const uint32_t blocks = k / kChunkCodes;
  if (!plane_strides_fit(n, blocks, scale_row_stride, scale_block_stride)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "scale strides (row %zu, block %zu) alias",
                scale_row_stride, scale_block_stride);
  }
  if (reinterpret_cast<uintptr_t>(scales) % scale_bytes != 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "scales is not aligned to %zu bytes",
                scale_bytes);
  }
  const size_t block_bytes = scale_bytes + kChunkRowBytes;
  const size_t src_bytes = size_t{n} * blocks * block_bytes;
  const size_t codes_bytes = codes_size(format, n, k);
  size_t plane_extent = 0;
  if (!plane_bytes(scales, n, blocks, scale_row_stride, scale_block_stride, 0, scale_bytes,
                   &plane_extent)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "scale strides (row %zu, block %zu) run past the end of the address space",
                scale_row_stride, scale_block_stride);
  }
  if (ranges_overlap(src, src_bytes, dst_codes, codes_bytes) ||
      ranges_overlap(src, src_bytes, scales, plane_extent) ||
      ranges_overlap(dst_codes, codes_bytes, scales, plane_extent)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "src, dst_codes and scales must not overlap");
  }
  const auto* in = static_cast<const uint8_t*>(src);
  if (refuse != nullptr) {
    for (size_t i = 0; i < size_t{n} * blocks; ++i) {
      if (const char* why = refuse(in + i * block_bytes)) {
        return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "block %zu (row %zu) %s", i % blocks,
                    i / blocks, why);
      }
    }
  }
  auto* out = static_cast<uint8_t*>(dst_codes);
  auto* plane = static_cast<uint8_t*>(scales);
  std::memset(out, 0, codes_bytes);
  for (uint32_t row = 0; row < n; ++row) {
    for (uint32_t b = 0; b < blocks; ++b) {
      const uint8_t* block = in + (size_t{row} * blocks + b) * block_bytes;
      std::memcpy(plane + (row * scale_row_stride + b * scale_block_stride) * scale_bytes, block,
                  scale_bytes);
      std::memcpy(out + nibble_offset(row, b * kChunkCodes, blocks), block + scale_bytes,
                  kChunkRowBytes);
    }
  }
  return QMOE_STATUS_OK;
}

}  // namespace qmoe
