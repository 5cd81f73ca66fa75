// The tensor-core INT4 GEMM on Hopper's warpgroup MMA (sm_90a wgmma): the same contract, operand
// stages and numerics as the mma.sync kernel (int4_gemm_tc_kernel.cuh, whose Loader fills the
// stages here too), with the product computed as Y^T = W X^T so that the dequantised codes are
// the MMA's register operand and X its shared-memory operand.
//
// Work split. One or two warpgroups (128 or 256 threads) per CTA; CTA (bx, by) computes rows
// [by * bm, by * bm + bm) of Y (tokens, the MMA's N: bm = 128, or 256 for the fast level's
// 256 x 128 tile) against W rows [n0, n0 + bn), n0 = n_base + bx * bn, all of them sharing the
// CTA's X stages. (The 256-token tile gives every dequantised weight twice the MMA work, 128
// accumulators a thread: per MMA it halves the consumers' dequantisation and the producer's
// codes and planes, which bound the 128-token tiles. Its wgmma needs 158 registers where it
// issues, whatever setmaxnreg grants (ptxas C7602), more than two 256-thread CTAs a
// multiprocessor leave (128): so two MMA warpgroups share one CTA.) Either each warpgroup takes 64
// rows of W (the MMA's M: eight 8-row code groups; bn = 64 or 128), or (split_k = 2, bn = 64)
// both take the same 64 rows, warpgroup h the 32-code chunk h of every k-tile, and their sums
// are added at the end (as the mma.sync split-K tiles do): the same work in two concurrent
// chains, for grids too small to fill the multiprocessors. Warp w of a warpgroup owns W rows
// 16w .. 16w + 15 of its 64, i.e. groups 2w and 2w + 1: row g of each in its A fragment
// (g = lane / 4), the layout of dequant_chunk_row's output, so the mma.sync kernel's
// dequantisation gives the A registers as they are. (X is what a CTA reads most: 16 KB a k-tile
// against 32 bytes of codes per W row, so the 128 x 128 tile halves the X traffic per output
// where the grid is large enough.)
//
// Split over K across a cluster (p.k_splits = c > 1, the launch's cluster of c CTAs along the
// grid's z): CTA z of the cluster computes the same output tile over k-tiles
// [z k_tiles / c, (z + 1) k_tiles / c), so that c times the CTAs share a grid that would leave
// multiprocessors idle or a last wave short. Every CTA puts its sums in its shared FP32 tile
// (the epilogue's), the cluster's barrier publishes them, and each CTA then writes every c-th
// row group of Y, reading the c tiles through distributed shared memory and adding them in rank
// order, z = 0 first: the same sums in the same order whichever CTA adds them, so the result is
// the same run to run (it differs from another c's in the rounding of those additions, as the
// bound allows: c - 1 additions instead of the folds they replace). A second cluster barrier
// keeps every CTA, and so its tile, alive until the others have read it.
//
// Pipeline. The stages of the tile's geometry (kTileGeometry): X bm rows x 64 k with its
// 16-byte units swizzled by row (x_piece_offset), which is exactly the 128-byte-swizzled
// K-major layout wgmma reads through a descriptor once every stage starts on a 1024-byte
// boundary (the kernel aligns its shared memory; a stage is a multiple of 1024 bytes). The
// stages are filled by a producer warpgroup of their own, after the MMA warpgroups (the
// consumers), and handed over through two mbarriers a stage, so that no barrier holds the
// warpgroups in lock step (with one CTA barrier a k-tile, measured, 17% of the split tile's
// stall samples sat there, and the copying warpgroup was the slowest). A producer of one warp
// was tried first: its copy and conversion chain, four times a thread's share, took longer
// than the consumers' k-tile, and a 9-warp CTA cannot hold 224 registers a thread (a
// sub-partition's 16 K registers hold three of its warps at 168).
//  - full[s] (257 arrivals a phase, plus the X bytes): producer thread 0 arrives with the X
//    tile's bytes expected and copies it with one TMA instruction (XTileMap), which lays it out
//    with the same swizzle and completes on full[s]; all 128 producer threads copy the codes by
//    cp.async (Loader::copy_operands), each then handing its copies to the barrier
//    (cp.async.mbarrier.arrive.noinc: an arrival the hardware makes once they have landed), and
//    store their plane entries already converted, from registers (Loader::store_plane_values),
//    then arrive with release. A consumer that observes the phase sees the X bytes and the codes
//    (their copies complete on the barrier) and the converted planes. The X copy and the MMA
//    both go through the async proxy, so no proxy fence lies between them.
//  - empty[s] (one arrival a consumer thread): a consumer thread arrives, with release, once it
//    has finished with the stage, its MMAs included (compute_stage_wgmma waits for them). The
//    producer waits for that phase before it writes anything into the stage again.
// K-tile kt lives in stage kt % kStages and is its (kt / kStages)-th use, hence the parities:
// full[s]'s phase kt / kStages, empty[s]'s the same one after kt is consumed. The producer never
// waits for a copy of its own: the plane elements of k-tile kt are loaded into registers when
// k-tile kt - 2 is stored, and the stores and the copies of k-tile kt are issued as
// soon as its stage is free, so every stage is published as soon as it lands. (Until
// 2026-12-03 the producer copied the plane words by cp.async too and converted them in place
// once its cp.async.wait_group said they had landed: the wait for k-tile kt - 3 then sat behind
// the wait for the stage of k-tile kt, so only two published stages ran ahead of the consumers,
// and the conversion and addressing took as many instructions as the consumers' k-tile.)
//
// Numerics. Each fold unit (16 or 32 k: fold_k) is summed by the MMA from zero into one of two
// partial accumulator sets and then folded into the FP32 result with its scale,
// acc = fma(scale, partial, acc), as the mma.sync kernel does: the same bound
// (int4_gemm_tc_accumulation_bound). The two partial sets let unit u + 1's MMA run while unit u
// is folded, and with an even unit count a stage's last unit is folded during the next stage's
// first MMAs (its scales kept in registers); the folds stay in unit order.
//
// Scaled weights (the fast level's, int4_gemm_tc.cuh). The producer turns each scale into two
// BF16 parts instead of an FP32 value, the consumers multiply each dequantised pair by them
// (scale_pairs: the weight rounded once to BF16) and every k-tile's MMAs accumulate into the
// one accumulator set, with no fold (consume_stages_overlapped, compute_stage_scaled).
#ifndef QMOE_LIB_CUDA_INT4_GEMM_WGMMA_KERNEL_CUH_
#define QMOE_LIB_CUDA_INT4_GEMM_WGMMA_KERNEL_CUH_

#include "lib/cuda/cluster_ptx.cuh"
#include "lib/cuda/int4_gemm_tc_kernel.cuh"
#include "lib/cuda/tma_ptx.cuh"
#include "lib/cuda/wgmma_ptx.cuh"

namespace qmoe::cuda::tc {

// What Loader and the kernel read of a variant, for a wgmma tile (16-bit X only). kScaled: the
// fast level's scaled weights ("Scaled weights" above; BF16 X only).
template <int kTileIndex, XMode kX, uint32_t kFoldK, bool kScaled = false>
struct WgmmaConfig {
  static_assert(kX != XMode::kF32Split, "the wgmma tiles take 16-bit X");
  static_assert(!kScaled || kX == XMode::kBf16, "scaled weights are BF16, as X must be");
  static constexpr bool kScaledWeights = kScaled;
  static constexpr TileGeometry kGeometry = kTileGeometry[kTileIndex];
  static constexpr uint32_t kBM = kGeometry.bm;       // tokens: the MMA's N (128 or 256)
  static constexpr uint32_t kBN = kGeometry.bn;       // W rows: the MMA's M
  static constexpr uint32_t kAccumulators = kBM / 2;  // a thread's of one 64 x kBM MMA tile
  static constexpr uint32_t kThreads = tile_threads(kGeometry);
  static constexpr uint32_t kFold = kFoldK;
  static constexpr StageLayout kStage = stage_layout(kGeometry, 2, kFold);
  static constexpr uint32_t kStages = stage_count(kGeometry, 2, kFold);
  static constexpr size_t kSharedBytes = shared_bytes(kGeometry, 2, kFold);
  static constexpr uint32_t kPlaneEntries = (kTileK / kFold) * kBN;
  static constexpr uint32_t kUnits = kTileK / kFold;            // fold units per k-tile: 2 or 4
  static constexpr uint32_t kSplitK = kGeometry.split_k;        // warpgroups on the same W rows
  static constexpr uint32_t kChunksPerGroup = 2 / kSplitK;      // of each k-tile's two chunks
  static constexpr uint32_t kUnitsPerGroup = kUnits / kSplitK;  // fold units a warpgroup folds
  static constexpr uint32_t kRowWarps = kBN / 16;               // warps across the W rows
  // The epilogue's FP32 tile [token][W row], rows padded by 4 floats: the accumulator stores of
  // a warp (8 W rows x 4 token pairs) and the row reads (64 consecutive floats) both hit 32
  // distinct banks.
  static constexpr uint32_t kOutStride = kBN + 4;
  static constexpr uint32_t kOutPairs = kBN / 2;   // epilogue threads per Y row, 2 columns each
  static constexpr uint32_t kOutOctets = kBN / 8;  // or 8 columns each
  // X comes by the TMA; the Loader copies codes and planes in the producer warpgroup, which
  // follows the kThreads consumer threads (the MMA warpgroups).
  static constexpr bool kXByTma = true;
  static constexpr uint32_t kLoaderThreads = 128;
  static constexpr uint32_t kCtaThreads = kThreads + kLoaderThreads;
  // Registers a thread: the launch gives every warp the same share of the multiprocessor's
  // 64 K (a sub-partition's 16 K holds three warps of a 384-thread CTA at 168, or two CTAs'
  // two warps each at 128); then the producer, which holds little, gives most of its share to
  // the consumers (setmaxnreg), so that their accumulators (three sets of 64 floats, or one of
  // 128 for 256 tokens) fit. The producer keeps two k-tiles' plane elements in registers
  // (produce_stages): 48 where a thread has four entries a k-tile (128 W rows, 16-code folds),
  // which spill at 40; the consumers get the rest of the launch's registers.
  static constexpr uint32_t kCtasPerSm = kThreads == 128 ? 2 : 1;
  static constexpr uint32_t kLaunchRegisters = 65536 / kCtasPerSm / kCtaThreads / 8 * 8;
  static constexpr uint32_t kProducerRegisters = kPlaneEntries / kLoaderThreads >= 4 ? 48 : 40;
  static constexpr uint32_t kConsumerRegisters =
      (kLaunchRegisters * kCtaThreads - kLoaderThreads * kProducerRegisters) / kThreads / 8 * 8;
  static constexpr uint32_t kXTileBytes = kBM * kTileK * 2;  // one TMA box: a stage's X
  // The stages' mbarriers follow the stages (from the aligned base): full[s], then empty[s].
  static constexpr uint32_t kBarrierOffset = kStages * kStage.bytes;
  static constexpr uint32_t kEmptyBarrierOffset = kBarrierOffset + 8 * kStages;
  // Per phase of full[s]: each producer thread's release (its stored plane entries) and the
  // landing of its code copies (cp_async_mbarrier_arrive_noinc), and the X's expect_tx.
  static constexpr uint32_t kFullArrivals = 2 * kLoaderThreads + 1;
  static constexpr uint32_t kEmptyArrivals = kThreads;
  // The consumers' own barrier (the epilogue), apart from the CTA's barrier 0.
  static constexpr uint32_t kConsumerBarrier = 1;

  static_assert(kGeometry.wgmma && kBN % 64 == 0 && kThreads == 2 * kBN * kSplitK);
  static_assert(kSplitK == 1 || (kSplitK == 2 && kBN == 64));
  // 256 tokens: 128 accumulators a thread, which leave no registers for the exact level's two
  // partial sets; two MMA warpgroups, one CTA a multiprocessor (the wgmma's 158 registers).
  static_assert(kBM == 128 || (kBM == 256 && kScaled && kCtasPerSm == 1 && kSplitK == 1));
  static_assert(kStage.bytes % kWgmmaAlignment == 0 && kStage.x_row_bytes == 128);
  static_assert(kStages >= 3 && kStages <= kMaxStages);
  static_assert(kSharedBytes ==
                size_t{kStages} * kStage.bytes + kWgmmaAlignment + kWgmmaBarrierBytes);
  static_assert(kWgmmaBarrierBytes >= 16 * kStages);
  static_assert(kConsumerRegisters <= 256 &&
                kConsumerRegisters * kThreads + kProducerRegisters * kLoaderThreads <=
                    kLaunchRegisters * kCtaThreads);
  static_assert(kStage.x_bytes == kXTileBytes && kStage.bytes % 8 == 0);
  static_assert(size_t{kBM} * kOutStride * 4 <= size_t{kStages} * kStage.bytes);
};

// The k-tiles [begin, end) of the cluster's CTA `rank` in a split over K (the whole of K without
// one). The launcher makes k_splits <= k_tiles, so every slice has a k-tile.
struct KSlice {
  uint32_t begin, end;
};
QMOE_TC_HD KSlice k_slice(const Params& p, uint32_t rank) {
  return {rank * p.k_tiles / p.k_splits, (rank + 1) * p.k_tiles / p.k_splits};
}

// A thread's fixed stage offsets, from its warp's row block rw (warp % kRowWarps: W rows
// 16 rw .. 16 rw + 15 of the tile, so without split_k warpgroup i's rows are 64i..64i+63) and its
// warpgroup's first chunk c0 of every k-tile (warp / kRowWarps with split_k, else 0): its two
// W rows' code words (groups 2 rw, 2 rw + 1, row g, chunk c0), plane entries (chunk c0's first
// fold unit) and the byte offset of chunk c0's first k16 slice in an X stage.
struct WgmmaLane {
  uint32_t codes[2];
  uint32_t planes[2];  // bytes: entry (unit c0 * units per chunk, column 16 rw + g + 8r)
  uint32_t permute;
  uint32_t x_slice;  // 2 c0 slices of 32 bytes
};

template <class C>
QMOE_TC_HD WgmmaLane wgmma_lane(uint32_t warp, uint32_t lane) {
  const uint32_t rw = warp % C::kRowWarps, c0 = C::kSplitK == 1 ? 0 : warp / C::kRowWarps;
  const uint32_t unit0 = c0 * (32 / C::kFold);
  WgmmaLane l;
  for (uint32_t r = 0; r < 2; ++r) {
    l.codes[r] =
        ptx::opaque32(code_row_offset(2 * rw + r, c0, b_col(lane)) + code_word_offset(lane, 0));
    l.planes[r] = ptx::opaque32(plane_entry(unit0, 16 * rw + 8 * r + b_col(lane), C::kBN) * 4);
  }
  l.permute = ptx::opaque32(permute_selector(lane));
  l.x_slice = ptx::opaque32(c0 * 2 * 32);
  return l;
}

// Scaled weights: each BF16 pair of d = code - zero point (exact) becomes rn(d * s), rounded
// once, from the scale's parts (Loader::convert_planes, bf16_split_bits: s = hi + lo exactly for
// an FP16 scale): t = d * lo is exact in BF16 (at most 4 significant bits times 4), so
// fma(d, hi, t) = rn(d * hi + d * lo) = rn(d * s). Adding -0 keeps the product d * lo as it is.
QMOE_TC_HD void scale_pairs(uint32_t (&pairs)[2], uint32_t scale_parts) {
  constexpr uint32_t kNegativeZeros = 0x80008000u;
  const uint32_t hi = ptx::byte_perm(scale_parts, scale_parts, 0x1010u);
  const uint32_t lo = ptx::byte_perm(scale_parts, scale_parts, 0x3232u);
#pragma unroll
  for (uint32_t j = 0; j < 2; ++j) {
    pairs[j] = ptx::fma2<true>(pairs[j], hi, ptx::fma2<true>(pairs[j], lo, kNegativeZeros));
  }
}

// The A fragments of the warpgroup's local chunk cc of the stage (its chunks are c0 .. c0 +
// kChunksPerGroup - 1; local slice s = local chunk s / 2, half s % 2: a_lo is slice 2 cc, a_hi
// slice 2 cc + 1), from the thread's two code rows: a[s] = {row g lo/hi pair 0, row g + 8 pair 0,
// row g pair 1, row g + 8 pair 1} (wgmma_m64k16's A layout with dequant_chunk_row's pairs).
template <class C, XMode kX>
QMOE_TC_HD void dequant_chunk(uint32_t (&a_lo)[4], uint32_t (&a_hi)[4], const uint8_t* stage,
                              const WgmmaLane& l, uint32_t cc) {
  constexpr bool kBf16 = XTraits<kX>::kBf16Mma;
  constexpr uint32_t kWordB = code_word_offset(0, 1) - code_word_offset(0, 0);
  constexpr uint32_t kUnitBytes = C::kBN * 4;
  constexpr uint32_t kUnitsPerChunk = 32 / C::kFold;
  const uint8_t* codes = stage + C::kStage.code_offset;
  const uint8_t* zeros = stage + C::kStage.zero_offset;
  const uint32_t unit_lo = cc * kUnitsPerChunk, unit_hi = unit_lo + kUnitsPerChunk - 1;
  uint32_t lo[2][2], hi[2][2];  // [row r][pair]
#pragma unroll
  for (uint32_t r = 0; r < 2; ++r) {
    const uint8_t* row = codes + l.codes[r] + cc * kChunkBytes;
    const uint32_t word_a = *reinterpret_cast<const uint32_t*>(row);
    const uint32_t word_b = *reinterpret_cast<const uint32_t*>(row + kWordB);
    const uint32_t z_lo =
        *reinterpret_cast<const uint32_t*>(zeros + l.planes[r] + unit_lo * kUnitBytes);
    const uint32_t z_hi =
        *reinterpret_cast<const uint32_t*>(zeros + l.planes[r] + unit_hi * kUnitBytes);
    dequant_chunk_row<kBf16>(word_a, word_b, l.permute, z_lo, z_hi, lo[r], hi[r]);
    if constexpr (C::kScaledWeights) {
      const uint8_t* scales = stage + C::kStage.scale_offset + l.planes[r];
      scale_pairs(lo[r], *reinterpret_cast<const uint32_t*>(scales + unit_lo * kUnitBytes));
      scale_pairs(hi[r], *reinterpret_cast<const uint32_t*>(scales + unit_hi * kUnitBytes));
    }
  }
  a_lo[0] = lo[0][0], a_lo[1] = lo[1][0], a_lo[2] = lo[0][1], a_lo[3] = lo[1][1];
  a_hi[0] = hi[0][0], a_hi[1] = hi[1][0], a_hi[2] = hi[0][1], a_hi[3] = hi[1][1];
}

// The A fragments of all the warpgroup's k16 slices of the stage (dequant_chunk of each of its
// chunks).
template <class C, XMode kX>
QMOE_TC_HD void dequant_stage(uint32_t (&a)[2 * C::kChunksPerGroup][4], const uint8_t* stage,
                              const WgmmaLane& l) {
#pragma unroll
  for (uint32_t cc = 0; cc < C::kChunksPerGroup; ++cc) {
    dequant_chunk<C, kX>(a[2 * cc], a[2 * cc + 1], stage, l, cc);
  }
}

// Issues the warpgroup's fold unit u (local) of the stage into `partial` (from zero) and closes
// their group; x_slices is the shared address of the warpgroup's first k16 slice of X.
template <class C, XMode kX>
QMOE_TC_HD void issue_unit(float (&partial)[C::kAccumulators],
                           const uint32_t (&a)[2 * C::kChunksPerGroup][4], uint32_t x_slices,
                           uint32_t u) {
  constexpr uint32_t kSlicesPerUnit = C::kFold / 16;
  ptx::wgmma_fence();
#pragma unroll
  for (uint32_t i = 0; i < kSlicesPerUnit; ++i) {
    const uint32_t s = u * kSlicesPerUnit + i;
    ptx::wgmma_m64k16<XTraits<kX>::kBf16Mma, C::kBM>(
        partial, a[s], ptx::wgmma_descriptor_sw128(x_slices + s * 32), i != 0);
  }
  ptx::wgmma_commit();
}

// The scales of the warpgroup's fold unit u (local) of a stage for the thread's two W rows.
struct UnitScales {
  float s0, s1;
};
template <class C>
QMOE_TC_HD UnitScales unit_scales(const uint8_t* stage, const WgmmaLane& l, uint32_t u) {
  const uint8_t* scales = stage + C::kStage.scale_offset + u * C::kBN * 4;
  return {*reinterpret_cast<const float*>(scales + l.planes[0]),
          *reinterpret_cast<const float*>(scales + l.planes[1])};
}

// acc += scale * partial: d[4i + e] is W row g + 8 (e / 2) of the warp's 16.
template <uint32_t kCount>
QMOE_TC_HD void fold_partial(float (&acc)[kCount], float (&partial)[kCount], UnitScales s) {
  ptx::wgmma_hold(partial);
#pragma unroll
  for (uint32_t i = 0; i < kCount; i += 4) {
    acc[i] = fmaf(s.s0, partial[i], acc[i]);
    acc[i + 1] = fmaf(s.s0, partial[i + 1], acc[i + 1]);
    acc[i + 2] = fmaf(s.s1, partial[i + 2], acc[i + 2]);
    acc[i + 3] = fmaf(s.s1, partial[i + 3], acc[i + 3]);
  }
}

// The warpgroup's MMAs and folds of one stage. Unit u + 1 is issued before unit u is folded,
// so the tensor cores work while the FFMAs run. With an even unit count the stage's last unit
// (partial set 1) is left for the next stage to fold while that stage's unit 0 (set 0) runs, its
// scales read here into `last` because the stage goes back to the producer on return; the
// folds still run in unit order, so the sums are those of folding each unit at once. (With one
// unit, split_k at 32-code folds, the set would alternate between stages; measured on the H200
// that lost 1-3%, so such a stage folds its unit at once.) Every MMA of the stage has completed
// on return, so the stage may then be released.
template <class C, XMode kX>
QMOE_TC_HD void compute_stage_wgmma(float (&acc)[C::kAccumulators],
                                    float (&partial)[2][C::kAccumulators], const uint8_t* stage,
                                    const WgmmaLane& l, UnitScales& last, bool fold_last) {
  constexpr uint32_t kUnits = C::kUnitsPerGroup;
  constexpr bool kCarry = kUnits % 2 == 0;
  uint32_t a[2 * C::kChunksPerGroup][4];
  dequant_stage<C, kX>(a, stage, l);
  const uint32_t x_slices = ptx::shared_address(stage) + l.x_slice;
  issue_unit<C, kX>(partial[0], a, x_slices, 0);
  if (kCarry && fold_last) {
    // Unit 0's group may stay in flight; the wait tells ptxas that set 1's MMAs (the previous
    // stage's, complete already) are done, else it injects a wait for every group here.
    ptx::wgmma_wait<1>();
    fold_partial(acc, partial[1], last);
  }
#pragma unroll
  for (uint32_t u = 1; u < kUnits; ++u) {
    issue_unit<C, kX>(partial[u % 2], a, x_slices, u);
    ptx::wgmma_wait<1>();
    fold_partial(acc, partial[(u - 1) % 2], unit_scales<C>(stage, l, u - 1));
  }
  ptx::wgmma_wait<0>();
  if constexpr (kCarry) {
    last = unit_scales<C>(stage, l, kUnits - 1);
  } else {
    fold_partial(acc, partial[(kUnits - 1) % 2], unit_scales<C>(stage, l, kUnits - 1));
  }
}

// Scaled weights: issues the MMAs of the warpgroup's local chunk cc of `stage` (its two k16
// slices, fragments a from dequant_chunk) accumulating into `acc`, and closes their group.
template <class C, XMode kX>
QMOE_TC_HD void issue_chunk_scaled(float (&acc)[C::kAccumulators], const uint32_t (&a)[2][4],
                                   const uint8_t* stage, const WgmmaLane& l, uint32_t cc) {
  const uint32_t x_slices = ptx::shared_address(stage) + l.x_slice;
  ptx::wgmma_fence();
#pragma unroll
  for (uint32_t h = 0; h < 2; ++h) {
    ptx::wgmma_m64k16<XTraits<kX>::kBf16Mma, C::kBM>(
        acc, a[h], ptx::wgmma_descriptor_sw128(x_slices + (2 * cc + h) * 32), true);
  }
  ptx::wgmma_commit();
}

// Scaled weights, one chunk a k-tile per warpgroup (the split tile): the warpgroup's MMAs of one
// stage, accumulating into `acc` straight from the tensor cores (no fold); every one of them has
// completed on return, so the stage may then be released. With one chunk the fragments are
// reused every k-tile, so the next stage is dequantised only after that wait; the MMAs of the
// CTA's other warpgroup overlap it instead. (With two chunks, consume_stages_overlapped keeps one
// chunk's MMAs in flight during the other's dequantisation.)
template <class C, XMode kX>
QMOE_TC_HD void compute_stage_scaled(float (&acc)[C::kAccumulators], const uint8_t* stage,
                                     const WgmmaLane& l) {
  uint32_t a[C::kChunksPerGroup][2][4];  // [local chunk][slice of the chunk]
#pragma unroll
  for (uint32_t cc = 0; cc < C::kChunksPerGroup; ++cc) {
    dequant_chunk<C, kX>(a[cc][0], a[cc][1], stage, l, cc);
    issue_chunk_scaled<C, kX>(acc, a[cc], stage, l, cc);
  }
  ptx::wgmma_wait<0>();
}

// Scaled weights with both chunks of a k-tile in each warpgroup (kChunksPerGroup == 2): the
// consumer k-loop with the MMAs of one chunk in flight while the other is dequantised. Chunk 0's
// fragments (a[0]) are issued as group G0, then chunk 1 is dequantised into a[1] and issued as G1;
// once G0 has retired (wait<1>: a[0] free), the next stage's full barrier is awaited and its
// chunk 0 dequantised into a[0] while G1 runs; after G1 (wait<0>) the stage is released and the
// next G0 issued. Every fragment is redefined only after the group that read it has retired, and
// a stage is released only after all of its MMAs, as compute_stage_scaled does; the MMAs and
// their order (acc accumulates slices 0..3 of each k-tile in turn) are the same, so the sums
// are the same bits.
template <class C, XMode kX>
QMOE_TC_HD void consume_stages_overlapped(float (&acc)[C::kAccumulators], uint8_t* smem,
                                          uint32_t count, const WgmmaLane& l) {
  static_assert(C::kScaledWeights && C::kChunksPerGroup == 2);
  const uint32_t bars = ptx::shared_address(smem);
  uint32_t a[2][2][4];  // [chunk][slice of the chunk]
  const auto full = [&](uint32_t j, uint32_t stage) {
    ptx::mbarrier_wait_parity(bars + C::kBarrierOffset + 8 * stage, (j / C::kStages) & 1);
    return smem + stage * C::kStage.bytes;
  };
  const auto issue = [&](const uint8_t* st, uint32_t cc) {
    issue_chunk_scaled<C, kX>(acc, a[cc], st, l, cc);
  };
  if (count == 0) return;
  uint32_t stage = 0;
  const uint8_t* st = full(0, 0);
  dequant_chunk<C, kX>(a[0][0], a[0][1], st, l, 0);
  issue(st, 0);
  // The last k-tile is peeled off so that every group is issued on every path: a conditional
  // issue makes ptxas wait for all groups at the join (its C7517).
  for (uint32_t j = 0; j + 1 < count; ++j) {
    dequant_chunk<C, kX>(a[1][0], a[1][1], st, l, 1);
    issue(st, 1);
    ptx::wgmma_wait<1>();  // G0 of k-tile j has retired: a[0] may be redefined
    const uint32_t next = stage + 1 == C::kStages ? 0 : stage + 1;
    const uint8_t* next_st = full(j + 1, next);
    dequant_chunk<C, kX>(a[0][0], a[0][1], next_st, l, 0);
    ptx::wgmma_wait<0>();  // every MMA of k-tile j has completed
    ptx::mbarrier_arrive(bars + C::kEmptyBarrierOffset + 8 * stage);
    issue(next_st, 0);
    stage = next;
    st = next_st;
  }
  dequant_chunk<C, kX>(a[1][0], a[1][1], st, l, 1);
  issue(st, 1);
  ptx::wgmma_wait<0>();
  ptx::mbarrier_arrive(bars + C::kEmptyBarrierOffset + 8 * stage);
}

// The epilogue's row writes from the FP32 tile (store_outputs_wgmma), two adjacent columns a
// thread: with a split over a cluster, the row groups dealt to the cluster's CTAs in turn, each
// output the sum of the c tiles in rank order (read through distributed shared memory, a warp's
// lanes on consecutive pairs: one contiguous 256-byte read a rank and row).
template <class C>
QMOE_TC_HD void store_rows_by_pairs(const Params& p, const float* tile, uint32_t rows, uint32_t m0,
                                    uint32_t n0, uint32_t rank, uint32_t tid) {
  const uint32_t splits = p.k_splits;
  const uint32_t pair = tid % C::kOutPairs, first_row = tid / C::kOutPairs;
  constexpr uint32_t kRowStep = C::kThreads / C::kOutPairs;
  const uint32_t col = n0 + 2 * pair;
  const bool in0 = col >= p.n_begin && col < p.n_end;
  const bool in1 = col + 1 >= p.n_begin && col + 1 < p.n_end;
  if (!in0 && !in1) return;
  const bool bias = p.w.bias != nullptr;
  const float bias0 = bias && in0 ? load_as_float(p.w.bias_dtype, p.w.bias, col) : 0.0f;
  const float bias1 = bias && in1 ? load_as_float(p.w.bias_dtype, p.w.bias, col + 1) : 0.0f;
  for (uint32_t token = first_row + rank * kRowStep; token < C::kBM && m0 + token < rows;
       token += splits * kRowStep) {
    const float* from = tile + token * C::kOutStride + 2 * pair;
    float sum[2] = {from[0], from[1]};  // rank 0's own sums when there is no split
    const uint32_t address = ptx::shared_address(from);
    if (splits > 1) ptx::cluster_load_f32x2(address, 0, sum);
    for (uint32_t r = 1; r < splits; ++r) {
      float v[2];
      ptx::cluster_load_f32x2(address, r, v);
      sum[0] += v[0];
      sum[1] += v[1];
    }
    store_pair(p, m0 + token, col, sum[0] + bias0, sum[1] + bias1, in0, in1);
  }
}

// The same without a split, eight adjacent columns a thread: one 16-byte store (two for FP32 Y)
// where all eight are written (p.y_octets: Y's rows allow it), else by pairs. A quarter of the
// pair path's row loop. (Not through distributed shared memory: there the lanes' 32-byte
// strides make four times the requests of the pair path's contiguous reads, which costs more than
// the wider stores save, as measured on the H200 with a split over 4.)
template <class C>
QMOE_TC_HD void store_rows_by_octets(const Params& p, const float* tile, uint32_t rows, uint32_t m0,
                                     uint32_t n0, uint32_t tid) {
  const uint32_t octet = tid % C::kOutOctets, first_row = tid / C::kOutOctets;
  constexpr uint32_t kRowStep = C::kThreads / C::kOutOctets;
  const uint32_t col = n0 + 8 * octet;
  bool in[8];
  float bias[8];
  bool any = false, all = true;
#pragma unroll
  for (uint32_t c = 0; c < 8; ++c) {
    in[c] = col + c >= p.n_begin && col + c < p.n_end;
    bias[c] =
        p.w.bias != nullptr && in[c] ? load_as_float(p.w.bias_dtype, p.w.bias, col + c) : 0.0f;
    any = any || in[c];
    all = all && in[c];
  }
  if (!any) return;
  for (uint32_t token = first_row; token < C::kBM && m0 + token < rows; token += kRowStep) {
    const float4* from = reinterpret_cast<const float4*>(tile + token * C::kOutStride + 8 * octet);
    const float4 lo = from[0], hi = from[1];
    float sum[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (uint32_t c = 0; c < 8; ++c) sum[c] += bias[c];
    if (all) {
      store_octet(p, m0 + token, col, sum);
    } else {
#pragma unroll
      for (uint32_t h = 0; h < 4; ++h) {
        if (in[2 * h] || in[2 * h + 1]) {
          store_pair(p, m0 + token, col + 2 * h, sum[2 * h], sum[2 * h + 1], in[2 * h],
                     in[2 * h + 1]);
        }
      }
    }
  }
}

// Writes the CTA's outputs through shared memory: the accumulators go to an FP32 tile
// [token][W row] (with split_k, the second warpgroup's first, then the first warpgroup adds its
// own to them: acc0 + acc1, one rounding, in a fixed order), then each warp writes whole rows of
// Y (rows < M, columns in [n_begin, n_end) only; bias added in FP32): eight adjacent columns a
// thread in 16-byte stores where there is no split and Y's alignment allows (p.y_octets), else
// two a thread. With a split over a cluster (p.k_splits > 1; `rank` is the CTA's), the row groups
// are dealt to the cluster's CTAs in turn and each output is the sum of the c tiles in rank order
// (the file's comment says why). The consumer threads alone (tid < kThreads), after the stages
// are free.
template <class C>
QMOE_TC_HD void store_outputs_wgmma(const Params& p, const float (&acc)[C::kAccumulators],
                                    float* tile, uint32_t rows, uint32_t m0, uint32_t n0,
                                    uint32_t rank, uint32_t tid) {
  const uint32_t lane = tid & 31, warp = tid >> 5;
  const uint32_t rw = warp % C::kRowWarps, half = warp / C::kRowWarps;
  const auto at = [&](uint32_t i) {
    const uint32_t token = 8 * (i / 4) + 2 * (lane & 3) + (i & 1);
    const uint32_t w_row = 16 * rw + b_col(lane) + 8 * ((i >> 1) & 1);
    return token * C::kOutStride + w_row;
  };
  if (C::kSplitK == 1 || half == 1) {
#pragma unroll
    for (uint32_t i = 0; i < C::kAccumulators; ++i) tile[at(i)] = acc[i];
  }
  if constexpr (C::kSplitK == 2) {
    ptx::named_barrier(C::kConsumerBarrier, C::kThreads);
    if (half == 0) {
#pragma unroll
      for (uint32_t i = 0; i < C::kAccumulators; ++i) tile[at(i)] = acc[i] + tile[at(i)];
    }
  }
  ptx::named_barrier(C::kConsumerBarrier, C::kThreads);
  const uint32_t splits = p.k_splits;
  if (splits > 1) ptx::cluster_barrier();  // every CTA's tile of the cluster is complete
  if (splits > 1 || !p.y_octets) {
    store_rows_by_pairs<C>(p, tile, rows, m0, n0, rank, tid);
  } else {
    store_rows_by_octets<C>(p, tile, rows, m0, n0, tid);
  }
  if (splits > 1) ptx::cluster_barrier();  // the others have read this CTA's tile
}

// The producer's X copy of k-tile kt into `stage` (its thread 0): the arrival on the stage's full
// barrier with the box's bytes, then the box (k kt * kTileK, row m0) of x_map.
template <class C>
QMOE_TC_HD void copy_x_tile(const void* x_map, uint8_t* smem, uint32_t stage, uint32_t kt,
                            uint32_t m0) {
  const uint32_t base = ptx::shared_address(smem);
  const uint32_t bar = base + C::kBarrierOffset + 8 * stage;
  ptx::mbarrier_arrive_expect_tx(bar, C::kXTileBytes);
  ptx::tma_load_2d(base + stage * C::kStage.bytes, x_map, static_cast<int32_t>(kt * kTileK),
                   static_cast<int32_t>(m0), bar);
}

// The producer warpgroup (pt: 0..127): every k-tile's X, codes and planes into its stage, in
// order, each stage once the consumers have released its previous k-tile (see the pipeline
// above). Nothing here waits for a copy: X and the codes complete on full[s] by themselves, and
// the planes are stored from registers loaded two k-tiles earlier. The k-tiles go two at a
// time: both stages' waits first, then the two k-tiles' work as one branch-free block, so that
// ptxas interleaves their independent chains (addresses, conversions, stores). One warp a
// scheduler runs this; one k-tile's chain at a time left it stalled on fixed latencies most of
// its cycles, slower than the consumers it feeds.
template <class C, XMode kX>
QMOE_TC_HD void produce_stages(const Params& p, const void* x_map, uint8_t* smem, uint32_t rows,
                               uint32_t m0, uint32_t n0, uint32_t kt_begin, uint32_t kt_end,
                               uint32_t pt) {
  using L = Loader<C, kX>;
  constexpr bool kF16 = C::kScaledWeights;
  const L loader(p, rows, m0, n0, pt);
  const uint32_t bars = ptx::shared_address(smem);
  // j counts the CTA's k-tiles (k-tile kt_begin + j), and the stages and parities follow j.
  const uint32_t count = kt_end - kt_begin;
  typename L::PlaneValues planes[2];  // k-tiles j and j + 1 of the step
#pragma unroll
  for (uint32_t u = 0; u < 2; ++u) {
    if (u < count) loader.template load_plane_values<kF16>(p, kt_begin + u, planes[u]);
  }
  const auto next_stage = [](uint32_t s) { return s + 1 == C::kStages ? 0u : s + 1; };
  const auto full = [&](uint32_t s) { return bars + C::kBarrierOffset + 8 * s; };
  const auto stage_at = [&](uint32_t s) { return smem + s * C::kStage.bytes; };
  const auto wait_free = [&](uint32_t j, uint32_t s) {
    if (j >= C::kStages) {
      ptx::mbarrier_wait_parity(bars + C::kEmptyBarrierOffset + 8 * s, ((j / C::kStages) - 1) & 1);
    }
  };
  uint32_t stage = 0, j = 0;
  for (; j + 1 < count; j += 2) {
    const uint32_t s0 = stage, s1 = next_stage(s0);
    wait_free(j, s0);
    wait_free(j + 1, s1);
    if (pt == 0) {
      copy_x_tile<C>(x_map, smem, s0, kt_begin + j, m0);
      copy_x_tile<C>(x_map, smem, s1, kt_begin + j + 1, m0);
    }
    // cp.async.mbarrier.arrive.noinc tracks every earlier copy of the thread: full[s1]'s
    // arrival also waits for k-tile j's codes, which land no later than the consumers need them.
    loader.copy_operands(p, stage_at(s0), kt_begin + j, pt);
    ptx::cp_async_mbarrier_arrive_noinc(full(s0));
    loader.copy_operands(p, stage_at(s1), kt_begin + j + 1, pt);
    ptx::cp_async_mbarrier_arrive_noinc(full(s1));
    loader.template store_plane_values<kF16>(p, stage_at(s0), planes[0], pt);
    loader.template store_plane_values<kF16>(p, stage_at(s1), planes[1], pt);
    ptx::mbarrier_arrive(full(s0));  // release: the plane entries just stored
    ptx::mbarrier_arrive(full(s1));
    // The next step's planes; past the last k-tile the last one again (a load that exists and
    // is never stored), so that no branch splits the block.
    const uint32_t last = count - 1;
    loader.template load_plane_values<kF16>(p, kt_begin + (j + 2 < last ? j + 2 : last), planes[0]);
    loader.template load_plane_values<kF16>(p, kt_begin + (j + 3 < last ? j + 3 : last), planes[1]);
    stage = next_stage(s1);
  }
  if (j < count) {  // an odd count's last k-tile, its planes in planes[0]
    wait_free(j, stage);
    if (pt == 0) copy_x_tile<C>(x_map, smem, stage, kt_begin + j, m0);
    loader.copy_operands(p, stage_at(stage), kt_begin + j, pt);
    ptx::cp_async_mbarrier_arrive_noinc(full(stage));
    loader.template store_plane_values<kF16>(p, stage_at(stage), planes[0], pt);
    ptx::mbarrier_arrive(full(stage));
  }
  ptx::cp_async_commit();  // every copy has landed before the thread exits
  ptx::cp_async_wait<0>();
}

// One CTA's work, as run_cta in int4_gemm_tc_kernel.cuh (the emulation test runs it on host
// threads): C::kCtaThreads threads, the consumer warpgroups first and the producer last; bz is
// the CTA's rank in its cluster, its slice of K (0 without a split).
// `smem` holds C::kSharedBytes, of which the stages start at its first 1024-byte boundary;
// x_map is the CUtensorMap of x_tile_map(p, C::kBM) (a __grid_constant__ parameter on the
// device).
template <class C, XMode kX>
QMOE_TC_HD void run_cta_wgmma(const Params& p, const void* x_map, uint8_t* smem, uint32_t bx,
                              uint32_t by, uint32_t bz, uint32_t tid) {
  const uint32_t rows = p.m_device != nullptr ? (*p.m_device < p.m ? *p.m_device : p.m) : p.m;
  const uint32_t m0 = by * C::kBM;
  if (m0 >= rows) return;  // the whole CTA, and its whole cluster (same by), before any barrier
  const KSlice slice = k_slice(p, bz);
  const uint32_t kt_begin = slice.begin, kt_end = slice.end;
  const uint32_t n0 = p.n_base + bx * C::kBN;
  const uint32_t base = ptx::shared_address(smem);
  smem += (kWgmmaAlignment - base % kWgmmaAlignment) % kWgmmaAlignment;
  const uint32_t bars = ptx::shared_address(smem);
  if (tid == C::kThreads) {
    for (uint32_t s = 0; s < C::kStages; ++s) {
      ptx::mbarrier_init(bars + C::kBarrierOffset + 8 * s, C::kFullArrivals);
      ptx::mbarrier_init(bars + C::kEmptyBarrierOffset + 8 * s, C::kEmptyArrivals);
    }
  }
  ptx::cta_barrier();  // the barriers are initialised; from here on the roles part
  if (tid >= C::kThreads) {
    ptx::warpgroup_registers_decrease<C::kProducerRegisters>();
    produce_stages<C, kX>(p, x_map, smem, rows, m0, n0, kt_begin, kt_end, tid - C::kThreads);
    return;
  }
  ptx::warpgroup_registers_increase<C::kConsumerRegisters>();

  const WgmmaLane lane_offsets = wgmma_lane<C>(tid >> 5, tid & 31);
  float acc[C::kAccumulators];
#pragma unroll
  for (uint32_t i = 0; i < C::kAccumulators; ++i) acc[i] = 0.0f;
  float partial[2][C::kAccumulators];  // the fold's partial sums (exact weights only)
  UnitScales last{0.0f, 0.0f};         // the previous k-tile's last fold unit (compute_stage_wgmma)
  if constexpr (C::kScaledWeights && C::kChunksPerGroup == 2) {
    consume_stages_overlapped<C, kX>(acc, smem, kt_end - kt_begin, lane_offsets);
  } else {
    uint32_t stage = 0;
    for (uint32_t j = 0; j < kt_end - kt_begin; ++j) {
      ptx::mbarrier_wait_parity(bars + C::kBarrierOffset + 8 * stage, (j / C::kStages) & 1);
      const uint8_t* st = smem + stage * C::kStage.bytes;
      if constexpr (C::kScaledWeights) {
        compute_stage_scaled<C, kX>(acc, st, lane_offsets);
      } else {
        compute_stage_wgmma<C, kX>(acc, partial, st, lane_offsets, last, j != 0);
      }
      // Every MMA of the stage has completed, and this thread has read all it reads of it.
      ptx::mbarrier_arrive(bars + C::kEmptyBarrierOffset + 8 * stage);
      stage = stage + 1 == C::kStages ? 0 : stage + 1;
    }
  }
  if constexpr (C::kScaledWeights) {
    ptx::wgmma_hold(acc);  // no read of the accumulators moves above the last wait
  } else if (C::kUnitsPerGroup % 2 == 0 && kt_end > kt_begin) {
    // The last k-tile's last unit, when compute_stage_wgmma carries it.
    fold_partial(acc, partial[1], last);
  }
  // No consumer reads a stage any more, and every copy into one has landed (each was observed
  // on its full barrier): the epilogue's tile overlays them.
  ptx::named_barrier(C::kConsumerBarrier, C::kThreads);
  store_outputs_wgmma<C>(p, acc, reinterpret_cast<float*>(smem), rows, m0, n0, bz, tid);
}

}  // namespace qmoe::cuda::tc

#endif  // QMOE_LIB_CUDA_INT4_GEMM_WGMMA_KERNEL_CUH_
