// The tensor-core GEMM's shared-memory layouts and lane fragments (lib/cuda/int4_gemm_tc_layout.cuh
// and the offsets the kernel derives from them), checked on the host against the PTX ISA's
// definitions: ldmatrix's fragment layout (lane L gets elements 2 (L % 4), +1 of row L / 4 of
// each matrix, whose rows lanes 8i..8i+7 address), the mma.m16n8k16 A, B and C fragment layouts,
// and __byte_perm's byte selection. The stage images are filled the way the kernel's loader
// fills them, from matrices whose every element is distinct, so a wrong offset, swizzle,
// permute or nibble shows as a wrong value. Needs no device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lib/cuda/int4_gemm_tc_kernel.cuh"
#include "lib/cuda/int4_gemm_tc_layout.cuh"
#include "lib/cuda/int4_gemm_wgmma_kernel.cuh"
#include "lib/cuda/wgmma_ptx.cuh"

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

// plane_word: an aligned word whose src-size bytes run from the word's start through the
// element's last byte (never past it), and the element at `shift` of the entry, for every
// element size and misalignment within a word.
TEST(CudaInt4GemmTcLayout, PlaneWordEndsWithTheElement) {
  for (uint32_t bytes : {1u, 2u, 4u}) {
    for (uintptr_t element = 4096; element < 4096 + 16; element += bytes) {
      const PlaneWord w = plane_word(element, bytes);
      EXPECT_EQ(w.word % 4, 0u);
      EXPECT_LE(w.word, element);
      EXPECT_GT(w.word + 4, element);
      EXPECT_EQ(w.word + w.src_bytes, element + bytes);
      EXPECT_LE(w.src_bytes, 4u);
      EXPECT_EQ(w.shift, 8 * (element - w.word));
    }
  }
}

TEST(CudaInt4GemmTcLayout, PlaneEndIsOnePastTheLargestElement) {
  for (uint32_t bytes : {1u, 2u, 4u}) {
    for (uint32_t n : {1u, 7u, 8u, 9u, 16u, 23u}) {
      for (uint32_t blocks : {1u, 3u}) {
        // Row-major, block-major, grouped, and grouped with a group stride below 7 rows.
        const size_t strides[][3] = {
            {blocks, 1, 0}, {1, n, 0}, {1, 8, 8 * blocks}, {4 * blocks, 1, 2 * blocks}};
        for (const auto& st : strides) {
          size_t largest = 0;
          for (uint32_t r = 0; r < n; ++r) {
            for (uint32_t b = 0; b < blocks; ++b) {
              largest = std::max(largest, plane_offset(r, b, st[0], st[1], st[2]));
            }
          }
          const auto* base = reinterpret_cast<const void*>(uintptr_t{4096});
          EXPECT_EQ(plane_end_address(base, n, blocks, st[0], st[1], st[2], bytes),
                    4096 + (largest + 1) * bytes)
              << "bytes " << bytes << " n " << n << " blocks " << blocks << " strides " << st[0]
              << "," << st[1] << "," << st[2];
        }
      }
    }
  }
}

// A serial stand-in for the CTA when only the loader runs: shared memory, cp.async at once, and
// every byte cp.async reads checked to lie in one of the buffers it may read.
class LoaderEmulator : public ptx::HostEmulator {
 public:
  explicit LoaderEmulator(size_t shared_bytes) : shared(shared_bytes, 0xA5) {}
  uint8_t* shared_memory() override { return shared.data(); }
  void cta_barrier() override {}
  void ldmatrix_x4(uint32_t (&)[4], uint32_t) override { ADD_FAILURE() << "ldmatrix"; }
  void mma_16816(bool, float (&)[4], const uint32_t (&)[4], uint32_t, uint32_t,
                 const float (&)[4]) override {
    ADD_FAILURE() << "mma";
  }
  void cp_async(uint32_t dst, const void* src, uint32_t cp_size, uint32_t src_bytes) override {
    EXPECT_EQ(dst % cp_size, 0u);
    const auto at = reinterpret_cast<uintptr_t>(src);
    EXPECT_EQ(at % cp_size, 0u) << "cp.async source not aligned to its size";
    if (src_bytes != 0) {
      // The whole cp_size bytes, not only src_bytes: compute-sanitizer memcheck checks the
      // whole source word of a partial cp.async, so one that reaches past a buffer's end is
      // reported even though the hardware reads only src_bytes (the loader plain-loads those).
      bool inside = false;
      for (const auto& r : readable) inside |= at >= r.first && at + cp_size <= r.second;
      EXPECT_TRUE(inside) << "cp.async reads [" << at << ", " << at + cp_size
                          << ") outside the buffers it may read";
    }
    ptx::HostEmulator::cp_async(dst, src, cp_size, src_bytes);
  }
  std::vector<uint8_t> shared;
  std::vector<std::pair<uintptr_t, uintptr_t>> readable;
};

// One plane of N rows x `blocks` in one of the orders the tests use (docs/formats.md strides),
// its elements at `offset` bytes into a 16-byte aligned buffer that ends with the plane.
struct TestPlane {
  size_t row_stride = 0, block_stride = 0, group_stride = 0, elements = 0;
  std::vector<uint4> buffer;
  const uint8_t* base = nullptr;
  size_t at(uint32_t n, uint32_t b) const {
    return plane_offset(n, b, row_stride, block_stride, group_stride);
  }
};
TestPlane make_plane(int order, uint32_t n, uint32_t blocks, uint32_t element_bytes,
                     uint32_t offset) {
  TestPlane t;
  switch (order) {
    case 0:  // row-major
      t.row_stride = blocks;
      t.block_stride = 1;
      break;
    case 1:  // block-major
      t.row_stride = 1;
      t.block_stride = n;
      break;
    case 2:  // padded row-major
      t.row_stride = blocks + 3;
      t.block_stride = 1;
      break;
    default:  // grouped
      t.row_stride = 1;
      t.block_stride = 8;
      t.group_stride = size_t{8} * blocks;
      break;
  }
  t.elements = t.group_stride != 0 ? (size_t{n} + 7) / 8 * t.group_stride
                                   : (n - 1) * t.row_stride + (blocks - 1) * t.block_stride + 1;
  const size_t bytes = offset + t.elements * element_bytes;
  t.buffer.assign((bytes + 15) / 16,
                  make_uint4(0xEEEEEEEEu, 0xEEEEEEEEu, 0xEEEEEEEEu, 0xEEEEEEEEu));
  t.base = reinterpret_cast<const uint8_t*>(t.buffer.data()) + offset;
  return t;
}

// A scale value exactly representable in FP16, BF16 and FP32, distinct for nearby (n, b).
float test_scale(uint32_t n, uint32_t b) {
  const uint32_t v = (n * 37 + b * 11) % 251 + 1;
  return (n % 2 == 0 ? 1.0f : -1.0f) * static_cast<float>(v) * 0.0625f;
}
uint32_t test_zero_point(uint32_t n, uint32_t b) {
  return (n * 7 + b * 3) % 16 | (n % 3 == 0 ? 0xF0u : 0u);  // high bits set: ignored
}

// Every plane entry of every stage the loader fills (copy_async, then convert_planes by the
// same thread; with kByRegisters the wgmma producer's route instead, load_plane_values then
// store_plane_values), for every column tile and k-tile: the FP32 scale of (n, k / B) (its two
// BF16 parts for scaled weights) and the zero constant of its zero point, scale 0 and the
// default zero point past N and K; and no byte read outside the planes' words (the planes end
// exactly with their last element).
template <class C, XMode kX, bool kByRegisters = false>
void check_plane_staging(uint32_t block, qmoe_dtype scale_dtype, int scale_order, int zero_order,
                         uint32_t scale_offset, uint32_t zero_offset) {
  using L = Loader<C, kX>;
  const uint32_t n = 150, k = block == 16 ? 80 : block == 32 ? 96 : 2 * block, m = 17;
  const uint32_t blocks = k / block, chunks = (k + 31) / 32, groups = (n + 7) / 8;
  SCOPED_TRACE("tile " + std::to_string(C::kBM) + "x" + std::to_string(C::kBN) + " fold " +
               std::to_string(C::kFold) + " block " + std::to_string(block) + " scale type " +
               std::to_string(scale_dtype) + " order " + std::to_string(scale_order) + " offset " +
               std::to_string(scale_offset) + " zero order " + std::to_string(zero_order) +
               " offset " + std::to_string(zero_offset));
  const uint32_t es = scale_dtype == QMOE_DTYPE_F32 ? 4 : 2;
  TestPlane scales = make_plane(scale_order, n, blocks, es, scale_offset);
  TestPlane zeros = make_plane(zero_order < 0 ? 0 : zero_order, n, blocks, 1, zero_offset);
  auto* scale_bytes = const_cast<uint8_t*>(scales.base);
  auto* zero_bytes = const_cast<uint8_t*>(zeros.base);
  for (uint32_t row = 0; row < n; ++row) {
    for (uint32_t b = 0; b < blocks; ++b) {
      const float v = test_scale(row, b);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      uint8_t* e = scale_bytes + scales.at(row, b) * es;
      if (scale_dtype == QMOE_DTYPE_F32) {
        std::memcpy(e, &bits, 4);
      } else if (scale_dtype == QMOE_DTYPE_BF16) {
        const uint16_t h = static_cast<uint16_t>(bits >> 16);
        std::memcpy(e, &h, 2);
      } else {
        const __half h = __float2half_rn(v);
        std::memcpy(e, &h, 2);
      }
      zero_bytes[zeros.at(row, b)] = static_cast<uint8_t>(test_zero_point(row, b));
    }
  }
  std::vector<uint4> x(size_t{m} * k * XTraits<kX>::kBytes / 16 + 1);
  std::vector<uint4> codes(size_t{groups} * chunks * kChunkBytes / 16);

  DeviceQuantMatrix w{};
  w.n = n;
  w.k = k;
  w.block_size = block;
  w.chunks = chunks;
  w.codes = reinterpret_cast<const uint8_t*>(codes.data());
  w.scale_dtype = scale_dtype;
  w.scales = scales.base;
  w.scale_row_stride = scales.row_stride;
  w.scale_block_stride = scales.block_stride;
  w.scale_group_stride = scales.group_stride;
  w.zero_points = zero_order < 0 ? nullptr : zeros.base;
  w.zero_point_row_stride = zeros.row_stride;
  w.zero_point_block_stride = zeros.block_stride;
  w.zero_point_group_stride = zeros.group_stride;
  std::vector<float> y(size_t{m} * n);
  const Params p = make_params(w, m, nullptr, x.data(), k, QMOE_DTYPE_F32, y.data(), n, 0, n);

  LoaderEmulator emulator(C::kStage.bytes);
  const auto range = [](const void* begin, size_t bytes) {
    const auto b = reinterpret_cast<uintptr_t>(begin);
    return std::make_pair(b, b + bytes);
  };
  emulator.readable.push_back(range(x.data(), x.size() * 16));
  emulator.readable.push_back(range(codes.data(), codes.size() * 16));
  // A plane word may start before the plane's first element, in its aligned word.
  const auto plane_range = [](const uint8_t* base, size_t bytes) {
    const auto b = reinterpret_cast<uintptr_t>(base);
    return std::make_pair(b & ~uintptr_t{3}, b + bytes);
  };
  emulator.readable.push_back(plane_range(scales.base, scales.elements * es));
  if (zero_order >= 0) emulator.readable.push_back(plane_range(zeros.base, zeros.elements));
  ptx::host_emulator = &emulator;
  uint8_t* stage = emulator.shared.data();
  const auto* scale_entries = reinterpret_cast<const float*>(stage + C::kStage.scale_offset);
  const auto* zero_entries = reinterpret_cast<const uint32_t*>(stage + C::kStage.zero_offset);
  constexpr bool kBf16 = XTraits<kX>::kBf16Mma;
  for (uint32_t n0 = 0; n0 < n; n0 += C::kBN) {
    std::vector<L> loaders;
    for (uint32_t tid = 0; tid < L::kThreads; ++tid) loaders.emplace_back(p, m, 0, n0, tid);
    for (uint32_t kt = 0; kt < p.k_tiles; ++kt) {
      std::fill(emulator.shared.begin(), emulator.shared.end(), 0xA5);
      if constexpr (kByRegisters) {
        for (uint32_t tid = 0; tid < L::kThreads; ++tid) {
          typename L::PlaneValues values;
          loaders[tid].load_plane_values(p, kt, values);
          loaders[tid].template store_plane_values<C::kScaledWeights>(p, stage, values, tid);
        }
      } else {
        for (uint32_t tid = 0; tid < L::kThreads; ++tid) {
          loaders[tid].copy_async(p, stage, kt, tid);
        }
        for (uint32_t tid = 0; tid < L::kThreads; ++tid) {
          loaders[tid].convert_planes(p, stage, kt, tid);
        }
      }
      for (uint32_t unit = 0; unit < kTileK / C::kFold; ++unit) {
        for (uint32_t column = 0; column < C::kBN; ++column) {
          const uint32_t row = n0 + column, kk = kt * kTileK + unit * C::kFold;
          const bool exists = row < n && kk < k;
          const float want_scale = exists ? test_scale(row, kk / block) : 0.0f;
          const uint32_t want_zero =
              zero_constant<kBf16>(exists && zero_order >= 0 ? test_zero_point(row, kk / block) & 15
                                                             : kInt4DefaultZeroPoint);
          const uint32_t e = plane_entry(unit, column, C::kBN);
          if constexpr (C::kScaledWeights) {
            uint32_t parts;
            std::memcpy(&parts, &scale_entries[e], 4);
            ASSERT_EQ(parts, bf16_split_bits(want_scale)) << "n " << row << " k " << kk;
          } else {
            ASSERT_EQ(scale_entries[e], want_scale) << "n " << row << " k " << kk;
          }
          ASSERT_EQ(zero_entries[e], want_zero) << "n " << row << " k " << kk;
        }
      }
    }
  }
  ptx::host_emulator = nullptr;
}

template <class C, XMode kX, bool kByRegisters = false>
void check_plane_staging_all(uint32_t block) {
  int index = 0;
  for (qmoe_dtype sd : {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16}) {
    if (C::kScaledWeights && sd != QMOE_DTYPE_F16) continue;  // scaled weights: FP16 scales
    for (int so = 0; so < 4; ++so) {
      for (int zo = -1; zo < 4; ++zo) {
        const uint32_t es = sd == QMOE_DTYPE_F32 ? 4 : 2;
        check_plane_staging<C, kX, kByRegisters>(block, sd, so, zo, es * (index % 4), index % 4);
        ++index;
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

TEST(CudaInt4GemmTcLayout, LoaderStagesEveryPlaneEntry) {
  check_plane_staging_all<Config<0, XMode::kBf16, 16>, XMode::kBf16>(16);
  check_plane_staging_all<Config<0, XMode::kF16, 32>, XMode::kF16>(128);
  check_plane_staging_all<Config<1, XMode::kBf16, 32>, XMode::kBf16>(32);
  check_plane_staging_all<Config<1, XMode::kF32Split, 16>, XMode::kF32Split>(16);
  check_plane_staging_all<Config<2, XMode::kF16, 32>, XMode::kF16>(64);
  check_plane_staging_all<Config<3, XMode::kBf16, 32>, XMode::kBf16>(32);
  check_plane_staging_all<Config<3, XMode::kF32Split, 32>, XMode::kF32Split>(128);
}

// The wgmma producer's planes: loaded into registers and stored converted, they must be the
// entries the cp.async route gives, on every wgmma tile, both fold granularities and levels.
TEST(CudaInt4GemmTcLayout, ProducerStoresThePlaneEntriesItLoads) {
  check_plane_staging_all<WgmmaConfig<4, XMode::kBf16, 32>, XMode::kBf16, true>(32);
  check_plane_staging_all<WgmmaConfig<5, XMode::kF16, 16>, XMode::kF16, true>(16);
  check_plane_staging_all<WgmmaConfig<6, XMode::kBf16, 32>, XMode::kBf16, true>(128);
  check_plane_staging_all<WgmmaConfig<4, XMode::kBf16, 16, true>, XMode::kBf16, true>(16);
  check_plane_staging_all<WgmmaConfig<5, XMode::kBf16, 32, true>, XMode::kBf16, true>(64);
}

// The wgmma tiles read the X stage through a 128-byte-swizzle descriptor: the hardware forms an
// element's address unswizzled (row r at r * 128 from a 1024-aligned start) and XORs its 16-byte
// unit (address bits 4-6) with bits 7-9. The loader's X layout must be exactly that, and the
// descriptor's fields what the PTX ISA's matrix-descriptor format says.
TEST(CudaInt4GemmTcLayout, WgmmaReadsTheXStageAsItIsLaidOut) {
  for (uint32_t r = 0; r < 128; ++r) {
    for (uint32_t q = 0; q < 8; ++q) {
      const uint32_t plain = r * 128 + q * 16;
      EXPECT_EQ(x_piece_offset(r, q, 2), plain ^ (((plain >> 7) & 7u) << 4)) << r << " " << q;
    }
  }
  for (uint32_t address : {0u, 0x400u, 0x13000u + 3 * 32u, 0x2FFE0u}) {
    const uint64_t d = ptx::wgmma_descriptor_sw128(address);
    EXPECT_EQ(d & 0x3FFFu, (address & 0x3FFFFu) >> 4) << "start address / 16";
    EXPECT_EQ((d >> 16) & 0x3FFFu, 1u) << "leading byte offset / 16";
    EXPECT_EQ((d >> 32) & 0x3FFFu, 1024u / 16) << "stride byte offset / 16: one 8-row atom";
    EXPECT_EQ((d >> 49) & 7u, 0u) << "base offset";
    EXPECT_EQ(d >> 62, 1u) << "swizzle mode: 128 bytes";
    EXPECT_EQ(d & ((3ull << 14) | (3ull << 30) | (7ull << 46) | (0x3FFull << 52)), 0u)
        << "reserved bits";
  }
}

// Stage counts: every variant has 3 or more stages (the pipeline converts one k-tile ahead),
// its shared memory is what the launcher reports, and the 64-row tiles with 16-bit X keep at
// least 6 k-tiles in flight within the budget.
TEST(CudaInt4GemmTcLayout, StageCounts) {
  for (int t = 0; t < kInt4GemmTcTileCount; ++t) {
    const TileGeometry g = kTileGeometry[t];
    for (uint32_t xb : {2u, 4u}) {
      if (g.wgmma && xb == 4) continue;  // 16-bit X only
      for (uint32_t fold : {16u, 32u}) {
        const uint32_t stages = stage_count(g, xb, fold);
        const size_t stage_bytes = size_t{stages} * stage_layout(g, xb, fold).bytes;
        EXPECT_GE(stages, kMinStages);
        EXPECT_LE(stages, kMaxStages);
        // The wgmma tile's: the alignment slack and a barrier per stage (its X copy's).
        EXPECT_EQ(shared_bytes(g, xb, fold),
                  stage_bytes + (g.wgmma ? kWgmmaAlignment + kWgmmaBarrierBytes : 0));
        if (g.wgmma) EXPECT_LE(8 * stages, kWgmmaBarrierBytes);
        if (stages > kMinStages) EXPECT_LE(stage_bytes, stage_budget(g));
        // The wgmma tile's stages start 1024-byte aligned, as its X descriptor (and the TMA's
        // swizzled copy) needs.
        if (g.wgmma) EXPECT_EQ(stage_layout(g, xb, fold).bytes % kWgmmaAlignment, 0u);
        if (g.bm == 64 && xb == 2) EXPECT_GE(stages, 6u) << "tile " << t << " fold " << fold;
      }
    }
  }
  EXPECT_EQ(int4_gemm_tc_shared_bytes(Int4GemmTcTile::k64x128, QMOE_DTYPE_BF16, 32),
            (Config<1, XMode::kBf16, 32>::kSharedBytes));
  EXPECT_EQ(int4_gemm_tc_shared_bytes(Int4GemmTcTile::k128x128, QMOE_DTYPE_F32, 16),
            (Config<0, XMode::kF32Split, 16>::kSharedBytes));
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
