#include "lib/gemm/group_panels.h"

#include <algorithm>

#include <cstring>

#include "lib/formats/byte_scales.h"
#include "lib/formats/quant_matrix.h"
#include "lib/formats/tiles.h"

namespace qmoe {
namespace {

float load_element(qmoe_dtype dtype, const void* base, size_t index, const KernelTable& kernels) {
  float value;
  switch (dtype) {
    case QMOE_DTYPE_F16:
      kernels.convert_f16_to_f32.fn(static_cast<const uint16_t*>(base) + index, &value, 1);
      return value;
    case QMOE_DTYPE_BF16:
      kernels.convert_bf16_to_f32.fn(static_cast<const uint16_t*>(base) + index, &value, 1);
      return value;
    case QMOE_DTYPE_F32:
    case QMOE_DTYPE_E8M0:  // scales only: never a bias (validate_quant_matrix)
    case QMOE_DTYPE_F8_E4M3:
      break;
  }
  return static_cast<const float*>(base)[index];
}

}  // namespace

size_t panel_elements(const GemmPlan& plan) {
  return size_t{plan.panel_blocks} * kGroupRows;
}

void build_group_panels(const GemmPlan& plan, const KernelTable& kernels, uint32_t n0,
                        uint32_t rows, uint32_t blocks, float* scales, uint16_t* staging,
                        uint8_t* zero_points) {
  // Gather raw elements into [block][8] order first (plain copies, reading each row's run in
  // order), then widen the whole panel with one call of the tier's conversion kernel: a
  // per-element conversion call would cost more than the group's GEMM.
  const qmoe_quant_matrix& w = plan.w;
  const uint32_t real_blocks = w.k / w.block_size;
  const size_t panel = size_t{blocks} * kGroupRows;
  if (w.scale_dtype == QMOE_DTYPE_E8M0 || w.scale_dtype == QMOE_DTYPE_F8_E4M3) {
    // One-byte scales: each byte's FP32 bits from its table (NaN bytes give NaN scales).
    const ByteScaleBits& table = w.scale_dtype == QMOE_DTYPE_E8M0 ? kE8M0Bits : kE4M3Bits;
    const auto* src = static_cast<const uint8_t*>(w.scales);
    std::fill(scales, scales + panel, 0.0f);
    for (uint32_t r = 0; r < rows; ++r) {
      const uint8_t* row = src + plane_row_offset(n0 + r, w.scale_row_stride, w.scale_group_stride);
      for (uint32_t b = 0; b < real_blocks; ++b) {
        std::memcpy(&scales[b * kGroupRows + r], &table.bits[row[b * w.scale_block_stride]],
                    sizeof(float));
      }
    }
  } else if (w.scale_dtype == QMOE_DTYPE_F32) {
    const auto* src = static_cast<const float*>(w.scales);
    std::fill(scales, scales + panel, 0.0f);
    for (uint32_t r = 0; r < rows; ++r) {
      const float* row = src + plane_row_offset(n0 + r, w.scale_row_stride, w.scale_group_stride);
      for (uint32_t b = 0; b < real_blocks; ++b) {
        scales[b * kGroupRows + r] = row[b * w.scale_block_stride];
      }
    }
  } else {
    uint16_t* bits = staging;
    std::fill(bits, bits + panel, uint16_t{0});
    const auto* src = static_cast<const uint16_t*>(w.scales);
    for (uint32_t r = 0; r < rows; ++r) {
      const uint16_t* row =
          src + plane_row_offset(n0 + r, w.scale_row_stride, w.scale_group_stride);
      for (uint32_t b = 0; b < real_blocks; ++b) {
        bits[b * kGroupRows + r] = row[b * w.scale_block_stride];
      }
    }
    if (w.scale_dtype == QMOE_DTYPE_F16) {
      kernels.convert_f16_to_f32.fn(bits, scales, panel);
    } else {
      kernels.convert_bf16_to_f32.fn(bits, scales, panel);
    }
  }
  if (zero_points != nullptr) {
    std::fill(zero_points, zero_points + panel,
              static_cast<uint8_t>(plan.format->default_zero_point));
    for (uint32_t r = 0; r < rows; ++r) {
      const uint8_t* row = w.zero_points + plane_row_offset(n0 + r, w.zero_point_row_stride,
                                                            w.zero_point_group_stride);
      for (uint32_t b = 0; b < real_blocks; ++b) {
        zero_points[b * kGroupRows + r] = row[b * w.zero_point_block_stride];
      }
    }
  }
}

void load_bias(const qmoe_quant_matrix& w, const KernelTable& kernels, uint32_t n0, uint32_t rows,
               float bias[8]) {
  for (uint32_t r = 0; r < kGroupRows; ++r) {
    bias[r] = r < rows ? load_element(w.bias_dtype, w.bias, n0 + r, kernels) : 0.0f;
  }
}

}  // namespace qmoe
