// The per-warp arithmetic of the decode kernels for INT3 (docs/formats.md, "INT3 weights"): the
// INT4 walk of int4_tile.cuh (its lanes, batches, scale and zero-point planes, exact and fast
// arithmetic) over INT3's code tiles, which this file turns into INT4's nibble words (the
// policy that joins them, Int3Decode, is in decode_formats.cuh).
//
// Bytes. A chunk (8 rows x 32 codes) is a 96-byte tile of three 16-byte-lane vectors; byte
// 32 v + 16 L + j holds, for row 2v + L (rows 0-5), code j in bits 0-2 and code 16 + j in bits
// 3-5, and in bits 6-7 two bits of a code of row 6 + L: vector 0 the low two bits of code j,
// vector 1 those of code 16 + j (bit 6 the code's bit 0, bit 7 its bit 1), vector 2 the high
// bits (bit 6 code j's bit 2, bit 7 code 16 + j's).
//
// Who reads what. The walk's lane l owns row r = l % 8 and chunk slot s = l / 8 (int4_tile.cuh),
// and the kernels' lanes are threadIdx.x % 32. A lane of rows 0-5 loads its row's 16 bytes, the
// tile's bytes 16 r..16 r + 15, so the six lanes of a chunk read its 96 bytes once and a
// warp-wide load covers four chunks, 384 contiguous bytes. The lanes of rows 6 and 7 load
// nothing: their codes' bits are bits 6-7 of the bytes rows L, 2 + L and 4 + L loaded, the lanes
// 6, 4 and 2 below them in the same chunk slot. Every lane packs its bytes' bits 6-7 into one
// word and three shuffles up deliver the three words to rows 6 and 7, which rebuild their codes
// from them; rows 0-5 rebuild theirs from their own bytes. Both end as INT4's nibble words
// (word i, byte j: code 4i + j in bits 0-3, code 16 + 4i + j in bits 4-7), which INT4's exact and
// fast arithmetic read as they read INT4's, with zero point 4 by default.
//
// Why shuffles rather than two more loads for rows 6 and 7: a batch slot would then hold 48
// code bytes a lane instead of 16, and the MoE kernels already run their walks at the register
// cap (int4_tile.cuh, batch_quads).
#ifndef QMOE_LIB_CUDA_INT3_TILE_CUH_
#define QMOE_LIB_CUDA_INT3_TILE_CUH_

#include "lib/cuda/int4_tile.cuh"

namespace qmoe::cuda {

// A word shifted left by s bits, or right by -s.
template <int S>
__device__ __forceinline__ uint32_t shift_left(uint32_t v) {
  if constexpr (S >= 0) {
    return v << S;
  } else {
    return v >> -S;
  }
}

// Row 6 + L's nibble word I from the three packed words of its sources (see nibbles below): the
// low two bits of code 4I + j at field I of lo2's byte j, of code 16 + 4I + j at field I of
// hi2's, and their high bits at bits 2I and 2I + 1 of high's.
template <int I>
__device__ __forceinline__ uint32_t int3_split_row_word(uint32_t lo2, uint32_t hi2, uint32_t high) {
  return ((lo2 >> (2 * I)) & 0x03030303u) | (shift_left<2 - 2 * I>(high) & 0x04040404u) |
         (shift_left<4 - 2 * I>(hi2) & 0x30303030u) | (shift_left<5 - 2 * I>(high) & 0x40404040u);
}

// A row of rows 0-5's nibble word from its own word: code 4i + j (bits 0-2 of byte j) stays,
// code 16 + 4i + j (bits 3-5) moves up to bits 4-6, bits 6-7 (another row's) are dropped.
__device__ __forceinline__ uint32_t int3_own_row_word(uint32_t v) {
  return (v & 0x07070707u) | ((v << 1) & 0x70707070u);
}

struct Int3Codes {
  static constexpr uint32_t kChunkVectors = kInt3ChunkBytes / kChunkRowBytes;  // 6
  static constexpr bool kRowsWithoutCodes = true;                              // rows 6 and 7
  static constexpr uint32_t kDefaultZeroPoint = kInt3DefaultZeroPoint;

  // The lane's row's codes as INT4's nibble words, from the 16 bytes it loaded (zeros for rows
  // 6 and 7). Every lane of the warp must call it (three warp shuffles).
  __device__ __forceinline__ static uint4 nibbles(const uint4& v) {
    // Bits 6-7 of byte j of word i, at bits 2i..2i+1 of byte j.
    const uint32_t packed = ((v.x >> 6) & 0x03030303u) | ((v.y >> 4) & 0x0C0C0C0Cu) |
                            ((v.z >> 2) & 0x30303030u) | (v.w & 0xC0C0C0C0u);
    // Row 6 + L of a chunk slot: from rows L (vector 0: low bits of codes 0-15), 2 + L
    // (vector 1: low bits of codes 16-31) and 4 + L (vector 2: the high bits). Lanes of rows
    // 0-5 receive words they do not use.
    const uint32_t lo2 = __shfl_up_sync(0xFFFFFFFFu, packed, 6);
    const uint32_t hi2 = __shfl_up_sync(0xFFFFFFFFu, packed, 4);
    const uint32_t high = __shfl_up_sync(0xFFFFFFFFu, packed, 2);
    const bool split_row = (threadIdx.x % kGroupRows) >= kInt3WholeRows;
    uint4 out;
    out.x = split_row ? int3_split_row_word<0>(lo2, hi2, high) : int3_own_row_word(v.x);
    out.y = split_row ? int3_split_row_word<1>(lo2, hi2, high) : int3_own_row_word(v.y);
    out.z = split_row ? int3_split_row_word<2>(lo2, hi2, high) : int3_own_row_word(v.z);
    out.w = split_row ? int3_split_row_word<3>(lo2, hi2, high) : int3_own_row_word(v.w);
    return out;
  }
};

// The lane's row of an 8-row group: INT4's scale and zero-point addressing, and its codes at
// 16 r of each 96-byte tile for rows 0-5; none for rows 6 and 7 (their codes come from nibbles).
__device__ __forceinline__ LaneRow int3_lane_row(const DeviceQuantMatrix& w, uint32_t group,
                                                 uint32_t r) {
  LaneRow lr = lane_row(w, group, r);
  lr.codes = r < kInt3WholeRows
                 ? reinterpret_cast<const uint4*>(
                       w.codes + size_t{group} * w.chunks * kInt3ChunkBytes + r * kChunkRowBytes)
                 : nullptr;
  return lr;
}

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_INT3_TILE_CUH_
