// A block of 8 warps computing a list of 8-row code groups of one matrix against activation rows
// staged in shared memory: the GEMV's loop (int4_tile.cuh and e2m1_tile.cuh have the per-warp
// arithmetic, the format's decode policy F of decode_formats.cuh picks it; the MoE layer's
// kernels run the same walks per warp without this block-level split).
//
// Rows m >= rows (<= MAXM) of the activations are neither staged nor computed (sums 0).
// Warp w takes group slot w / kw and K share w % kw: 8 / kw groups run side by side, each split
// over kw warps by interleaved quads (warp s of a group takes quads s, s + kw, ...), and `rounds`
// such steps run one after another. K is walked in tiles of tc chunks; the caller's stage(c0)
// writes the tile's records (all threads take part) and is called once when one tile covers K,
// per tile and round otherwise. Each warp issues the code loads of its first two batches before
// a tile is staged, so weights stream while activations are converted. kw warps' partial sums
// meet in `partial` and are added in warp order, so the bits do not depend on timing.
#ifndef QMOE_LIB_CUDA_INT4_BLOCK_CUH_
#define QMOE_LIB_CUDA_INT4_BLOCK_CUH_

#include "lib/cuda/decode_formats.cuh"

namespace qmoe::cuda {

constexpr uint32_t kBlockThreads = 256;
constexpr uint32_t kBlockWarps = kBlockThreads / 32;

// group_of(round, slot) -> group index, or -1 when the slot has none that round (warp-uniform).
// stage(c0): stage chunks [c0, c0 + tc) of every activation row (block-wide, no barrier inside).
// sink(group, r, sub, acc): the summed rows of `group` (before F::finish), called by the 4 lanes
// (sub = 0..3) of each row of the group's first warp. Only acc[m] with m % 4 == sub is
// guaranteed to hold the row's sum (with kw = 1 every m does): a sink writes those.
// Every thread of the block must call this (it contains __syncthreads).
template <class F, Level L, int MAXM, class GroupOf, class Stage, class Sink>
__device__ __forceinline__ void run_groups(const DeviceQuantMatrix& w, uint32_t rows, uint32_t kw,
                                           uint32_t rounds, uint32_t tc, unsigned char* smem,
                                           float (*partial)[MAXM][kGroupRows], GroupOf group_of,
                                           Stage stage, Sink sink) {
  constexpr int U = F::batch_quads(L, MAXM, true);
  const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint32_t r = lane % kGroupRows, sub = lane / kGroupRows;
  const uint32_t gs = warp / kw, ks = warp % kw;
  const uint32_t tiles = (w.chunks + tc - 1) / tc;
  const typename F::Walk wm = F::walk(w);

  for (uint32_t round = 0; round < rounds; ++round) {
    const int64_t group = group_of(round, gs);
    const bool active = group >= 0;
    const uint32_t g = active ? static_cast<uint32_t>(group) : 0;
    const typename F::Row lr = F::row(w, g, r);
    float acc[MAXM];
#pragma unroll
    for (int m = 0; m < MAXM; ++m) acc[m] = 0.0f;

    for (uint32_t t = 0; t < tiles; ++t) {
      const uint32_t c0 = t * tc;  // a multiple of 4: tiles start on quad boundaries
      const QuadWalk qw = tile_walk(rows, sub, kw, c0, tc, w.chunks);
      const uint32_t q0 = c0 / kQuadChunks + ks;
      typename F::template Batch<U> a{}, b{};
      if (active) F::template prime<U>(a, b, wm, lr, qw, q0);
      if (tiles > 1 || round == 0) {
        if (round != 0 || t != 0) __syncthreads();  // every warp is done with the last tile
        stage(c0);
        __syncthreads();
      }
      if (active) F::template run<L, MAXM, U>(a, b, wm, lr, qw, q0, smem, acc);
    }

    reduce_row_lanes<MAXM>(acc);
    if (kw > 1) {
      if (active) {
#pragma unroll
        for (int m = 0; m < MAXM; ++m) {
          if ((m & 3) == static_cast<int>(sub)) partial[warp][m][r] = acc[m];
        }
      }
      __syncthreads();
      if (ks == 0 && active) {
        // Lane (sub, r) sums m = sub, sub + 4 over the group's warps in order; the other m
        // come from the lanes that own them, so pass each lane its own and zeros elsewhere.
        float sum[MAXM];
#pragma unroll
        for (int m = 0; m < MAXM; ++m) {
          sum[m] = 0.0f;
          if ((m & 3) != static_cast<int>(sub)) continue;
          sum[m] = partial[warp][m][r];
          for (uint32_t s = 1; s < kw; ++s) sum[m] += partial[warp + s][m][r];
        }
        sink(g, r, sub, sum);
      }
      __syncthreads();  // partial is reused by the next round
    } else if (active) {
      sink(g, r, sub, acc);
    }
  }
}

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_INT4_BLOCK_CUH_
