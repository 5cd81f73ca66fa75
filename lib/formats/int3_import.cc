// Importer into the canonical INT3 layout from the upstream packing: row n of the source is
// 3k/8 bytes, code k of it bits 3k..3k+2 of that stream, least significant bit first (codes
// 0, 1, ..., 7 pack to the bytes 88 c6 fa). Bit-exact: every code keeps its value, the
// canonical padding is zero. Import runs once per weight load, so clarity wins over speed.
#include "lib/formats/int3_import.h"

#include <cstdint>
#include <cstring>

#include "lib/error.h"
#include "lib/formats/format_traits.h"
#include "lib/formats/int3_layout.h"
#include "lib/formats/quant_matrix.h"
#include "lib/memory_ranges.h"

namespace qmoe {
namespace {

// Code k (0..31) of row r (0..7) into `tile` (96 zeroed-or-partly-written bytes), by the
// layout of lib/formats/int3_layout.h.
void store_code(uint8_t* tile, uint32_t r, uint32_t k, uint8_t code) {
  const uint32_t j = k % kInt3LaneBytes, h = k / kInt3LaneBytes;
  if (r < kInt3WholeRows) {
    tile[(r / 2) * kInt3VectorBytes + (r % 2) * kInt3LaneBytes + j] |=
        static_cast<uint8_t>(code << (3 * h));
  } else {
    const uint32_t lane = (r - kInt3WholeRows) * kInt3LaneBytes + j;
    tile[h * kInt3VectorBytes + lane] |= static_cast<uint8_t>((code & 3) << 6);
    tile[2 * kInt3VectorBytes + lane] |= static_cast<uint8_t>((code >> 2) << (6 + h));
  }
}

// Code k of a row's LSB-first 3-bit stream (the 3 bits may span two bytes).
uint8_t stream_code(const uint8_t* row, uint32_t k) {
  const size_t bit = size_t{k} * 3;
  const uint32_t pair = row[bit / 8] | (bit % 8 > 5 ? uint32_t{row[bit / 8 + 1]} << 8 : 0u);
  return static_cast<uint8_t>((pair >> (bit % 8)) & 7);
}

}  // namespace

qmoe_status import_int3_packed(const char* function, const uint8_t* src, uint32_t n, uint32_t k,
                               void* dst, size_t dst_bytes) {
  if (qmoe_status s = check_matrix_dims(function, n, k); s != QMOE_STATUS_OK) return s;
  if (src == nullptr || dst == nullptr) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "%s is NULL",
                src == nullptr ? "src" : "dst");
  }
  // A row of the stream is 3k/8 whole bytes only when k is a multiple of 8 (every INT3 block
  // size is), so rows start on byte boundaries.
  if (k % 8 != 0) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "k = %u is not a multiple of 8", k);
  }
  const size_t need = codes_size(kInt3Format, n, k);
  if (dst_bytes < need) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                "dst_bytes = %zu but an %u x %u INT3 matrix needs %zu", dst_bytes, n, k, need);
  }
  const size_t row_bytes = size_t{k} / 8 * 3;
  // dst is cleared before src is read: an import in place would read zeros.
  if (ranges_overlap(src, size_t{n} * row_bytes, dst, need)) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "src and dst overlap");
  }
  auto* out = static_cast<uint8_t*>(dst);
  std::memset(out, 0, need);
  const uint32_t chunks = chunk_count(k);
  for (uint32_t row = 0; row < n; ++row) {
    const uint8_t* in = src + row * row_bytes;
    uint8_t* group = out + size_t{row / kGroupRows} * chunks * kInt3TileBytes;
    for (uint32_t kk = 0; kk < k; ++kk) {
      store_code(group + size_t{kk / kChunkCodes} * kInt3TileBytes, row % kGroupRows,
                 kk % kChunkCodes, stream_code(in, kk));
    }
  }
  return QMOE_STATUS_OK;
}

}  // namespace qmoe
