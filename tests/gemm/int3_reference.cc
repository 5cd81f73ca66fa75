#include "tests/gemm/int3_reference.h"

namespace qmoe::testing {

Int3BitPosition int3_bit_position(uint32_t n, uint32_t k, uint32_t k_total, int bit) {
  // docs/formats.md: tile (n / 8, k / 32) at ((n / 8) * ceil(K / 32) + k / 32) * 96; in it, with
  // r = n % 8, j = k % 16, h = (k % 32) / 16: rows 0-5 keep code k in bits 3h..3h+2 of byte
  // 32 (r / 2) + 16 (r % 2) + j; rows 6-7 keep its low two bits in bits 6-7 of byte
  // 32 h + 16 (r - 6) + j and its high bit in bit 6 + h of byte 64 + 16 (r - 6) + j.
  const size_t chunks = (size_t{k_total} + 31) / 32;
  const size_t tile = ((size_t{n} / 8) * chunks + k / 32) * 96;
  const uint32_t r = n % 8, j = k % 16, h = (k % 32) / 16;
  if (r < 6) return {tile + 32 * (r / 2) + 16 * (r % 2) + j, static_cast<int>(3 * h) + bit};
  if (bit < 2) return {tile + 32 * h + 16 * (r - 6) + j, 6 + bit};
  return {tile + 64 + 16 * (r - 6) + j, static_cast<int>(6 + h)};
}

std::vector<uint8_t> pack_int3_canonical(const std::vector<uint8_t>& codes, uint32_t n,
                                         uint32_t k) {
  std::vector<uint8_t> out((size_t{n} + 7) / 8 * ((size_t{k} + 31) / 32) * 96, 0);
  for (uint32_t row = 0; row < n; ++row) {
    for (uint32_t col = 0; col < k; ++col) {
      const uint8_t code = codes[size_t{row} * k + col];
      for (int bit = 0; bit < 3; ++bit) {
        const Int3BitPosition at = int3_bit_position(row, col, k, bit);
        out[at.byte] = static_cast<uint8_t>(out[at.byte] | ((code >> bit) & 1) << at.bit);
      }
    }
  }
  return out;
}

uint8_t canonical_int3_code(const uint8_t* canonical, uint32_t n, uint32_t k, uint32_t k_total) {
  uint8_t code = 0;
  for (int bit = 0; bit < 3; ++bit) {
    const Int3BitPosition at = int3_bit_position(n, k, k_total, bit);
    code = static_cast<uint8_t>(code | ((canonical[at.byte] >> at.bit) & 1) << bit);
  }
  return code;
}

Int4Matrix make_int3_matrix(const Int4Options& options, std::mt19937_64& rng) {
  Int4Matrix w = make_int4_matrix(options, rng);
  const uint32_t n = options.n, k = options.k, blocks = k / options.block_size;
  std::uniform_int_distribution<int> code(0, 7);
  for (auto& c : w.code_values) c = static_cast<uint8_t>(code(rng));
  w.codes = pack_int3_canonical(w.code_values, n, k);
  w.desc.format = QMOE_WEIGHT_FORMAT_INT3;
  w.desc.codes = w.codes.data();
  w.zero_values.assign(size_t{n} * blocks, 4);
  if (options.zero_points) {
    const qmoe_quant_matrix& d = w.desc;
    for (uint32_t row = 0; row < n; ++row) {
      const size_t row_offset =
          d.zero_point_group_stride == 0
              ? row * d.zero_point_row_stride
              : (row / 8) * d.zero_point_group_stride + (row % 8) * d.zero_point_row_stride;
      for (uint32_t b = 0; b < blocks; ++b) {
        const uint8_t z = static_cast<uint8_t>(code(rng));
        w.zero_values[size_t{row} * blocks + b] = z;
        w.zero_points[row_offset + b * d.zero_point_block_stride] = z;
      }
    }
  }
  return w;
}

}  // namespace qmoe::testing
