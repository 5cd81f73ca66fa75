// The per-warp arithmetic of the INT4 decode kernels (int4_gemv.cu, moe_layer.cu): one warp
// computes the 8 rows of one 8-row code group against MAXM activation rows over a set of
// 4-chunk "quads" of K. What is not INT4's own (the levels, the activation records, QuadWalk,
// the two-batch walk) is shared with the E2M1 formats' code (e2m1_tile.cuh).
//
// Who reads what. Lane l owns row r = l % 8 of the group and chunk slot s = l / 8 of a quad: for
// quad q it loads the 16 bytes of row r of chunk c = 4q + s, so one warp-wide load covers chunks
// 4q..4q+3 of the group, 512 contiguous bytes of the canonical layout
//   byte(n, k) = ((n / 8) * chunks + k / 32) * 128 + (n % 8) * 16 + (k % 16)
// (code k in the low nibble when k % 32 < 16, else in the high nibble). Word i (i = 0..3) of a
// lane's 16 bytes holds bytes 4i..4i+3: its low nibbles are codes 4i..4i+3 of the chunk and its
// high nibbles codes 16+4i..16+4i+3. A lane accumulates its row's partial sums over its chunks
// in ascending quad order; the 4 lanes of a row (l, l+8, l+16, l+24) are summed by two xor
// shuffles at the end.
//
// Loads in flight. A warp walks its quads in batches of U with two batches in registers: while
// one is being computed the next is already loading (prime_walk() issues the first two,
// run_walk() keeps one batch ahead), so a warp has up to 2U 16-byte code loads (and their scales)
// outstanding, and walks compiled with kAhead > 0 keep kAhead batches more in flight as L1
// prefetches (below). A batch slot holds the lane's 16 code bytes, the raw bits of its block(s)'
// scales (the scale dtype is a run-time value of the walk, so one compiled body serves FP32, FP16
// and BF16 planes) and its zero points, packed two slots to a register: 6.5 registers a slot.
//
// Activations come from shared memory as per-(row m, chunk) records written by the staging code
// (activation_stage.cuh):
//   exact: 32 FP32 values, then 4 floats of padding (144 bytes). With the padding the 4 chunks
//          a warp reads at once start 4 banks apart, so 16-byte reads do not conflict.
//   fast:  int8 q[32], then FP32 scale, int32 sum of q[0..15], sum of q[16..31], sum of all
//          (48 bytes; 12 words, so 4 consecutive records also start on distinct banks).
// Records of row m start at base + m * row_stride (in records); rows past the caller's M hold
// zeros and give zero results.
#ifndef QMOE_LIB_CUDA_INT4_TILE_CUH_
#define QMOE_LIB_CUDA_INT4_TILE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "lib/cuda/device_quant_matrix.cuh"
#include "qmoe/qmoe.h"

namespace qmoe::cuda {

enum class Level { kExact, kFast };

constexpr uint32_t kQuadChunks = 4;                             // chunks one warp-wide load covers
constexpr uint32_t kExactRecordFloats = 36;                     // 32 values + 4 padding
constexpr uint32_t kExactRecordBytes = kExactRecordFloats * 4;  // 144
constexpr uint32_t kFastRecordBytes = 48;         // q[32], scale, sum_lo, sum_hi, sum_all
constexpr float kQ8FlushBelowDevice = 0x1p-119f;  // lib/quant_layout.h's kQ8FlushBelow

template <Level L>
__host__ __device__ constexpr uint32_t record_bytes() {
  return L == Level::kExact ? kExactRecordBytes : kFastRecordBytes;
}

// Every decode kernel is capped at 80 registers a thread (3 blocks of 256 threads per SM: two of
// the running kernel's and one of the next kernel's, launched early). Quads per batch (two
// batches are in flight) within that, chosen from the compiler's resource report (no local
// memory in the GEMV's walks) and measured: the GEMV, whose matrix description is a kernel
// parameter (no registers), 3 for M <= 2, 2 for M = 4 at the fast level, else 1; the MoE
// kernels, whose description sits in registers (loaded from shared memory) beside their
// routing state, 1. A second quad there pushes the walk's state to local memory at the cap, and
// the spills cost more than the extra loads in flight gain
// (docs/results/2026-12-02-h200-moe-one-quad.md).
constexpr int kDecodeMinBlocksPerSm = 3;

// (A function of run-time values so that the GEMV's host-side K-split plan asks the same rule
// the kernels compile with.)
__host__ __device__ constexpr int batch_quads(Level level, int max_m, bool params_matrix) {
  if (params_matrix) return max_m <= 2 ? 3 : max_m <= 4 && level == Level::kFast ? 2 : 1;
  return 1;
}

// ---- Matrix descriptions ---------------------------------------------------------------------

__host__ __device__ inline bool is_activation_dtype_value(qmoe_dtype d) {
  return d == QMOE_DTYPE_F32 || d == QMOE_DTYPE_F16 || d == QMOE_DTYPE_BF16;
}

// What the kernels rely on: a shape the canonical layout describes, codes 16-byte aligned (each
// lane reads 16 bytes at a time), a scale plane of a known dtype, a known bias dtype.
__host__ __device__ inline bool quant_matrix_is_valid(const DeviceQuantMatrix& w) {
  const uint32_t b = w.block_size;
  return w.n >= 1 && w.k >= 1 && (b == 16 || b == 32 || b == 64 || b == 128) && w.k % b == 0 &&
         w.chunks == (w.k + kChunkCodes - 1) / kChunkCodes && w.codes != nullptr &&
         (reinterpret_cast<uintptr_t>(w.codes) & 15) == 0 && w.scales != nullptr &&
         is_activation_dtype_value(w.scale_dtype) &&
         (w.bias == nullptr || is_activation_dtype_value(w.bias_dtype));
}

// ---- Element conversions ------------------------------------------------------------------

__device__ __forceinline__ float bf16_bits_to_float(uint32_t bits) {
  return __uint_as_float(bits << 16);
}

// Widen element i of a FP32/FP16/BF16 array (exact).
__device__ __forceinline__ float load_widened(const void* p, size_t i, qmoe_dtype dtype) {
  if (dtype == QMOE_DTYPE_F32) return static_cast<const float*>(p)[i];
  const unsigned short bits = static_cast<const unsigned short*>(p)[i];
  if (dtype == QMOE_DTYPE_F16) return __half2float(__ushort_as_half(bits));
  return bf16_bits_to_float(bits);
}

// The same through the L2 only (ld.global.cg): for data another grid may have written while this
// one runs (programmatic dependent launch), which a stale L1 line must not answer.
__device__ __forceinline__ float load_widened_cg(const void* p, size_t i, qmoe_dtype dtype) {
  if (dtype == QMOE_DTYPE_F32) return __ldcg(static_cast<const float*>(p) + i);
  const unsigned short bits = __ldcg(static_cast<const unsigned short*>(p) + i);
  if (dtype == QMOE_DTYPE_F16) return __half2float(__ushort_as_half(bits));
  return bf16_bits_to_float(bits);
}

// Round to the dtype to nearest even and store element i.
__device__ __forceinline__ void store_narrowed(void* p, size_t i, qmoe_dtype dtype, float v) {
  if (dtype == QMOE_DTYPE_F32) {
    static_cast<float*>(p)[i] = v;
  } else if (dtype == QMOE_DTYPE_F16) {
    static_cast<unsigned short*>(p)[i] = __half_as_ushort(__float2half_rn(v));
  } else {
    static_cast<unsigned short*>(p)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}

// ---- Plane addressing ----------------------------------------------------------------------

// Element offset of row n's block 0 in a plane (DeviceQuantMatrix's strides).
__host__ __device__ __forceinline__ size_t plane_row_offset(uint32_t n, size_t row_stride,
                                                            size_t group_stride) {
  return group_stride == 0 ? size_t{n} * row_stride
                           : size_t{n / kGroupRows} * group_stride + (n % kGroupRows) * row_stride;
}

__host__ __device__ __forceinline__ uint32_t scale_bytes(qmoe_dtype sd) {
  return sd == QMOE_DTYPE_F32 ? 4 : 2;
}

// What a lane needs to address its row of one group.
struct LaneRow {
  const uint4* codes;           // the lane's row of the group's chunk 0; chunk c at codes + 8c
                                // (INT3, int3_tile.cuh: + 6c, and nullptr for rows 6 and 7)
  const unsigned char* scales;  // element (n, block 0) of the scale plane
  const uint8_t* zps;           // element (n, block 0) of the zero points; nullptr: all 8
  bool valid;                   // n < N: rows past N are padding whose planes must not be read
};

__device__ __forceinline__ LaneRow lane_row(const DeviceQuantMatrix& w, uint32_t group,
                                            uint32_t r) {
  LaneRow lr;
  const uint32_t n = group * kGroupRows + r;
  lr.codes = reinterpret_cast<const uint4*>(w.codes + size_t{group} * w.chunks * kChunkBytes +
                                            r * kChunkRowBytes);
  lr.valid = n < w.n;
  lr.scales =
      static_cast<const unsigned char*>(w.scales) +
      plane_row_offset(n, w.scale_row_stride, w.scale_group_stride) * scale_bytes(w.scale_dtype);
  lr.zps = w.zero_points == nullptr ? nullptr
                                    : w.zero_points + plane_row_offset(n, w.zero_point_row_stride,
                                                                       w.zero_point_group_stride);
  return lr;
}

// What a walk reads of the matrix besides the lane's row pointers, held in registers (the MoE
// kernels keep their matrix descriptions in shared memory; reading fields from there inside the
// loop would cost registers or reloads). Every field is warp-uniform.
struct WalkMatrix {
  uint32_t k;         // K
  uint32_t shift;     // block sizes 32..128: chunk c lies in block c >> shift
  bool b16;           // block size 16: chunk c holds blocks 2c and 2c + 1
  bool simple;        // blocks >= 32, no zero points, 16-bit scales: the lean path below
  bool wide;          // FP32 scales
  bool bf16;          // BF16 scales (else FP16 when not wide)
  size_t scale_step;  // bytes between consecutive blocks of a row's scales
  size_t zp_step;     // bytes between consecutive blocks of a row's zero points
};

// The models' layout, which the lean walk (kSimple below) reads: blocks of 32 or more, 16-bit
// scales, no zero points (so zero point 8). A template over the description type so that the host
// (qmoe_quant_matrix, when a device expert set is made) and the kernels (DeviceQuantMatrix) test
// the same fields the same way.
template <class Matrix>
__host__ __device__ constexpr bool int4_lean_layout(const Matrix& w) {
  return w.block_size >= 32 && w.scale_dtype != QMOE_DTYPE_F32 && w.zero_points == nullptr;
}

// log2(block / 32) for blocks of 32, 64, 128: chunk c lies in block c >> shift.
__device__ __forceinline__ uint32_t chunk_block_shift(uint32_t block_size) {
  return block_size <= 32 ? 0u : static_cast<uint32_t>(26 - __clz(block_size));
}

__device__ __forceinline__ WalkMatrix walk_matrix(const DeviceQuantMatrix& w) {
  WalkMatrix wm;
  wm.k = w.k;
  wm.b16 = w.block_size == 16;
  wm.shift = chunk_block_shift(w.block_size);
  wm.wide = w.scale_dtype == QMOE_DTYPE_F32;
  wm.bf16 = w.scale_dtype == QMOE_DTYPE_BF16;
  wm.simple = int4_lean_layout(w);
  wm.scale_step = w.scale_block_stride * scale_bytes(w.scale_dtype);
  wm.zp_step = w.zero_point_block_stride;
  return wm;
}

// ---- One batch of U quads: loads ------------------------------------------------------------

// Per quad slot j: the lane's 16 code bytes of chunk c, the scales and zero points of the
// chunk's block(s) (block size 16: lo = block 2c for codes 0..15, hi = block 2c + 1 for codes
// 16..31; otherwise both halves are block 32c / B and only lo is used). Slots whose chunk is
// outside the walk (quad past q_end, chunk past c_end) hold zeros and are skipped by the
// arithmetic, which recomputes the chunk from the same quad numbers.
//
// Two instantiations of the loads and the arithmetic: kSimple (WalkMatrix::simple: one 16-bit
// scale per chunk, zero point 8 — the models' layout) touches only codes and scale_lo; the
// general one handles block 16, zero points and FP32 scales. A walk picks one per matrix (a
// warp-uniform branch around the whole walk), so the common path carries no per-slot tests of
// the layout.
template <int U>
struct Batch {
  uint4 codes[U];
  uint32_t scale_lo[U], scale_hi[U];  // raw bits (16-bit dtypes: in the low half)
  uint32_t zp[(U + 1) / 2];           // slot j: (z_lo | z_hi << 8) << 16 (j % 2)
};

// The code tiles a walk reads, as a policy `Codes` of the loads and the arithmetic below:
//   kChunkVectors        16-byte vectors of one chunk (8 rows x 32 codes) in the canonical layout
//   kRowsWithoutCodes    whether some lanes' rows have no bytes of their own (LaneRow::codes null)
//   kDefaultZeroPoint    the zero point without a zero-point plane
//   nibbles(v)           the lane's loaded 16 bytes as INT4's nibble words (the layout above)
// INT4's are the layout above, read as they are; INT3's (int3_tile.cuh) are rebuilt into the
// same words, so that one arithmetic serves both.
struct Int4Codes {
  static constexpr uint32_t kChunkVectors = kChunkBytes / 16;
  static constexpr bool kRowsWithoutCodes = false;
  static constexpr uint32_t kDefaultZeroPoint = kInt4DefaultZeroPoint;
  __device__ __forceinline__ static uint4 nibbles(const uint4& v) { return v; }
};

// The lane's 16 code bytes of chunk c (zeros for a lane whose row has none).
template <class Codes>
__device__ __forceinline__ uint4 load_chunk_codes(const LaneRow& lr, uint32_t c) {
  uint4 v = make_uint4(0, 0, 0, 0);
  if (!Codes::kRowsWithoutCodes || lr.codes != nullptr) {
    v = __ldg(lr.codes + size_t{c} * Codes::kChunkVectors);
  }
  return v;
}

// The raw bits of the scale at p: 4 bytes for FP32 planes, 2 otherwise (zero-extended).
__device__ __forceinline__ uint32_t load_scale_bits(const unsigned char* p, bool wide) {
  return wide ? __ldg(reinterpret_cast<const unsigned int*>(p))
              : static_cast<uint32_t>(__ldg(reinterpret_cast<const unsigned short*>(p)));
}

// Branch-free widening of raw scale bits (two selects on uniform flags).
__device__ __forceinline__ float scale_bits_to_float(uint32_t bits, const WalkMatrix& w) {
  const float h = __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  const float f = w.bf16 ? __uint_as_float(bits << 16) : h;
  return w.wide ? __uint_as_float(bits) : f;
}

// Chunk c of a walk slot: quads q_first + j * step, chunk 4q + sub. The block of chunk c0 + 4 step
// j is blk(c0) + j * d_blk (4 step is a multiple of the chunks per block, so the scale and
// zero-point addresses of a batch's slots are one base plus a multiple of a uniform stride).
__device__ __forceinline__ uint32_t block_of_chunk(const WalkMatrix& w, uint32_t c) {
  return w.b16 ? 2 * c : c >> w.shift;
}
__device__ __forceinline__ uint32_t block_stride_of_slot(const WalkMatrix& w, uint32_t step) {
  return w.b16 ? 8 * step : (kQuadChunks * step) >> w.shift;
}

// Loads quads q_first + j * q_step (j < U) that are below q_end, chunks below c_end. All loads
// are issued before any is used.
template <int U, bool kSimple, class Codes = Int4Codes>
__device__ __forceinline__ void load_batch(Batch<U>& b, const WalkMatrix& w, const LaneRow& lr,
                                           uint32_t sub, uint32_t q_first, uint32_t q_step,
                                           uint32_t q_end, uint32_t c_end) {
  const uint32_t c0 = q_first * kQuadChunks + sub;
  const uint32_t blk0 = kSimple ? c0 >> w.shift : block_of_chunk(w, c0);
  const size_t d_blk = block_stride_of_slot(w, q_step);
  const unsigned char* sp = lr.scales + size_t{blk0} * w.scale_step;
  const size_t ds = d_blk * w.scale_step;
#pragma unroll
  for (int j = 0; j < U; ++j) {
    const uint32_t q = q_first + q_step * j;
    const uint32_t c = c0 + kQuadChunks * q_step * j;
    const bool ok = q < q_end && c < c_end;
    const bool lo_ok = ok && lr.valid;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (ok) v = load_chunk_codes<Codes>(lr, c);
    b.codes[j] = v;
    const unsigned char* sj = sp + j * ds;
    if constexpr (kSimple) {
      uint32_t lo = 0;
      if (lo_ok) lo = __ldg(reinterpret_cast<const unsigned short*>(sj));
      b.scale_lo[j] = lo;
    } else {
      // Block 2c + 1 exists only when the chunk's codes 16..31 are inside K.
      const bool hi_ok = lo_ok && w.b16 && c * kChunkCodes + 16 < w.k;
      const bool z_ok = lo_ok && lr.zps != nullptr;
      const uint8_t* zj = lr.zps + (size_t{blk0} + j * d_blk) * w.zp_step;
      uint32_t lo = 0, hi = 0, zlo = Codes::kDefaultZeroPoint, zhi;
      if (lo_ok) lo = load_scale_bits(sj, w.wide);
      if (hi_ok) hi = load_scale_bits(sj + w.scale_step, w.wide);
      if (z_ok) zlo = __ldg(zj);
      zhi = zlo;
      if (z_ok && hi_ok) zhi = __ldg(zj + w.zp_step);
      const uint32_t z = zlo | (zhi << 8);
      b.scale_lo[j] = lo;
      b.scale_hi[j] = hi;
      if (j % 2 == 0) {
        b.zp[j / 2] = z;
      } else {
        b.zp[j / 2] |= z << 16;
      }
    }
  }
}

// ---- Exact level ---------------------------------------------------------------------------

// code - z, exactly, from the nibble at bit p of a word (p <= 16): (word & 0xF << p) | 0x4B000000
// is the float 2^23 + code * 2^p (the code lands in the mantissa, below bit 23), and
// fma(v, 2^-p, -(2^(23-p) + z)) = 2^(23-p) + code - 2^(23-p) - z with one rounding of an exact
// small integer: one LOP3 and one FFMA per code. Nibbles at bits 20..31 are first shifted down
// by 20 (one shift per word) to bits 0..11.
template <int P>
__device__ __forceinline__ float code_minus_z(uint32_t word, float k_p) {
  static_assert(P % 4 == 0 && P <= 16, "nibble must sit in the mantissa");
  const float v = __uint_as_float((word & (0xFu << P)) | 0x4B000000u);
  return __fmaf_rn(v, 1.0f / static_cast<float>(1u << P), k_p);
}

// The five constants -(2^(23-p) + z) for p = 0, 4, 8, 12, 16.
struct ZeroTerms {
  float k0, k4, k8, k12, k16;
};
__device__ __forceinline__ ZeroTerms zero_terms(float z) {
  return {-8388608.0f - z, -524288.0f - z, -32768.0f - z, -2048.0f - z, -128.0f - z};
}

// One word's worth of a chunk at the exact level, for every row m < rows (at least one; a
// warp-uniform branch skips the rest): lo[m] += x[m][4i + j] * l[j] and hi[m] += x[m][16 + 4i + j]
// * h[j] for j = 0..3, in that order (the k order). x points at row 0's exact record of the
// chunk, rows x_row_stride_floats apart. The INT4 and E2M1 exact walks share it: their weights
// differ, their products and order do not.
template <int MAXM>
__device__ __forceinline__ void exact_word_fmas(const float* x, uint32_t x_row_stride_floats,
                                                uint32_t rows, int i, const float (&l)[4],
                                                const float (&h)[4], float lo[MAXM],
                                                float hi[MAXM]) {
#pragma unroll
  for (int m = 0; m < MAXM; ++m) {
    if (m > 0 && m >= static_cast<int>(rows)) break;  // a walk has at least one row
    const float* xm = x + m * x_row_stride_floats;
    const float4 xl = *reinterpret_cast<const float4*>(xm + 4 * i);
    const float4 xh = *reinterpret_cast<const float4*>(xm + 16 + 4 * i);
    lo[m] = __fmaf_rn(xl.x, l[0], lo[m]);
    lo[m] = __fmaf_rn(xl.y, l[1], lo[m]);
    lo[m] = __fmaf_rn(xl.z, l[2], lo[m]);
    lo[m] = __fmaf_rn(xl.w, l[3], lo[m]);
    hi[m] = __fmaf_rn(xh.x, h[0], hi[m]);
    hi[m] = __fmaf_rn(xh.y, h[1], hi[m]);
    hi[m] = __fmaf_rn(xh.z, h[2], hi[m]);
    hi[m] = __fmaf_rn(xh.w, h[3], hi[m]);
  }
}

// The chunk's two partial sums for row m < rows: lo = sum_{k<16} x_k (code_k - z_lo), hi = the
// same over k = 16..31, each in FP32 in k order. x points at the row's exact record of the chunk.
// Rows rows..MAXM-1 are skipped (a warp-uniform branch): their sums stay 0.
template <int MAXM>
__device__ __forceinline__ void exact_chunk(const uint4& codes, uint32_t zp, const float* x,
                                            uint32_t x_row_stride_floats, uint32_t rows,
                                            float lo[MAXM], float hi[MAXM]) {
  const ZeroTerms zl = zero_terms(static_cast<float>(zp & 0xFF));
  const ZeroTerms zh = zero_terms(static_cast<float>((zp >> 8) & 0xFF));
#pragma unroll
  for (int m = 0; m < MAXM; ++m) {
    lo[m] = 0.0f;
    hi[m] = 0.0f;
  }
  const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t w = words[i];
    const uint32_t w20 = w >> 20;
    // Byte j of the word: code 4i+j in bits 8j..8j+3, code 16+4i+j in bits 8j+4..8j+7.
    const float l0 = code_minus_z<0>(w, zl.k0);
    const float h0 = code_minus_z<4>(w, zh.k4);
    const float l1 = code_minus_z<8>(w, zl.k8);
    const float h1 = code_minus_z<12>(w, zh.k12);
    const float l2 = code_minus_z<16>(w, zl.k16);
    const float h2 = code_minus_z<0>(w20, zh.k0);  // bits 20..23
    const float l3 = code_minus_z<4>(w20, zl.k4);  // bits 24..27
    const float h3 = code_minus_z<8>(w20, zh.k8);  // bits 28..31
    const float l[4] = {l0, l1, l2, l3}, h[4] = {h0, h1, h2, h3};
    exact_word_fmas<MAXM>(x, x_row_stride_floats, rows, i, l, h, lo, hi);
  }
}

// ---- Fast level ----------------------------------------------------------------------------

// Exact float of an integer |v| < 2^22: the bits 0x4B400000 + v are the float 1.5 * 2^23 + v.
__device__ __forceinline__ float small_int_to_float(int32_t v) {
  return __int_as_float(0x4B400000 + v) - 12582912.0f;
}

// dot of the unsigned bytes of a (the high nibbles, in place: 16 x code) with the signed bytes
// of b, plus c: 16 times the dot of the codes, exactly (|.| <= 4 * 240 * 127 per word).
__device__ __forceinline__ int dp4a_hi_nibbles(uint32_t a, int b, int c) {
#if defined(__CUDA_ARCH__)
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#else
  for (int i = 0; i < 4; ++i) {
    c += static_cast<int>((a >> (8 * i)) & 0xFFu) *
         static_cast<int>(static_cast<int8_t>(b >> (8 * i)));
  }
  return c;
#endif
}

// acc[m] += (dot - z * sum_q) * (scale * x_scale) per block of the chunk, as the scalar kernel,
// for rows m < rows; the integer parts are exact (|dot|, |z sum_q| <= 32 * 15 * 127). The dot of
// codes 16..31 is taken on the high nibbles in place (16 x the dot) and shifted back, exactly.
// kSimple: one block per chunk, zero point kZero (the format's default).
template <int MAXM, bool kSimple, uint32_t kZero = kInt4DefaultZeroPoint>
__device__ __forceinline__ void fast_chunk(const uint4& codes, uint32_t zp, float scale_lo,
                                           uint32_t scale_hi_bits, const WalkMatrix& w,
                                           const unsigned char* rec, uint32_t rec_row_stride_bytes,
                                           uint32_t rows, float acc[MAXM]) {
  const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
  int lo[4];
  uint32_t hi16[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    lo[i] = static_cast<int>(words[i] & 0x0F0F0F0Fu);  // codes 4i..4i+3
    hi16[i] = words[i] & 0xF0F0F0F0u;                  // 16 x codes 16+4i..16+4i+3
  }
#pragma unroll
  for (int m = 0; m < MAXM; ++m) {
    if (m > 0 && m >= static_cast<int>(rows)) break;  // a walk has at least one row
    const unsigned char* r = rec + m * rec_row_stride_bytes;
    const int4 q_lo = *reinterpret_cast<const int4*>(r);
    const int4 q_hi = *reinterpret_cast<const int4*>(r + 16);
    const int4 meta = *reinterpret_cast<const int4*>(r + 32);  // scale, sum_lo, sum_hi, sum_all
    int d_lo = __dp4a(lo[0], q_lo.x, 0);
    d_lo = __dp4a(lo[1], q_lo.y, d_lo);
    d_lo = __dp4a(lo[2], q_lo.z, d_lo);
    d_lo = __dp4a(lo[3], q_lo.w, d_lo);
    int d_hi = dp4a_hi_nibbles(hi16[0], q_hi.x, 0);
    d_hi = dp4a_hi_nibbles(hi16[1], q_hi.y, d_hi);
    d_hi = dp4a_hi_nibbles(hi16[2], q_hi.z, d_hi);
    d_hi = dp4a_hi_nibbles(hi16[3], q_hi.w, d_hi);
    d_hi >>= 4;  // exact: a multiple of 16
    const float x_scale = __int_as_float(meta.x);
    if (kSimple) {
      const float c = small_int_to_float(d_lo + d_hi - static_cast<int>(kZero) * meta.w);
      acc[m] = __fmaf_rn(c, __fmul_rn(scale_lo, x_scale), acc[m]);
    } else if (w.b16) {
      const int z_lo = static_cast<int>(zp & 0xFF), z_hi = static_cast<int>((zp >> 8) & 0xFF);
      const float c_lo = small_int_to_float(d_lo - z_lo * meta.y);
      const float c_hi = small_int_to_float(d_hi - z_hi * meta.z);
      const float scale_hi = scale_bits_to_float(scale_hi_bits, w);
      acc[m] = __fmaf_rn(c_lo, __fmul_rn(scale_lo, x_scale), acc[m]);
      acc[m] = __fmaf_rn(c_hi, __fmul_rn(scale_hi, x_scale), acc[m]);
    } else {
      const int z_lo = static_cast<int>(zp & 0xFF);
      const float c = small_int_to_float(d_lo + d_hi - z_lo * meta.w);
      acc[m] = __fmaf_rn(c, __fmul_rn(scale_lo, x_scale), acc[m]);
    }
  }
}

// ---- One batch: arithmetic -----------------------------------------------------------------

// Where a walk over a group's quads stands: quads q, q + step, ... below q_end, chunks below
// c_end, against a staged tile whose first chunk is tile_c0 (tc records per activation row).
struct QuadWalk {
  uint32_t rows;     // activation rows to compute (<= MAXM; the rest are skipped, sums 0)
  uint32_t sub;      // the lane's chunk slot in a quad
  uint32_t step;     // quads between consecutive quads of this warp
  uint32_t q_end;    // first quad past the walk
  uint32_t c_end;    // first chunk past the walk
  uint32_t tile_c0;  // the staged tile's first chunk
  uint32_t tc;       // records per activation row in the tile
};

// The walk over the tile of chunks [c0, c0 + tc) of a K of `chunks` chunks (c0 a multiple of 4:
// tiles start on quad boundaries), for a lane of chunk slot sub taking every step-th quad.
__device__ __forceinline__ QuadWalk tile_walk(uint32_t rows, uint32_t sub, uint32_t step,
                                              uint32_t c0, uint32_t tc, uint32_t chunks) {
  QuadWalk qw;
  qw.rows = rows;
  qw.sub = sub;
  qw.step = step;
  qw.tile_c0 = c0;
  qw.c_end = min(c0 + tc, chunks);
  qw.q_end = (qw.c_end + kQuadChunks - 1) / kQuadChunks;
  qw.tc = tc;
  return qw;
}

// Adds the batch of quads q_first, q_first + step, ... to acc[m] (m < qw.rows). xs: the staged
// tile's records of row 0. Exact: per chunk the two half sums times their block's scale (one
// block per chunk from block size 32 up: (lo + hi) * scale).
template <Level L, int MAXM, int U, bool kSimple, class Codes = Int4Codes>
__device__ __forceinline__ void compute_batch(const Batch<U>& b, const WalkMatrix& w,
                                              const QuadWalk& qw, uint32_t q_first,
                                              const unsigned char* xs, float acc[MAXM]) {
  const uint32_t c0 = q_first * kQuadChunks + qw.sub;
  const unsigned char* rec0 = xs + size_t(c0 - qw.tile_c0) * record_bytes<L>();
  const uint32_t rec_step = kQuadChunks * qw.step * record_bytes<L>();
#pragma unroll
  for (int j = 0; j < U; ++j) {
    const uint32_t q = q_first + qw.step * j;
    const uint32_t c = c0 + kQuadChunks * qw.step * j;
    // Before the lane's own skip: INT3's words take warp shuffles, which every lane must reach.
    const uint4 codes = Codes::nibbles(b.codes[j]);
    if (q >= qw.q_end || c >= qw.c_end) continue;
    const unsigned char* rec = rec0 + j * rec_step;
    constexpr uint32_t kZero = Codes::kDefaultZeroPoint;
    const uint32_t zp = kSimple ? kZero * 0x0101u : b.zp[j / 2] >> (16 * (j % 2));
    const float s_lo =
        kSimple
            ? (w.bf16 ? __uint_as_float(b.scale_lo[j] << 16)
                      : __half2float(__ushort_as_half(static_cast<unsigned short>(b.scale_lo[j]))))
            : scale_bits_to_float(b.scale_lo[j], w);
    if constexpr (L == Level::kExact) {
      float lo[MAXM], hi[MAXM];
      exact_chunk<MAXM>(codes, zp, reinterpret_cast<const float*>(rec), qw.tc * kExactRecordFloats,
                        qw.rows, lo, hi);
#pragma unroll
      for (int m = 0; m < MAXM; ++m) {
        if (m > 0 && m >= static_cast<int>(qw.rows)) break;
        if (!kSimple && w.b16) {
          acc[m] = __fmaf_rn(lo[m], s_lo, acc[m]);
          acc[m] = __fmaf_rn(hi[m], scale_bits_to_float(b.scale_hi[j], w), acc[m]);
        } else {
          acc[m] = __fmaf_rn(__fadd_rn(lo[m], hi[m]), s_lo, acc[m]);
        }
      }
    } else {
      fast_chunk<MAXM, kSimple, kZero>(codes, zp, s_lo, b.scale_hi[j], w, rec,
                                       qw.tc * kFastRecordBytes, qw.rows, acc);
    }
  }
}

// ---- A walk over a group's quads, two batches in flight ---------------------------------------
//
// The pipeline is the same for every format; `Ops` supplies the format's batch loads and
// arithmetic as two static members (resolved at compile time, so each format's walk is its own
// straight-line code):
//   Ops::template load<U>(batch, walk, row, sub, q_first, q_step, q_end, c_end)
//   Ops::template compute<L, MAXM, U>(batch, walk, quad_walk, q_first, xs, acc)
//   Ops::prefetch_chunk_l1(walk, row, c)   (the lines load reads for chunk c, into the L1)

// A line prefetch of one address into the L1 (nothing on the host).
__device__ __forceinline__ void prefetch_l1_line(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
#endif
}

// L1 prefetch. A walk compiled with kAhead > 0 keeps kAhead batches (about kL1AheadQuads quads)
// in flight as L1 prefetches ahead of its two batches in registers, so a lane has that many more
// 16-byte code loads outstanding without a register for any of them. Only FC1 of the MoE kernels
// at one token an item walks so: the other walks measured slower with it
// (docs/results/2026-12-04-h200-moe-l1-prefetch.md).
constexpr int kL1AheadQuads = 8;
template <int U>
__host__ __device__ constexpr int l1_ahead_batches() {
  return kL1AheadQuads / U > 1 ? kL1AheadQuads / U : 1;
}

// Prefetches into the L1 the lines of batch q_first.. (U quads, q_step apart) that Ops::load
// would read.
template <class Ops, int U, class W, class R>
__device__ __forceinline__ void prefetch_batch_l1(const W& w, const R& lr, const QuadWalk& qw,
                                                  uint32_t q_first) {
#pragma unroll
  for (int j = 0; j < U; ++j) {
    const uint32_t q = q_first + qw.step * j;
    const uint32_t c = q * kQuadChunks + qw.sub;
    if (q < qw.q_end && c < qw.c_end) Ops::prefetch_chunk_l1(w, lr, c);
  }
}

// Issues the loads of the walk's first two batches (quads q0.. and q0 + U step..) and the L1
// prefetches of the kAhead batches after them. Callable before the activation tile is staged,
// so the code bytes stream in while it is.
template <class Ops, int U, int kAhead, class B, class W, class R>
__device__ __forceinline__ void prime_walk_with(B& a, B& b, const W& w, const R& lr,
                                                const QuadWalk& qw, uint32_t q0) {
  Ops::template load<U>(a, w, lr, qw.sub, q0, qw.step, qw.q_end, qw.c_end);
  const uint32_t advance = U * qw.step;
  const uint32_t q1 = q0 + advance;
  if (q1 < qw.q_end) Ops::template load<U>(b, w, lr, qw.sub, q1, qw.step, qw.q_end, qw.c_end);
  for (int i = 1; i <= kAhead; ++i) {
    const uint32_t q = q1 + i * advance;
    if (q >= qw.q_end) break;
    prefetch_batch_l1<Ops, U>(w, lr, qw, q);
  }
}

// acc[m] += the walk from q0 (primed by prime_walk_with): computes one batch while the other
// loads, and prefetches into the L1 the batch kAhead after the one it loads.
template <class Ops, Level L, int MAXM, int U, int kAhead, class B, class W, class R>
__device__ __forceinline__ void run_walk_with(B& a, B& b, const W& w, const R& lr,
                                              const QuadWalk& qw, uint32_t q0,
                                              const unsigned char* xs, float acc[MAXM]) {
  const uint32_t advance = U * qw.step;
  uint32_t q = q0;
  for (;;) {
    Ops::template compute<L, MAXM, U>(a, w, qw, q, xs, acc);
    q += advance;
    if (q >= qw.q_end) break;
    if (q + advance < qw.q_end) {
      Ops::template load<U>(a, w, lr, qw.sub, q + advance, qw.step, qw.q_end, qw.c_end);
      if (kAhead > 0) prefetch_batch_l1<Ops, U>(w, lr, qw, q + (1 + kAhead) * advance);
    }
    Ops::template compute<L, MAXM, U>(b, w, qw, q, xs, acc);
    q += advance;
    if (q >= qw.q_end) break;
    if (q + advance < qw.q_end) {
      Ops::template load<U>(b, w, lr, qw.sub, q + advance, qw.step, qw.q_end, qw.c_end);
      if (kAhead > 0) prefetch_batch_l1<Ops, U>(w, lr, qw, q + (1 + kAhead) * advance);
    }
  }
}

// The batch operations of INT4's scale and zero-point planes over the code tiles `Codes` (INT4's,
// or INT3's: int3_tile.cuh), lean (kSimple) or general.
template <bool kSimple, class Codes = Int4Codes>
struct Int4BatchOps {
  template <int U>
  __device__ __forceinline__ static void load(Batch<U>& b, const WalkMatrix& w, const LaneRow& lr,
                                              uint32_t sub, uint32_t q_first, uint32_t q_step,
                                              uint32_t q_end, uint32_t c_end) {
    load_batch<U, kSimple, Codes>(b, w, lr, sub, q_first, q_step, q_end, c_end);
  }
  template <Level L, int MAXM, int U>
  __device__ __forceinline__ static void compute(const Batch<U>& b, const WalkMatrix& w,
                                                 const QuadWalk& qw, uint32_t q_first,
                                                 const unsigned char* xs, float acc[MAXM]) {
    compute_batch<L, MAXM, U, kSimple, Codes>(b, w, qw, q_first, xs, acc);
  }
  // The lines load_batch reads for chunk c: its codes, its block's scale and zero point.
  __device__ __forceinline__ static void prefetch_chunk_l1(const WalkMatrix& w, const LaneRow& lr,
                                                           uint32_t c) {
    if (!Codes::kRowsWithoutCodes || lr.codes != nullptr) {
      prefetch_l1_line(lr.codes + size_t{c} * Codes::kChunkVectors);
    }
    if (!lr.valid) return;
    const uint32_t blk = kSimple ? c >> w.shift : block_of_chunk(w, c);
    prefetch_l1_line(lr.scales + size_t{blk} * w.scale_step);
    if (!kSimple && lr.zps != nullptr) prefetch_l1_line(lr.zps + size_t{blk} * w.zp_step);
  }
};

// INT4's (and INT3's) walks: the lean body when the matrix allows it (a warp-uniform choice made
// once per walk).
template <int U, int kAhead, class Codes = Int4Codes>
__device__ __forceinline__ void prime_walk(Batch<U>& a, Batch<U>& b, const WalkMatrix& w,
                                           const LaneRow& lr, const QuadWalk& qw, uint32_t q0) {
  if (w.simple) {
    prime_walk_with<Int4BatchOps<true, Codes>, U, kAhead>(a, b, w, lr, qw, q0);
  } else {
    prime_walk_with<Int4BatchOps<false, Codes>, U, kAhead>(a, b, w, lr, qw, q0);
  }
}

template <Level L, int MAXM, int U, int kAhead, class Codes = Int4Codes>
__device__ __forceinline__ void run_walk(Batch<U>& a, Batch<U>& b, const WalkMatrix& w,
                                         const LaneRow& lr, const QuadWalk& qw, uint32_t q0,
                                         const unsigned char* xs, float acc[MAXM]) {
  if (w.simple) {
    run_walk_with<Int4BatchOps<true, Codes>, L, MAXM, U, kAhead>(a, b, w, lr, qw, q0, xs, acc);
  } else {
    run_walk_with<Int4BatchOps<false, Codes>, L, MAXM, U, kAhead>(a, b, w, lr, qw, q0, xs, acc);
  }
}

// Sums the 4 lanes of each row (l, l ^ 8, l ^ 16, l ^ 24); afterwards all four hold the same bits
// (IEEE addition commutes), so any of them may write the result.
template <int MAXM>
__device__ __forceinline__ void reduce_row_lanes(float acc[MAXM]) {
#pragma unroll
  for (int m = 0; m < MAXM; ++m) {
    acc[m] += __shfl_xor_sync(0xFFFFFFFFu, acc[m], 8);
    acc[m] += __shfl_xor_sync(0xFFFFFFFFu, acc[m], 16);
  }
}

// Bias of row n (0 without one).
__device__ __forceinline__ float load_bias(const DeviceQuantMatrix& w, uint32_t n) {
  if (w.bias == nullptr) return 0.0f;
  return load_widened(w.bias, n, w.bias_dtype);
}

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_INT4_TILE_CUH_
