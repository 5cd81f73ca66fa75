#include "tests/cuda/cuda_test_util.h"

#include <fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "tests/cpu/isa_test_util.h"

namespace qmoe::testing {

std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA device: cudaGetDeviceCount failed with ") +
           cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
  }
  if (count == 0) return "no usable CUDA device: cudaGetDeviceCount reports 0 devices";
  return "";
}

DeviceBuffer::DeviceBuffer(size_t bytes) {
  if (cudaMalloc(&data_, bytes == 0 ? 1 : bytes) != cudaSuccess) {
    data_ = nullptr;
    cudaGetLastError();
    ADD_FAILURE() << "cudaMalloc of " << bytes << " bytes failed";
    return;
  }
  bytes_ = bytes;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

bool DeviceBuffer::upload(const void* src, size_t bytes, size_t offset) {
  if (bytes == 0) return true;
  if (data_ == nullptr || offset + bytes > bytes_) return false;
  return cudaMemcpy(static_cast<char*>(data_) + offset, src, bytes, cudaMemcpyHostToDevice) ==
         cudaSuccess;
}

bool DeviceBuffer::download(void* dst, size_t bytes, size_t offset) const {
  if (bytes == 0) return true;
  if (data_ == nullptr || offset + bytes > bytes_) return false;
  return cudaMemcpy(dst, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost) ==
         cudaSuccess;
}

bool DeviceBuffer::fill(int byte) {
  return data_ != nullptr && cudaMemset(data_, byte, bytes_) == cudaSuccess;
}

std::unique_ptr<DeviceInt4Matrix> upload_matrix(const Int4Matrix& w) {
  auto d = std::make_unique<DeviceInt4Matrix>();
  const qmoe_quant_matrix& h = w.desc;
  d->codes = to_device(w.codes);
  d->scales = to_device(w.scales);
  cuda::DeviceQuantMatrix& m = d->desc;
  m.n = h.n;
  m.k = h.k;
  m.block_size = h.block_size;
  m.chunks = (h.k + 31) / 32;
  m.codes = d->codes.as<const uint8_t>();
  m.scale_dtype = h.scale_dtype;
  m.scales = d->scales.data();
  m.format = h.format;
  m.global_scale = 1.0f;
  m.scale_row_stride = h.scale_row_stride;
  m.scale_block_stride = h.scale_block_stride;
  m.scale_group_stride = h.scale_group_stride;
  if (h.zero_points != nullptr) {
    d->zero_points = to_device(w.zero_points);
    m.zero_points = d->zero_points.as<const uint8_t>();
    m.zero_point_row_stride = h.zero_point_row_stride;
    m.zero_point_block_stride = h.zero_point_block_stride;
    m.zero_point_group_stride = h.zero_point_group_stride;
  }
  if (h.bias != nullptr) {
    d->bias = to_device(w.bias);
    m.bias_dtype = h.bias_dtype;
    m.bias = d->bias.data();
  } else {
    m.bias_dtype = QMOE_DTYPE_F32;
  }
  return d;
}

namespace {

// The planes every format has (codes, scales, bias), the description pointing at them.
template <class Matrix>
std::unique_ptr<DeviceAbiMatrix> upload_planes(const Matrix& w) {
  auto d = std::make_unique<DeviceAbiMatrix>();
  d->codes = to_device(w.codes);
  d->scales = to_device(w.scales);
  d->desc = w.desc;
  d->desc.codes = d->codes.data();
  d->desc.scales = d->scales.data();
  if (w.desc.bias != nullptr) {
    d->bias = to_device(w.bias);
    d->desc.bias = d->bias.data();
  }
  return d;
}

}  // namespace

std::unique_ptr<DeviceAbiMatrix> upload_abi_matrix(const Int4Matrix& w) {
  std::unique_ptr<DeviceAbiMatrix> d = upload_planes(w);
  if (w.desc.zero_points != nullptr) {
    d->zero_points = to_device(w.zero_points);
    d->desc.zero_points = d->zero_points.as<const uint8_t>();
  }
  return d;
}

std::unique_ptr<DeviceAbiMatrix> upload_abi_matrix(const Fp4Matrix& w) {
  return upload_planes(w);
}

void CudaAbiTest::SetUp() {
  QMOE_SKIP_WITHOUT_CUDA();
  seed_ = fresh_seed();
  rng_.seed(seed_);
  ASSERT_EQ(qmoe_context_create(nullptr, &ctx_), QMOE_STATUS_OK);
}

void CudaAbiTest::TearDown() {
  if (ctx_ != nullptr) qmoe_context_destroy(ctx_);
  if (HasFailure()) std::printf("seed %llu\n", static_cast<unsigned long long>(seed_));
}

Int4Options tail_variant_options(uint32_t n, uint32_t k, uint32_t block_size, int v, bool bias) {
  const qmoe_dtype dtypes[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
  const ScaleOrder orders[] = {ScaleOrder::kRowMajor, ScaleOrder::kBlockMajor,
                               ScaleOrder::kPaddedRowMajor, ScaleOrder::kGrouped};
  Int4Options o;
  o.n = n;
  o.k = k;
  o.block_size = block_size;
  o.scale_dtype = dtypes[v % 3];
  o.scale_order = orders[v % 4];
  o.zero_points = v % 2 == 1;
  o.zero_point_order = orders[(v + 1) % 4];
  o.bias = bias;
  o.bias_dtype = dtypes[(v + 2) % 3];
  return o;
}

Int4Matrix integer_part_matrix(uint32_t block_size, int v, Int4MatrixMaker make_matrix,
                               std::mt19937_64& rng) {
  const qmoe_dtype dtypes[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
  const ScaleOrder orders[] = {ScaleOrder::kRowMajor, ScaleOrder::kBlockMajor,
                               ScaleOrder::kGrouped};
  Int4Options o;
  o.block_size = block_size;
  o.n = 11 + v;
  o.k = block_size == 16 ? 16 * (3 + 2 * v) : block_size * (1 + v % 3);
  o.scale_dtype = dtypes[v % 3];
  o.scale_order = orders[v % 3];
  o.zero_points = v % 2 == 0;
  Int4Matrix w = make_matrix(o, rng);
  set_power_of_two_scales(&w, rng);
  return w;
}

void set_power_of_two_scales(Int4Matrix* w, std::mt19937_64& rng) {
  const Int4Options& o = w->options;
  const qmoe_quant_matrix& d = w->desc;
  const uint32_t blocks = o.k / o.block_size;
  const size_t es = dtype_size(o.scale_dtype);
  for (uint32_t n = 0; n < o.n; ++n) {
    for (uint32_t b = 0; b < blocks; ++b) {
      const float s = std::ldexp(rng() % 2 ? -1.0f : 1.0f, static_cast<int>(rng() % 3) - 1);
      w->scale_values[size_t{n} * blocks + b] = s;
      const size_t row = d.scale_group_stride == 0
                             ? n * d.scale_row_stride
                             : (n / 8) * d.scale_group_stride + (n % 8) * d.scale_row_stride;
      const std::vector<unsigned char> bits = to_dtype(o.scale_dtype, {s});
      std::memcpy(w->scales.data() + (row + b * d.scale_block_stride) * es, bits.data(), es);
    }
  }
}

std::vector<float> integer_part_activations(uint32_t m, uint32_t k, std::mt19937_64& rng) {
  std::vector<float> x(size_t{m} * k);
  for (uint32_t i = 0; i < m; ++i) {
    for (uint32_t c = 0; c * 32 < k; ++c) {
      const uint32_t k1 = std::min(k, c * 32 + 32);
      for (uint32_t j = c * 32; j < k1; ++j) {
        x[size_t{i} * k + j] = static_cast<float>(static_cast<int>(rng() % 507) - 253) / 2;
      }
      x[size_t{i} * k + c * 32 + rng() % (k1 - c * 32)] = rng() % 2 ? 127.0f : -127.0f;
    }
  }
  return x;
}

double integer_parts_output(const Int4Matrix& w, const float* x, uint32_t n, qmoe_accuracy level) {
  double want = w.bias_values[n];
  for (uint32_t j = 0; j < w.options.k; ++j) {
    const double xv = x[j];
    const double q = level == QMOE_ACCURACY_FAST ? std::nearbyint(xv) : xv;
    want += q * w.weight(n, j);
  }
  return want;
}

std::vector<unsigned char> to_dtype(qmoe_dtype d, const std::vector<float>& v) {
  std::vector<unsigned char> out(v.size() * dtype_size(d));
  for (size_t i = 0; i < v.size(); ++i) {
    if (d == QMOE_DTYPE_F32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
      continue;
    }
    uint16_t bits;
    if (d == QMOE_DTYPE_F16) {
      bits = fp16_ieee_from_fp32_value(v[i]);
    } else {
      uint32_t x;
      std::memcpy(&x, &v[i], 4);
      bits = static_cast<uint16_t>((x + 0x7FFF + ((x >> 16) & 1)) >> 16);  // finite inputs
    }
    std::memcpy(out.data() + 2 * i, &bits, 2);
  }
  return out;
}

std::vector<float> from_dtype(qmoe_dtype d, const std::vector<unsigned char>& bytes) {
  const size_t n = bytes.size() / dtype_size(d);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (d == QMOE_DTYPE_F32) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
      continue;
    }
    uint16_t bits;
    std::memcpy(&bits, bytes.data() + 2 * i, 2);
    if (d == QMOE_DTYPE_F16) {
      out[i] = fp16_ieee_to_fp32_value(bits);
    } else {
      const uint32_t x = uint32_t{bits} << 16;
      std::memcpy(&out[i], &x, 4);
    }
  }
  return out;
}

const char* dtype_label(qmoe_dtype d) {
  return d == QMOE_DTYPE_F32 ? "f32" : d == QMOE_DTYPE_F16 ? "f16" : "bf16";
}

}  // namespace qmoe::testing
