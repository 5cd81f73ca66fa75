// Activation rows: X prepared once for an accuracy level and a K, then read by every matrix of
// that K (qmoe_gemm's columns, the MoE layer's experts). At the exact level a row is FP32 padded
// with zeros to whole 32-k chunks; at the fast level it is int8 with a scale and a sum per chunk
// (Q8Activations, lib/gemm/group_args.h). Rows can be gathered (copied) and written chunk by
// chunk.
#ifndef QMOE_LIB_GEMM_ACTIVATION_ROWS_H_
#define QMOE_LIB_GEMM_ACTIVATION_ROWS_H_

#include <cstddef>
#include <cstdint>

#include "lib/cpu/kernel_table.h"
#include "qmoe/qmoe.h"

namespace qmoe {

/// Read-only prepared activation rows of one accuracy level and K. Row r is, at the exact
/// level, chunks * 32 floats at x + r * x_stride, zero past K; at the fast level, chunks * 32
/// int8 at q + r * q_stride with scale and sum_q at + r * chunks and e2m1_start at
/// + r * chunks * 2 (see Q8Activations).
struct ActivationView {
  qmoe_accuracy accuracy;
  uint32_t k;
  uint32_t chunks;
  const float* x;
  size_t x_stride;  // floats
  const int8_t* q;
  const float* scale;
  const float* sum_q;
  const int32_t* e2m1_start;
  size_t q_stride;  // bytes
};

/// Writable storage for `capacity` prepared rows, carved from caller scratch.
struct ActivationRows {
  qmoe_accuracy accuracy;
  uint32_t k;
  uint32_t chunks;
  float* x;   // exact level
  int8_t* q;  // fast level
  float* scale;
  float* sum_q;
  int32_t* e2m1_start;
  size_t stride;  // chunks * 32: floats of an exact row, bytes of a fast row
};

/// Bytes of storage for `capacity` rows of (accuracy, k); a multiple of 64.
size_t activation_rows_bytes(qmoe_accuracy accuracy, uint32_t k, size_t capacity);

/// Lay out `capacity` rows in `storage` (64-byte aligned, activation_rows_bytes long).
ActivationRows carve_activation_rows(qmoe_accuracy accuracy, uint32_t k, size_t capacity,
                                     unsigned char* storage);

/// The caller's FP32 rows used in place: exact level with k a multiple of 32 only.
ActivationView direct_activation_view(const float* x, size_t ldx, uint32_t k);

ActivationView view_of(const ActivationRows& rows);

/// Prepare rows [first, first + m) of `rows` from X rows x + i * ldx (k floats each).
void prepare_activation_rows(const KernelTable& kernels, const ActivationRows& rows, size_t first,
                             uint32_t m, const float* x, size_t ldx);

/// prepare_activation_rows from X rows of `dtype` (F32, F16 or BF16) at x + i * ldx elements:
/// 16-bit rows are widened 32 values at a time and prepared chunk by chunk, which gives the
/// rows prepared from the widened X (see prepare_activation_chunk).
void prepare_activation_rows_typed(const KernelTable& kernels, const ActivationRows& rows,
                                   size_t first, uint32_t m, qmoe_dtype dtype, const void* x,
                                   size_t ldx);

/// Prepare chunk `chunk` (k in [32 * chunk, 32 * chunk + len), len <= 32 and the rest of the
/// row) of row `row` from `values`. Chunks of one row are independent: a row written chunk by
/// chunk equals the row prepared at once.
void prepare_activation_chunk(const KernelTable& kernels, const ActivationRows& rows, size_t row,
                              uint32_t chunk, const float* values, uint32_t len);

/// Copy prepared row `src_row` of `src` to row `dst_row` of `dst` (same accuracy and k).
void copy_activation_row(const ActivationView& src, size_t src_row, const ActivationRows& dst,
                         size_t dst_row);

}  // namespace qmoe

#endif  // QMOE_LIB_GEMM_ACTIVATION_ROWS_H_
