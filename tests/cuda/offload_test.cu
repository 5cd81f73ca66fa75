// The hybrid layer on a device (qmoe_cuda_offload_*, lib/cuda/offload_*.cu): resident experts on
// the GPU, cold ones through the doorbell ring on the CPU, joined in y.
//  - All-cold, no-cold and mixed residency against the CPU: y is bit for bit the resident
//    layer's output plus the CPU layer with the cold run mask (rounded once to the dtype) on
//    the rows with a cold selection, and, in FP32, within the FP64 reference's bound.
//  - Router logits routed on the device: the CPU's routing rule's selections, within the FP64
//    reference; a NaN logit refuses the call.
//  - The short circuit gives the bits of a session without it, and a no-cold layer leaves the
//    (poisoned) ring byte for byte as it was.
//  - A graph of 48 chained layers captured once and replayed 5 times with new routing equals
//    eager execution, each replay issues new requests, and each layer's expert_counts hold its
//    routing's selections per expert, cold ones included.
//  - A stopped service: the call times out within the deadline, the session reports TIMEOUT,
//    later calls fail fast; destroying a session with calls in flight returns.
// Telemetry conservation is checked after each. Every test skips where no device is usable.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lib/cuda/offload_session.cuh"
#include "lib/cuda_handles.h"
#include "lib/offload/ring_layout.h"
#include "qmoe/qmoe.h"
#include "qmoe/qmoe_cuda.h"
#include "tests/cpu/isa_test_util.h"
#include "tests/cuda/cuda_set_util.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/layer_call_util.h"
#include "tests/moe/moe_call.h"
#include "tests/moe/moe_reference.h"

namespace qmoe::testing {
namespace {

constexpr uint32_t kCapacity = 4;
constexpr uint32_t kK = 3;

MoeOptions layer_options() {
  MoeOptions o;
  o.experts = 8;
  o.hidden = 320;  // two wait blocks, the second one partial
  o.intermediate = 64;
  return o;
}

// Layers of experts on the host and on the GPU (with a resident subset), a CPU context.
struct Model {
  MoeOptions o = layer_options();
  std::vector<std::unique_ptr<MoeModel>> models;
  std::vector<HostSet> host;
  std::vector<GpuSet> gpu;
  std::vector<std::vector<uint8_t>> cold;  // per layer: expert e not resident
  ContextPtr ctx;

  // resident: per layer, the resident experts (empty: every expert).
  Model(std::mt19937_64& rng, const std::vector<std::vector<uint32_t>>& resident) {
    qmoe_context* raw_ctx = nullptr;
    EXPECT_EQ(qmoe_context_create(nullptr, &raw_ctx), QMOE_STATUS_OK);
    ctx.reset(raw_ctx);
    for (const std::vector<uint32_t>& r : resident) {
      models.push_back(make_moe_model(o, rng));
      host.push_back(make_host_set(models.back()->desc));
      gpu.push_back(make_gpu_set(host.back().get(), r));
      std::vector<uint8_t> c(o.experts, r.empty() ? 0 : 1);
      for (uint32_t e : r) c[e] = 0;
      cold.push_back(c);
    }
  }

  Session session(bool short_circuit, uint32_t timeout_us = 5000000) const {
    std::vector<const qmoe_expert_set*> h;
    std::vector<const qmoe_cuda_expert_set*> g;
    for (size_t l = 0; l < host.size(); ++l) {
      h.push_back(host[l].get());
      g.push_back(gpu[l].get());
    }
    return make_session(ctx.get(), h, g, kCapacity, kK, timeout_us, short_circuit);
  }
};

// One layer call's buffers on the device, its routing and x on the host.
struct Io {
  qmoe_dtype dtype;
  uint32_t m = 0;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::vector<float> x;  // FP32 values (exact in dtype)
  DeviceBuffer d_m, d_x, d_y, d_ids, d_weights;

  Io(qmoe_dtype d, uint32_t hidden) : dtype(d) {
    const size_t rows = size_t{kCapacity} * hidden * dtype_size(d);
    d_m = DeviceBuffer(sizeof(uint32_t));
    d_x = DeviceBuffer(rows);
    d_y = DeviceBuffer(rows);
    d_ids = DeviceBuffer(kCapacity * kK * sizeof(int32_t));
    d_weights = DeviceBuffer(kCapacity * kK * sizeof(float));
  }
  // New routing over the experts `allowed` marks, m tokens, x from `rng`.
  void randomize(std::mt19937_64& rng, uint32_t m_, const std::vector<uint32_t>& allowed,
                 uint32_t hidden) {
    m = m_;
    std::vector<int32_t> local;
    random_routing(kCapacity, static_cast<uint32_t>(allowed.size()), kK, rng, &local, &weights);
    ids.clear();
    for (int32_t i : local) ids.push_back(static_cast<int32_t>(allowed[i]));
    std::vector<float> v = random_activations(kCapacity, hidden, rng);
    x = from_dtype(dtype, to_dtype(dtype, v));  // exact in the dtype
    EXPECT_TRUE(d_m.upload(&m, sizeof m));
    EXPECT_TRUE(d_ids.upload(ids.data(), ids.size() * sizeof(int32_t)));
    EXPECT_TRUE(d_weights.upload(weights.data(), weights.size() * sizeof(float)));
    const std::vector<unsigned char> xb = to_dtype(dtype, x);
    EXPECT_TRUE(d_x.upload(xb.data(), xb.size()));
  }
  qmoe_cuda_moe_params params(uint32_t hidden, qmoe_accuracy accuracy, const void* x_dev,
                              void* y_dev) const {
    qmoe_cuda_moe_params p;
    qmoe_cuda_moe_params_init(&p);
    p.accuracy = accuracy;
    p.dtype = dtype;
    p.m_capacity = kCapacity;
    p.m = d_m.as<uint32_t>();
    p.x = x_dev;
    p.ldx = hidden;
    p.y = y_dev;
    p.ldy = hidden;
    p.k = kK;
    p.ids = d_ids.as<int32_t>();
    p.weights = d_weights.as<float>();
    return p;
  }
  std::vector<unsigned char> y_bytes(uint32_t hidden) const {
    std::vector<unsigned char> out(size_t{kCapacity} * hidden * dtype_size(dtype));
    EXPECT_TRUE(d_y.download(out.data(), out.size()));
    return out;
  }
};

std::vector<uint32_t> all_experts(uint32_t n) {
  std::vector<uint32_t> v(n);
  for (uint32_t e = 0; e < n; ++e) v[e] = e;
  return v;
}

qmoe_cuda_offload_telemetry telemetry(qmoe_cuda_offload* s, cudaStream_t stream) {
  qmoe_cuda_offload_telemetry t{};
  t.struct_size = sizeof t;
  EXPECT_EQ(qmoe_cuda_offload_get_telemetry(s, stream, &t), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  return t;
}

void expect_conservation(const qmoe_cuda_offload_telemetry& t) {
  EXPECT_EQ(t.published_requests + t.short_circuits + t.refused_calls, t.classify_calls);
  EXPECT_EQ(t.published_requests, t.requests_served);
  EXPECT_EQ(t.cold_selections, t.selections_served);
  EXPECT_EQ(t.failed_requests, 0u);
}

// One element of a dtype array, widened.
float element(qmoe_dtype d, const std::vector<unsigned char>& bytes, size_t i) {
  const size_t es = dtype_size(d);
  std::vector<unsigned char> one(bytes.begin() + i * es, bytes.begin() + (i + 1) * es);
  return from_dtype(d, one)[0];
}

enum class Residency { kAllCold, kNoCold, kMixed };

const char* residency_name(Residency r) {
  return r == Residency::kAllCold ? "all-cold" : r == Residency::kNoCold ? "no-cold" : "mixed";
}

TEST(Offload, HybridLayerIsTheResidentLayerPlusTheCpuColdPart) {
  QMOE_SKIP_WITHOUT_CUDA();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const uint32_t experts = layer_options().experts, hidden = layer_options().hidden;
  for (Residency residency : {Residency::kAllCold, Residency::kNoCold, Residency::kMixed}) {
    // All-cold: only expert E-1 is resident and no call routes to it.
    std::vector<uint32_t> resident, allowed = all_experts(experts);
    if (residency == Residency::kAllCold) {
      resident = {experts - 1};
      allowed.pop_back();
    } else if (residency == Residency::kMixed) {
      resident = {0, 2, 5, 7};
    }
    Model model(rng, {resident});
    Session session = model.session(true);
    ASSERT_TRUE(session);
    uint64_t calls = 0, cold_calls = 0;
    for (qmoe_dtype dtype : {QMOE_DTYPE_F32, QMOE_DTYPE_BF16}) {
      for (qmoe_accuracy accuracy : {QMOE_ACCURACY_FAST, QMOE_ACCURACY_EXACT}) {
        for (uint32_t m : {1u, kCapacity}) {
          const std::string where = std::string(residency_name(residency)) + " " +
                                    dtype_label(dtype) +
                                    (accuracy == QMOE_ACCURACY_FAST ? " fast" : " exact") + " m " +
                                    std::to_string(m) + " seed " + std::to_string(seed);
          Io io(dtype, hidden);
          io.randomize(rng, m, allowed, hidden);
          // The resident part alone, on the GPU, into its own buffer.
          DeviceBuffer y_hot(io.d_y.bytes()), workspace;
          size_t ws = 0;
          ASSERT_EQ(qmoe_cuda_moe_workspace_size(model.gpu[0].get(), accuracy, kCapacity, kK, &ws),
                    QMOE_STATUS_OK);
          workspace = DeviceBuffer(ws);
          qmoe_cuda_moe_params hot = io.params(hidden, accuracy, io.d_x.data(), y_hot.data());
          hot.workspace = workspace.data();
          hot.workspace_bytes = ws;
          ASSERT_EQ(qmoe_cuda_moe_forward(model.gpu[0].get(), &hot, nullptr), QMOE_STATUS_OK)
              << qmoe_last_error_message();
          // The hybrid layer.
          const qmoe_cuda_moe_params p = io.params(hidden, accuracy, io.d_x.data(), io.d_y.data());
          ASSERT_EQ(qmoe_cuda_offload_forward(session.get(), 0, &p, nullptr), QMOE_STATUS_OK)
              << qmoe_last_error_message();
          ASSERT_EQ(qmoe_cuda_offload_check(session.get(), nullptr), QMOE_STATUS_OK)
              << qmoe_last_error_message() << " " << where;
          ++calls;
          // The cold part on the CPU: the layer with the cold run mask.
          const std::vector<unsigned char> xb = to_dtype(dtype, io.x);
          std::vector<unsigned char> y_cold(xb.size(), 0);
          MoeCallOptions cold_part;
          cold_part.run_mask = model.cold[0].data();
          ASSERT_EQ(moe_forward_typed(model.ctx.get(), model.host[0].get(), accuracy, m, dtype,
                                      xb.data(), hidden, io.ids.data(), io.weights.data(), kK,
                                      y_cold.data(), hidden, &cold_part),
                    QMOE_STATUS_OK);
          std::vector<unsigned char> hot_bytes(xb.size());
          ASSERT_TRUE(y_hot.download(hot_bytes.data(), hot_bytes.size()));
          const std::vector<unsigned char> y = io.y_bytes(hidden);
          const size_t es = dtype_size(dtype);
          const auto at = [&](uint32_t t, uint32_t h) { return size_t{t} * hidden + h; };
          const bool any_cold = expect_resident_plus_cold(
              dtype, m, hidden, kK, model.cold[0], io.ids, io.weights,
              [&](uint32_t t, uint32_t h) { return y.data() + at(t, h) * es; },
              [&](uint32_t t, uint32_t h) { return element(dtype, hot_bytes, at(t, h)); },
              [&](uint32_t t, uint32_t h) { return element(dtype, y_cold, at(t, h)); }, where);
          cold_calls += any_cold;
          if (residency != Residency::kMixed) {
            EXPECT_EQ(any_cold, residency == Residency::kAllCold) << where;
          }
          if (dtype == QMOE_DTYPE_F32) {
            const MoeReference ref = reference_moe(*model.models[0], accuracy, io.x, m, io.ids,
                                                   io.weights, kK, nullptr, {});
            expect_within_layer_reference(
                m, hidden, [&](uint32_t t, uint32_t h) { return element(dtype, y, at(t, h)); }, ref,
                where);
            if (HasFatalFailure()) return;
          }
        }
      }
    }
    const qmoe_cuda_offload_telemetry t = telemetry(session.get(), nullptr);
    expect_conservation(t);
    EXPECT_EQ(t.classify_calls, calls);
    EXPECT_EQ(t.published_requests, cold_calls);
    EXPECT_EQ(t.short_circuits, calls - cold_calls);
    if (residency == Residency::kNoCold) EXPECT_EQ(t.requests_served, 0u);
  }
}

// Router logits: the classify block routes them on the device, so the hybrid layer runs the
// routing the CPU's rule gives (its selections per expert equal qmoe_moe_route_topk's), within
// the FP64 reference of that routing; a row with a NaN logit refuses the call (no request, y
// zero, the error word set) and the session goes on.
TEST(Offload, HybridLayerRoutesRouterLogits) {
  QMOE_SKIP_WITHOUT_CUDA();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const uint32_t experts = layer_options().experts, hidden = layer_options().hidden;
  Model model(rng, {{0, 2, 5, 7}});
  Session session = model.session(true);
  ASSERT_TRUE(session);
  DeviceBuffer d_logits(size_t{kCapacity} * experts * sizeof(float));
  DeviceBuffer counts(experts * sizeof(uint32_t)), workspace;
  size_t ws = 0;
  ASSERT_EQ(
      qmoe_cuda_moe_workspace_size(model.gpu[0].get(), QMOE_ACCURACY_EXACT, kCapacity, kK, &ws),
      QMOE_STATUS_OK);
  workspace = DeviceBuffer(ws);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  uint64_t calls = 0;
  for (qmoe_accuracy accuracy : {QMOE_ACCURACY_FAST, QMOE_ACCURACY_EXACT}) {
    for (uint32_t m : {1u, kCapacity}) {
      const std::string where = std::string(accuracy == QMOE_ACCURACY_FAST ? "fast" : "exact") +
                                " m " + std::to_string(m) + " seed " + std::to_string(seed);
      Io io(QMOE_DTYPE_F32, hidden);
      io.randomize(rng, m, all_experts(experts), hidden);
      std::vector<float> logits(size_t{kCapacity} * experts);
      for (float& v : logits) v = normal(rng);
      logits[1] = 8.0f;  // token 0 tops at expert 1, which is not resident
      ASSERT_TRUE(d_logits.upload(logits.data(), logits.size() * sizeof(float)));
      std::vector<int32_t> ids(size_t{m} * kK);
      std::vector<float> weights(ids.size());
      ASSERT_EQ(qmoe_moe_route_topk(logits.data(), m, experts, kK, 1, ids.data(), weights.data()),
                QMOE_STATUS_OK);
      qmoe_cuda_moe_params p = io.params(hidden, accuracy, io.d_x.data(), io.d_y.data());
      p.ids = nullptr;
      p.weights = nullptr;
      p.logits = d_logits.data();
      p.renormalize = 1;
      p.expert_counts = counts.as<uint32_t>();
      p.workspace = workspace.data();
      p.workspace_bytes = ws;
      QMOE_CUDA_OK(cudaMemset(counts.data(), 0xFF, counts.bytes()));
      QMOE_CUDA_OK(cudaDeviceSynchronize());
      ASSERT_EQ(qmoe_cuda_offload_forward(session.get(), 0, &p, nullptr), QMOE_STATUS_OK)
          << qmoe_last_error_message();
      ASSERT_EQ(qmoe_cuda_offload_check(session.get(), nullptr), QMOE_STATUS_OK)
          << qmoe_last_error_message() << " " << where;
      ASSERT_EQ(qmoe_cuda_moe_check(workspace.data(), nullptr), QMOE_STATUS_OK)
          << qmoe_last_error_message() << " " << where;
      ++calls;
      std::vector<uint32_t> got(experts);
      ASSERT_TRUE(counts.download(got.data(), got.size() * sizeof(uint32_t)));
      EXPECT_EQ(got, selections_per_expert(ids, weights, m, kK, experts)) << where;
      const std::vector<unsigned char> y = io.y_bytes(hidden);
      const MoeReference ref =
          reference_moe(*model.models[0], accuracy, io.x, m, ids, weights, kK, nullptr, {});
      expect_within_layer_reference(
          m, hidden,
          [&](uint32_t t, uint32_t h) {
            return element(QMOE_DTYPE_F32, y, size_t{t} * hidden + h);
          },
          ref, where);
      if (HasFatalFailure()) return;

      // A NaN logit in the last token's row: refused, nothing published, y zero.
      const uint64_t refused_before = telemetry(session.get(), nullptr).refused_calls;
      logits[size_t{m - 1} * experts + 3] = NAN;
      ASSERT_TRUE(d_logits.upload(logits.data(), logits.size() * sizeof(float)));
      QMOE_CUDA_OK(cudaDeviceSynchronize());
      ASSERT_EQ(qmoe_cuda_offload_forward(session.get(), 0, &p, nullptr), QMOE_STATUS_OK)
          << qmoe_last_error_message();
      ASSERT_EQ(qmoe_cuda_offload_check(session.get(), nullptr), QMOE_STATUS_OK)
          << qmoe_last_error_message() << " " << where;
      EXPECT_EQ(qmoe_cuda_moe_check(workspace.data(), nullptr), QMOE_STATUS_INVALID_ARGUMENT)
          << where;
      ++calls;
      const qmoe_cuda_offload_telemetry t = telemetry(session.get(), nullptr);
      EXPECT_EQ(t.refused_calls, refused_before + 1) << where;
      const std::vector<unsigned char> zeroed = io.y_bytes(hidden);
      for (uint32_t i = 0; i < m * hidden; ++i) {
        ASSERT_EQ(element(QMOE_DTYPE_F32, zeroed, i), 0.0f) << where << " y element " << i;
      }
    }
  }
  const qmoe_cuda_offload_telemetry t = telemetry(session.get(), nullptr);
  EXPECT_EQ(t.published_requests + t.short_circuits + t.refused_calls, t.classify_calls);
  EXPECT_EQ(t.published_requests, t.requests_served);
  EXPECT_EQ(t.cold_selections, t.selections_served);
  EXPECT_EQ(t.classify_calls, calls);
  EXPECT_GT(t.published_requests, 0u);
}

// The short circuit on and off give the same bits, no-cold and mixed alike; off, every call goes
// through the ring.
TEST(Offload, ShortCircuitGivesTheBitsOfTheRingPath) {
  QMOE_SKIP_WITHOUT_CUDA();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const uint32_t hidden = layer_options().hidden;
  Model model(rng, {{1, 2, 4, 6}});
  Session on = model.session(true), off = model.session(false);
  ASSERT_TRUE(on && off);
  const std::vector<uint32_t> hot = {1, 2, 4, 6};
  const std::vector<uint32_t> any = all_experts(layer_options().experts);
  uint64_t zero_cold = 0;
  for (int i = 0; i < 12; ++i) {
    const bool no_cold = i % 2 == 0;
    Io io(QMOE_DTYPE_F32, hidden);
    const uint32_t m = 1 + i % kCapacity;
    io.randomize(rng, m, no_cold ? hot : any, hidden);
    bool cold = false;
    for (uint32_t j = 0; j < m * kK; ++j) cold |= model.cold[0][io.ids[j]] != 0;
    zero_cold += !cold;
    DeviceBuffer y2(io.d_y.bytes());
    // y starts as -0.0 where accumulate reads it: an added +0.0 would change those bits.
    std::vector<float> start(io.d_y.bytes() / 4, -0.0f);
    ASSERT_TRUE(io.d_y.upload(start.data(), io.d_y.bytes()));
    ASSERT_TRUE(y2.upload(start.data(), y2.bytes()));
    qmoe_cuda_moe_params p = io.params(hidden, QMOE_ACCURACY_FAST, io.d_x.data(), io.d_y.data());
    p.accumulate = 1;
    ASSERT_EQ(qmoe_cuda_offload_forward(on.get(), 0, &p, nullptr), QMOE_STATUS_OK);
    p.y = y2.data();
    ASSERT_EQ(qmoe_cuda_offload_forward(off.get(), 0, &p, nullptr), QMOE_STATUS_OK);
    QMOE_CUDA_OK(cudaDeviceSynchronize());
    std::vector<unsigned char> a(io.d_y.bytes()), b(y2.bytes());
    ASSERT_TRUE(io.d_y.download(a.data(), a.size()));
    ASSERT_TRUE(y2.download(b.data(), b.size()));
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << "call " << i << " seed " << seed;
  }
  const qmoe_cuda_offload_telemetry ton = telemetry(on.get(), nullptr);
  const qmoe_cuda_offload_telemetry toff = telemetry(off.get(), nullptr);
  expect_conservation(ton);
  expect_conservation(toff);
  EXPECT_EQ(ton.short_circuits, zero_cold);
  EXPECT_EQ(toff.short_circuits, 0u);
  EXPECT_EQ(toff.published_requests, 12u);
}

// A layer with no cold selection writes nothing to the ring: its payload, poisoned first, and
// its sequence words are byte for byte what they were; the service serves nothing.
TEST(Offload, NoColdLayerLeavesTheStagingMemoryUntouched) {
  QMOE_SKIP_WITHOUT_CUDA();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const uint32_t hidden = layer_options().hidden;
  Model model(rng, {{}});  // every expert resident
  Session session = model.session(true);
  ASSERT_TRUE(session);
  auto* s = static_cast<cuda::OffloadSession*>(offload_session_object(session.get()));
  ASSERT_NE(s, nullptr);
  const offload::RingLayout& l = s->layout;
  for (uint32_t slot = 0; slot < l.geometry.ring_size; ++slot) {
    unsigned char* e = offload::ring_entry(s->ring_host, l, slot);
    std::memset(e + l.meta, 0xA5, l.entry_bytes - l.meta);
  }
  const std::vector<unsigned char> before(s->ring_host, s->ring_host + l.total_bytes);
  for (int i = 0; i < 8; ++i) {
    Io io(QMOE_DTYPE_F32, hidden);
    io.randomize(rng, 1 + i % kCapacity, all_experts(layer_options().experts), hidden);
    const qmoe_cuda_moe_params p =
        io.params(hidden, QMOE_ACCURACY_FAST, io.d_x.data(), io.d_y.data());
    ASSERT_EQ(qmoe_cuda_offload_forward(session.get(), 0, &p, nullptr), QMOE_STATUS_OK);
  }
  QMOE_CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(std::memcmp(before.data(), s->ring_host, before.size()), 0) << "seed " << seed;
  const qmoe_cuda_offload_telemetry t = telemetry(session.get(), nullptr);
  EXPECT_EQ(t.short_circuits, 8u);
  EXPECT_EQ(t.requests_served, 0u);
  EXPECT_EQ(t.published_requests, 0u);
  expect_conservation(t);
}

// 48 chained layers (layer l reads layer l-1's y) captured once; 5 replays with new routing each
// equal eager runs of the same routing, layer by layer, bit for bit.
TEST(Offload, GraphReplayWithNewRoutingEqualsEager) {
  QMOE_SKIP_WITHOUT_CUDA();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const uint32_t layers = 48, hidden = layer_options().hidden, experts = layer_options().experts;
  std::vector<std::vector<uint32_t>> resident;
  for (uint32_t l = 0; l < layers; ++l) resident.push_back({l % experts, (l + 3) % experts});
  Model model(rng, resident);
  Session session = model.session(true);
  ASSERT_TRUE(session);
  std::vector<std::unique_ptr<Io>> io;
  for (uint32_t l = 0; l < layers; ++l) {
    io.push_back(std::make_unique<Io>(QMOE_DTYPE_F32, hidden));
    io.back()->randomize(rng, kCapacity, all_experts(experts), hidden);
  }
  cudaStream_t stream = nullptr;
  QMOE_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Every layer's selections per expert (expert_counts), cold ones included.
  DeviceBuffer counts(size_t{layers} * experts * sizeof(uint32_t));
  auto expect_counts = [&](const char* what, int replay) {
    std::vector<uint32_t> got(size_t{layers} * experts);
    ASSERT_TRUE(counts.download(got.data(), got.size() * sizeof(uint32_t)));
    for (uint32_t l = 0; l < layers; ++l) {
      const std::vector<uint32_t> layer(got.begin() + size_t{l} * experts,
                                        got.begin() + size_t{l + 1} * experts);
      EXPECT_EQ(layer, selections_per_expert(io[l]->ids, io[l]->weights, io[l]->m, kK, experts))
          << what << " expert_counts, replay " << replay << " layer " << l;
    }
  };
  auto enqueue = [&] {
    for (uint32_t l = 0; l < layers; ++l) {
      const void* x = l == 0 ? io[0]->d_x.data() : io[l - 1]->d_y.data();
      qmoe_cuda_moe_params p = io[l]->params(hidden, QMOE_ACCURACY_FAST, x, io[l]->d_y.data());
      p.expert_counts = counts.as<uint32_t>() + size_t{l} * experts;
      const qmoe_status st = qmoe_cuda_offload_forward(session.get(), l, &p, stream);
      if (st != QMOE_STATUS_OK) return st;
    }
    return QMOE_STATUS_OK;
  };
  auto outputs = [&] {
    std::vector<std::vector<unsigned char>> out;
    for (uint32_t l = 0; l < layers; ++l) out.push_back(io[l]->y_bytes(hidden));
    return out;
  };
  cudaGraph_t graph = nullptr;
  QMOE_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const qmoe_status captured = enqueue();
  QMOE_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  ASSERT_EQ(captured, QMOE_STATUS_OK) << qmoe_last_error_message();
  cudaGraphExec_t exec = nullptr;
  QMOE_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  uint64_t published = 0;
  for (int replay = 0; replay < 5; ++replay) {
    for (uint32_t l = 0; l < layers; ++l) {
      io[l]->randomize(rng, 1 + (replay + l) % kCapacity, all_experts(experts), hidden);
      QMOE_CUDA_OK(cudaMemset(io[l]->d_y.data(), 0, io[l]->d_y.bytes()));
    }
    QMOE_CUDA_OK(cudaMemset(counts.data(), 0xFF, counts.bytes()));
    // The uploads ran on the legacy stream, which a non-blocking stream does not wait for.
    QMOE_CUDA_OK(cudaDeviceSynchronize());
    ASSERT_EQ(qmoe_cuda_offload_wake(session.get()), QMOE_STATUS_OK);
    QMOE_CUDA_OK(cudaGraphLaunch(exec, stream));
    QMOE_CUDA_OK(cudaStreamSynchronize(stream));
    ASSERT_EQ(qmoe_cuda_offload_check(session.get(), stream), QMOE_STATUS_OK)
        << qmoe_last_error_message();
    const auto replayed = outputs();
    expect_counts("graph", replay);
    QMOE_CUDA_OK(cudaMemsetAsync(counts.data(), 0xFF, counts.bytes(), stream));
    const uint64_t after_replay = telemetry(session.get(), stream).published_requests;
    EXPECT_GT(after_replay, published) << "replay " << replay << ": no new request";
    for (uint32_t l = 0; l < layers; ++l) {
      QMOE_CUDA_OK(cudaMemsetAsync(io[l]->d_y.data(), 0, io[l]->d_y.bytes(), stream));
    }
    ASSERT_EQ(enqueue(), QMOE_STATUS_OK) << qmoe_last_error_message();
    QMOE_CUDA_OK(cudaStreamSynchronize(stream));
    const auto eager = outputs();
    expect_counts("eager", replay);
    for (uint32_t l = 0; l < layers; ++l) {
      EXPECT_EQ(replayed[l], eager[l]) << "replay " << replay << " layer " << l << " seed " << seed;
    }
    const uint64_t after_eager = telemetry(session.get(), stream).published_requests;
    // The replay and the eager run published the same number of requests.
    EXPECT_EQ(after_eager - after_replay, after_replay - published) << "replay " << replay;
    published = after_eager;
  }
  const qmoe_cuda_offload_telemetry t = telemetry(session.get(), stream);
  expect_conservation(t);
  EXPECT_EQ(t.classify_calls, 2u * 5 * layers);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// With the service stopped, the call's wait gives up at the deadline (no hang), the session
// reports TIMEOUT, and later calls fail fast on the host.
TEST(Offload, StoppedServiceTimesOutWithinTheDeadline) {
  QMOE_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(fresh_seed());
  const uint32_t hidden = layer_options().hidden, experts = layer_options().experts;
  Model model(rng, {{experts - 1}});
  const uint32_t timeout_us = 200000;
  Session session = model.session(true, timeout_us);
  ASSERT_TRUE(session);
  auto* s = static_cast<cuda::OffloadSession*>(offload_session_object(session.get()));
  ASSERT_NE(s, nullptr);
  s->service->stop();
  std::vector<uint32_t> allowed = all_experts(experts);
  allowed.pop_back();  // every selection cold
  Io io(QMOE_DTYPE_F32, hidden);
  io.randomize(rng, 2, allowed, hidden);
  const qmoe_cuda_moe_params p =
      io.params(hidden, QMOE_ACCURACY_FAST, io.d_x.data(), io.d_y.data());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(qmoe_cuda_offload_forward(session.get(), 0, &p, nullptr), QMOE_STATUS_OK);
  const qmoe_status status = qmoe_cuda_offload_check(session.get(), nullptr);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(status, QMOE_STATUS_TIMEOUT) << qmoe_last_error_message();
  EXPECT_GE(waited, timeout_us * 1e-6);
  EXPECT_LT(waited, timeout_us * 1e-6 + 5.0);
  // The host knows now: the next call fails without enqueueing anything.
  EXPECT_EQ(qmoe_cuda_offload_forward(session.get(), 0, &p, nullptr), QMOE_STATUS_TIMEOUT);
  const qmoe_cuda_offload_telemetry t = telemetry(session.get(), nullptr);
  EXPECT_EQ(t.classify_calls, 1u);
  EXPECT_EQ(t.published_requests, 1u);
  EXPECT_EQ(t.requests_served, 0u);
}

// Destroying a session right after enqueueing calls: it waits for them (they are answered),
// then stops the service; nothing hangs.
TEST(Offload, DestroyWithCallsInFlight) {
  QMOE_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(fresh_seed());
  const uint32_t hidden = layer_options().hidden, experts = layer_options().experts;
  Model model(rng, {{experts - 1}});
  Session session = model.session(true);
  ASSERT_TRUE(session);
  std::vector<uint32_t> allowed = all_experts(experts);
  allowed.pop_back();
  Io io(QMOE_DTYPE_F32, hidden);
  io.randomize(rng, kCapacity, allowed, hidden);
  const qmoe_cuda_moe_params p =
      io.params(hidden, QMOE_ACCURACY_FAST, io.d_x.data(), io.d_y.data());
  for (int i = 0; i < 16; ++i) {
    ASSERT_EQ(qmoe_cuda_offload_forward(session.get(), 0, &p, nullptr), QMOE_STATUS_OK);
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(qmoe_cuda_offload_destroy(session.release()), QMOE_STATUS_OK);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
}

}  // namespace
}  // namespace qmoe::testing
