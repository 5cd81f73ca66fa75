// The per-warp arithmetic of the decode kernels for the E2M1 formats, MXFP4 and NVFP4
// (docs/formats.md, "E2M1 weights"): the counterpart of int4_tile.cuh's INT4 loads and
// arithmetic, run by the same walk (int4_tile.cuh: who reads what, the two batches in flight,
// the shared-memory activation records, QuadWalk) and the same kernels (decode_formats.cuh
// lists the formats).
//
// Bytes. The codes are INT4's canonical nibbles byte for byte, so a lane's 16 bytes of chunk c
// are word i (i = 0..3) = bytes 4i..4i+3, low nibbles codes 4i..4i+3, high nibbles codes
// 16+4i..16+4i+3. Scales are one byte per block: MXFP4 an E8M0 byte per chunk (block 32 = one
// chunk), NVFP4 an E4M3 byte per 16 k (block 2c for codes 0..15, 2c + 1 for codes 16..31; the
// second exists only when 32c + 16 < K). No zero points. NVFP4's global scale multiplies every
// output.
//
// Arithmetic, as the CPU kernels define it (lib/cpu/scalar/gemm_e2m1_8x32_scalar.inc):
//   exact: per block, the FP32 sum of x_k * E2M1(code_k), times the block's scale; a chunk's
//          codes 0..15 and 16..31 are summed apart (lo, hi) in k order, as INT4's; MXFP4 adds
//          (lo + hi) * scale, NVFP4 lo * scale_lo + hi * scale_hi.
//   fast:  per block the exact integer d = sum_k q_k * 2 E2M1(code_k) (dp4a of int8 weights in
//          [-12, 12] with the int8 activations), acc += d * (scale * x_scale).
// The output is acc * (global scale, times 1/2 at the fast level for the doubled codes) + bias.
// A NaN scale byte (E8M0 0xFF, E4M3 0x7F / 0xFF) makes its block's contribution NaN, and so
// the row's output, whatever the codes and activations (NaN times 0 is NaN).
#ifndef QMOE_LIB_CUDA_E2M1_TILE_CUH_
#define QMOE_LIB_CUDA_E2M1_TILE_CUH_

#include "lib/cuda/int4_tile.cuh"

namespace qmoe::cuda {

// ---- Byte permutes ------------------------------------------------------------------------------

// PTX prmt.b32 in its default mode: byte n of the result is byte (sel >> 4n) & 7 of the 8-byte
// value {b, a} (a the low word), or, when bit 4n + 3 of sel is set, that byte's sign bit
// replicated over the byte. Only sel's low 16 bits count. The host branch is the emulation's
// (tests/cuda/cuda_host_emulator.h), sign replication included, so a selector whose nibbles
// carry bit 3 gives the same wrong answer there as on a GPU.
__device__ __forceinline__ uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
#else
  const uint64_t v = (uint64_t{b} << 32) | a;
  uint32_t d = 0;
  for (int n = 0; n < 4; ++n) {
    const uint32_t s = (sel >> (4 * n)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(v >> (8 * (s & 7u))) & 0xFFu;
    if ((s & 8u) != 0) byte = (byte & 0x80u) != 0 ? 0xFFu : 0u;
    d |= byte << (8 * n);
  }
  return d;
#endif
}

// ---- Code decoding ------------------------------------------------------------------------------

// Twice the E2M1 values of codes 0..7 and 8..15 as int8 bytes (lib/formats/e2m1_layout.h's
// kE2M1Doubled): {0, 1, 2, 3}, {4, 6, 8, 12}, {0, -1, -2, -3}, {-4, -6, -8, -12}.
constexpr uint32_t kE2M1DoubledPos0 = 0x03020100u;
constexpr uint32_t kE2M1DoubledPos1 = 0x0C080604u;
constexpr uint32_t kE2M1DoubledNeg0 = 0xFDFEFF00u;
constexpr uint32_t kE2M1DoubledNeg1 = 0xF4F8FAFCu;

// The int8 doubled values of a code word's 8 codes: lo = codes 4i..4i+3 (the low nibbles of
// bytes 0..3), hi = codes 16+4i..16+4i+3 (the high nibbles), byte j of each for byte j of the
// word. A 16-entry lookup is two 8-entry ones (positive and negative halves of the table, with
// the sign bit masked off the selector, since a set nibble bit 3 would replicate signs) and a
// third permute picking, per byte, the half the code's sign bit names. The lookups take the
// word's nibbles in order (selector nibble n = nibble n: codes 4i, 16+4i, 4i+1, 16+4i+1 for the
// low half-word), so two last permutes gather the low and high codes: 13 integer operations for
// 8 codes, shared by every activation row.
__device__ __forceinline__ void e2m1_doubled_bytes(uint32_t word, int* lo, int* hi) {
  const uint32_t index = word & 0x77777777u;
  // 0x3210 picks byte n of the positive lookup; + 4 (the sign bit, shifted to bit 2 of the
  // nibble) byte n of the negative one.
  const uint32_t pick = ((word >> 1) & 0x44444444u) | 0x32103210u;
  const uint32_t index_hi = index >> 16, pick_hi = pick >> 16;
  const uint32_t a = byte_perm(byte_perm(kE2M1DoubledPos0, kE2M1DoubledPos1, index),
                               byte_perm(kE2M1DoubledNeg0, kE2M1DoubledNeg1, index), pick);
  const uint32_t b = byte_perm(byte_perm(kE2M1DoubledPos0, kE2M1DoubledPos1, index_hi),
                               byte_perm(kE2M1DoubledNeg0, kE2M1DoubledNeg1, index_hi), pick_hi);
  // a = values of codes {4i, 16+4i, 4i+1, 16+4i+1}, b = {4i+2, 16+4i+2, 4i+3, 16+4i+3}.
  *lo = static_cast<int>(byte_perm(a, b, 0x6420u));
  *hi = static_cast<int>(byte_perm(a, b, 0x7531u));
}

// FP16 bits of two codes, E2M1(code) * 2^-14 each, exactly: the code's sign to bit 15 and its
// exponent and mantissa bits (e e m) to bits 11..9, the low two exponent bits and the top
// mantissa bit of a binary16. For e > 0 that is (1 + m/2) 2^(e - 15) = E2M1 * 2^-14, and for
// e = 0 the subnormal m 2^-15 = (m / 2) 2^-14, E2M1's own subnormal scaled alike.
// `nibbles` holds the two codes at bits 12..15 and 28..31 and zeros at bits 9..11, 18 and
// 25..27 (so (v | v >> 3) moves each code's low three bits without meeting another's).
__device__ __forceinline__ uint32_t e2m1_half2_bits(uint32_t nibbles) {
  return (nibbles | (nibbles >> 3)) & 0x8E008E00u;
}

__device__ __forceinline__ float half_bits_to_float(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}

// 2^14: undoes the decoded values' 2^-14 once per block sum.
constexpr float kE2M1HalfUnit = 16384.0f;

// ---- Scale bytes --------------------------------------------------------------------------------

// E8M0 (OCP MX 5.4.1): 2^(e - 127); e = 0 is the FP32 subnormal 2^-127, e = 0xFF NaN
// (lib/formats/byte_scales.h's kE8M0Bits, value for value).
__device__ __forceinline__ float e8m0_to_float(uint32_t e) {
  const uint32_t bits = e == 0 ? 0x00400000u : e == 0xFFu ? 0x7FC00000u : e << 23;
  return __uint_as_float(bits);
}

// E4M3 (OCP FP8 "E4M3"): sign, 4 exponent bits (bias 7), 3 mantissa bits; S.1111.111 is NaN.
// The byte's exponent and mantissa moved under a binary16's (bias 15) are the value times 2^-8,
// subnormals included (m 2^-9 -> m 2^-17, a binary16 subnormal); times 2^8 in FP32, exactly.
// Negative scales keep their sign (kE4M3Bits, value for value).
__device__ __forceinline__ float e4m3_to_float(uint32_t b) {
  const uint32_t h = ((b & 0x80u) << 8) | ((b & 0x7Fu) << 7);
  const float v = __fmul_rn(half_bits_to_float(h), 256.0f);
  return (b & 0x7Fu) == 0x7Fu ? __uint_as_float(0x7FC00000u | ((b & 0x80u) << 24)) : v;
}

// ---- The two formats ----------------------------------------------------------------------------

struct Mxfp4Format {
  static constexpr qmoe_weight_format kFormat = QMOE_WEIGHT_FORMAT_MXFP4;
  static constexpr qmoe_dtype kScaleDtype = QMOE_DTYPE_E8M0;
  static constexpr uint32_t kBlockSize = 32;  // one block per chunk
  static constexpr bool kGlobalScale = false;
  __device__ __forceinline__ static float scale(uint32_t byte) { return e8m0_to_float(byte); }
};

struct Nvfp4Format {
  static constexpr qmoe_weight_format kFormat = QMOE_WEIGHT_FORMAT_NVFP4;
  static constexpr qmoe_dtype kScaleDtype = QMOE_DTYPE_F8_E4M3;
  static constexpr uint32_t kBlockSize = 16;  // two blocks per chunk
  static constexpr bool kGlobalScale = true;
  __device__ __forceinline__ static float scale(uint32_t byte) { return e4m3_to_float(byte); }
};

// What a lane needs to address its row of one group (int4_tile.cuh's LaneRow without zero
// points; scale elements are bytes).
struct E2m1Row {
  const uint4* codes;     // the lane's row of the group's chunk 0; chunk c at codes + 8c
  const uint8_t* scales;  // element (n, block 0) of the scale plane
  bool valid;             // n < N: rows past N are padding whose planes must not be read
};

// The walk's warp-uniform matrix fields, in registers.
struct E2m1Walk {
  uint32_t k;         // K
  size_t scale_step;  // bytes between consecutive blocks of a row's scales (the block stride)
};

// Per quad slot j: the lane's 16 code bytes of chunk c and its scale byte(s): bits 0..7 the
// block of codes 0..15 (MXFP4: of the whole chunk), bits 8..15 (NVFP4) the block of codes
// 16..31. Slots outside the walk hold zeros and are skipped by the arithmetic.
template <int U>
struct E2m1Batch {
  uint4 codes[U];
  uint32_t scales[U];
};

// The E2M1 formats' decode policy (decode_formats.cuh): the walk's loads and arithmetic for
// Format (Mxfp4Format or Nvfp4Format), and what the kernels need around them.
template <class Format>
struct E2m1Decode {
  static constexpr qmoe_weight_format kFormat = Format::kFormat;
  static constexpr bool kTwoBlocks = Format::kBlockSize == 16;
  using Walk = E2m1Walk;
  using Row = E2m1Row;
  template <int U>
  using Batch = E2m1Batch<U>;

  // Quads per batch: INT4's choice (int4_tile.cuh), whose slots are larger (6.5 registers
  // against 5 here), so the same counts fit the same register cap.
  __host__ __device__ static constexpr int batch_quads(Level level, int max_m, bool params_matrix) {
    return cuda::batch_quads(level, max_m, params_matrix);
  }

  // The format, its only block size and scale type, no zero points, 16-byte aligned codes, a
  // known bias dtype, and (NVFP4) a finite global scale > 0.
  __host__ __device__ static bool valid(const DeviceQuantMatrix& w) {
    const bool global_ok =
        !Format::kGlobalScale || (w.global_scale > 0.0f && w.global_scale <= 3.40282347e38f);
    return w.format == kFormat && w.n >= 1 && w.k >= 1 && w.block_size == Format::kBlockSize &&
           w.k % Format::kBlockSize == 0 && w.chunks == (w.k + kChunkCodes - 1) / kChunkCodes &&
           w.codes != nullptr && (reinterpret_cast<uintptr_t>(w.codes) & 15) == 0 &&
           w.scales != nullptr && w.scale_dtype == Format::kScaleDtype &&
           w.zero_points == nullptr &&
           (w.bias == nullptr || is_activation_dtype_value(w.bias_dtype)) && global_ok;
  }

  __device__ __forceinline__ static uint32_t scale_bytes(const DeviceQuantMatrix&) { return 1; }

  __device__ __forceinline__ static Walk walk(const DeviceQuantMatrix& w) {
    return {w.k, w.scale_block_stride};
  }

  __device__ __forceinline__ static Row row(const DeviceQuantMatrix& w, uint32_t group,
                                            uint32_t r) {
    Row lr;
    const uint32_t n = group * kGroupRows + r;
    lr.codes = reinterpret_cast<const uint4*>(w.codes + size_t{group} * w.chunks * kChunkBytes +
                                              r * kChunkRowBytes);
    lr.valid = n < w.n;
    lr.scales = static_cast<const uint8_t*>(w.scales) +
                plane_row_offset(n, w.scale_row_stride, w.scale_group_stride);
    return lr;
  }

  // The output's multiplier: the global scale (NVFP4; 1 for MXFP4), times 1/2 at the fast
  // level for the doubled codes, formed in FP32 as the CPU kernels form it.
  template <Level L>
  __device__ __forceinline__ static float output_scale(const DeviceQuantMatrix& w) {
    const float unit = L == Level::kFast ? 0.5f : 1.0f;
    return Format::kGlobalScale ? __fmul_rn(unit, w.global_scale) : unit;
  }

  // A row's finished sum, before its bias.
  template <Level L>
  __device__ __forceinline__ static float finish(float sum, const DeviceQuantMatrix& w) {
    return __fmul_rn(sum, output_scale<L>(w));
  }

  // ---- Loads ----

  template <int U>
  __device__ __forceinline__ static void load(Batch<U>& b, const Walk& w, const Row& lr,
                                              uint32_t sub, uint32_t q_first, uint32_t q_step,
                                              uint32_t q_end, uint32_t c_end) {
    constexpr uint32_t kBlocksPerChunk = kTwoBlocks ? 2 : 1;
    const uint32_t c0 = q_first * kQuadChunks + sub;
    const uint8_t* sp = lr.scales + size_t{c0} * kBlocksPerChunk * w.scale_step;
    const size_t ds = size_t{kBlocksPerChunk} * kQuadChunks * q_step * w.scale_step;
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const uint32_t q = q_first + q_step * j;
      const uint32_t c = c0 + kQuadChunks * q_step * j;
      const bool ok = q < q_end && c < c_end;
      const bool lo_ok = ok && lr.valid;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (ok) v = __ldg(lr.codes + size_t{c} * (kChunkBytes / 16));
      b.codes[j] = v;
      const uint8_t* sj = sp + j * ds;
      uint32_t s = 0;
      if (lo_ok) s = __ldg(sj);
      if constexpr (kTwoBlocks) {
        // Block 2c + 1 exists only when the chunk's codes 16..31 are inside K.
        if (lo_ok && c * kChunkCodes + 16 < w.k) s |= uint32_t{__ldg(sj + w.scale_step)} << 8;
      }
      b.scales[j] = s;
    }
  }

  // The lines load reads for chunk c: its codes and its block(s)' scales.
  __device__ __forceinline__ static void prefetch_chunk_l1(const Walk& w, const Row& lr,
                                                           uint32_t c) {
    prefetch_l1_line(lr.codes + size_t{c} * (kChunkBytes / 16));
    if (lr.valid) prefetch_l1_line(lr.scales + size_t{c} * (kTwoBlocks ? 2 : 1) * w.scale_step);
  }

  // ---- Exact level ----

  // The chunk's two partial sums for row m < rows: lo = sum_{k<16} x_k E2M1(code_k) 2^-14,
  // hi = the same over k = 16..31, each in FP32 in k order. The products are those of the
  // unscaled values times 2^-14, exactly, unless they fall below 2^-112 (FP32's subnormals):
  // the caller's multiplication by 2^14 then restores the unscaled sums bit for bit.
  template <int MAXM>
  __device__ __forceinline__ static void exact_chunk(const uint4& codes, const float* x,
                                                     uint32_t x_row_stride_floats, uint32_t rows,
                                                     float lo[MAXM], float hi[MAXM]) {
#pragma unroll
    for (int m = 0; m < MAXM; ++m) {
      lo[m] = 0.0f;
      hi[m] = 0.0f;
    }
    const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // Low nibbles (codes 4i..4i+3) at bits 0, 8, 16, 24; high nibbles (16+4i..) at 4, 12, ...
      const uint32_t low = words[i] & 0x0F0F0F0Fu, high = words[i] & 0xF0F0F0F0u;
      // Each shift puts a pair of codes (bytes j and j + 2 of the word) at bits 12..15 and
      // 28..31 with only zeros at the bits e2m1_half2_bits requires.
      const uint32_t lo02 = e2m1_half2_bits(low << 12);  // codes 4i, 4i+2
      const uint32_t lo13 = e2m1_half2_bits(low << 4);   // codes 4i+1, 4i+3
      const uint32_t hi02 = e2m1_half2_bits(high << 8);  // codes 16+4i, 16+4i+2
      const uint32_t hi13 = e2m1_half2_bits(high);       // codes 16+4i+1, 16+4i+3
      const float l0 = half_bits_to_float(lo02), l2 = half_bits_to_float(lo02 >> 16);
      const float l1 = half_bits_to_float(lo13), l3 = half_bits_to_float(lo13 >> 16);
      const float h0 = half_bits_to_float(hi02), h2 = half_bits_to_float(hi02 >> 16);
      const float h1 = half_bits_to_float(hi13), h3 = half_bits_to_float(hi13 >> 16);
      const float l[4] = {l0, l1, l2, l3}, h[4] = {h0, h1, h2, h3};
      exact_word_fmas<MAXM>(x, x_row_stride_floats, rows, i, l, h, lo, hi);
    }
  }

  // ---- Fast level ----

  // acc[m] += d * (scale * x_scale) per block of the chunk for rows m < rows, d the exact
  // integer dot of the doubled codes with q (|d| <= 32 * 12 * 127 < 2^22).
  template <int MAXM>
  __device__ __forceinline__ static void fast_chunk(const uint4& codes, float scale_lo,
                                                    float scale_hi, const unsigned char* rec,
                                                    uint32_t rec_row_stride_bytes, uint32_t rows,
                                                    float acc[MAXM]) {
    const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
    int lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) e2m1_doubled_bytes(words[i], &lo[i], &hi[i]);
#pragma unroll
    for (int m = 0; m < MAXM; ++m) {
      if (m > 0 && m >= static_cast<int>(rows)) break;  // a walk has at least one row
      const unsigned char* r = rec + m * rec_row_stride_bytes;
      const int4 q_lo = *reinterpret_cast<const int4*>(r);
      const int4 q_hi = *reinterpret_cast<const int4*>(r + 16);
      const float x_scale = *reinterpret_cast<const float*>(r + 32);
      int d_lo = __dp4a(lo[0], q_lo.x, 0);
      d_lo = __dp4a(lo[1], q_lo.y, d_lo);
      d_lo = __dp4a(lo[2], q_lo.z, d_lo);
      d_lo = __dp4a(lo[3], q_lo.w, d_lo);
      int d_hi = __dp4a(hi[0], q_hi.x, 0);
      d_hi = __dp4a(hi[1], q_hi.y, d_hi);
      d_hi = __dp4a(hi[2], q_hi.z, d_hi);
      d_hi = __dp4a(hi[3], q_hi.w, d_hi);
      if constexpr (kTwoBlocks) {
        acc[m] = __fmaf_rn(small_int_to_float(d_lo), __fmul_rn(scale_lo, x_scale), acc[m]);
        acc[m] = __fmaf_rn(small_int_to_float(d_hi), __fmul_rn(scale_hi, x_scale), acc[m]);
      } else {
        acc[m] = __fmaf_rn(small_int_to_float(d_lo + d_hi), __fmul_rn(scale_lo, x_scale), acc[m]);
      }
    }
  }

  // ---- One batch ----

  // Adds the batch of quads q_first, q_first + step, ... to acc[m] (m < qw.rows). The scales
  // are decoded once per chunk, for every row.
  template <Level L, int MAXM, int U>
  __device__ __forceinline__ static void compute(const Batch<U>& b, const Walk& w,
                                                 const QuadWalk& qw, uint32_t q_first,
                                                 const unsigned char* xs, float acc[MAXM]) {
    (void)w;
    const uint32_t c0 = q_first * kQuadChunks + qw.sub;
    const unsigned char* rec0 = xs + size_t(c0 - qw.tile_c0) * record_bytes<L>();
    const uint32_t rec_step = kQuadChunks * qw.step * record_bytes<L>();
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const uint32_t q = q_first + qw.step * j;
      const uint32_t c = c0 + kQuadChunks * qw.step * j;
      if (q >= qw.q_end || c >= qw.c_end) continue;
      const unsigned char* rec = rec0 + j * rec_step;
      const float s_lo = Format::scale(b.scales[j] & 0xFFu);
      const float s_hi = kTwoBlocks ? Format::scale(b.scales[j] >> 8) : 0.0f;
      if constexpr (L == Level::kExact) {
        float lo[MAXM], hi[MAXM];
        exact_chunk<MAXM>(b.codes[j], reinterpret_cast<const float*>(rec),
                          qw.tc * kExactRecordFloats, qw.rows, lo, hi);
#pragma unroll
        for (int m = 0; m < MAXM; ++m) {
          if (m > 0 && m >= static_cast<int>(qw.rows)) break;
          if constexpr (kTwoBlocks) {
            acc[m] = __fmaf_rn(__fmul_rn(lo[m], kE2M1HalfUnit), s_lo, acc[m]);
            acc[m] = __fmaf_rn(__fmul_rn(hi[m], kE2M1HalfUnit), s_hi, acc[m]);
          } else {
            acc[m] = __fmaf_rn(__fmul_rn(__fadd_rn(lo[m], hi[m]), kE2M1HalfUnit), s_lo, acc[m]);
          }
        }
      } else {
        fast_chunk<MAXM>(b.codes[j], s_lo, s_hi, rec, qw.tc * kFastRecordBytes, qw.rows, acc);
      }
    }
  }

  // ---- The walk (int4_tile.cuh's pipeline) ----

  template <int U, int kAhead = 0>
  __device__ __forceinline__ static void prime(Batch<U>& a, Batch<U>& b, const Walk& w,
                                               const Row& lr, const QuadWalk& qw, uint32_t q0) {
    prime_walk_with<E2m1Decode, U, kAhead>(a, b, w, lr, qw, q0);
  }

  template <Level L, int MAXM, int U, int kAhead = 0>
  __device__ __forceinline__ static void run(Batch<U>& a, Batch<U>& b, const Walk& w, const Row& lr,
                                             const QuadWalk& qw, uint32_t q0,
                                             const unsigned char* xs, float acc[MAXM]) {
    run_walk_with<E2m1Decode, L, MAXM, U, kAhead>(a, b, w, lr, qw, q0, xs, acc);
  }
};

using Mxfp4Decode = E2m1Decode<Mxfp4Format>;
using Nvfp4Decode = E2m1Decode<Nvfp4Format>;

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_E2M1_TILE_CUH_
