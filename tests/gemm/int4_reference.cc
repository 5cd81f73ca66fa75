#include "tests/gemm/int4_reference.h"

#include <fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "tests/gemm/q8_reference.h"

namespace qmoe::testing {
namespace {

const char* dtype_name(qmoe_dtype d) {
  switch (d) {
    case QMOE_DTYPE_F32:
      return "f32";
    case QMOE_DTYPE_F16:
      return "f16";
    case QMOE_DTYPE_BF16:
      return "bf16";
    case QMOE_DTYPE_E8M0:
      return "e8m0";
    case QMOE_DTYPE_F8_E4M3:
      return "e4m3";
  }
  return "?";
}

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

// Round a double to the dtype and store its bits; returns the exact value stored.
double store_value(qmoe_dtype dtype, double v, unsigned char* dst) {
  switch (dtype) {
    case QMOE_DTYPE_F32: {
      const float f = static_cast<float>(v);
      std::memcpy(dst, &f, 4);
      return f;
    }
    case QMOE_DTYPE_F16: {
      const uint16_t h = fp16_ieee_from_fp32_value(static_cast<float>(v));
      std::memcpy(dst, &h, 2);
      return fp16_ieee_to_fp32_value(h);
    }
    case QMOE_DTYPE_BF16: {
      // Truncate a float to its top 16 bits: a real BF16 pattern, exactly representable.
      const float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      const uint16_t b = static_cast<uint16_t>(bits >> 16);
      std::memcpy(dst, &b, 2);
      const uint32_t back = uint32_t{b} << 16;
      float out;
      std::memcpy(&out, &back, 4);
      return out;
    }
    case QMOE_DTYPE_E8M0:  // not an INT4 scale type
    case QMOE_DTYPE_F8_E4M3:
      break;
  }
  return 0;
}

size_t elem_size(qmoe_dtype d) {
  return d == QMOE_DTYPE_F32 ? 4 : 2;
}

// Strides for a plane of n rows x blocks, and its element count.
// Strides of a plane in `order`; element (n, b) at plane_offset(n, b, ...); `elements` is the
// plane's extent.
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

size_t plane_offset(uint32_t n, uint32_t b, size_t row_stride, size_t block_stride,
                    size_t group_stride) {
  const size_t row =
      group_stride == 0 ? n * row_stride : (n / 8) * group_stride + (n % 8) * row_stride;
  return row + b * block_stride;
}

}  // namespace

std::string Int4Options::describe() const {
  std::ostringstream s;
  s << "n=" << n << " k=" << k << " block=" << block_size << " scales=" << dtype_name(scale_dtype)
    << "/" << order_name(scale_order);
  if (zero_points) s << " zero_points/" << order_name(zero_point_order);
  if (bias) s << " bias=" << dtype_name(bias_dtype);
  return s.str();
}

size_t canonical_byte(uint32_t n, uint32_t k, uint32_t k_total) {
  const size_t chunks = (k_total + 31) / 32;
  return ((n / 8) * chunks + k / 32) * 128 + (n % 8) * 16 + (k % 16);
}

double Int4Matrix::weight(uint32_t n, uint32_t k) const {
  const uint32_t blocks = options.k / options.block_size;
  const uint32_t b = k / options.block_size;
  return (static_cast<double>(code_values[size_t{n} * options.k + k]) -
          zero_values[size_t{n} * blocks + b]) *
         scale_values[size_t{n} * blocks + b];
}

Int4Options grouped_int4_options(uint32_t n, uint32_t k, bool zero_points, bool bias) {
  Int4Options o;
  o.n = n;
  o.k = k;
  o.block_size = 32;
  o.scale_dtype = QMOE_DTYPE_F16;
  o.scale_order = ScaleOrder::kGrouped;
  o.zero_points = zero_points;
  o.bias = bias;
  return o;
}

std::vector<Int4Options> benchmark_gemm_shapes() {
  return {grouped_int4_options(1536, 2048), grouped_int4_options(2048, 768),
          grouped_int4_options(5760, 2880, false, true)};
}

Int4Options random_int4_options(std::mt19937_64& rng, uint32_t max_k) {
  const uint32_t block_sizes[] = {16, 32, 64, 128};
  const qmoe_dtype dtypes[] = {QMOE_DTYPE_F16, QMOE_DTYPE_BF16, QMOE_DTYPE_F32};
  const ScaleOrder orders[] = {ScaleOrder::kBlockMajor, ScaleOrder::kRowMajor,
                               ScaleOrder::kPaddedRowMajor, ScaleOrder::kGrouped};
  Int4Options o;
  o.block_size = block_sizes[rng() % 4];
  o.k = o.block_size * static_cast<uint32_t>(1 + rng() % (max_k / o.block_size));
  o.n = static_cast<uint32_t>(1 + rng() % 70);
  o.scale_dtype = dtypes[rng() % 3];
  o.scale_order = orders[rng() % 4];
  o.zero_points = rng() % 2;
  o.zero_point_order = orders[rng() % 4];
  o.bias = rng() % 2;
  o.bias_dtype = dtypes[rng() % 3];
  return o;
}

Int4Matrix make_int4_matrix(const Int4Options& o, std::mt19937_64& rng) {
  Int4Matrix w;
  w.options = o;
  const uint32_t blocks = o.k / o.block_size;
  std::uniform_int_distribution<int> code(0, 15);
  std::uniform_real_distribution<double> mag(0.002, 0.05);

  w.code_values.resize(size_t{o.n} * o.k);
  for (auto& c : w.code_values) c = static_cast<uint8_t>(code(rng));
  const size_t groups = (o.n + 7) / 8, chunks = (o.k + 31) / 32;
  w.codes.assign(groups * chunks * 128, 0);
  for (uint32_t n = 0; n < o.n; ++n) {
    for (uint32_t k = 0; k < o.k; ++k) {
      const uint8_t c = w.code_values[size_t{n} * o.k + k];
      uint8_t& byte = w.codes[canonical_byte(n, k, o.k)];
      byte |= (k % 32) < 16 ? c : static_cast<uint8_t>(c << 4);
    }
  }

  size_t rs = 0, bs = 0, gs = 0, count = 0;
  plane_strides(o.scale_order, o.n, blocks, &rs, &bs, &gs, &count);
  w.scales.assign(count * elem_size(o.scale_dtype), 0xEE);
  w.scale_values.resize(size_t{o.n} * blocks);
  for (uint32_t n = 0; n < o.n; ++n) {
    for (uint32_t b = 0; b < blocks; ++b) {
      const double v = (rng() & 1 ? -1.0 : 1.0) * mag(rng);
      w.scale_values[size_t{n} * blocks + b] =
          store_value(o.scale_dtype, v,
                      w.scales.data() + plane_offset(n, b, rs, bs, gs) * elem_size(o.scale_dtype));
    }
  }
  w.desc.struct_size = sizeof(w.desc);
  w.desc.format = QMOE_WEIGHT_FORMAT_INT4;
  w.desc.n = o.n;
  w.desc.k = o.k;
  w.desc.block_size = o.block_size;
  w.desc.codes = w.codes.data();
  w.desc.scale_dtype = o.scale_dtype;
  w.desc.scales = w.scales.data();
  w.desc.scale_row_stride = rs;
  w.desc.scale_block_stride = bs;
  w.desc.scale_group_stride = gs;

  w.zero_values.assign(size_t{o.n} * blocks, 8);
  if (o.zero_points) {
    plane_strides(o.zero_point_order, o.n, blocks, &rs, &bs, &gs, &count);
    w.zero_points.assign(count, 0xEE);
    for (uint32_t n = 0; n < o.n; ++n) {
      for (uint32_t b = 0; b < blocks; ++b) {
        const uint8_t z = static_cast<uint8_t>(code(rng));
        w.zero_values[size_t{n} * blocks + b] = z;
        w.zero_points[plane_offset(n, b, rs, bs, gs)] = z;
      }
    }
    w.desc.zero_points = w.zero_points.data();
    w.desc.zero_point_row_stride = rs;
    w.desc.zero_point_block_stride = bs;
    w.desc.zero_point_group_stride = gs;
  }

  w.bias_values.assign(o.n, 0.0);
  if (o.bias) {
    w.bias.assign(size_t{o.n} * elem_size(o.bias_dtype), 0);
    std::uniform_real_distribution<double> bias(-2.0, 2.0);
    for (uint32_t n = 0; n < o.n; ++n) {
      w.bias_values[n] =
          store_value(o.bias_dtype, bias(rng), w.bias.data() + n * elem_size(o.bias_dtype));
    }
    w.desc.bias_dtype = o.bias_dtype;
    w.desc.bias = w.bias.data();
  }
  return w;
}

Reference reference_gemm(const Int4Matrix& w, const std::vector<float>& x, uint32_t m) {
  const uint32_t n_total = w.options.n, k_total = w.options.k;
  Reference ref;
  ref.y.assign(size_t{m} * n_total, 0.0);
  ref.abs_sum.assign(size_t{m} * n_total, 0.0);
  ref.fast_bound.assign(size_t{m} * n_total, 0.0);
  for (uint32_t i = 0; i < m; ++i) {
    const float* xr = x.data() + size_t{i} * k_total;
    const std::vector<double> half_step = q8_half_steps(xr, k_total);
    for (uint32_t n = 0; n < n_total; ++n) {
      const auto [y, abs_sum, quant] = reference_row_sums(
          xr, half_step, k_total, [&](size_t k) { return w.weight(n, static_cast<uint32_t>(k)); });
      const size_t o = size_t{i} * n_total + n;
      ref.y[o] = y + w.bias_values[n];
      ref.abs_sum[o] = abs_sum;
      // Documented fast-level bound: the activation rounding, plus the exact level's tolerance
      // for FP32 accumulation.
      ref.fast_bound[o] = quant + 1e-5 * (abs_sum + quant);
    }
  }
  return ref;
}

std::vector<float> random_activations(uint32_t m, uint32_t k, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(size_t{m} * k);
  for (auto& v : x) v = normal(rng);
  // Some outliers and exact zeros, as real activations have.
  for (size_t i = 0; i < x.size(); i += 97) x[i] *= 20.0f;
  for (size_t i = 5; i < x.size(); i += 61) x[i] = 0.0f;
  return x;
}

}  // namespace qmoe::testing
