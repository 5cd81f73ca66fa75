#include "tests/cuda/cuda_test_util.h"

#include <fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>

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

namespace {

template <typename V>
DeviceBuffer upload_vector(const std::vector<V>& v) {
  DeviceBuffer b(v.size() * sizeof(V));
  EXPECT_TRUE(b.upload(v.data(), v.size() * sizeof(V))) << "cudaMemcpy of a plane failed";
  return b;
}

}  // namespace

std::unique_ptr<DeviceInt4Matrix> upload_matrix(const Int4Matrix& w) {
  auto d = std::make_unique<DeviceInt4Matrix>();
  const qmoe_quant_matrix& h = w.desc;
  d->codes = upload_vector(w.codes);
  d->scales = upload_vector(w.scales);
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
    d->zero_points = upload_vector(w.zero_points);
    m.zero_points = d->zero_points.as<const uint8_t>();
    m.zero_point_row_stride = h.zero_point_row_stride;
    m.zero_point_block_stride = h.zero_point_block_stride;
    m.zero_point_group_stride = h.zero_point_group_stride;
  }
  if (h.bias != nullptr) {
    d->bias = upload_vector(w.bias);
    m.bias_dtype = h.bias_dtype;
    m.bias = d->bias.data();
  } else {
    m.bias_dtype = QMOE_DTYPE_F32;
  }
  return d;
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
