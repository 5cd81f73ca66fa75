// The per-warp arithmetic of the INT4 decode kernels (int4_gemv.cu, moe_layer.cu): one warp
// computes the 8 rows of one 8-row code group against MAXM activation rows over a set of
// 4-chunk "quads" of K.
//
// Who reads what. Lane l owns row r = l % 8 of the group and chunk slot s = l / 8 of a quad: for
// quad q it loads the 16 bytes of row r of chunk c = 4q + s, so one warp-wide load covers chunks
// 4q..4q+3 of the group, 512 contiguous bytes of the canonical layout
//   byte(n, k) = ((n / 8) * chunks + k / 32) * 128 + (n % 8) * 16 + (k % 16)
// (code k in the low nibble when k % 32 < 16, else in the high nibble). Word i (i = 0..3) of a
// lane's 16 bytes holds bytes 4i..4i+3: its low nibbles are codes 4i..4i+3 of the chunk and its
// high nibbles codes 16+4i..16+4i+3. A lane accumulates its row's partial sums over its chunks;
// the 4 lanes of a row (l, l+8, l+16, l+24) are summed by two xor shuffles at the end.
//
// Activations come from shared memory as per-(row m, chunk) records written by the staging code
// (activation_stage.cuh, or the MoE layer's copy of its own records):
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

// Loads per batch: U quads of one lane in flight before the first use. Fewer for large M, whose
// accumulators need the registers and whose arithmetic per byte is higher.
template <int MAXM>
__host__ __device__ constexpr int batch_quads() {
  return MAXM <= 2 ? 8 : 4;
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

// Scale element i of a plane of dtype SD (read-only for the kernel's lifetime: the non-coherent
// path is allowed).
template <qmoe_dtype SD>
__device__ __forceinline__ float load_scale(const void* p, size_t i) {
  if constexpr (SD == QMOE_DTYPE_F32) {
    return __ldg(static_cast<const float*>(p) + i);
  } else if constexpr (SD == QMOE_DTYPE_F16) {
    return __half2float(__ushort_as_half(__ldg(static_cast<const unsigned short*>(p) + i)));
  } else {
    return bf16_bits_to_float(__ldg(static_cast<const unsigned short*>(p) + i));
  }
}

// ---- Plane addressing ----------------------------------------------------------------------

// Element offset of row n's block 0 in a plane (DeviceQuantMatrix's strides).
__device__ __forceinline__ size_t plane_row_offset(uint32_t n, size_t row_stride,
                                                   size_t group_stride) {
  return group_stride == 0 ? size_t{n} * row_stride
                           : size_t{n / kGroupRows} * group_stride + (n % kGroupRows) * row_stride;
}

// What a lane needs to address its row of one group.
struct LaneRow {
  const uint8_t* codes;  // the lane's row of the group's chunk 0 (row r's 16 bytes)
  size_t scale_off;      // plane offset of (n, block 0)
  size_t zp_off;
  bool valid;  // n < N: rows past N are padding whose planes must not be read
};

__device__ __forceinline__ LaneRow lane_row(const DeviceQuantMatrix& w, uint32_t group,
                                            uint32_t r) {
  LaneRow lr;
  const uint32_t n = group * kGroupRows + r;
  lr.codes = w.codes + size_t{group} * w.chunks * kChunkBytes + r * kChunkRowBytes;
  lr.valid = n < w.n;
  lr.scale_off = plane_row_offset(n, w.scale_row_stride, w.scale_group_stride);
  lr.zp_off = plane_row_offset(n, w.zero_point_row_stride, w.zero_point_group_stride);
  return lr;
}

// ---- One batch of U quads: loads ------------------------------------------------------------

// Per quad slot j: the lane's 16 code bytes of chunk c, the scales and zero points of the
// chunk's block(s) (block size 16: lo = block 2c for codes 0..15, hi = block 2c + 1 for codes
// 16..31; otherwise both halves are block 32c / B and only lo is used), and the chunk's index in
// the staged activation tile (-1: nothing to do).
template <int U>
struct Batch {
  uint4 codes[U];
  float scale_lo[U], scale_hi[U];
  uint32_t zp[U];  // zero point of lo | zero point of hi << 8
  int local[U];
};

// Loads quads q_first + j * q_step (j < U) that are below q_end, chunks below chunk_end, for the
// activation tile starting at chunk tile_c0. All loads are issued before any is used.
template <int U, qmoe_dtype SD>
__device__ __forceinline__ void load_batch(Batch<U>& b, const DeviceQuantMatrix& w,
                                           const LaneRow& lr, uint32_t sub, uint32_t q_first,
                                           uint32_t q_step, uint32_t q_end, uint32_t chunk_end,
                                           uint32_t tile_c0) {
  const bool b16 = w.block_size == 16;
  const uint32_t chunks_per_block = b16 ? 1 : w.block_size / kChunkCodes;
#pragma unroll
  for (int j = 0; j < U; ++j) {
    const uint32_t q = q_first + q_step * j;
    const uint32_t c = q * kQuadChunks + sub;
    const bool ok = q < q_end && c < chunk_end;
    b.local[j] = ok ? static_cast<int>(c - tile_c0) : -1;
    b.codes[j] = make_uint4(0, 0, 0, 0);
    b.scale_lo[j] = 0.0f;
    b.scale_hi[j] = 0.0f;
    b.zp[j] = kInt4DefaultZeroPoint | (kInt4DefaultZeroPoint << 8);
    if (ok) {
      b.codes[j] = __ldg(reinterpret_cast<const uint4*>(lr.codes + size_t{c} * kChunkBytes));
    }
    if (ok && lr.valid) {
      const uint32_t blk = b16 ? 2 * c : c / chunks_per_block;
      b.scale_lo[j] = load_scale<SD>(w.scales, lr.scale_off + blk * w.scale_block_stride);
      // Block 2c + 1 exists only when the chunk's codes 16..31 are inside K.
      const bool hi_exists = b16 && c * kChunkCodes + 16 < w.k;
      if (hi_exists) {
        b.scale_hi[j] = load_scale<SD>(w.scales, lr.scale_off + (blk + 1) * w.scale_block_stride);
      }
      if (w.zero_points != nullptr) {
        const uint32_t zlo = __ldg(w.zero_points + lr.zp_off + blk * w.zero_point_block_stride);
        uint32_t zhi = zlo;
        if (hi_exists) {
          zhi = __ldg(w.zero_points + lr.zp_off + (blk + 1) * w.zero_point_block_stride);
        }
        b.zp[j] = zlo | (zhi << 8);
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

// The chunk's two partial sums for row m: lo = sum_{k<16} x_k (code_k - z_lo), hi = the same over
// k = 16..31, each in FP32 in k order. x points at the row's exact record of the chunk.
template <int MAXM>
__device__ __forceinline__ void exact_chunk(const uint4& codes, uint32_t zp, const float* x,
                                            uint32_t x_row_stride_floats, float lo[MAXM],
                                            float hi[MAXM]) {
  const ZeroTerms zl = zero_terms(static_cast<float>(zp & 0xFF));
  const ZeroTerms zh = zero_terms(static_cast<float>(zp >> 8));
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
#pragma unroll
    for (int m = 0; m < MAXM; ++m) {
      const float* xm = x + m * x_row_stride_floats;
      const float4 xl = *reinterpret_cast<const float4*>(xm + 4 * i);
      const float4 xh = *reinterpret_cast<const float4*>(xm + 16 + 4 * i);
      lo[m] = __fmaf_rn(xl.x, l0, lo[m]);
      lo[m] = __fmaf_rn(xl.y, l1, lo[m]);
      lo[m] = __fmaf_rn(xl.z, l2, lo[m]);
      lo[m] = __fmaf_rn(xl.w, l3, lo[m]);
      hi[m] = __fmaf_rn(xh.x, h0, hi[m]);
      hi[m] = __fmaf_rn(xh.y, h1, hi[m]);
      hi[m] = __fmaf_rn(xh.z, h2, hi[m]);
      hi[m] = __fmaf_rn(xh.w, h3, hi[m]);
    }
  }
}

// ---- Fast level ----------------------------------------------------------------------------

// Exact float of an integer |v| < 2^22: the bits 0x4B400000 + v are the float 1.5 * 2^23 + v.
__device__ __forceinline__ float small_int_to_float(int32_t v) {
  return __int_as_float(0x4B400000 + v) - 12582912.0f;
}

// acc[m] += (dot - z * sum_q) * (scale * x_scale) per block of the chunk, as the scalar kernel;
// the integer parts are exact (|dot|, |z sum_q| <= 32 * 15 * 127).
template <int MAXM>
__device__ __forceinline__ void fast_chunk(const uint4& codes, uint32_t zp, float scale_lo,
                                           float scale_hi, bool b16, const unsigned char* rec,
                                           uint32_t rec_row_stride_bytes, float acc[MAXM]) {
  const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
  int lo[4], hi[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    lo[i] = static_cast<int>(words[i] & 0x0F0F0F0Fu);         // codes 4i..4i+3
    hi[i] = static_cast<int>((words[i] >> 4) & 0x0F0F0F0Fu);  // codes 16+4i..16+4i+3
  }
  const int z_lo = static_cast<int>(zp & 0xFF), z_hi = static_cast<int>(zp >> 8);
#pragma unroll
  for (int m = 0; m < MAXM; ++m) {
    const unsigned char* r = rec + m * rec_row_stride_bytes;
    const int4 q_lo = *reinterpret_cast<const int4*>(r);
    const int4 q_hi = *reinterpret_cast<const int4*>(r + 16);
    const int4 meta = *reinterpret_cast<const int4*>(r + 32);  // scale, sum_lo, sum_hi, sum_all
    int d_lo = __dp4a(lo[0], q_lo.x, 0);
    d_lo = __dp4a(lo[1], q_lo.y, d_lo);
    d_lo = __dp4a(lo[2], q_lo.z, d_lo);
    d_lo = __dp4a(lo[3], q_lo.w, d_lo);
    int d_hi = __dp4a(hi[0], q_hi.x, 0);
    d_hi = __dp4a(hi[1], q_hi.y, d_hi);
    d_hi = __dp4a(hi[2], q_hi.z, d_hi);
    d_hi = __dp4a(hi[3], q_hi.w, d_hi);
    const float x_scale = __int_as_float(meta.x);
    if (b16) {
      const float c_lo = small_int_to_float(d_lo - z_lo * meta.y);
      const float c_hi = small_int_to_float(d_hi - z_hi * meta.z);
      acc[m] = __fmaf_rn(c_lo, __fmul_rn(scale_lo, x_scale), acc[m]);
      acc[m] = __fmaf_rn(c_hi, __fmul_rn(scale_hi, x_scale), acc[m]);
    } else {
      const float c = small_int_to_float(d_lo + d_hi - z_lo * meta.w);
      acc[m] = __fmaf_rn(c, __fmul_rn(scale_lo, x_scale), acc[m]);
    }
  }
}

// ---- One batch: arithmetic -----------------------------------------------------------------

// Adds the batch's chunks to acc[m] (m < MAXM). xs: the staged tile's records of row 0;
// row_stride_records: records between rows. Exact: per chunk the two half sums times their
// block's scale (one block per chunk from block size 32 up: (lo + hi) * scale).
template <Level L, int MAXM, int U>
__device__ __forceinline__ void compute_batch(const Batch<U>& b, bool b16, const unsigned char* xs,
                                              uint32_t row_stride_records, float acc[MAXM]) {
#pragma unroll
  for (int j = 0; j < U; ++j) {
    if (b.local[j] < 0) continue;
    const unsigned char* rec = xs + size_t(b.local[j]) * record_bytes<L>();
    if constexpr (L == Level::kExact) {
      float lo[MAXM], hi[MAXM];
      exact_chunk<MAXM>(b.codes[j], b.zp[j], reinterpret_cast<const float*>(rec),
                        row_stride_records * kExactRecordFloats, lo, hi);
#pragma unroll
      for (int m = 0; m < MAXM; ++m) {
        if (b16) {
          acc[m] = __fmaf_rn(lo[m], b.scale_lo[j], acc[m]);
          acc[m] = __fmaf_rn(hi[m], b.scale_hi[j], acc[m]);
        } else {
          acc[m] = __fmaf_rn(__fadd_rn(lo[m], hi[m]), b.scale_lo[j], acc[m]);
        }
      }
    } else {
      fast_chunk<MAXM>(b.codes[j], b.zp[j], b.scale_lo[j], b.scale_hi[j], b16, rec,
                       row_stride_records * kFastRecordBytes, acc);
    }
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
