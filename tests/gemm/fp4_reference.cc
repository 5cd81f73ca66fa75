#include "tests/gemm/fp4_reference.h"

#include <fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "tests/gemm/q8_reference.h"

namespace qmoe::testing {
namespace {

const char* order_name(ScaleOrder o) {
  switch (o) {
    case ScaleOrder::kRowMajor:
      return "row-major";
    case ScaleOrder::kBlockMajor:
      return "block-major";
    case ScaleOrder::kPaddedRowMajor:
      return "padded-row-major";
    case ScaleOrder::kGrouped:
      return "grouped";
  }
  return "?";
}

// Strides of a plane in `order` and its extent in elements.
void plane_strides(ScaleOrder order, uint32_t n, uint32_t blocks, size_t* row_stride,
                   size_t* block_stride, size_t* group_stride, size_t* elements) {
  *group_stride = 0;
  switch (order) {
    case ScaleOrder::kRowMajor:
      *row_stride = blocks;
      *block_stride = 1;
      break;
    case ScaleOrder::kBlockMajor:
      *row_stride = 1;
      *block_stride = n;
      break;
    case ScaleOrder::kPaddedRowMajor:
      *row_stride = blocks + 3;
      *block_stride = 1;
      break;
    case ScaleOrder::kGrouped:
      *row_stride = 1;
      *block_stride = 8;
      *group_stride = size_t{8} * blocks;
      *elements = (size_t{n} + 7) / 8 * *group_stride;
      return;
  }
  *elements = (n - 1) * *row_stride + (blocks - 1) * *block_stride + 1;
}

size_t plane_offset(const qmoe_quant_matrix& d, uint32_t n, uint32_t b) {
  const size_t row = d.scale_group_stride == 0
                         ? n * d.scale_row_stride
                         : (n / 8) * d.scale_group_stride + (n % 8) * d.scale_row_stride;
  return row + b * d.scale_block_stride;
}

}  // namespace

double e2m1_value(uint8_t code) {
  const double sign = (code & 0x8) != 0 ? -1.0 : 1.0;
  const int exponent = (code >> 1) & 0x3;
  const int mantissa = code & 0x1;
  if (exponent == 0) return sign * mantissa * 0.5;  // 2^(1 - bias) * m / 2
  return sign * std::ldexp(1.0 + mantissa * 0.5, exponent - 1);
}

double e8m0_value(uint8_t e) {
  if (e == 0xFF) return std::numeric_limits<double>::quiet_NaN();
  return std::ldexp(1.0, static_cast<int>(e) - 127);
}

double e4m3_value(uint8_t b) {
  const double sign = (b & 0x80) != 0 ? -1.0 : 1.0;
  const int exponent = (b >> 3) & 0xF;
  const int mantissa = b & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<double>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(mantissa / 8.0, -6);
  return sign * std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
}

uint32_t fp4_block_size(qmoe_weight_format format) {
  return format == QMOE_WEIGHT_FORMAT_NVFP4 ? 16 : 32;
}
qmoe_dtype fp4_scale_dtype(qmoe_weight_format format) {
  return format == QMOE_WEIGHT_FORMAT_NVFP4 ? QMOE_DTYPE_F8_E4M3 : QMOE_DTYPE_E8M0;
}
const char* fp4_format_name(qmoe_weight_format format) {
  return format == QMOE_WEIGHT_FORMAT_NVFP4 ? "nvfp4" : "mxfp4";
}

std::string Fp4Options::describe() const {
  std::ostringstream s;
  s << fp4_format_name(format) << " n=" << n << " k=" << k << " scales=" << order_name(scale_order);
  if (bias)
    s << " bias="
      << (bias_dtype == QMOE_DTYPE_F32   ? "f32"
          : bias_dtype == QMOE_DTYPE_F16 ? "f16"
                                         : "bf16");
  if (global_scale != 0.0f) s << " global_scale=" << global_scale;
  return s.str();
}

double Fp4Matrix::weight(uint32_t n, uint32_t k) const {
  const uint32_t block = fp4_block_size(options.format);
  const uint32_t blocks = options.k / block;
  const uint8_t s = scale_bytes[size_t{n} * blocks + k / block];
  const double scale = options.format == QMOE_WEIGHT_FORMAT_NVFP4 ? e4m3_value(s) : e8m0_value(s);
  const double global = options.global_scale == 0.0f ? 1.0 : options.global_scale;
  return e2m1_value(code_values[size_t{n} * options.k + k]) * scale * global;
}

void Fp4Matrix::set_scale(uint32_t n, uint32_t b, uint8_t byte) {
  const uint32_t blocks = options.k / fp4_block_size(options.format);
  scale_bytes[size_t{n} * blocks + b] = byte;
  scales[plane_offset(desc, n, b)] = byte;
}

void Fp4Matrix::set_code(uint32_t n, uint32_t k, uint8_t code) {
  code_values[size_t{n} * options.k + k] = code;
  uint8_t& byte = codes[canonical_byte(n, k, options.k)];
  byte = (k % 32) < 16 ? static_cast<uint8_t>((byte & 0xF0) | code)
                       : static_cast<uint8_t>((byte & 0x0F) | code << 4);
}

Fp4Options random_fp4_options(std::mt19937_64& rng, uint32_t max_k) {
  const ScaleOrder orders[] = {ScaleOrder::kBlockMajor, ScaleOrder::kRowMajor,
                               ScaleOrder::kPaddedRowMajor, ScaleOrder::kGrouped};
  const qmoe_dtype dtypes[] = {QMOE_DTYPE_F16, QMOE_DTYPE_BF16, QMOE_DTYPE_F32};
  Fp4Options o;
  o.format = rng() % 2 ? QMOE_WEIGHT_FORMAT_NVFP4 : QMOE_WEIGHT_FORMAT_MXFP4;
  const uint32_t block = fp4_block_size(o.format);
  o.k = block * static_cast<uint32_t>(1 + rng() % (max_k / block));
  o.n = static_cast<uint32_t>(1 + rng() % 70);
  o.scale_order = orders[rng() % 4];
  o.bias = rng() % 2;
  o.bias_dtype = dtypes[rng() % 3];
  if (o.format == QMOE_WEIGHT_FORMAT_NVFP4 && rng() % 2) {
    o.global_scale = static_cast<float>(
        std::ldexp(1.0 + (rng() % 1000) / 1000.0, static_cast<int>(rng() % 16) - 12));
  }
  return o;
}

Fp4Matrix make_fp4_matrix(const Fp4Options& o, std::mt19937_64& rng) {
  Fp4Matrix w;
  w.options = o;
  const uint32_t block = fp4_block_size(o.format);
  const uint32_t blocks = o.k / block;
  std::uniform_int_distribution<int> code(0, 15);

  w.code_values.resize(size_t{o.n} * o.k);
  for (auto& c : w.code_values) c = static_cast<uint8_t>(code(rng));
  const size_t groups = (o.n + 7) / 8, chunks = (o.k + 31) / 32;
  w.codes.assign(groups * chunks * 128, 0);
  for (uint32_t n = 0; n < o.n; ++n) {
    for (uint32_t k = 0; k < o.k; ++k) {
      const uint8_t c = w.code_values[size_t{n} * o.k + k];
      w.codes[canonical_byte(n, k, o.k)] |= (k % 32) < 16 ? c : static_cast<uint8_t>(c << 4);
    }
  }

  w.desc.struct_size = sizeof(w.desc);
  w.desc.format = o.format;
  w.desc.n = o.n;
  w.desc.k = o.k;
  w.desc.block_size = block;
  w.desc.codes = w.codes.data();
  w.desc.scale_dtype = fp4_scale_dtype(o.format);
  size_t count = 0;
  plane_strides(o.scale_order, o.n, blocks, &w.desc.scale_row_stride, &w.desc.scale_block_stride,
                &w.desc.scale_group_stride, &count);
  w.scales.assign(count, 0xEE);  // unused elements: a NaN-free byte the kernels must not read
  w.scale_bytes.resize(size_t{o.n} * blocks);
  for (uint32_t n = 0; n < o.n; ++n) {
    for (uint32_t b = 0; b < blocks; ++b) {
      uint8_t byte;
      if (o.format == QMOE_WEIGHT_FORMAT_MXFP4) {
        byte = static_cast<uint8_t>(117 + rng() % 14);  // 2^-10 .. 2^3
      } else {
        byte = static_cast<uint8_t>(1 + rng() % 0x6E);  // subnormal to 2^7 (0x01 .. 0x6E)
        if (rng() % 8 == 0) byte |= 0x80;               // a negative scale now and then
      }
      w.set_scale(n, b, byte);
    }
  }
  w.desc.scales = w.scales.data();
  w.desc.global_scale = o.global_scale;

  w.bias_values.assign(o.n, 0.0);
  if (o.bias) {
    const size_t size = o.bias_dtype == QMOE_DTYPE_F32 ? 4 : 2;
    w.bias.assign(size_t{o.n} * size, 0);
    std::uniform_real_distribution<float> bias(-2.0f, 2.0f);
    for (uint32_t n = 0; n < o.n; ++n) {
      const float v = bias(rng);
      unsigned char* dst = w.bias.data() + n * size;
      if (o.bias_dtype == QMOE_DTYPE_F32) {
        std::memcpy(dst, &v, 4);
        w.bias_values[n] = v;
      } else if (o.bias_dtype == QMOE_DTYPE_F16) {
        const uint16_t h = fp16_ieee_from_fp32_value(v);
        std::memcpy(dst, &h, 2);
        w.bias_values[n] = fp16_ieee_to_fp32_value(h);
      } else {
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        const uint16_t b16 = static_cast<uint16_t>(bits >> 16);
        std::memcpy(dst, &b16, 2);
        const uint32_t back = uint32_t{b16} << 16;
        float f;
        std::memcpy(&f, &back, 4);
        w.bias_values[n] = f;
      }
    }
    w.desc.bias_dtype = o.bias_dtype;
    w.desc.bias = w.bias.data();
  }
  return w;
}

Fp4Reference reference_gemm(const Fp4Matrix& w, const std::vector<float>& x, uint32_t m) {
  const uint32_t n_total = w.options.n, k_total = w.options.k;
  Fp4Reference ref;
  ref.y.assign(size_t{m} * n_total, 0.0);
  ref.abs_sum.assign(size_t{m} * n_total, 0.0);
  ref.exact_tol.assign(size_t{m} * n_total, 0.0);
  ref.fast_tol.assign(size_t{m} * n_total, 0.0);
  for (uint32_t i = 0; i < m; ++i) {
    const float* xr = x.data() + size_t{i} * k_total;
    const std::vector<double> half_step = q8_half_steps(xr, k_total);
    for (uint32_t n = 0; n < n_total; ++n) {
      const auto [y, abs_sum, quant] = reference_row_sums(
          xr, half_step, k_total, [&](size_t k) { return w.weight(n, static_cast<uint32_t>(k)); });
      const size_t o = size_t{i} * n_total + n;
      ref.y[o] = y + w.bias_values[n];
      ref.abs_sum[o] = abs_sum;
      const double output_rounding = 0x1p-23 * std::fabs(ref.y[o]);
      ref.exact_tol[o] = 1e-5 * abs_sum + output_rounding;
      ref.fast_tol[o] = quant + 1e-5 * (abs_sum + quant) + output_rounding;
    }
  }
  return ref;
}

}  // namespace qmoe::testing
