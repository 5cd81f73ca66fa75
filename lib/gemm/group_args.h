// The arguments of a dequant-GEMM kernel, whatever its format and ISA: the contract between the
// GEMM driver (lib/gemm/gemm_rows.cc) and the kernels of lib/cpu/.
//
// Types and constants only (no inline functions): included by translation units of every
// ISA's flags.
#ifndef QMOE_LIB_GEMM_GROUP_ARGS_H_
#define QMOE_LIB_GEMM_GROUP_ARGS_H_

#include <cstddef>
#include <cstdint>

#include "lib/formats/tiles.h"
#include "qmoe/qmoe.h"

namespace qmoe {

// Activations of one GEMM call quantized for the fast level, per row m and chunk c:
//   x[m, 32c + i] ~= scale[m, c] * q[m, 32c + i],  q in [-127, 127], zero past K;
//   sum_q[m, c] = sum_i q[m, 32c + i] (exact as float: |sum| <= 32 * 127);
//   e2m1_start[m, c] = {-12 sum_{i < 16} q[m, 32c + i], -12 sum_{i >= 16} q[m, 32c + i]}
//   (int32, two per chunk): where the E2M1 fast kernels start their integer sums of u q with
//   unsigned weights u = 2 E2M1(code) + 12, so that each half chunk's sum comes out as the
//   exact sum_i 2 E2M1(code_i) q_i with no correction per weight group (NVFP4's 16-k blocks
//   take one half each). Filled once per call with the quantized rows.
// A chunk whose max|x| is below kQ8FlushBelow (zero included) quantizes to q = 0, scale 0:
// from there down 127 / max|x| overflows (below ~2^-121) or max|x| / 127 is subnormal and no
// longer within 2^-24 of its value, so the documented bound could not hold. Above it both
// divisions are normal and finite, every product |x * 127 / max| stays below 127.5, and no
// division by zero is ever evaluated (the divide-by-zero flag stays clear).
constexpr float kQ8FlushBelow = 0x1p-119f;
struct Q8Activations {
  const int8_t* q;     // m * q_stride bytes, q_stride = chunks * 32
  const float* scale;  // m * chunks
  const float* sum_q;  // m * chunks
  size_t q_stride;
  size_t chunk_stride;        // = chunks
  const int32_t* e2m1_start;  // m * chunks * 2
};

/// The E2M1 weights' offset in the fast kernels (e2m1_start above).
constexpr int32_t kE2M1FastOffset = 12;

// One kernel call: the outputs of rows [row_begin, row_end) of one 8-row group for all M
// activation rows.
//
// Scales and zero points of block b for the group's 8 rows are 8 consecutive elements at
// scales + b * scale_block_stride and zero_points + b * zero_point_block_stride. The driver
// points these at the caller's planes when they are in [K/block, N] order (row stride 1), the
// group is full and K is a multiple of 32; otherwise at panels it built (fp32 scales, block
// stride 8; rows past N and a half-filled last chunk's missing block hold scale 0; byte scale
// types decoded to their FP32 values, NaN included). Kernels read blocks
// [0, ceil(chunks * 32 / block_size)) only.
struct GemmGroupArgs {
  const uint8_t* codes;  // the group's first tile; chunks tiles of the format's tile bytes
  uint32_t chunks;       // ceil(K / 32)
  uint32_t block_size;   // k of one scale (the formats' traits say which sizes)
  qmoe_dtype scale_dtype;
  const void* scales;
  size_t scale_block_stride;   // elements
  const uint8_t* zero_points;  // nullptr: every zero point is the format's default
  size_t zero_point_block_stride;
  const float* bias;  // 8 values (0 past N), or nullptr
  // The factor every weight of the matrix carries beyond its block scale: the matrix's global
  // scale (qmoe_quant_matrix::global_scale; 1 when it has none). Each output is
  // global_scale * sum_k x_k * (code value * block scale)_k + bias. Formats whose traits take no
  // global scale always get 1 here, and their kernels do not read it.
  float global_scale;
  uint32_t m;
  // Exact level: X rows of chunks * 32 floats at x + i * ldx (zero past K).
  const float* x;
  size_t ldx;
  // Fast level.
  Q8Activations xq;
  // Output: Y[i, row] at y[i * ldy + row] for row in [row_begin, row_end) (y points at the
  // group's first column).
  float* y;
  size_t ldy;
  uint32_t row_begin;
  uint32_t row_end;
  // Tuning, not semantics: how far ahead (bytes) to prefetch the code stream into L2 in
  // addition to the fixed L1 prefetch; 0 for none (lib/cpu/common/int4_prefetch.h).
  uint32_t prefetch_l2_bytes;
};

}  // namespace qmoe

#endif  // QMOE_LIB_GEMM_GROUP_ARGS_H_
