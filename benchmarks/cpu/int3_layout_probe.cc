// qmoe_int3_layout_probe: what unpacking costs the INT3 fast kernel for each candidate byte
// layout of a 96-byte tile (8 rows x 32 3-bit codes), on this core. Each candidate runs the same
// M = 1 fast-level chunk core: unpack the tile into the pair form of the INT4 kernels (a 256-bit
// vector per pair of rows and half of the chunk, one row per 128-bit lane, the codes as bytes in
// k order; or four rows per 512-bit vector), multiply with vpmaddubsw against the activation
// halves broadcast per lane, reduce to the eight rows' int32 sums and accumulate them in FP32.
// Only the unpacking differs. The INT4 core (128-byte tiles) runs beside them for reference.
//
// Candidates (docs/formats.md, "INT3 weights", has the chosen one byte by byte):
//   planes   three bit planes: for plane i (bit i of the codes), half h (k 16h..16h+15) and row
//            r, a 16-bit mask at 32i + 16h + 2r. AVX2: per plane and vector a broadcast,
//            vpshufb, vpand, vpcmpeqb and vpand; AVX-512: kmovq + a masked move or add per plane.
//   split21  per row 12 contiguous bytes: 8 bytes of 2-bit fields (byte j holds codes j, j + 8,
//            j + 16, j + 24 in bits 0-1, 2-3, 4-5, 6-7: AND and shift give them in k order) and
//            4 bytes of high bits (bit k = bit 2 of code k), spread to bytes with vpshufb,
//            vpand and vpcmpeqb.
//   3+3+2    three 32-byte vectors whose bytes hold two whole codes each (bits 0-2 and 3-5) for
//            rows 0-5, and in their top two bits the codes of rows 6-7 split into their low two
//            bits (vectors 0 and 1) and their high bit (vector 2): six of the eight pair vectors
//            are one or two operations, the other two five.
//
// Two measurements per candidate: cycles per tile with the tiles in L1 (the arithmetic ceiling;
// clock from a chain of dependent vaddps, 3 cycles each), and GB/s streaming a 96 MiB buffer
// (128 MiB for INT4: the same codes) from DRAM with the kernels' 3 KiB software prefetch, beside
// a plain AVX2 read of the same buffer. docs/results/2026-12-01-int3-layout.md has the figures.
//
//   qmoe_int3_layout_probe [--rounds R] [--no-dram]
#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

// The AVX-512 intrinsics with GCC 12's spurious warnings scoped away (the header says why).
#include "lib/cpu/avx512/immintrin_avx512.h"

namespace {

#define QMOE_AVX2 __attribute__((target("avx2,fma"), always_inline)) inline
#define QMOE_AVX2_FN __attribute__((target("avx2,fma"), noinline))
#define QMOE_AVX512 \
  __attribute__((target("avx2,fma,avx512f,avx512bw,avx512dq,avx512vl"), always_inline)) inline
#define QMOE_AVX512_FN \
  __attribute__((target("avx2,fma,avx512f,avx512bw,avx512dq,avx512vl"), noinline))

constexpr int kL1Tiles = 64;             // 6 KiB of INT3 tiles, 8 KiB of INT4: L1-resident
constexpr size_t kDramTiles = 1 << 20;   // 96 MiB of INT3 tiles, 128 MiB of INT4
constexpr size_t kPrefetchBytes = 3072;  // the INT4 kernels' distance (int4_prefetch.h)

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

QMOE_AVX2_FN double measure_hz() {
  __m256 a = _mm256_set1_ps(1.0f);
  const __m256 b = _mm256_set1_ps(1e-9f);
  const long iterations = 20000000;
  const double t0 = seconds_now();
  for (long i = 0; i < iterations; ++i) {
    a = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a, b), b), b), b);
    asm volatile("" : "+x"(a));
  }
  const double t1 = seconds_now();
  volatile float sink = _mm256_cvtss_f32(a);
  (void)sink;
  return 12.0 * iterations / (t1 - t0);
}

// ---- The shared 256-bit chunk core (the INT4 AVX2 kernel's pair form and reduction) --------

// lo[p] = [row 2p: codes 0-15 | row 2p + 1: codes 0-15], hi[p] the same for codes 16-31, as
// bytes; x_lo, x_hi the activation halves broadcast to both lanes. Returns the eight rows' sums
// in the order [0 2 4 6 1 3 5 7].
QMOE_AVX2 __m256i pair_sums(const __m256i lo[4], const __m256i hi[4], __m256i x_lo, __m256i x_hi) {
  __m256i pair[4];
  for (int p = 0; p < 4; ++p) {
    pair[p] =
        _mm256_add_epi16(_mm256_maddubs_epi16(lo[p], x_lo), _mm256_maddubs_epi16(hi[p], x_hi));
  }
  const __m256i a = _mm256_add_epi16(_mm256_unpacklo_epi32(pair[0], pair[1]),
                                     _mm256_unpackhi_epi32(pair[0], pair[1]));
  const __m256i b = _mm256_add_epi16(_mm256_unpacklo_epi32(pair[2], pair[3]),
                                     _mm256_unpackhi_epi32(pair[2], pair[3]));
  const __m256i s = _mm256_add_epi16(_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b));
  return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
}

// ---- Unpackers: one tile into lo[4], hi[4] --------------------------------------------------

struct Int4Unpack {
  static constexpr int kBytes = 128;
  QMOE_AVX2 static void run(const uint8_t* t, __m256i lo[4], __m256i hi[4]) {
    const __m256i m = _mm256_set1_epi8(0x0F);
    for (int p = 0; p < 4; ++p) {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 32 * p));
      lo[p] = _mm256_and_si256(b, m);
      hi[p] = _mm256_and_si256(_mm256_srli_epi16(b, 4), m);
    }
  }
};

// Bit i of each byte of `sel`'s broadcast selects: bytes 0-7 of a lane test bit j of byte 0,
// bytes 8-15 bit j of byte 1.
QMOE_AVX2 __m256i bit_select() {
  return _mm256_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8,
                          16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
}

// The 16 bits at `two` (little-endian) of the low lane and at `two + 2` of the high lane spread
// to one byte per bit: value `v` where the bit is set, 0 elsewhere.
QMOE_AVX2 __m256i spread_bits(__m256i bytes, __m256i shuffle, __m256i v) {
  const __m256i sel = bit_select();
  const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(bytes, shuffle), sel);
  return _mm256_and_si256(_mm256_cmpeq_epi8(b, sel), v);
}

// Pair p of the planes candidate: lane 0 byte 4p (row 2p, codes 0-7) to bytes 0-7 and 4p + 1
// to bytes 8-15; lane 1 bytes 4p + 2 and 4p + 3 (row 2p + 1). Loaded, not built per call.
alignas(32) const int8_t kPlaneShuffles[4][32] = {
#define QMOE_PAIR_(p)                                                                           \
  {                                                                                             \
    4 * p, 4 * p, 4 * p, 4 * p, 4 * p, 4 * p, 4 * p, 4 * p, 4 * p + 1, 4 * p + 1, 4 * p + 1,    \
        4 * p + 1, 4 * p + 1, 4 * p + 1, 4 * p + 1, 4 * p + 1, 4 * p + 2, 4 * p + 2, 4 * p + 2, \
        4 * p + 2, 4 * p + 2, 4 * p + 2, 4 * p + 2, 4 * p + 2, 4 * p + 3, 4 * p + 3, 4 * p + 3, \
        4 * p + 3, 4 * p + 3, 4 * p + 3, 4 * p + 3, 4 * p + 3                                   \
  }
    QMOE_PAIR_(0), QMOE_PAIR_(1), QMOE_PAIR_(2), QMOE_PAIR_(3)
#undef QMOE_PAIR_
};

struct PlanesUnpack {
  static constexpr int kBytes = 96;
  // Plane i, half h, row r: 16 bits at 32i + 16h + 2r.
  QMOE_AVX2 static void run(const uint8_t* t, __m256i lo[4], __m256i hi[4]) {
    // Lane 0 takes the mask at byte 4p (row 2p), lane 1 at 4p + 2 (row 2p + 1), from a
    // broadcast of the 16 bytes of one (plane, half).
    for (int h = 0; h < 2; ++h) {
      const __m256i plane[3] = {_mm256_broadcastsi128_si256(
                                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(t + 16 * h))),
                                _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                    reinterpret_cast<const __m128i*>(t + 32 + 16 * h))),
                                _mm256_broadcastsi128_si256(_mm_loadu_si128(
                                    reinterpret_cast<const __m128i*>(t + 64 + 16 * h)))};
      for (int p = 0; p < 4; ++p) {
        const __m256i shuffle =
            _mm256_load_si256(reinterpret_cast<const __m256i*>(kPlaneShuffles[p]));
        __m256i codes = spread_bits(plane[0], shuffle, _mm256_set1_epi8(1));
        codes = _mm256_or_si256(codes, spread_bits(plane[1], shuffle, _mm256_set1_epi8(2)));
        codes = _mm256_or_si256(codes, spread_bits(plane[2], shuffle, _mm256_set1_epi8(4)));
        (h == 0 ? lo : hi)[p] = codes;
      }
    }
  }
};

struct Split21Unpack {
  static constexpr int kBytes = 96;
  // Row r: bytes 12r..12r+7 the 2-bit fields, 12r+8..12r+11 the high bits.
  QMOE_AVX2 static void run(const uint8_t* t, __m256i lo[4], __m256i hi[4]) {
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4);
    const __m256i dup_fields = _mm256_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0,
                                                1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i high_bytes[2] = {
        _mm256_setr_epi8(8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9, 8, 8, 8, 8, 8, 8, 8, 8, 9,
                         9, 9, 9, 9, 9, 9, 9),
        _mm256_setr_epi8(10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11, 10, 10, 10,
                         10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11)};
    const __m256i shifts[2] = {_mm256_setr_epi64x(0, 2, 0, 2), _mm256_setr_epi64x(4, 6, 4, 6)};
    for (int p = 0; p < 4; ++p) {
      // Rows 2p and 2p + 1 (the last row's load reads 4 bytes past its 12).
      const __m256i rows = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(t + 24 * p + 12),
                                               reinterpret_cast<const __m128i*>(t + 24 * p));
      const __m256i fields = _mm256_shuffle_epi8(rows, dup_fields);
      for (int h = 0; h < 2; ++h) {
        // Bytes 0-7 of a lane: codes 16h + j (shift 4h); bytes 8-15: codes 16h + 8 + j.
        const __m256i low2 = _mm256_and_si256(_mm256_srlv_epi64(fields, shifts[h]), m3);
        const __m256i codes = _mm256_or_si256(low2, spread_bits(rows, high_bytes[h], m4));
        (h == 0 ? lo : hi)[p] = codes;
      }
    }
  }
};

struct Layout332Unpack {
  static constexpr int kBytes = 96;
  // Byte 32v + 16L + b: rows 2v + L (v < 3) code b in bits 0-2 and code 16 + b in bits 3-5; bits
  // 6-7 of vectors 0 and 1 the low two bits of row 6 + L's code b and 16 + b; bits 6 and 7 of
  // vector 2 their high bits.
  QMOE_AVX2 static void run(const uint8_t* t, __m256i lo[4], __m256i hi[4]) {
    const __m256i m7 = _mm256_set1_epi8(7), m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4);
    const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t));
    const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 32));
    const __m256i v2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 64));
    lo[0] = _mm256_and_si256(v0, m7);
    hi[0] = _mm256_and_si256(_mm256_srli_epi16(v0, 3), m7);
    lo[1] = _mm256_and_si256(v1, m7);
    hi[1] = _mm256_and_si256(_mm256_srli_epi16(v1, 3), m7);
    lo[2] = _mm256_and_si256(v2, m7);
    hi[2] = _mm256_and_si256(_mm256_srli_epi16(v2, 3), m7);
    lo[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v0, 6), m3),
                            _mm256_and_si256(_mm256_srli_epi16(v2, 4), m4));
    hi[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v1, 6), m3),
                            _mm256_and_si256(_mm256_srli_epi16(v2, 5), m4));
  }
};

// The M = 1 chunk core over `tiles` consecutive tiles, `passes` times; with `prefetch`, the
// kernels' software prefetch of the stream (two lines per 128 bytes of INT4: one per 64 bytes).
template <typename Unpack>
QMOE_AVX2_FN float core256(const uint8_t* base, size_t tiles, const int8_t* q, int passes,
                           bool prefetch) {
  __m256 acc = _mm256_setzero_ps();
  const __m256 scale = _mm256_set1_ps(1e-3f);
  for (int pass = 0; pass < passes; ++pass) {
    const uint8_t* t = base;
    for (size_t c = 0; c < tiles; ++c, t += Unpack::kBytes) {
      if (prefetch) {
        for (int line = 0; line < Unpack::kBytes; line += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(t + kPrefetchBytes + line), _MM_HINT_T0);
        }
      }
      __m256i lo[4], hi[4];
      Unpack::run(t, lo, hi);
      const int8_t* qc = q + 32 * (c % 64);
      const __m256i x_lo =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qc)));
      const __m256i x_hi =
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qc + 16)));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pair_sums(lo, hi, x_lo, x_hi)), scale, acc);
    }
  }
  return _mm256_cvtss_f32(acc);
}

// ---- 512-bit cores: four rows per vector, one per 128-bit lane (the INT4 AVX-512 body) -----

// lo0 = rows 0-3 codes 0-15, hi0 rows 0-3 codes 16-31, lo1/hi1 rows 4-7.
struct Int4Unpack512 {
  static constexpr int kBytes = 128;
  QMOE_AVX512 static void run(const uint8_t* t, __m512i v[4]) {
    const __m512i m = _mm512_set1_epi8(0x0F);
    const __m512i b0 = _mm512_loadu_si512(t), b1 = _mm512_loadu_si512(t + 64);
    v[0] = _mm512_and_si512(b0, m);
    v[1] = _mm512_and_si512(_mm512_srli_epi16(b0, 4), m);
    v[2] = _mm512_and_si512(b1, m);
    v[3] = _mm512_and_si512(_mm512_srli_epi16(b1, 4), m);
  }
};

struct PlanesUnpack512 {
  static constexpr int kBytes = 96;
  // Plane i, half h: 16 bytes, rows 0..7 two bytes each; rows 0-3 are one 64-bit mask.
  QMOE_AVX512 static void run(const uint8_t* t, __m512i v[4]) {
    for (int h = 0; h < 2; ++h) {
      for (int g = 0; g < 2; ++g) {
        uint64_t m[3];
        for (int i = 0; i < 3; ++i) std::memcpy(&m[i], t + 32 * i + 16 * h + 8 * g, 8);
        __m512i codes = _mm512_maskz_mov_epi8(_cvtu64_mask64(m[0]), _mm512_set1_epi8(1));
        codes = _mm512_mask_add_epi8(codes, _cvtu64_mask64(m[1]), codes, _mm512_set1_epi8(2));
        codes = _mm512_mask_add_epi8(codes, _cvtu64_mask64(m[2]), codes, _mm512_set1_epi8(4));
        v[2 * g + h] = codes;
      }
    }
  }
};

struct Layout332Unpack512 {
  static constexpr int kBytes = 96;
  QMOE_AVX512 static void run(const uint8_t* t, __m512i v[4]) {
    const __m512i m7 = _mm512_set1_epi8(7);
    const __m512i z = _mm512_loadu_si512(t);  // [v0 | v1] = rows 0, 1, 2, 3
    const __m512i w =
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + 64)));
    v[0] = _mm512_and_si512(z, m7);
    v[1] = _mm512_and_si512(_mm512_srli_epi16(z, 3), m7);
    // Rows 4-7: [v2 | v0] and [v2 | v1]; rows 6-7 take bits 6-7 of v0 (v1) and bit 6 (7) of v2.
    const __m512i a = _mm512_shuffle_i64x2(w, z, _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i b = _mm512_shuffle_i64x2(w, z, _MM_SHUFFLE(3, 2, 1, 0));
    const __m512i rows45_mask =
        _mm512_setr_epi64(-1, -1, -1, -1, 0x0303030303030303, 0x0303030303030303,
                          0x0303030303030303, 0x0303030303030303);
    const __m512i lo_shift = _mm512_setr_epi64(0, 0, 0, 0, 0x0006000600060006, 0x0006000600060006,
                                               0x0006000600060006, 0x0006000600060006);
    const __m512i lo_hshift = _mm512_setr_epi64(0, 0, 0, 0, 0x0004000400040004, 0x0004000400040004,
                                                0x0004000400040004, 0x0004000400040004);
    const __m512i hi_shift = _mm512_setr_epi64(
        0x0003000300030003, 0x0003000300030003, 0x0003000300030003, 0x0003000300030003,
        0x0006000600060006, 0x0006000600060006, 0x0006000600060006, 0x0006000600060006);
    const __m512i hi_hshift = _mm512_setr_epi64(
        0x0003000300030003, 0x0003000300030003, 0x0003000300030003, 0x0003000300030003,
        0x0005000500050005, 0x0005000500050005, 0x0005000500050005, 0x0005000500050005);
    // (mask ? low : high) per bit, then the code's three bits.
    v[2] = _mm512_and_si512(_mm512_ternarylogic_epi64(rows45_mask, _mm512_srlv_epi16(a, lo_shift),
                                                      _mm512_srlv_epi16(w, lo_hshift), 0xCA),
                            m7);
    v[3] = _mm512_and_si512(_mm512_ternarylogic_epi64(rows45_mask, _mm512_srlv_epi16(b, hi_shift),
                                                      _mm512_srlv_epi16(w, hi_hshift), 0xCA),
                            m7);
  }
};

template <typename Unpack>
QMOE_AVX512_FN float core512(const uint8_t* base, size_t tiles, const int8_t* q, int passes,
                             bool prefetch) {
  __m512 acc = _mm512_setzero_ps();
  const __m512 scale = _mm512_set1_ps(1e-3f);
  const __m512i ones = _mm512_set1_epi16(1);
  for (int pass = 0; pass < passes; ++pass) {
    const uint8_t* t = base;
    for (size_t c = 0; c < tiles; ++c, t += Unpack::kBytes) {
      if (prefetch) {
        for (int line = 0; line < Unpack::kBytes; line += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(t + kPrefetchBytes + line), _MM_HINT_T0);
        }
      }
      __m512i v[4];
      Unpack::run(t, v);
      const int8_t* qc = q + 32 * (c % 64);
      const __m512i x_lo =
          _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qc)));
      const __m512i x_hi =
          _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qc + 16)));
      const __m512i p0 =
          _mm512_add_epi16(_mm512_maddubs_epi16(v[0], x_lo), _mm512_maddubs_epi16(v[1], x_hi));
      const __m512i p1 =
          _mm512_add_epi16(_mm512_maddubs_epi16(v[2], x_lo), _mm512_maddubs_epi16(v[3], x_hi));
      const __m512i s =
          _mm512_add_epi16(_mm512_unpacklo_epi32(p0, p1), _mm512_unpackhi_epi32(p0, p1));
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_madd_epi16(s, ones)), scale, acc);
    }
  }
  return _mm512_reduce_add_ps(acc);
}

// A plain read of the same bytes: 32-byte loads XORed together, the same prefetch.
QMOE_AVX2_FN float read256(const uint8_t* base, size_t tiles, const int8_t*, int passes, bool) {
  __m256i x = _mm256_setzero_si256();
  const size_t bytes = tiles * 96;
  for (int pass = 0; pass < passes; ++pass) {
    for (size_t i = 0; i < bytes; i += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(base + i + kPrefetchBytes), _MM_HINT_T0);
      x = _mm256_xor_si256(x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + i)));
      x = _mm256_xor_si256(x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + i + 32)));
    }
  }
  return static_cast<float>(_mm256_extract_epi32(x, 0));
}

using CoreFn = float (*)(const uint8_t*, size_t, const int8_t*, int, bool);

struct Candidate {
  const char* name;
  int tile_bytes;
  bool avx512;
  CoreFn fn;
};

double best_seconds(CoreFn fn, const uint8_t* base, size_t tiles, const int8_t* q, int passes,
                    bool prefetch, int repeats) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const double t0 = seconds_now();
    volatile float sink = fn(base, tiles, q, passes, prefetch);
    (void)sink;
    const double t = seconds_now() - t0;
    if (t < best) best = t;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3;
  bool dram = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--no-dram") == 0) {
      dram = false;
    } else {
      std::fprintf(stderr, "usage: qmoe_int3_layout_probe [--rounds R] [--no-dram]\n");
      return 2;
    }
  }
  if (rounds < 1) rounds = 1;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    std::printf("qmoe_int3_layout_probe: this CPU has no AVX2 and FMA; nothing to measure\n");
    return 0;
  }
  const bool have512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const Candidate candidates[] = {
      {"int4 (reference)", 128, false, &core256<Int4Unpack>},
      {"planes", 96, false, &core256<PlanesUnpack>},
      {"split21", 96, false, &core256<Split21Unpack>},
      {"3+3+2", 96, false, &core256<Layout332Unpack>},
      {"int4 (reference)", 128, true, &core512<Int4Unpack512>},
      {"planes", 96, true, &core512<PlanesUnpack512>},
      {"3+3+2", 96, true, &core512<Layout332Unpack512>},
  };

  const size_t buffer_bytes = kDramTiles * 128 + 4096;
  void* raw = nullptr;
  if (posix_memalign(&raw, 1 << 21, buffer_bytes) != 0) return 1;
  auto* buffer = static_cast<uint8_t*>(raw);
  madvise(buffer, buffer_bytes, MADV_HUGEPAGE);
  for (size_t i = 0; i < buffer_bytes; ++i)
    buffer[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  std::vector<int8_t> q(32 * 64);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<int8_t>(static_cast<int>(i % 255) - 127);

  for (int r = 0; r < rounds; ++r) {
    const double hz = measure_hz();
    double read_gbs = 0.0;
    if (dram) {
      const double t = best_seconds(&read256, buffer, kDramTiles * 128 / 96, q.data(), 1, true, 2);
      read_gbs = kDramTiles * 128 / t / 1e9;
    }
    std::printf("round %d: clock %.2f GHz, plain AVX2 read %.2f GB/s\n", r, hz / 1e9, read_gbs);
    for (const Candidate& c : candidates) {
      if (c.avx512 && !have512) continue;
      const int passes = 20000;
      const double l1 = best_seconds(c.fn, buffer, kL1Tiles, q.data(), passes, false, 7);
      const double cycles = l1 / (static_cast<double>(passes) * kL1Tiles) * hz;
      std::printf("  %-6s %-16s L1: %5.1f cycles per tile (%5.1f GB/s ceiling)",
                  c.avx512 ? "avx512" : "avx2", c.name, cycles, c.tile_bytes * hz / cycles / 1e9);
      if (dram) {
        const double t = best_seconds(c.fn, buffer, kDramTiles, q.data(), 1, true, 2);
        const double gbs = static_cast<double>(kDramTiles) * c.tile_bytes / t / 1e9;
        std::printf(" | DRAM: %5.2f GB/s (%.2f of the read), %.2f ns per 256 codes", gbs,
                    gbs / read_gbs, t / kDramTiles * 1e9);
      }
      std::printf("\n");
    }
  }
  std::free(raw);
  return 0;
}
