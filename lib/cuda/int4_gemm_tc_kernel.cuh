// The tensor-core INT4 GEMM kernel, a template over the CTA tile, the X type and the fold
// granularity, with the launch and configuration bodies of each X type. Included only by
// int4_gemm_tc_{bf16,f16,f32}.cu, which instantiate it (one X type per file).
//
// Work split. The grid is (column tiles, row tiles); CTA (bx, by) computes rows
// [by * bm, by * bm + bm) of Y against W rows [n0, n0 + bn), n0 = n_base + bx * bn, a multiple
// of 8, so the CTA's W rows are whole 8-row groups of the canonical layout. Warp (kg, wm, wn)
// owns rows wm * 64 .. +63 and W rows wn * 32 .. +31 of the tile: 4 x 4 m16n8 accumulator
// tiles, n8 tile j being W group n0 / 8 + wn * 4 + j. Without split K (kg = 0) the warp runs
// both 32-code chunks of every k-tile; with it, k group kg runs chunk kg, and at the end group
// 1's sums are added to group 0's, which writes Y.
//
// Pipeline. K advances in k-tiles of 64 (two 32-code chunks) through C::kStages shared-memory
// stages (stage_count: 4 to 8). Everything a k-tile reads from global memory travels by
// cp.async, issued kStages - 1 k-tiles ahead: X, the codes, and the scale and zero-point plane
// entries (each the aligned word that holds its element, plane_word). A thread converts the
// plane entries it copied (to the FP32 scale and the zero constant) one k-tile before the warps
// use them, after its own cp.async.wait_group and before the barrier that publishes them. No
// load in the k-loop waits on global memory except through cp.async.wait_group, which waits
// for a k-tile issued kStages - 2 k-tiles earlier. One barrier per k-tile.
//
// (Until this pipeline, the plane elements were loaded into registers after the barrier and
// stored into the stage after that k-tile's MMAs: every k-tile then waited one global round
// trip, about 1 us from HBM, whatever M was; docs/results/2026-12-01-int4-gemm-tc-planes.md.)
//
// Per 32-code chunk a warp dequantises its 4 n8 tiles' codes in registers once
// (dequant_chunk_row) and reuses them for its 4 m16 tiles; each fold unit's MMAs start
// from zero and the unit's sum is folded into the FP32 accumulators with its scale.
#ifndef QMOE_LIB_CUDA_INT4_GEMM_TC_KERNEL_CUH_
#define QMOE_LIB_CUDA_INT4_GEMM_TC_KERNEL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "lib/cuda/int4_gemm_tc_layout.cuh"
#include "lib/cuda/int4_gemm_tc_params.cuh"
#include "lib/cuda/tc_ptx.cuh"

namespace qmoe::cuda::tc {

// How X enters the MMAs: BF16 or FP16 as given; FP32 split into BF16 hi + lo.
enum class XMode { kBf16, kF16, kF32Split };

template <XMode kX>
struct XTraits {
  static constexpr uint32_t kBytes = kX == XMode::kF32Split ? 4 : 2;
  static constexpr bool kBf16Mma = kX != XMode::kF16;
  static constexpr bool kSplit = kX == XMode::kF32Split;
};

template <int kTileIndex, XMode kX, uint32_t kFoldK>
struct Config {
  static constexpr TileGeometry kGeometry = kTileGeometry[kTileIndex];
  static constexpr uint32_t kBM = kGeometry.bm;
  static constexpr uint32_t kBN = kGeometry.bn;
  static constexpr uint32_t kWarpsN = kGeometry.warps_n;
  static constexpr uint32_t kWarpsPerGroup = kGeometry.warps_m * kGeometry.warps_n;
  static constexpr uint32_t kSplitK = kGeometry.split_k;
  static constexpr uint32_t kChunksPerWarp = 2 / kSplitK;  // of each k-tile's two
  static constexpr uint32_t kThreads = tile_threads(kGeometry);
  static constexpr uint32_t kFold = kFoldK;
  static constexpr StageLayout kStage = stage_layout(kGeometry, XTraits<kX>::kBytes, kFold);
  static constexpr uint32_t kStages = stage_count(kGeometry, XTraits<kX>::kBytes, kFold);
  static constexpr size_t kSharedBytes = size_t{kStages} * kStage.bytes;
  // __launch_bounds__'s minimum CTAs per multiprocessor: 0 leaves the register budget to ptxas,
  // except for the 192-thread tile, which ptxas otherwise squeezes to 168 registers (two CTAs
  // per multiprocessor) by spilling; the tile choice counts it at one CTA (192 registers).
  static constexpr uint32_t kMinBlocks = kThreads == 192 ? 1 : 0;
  // Plane entries of one stage: [unit][column], kTileK / kFold units of bn columns.
  static constexpr uint32_t kPlaneEntries = (kTileK / kFold) * kBN;
  // X travels by cp.async with the rest of the stage, and every thread copies (Loader).
  static constexpr bool kXByTma = false;
  static constexpr uint32_t kLoaderThreads = kThreads;
  // The weights enter the MMAs as (code - zero point) exactly, the scale applied in FP32.
  static constexpr bool kScaledWeights = false;

  static_assert(kBM == kWarpRowsM * kGeometry.warps_m && kBN == kWarpRowsN * kWarpsN);
  static_assert(kFold == 16 || kFold == 32);
  static_assert(kSplitK == 1 || kSplitK == 2);
  // The split-K sums pass through the (then idle) stages: a group's 64 accumulators per thread.
  static_assert(kSplitK == 1 || kWarpsPerGroup * 32 * 64 * 4 <= kSharedBytes);
  // The pipeline converts k-tile kt + 1's planes while k-tile kt + kStages - 1 is being copied
  // into a third stage.
  static_assert(kStages >= 3 && kStages <= kMaxStages);
  static_assert(kSharedBytes == shared_bytes(kGeometry, XTraits<kX>::kBytes, kFold));
  static_assert(kThreads % 16 == 0);
  static_assert(kStage.bytes % 128 == 0 && kStage.code_offset % 128 == 0 &&
                kStage.scale_offset % 128 == 0 && kStage.zero_offset % 128 == 0);
};

template <class T>
QMOE_TC_HD uint32_t bits_of(T value) {
  static_assert(sizeof(T) == 4);
  uint32_t bits;
  memcpy(&bits, &value, 4);
  return bits;
}

// A scale as two BF16 parts, hi = rn(s) in the low half and lo = rn(s - hi) in the high half
// (s - hi is exact in FP32). For an FP16 scale hi + lo == s exactly (11 significant bits, 8 in
// hi, the rest in lo), which scale_pairs relies on.
QMOE_TC_HD uint32_t bf16_split_bits(float s) {
  const __nv_bfloat16 hi = __float2bfloat16_rn(s);
  const __nv_bfloat16 lo = __float2bfloat16_rn(s - __bfloat162float(hi));
  return bits_of(__halves2bfloat162(hi, lo));
}

// One 16-bit or 32-bit plane element as FP32 (exact).
QMOE_TC_HD float load_as_float(qmoe_dtype dtype, const void* base, size_t i) {
  if (dtype == QMOE_DTYPE_F32) return static_cast<const float*>(base)[i];
  const uint16_t bits = static_cast<const uint16_t*>(base)[i];
  if (dtype == QMOE_DTYPE_F16) {
    __half h;
    memcpy(&h, &bits, 2);
    return __half2float(h);
  }
  const uint32_t wide = uint32_t{bits} << 16;
  float f;
  memcpy(&f, &wide, 4);
  return f;
}

// A thread's share of filling the stages, with everything that does not depend on the k-tile
// worked out once. With the CTA's threads a multiple of 16 and of bn, every piece a thread
// copies has the same position within its 16-byte row group and every plane entry the same
// column, so a k-tile only moves the source pointers.
//
// Per stage: X rows [m0, m0 + bm) of the k-tile as 16-byte pieces (zeros past M and past K;
// a config whose kXByTma is set copies X by the TMA instead, and the Loader leaves it out);
// the codes of W groups [group0, group0 + bn / 8), chunks 2 kt and 2 kt + 1 (zeros past the
// last group and past the last chunk); and per fold unit and column the scale and zero-point
// plane words (plane_word), which convert_planes turns into the FP32 scale and the zero
// constant (scale 0 and the default zero point past N and K, where the planes are not read: a
// fold unit of padding then adds exactly 0). Both zero fills matter: a zero code still
// dequantises to -zero_point, so X must be zero wherever the codes are padding. A thread's plane
// entries are the same ones in every stage (tid + i * kThreads), so that the thread that
// copies an entry is the one that converts it: its own cp.async.wait_group is then all the
// ordering the conversion needs.
template <class C, XMode kX>
struct Loader {
  // The threads that copy, every one of them with tid < kThreads: the CTA's for the mma.sync
  // tiles, the producer warpgroup's for the wgmma tiles (tid counted from its first thread).
  static constexpr uint32_t kThreads = C::kLoaderThreads;
  static constexpr uint32_t kXBytes = XTraits<kX>::kBytes;
  static constexpr uint32_t kPiecesPerRow = C::kStage.x_row_bytes / 16;  // 8 or 16 (FP32 X)
  static constexpr uint32_t kXPieces = C::kBM * kPiecesPerRow;
  // X is copied by the first kXThreads threads: the largest power of two not above the CTA's
  // (all but for 192), so that they divide the tile's pieces evenly and a thread's pieces are
  // kXRowStep rows apart, a multiple of the swizzle period, at constant offsets from its first.
  static constexpr uint32_t kXThreads = kThreads >= 256 ? 256 : kThreads >= 128 ? 128 : 64;
  static constexpr uint32_t kXPerThread = kXPieces / kXThreads;
  static constexpr uint32_t kXRowStep = kXThreads / kPiecesPerRow;
  // The code tile holds group j's chunk c at (2 j + c) * 128, its row r at + 16 r: piece
  // 16 j + 8 c + r, as the chunks lie in memory.
  static constexpr uint32_t kCodePieces = C::kBN * 2;
  static constexpr uint32_t kCodePerThread = kCodePieces / kThreads;
  static constexpr uint32_t kCodeGroupStep = kThreads / 16;
  static constexpr uint32_t kPlanePerThread = C::kPlaneEntries / kThreads;
  static constexpr uint32_t kPlaneUnitStep = kThreads / C::kBN;
  static_assert(kXPieces % kXThreads == 0 && kCodePieces % kThreads == 0);
  static_assert(kThreads % C::kBN == 0 && C::kPlaneEntries % kThreads == 0);

  // Row (group) starts of the pieces' sources. A piece whose row is past M (group past the
  // last) gets a row (group) that exists and is copied with source size 0, and a piece whose k
  // is past K gets no k offset, so that no address handed to cp.async leaves the buffers.
  // With at most 4 pieces a thread keeps each piece's row start (x_rows); with more (FP32 X on
  // the smaller tiles) that many 64-bit addresses spill, so it recomputes them from x_src.
  static constexpr bool kKeepRows = kXPerThread <= 4;
  const uint8_t* x_rows[kKeepRows ? kXPerThread : 1];
  const uint8_t* x_src;  // row m0 of X (it exists: the CTA has rows)
  size_t x_row_bytes;    // ldx in bytes
  const uint8_t* code_src[kCodePerThread];
  uint32_t x_dst;            // stage offset of piece 0
  uint32_t x_k;              // the pieces' first k within a k-tile
  int32_t x_rows_left;       // rows from piece 0's row to M: piece i exists iff i * step < it
  uint32_t code_chunk;       // the pieces' chunk within a k-tile (0 or 1)
  int32_t code_groups_left;  // likewise for the groups of the code pieces
  uintptr_t scale_src;       // element (n, block 0) of this thread's column n (the plane's start
  uintptr_t zero_src;        // past N); zero_src is 0 without zero points
  uint32_t plane_k;          // k of its first plane entry within a k-tile: (tid / bn) * kFold
  bool column_ok;            // this thread's column is below N

  static_assert(kXRowStep % (kXBytes == 2 ? 8 : 4) == 0);  // see x_piece_offset

  QMOE_TC_HD Loader(const Params& p, uint32_t rows, uint32_t m0, uint32_t n0, uint32_t tid) {
    const uint32_t r0 = tid / kPiecesPerRow, q = tid % kPiecesPerRow;
    x_k = q * (16 / kXBytes);
    x_dst = x_piece_offset(r0, q, kXBytes);
    x_rows_left = static_cast<int32_t>(rows - m0) - static_cast<int32_t>(r0);
    x_row_bytes = p.ldx * kXBytes;
    x_src = static_cast<const uint8_t*>(p.x) + size_t{m0} * x_row_bytes;
    if constexpr (kKeepRows) {
#pragma unroll
      for (uint32_t i = 0; i < kXPerThread; ++i) {
        const bool row_ok = static_cast<int32_t>(i * kXRowStep) < x_rows_left;
        x_rows[i] = row_ok ? x_src + (r0 + i * kXRowStep) * x_row_bytes : x_src;
      }
    }
    const uint32_t groups = (p.w.n + kGroupRows - 1) / kGroupRows;
    const uint32_t group = n0 / kGroupRows + tid / 16;
    code_chunk = (tid / 8) % 2;
    code_groups_left = static_cast<int32_t>(groups - group);
#pragma unroll
    for (uint32_t i = 0; i < kCodePerThread; ++i) {
      const uint32_t g = static_cast<int32_t>(i * kCodeGroupStep) < code_groups_left
                             ? group + i * kCodeGroupStep
                             : n0 / kGroupRows;
      code_src[i] = p.w.codes + size_t{g} * p.w.chunks * kChunkBytes + (tid % 8) * kChunkRowBytes;
    }
    const uint32_t n = n0 + tid % C::kBN;
    column_ok = n < p.w.n;
    plane_k = tid / C::kBN * C::kFold;
    const size_t scale_row =
        column_ok ? plane_offset(n, 0, p.w.scale_row_stride, 0, p.w.scale_group_stride) : 0;
    const size_t zero_row =
        column_ok ? plane_offset(n, 0, p.w.zero_point_row_stride, 0, p.w.zero_point_group_stride)
                  : 0;
    scale_src = reinterpret_cast<uintptr_t>(p.w.scales) + scale_row * p.scale_bytes;
    zero_src =
        p.w.zero_points != nullptr ? reinterpret_cast<uintptr_t>(p.w.zero_points) + zero_row : 0;
  }

  // The block of this thread's plane entry i in k-tile kt (0 when the entry is missing), and
  // whether the entry exists: its column below N and its fold unit below K. A missing entry is
  // copied with src-size 0 from block 0 of its row (past N, the plane's start): an address
  // that exists.
  QMOE_TC_HD bool plane_block(const Params& p, uint32_t kt, uint32_t i, uint32_t& block) const {
    const uint32_t k = kt * kTileK + plane_k + i * kPlaneUnitStep * C::kFold;
    const bool valid = column_ok && k < p.w.k;
    block = valid ? k >> p.block_shift : 0u;
    return valid;
  }

  // Issues the cp.async copies of k-tile kt into `stage`: X (unless the TMA brings it), the
  // codes and the plane words.
  QMOE_TC_HD void copy_async(const Params& p, uint8_t* stage, uint32_t kt, uint32_t tid) const {
    copy_operands(p, stage, kt, tid);
    copy_planes(p, stage, kt, tid);
  }

  // The cp.async copies of k-tile kt's X (unless the TMA brings it) and codes into `stage`.
  QMOE_TC_HD void copy_operands(const Params& p, uint8_t* stage, uint32_t kt, uint32_t tid) const {
    const uint32_t x_s = ptx::shared_address(stage);
    if (!C::kXByTma && (kXThreads == kThreads || tid < kXThreads)) {  // warp-uniform
      const bool k_ok = kt * kTileK + x_k < p.w.k;  // K is a multiple of 16: whole pieces
      const size_t x_advance = k_ok ? (size_t{kt} * kTileK + x_k) * kXBytes : 0;
      // Without kept rows the row size passes through an opaque move, so that the compiler
      // recomputes each address here rather than hoisting kXPerThread of them out of the loop.
      const size_t row_bytes = kKeepRows ? 0 : ptx::opaque(x_row_bytes);
#pragma unroll
      for (uint32_t i = 0; i < kXPerThread; ++i) {
        const bool row_ok = static_cast<int32_t>(i * kXRowStep) < x_rows_left;
        const uint8_t* src;
        if constexpr (kKeepRows) {
          src = x_rows[i];
        } else {
          src = x_src + (row_ok ? tid / kPiecesPerRow + i * kXRowStep : 0) * row_bytes;
        }
        ptx::cp_async_16(x_s + x_dst + i * kXRowStep * C::kStage.x_row_bytes, src + x_advance,
                         k_ok && row_ok);
      }
    }
    const uint32_t codes_s = x_s + C::kStage.code_offset;
    const bool chunk_ok = kt * 2 + code_chunk < p.w.chunks;
    const size_t code_advance = chunk_ok ? (size_t{kt} * 2 + code_chunk) * kChunkBytes : 0;
#pragma unroll
    for (uint32_t i = 0; i < kCodePerThread; ++i) {
      const bool valid = chunk_ok && static_cast<int32_t>(i * kCodeGroupStep) < code_groups_left;
      const uint32_t piece = tid + i * kThreads;
      ptx::cp_async_16(codes_s + code_row_offset(piece / 16, (piece / 8) % 2, piece % 8),
                       code_src[i] + code_advance, valid);
    }
  }

  // The cp.async copies of k-tile kt's plane words into `stage` (convert_planes finishes them).
  QMOE_TC_HD void copy_planes(const Params& p, uint8_t* stage, uint32_t kt, uint32_t tid) const {
    const uint32_t x_s = ptx::shared_address(stage);
    const uint32_t scales_s = x_s + C::kStage.scale_offset;
    const uint32_t zeros_s = x_s + C::kStage.zero_offset;
    const bool near_end = kt >= p.tail_ktile;  // uniform: only these k-tiles test for the tail
#pragma unroll
    for (uint32_t i = 0; i < kPlanePerThread; ++i) {
      uint32_t b;
      const bool valid = plane_block(p, kt, i, b);
      const uint32_t e = (tid + i * kThreads) * 4;  // plane_entry(tid / bn + i * step, column)
      const PlaneWord s = plane_word(scale_src + size_t{b} * p.scale_block_bytes, p.scale_bytes);
      if (near_end && valid &&
          s.word + 4 > p.scale_end) {  // the plane's last word: see load_tail_entry
        load_tail_entry(stage + C::kStage.scale_offset + e, s, p.scale_bytes);
      } else {
        ptx::cp_async_4(scales_s + e, reinterpret_cast<const void*>(s.word),
                        valid ? s.src_bytes : 0u);
      }
      if (p.w.zero_points != nullptr) {  // uniform
        const PlaneWord z = plane_word(zero_src + size_t{b} * p.zero_block_bytes, 1);
        if (near_end && valid && z.word + 4 > p.zero_end) {
          load_tail_entry(stage + C::kStage.zero_offset + e, z, 1);
        } else {
          ptx::cp_async_4(zeros_s + e, reinterpret_cast<const void*>(z.word),
                          valid ? z.src_bytes : 0u);
        }
      }
    }
  }

  // The entry of an element in the plane's last aligned word, which reaches past the plane's
  // end: loaded here with a plain load of the element alone, not by cp.async. cp.async with
  // src-size < 4 reads only the element (PTX ISA), but compute-sanitizer memcheck checks the
  // whole 4-byte word and reports the bytes past an allocation that ends with the plane (shown
  // on the H200 with a one-instruction kernel). One entry per plane and CTA column, at the last
  // block: the synchronous load costs one latency there. The entry is this thread's, read only
  // by its own convert_planes, like a cp.async entry.
  QMOE_TC_HD static void load_tail_entry(uint8_t* entry, const PlaneWord& w, uint32_t bytes) {
    const uintptr_t element = w.word + w.shift / 8;
    const uint32_t value = bytes == 2 ? *reinterpret_cast<const uint16_t*>(element)
                                      : *reinterpret_cast<const uint8_t*>(element);
    *reinterpret_cast<uint32_t*>(entry) = value << w.shift;
  }

  // The pipeline's prologue: k-tiles 0 .. kStages - 2 into the stages of the same index, one
  // cp.async group each (empty past the last k-tile, so that the group counting of the k-loop
  // holds for any K); then k-tile 0's planes converted (its group has landed: at most
  // kStages - 2 are pending).
  QMOE_TC_HD void prologue(const Params& p, uint8_t* smem, uint32_t tid) const {
#pragma unroll
    for (uint32_t s = 0; s + 1 < C::kStages; ++s) {
      if (s < p.k_tiles) copy_async(p, smem + s * C::kStage.bytes, s, tid);
      ptx::cp_async_commit();
    }
    ptx::cp_async_wait<C::kStages - 2>();
    convert_planes(p, smem, 0, tid);
  }

  // The stage that k-tile kt + kStages - 1 is copied into while k-tile kt is computed in
  // `stage`: k-tile kt - 1's.
  QMOE_TC_HD static uint32_t refill_stage(uint32_t stage) {
    return stage == 0 ? C::kStages - 1 : stage - 1;
  }

  // The k-loop's loading step for k-tile kt (in `stage`), after the barrier that follows the
  // wait for k-tiles kt and kt + 1 (which no warp is still reading k-tile kt - 1 past): k-tile
  // kt + kStages - 1 into kt - 1's stage, one cp.async group (empty past the last k-tile), and
  // k-tile kt + 1's plane entries converted, this thread's own copies (landed); the warps read
  // them after the next barrier, and nothing reads that stage now (its previous k-tile,
  // kt + 1 - kStages, was finished before this barrier). Returns k-tile kt + 1's stage.
  QMOE_TC_HD uint32_t advance(const Params& p, uint8_t* smem, uint32_t kt, uint32_t stage,
                              uint32_t tid) const {
    const uint32_t refill = refill_stage(stage);
    const uint32_t following = stage + 1 == C::kStages ? 0 : stage + 1;
    const uint32_t next = kt + C::kStages - 1;
    if (next < p.k_tiles) copy_async(p, smem + refill * C::kStage.bytes, next, tid);
    ptx::cp_async_commit();
    if (kt + 1 < p.k_tiles) convert_planes(p, smem + following * C::kStage.bytes, kt + 1, tid);
    return following;
  }

  // Plane entry e of `stage` as the warps read it: the FP32 scale (its two BF16 parts with
  // scaled weights: bf16_split_bits) and the zero constant of zero point z. Both routes for the
  // planes (convert_planes, store_plane_values) end here.
  QMOE_TC_HD static void write_entry(uint8_t* stage, uint32_t e, float scale, uint32_t z) {
    reinterpret_cast<uint32_t*>(stage + C::kStage.scale_offset)[e] =
        C::kScaledWeights ? bf16_split_bits(scale) : bits_of(scale);
    reinterpret_cast<uint32_t*>(stage + C::kStage.zero_offset)[e] =
        zero_constant<XTraits<kX>::kBf16Mma>(z);
  }

  // Turns this thread's plane entries of k-tile kt in `stage` into the FP32 scale and the zero
  // constant, in place. Only after this thread's cp.async.wait_group for k-tile kt (the entries
  // are its own copies) and before the barrier that lets the warps read them. An element's bit
  // position in its entry depends only on its address modulo 4, so 32-bit arithmetic on the
  // low address bits finds it.
  QMOE_TC_HD void convert_planes(const Params& p, uint8_t* stage, uint32_t kt, uint32_t tid) const {
    auto* scales = reinterpret_cast<uint32_t*>(stage + C::kStage.scale_offset);
    auto* zeros = reinterpret_cast<uint32_t*>(stage + C::kStage.zero_offset);
#pragma unroll
    for (uint32_t i = 0; i < kPlanePerThread; ++i) {
      uint32_t b;
      const bool valid = plane_block(p, kt, i, b);
      const uint32_t e = tid + i * kThreads;
      const uint32_t scale_low =
          static_cast<uint32_t>(scale_src) + b * static_cast<uint32_t>(p.scale_block_bytes);
      // A missing entry was zero-filled: scale 0.
      const float scale =
          scale_from_entry(p.w.scale_dtype, scales[e], plane_word(scale_low, 0).shift);
      uint32_t z = kInt4DefaultZeroPoint;
      if (p.w.zero_points != nullptr && valid) {
        const uint32_t zero_low =
            static_cast<uint32_t>(zero_src) + b * static_cast<uint32_t>(p.zero_block_bytes);
        z = zero_point_from_entry(zeros[e], plane_word(zero_low, 0).shift);
      }
      write_entry(stage, e, scale, z);
    }
  }

  // The other route for the planes (the wgmma tiles' producer): this thread's plane elements of
  // k-tile kt loaded into registers, some k-tiles before the stage is filled, and stored into
  // the stage already converted (store_plane_values), so that no wait for a copy's landing lies
  // between the producer and the stage's publication. Each element is loaded alone, with its own
  // size: no aligned word, no tail case.
  struct PlaneValues {
    uint32_t scale[kPlanePerThread];  // the element's bits, as loaded
    uint32_t zero[kPlanePerThread];   // the zero point as loaded (the default without them)
    uint32_t valid;                   // bit i: entry i exists (else scale 0, default zero point)
  };
  // Branch-free: a missing entry's block is 0 (plane_block), whose element exists (its column's
  // first, or the plane's first past N), so every load is issued, and whether the entry exists
  // is kept beside the value for store_plane_values to apply: a select here would wait for the
  // load at once, where the stage's store is some k-tiles later. kF16Scales: the scales
  // are known to be FP16 (scaled weights), so their size is no branch either.
  template <bool kF16Scales = false>
  QMOE_TC_HD void load_plane_values(const Params& p, uint32_t kt, PlaneValues& v) const {
    v.valid = 0;
#pragma unroll
    for (uint32_t i = 0; i < kPlanePerThread; ++i) {
      uint32_t b;
      v.valid |= plane_block(p, kt, i, b) ? 1u << i : 0u;
      const uintptr_t scale = scale_src + size_t{b} * p.scale_block_bytes;
      if (kF16Scales || p.scale_bytes != 4) {
        v.scale[i] = *reinterpret_cast<const uint16_t*>(scale);
      } else {
        v.scale[i] = *reinterpret_cast<const uint32_t*>(scale);
      }
      v.zero[i] = p.w.zero_points != nullptr  // uniform
                      ? *reinterpret_cast<const uint8_t*>(zero_src + size_t{b} * p.zero_block_bytes)
                      : uint32_t{kInt4DefaultZeroPoint};
    }
  }
  // The entries of `v` (k-tile kt's, this thread's: tid + i * kThreads) into `stage` as
  // convert_planes leaves them. kF16Scales: the scales are known to be FP16 (scaled weights).
  template <bool kF16Scales = false>
  QMOE_TC_HD void store_plane_values(const Params& p, uint8_t* stage, const PlaneValues& v,
                                     uint32_t tid) const {
#pragma unroll
    for (uint32_t i = 0; i < kPlanePerThread; ++i) {
      const bool valid = (v.valid >> i) & 1u;
      const uint32_t bits = valid ? v.scale[i] : 0u;  // scale 0 for a missing entry
      const float scale = kF16Scales ? ptx::half_bits_to_float(static_cast<uint16_t>(bits))
                                     : scale_from_entry(p.w.scale_dtype, bits, 0);
      const uint32_t z = valid ? v.zero[i] & 0x0Fu : uint32_t{kInt4DefaultZeroPoint};
      write_entry(stage, tid + i * kThreads, scale, z);
    }
  }
};

// x = hi + lo + r with hi = rn(x), lo = rn(x - hi) in BF16 (x - hi is exact in FP32), so
// |r| <= 2^-16 |x|; both pairs packed with the first value in the low half.
QMOE_TC_HD void split_bf16x2(float2 v, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(v.x, v.y);
  const float2 back = __bfloat1622float2(h);
  hi = bits_of(h);
  lo = bits_of(__floats2bfloat162_rn(v.x - back.x, v.y - back.y));
}

// Stage-relative offsets that depend only on the lane and the warp, worked out once
// (int4_gemm_tc_layout.cuh defines each). A warp's chunks within each k-tile are
// first_chunk .. first_chunk + kChunksPerWarp - 1, first_chunk = kg * kChunksPerWarp for the
// warp's k group kg; the offsets below already point at the first, and slices and fold units
// are counted from there ("local").
struct LaneOffsets {
  uint32_t codes;    // word_a of row b_col of the warp's first group, first chunk
  uint32_t permute;  // permute_selector(lane)
  uint32_t zeros;    // plane entry (first chunk's first unit, the lane's B column), in bytes
  uint32_t scales;   // plane entry (same unit, the lane's first accumulator column), in bytes
  uint32_t a[4];     // 16-bit X: ldmatrix_row_offset(warp's first row, slice, lane), local slice
  uint32_t f32[4];   // FP32 X: fp32_pair_offset(warp's first row, first chunk's slice h,
                     // 2 u, lane) at [2 h + u]
};

// FP32 X: fp32_pair_offset(warp's first row + 16 i, slice, reg, lane) for local slice s, from
// the four offsets kept. Piece 4 s + 2 (reg / 2) + t / 2 is swizzled in its bits 1-2 only, so a
// chunk (s / 2) adds 128 bytes; reg % 2 selects row g + 8 (256 bytes a row), and the swizzle
// repeats every 4 rows.
QMOE_TC_HD uint32_t fp32_pair_from(const uint32_t (&f32)[4], uint32_t i, uint32_t s, uint32_t reg) {
  return f32[(s & 1) * 2 + (reg >> 1)] + (s >> 1) * 128 + (reg & 1) * 8 * 256 + i * 16 * 256;
}

template <class C>
QMOE_TC_HD LaneOffsets lane_offsets(uint32_t kg, uint32_t wm, uint32_t wn, uint32_t lane) {
  const uint32_t first_chunk = kg * C::kChunksPerWarp;
  constexpr uint32_t kUnitsPerChunk = 32 / C::kFold;
  LaneOffsets o;
  o.codes = code_row_offset(wn * 4, first_chunk, b_col(lane)) + code_word_offset(lane, 0);
  o.permute = permute_selector(lane);
  o.zeros = plane_entry(first_chunk * kUnitsPerChunk, wn * kWarpRowsN + b_col(lane), C::kBN) * 4;
  o.scales =
      plane_entry(first_chunk * kUnitsPerChunk, wn * kWarpRowsN + acc_col(0, lane), C::kBN) * 4;
  for (uint32_t s = 0; s < 4; ++s) {
    o.a[s] = s < 2 * C::kChunksPerWarp
                 ? ldmatrix_row_offset(wm * kWarpRowsM, 2 * first_chunk + s, lane)
                 : 0;
    o.f32[s] = fp32_pair_offset(wm * kWarpRowsM, 2 * first_chunk + (s >> 1), (s & 1) * 2, lane);
  }
  // Kept in registers for the whole loop rather than recomputed from the lane every k-tile.
  o.codes = ptx::opaque32(o.codes);
  o.permute = ptx::opaque32(o.permute);
  o.zeros = ptx::opaque32(o.zeros);
  o.scales = ptx::opaque32(o.scales);
  for (uint32_t s = 0; s < 4; ++s) {
    o.a[s] = ptx::opaque32(o.a[s]);
    o.f32[s] = ptx::opaque32(o.f32[s]);
  }
  return o;
}

// The A fragment of m16 tile i of the warp for the stage's k16 slice s (a_lo: FP32 X's low
// parts).
template <class C, XMode kX>
QMOE_TC_HD void load_a(uint32_t (&a)[4], uint32_t (&a_lo)[4], const uint8_t* stage,
                       const LaneOffsets& o, uint32_t i, uint32_t s) {
  if constexpr (!XTraits<kX>::kSplit) {
    // ldmatrix_row_offset(row0 + 16 i, ...) = ldmatrix_row_offset(row0, ...) + 16 i rows: the
    // swizzle repeats every 8 rows.
    ptx::ldmatrix_x4(a, ptx::shared_address(stage) + i * 16 * C::kStage.x_row_bytes + o.a[s]);
  } else {
#pragma unroll
    for (uint32_t reg = 0; reg < 4; ++reg) {
      const float2 v = *reinterpret_cast<const float2*>(stage + fp32_pair_from(o.f32, i, s, reg));
      split_bf16x2(v, a[reg], a_lo[reg]);
    }
  }
}

// acc += scale * sum for one m16n8 tile: columns 2t (c[0], c[2]) and 2t + 1 (c[1], c[3]).
QMOE_TC_HD void fold(float (&acc)[4], const float (&sum)[4], float2 scale) {
  acc[0] = fmaf(scale.x, sum[0], acc[0]);
  acc[1] = fmaf(scale.y, sum[1], acc[1]);
  acc[2] = fmaf(scale.x, sum[2], acc[2]);
  acc[3] = fmaf(scale.y, sum[3], acc[3]);
}

// sum (+)= A * B over one k16 slice; FP32 X adds its low part first, then the high part.
template <XMode kX>
QMOE_TC_HD void mma_slice(float (&sum)[4], const uint32_t (&a)[4], const uint32_t (&a_lo)[4],
                          const uint32_t (&b)[2], bool first) {
  constexpr bool kBf16 = XTraits<kX>::kBf16Mma;
  const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const uint32_t(&a_first)[4] = XTraits<kX>::kSplit ? a_lo : a;
  if (first) {
    ptx::mma_16816<kBf16>(sum, a_first, b[0], b[1], zero);
  } else {
    ptx::mma_16816<kBf16>(sum, a_first, b[0], b[1], sum);
  }
  if constexpr (XTraits<kX>::kSplit) ptx::mma_16816<kBf16>(sum, a, b[0], b[1], sum);
}

// The MMAs of one stage (k-tile) for the calling warp.
template <class C, XMode kX>
QMOE_TC_HD void compute_stage(float (&acc)[4][4][4], const uint8_t* stage, const LaneOffsets& o) {
  constexpr bool kBf16 = XTraits<kX>::kBf16Mma;
  const uint8_t* codes = stage + C::kStage.code_offset + o.codes;
  const uint8_t* scales = stage + C::kStage.scale_offset + o.scales;
  const uint8_t* zeros = stage + C::kStage.zero_offset + o.zeros;
  constexpr uint32_t kUnitBytes = C::kBN * 4;  // one fold unit's plane entries
#pragma unroll
  for (uint32_t cc = 0; cc < C::kChunksPerWarp; ++cc) {  // local chunks
    // Fold units of the chunk's two k16 halves (the same unit when kFold == 32).
    constexpr uint32_t kUnitsPerChunk = 32 / C::kFold;
    const uint32_t unit_lo = cc * kUnitsPerChunk, unit_hi = unit_lo + kUnitsPerChunk - 1;
    uint32_t b[4][2][2];  // [n8 tile][chunk half][register]
    float2 scale[4][2];   // [n8 tile][chunk half]: columns 2t, 2t + 1
#pragma unroll
    for (uint32_t j = 0; j < 4; ++j) {
      const uint8_t* row = codes + (j * 2 + cc) * kChunkBytes;
      constexpr uint32_t kWordB = code_word_offset(0, 1) - code_word_offset(0, 0);
      const uint32_t word_a = *reinterpret_cast<const uint32_t*>(row);
      const uint32_t word_b = *reinterpret_cast<const uint32_t*>(row + kWordB);
      const uint32_t z_lo =
          *reinterpret_cast<const uint32_t*>(zeros + unit_lo * kUnitBytes + j * 32);
      const uint32_t z_hi =
          *reinterpret_cast<const uint32_t*>(zeros + unit_hi * kUnitBytes + j * 32);
      dequant_chunk_row<kBf16>(word_a, word_b, o.permute, z_lo, z_hi, b[j][0], b[j][1]);
      scale[j][0] = *reinterpret_cast<const float2*>(scales + unit_lo * kUnitBytes + j * 32);
      scale[j][1] = *reinterpret_cast<const float2*>(scales + unit_hi * kUnitBytes + j * 32);
    }
#pragma unroll
    for (uint32_t i = 0; i < 4; ++i) {
      // Slice by slice, so that one slice's A fragment is live at a time; with kFold == 32 the
      // two slices' products of each n8 tile chain into one sum, folded after the second.
      float sum[4][4];
#pragma unroll
      for (uint32_t h = 0; h < 2; ++h) {
        uint32_t a[4], a_lo[4];
        load_a<C, kX>(a, a_lo, stage, o, i, cc * 2 + h);
#pragma unroll
        for (uint32_t j = 0; j < 4; ++j) {
          mma_slice<kX>(sum[j], a, a_lo, b[j][h], C::kFold == 16 || h == 0);
          if (C::kFold == 16 || h == 1) fold(acc[i][j], sum[j], scale[j][h]);
        }
      }
    }
  }
}

// Y[row][col], Y[row][col + 1] for the written ones of the two (col is even); one vector store
// when both are written and the launch allows pairs.
QMOE_TC_HD void store_pair(const Params& p, uint32_t row, uint32_t col, float v0, float v1,
                           bool in0, bool in1) {
  const size_t at = size_t{row} * p.ldy + col;
  const bool pair = p.y_pairs && in0 && in1;
  switch (p.y_dtype) {
    case QMOE_DTYPE_F16: {
      __half* y = static_cast<__half*>(p.y) + at;
      if (pair) {
        *reinterpret_cast<__half2*>(y) = __floats2half2_rn(v0, v1);
      } else {
        if (in0) y[0] = __float2half_rn(v0);
        if (in1) y[1] = __float2half_rn(v1);
      }
      return;
    }
    case QMOE_DTYPE_BF16: {
      __nv_bfloat16* y = static_cast<__nv_bfloat16*>(p.y) + at;
      if (pair) {
        *reinterpret_cast<__nv_bfloat162*>(y) = __floats2bfloat162_rn(v0, v1);
      } else {
        if (in0) y[0] = __float2bfloat16_rn(v0);
        if (in1) y[1] = __float2bfloat16_rn(v1);
      }
      return;
    }
    case QMOE_DTYPE_F32:
      break;
  }
  float* y = static_cast<float*>(p.y) + at;
  if (pair) {
    *reinterpret_cast<float2*>(y) = make_float2(v0, v1);
  } else {
    if (in0) y[0] = v0;
    if (in1) y[1] = v1;
  }
}

// Y[row][col .. col + 7] (col a multiple of 8, all eight written) as 16-byte stores: one for
// 16-bit Y, two for FP32. Only where p.y_octets says the addresses are 16-byte aligned.
QMOE_TC_HD void store_octet(const Params& p, uint32_t row, uint32_t col, const float (&v)[8]) {
  const size_t at = size_t{row} * p.ldy + col;
  // The eight values as four 16-bit pairs, each converted by `pair`, at element `at` of Y.
  const auto store_pairs = [&](auto pair) {
    uint4 packed;
    packed.x = bits_of(pair(v[0], v[1]));
    packed.y = bits_of(pair(v[2], v[3]));
    packed.z = bits_of(pair(v[4], v[5]));
    packed.w = bits_of(pair(v[6], v[7]));
    *reinterpret_cast<uint4*>(static_cast<uint8_t*>(p.y) + at * 2) = packed;
  };
  switch (p.y_dtype) {
    case QMOE_DTYPE_F16:
      return store_pairs([](float a, float b) { return __floats2half2_rn(a, b); });
    case QMOE_DTYPE_BF16:
      return store_pairs([](float a, float b) { return __floats2bfloat162_rn(a, b); });
    case QMOE_DTYPE_F32:
      break;
  }
  float4* y = reinterpret_cast<float4*>(static_cast<float*>(p.y) + at);
  y[0] = make_float4(v[0], v[1], v[2], v[3]);
  y[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// Writes the warp's outputs: rows < M, columns in [n_begin, n_end) only; bias added in FP32.
template <class C>
QMOE_TC_HD void store_outputs(const Params& p, const float (&acc)[4][4][4], uint32_t rows,
                              uint32_t m0, uint32_t n0, uint32_t wm, uint32_t wn, uint32_t lane) {
#pragma unroll
  for (uint32_t j = 0; j < 4; ++j) {
    const uint32_t col = n0 + wn * kWarpRowsN + j * 8 + acc_col(0, lane);  // even
    const bool in0 = col >= p.n_begin && col < p.n_end;
    const bool in1 = col + 1 >= p.n_begin && col + 1 < p.n_end;
    const bool bias = p.w.bias != nullptr;
    const float bias0 = bias && in0 ? load_as_float(p.w.bias_dtype, p.w.bias, col) : 0.0f;
    const float bias1 = bias && in1 ? load_as_float(p.w.bias_dtype, p.w.bias, col + 1) : 0.0f;
#pragma unroll
    for (uint32_t i = 0; i < 4; ++i) {
#pragma unroll
      for (uint32_t half = 0; half < 2; ++half) {
        const uint32_t row = m0 + wm * kWarpRowsM + i * 16 + acc_row(2 * half, lane);
        if (row < rows) {
          float v0 = acc[i][j][2 * half], v1 = acc[i][j][2 * half + 1];
          if (bias) {
            v0 += bias0;
            v1 += bias1;
          }
          store_pair(p, row, col, v0, v1, in0, in1);
        }
      }
    }
  }
}

// One CTA's work: (bx, by) as blockIdx, thread tid of C::kThreads, `smem` its dynamic shared
// memory (C::kStages stages). The kernel below runs it; the emulation test runs it on host
// threads.
template <class C, XMode kX>
QMOE_TC_HD void run_cta(const Params& p, uint8_t* smem, uint32_t bx, uint32_t by, uint32_t tid) {
  const uint32_t rows = p.m_device != nullptr ? (*p.m_device < p.m ? *p.m_device : p.m) : p.m;
  const uint32_t m0 = by * C::kBM;
  if (m0 >= rows) return;  // the whole CTA, before any barrier
  const uint32_t n0 = p.n_base + bx * C::kBN;
  const uint32_t lane = tid & 31, warp = tid >> 5;
  // Warp = (k group, warp row, warp column), the column fastest.
  const uint32_t kg = warp / C::kWarpsPerGroup, in_group = warp % C::kWarpsPerGroup;
  const uint32_t wm = in_group / C::kWarpsN, wn = in_group % C::kWarpsN;
  const LaneOffsets offsets = lane_offsets<C>(kg, wm, wn, lane);

  float acc[4][4][4];
#pragma unroll
  for (uint32_t i = 0; i < 4; ++i) {
#pragma unroll
    for (uint32_t j = 0; j < 4; ++j) {
#pragma unroll
      for (uint32_t c = 0; c < 4; ++c) acc[i][j][c] = 0.0f;
    }
  }

  Loader<C, kX> loader(p, rows, m0, n0, tid);
  loader.prologue(p, smem, tid);
  uint32_t stage = 0;  // of k-tile kt: kt % kStages, kept as a counter
  for (uint32_t kt = 0; kt < p.k_tiles; ++kt) {
    // kStages - 1 + kt groups are committed; with at most kStages - 3 pending, this thread's
    // copies of k-tiles kt and kt + 1 have landed.
    ptx::cp_async_wait<C::kStages - 3>();
    // All threads' copies and plane conversions of k-tile kt are now visible, and every warp has
    // finished k-tile kt - 1, whose stage (kt + kStages - 1) % kStages is refilled next.
    ptx::cta_barrier();
    const uint32_t following = loader.advance(p, smem, kt, stage, tid);
    compute_stage<C, kX>(acc, smem + stage * C::kStage.bytes, offsets);
    stage = following;
  }
  ptx::cp_async_wait<0>();  // only empty groups can remain; none outlives the kernel

  if constexpr (C::kSplitK == 2) {
    // k group 1 hands its sums to group 0 through the stages: after this barrier no warp reads
    // them any more and no copy into them is pending. Entry [warp in group][c][lane], so that a
    // warp's stores and loads are 32 consecutive words.
    ptx::cta_barrier();
    auto* partial = reinterpret_cast<float*>(smem) + in_group * 64 * 32 + lane;
    if (kg == 1) {
#pragma unroll
      for (uint32_t c = 0; c < 64; ++c) partial[c * 32] = acc[c / 16][(c / 4) % 4][c % 4];
    }
    ptx::cta_barrier();
    if (kg == 1) return;
#pragma unroll
    for (uint32_t c = 0; c < 64; ++c) acc[c / 16][(c / 4) % 4][c % 4] += partial[c * 32];
  }
  store_outputs<C>(p, acc, rows, m0, n0, wm, wn, lane);
}

template <int kTileIndex, XMode kX, uint32_t kFold>
__global__ void __launch_bounds__(Config<kTileIndex, kX, kFold>::kThreads,
                                  Config<kTileIndex, kX, kFold>::kMinBlocks)
    int4_gemm_tc_kernel(const __grid_constant__ Params p) {
  extern __shared__ __align__(128) uint8_t smem[];
  run_cta<Config<kTileIndex, kX, kFold>, kX>(p, smem, blockIdx.x, blockIdx.y, threadIdx.x);
}

template <XMode kX, int kTileIndex, uint32_t kFold>
cudaError_t launch_one(const Params& p, dim3 grid, cudaStream_t stream) {
  using C = Config<kTileIndex, kX, kFold>;
  int4_gemm_tc_kernel<kTileIndex, kX, kFold><<<grid, C::kThreads, C::kSharedBytes, stream>>>(p);
  return cudaGetLastError();
}

template <XMode kX, int kTileIndex>
cudaError_t launch_tile(uint32_t fold, const Params& p, dim3 grid, cudaStream_t stream) {
  return fold == 16 ? launch_one<kX, kTileIndex, 16>(p, grid, stream)
                    : launch_one<kX, kTileIndex, 32>(p, grid, stream);
}

template <XMode kX>
cudaError_t launch_variant(Int4GemmTcTile tile, uint32_t fold, const Params& p, dim3 grid,
                           cudaStream_t stream) {
  switch (tile) {
    case Int4GemmTcTile::k128x128:
      return launch_tile<kX, 0>(fold, p, grid, stream);
    case Int4GemmTcTile::k64x128:
      return launch_tile<kX, 1>(fold, p, grid, stream);
    case Int4GemmTcTile::k64x96:
      return launch_tile<kX, 2>(fold, p, grid, stream);
    case Int4GemmTcTile::k64x64:
      return launch_tile<kX, 3>(fold, p, grid, stream);
    case Int4GemmTcTile::kWgmma128x64:
    case Int4GemmTcTile::kWgmma128x128:
      break;  // not mma.sync variants: launch_wgmma
  }
  return cudaErrorInvalidValue;
}

// Opt-in shared memory (beyond 48 KB) and a carveout that favours shared memory over L1 (the
// kernel's global reads bypass L1), for a variant that fits the device.
template <XMode kX, int kTileIndex, uint32_t kFold>
cudaError_t configure_one(size_t max_shared_bytes) {
  using C = Config<kTileIndex, kX, kFold>;
  constexpr size_t kBytes = C::kSharedBytes;
  if (kBytes > max_shared_bytes) return cudaSuccess;  // never launched on this device
  const auto kernel = int4_gemm_tc_kernel<kTileIndex, kX, kFold>;
  cudaError_t error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kBytes));
  if (error != cudaSuccess) return error;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                              cudaSharedmemCarveoutMaxShared);
}

template <XMode kX, int kTileIndex>
cudaError_t configure_tile(size_t max_shared_bytes) {
  const cudaError_t error = configure_one<kX, kTileIndex, 16>(max_shared_bytes);
  return error != cudaSuccess ? error : configure_one<kX, kTileIndex, 32>(max_shared_bytes);
}

template <XMode kX>
cudaError_t configure_variants(size_t max_shared_bytes) {
  cudaError_t error = configure_tile<kX, 0>(max_shared_bytes);
  if (error == cudaSuccess) error = configure_tile<kX, 1>(max_shared_bytes);
  if (error == cudaSuccess) error = configure_tile<kX, 2>(max_shared_bytes);
  if (error == cudaSuccess) error = configure_tile<kX, 3>(max_shared_bytes);
  return error;
}

}  // namespace qmoe::cuda::tc

#endif  // QMOE_LIB_CUDA_INT4_GEMM_TC_KERNEL_CUH_
