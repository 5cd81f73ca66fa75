#include "tests/cuda/layer_call_util.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "tests/cuda/layer_output_check.h"

namespace qmoe::testing {

LayerBuffers::LayerBuffers(qmoe_dtype d, uint32_t cap, uint32_t h, uint32_t e, uint32_t k_,
                           size_t ws)
    : dtype(d),
      capacity(cap),
      hidden(h),
      experts(e),
      k(k_),
      ldx(h + 3),
      ldy(h + 5),
      workspace_bytes(ws),
      d_m(sizeof(uint32_t)),
      d_x(size_t{cap} * ldx * dtype_size(d)),
      d_y((2 * kGuard + size_t{cap} * ldy) * dtype_size(d)),
      d_ids(size_t{cap} * k_ * sizeof(int32_t)),
      d_weights(size_t{cap} * k_ * sizeof(float)),
      d_logits(size_t{cap} * e * dtype_size(d)),
      d_workspace(ws) {}

void LayerBuffers::write(uint32_t m, const std::vector<float>& x, const std::vector<float>& y0,
                         bool accumulate, const std::vector<int32_t>& ids,
                         const std::vector<float>& weights, const std::vector<float>& logits) {
  const size_t es = dtype_size(dtype);
  const uint32_t rows = std::min(m, capacity);
  ASSERT_TRUE(d_m.upload(&m, sizeof m));
  std::vector<float> xs(size_t{capacity} * ldx, 0.0f);
  for (uint32_t t = 0; t < rows; ++t) {
    std::copy_n(x.begin() + size_t{t} * hidden, hidden, xs.begin() + size_t{t} * ldx);
  }
  const std::vector<unsigned char> xb = to_dtype(dtype, xs);
  ASSERT_TRUE(d_x.upload(xb.data(), xb.size()));
  ASSERT_TRUE(d_y.fill(kPoison));
  if (accumulate) {
    for (uint32_t t = 0; t < rows; ++t) {
      const std::vector<float> row(y0.begin() + size_t{t} * hidden,
                                   y0.begin() + size_t{t + 1} * hidden);
      const std::vector<unsigned char> rb = to_dtype(dtype, row);
      ASSERT_TRUE(d_y.upload(rb.data(), rb.size(), (kGuard + size_t{t} * ldy) * es));
    }
  }
  if (!logits.empty()) {
    const std::vector<unsigned char> lb = to_dtype(dtype, logits);
    ASSERT_TRUE(d_logits.upload(lb.data(), std::min(lb.size(), d_logits.bytes())));
  }
  ASSERT_TRUE(d_ids.upload(ids.data(), std::min(ids.size() * sizeof(int32_t), d_ids.bytes())));
  ASSERT_TRUE(d_weights.upload(weights.data(),
                               std::min(weights.size() * sizeof(float), d_weights.bytes())));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

std::vector<unsigned char> LayerBuffers::read_y() const {
  std::vector<unsigned char> out(d_y.bytes());
  EXPECT_TRUE(d_y.download(out.data(), out.size()));
  return out;
}

double LayerBuffers::y_at(const std::vector<unsigned char>& yb, uint32_t t, uint32_t n) const {
  const unsigned char* p = y_bytes_at(yb, t, n);
  return from_dtype(dtype, std::vector<unsigned char>(p, p + dtype_size(dtype)))[0];
}

size_t LayerBuffers::touched_outside(const std::vector<unsigned char>& yb, uint32_t rows) const {
  const size_t es = dtype_size(dtype);
  size_t bad = 0;
  for (size_t e = 0; e < yb.size() / es; ++e) {
    if (e >= kGuard && e < kGuard + size_t{capacity} * ldy) {
      const size_t off = e - kGuard;
      if (off / ldy < rows && off % ldy < hidden) continue;
    }
    for (size_t b = 0; b < es; ++b) bad += yb[e * es + b] != kPoison;
  }
  return bad;
}

void check_layer_outputs(const LayerBuffers& b, const std::vector<unsigned char>& yb, uint32_t m,
                         const MoeReference& ref, const std::vector<float>& cpu, bool device_routed,
                         const std::string& what) {
  size_t bad = 0;
  check_layer_values(
      b.dtype, m, b.hidden, [&](uint32_t t, uint32_t n) { return b.y_at(yb, t, n); }, ref, cpu,
      device_routed ? 2.0 : 1.0, 2.02, what, &bad);
  EXPECT_EQ(bad, 0u) << what;
}

}  // namespace qmoe::testing
