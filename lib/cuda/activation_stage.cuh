// Activation rows into the shared-memory records that int4_tile.cuh reads: widened to FP32
// (exact level) or quantized to int8 per 32 k (fast level), exactly as the CPU's
// quantize_activations_q8 (lib/cpu/scalar/gemm_int4_scalar.cc, docs/formats.md):
//   amax = max |x| over the chunk's k < K (NaN ignored), flushed (q = 0, scale 0) below 2^-119;
//   scale = amax / 127, q = round-half-even(x * (127 / amax)) in FP32 (IEEE division, the
//   product rounded before the rounding to integer), NaN -> 0; codes past K are q = 0.
// Two stagers, both a pure function of the values (so every block that stages the same rows
// writes the same records):
//   stage_rows:   block-wide, from the caller's activation rows (FP32/FP16/BF16, any alignment);
//                 every record is written by 4 consecutive threads of one warp, 8 k each
//                 (16-byte loads where the row allows them).
//   stage_f32_warp: one warp, from 16-byte aligned FP32 rows in global memory (the MoE layer's
//                 FC1 activations); every record is written by 8 consecutive lanes, 4 k each.
// In both, a chunk's max and sums take shuffles among its threads only.
#ifndef QMOE_LIB_CUDA_ACTIVATION_STAGE_CUH_
#define QMOE_LIB_CUDA_ACTIVATION_STAGE_CUH_

#include "lib/cuda/int4_tile.cuh"

namespace qmoe::cuda {

// The chunk's scale and 127 / amax from its amax (as quantize_activations_q8).
struct Q8Scale {
  float scale, inv;
};
__device__ __forceinline__ Q8Scale q8_scale(float amax) {
  const bool flush = !(amax >= kQ8FlushBelowDevice);
  return {flush ? 0.0f : __fdiv_rn(amax, 127.0f), flush ? 0.0f : __fdiv_rn(127.0f, amax)};
}

// round-half-even(x * inv) as a byte: cvt.rni rounds half to even; |x * inv| <= 127 (1 + 2^-23)
// for finite x, so no clamp. NaN (a NaN x, or an infinite x times inv = 0) is mapped to 0
// explicitly. *sum gets the integer.
__device__ __forceinline__ uint32_t q8_byte(float x, float inv, int32_t* sum) {
  const float t = __fmul_rn(x, inv);
  const int32_t q = t == t ? __float2int_rn(t) : 0;
  *sum += q;
  return static_cast<uint32_t>(q) & 0xFFu;
}

// One chunk's 8 values of one of its 4 threads, FP32 (zeros past K).
struct Eight {
  float v[8];
};

// Quantizes the 8 values of this thread (part = threadIdx % 4 of the chunk's 4 threads) and
// writes them, and (parts 0..2) the chunk's scale and sums, into the fast record `rec`. All 32
// lanes of the warp must call it (shuffles); `active` false lanes write nothing but take part.
__device__ __forceinline__ void quantize_eight(const Eight& e, uint32_t part, bool active,
                                               unsigned char* rec) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(e.v[i]));  // fmaxf ignores NaN
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 2));
  const Q8Scale s = q8_scale(amax);
  int32_t sum = 0;
  uint32_t packed[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 8; ++i) packed[i / 4] |= q8_byte(e.v[i], s.inv, &sum) << (8 * (i % 4));
  const int32_t half = sum + __shfl_xor_sync(0xFFFFFFFFu, sum, 1);  // parts {0,1} or {2,3}
  const int32_t all = half + __shfl_xor_sync(0xFFFFFFFFu, half, 2);
  if (!active) return;
  *reinterpret_cast<uint2*>(rec + 8 * part) = make_uint2(packed[0], packed[1]);
  int32_t* meta = reinterpret_cast<int32_t*>(rec + 32);
  if (part == 0) {
    meta[0] = __float_as_int(s.scale);
    meta[1] = half;  // q[0..15]
  } else if (part == 1) {
    meta[3] = all;
  } else if (part == 2) {
    meta[2] = half;  // q[16..31]
  }
}

// Elements k0..k0+7 of a row (zeros at k >= k_total), widened; one or two 16-byte loads when the
// eight lie inside K and start 16-byte aligned, element loads otherwise. cg: through the L2 only
// (data the preceding grid may have written).
__device__ __forceinline__ Eight load_eight(const void* row, uint32_t k0, uint32_t k_total,
                                            qmoe_dtype dtype, bool cg) {
  Eight e;
  const size_t es = dtype == QMOE_DTYPE_F32 ? 4 : 2;
  const unsigned char* p = static_cast<const unsigned char*>(row) + size_t{k0} * es;
  if (k0 + 8 <= k_total && (reinterpret_cast<uintptr_t>(p) & 15) == 0) {
    if (dtype == QMOE_DTYPE_F32) {
      const float4* p4 = reinterpret_cast<const float4*>(p);
      const float4 a = cg ? __ldcg(p4) : __ldg(p4);
      const float4 b = cg ? __ldcg(p4 + 1) : __ldg(p4 + 1);
      e.v[0] = a.x, e.v[1] = a.y, e.v[2] = a.z, e.v[3] = a.w;
      e.v[4] = b.x, e.v[5] = b.y, e.v[6] = b.z, e.v[7] = b.w;
    } else {
      const uint4* p4 = reinterpret_cast<const uint4*>(p);
      const uint4 u = cg ? __ldcg(p4) : __ldg(p4);
      const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (dtype == QMOE_DTYPE_F16) {
          e.v[2 * i] = __half2float(__ushort_as_half(static_cast<unsigned short>(words[i])));
          e.v[2 * i + 1] =
              __half2float(__ushort_as_half(static_cast<unsigned short>(words[i] >> 16)));
        } else {
          e.v[2 * i] = __uint_as_float(words[i] << 16);
          e.v[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
        }
      }
    }
    return e;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const uint32_t k = k0 + j;
    float v = 0.0f;
    if (k < k_total) v = cg ? load_widened_cg(row, k, dtype) : load_widened(row, k, dtype);
    e.v[j] = v;
  }
  return e;
}

// Stages chunks [c0, c0 + tc) of the first `rows` (<= MAXM) activation rows into records (row m's
// record of chunk c0 + i at smem + (m * tc + i) * record_bytes); row m is read at row_ptr(m)
// (elements of `dtype`, k < K only). Records of rows >= rows are not written (the walks skip
// them). Called by all threads of the block (blockDim.x a multiple of 32); the caller
// synchronises before the records are read.
template <Level L, int MAXM, class RowPtr>
__device__ void stage_rows(unsigned char* smem, uint32_t c0, uint32_t tc, uint32_t k_total,
                           uint32_t rows, qmoe_dtype dtype, bool cg_loads, RowPtr row_ptr) {
  const uint32_t items = min(rows, static_cast<uint32_t>(MAXM)) * tc;
  const uint32_t part = threadIdx.x % 4;
  // Every thread of a warp runs the same number of passes (the quantizer shuffles).
  const uint32_t per_pass = blockDim.x / 4;
  for (uint32_t base = 0; base < items; base += per_pass) {
    const uint32_t item = base + threadIdx.x / 4;
    const bool active = item < items;
    const uint32_t m = active ? item / tc : 0, i = active ? item % tc : 0;
    const uint32_t k0 = (c0 + i) * kChunkCodes + 8 * part;
    Eight e;
    if (active) {
      e = load_eight(row_ptr(m), k0, k_total, dtype, cg_loads);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) e.v[j] = 0.0f;
    }
    unsigned char* rec = smem + size_t(m * tc + i) * record_bytes<L>();
    if constexpr (L == Level::kExact) {
      if (active) {
        float* f = reinterpret_cast<float*>(rec) + 8 * part;
        *reinterpret_cast<float4*>(f) = make_float4(e.v[0], e.v[1], e.v[2], e.v[3]);
        *reinterpret_cast<float4*>(f + 4) = make_float4(e.v[4], e.v[5], e.v[6], e.v[7]);
      }
    } else {
      quantize_eight(e, part, active, rec);
    }
  }
}

// The fast record of one chunk from 8 lanes with 4 values each (part = lane % 8 holds k
// 4 part..4 part + 3 of the chunk): as quantize_eight, with the chunk's shuffles among its 8
// lanes. All 32 lanes must call it; `active` false lanes write nothing but take part.
__device__ __forceinline__ void quantize_four(const float4& v, uint32_t part, bool active,
                                              unsigned char* rec) {
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 2));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 4));
  const Q8Scale s = q8_scale(amax);
  int32_t sum = 0;
  const uint32_t packed = q8_byte(v.x, s.inv, &sum) | (q8_byte(v.y, s.inv, &sum) << 8) |
                          (q8_byte(v.z, s.inv, &sum) << 16) | (q8_byte(v.w, s.inv, &sum) << 24);
  int32_t half = sum + __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
  half += __shfl_xor_sync(0xFFFFFFFFu, half, 2);  // parts 0..3: q[0..15]; 4..7: q[16..31]
  const int32_t all = half + __shfl_xor_sync(0xFFFFFFFFu, half, 4);
  if (!active) return;
  *reinterpret_cast<uint32_t*>(rec + 4 * part) = packed;
  int32_t* meta = reinterpret_cast<int32_t*>(rec + 32);
  if (part == 0) {
    meta[0] = __float_as_int(s.scale);
    meta[1] = half;
  } else if (part == 1) {
    meta[3] = all;
  } else if (part == 4) {
    meta[2] = half;
  }
}

// One warp stages chunks [c0, c0 + tc) of the first `rows` (<= MAXM) rows into its own records
// (row m's record of chunk c0 + i at xs + (m * tc + i) * record_bytes): row m is the FP32 row at
// src + m * src_row_bytes (16-byte aligned, read through the L2), k < k_total only (k_total a
// multiple of 4; zeros past it). Lanes 8j..8j+7 take one chunk, 4 values each. The caller
// orders the records (__syncwarp) before they are read.
template <Level L, int MAXM>
__device__ __forceinline__ void stage_f32_warp(unsigned char* xs, const unsigned char* src,
                                               size_t src_row_bytes, uint32_t rows, uint32_t c0,
                                               uint32_t tc, uint32_t k_total, uint32_t lane) {
  const uint32_t items = min(rows, static_cast<uint32_t>(MAXM)) * tc, part = lane % 8;
  for (uint32_t base = 0; base < items; base += 4) {  // uniform trip count (shuffles)
    const uint32_t item = base + lane / 8;
    const bool active = item < items;
    const uint32_t m = active ? item / tc : 0, i = active ? item % tc : 0;
    const uint32_t k = (c0 + i) * kChunkCodes + 4 * part;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (active && k < k_total) {
      v = __ldcg(reinterpret_cast<const float4*>(src + m * src_row_bytes + size_t{k} * 4));
    }
    unsigned char* rec = xs + size_t(m * tc + i) * record_bytes<L>();
    if constexpr (L == Level::kExact) {
      if (active) *reinterpret_cast<float4*>(rec + 16 * part) = v;
    } else {
      quantize_four(v, part, active, rec);
    }
  }
}

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_ACTIVATION_STAGE_CUH_
