// Activation rows into the shared-memory records that int4_tile.cuh reads: widened to FP32
// (exact level) or quantized to int8 per 32 k (fast level), exactly as the CPU's
// quantize_activations_q8 (lib/cpu/scalar/gemm_int4_scalar.cc, docs/formats.md):
//   amax = max |x| over the chunk's k < K (NaN ignored), flushed (q = 0, scale 0) below 2^-119;
//   scale = amax / 127, q = round-half-even(x * (127 / amax)) in FP32 (IEEE division, the
//   product rounded before the rounding to integer), NaN -> 0; codes past K are q = 0.
// Every record is written by 4 consecutive threads of one warp, 8 k each (thread t of the 4
// covers k 8t..8t+7 of the chunk), so the chunk's max and sums take two shuffles.
#ifndef QMOE_LIB_CUDA_ACTIVATION_STAGE_CUH_
#define QMOE_LIB_CUDA_ACTIVATION_STAGE_CUH_

#include "lib/cuda/int4_tile.cuh"

namespace qmoe::cuda {

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
  const bool flush = !(amax >= kQ8FlushBelowDevice);
  const float scale = flush ? 0.0f : __fdiv_rn(amax, 127.0f);
  const float inv = flush ? 0.0f : __fdiv_rn(127.0f, amax);
  int32_t sum = 0;
  uint32_t packed[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    // cvt.rni rounds half to even; |x * inv| <= 127 (1 + 2^-23) for finite x, so no clamp.
    // NaN (a NaN x, or an infinite x times inv = 0) is mapped to 0 explicitly.
    const float t = __fmul_rn(e.v[i], inv);
    const int32_t q = t == t ? __float2int_rn(t) : 0;
    sum += q;
    packed[i / 4] |= (static_cast<uint32_t>(q) & 0xFFu) << (8 * (i % 4));
  }
  const int32_t half = sum + __shfl_xor_sync(0xFFFFFFFFu, sum, 1);  // parts {0,1} or {2,3}
  const int32_t all = half + __shfl_xor_sync(0xFFFFFFFFu, half, 2);
  if (!active) return;
  *reinterpret_cast<uint2*>(rec + 8 * part) = make_uint2(packed[0], packed[1]);
  int32_t* meta = reinterpret_cast<int32_t*>(rec + 32);
  if (part == 0) {
    meta[0] = __float_as_int(scale);
    meta[1] = half;  // q[0..15]
  } else if (part == 1) {
    meta[3] = all;
  } else if (part == 2) {
    meta[2] = half;  // q[16..31]
  }
}

// Stages chunks [c0, c0 + tc) of MAXM activation rows into records (row m's record of chunk
// c0 + i at smem + (m * tc + i) * record_bytes). Row m < rows is read at row_ptr(m) (elements of
// `dtype`, k < K only); rows m >= rows are zero. Called by all threads of the block (blockDim.x
// a multiple of 32); the caller synchronises before the records are read.
template <Level L, int MAXM, class RowPtr>
__device__ void stage_rows(unsigned char* smem, uint32_t c0, uint32_t tc, uint32_t k_total,
                           uint32_t rows, qmoe_dtype dtype, bool cg_loads, RowPtr row_ptr) {
  const uint32_t items = MAXM * tc;
  const uint32_t part = threadIdx.x % 4;
  // Every thread of a warp runs the same number of passes (the quantizer shuffles).
  const uint32_t per_pass = blockDim.x / 4;
  for (uint32_t base = 0; base < items; base += per_pass) {
    const uint32_t item = base + threadIdx.x / 4;
    const bool active = item < items;
    const uint32_t m = active ? item / tc : 0, i = active ? item % tc : 0;
    const uint32_t k0 = (c0 + i) * kChunkCodes + 8 * part;
    Eight e;
    const void* row = (active && m < rows) ? row_ptr(m) : nullptr;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t k = k0 + j;
      float v = 0.0f;
      if (row != nullptr && k < k_total) {
        v = cg_loads ? load_widened_cg(row, k, dtype) : load_widened(row, k, dtype);
      }
      e.v[j] = v;
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

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_ACTIVATION_STAGE_CUH_
