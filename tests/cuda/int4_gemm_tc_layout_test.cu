// The tensor-core GEMM's shared-memory layouts and lane fragments (lib/cuda/int4_gemm_tc_layout.cuh
// and the offsets the kernel derives from them), checked on the host against the PTX ISA's
// definitions: ldmatrix's fragment layout (lane L gets elements 2 (L % 4), +1 of row L / 4 of
// each matrix, whose rows lanes 8i..8i+7 address), the mma.m16n8k16 A, B and C fragment layouts,
// and __byte_perm's byte selection. The stage images are filled the way the kernel's loader
// fills them, from matrices whose every element is distinct, so a wrong offset, swizzle,
// permute or nibble shows as a wrong value. Needs no device.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "lib/cuda/int4_gemm_tc_kernel.cuh"
#include "lib/cuda/int4_gemm_tc_layout.cuh"

namespace qmoe::cuda::tc {
namespace {

// mma.m16n8k16 A fragment: element e (0, 1) of register reg of `lane` (PTX ISA).
uint32_t a_row(uint32_t reg, uint32_t lane) {
  return lane / 4 + 8 * (reg % 2);
}
uint32_t a_k(uint32_t reg, uint32_t e, uint32_t lane) {
  return 2 * (lane % 4) + e + 8 * (reg / 2);
}
// B fragment: element e of register reg holds B[2t + e + 8 reg][g].
uint32_t b_k(uint32_t reg, uint32_t e, uint32_t lane) {
  return 2 * (lane % 4) + e + 8 * reg;
}

uint16_t half_of(uint32_t reg, uint32_t e) {
  return static_cast<uint16_t>(reg >> (16 * e));
}

// A stage's X tile of 128 rows holding the element id r * 64 + k (16-bit X), filled piece by
// piece at x_piece_offset as the loader copies them.
std::vector<uint8_t> x_tile_16bit(uint32_t rows) {
  std::vector<uint8_t> tile(size_t{rows} * 128, 0xCD);
  std::set<uint32_t> used;
  for (uint32_t r = 0; r < rows; ++r) {
    for (uint32_t q = 0; q < 8; ++q) {
      const uint32_t at = x_piece_offset(r, q, 2);
      EXPECT_TRUE(used.insert(at).second) << "two pieces at " << at;
      EXPECT_LT(at + 16, tile.size() + 1);
      for (uint32_t e = 0; e < 8; ++e) {
        const uint16_t id = static_cast<uint16_t>(r * 64 + q * 8 + e);
        std::memcpy(tile.data() + at + 2 * e, &id, 2);
      }
    }
  }
  return tile;
}

// ldmatrix.x4 as the PTX ISA defines it: lanes 8i..8i+7 address the 16-byte rows of matrix i;
// register i of lane L holds elements 2 (L % 4), 2 (L % 4) + 1 of row L / 4 of matrix i.
void ldmatrix_x4(const std::vector<uint8_t>& smem, const uint32_t (&address)[32],
                 uint32_t (&regs)[32][4]) {
  for (uint32_t lane = 0; lane < 32; ++lane) {
    for (uint32_t i = 0; i < 4; ++i) {
      const uint32_t row_address = address[8 * i + lane / 4];
      uint32_t v;
      std::memcpy(&v, smem.data() + row_address + 4 * (lane % 4), 4);
      regs[lane][i] = v;
    }
  }
}

TEST(CudaInt4GemmTcLayout, XPiecesTileEachStageRowOnce) {
  for (uint32_t bytes : {2u, 4u}) {
    const uint32_t pieces = bytes == 2 ? 8 : 16, row_size = 64 * bytes;
    std::set<uint32_t> offsets;
    for (uint32_t r = 0; r < 128; ++r) {
      for (uint32_t q = 0; q < pieces; ++q) {
        const uint32_t at = x_piece_offset(r, q, bytes);
        EXPECT_EQ(at / row_size, r) << "piece " << q << " leaves row " << r;
        EXPECT_EQ(at % 16, 0u);
        EXPECT_TRUE(offsets.insert(at).second);
        // The loader places a thread's pieces kXRowStep rows apart at constant offsets; the
        // kernel's ldmatrix and FP32 offsets add whole m16 tiles: both need this period.
        const uint32_t period = bytes == 2 ? 8 : 4;
        EXPECT_EQ(x_piece_offset(r + period, q, bytes), at + period * row_size);
      }
    }
  }
}

// Every lane's ldmatrix address from the kernel's LaneOffsets (plus 16 rows per m16 tile, as
// load_a adds) gives the mma A fragment of the X tile, for every k group, warp row, m16 tile
// and slice of the warp (its local slice s is the stage's slice 2 first_chunk + s).
template <class C>
void check_ldmatrix(const std::vector<uint8_t>& tile) {
  for (uint32_t kg = 0; kg < C::kSplitK; ++kg) {
    for (uint32_t wm = 0; wm < C::kBM / 64; ++wm) {
      LaneOffsets o[32];
      for (uint32_t lane = 0; lane < 32; ++lane) o[lane] = lane_offsets<C>(kg, wm, 0, lane);
      for (uint32_t i = 0; i < 4; ++i) {
        for (uint32_t s = 0; s < 2 * C::kChunksPerWarp; ++s) {
          const uint32_t slice = 2 * kg * C::kChunksPerWarp + s;
          uint32_t address[32];
          for (uint32_t lane = 0; lane < 32; ++lane) {
            address[lane] = i * 16 * 128 + o[lane].a[s];
            EXPECT_EQ(address[lane], ldmatrix_row_offset(wm * 64 + i * 16, slice, lane));
          }
          uint32_t regs[32][4];
          ldmatrix_x4(tile, address, regs);
          for (uint32_t lane = 0; lane < 32; ++lane) {
            for (uint32_t reg = 0; reg < 4; ++reg) {
              for (uint32_t e = 0; e < 2; ++e) {
                const uint32_t row = wm * 64 + i * 16 + a_row(reg, lane);
                const uint32_t k = 16 * slice + a_k(reg, e, lane);
                ASSERT_EQ(half_of(regs[lane][reg], e), row * 64 + k)
                    << "split " << C::kSplitK << " kg " << kg << " wm " << wm << " tile " << i
                    << " slice " << slice << " lane " << lane << " a[" << reg << "] element " << e;
              }
            }
          }
        }
      }
    }
  }
}

TEST(CudaInt4GemmTcLayout, LdmatrixGivesMmaAFragments) {
  const std::vector<uint8_t> tile = x_tile_16bit(128);
  check_ldmatrix<Config<0, XMode::kBf16, 32>>(tile);
  check_ldmatrix<Config<1, XMode::kBf16, 32>>(tile);
  check_ldmatrix<Config<3, XMode::kF16, 16>>(tile);
}

// FP32 X: the float pair each lane reads for a[reg] (fp32_pair_from, as load_a calls it) is
// A[row][k], A[row][k + 1] of the mma A fragment.
template <class C>
void check_fp32_pairs(const std::vector<float>& tile) {
  for (uint32_t kg = 0; kg < C::kSplitK; ++kg) {
    for (uint32_t wm = 0; wm < C::kBM / 64; ++wm) {
      for (uint32_t lane = 0; lane < 32; ++lane) {
        const LaneOffsets o = lane_offsets<C>(kg, wm, 0, lane);
        for (uint32_t i = 0; i < 4; ++i) {
          for (uint32_t s = 0; s < 2 * C::kChunksPerWarp; ++s) {
            const uint32_t slice = 2 * kg * C::kChunksPerWarp + s;
            for (uint32_t reg = 0; reg < 4; ++reg) {
              const uint32_t at = fp32_pair_from(o.f32, i, s, reg);
              ASSERT_EQ(at, fp32_pair_offset(wm * 64 + i * 16, slice, reg, lane));
              ASSERT_EQ(at % 8, 0u);
              for (uint32_t e = 0; e < 2; ++e) {
                const uint32_t row = wm * 64 + i * 16 + a_row(reg, lane);
                const uint32_t k = 16 * slice + a_k(reg, e, lane);
                ASSERT_EQ(tile[at / 4 + e], static_cast<float>(row * 64 + k))
                    << "split " << C::kSplitK << " kg " << kg << " wm " << wm << " tile " << i
                    << " slice " << slice << " lane " << lane << " a[" << reg << "] element " << e;
              }
            }
          }
        }
      }
    }
  }
}

TEST(CudaInt4GemmTcLayout, Fp32PairsGiveMmaAFragments) {
  const uint32_t rows = 128;
  std::vector<float> tile(size_t{rows} * 64, -1.0f);
  for (uint32_t r = 0; r < rows; ++r) {
    for (uint32_t q = 0; q < 16; ++q) {
      const uint32_t at = x_piece_offset(r, q, 4);
      for (uint32_t e = 0; e < 4; ++e) tile[at / 4 + e] = static_cast<float>(r * 64 + q * 4 + e);
    }
  }
  check_fp32_pairs<Config<0, XMode::kF32Split, 32>>(tile);
  check_fp32_pairs<Config<2, XMode::kF32Split, 16>>(tile);
}

// 16-bit element -> value, for the dequantised B registers.
double b_value(bool bf16, uint16_t h) {
  if (bf16) {
    const uint32_t bits = uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  __half v;
  std::memcpy(&v, &h, 2);
  return __half2float(v);
}

// Each lane's two words at the kernel's offsets (LaneOffsets.codes plus the local chunk, as
// compute_stage adds), through dequant_chunk_row: the mma B fragments (code - zero point) of
// every n8 tile, chunk and half of the warp, for every k group.
template <class C, bool kBf16>
void check_b_lanes(const std::vector<uint8_t>& tile, const std::vector<uint8_t>& code,
                   const std::vector<uint32_t>& zero, uint64_t seed) {
  for (uint32_t kg = 0; kg < C::kSplitK; ++kg) {
    for (uint32_t wn = 0; wn < 2; ++wn) {
      for (uint32_t lane = 0; lane < 32; ++lane) {
        const LaneOffsets o = lane_offsets<C>(kg, 0, wn, lane);
        EXPECT_EQ(o.permute, permute_selector(lane));
        for (uint32_t j = 0; j < 4; ++j) {
          for (uint32_t lc = 0; lc < C::kChunksPerWarp; ++lc) {
            const uint32_t cc = kg * C::kChunksPerWarp + lc;
            const uint8_t* row = tile.data() + o.codes + (j * 2 + lc) * kChunkBytes;
            uint32_t word_a, word_b;
            std::memcpy(&word_a, row, 4);
            std::memcpy(&word_b, row + code_word_offset(0, 1) - code_word_offset(0, 0), 4);
            const uint32_t n = wn * 32 + j * 8 + b_col(lane);
            uint32_t lo[2], hi[2];
            dequant_chunk_row<kBf16>(word_a, word_b, o.permute,
                                     zero_constant<kBf16>(zero[(cc * 2) * 64 + n]),
                                     zero_constant<kBf16>(zero[(cc * 2 + 1) * 64 + n]), lo, hi);
            for (uint32_t h = 0; h < 2; ++h) {
              for (uint32_t reg = 0; reg < 2; ++reg) {
                for (uint32_t e = 0; e < 2; ++e) {
                  const uint32_t k = 32 * cc + 16 * h + b_k(reg, e, lane);
                  const double want = static_cast<double>(code[n * 64 + k]) -
                                      static_cast<double>(zero[(cc * 2 + h) * 64 + n]);
                  const uint32_t got = h == 0 ? lo[reg] : hi[reg];
                  ASSERT_EQ(b_value(kBf16, half_of(got, e)), want)
                      << (kBf16 ? "bf16" : "f16") << " seed " << seed << " split " << C::kSplitK
                      << " kg " << kg << " wn " << wn << " lane " << lane << " n8 tile " << j
                      << " chunk " << cc << " half " << h << " b[" << reg << "] element " << e;
                }
              }
            }
          }
        }
      }
    }
  }
}

// The code tile as the loader fills it (piece p of the CTA's groups at p * 16, from canonical
// bytes) for random codes and zero points (one per k half, as with block size 16), checked
// lane by lane in BF16 and FP16, for a tile without and one with split K.
template <bool kBf16>
void check_b_fragments(uint64_t seed) {
  std::mt19937_64 rng(seed);
  constexpr uint32_t kGroups = 8;  // a warp's 4 n8 tiles, for both warps of a 64-column CTA
  // code[n][k] for 64 rows x 64 k (two chunks), in the canonical bytes of docs/formats.md.
  std::vector<uint8_t> code(kGroups * 8 * 64);
  for (auto& c : code) c = static_cast<uint8_t>(rng() % 16);
  std::vector<uint8_t> canonical(kGroups * 2 * kChunkBytes, 0);
  for (uint32_t n = 0; n < kGroups * 8; ++n) {
    for (uint32_t k = 0; k < 64; ++k) {
      const size_t byte = ((n / 8) * 2 + k / 32) * 128 + (n % 8) * 16 + k % 16;
      canonical[byte] |= k % 32 < 16 ? code[n * 64 + k] : code[n * 64 + k] << 4;
    }
  }
  // Loader: piece p = 16 group + 8 chunk + row, from the group's chunk row in memory.
  std::vector<uint8_t> tile(canonical.size(), 0xCD);
  for (uint32_t p = 0; p < kGroups * 16; ++p) {
    const uint32_t group = p / 16, chunk = (p / 8) % 2, row = p % 8;
    std::memcpy(tile.data() + code_row_offset(group, chunk, row),
                canonical.data() + (group * 2 + chunk) * kChunkBytes + row * kChunkRowBytes, 16);
  }
  // Zero points per (k half, n): each half of each chunk its own, as with block size 16.
  std::vector<uint32_t> zero(4 * kGroups * 8);
  for (auto& z : zero) z = static_cast<uint32_t>(rng() % 16);

  check_b_lanes<Config<0, XMode::kBf16, 16>, kBf16>(tile, code, zero, seed);
  check_b_lanes<Config<1, XMode::kBf16, 16>, kBf16>(tile, code, zero, seed);
}

TEST(CudaInt4GemmTcLayout, DequantisedCodesAreMmaBFragments) {
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    check_b_fragments<true>(seed);
    check_b_fragments<false>(seed);
  }
}

// Every 4-bit code and zero point through the exponent trick, both lanes, both types.
TEST(CudaInt4GemmTcLayout, NibbleMagicIsExact) {
  for (uint32_t c0 = 0; c0 < 16; ++c0) {
    for (uint32_t c1 = 0; c1 < 16; ++c1) {
      for (uint32_t z = 0; z < 16; ++z) {
        const uint32_t v = c0 | c1 << 16;
        const uint32_t bf = ptx::fma2<true>(ptx::and_or<0x000F000Fu>(v, NibbleMagic<true>::kMagic),
                                            NibbleMagic<true>::kOne, zero_constant<true>(z));
        const uint32_t hf =
            ptx::fma2<false>(ptx::and_or<0x000F000Fu>(v, NibbleMagic<false>::kMagic),
                             NibbleMagic<false>::kOne, zero_constant<false>(z));
        ASSERT_EQ(b_value(true, half_of(bf, 0)), double(c0) - z);
        ASSERT_EQ(b_value(true, half_of(bf, 1)), double(c1) - z);
        ASSERT_EQ(b_value(false, half_of(hf, 0)), double(c0) - z);
        ASSERT_EQ(b_value(false, half_of(hf, 1)), double(c1) - z);
      }
    }
  }
}

// The plane entries each lane reads are those of its fragments' columns: the zero constant of
// its B column, the scales of its two accumulator columns; and the loader's entry e of a thread
// is plane_entry(unit0 + i * step, column).
template <class C>
void check_plane_entries() {
  using L = Loader<C, XMode::kBf16>;
  constexpr uint32_t kUnitsPerChunk = 32 / C::kFold;
  for (uint32_t kg = 0; kg < C::kSplitK; ++kg) {
    for (uint32_t wn = 0; wn < C::kWarpsN; ++wn) {
      for (uint32_t lane = 0; lane < 32; ++lane) {
        const LaneOffsets o = lane_offsets<C>(kg, 0, wn, lane);
        for (uint32_t j = 0; j < 4; ++j) {
          for (uint32_t unit = 0; unit < C::kChunksPerWarp * kUnitsPerChunk; ++unit) {
            const uint32_t column = wn * 32 + j * 8;
            const uint32_t stage_unit = kg * C::kChunksPerWarp * kUnitsPerChunk + unit;
            EXPECT_EQ(o.zeros + unit * C::kBN * 4 + j * 32,
                      plane_entry(stage_unit, column + b_col(lane), C::kBN) * 4);
            for (uint32_t c = 0; c < 2; ++c) {
              EXPECT_EQ(o.scales + unit * C::kBN * 4 + j * 32 + 4 * c,
                        plane_entry(stage_unit, column + acc_col(c, lane), C::kBN) * 4);
              EXPECT_EQ(acc_col(c + 2, lane), acc_col(c, lane));
              EXPECT_EQ(acc_row(c + 2, lane), acc_row(c, lane) + 8);
            }
          }
        }
      }
    }
  }
  for (uint32_t tid = 0; tid < C::kThreads; ++tid) {
    for (uint32_t i = 0; i < L::kPlanePerThread; ++i) {
      EXPECT_EQ(tid + i * C::kThreads,
                plane_entry(tid / C::kBN + i * L::kPlaneUnitStep, tid % C::kBN, C::kBN));
    }
  }
}

// The plane entries each lane reads are those of its fragments' columns and its chunks' fold
// units: the zero constant of its B column, the scales of its two accumulator columns; and the
// loader's entry of a thread is plane_entry(unit0 + i * step, column).
TEST(CudaInt4GemmTcLayout, PlaneEntriesFollowTheFragments) {
  check_plane_entries<Config<0, XMode::kBf16, 16>>();
  check_plane_entries<Config<0, XMode::kBf16, 32>>();
  check_plane_entries<Config<1, XMode::kBf16, 16>>();
  check_plane_entries<Config<2, XMode::kBf16, 32>>();
  check_plane_entries<Config<3, XMode::kBf16, 16>>();
}

// The loader's X pieces (thread tid < kXThreads, piece i: row tid / pieces + i * kXRowStep,
// piece tid % pieces, at x_dst + i * kXRowStep rows) and code pieces cover the stage exactly
// once, for every tile and X type.
template <int kTile, XMode kX>
void check_loader_cover() {
  using C = Config<kTile, kX, 32>;
  using L = Loader<C, kX>;
  std::set<uint32_t> x_pieces, code_pieces;
  for (uint32_t tid = 0; tid < L::kXThreads; ++tid) {
    const uint32_t r0 = tid / L::kPiecesPerRow, q = tid % L::kPiecesPerRow;
    for (uint32_t i = 0; i < L::kXPerThread; ++i) {
      const uint32_t r = r0 + i * L::kXRowStep;
      ASSERT_LT(r, C::kBM);
      EXPECT_EQ(x_piece_offset(r0, q, L::kXBytes) + i * L::kXRowStep * C::kStage.x_row_bytes,
                x_piece_offset(r, q, L::kXBytes));
      EXPECT_TRUE(x_pieces.insert(r * L::kPiecesPerRow + q).second);
    }
  }
  EXPECT_EQ(x_pieces.size(), C::kBM * L::kPiecesPerRow) << "tile " << kTile;
  for (uint32_t tid = 0; tid < C::kThreads; ++tid) {
    for (uint32_t i = 0; i < L::kCodePerThread; ++i) {
      const uint32_t piece = tid + i * C::kThreads;
      // The loader's group of piece i is its first group plus i * kCodeGroupStep, its chunk and
      // row those of tid.
      EXPECT_EQ(piece / 16, tid / 16 + i * L::kCodeGroupStep);
      EXPECT_EQ((piece / 8) % 2, (tid / 8) % 2);
      EXPECT_EQ(piece % 8, tid % 8);
      EXPECT_TRUE(
          code_pieces.insert(code_row_offset(piece / 16, (piece / 8) % 2, piece % 8)).second);
    }
  }
  EXPECT_EQ(code_pieces.size(), C::kBN * 2) << "tile " << kTile;
  EXPECT_LE(*code_pieces.rbegin() + 16, C::kStage.scale_offset - C::kStage.code_offset);
}

TEST(CudaInt4GemmTcLayout, LoaderCoversEveryStage) {
  check_loader_cover<0, XMode::kBf16>();
  check_loader_cover<1, XMode::kBf16>();
  check_loader_cover<2, XMode::kBf16>();
  check_loader_cover<3, XMode::kBf16>();
  check_loader_cover<0, XMode::kF32Split>();
  check_loader_cover<1, XMode::kF32Split>();
  check_loader_cover<2, XMode::kF32Split>();
  check_loader_cover<3, XMode::kF32Split>();
}

}  // namespace
}  // namespace qmoe::cuda::tc
