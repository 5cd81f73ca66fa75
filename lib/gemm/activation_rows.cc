#include "lib/gemm/activation_rows.h"

#include <algorithm>
#include <cstring>

#include "lib/formats/quant_matrix.h"
#include "lib/formats/tiles.h"
#include "lib/gemm/activation_dtype.h"
#include "lib/memory_ranges.h"

namespace qmoe {

namespace {

// e2m1_start of `chunks` chunks of quantized q (Q8Activations): -12 times each half's sum.
void e2m1_starts(const int8_t* q, uint32_t chunks, int32_t* start) {
  for (uint32_t c = 0; c < chunks; ++c) {
    for (uint32_t half = 0; half < 2; ++half) {
      int32_t sum = 0;
      for (uint32_t i = 0; i < kChunkCodes / 2; ++i) {
        sum += q[size_t{c} * kChunkCodes + half * (kChunkCodes / 2) + i];
      }
      start[2 * c + half] = -kE2M1FastOffset * sum;
    }
  }
}

}  // namespace

size_t activation_rows_bytes(qmoe_accuracy accuracy, uint32_t k, size_t capacity) {
  const size_t chunks = chunk_count(k);
  const size_t stride = chunks * kChunkCodes;
  if (accuracy == QMOE_ACCURACY_EXACT) return align64(capacity * stride * sizeof(float));
  return align64(capacity * stride) + 2 * align64(capacity * chunks * sizeof(float)) +
         align64(capacity * chunks * 2 * sizeof(int32_t));
}

ActivationRows carve_activation_rows(qmoe_accuracy accuracy, uint32_t k, size_t capacity,
                                     unsigned char* storage) {
  ActivationRows r{};
  r.accuracy = accuracy;
  r.k = k;
  r.chunks = chunk_count(k);
  r.stride = size_t{r.chunks} * kChunkCodes;
  if (accuracy == QMOE_ACCURACY_EXACT) {
    r.x = reinterpret_cast<float*>(storage);
  } else {
    r.q = reinterpret_cast<int8_t*>(storage);
    storage += align64(capacity * r.stride);
    r.scale = reinterpret_cast<float*>(storage);
    storage += align64(capacity * r.chunks * sizeof(float));
    r.sum_q = reinterpret_cast<float*>(storage);
    storage += align64(capacity * r.chunks * sizeof(float));
    r.e2m1_start = reinterpret_cast<int32_t*>(storage);
  }
  return r;
}

ActivationView direct_activation_view(const float* x, size_t ldx, uint32_t k) {
  ActivationView v{};
  v.accuracy = QMOE_ACCURACY_EXACT;
  v.k = k;
  v.chunks = k / kChunkCodes;
  v.x = x;
  v.x_stride = ldx;
  return v;
}

ActivationView view_of(const ActivationRows& rows) {
  ActivationView v{};
  v.accuracy = rows.accuracy;
  v.k = rows.k;
  v.chunks = rows.chunks;
  v.x = rows.x;
  v.x_stride = rows.stride;
  v.q = rows.q;
  v.scale = rows.scale;
  v.sum_q = rows.sum_q;
  v.e2m1_start = rows.e2m1_start;
  v.q_stride = rows.stride;
  return v;
}

void prepare_activation_rows(const KernelTable& kernels, const ActivationRows& rows, size_t first,
                             uint32_t m, const float* x, size_t ldx) {
  for (uint32_t i = 0; i < m; ++i) {
    const size_t r = first + i;
    const float* src = x + i * ldx;
    if (rows.accuracy == QMOE_ACCURACY_EXACT) {
      // Kernels read whole chunks: the row with a zero tail.
      float* dst = rows.x + r * rows.stride;
      std::memcpy(dst, src, rows.k * sizeof(float));
      std::memset(dst + rows.k, 0, (rows.stride - rows.k) * sizeof(float));
    } else {
      kernels.quantize_activations_q8.fn(src, rows.k, rows.q + r * rows.stride,
                                         rows.scale + r * rows.chunks,
                                         rows.sum_q + r * rows.chunks);
      e2m1_starts(rows.q + r * rows.stride, rows.chunks, rows.e2m1_start + r * rows.chunks * 2);
    }
  }
}

void prepare_activation_rows_typed(const KernelTable& kernels, const ActivationRows& rows,
                                   size_t first, uint32_t m, qmoe_dtype dtype, const void* x,
                                   size_t ldx) {
  if (dtype == QMOE_DTYPE_F32) {
    prepare_activation_rows(kernels, rows, first, m, static_cast<const float*>(x), ldx);
    return;
  }
  float values[kChunkCodes];
  for (uint32_t i = 0; i < m; ++i) {
    for (uint32_t c = 0; c < rows.chunks; ++c) {
      const uint32_t k0 = c * kChunkCodes, len = std::min(kChunkCodes, rows.k - k0);
      widen_activations(kernels, dtype, activation_at(x, dtype, i * ldx + k0), values, len);
      prepare_activation_chunk(kernels, rows, first + i, c, values, len);
    }
  }
}

void prepare_activation_chunk(const KernelTable& kernels, const ActivationRows& rows, size_t row,
                              uint32_t chunk, const float* values, uint32_t len) {
  const size_t k0 = size_t{chunk} * kChunkCodes;
  if (rows.accuracy == QMOE_ACCURACY_EXACT) {
    float* dst = rows.x + row * rows.stride + k0;
    std::memcpy(dst, values, len * sizeof(float));
    std::memset(dst + len, 0, (kChunkCodes - len) * sizeof(float));
  } else {
    // The quantizer works per chunk (docs/formats.md), so one chunk at a time gives the same
    // q, scale and sum as the whole row at once.
    kernels.quantize_activations_q8.fn(values, len, rows.q + row * rows.stride + k0,
                                       rows.scale + row * rows.chunks + chunk,
                                       rows.sum_q + row * rows.chunks + chunk);
    e2m1_starts(rows.q + row * rows.stride + k0, 1,
                rows.e2m1_start + (row * rows.chunks + chunk) * 2);
  }
}

void copy_activation_row(const ActivationView& src, size_t src_row, const ActivationRows& dst,
                         size_t dst_row) {
  if (dst.accuracy == QMOE_ACCURACY_EXACT) {
    std::memcpy(dst.x + dst_row * dst.stride, src.x + src_row * src.x_stride,
                dst.stride * sizeof(float));
  } else {
    std::memcpy(dst.q + dst_row * dst.stride, src.q + src_row * src.q_stride, dst.stride);
    std::memcpy(dst.scale + dst_row * dst.chunks, src.scale + src_row * src.chunks,
                dst.chunks * sizeof(float));
    std::memcpy(dst.sum_q + dst_row * dst.chunks, src.sum_q + src_row * src.chunks,
                dst.chunks * sizeof(float));
    std::memcpy(dst.e2m1_start + dst_row * dst.chunks * 2,
                src.e2m1_start + src_row * src.chunks * 2, dst.chunks * 2 * sizeof(int32_t));
  }
}

}  // namespace qmoe
