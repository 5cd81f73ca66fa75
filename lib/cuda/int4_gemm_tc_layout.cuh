// Where the tensor-core INT4 GEMM keeps its operands in shared memory, which bytes each lane
// takes from there, and how a lane turns its code bytes into mma B fragments: the index
// arithmetic and the dequantisation as __host__ __device__ functions, so that the kernel
// (int4_gemm_tc_kernel.cuh) and the host-side check of these layouts against the PTX ISA's
// fragment definitions (tests/cuda/int4_gemm_tc_layout_test.cu) run the same code.
//
// Lane notation: g = lane / 4, t = lane % 4. The mma.m16n8k16 fragments (PTX ISA, matrix
// fragments for mma.m16n8k16 with floating point type), each pair with the lower index in the
// low 16 bits of its register:
//   A (16 x 16, row-major): a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
//                           a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
//   B (16 x 8, "col"):      b[0] = B[2t, 2t+1][g]      b[1] = B[2t+8, 2t+9][g]
//   C, D (16 x 8, FP32):    c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
// Here A is X (rows of the m16 tile, k), B is W transposed (k, the 8 rows of one code group).
#ifndef QMOE_LIB_CUDA_INT4_GEMM_TC_LAYOUT_CUH_
#define QMOE_LIB_CUDA_INT4_GEMM_TC_LAYOUT_CUH_

#include <cstdint>

#include "lib/cuda/device_quant_matrix.cuh"
#include "lib/cuda/tc_ptx.cuh"

#define QMOE_TC_HD __host__ __device__ __forceinline__

namespace qmoe::cuda::tc {

// ---- X tile: rows of 64 k, 16-bit (128 bytes a row) or FP32 (256 bytes) elements ----

// Byte offset of 16-byte piece q (k 8q..8q+7 of 16-bit X, 4q..4q+3 of FP32 X) of tile row r.
// 16-bit X: slot q ^ (r % 8), so the 8 rows of an ldmatrix matrix (one q, r % 8 = 0..7) hit 8
// distinct 16-byte bank groups. FP32 X: slot q ^ 2 (r % 4), so the 32 bytes that the 4 lanes of
// a row read (pieces 2c, 2c + 1) stay adjacent and rows r % 4 = 0..3 cover all 32 banks. Rows
// that differ by a multiple of 8 (16-bit) or 4 (FP32) share the swizzle.
QMOE_TC_HD constexpr uint32_t x_piece_offset(uint32_t r, uint32_t q, uint32_t x_element_bytes) {
  return x_element_bytes == 2 ? r * 128 + ((q ^ (r & 7)) << 4)
                              : r * 256 + ((q ^ ((r & 3) << 1)) << 4);
}

// 16-bit X: the row address that `lane` gives ldmatrix.x4 for the m16 tile at tile row row0 (a
// multiple of 16) and the stage's k16 slice s (0..3). Lanes 8i..8i+7 give matrix i's rows:
// matrices 0..3 = (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15,
// k 8-15) of the slice, so ldmatrix's register i is a[i] (PTX ISA, ldmatrix: lane L receives
// elements 2 (L % 4), +1 of row L / 4 of each matrix).
QMOE_TC_HD constexpr uint32_t ldmatrix_row_offset(uint32_t row0, uint32_t s, uint32_t lane) {
  return x_piece_offset(row0 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * s + (lane >> 4), 2);
}

// FP32 X: the offset of the float pair that becomes a[reg] (0..3) of `lane`, m16 tile at tile
// row row0, slice s: A[g + 8 (reg % 2)][16 s + 8 (reg / 2) + 2t, +1].
QMOE_TC_HD constexpr uint32_t fp32_pair_offset(uint32_t row0, uint32_t s, uint32_t reg,
                                               uint32_t lane) {
  return x_piece_offset(row0 + (lane >> 2) + (reg & 1) * 8,
                        4 * s + 2 * (reg >> 1) + ((lane & 3) >> 1), 4) +
         (lane & 1) * 8;
}

// ---- Code tile: the CTA's code groups, two 32-code chunks each, as they lie in memory ----

// Byte offset of row r (0..7) of chunk cc (0, 1) of the CTA's group `tile8`. The loader copies
// 16-byte piece p to p * 16: group p / 16, chunk (p / 8) % 2, row p % 8.
QMOE_TC_HD constexpr uint32_t code_row_offset(uint32_t tile8, uint32_t cc, uint32_t r) {
  return (tile8 * 2 + cc) * kChunkBytes + r * kChunkRowBytes;
}

// The two words of row g that `lane` needs (dequant_chunk_row): word t / 2 (w = 0) and word
// 2 + t / 2 (w = 1), as byte offsets within the row.
QMOE_TC_HD constexpr uint32_t code_word_offset(uint32_t lane, uint32_t w) {
  return (w * 2 + ((lane & 3) >> 1)) * 4;
}

// Element (n, b) of a scale or zero-point plane (docs/formats.md: row term n * row_stride, or
// (n / 8) * group_stride + (n % 8) * row_stride when the group stride is nonzero).
QMOE_TC_HD size_t plane_offset(uint32_t n, uint32_t b, size_t row_stride, size_t block_stride,
                               size_t group_stride) {
  const size_t row = group_stride != 0 ? size_t{n / kGroupRows} * group_stride +
                                             size_t{n % kGroupRows} * row_stride
                                       : size_t{n} * row_stride;
  return row + size_t{b} * block_stride;
}

// One past the last byte of an n x blocks plane of `bytes`-byte elements at `base` (n and blocks
// at least 1). The strides are unsigned, so the largest offset is in the last block, on row
// n - 1 or, with a group stride, on row 7 of the group before the last (a group stride below
// 7 row strides puts that one further).
QMOE_TC_HD uintptr_t plane_end_address(const void* base, uint32_t n, uint32_t blocks,
                                       size_t row_stride, size_t block_stride, size_t group_stride,
                                       uint32_t bytes) {
  size_t last = plane_offset(n - 1, blocks - 1, row_stride, block_stride, group_stride);
  const uint32_t last_group_start = (n - 1) / kGroupRows * kGroupRows;
  if (group_stride != 0 && last_group_start > 0) {
    const size_t before =
        plane_offset(last_group_start - 1, blocks - 1, row_stride, block_stride, group_stride);
    last = before > last ? before : last;
  }
  return reinterpret_cast<uintptr_t>(base) + (last + 1) * bytes;
}

// ---- Plane entries of a stage: [fold unit][CTA column] ----

QMOE_TC_HD constexpr uint32_t plane_entry(uint32_t unit, uint32_t column, uint32_t bn) {
  return unit * bn + column;
}

// A plane element as cp.async moves it into its 4-byte entry. The planes are strided gathers of
// 1-, 2- or 4-byte elements (zero points, 16-bit scales, FP32 scales) and cp.async moves 4, 8 or
// 16 aligned bytes, so the entry receives the aligned word that holds the element: src-size
// bytes from `word`, i.e. from the word's first byte through the element's last one and never
// past it (the bytes before the element lie in the same aligned word, hence in the same
// allocation), the rest of the entry zeroed. The element is then the `bytes` bytes at bit
// `shift` of the entry, which the thread that issued the copy converts in place
// (scale_from_entry, zero_point_from_entry) once its copy has landed.
struct PlaneWord {
  uintptr_t word;      // element address rounded down to 4
  uint32_t src_bytes;  // element offset in the word + element size: 1..4 for an aligned element
  uint32_t shift;      // bit position of the element in the entry
};
QMOE_TC_HD constexpr PlaneWord plane_word(uintptr_t element, uint32_t bytes) {
  const uint32_t offset = static_cast<uint32_t>(element & 3u);
  return {element - offset, offset + bytes, offset * 8};
}

// The FP32 value of a scale element of `dtype` (F32, F16 or BF16) at bit `shift` of `entry`
// (exact). An entry that cp.async zero-filled gives 0.
QMOE_TC_HD float scale_from_entry(qmoe_dtype dtype, uint32_t entry, uint32_t shift) {
  const uint32_t bits = entry >> shift;
  if (dtype == QMOE_DTYPE_F32) return ptx::float_from_bits(bits);
  if (dtype == QMOE_DTYPE_F16) return ptx::half_bits_to_float(static_cast<uint16_t>(bits));
  return ptx::float_from_bits(bits << 16);
}

// A zero point (its low 4 bits, docs/formats.md) at bit `shift` of `entry`.
QMOE_TC_HD constexpr uint32_t zero_point_from_entry(uint32_t entry, uint32_t shift) {
  return (entry >> shift) & 0x0Fu;
}

// ---- Fragment coordinates (PTX ISA layouts above) ----

// Row (within the m16 tile) and column (within the n8 tile) of accumulator c (0..3).
QMOE_TC_HD constexpr uint32_t acc_row(uint32_t c, uint32_t lane) {
  return (lane >> 2) + (c >> 1) * 8;
}
QMOE_TC_HD constexpr uint32_t acc_col(uint32_t c, uint32_t lane) {
  return (lane & 3) * 2 + (c & 1);
}
// The column (W row within the group) of the lane's B fragment.
QMOE_TC_HD constexpr uint32_t b_col(uint32_t lane) {
  return lane >> 2;
}

// ---- Dequantisation ----

// Exponent-trick constants, per 16-bit lane: OR-ing a nibble c into the mantissa of kMagic
// gives exactly kMagic + c (BF16 128: 7 mantissa bits of spacing 1; FP16 1024: 10 bits of
// spacing 1); adding zero_constant(z) = -(kMagic + z) then gives c - z exactly, an integer in
// [-15, 15] that both types hold.
template <bool kBf16>
struct NibbleMagic {
  static constexpr uint32_t kMagic = kBf16 ? 0x43004300u : 0x64006400u;     // 128 / 1024
  static constexpr uint32_t kOne = kBf16 ? 0x3F803F80u : 0x3C003C00u;       // 1.0
  static constexpr uint32_t kNegMagic = kBf16 ? 0xC300C300u : 0xE400E400u;  // -128 / -1024
};

// -(kMagic + z) in both lanes, for a zero point z in 0..15.
template <bool kBf16>
QMOE_TC_HD constexpr uint32_t zero_constant(uint32_t z) {
  return NibbleMagic<kBf16>::kNegMagic | (z * 0x00010001u);
}

// The byte_perm selector of dequant_chunk_row for lane t: t even takes bytes a0, b0, a1, b1 of
// (word_a, word_b), t odd a2, b2, a3, b3.
QMOE_TC_HD constexpr uint32_t permute_selector(uint32_t lane) {
  return (lane & 1) != 0 ? 0x7362u : 0x5140u;
}

// The B fragments of one 8-row x 32-k canonical chunk for `lane` (its row is g): lo = the mma
// over chunk k 0..15, hi = over k 16..31, each {b[0], b[1]}. Row g's 16 bytes are byte
// j = code j | code j+16 << 4, and the lane needs k = 2t, 2t+1, 2t+8, 2t+9 of each half: the
// nibbles of bytes 2t, 2t+1, 2t+8, 2t+9, i.e. half t % 2 of word t / 2 (`word_a`) and of word
// 2 + t / 2 (`word_b`). One byte permute (selector permute_selector(t)) makes
//   v = byte 2t | byte 2t+8 << 8 | byte 2t+1 << 16 | byte 2t+9 << 24
// so that its nibble pairs at bits (s, s + 16) are: s = 0: k (2t, 2t+1); s = 4: (2t+16, 2t+17);
// s = 8: (2t+8, 2t+9); s = 12: (2t+24, 2t+25) -- exactly lo[0], hi[0], lo[1], hi[1].
// z_lo / z_hi: zero_constant() of the zero points of k 0..15 and 16..31 (equal unless the block
// size is 16).
template <bool kBf16>
QMOE_TC_HD void dequant_chunk_row(uint32_t word_a, uint32_t word_b, uint32_t permute, uint32_t z_lo,
                                  uint32_t z_hi, uint32_t (&lo)[2], uint32_t (&hi)[2]) {
  using M = NibbleMagic<kBf16>;
  constexpr uint32_t kMask = 0x000F000Fu;
  const uint32_t v = ptx::byte_perm(word_a, word_b, permute);
  lo[0] = ptx::fma2<kBf16>(ptx::and_or<kMask>(v, M::kMagic), M::kOne, z_lo);
  hi[0] = ptx::fma2<kBf16>(ptx::and_or<kMask>(v >> 4, M::kMagic), M::kOne, z_hi);
  lo[1] = ptx::fma2<kBf16>(ptx::and_or<kMask>(v >> 8, M::kMagic), M::kOne, z_lo);
  hi[1] = ptx::fma2<kBf16>(ptx::and_or<kMask>(v >> 12, M::kMagic), M::kOne, z_hi);
}

}  // namespace qmoe::cuda::tc

#endif  // QMOE_LIB_CUDA_INT4_GEMM_TC_LAYOUT_CUH_
