// The offload session ABI's host-side checks (lib/cuda_offload_api.cc), which run in every build
// and on every machine: bad descriptions, handles and layer-call parameters are refused with
// their status before any CUDA call. Where a device is usable, the checks that need real GPU
// sets (E and H against the host sets, k against E) and a live session's parameter checks run
// too, and the session's life cycle (create, destroy, a destroyed handle refused).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "qmoe/qmoe.h"
#include "qmoe/qmoe_cuda.h"
#include "tests/cuda/cuda_set_util.h"
#include "tests/moe/moe_reference.h"

namespace qmoe::testing {
namespace {

bool device_usable() {
  int count = 0;
  return qmoe_cuda_get_device_count(&count) == QMOE_STATUS_OK && count > 0;
}

struct ContextDeleter {
  void operator()(qmoe_context* c) const { qmoe_context_destroy(c); }
};

TEST(CudaOffloadChecks, DescriptionDefaults) {
  qmoe_cuda_offload_desc d;
  std::memset(&d, 0xCD, sizeof d);
  qmoe_cuda_offload_desc_init(&d);
  EXPECT_EQ(d.struct_size, sizeof d);
  EXPECT_EQ(d.device, 0);
  EXPECT_EQ(d.context, nullptr);
  EXPECT_EQ(d.num_layers, 0u);
  EXPECT_EQ(d.host_layers, nullptr);
  EXPECT_EQ(d.gpu_layers, nullptr);
  EXPECT_EQ(d.m_capacity, 4u);
  EXPECT_EQ(d.k, 8u);
  EXPECT_EQ(d.ring_size, 4u);
  EXPECT_EQ(d.timeout_us, 1000000u);
  EXPECT_EQ(d.spin_us, 2000u);
  EXPECT_EQ(d.park_poll_us, 100u);
  EXPECT_EQ(d.short_circuit, 1);
  qmoe_cuda_offload_desc_init(nullptr);  // no crash
}

// A host expert set (E = 6, H = 64, I = 32) and a one-thread CPU context, and a description of
// a one-layer session over them (its GPU set filled in by the test).
struct Fixture {
  std::mt19937_64 rng{21};
  MoeOptions o;
  std::unique_ptr<MoeModel> model;
  std::unique_ptr<qmoe_expert_set, HostSetDeleter> host;
  std::unique_ptr<qmoe_context, ContextDeleter> ctx;
  const qmoe_expert_set* host_layers[1] = {nullptr};
  const qmoe_cuda_expert_set* gpu_layers[1] = {nullptr};
  qmoe_cuda_offload_desc good;

  Fixture() {
    o.experts = 6;
    o.hidden = 64;
    o.intermediate = 32;
    model = make_moe_model(o, rng);
    qmoe_expert_set* raw_host = nullptr;
    EXPECT_EQ(qmoe_expert_set_create(&model->desc, &raw_host), QMOE_STATUS_OK);
    host.reset(raw_host);
    qmoe_context* raw_ctx = nullptr;
    qmoe_context_options co;
    qmoe_context_options_init(&co);
    co.num_threads = 1;
    EXPECT_EQ(qmoe_context_create(&co, &raw_ctx), QMOE_STATUS_OK);
    ctx.reset(raw_ctx);
    host_layers[0] = host.get();
    qmoe_cuda_offload_desc_init(&good);
    good.context = ctx.get();
    good.num_layers = 1;
    good.host_layers = host_layers;
    good.gpu_layers = gpu_layers;
    good.k = 2;
  }
  static qmoe_status create(const qmoe_cuda_offload_desc* d) {
    qmoe_cuda_offload* s = reinterpret_cast<qmoe_cuda_offload*>(0x1);
    const qmoe_status st = qmoe_cuda_offload_create(d, &s);
    if (st != QMOE_STATUS_OK) {
      EXPECT_EQ(s, nullptr);
    } else {
      EXPECT_EQ(qmoe_cuda_offload_destroy(s), QMOE_STATUS_OK);
    }
    return st;
  }
  template <typename Edit>
  qmoe_status with(Edit edit) {
    qmoe_cuda_offload_desc d = good;
    edit(d);
    return create(&d);
  }
};

TEST(CudaOffloadChecks, CreateRefusesBadDescriptions) {
  Fixture f;
  auto with = [&](auto&& edit) { return f.with(edit); };
  EXPECT_EQ(Fixture::create(nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_cuda_offload_create(&f.good, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.struct_size = 8; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.context = nullptr; }), QMOE_STATUS_INVALID_CONTEXT);
  EXPECT_EQ(with([](auto& d) { d.device = -1; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.num_layers = 0; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.host_layers = nullptr; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.gpu_layers = nullptr; }), QMOE_STATUS_INVALID_ARGUMENT);
  // gpu_layers[0] is not a set (NULL): refused before anything else about it.
  EXPECT_EQ(Fixture::create(&f.good), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("set is NULL"), std::string::npos)
      << qmoe_last_error_message();
  const qmoe_expert_set* null_host[1] = {nullptr};
  EXPECT_EQ(with([&](auto& d) { d.host_layers = null_host; }), QMOE_STATUS_INVALID_ARGUMENT);
  qmoe_expert_set* gone = nullptr;
  ASSERT_EQ(qmoe_expert_set_create(&f.model->desc, &gone), QMOE_STATUS_OK);
  ASSERT_EQ(qmoe_expert_set_destroy(gone), QMOE_STATUS_OK);
  const qmoe_expert_set* gone_host[1] = {gone};
  EXPECT_EQ(with([&](auto& d) { d.host_layers = gone_host; }), QMOE_STATUS_INVALID_ARGUMENT);
}

// With a device: the checks against GPU sets, a session's life, a layer call's parameters.
TEST(CudaOffloadChecks, CreateAndForwardCheckAgainstGpuSets) {
  if (!device_usable()) GTEST_SKIP() << "GPU sets need a usable device";
  Fixture f;
  auto& good = f.good;
  auto& host = f.host;
  auto& o = f.o;
  auto& rng = f.rng;
  auto with = [&](auto&& edit) { return f.with(edit); };
  qmoe_cuda_expert_set_desc gd;
  qmoe_cuda_expert_set_desc_init(&gd);
  gd.experts = host.get();
  const uint32_t resident[] = {0, 3};
  gd.resident = resident;
  gd.num_resident = 2;
  qmoe_cuda_expert_set* raw_gpu = nullptr;
  ASSERT_EQ(qmoe_cuda_expert_set_create(&gd, &raw_gpu), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  std::unique_ptr<qmoe_cuda_expert_set, GpuSetDeleter> gpu(raw_gpu);
  f.gpu_layers[0] = gpu.get();
  // Another FFN shape on the host side: E differs.
  MoeOptions o2 = o;
  o2.experts = 5;
  const auto model2 = make_moe_model(o2, rng);
  qmoe_expert_set* raw_host2 = nullptr;
  ASSERT_EQ(qmoe_expert_set_create(&model2->desc, &raw_host2), QMOE_STATUS_OK);
  std::unique_ptr<qmoe_expert_set, HostSetDeleter> host2(raw_host2);
  const qmoe_expert_set* other_host[1] = {host2.get()};
  EXPECT_EQ(with([&](auto& d) { d.host_layers = other_host; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.k = 0; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.k = 7; }), QMOE_STATUS_INVALID_ARGUMENT);  // E = 6
  EXPECT_EQ(with([](auto& d) { d.m_capacity = 0; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.m_capacity = 2049; }), QMOE_STATUS_INVALID_ARGUMENT);  // * 2
  EXPECT_EQ(with([](auto& d) { d.ring_size = 0; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.ring_size = 1025; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.timeout_us = 0; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(with([](auto& d) { d.park_poll_us = 0; }), QMOE_STATUS_INVALID_ARGUMENT);
  int count = 0;
  ASSERT_EQ(qmoe_cuda_get_device_count(&count), QMOE_STATUS_OK);
  EXPECT_EQ(with([&](auto& d) { d.device = count; }), QMOE_STATUS_INVALID_ARGUMENT);

  // A good description: a live session, refused once destroyed.
  qmoe_cuda_offload* s = nullptr;
  ASSERT_EQ(qmoe_cuda_offload_create(&good, &s), QMOE_STATUS_OK) << qmoe_last_error_message();
  EXPECT_EQ(qmoe_cuda_offload_wake(s), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_cuda_offload_check(s, nullptr), QMOE_STATUS_OK) << qmoe_last_error_message();
  qmoe_cuda_offload_telemetry t;
  std::memset(&t, 0xCD, sizeof t);
  t.struct_size = sizeof t;
  ASSERT_EQ(qmoe_cuda_offload_get_telemetry(s, nullptr, &t), QMOE_STATUS_OK);
  EXPECT_EQ(t.classify_calls, 0u);
  EXPECT_EQ(t.requests_served, 0u);
  t.struct_size = 4;
  EXPECT_EQ(qmoe_cuda_offload_get_telemetry(s, nullptr, &t), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_cuda_offload_get_telemetry(s, nullptr, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  // A layer call's parameters, refused on the host (these are host pointers: the last call,
  // right in every other way, is refused by the backend's device-pointer check).
  uint32_t m_host = 1;
  alignas(16) float xh[64] = {}, yh[64] = {};
  int32_t ids[2] = {0, 1};
  float weights[2] = {0.5f, 0.5f};
  qmoe_cuda_moe_params p;
  qmoe_cuda_moe_params_init(&p);
  p.m_capacity = 1;
  p.m = &m_host;
  p.x = xh;
  p.ldx = 64;
  p.y = yh;
  p.ldy = 64;
  p.k = 2;
  p.ids = ids;
  p.weights = weights;
  auto forward = [&](uint32_t layer, auto&& edit) {
    qmoe_cuda_moe_params q = p;
    edit(q);
    return qmoe_cuda_offload_forward(s, layer, &q, nullptr);
  };
  EXPECT_EQ(qmoe_cuda_offload_forward(s, 0, nullptr, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(forward(1, [](auto&) {}), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(forward(0, [](auto& q) { q.struct_size = 8; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(forward(0, [](auto& q) { q.accuracy = static_cast<qmoe_accuracy>(9); }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(forward(0, [](auto& q) { q.dtype = QMOE_DTYPE_E8M0; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(forward(0, [](auto& q) { q.k = 3; }), QMOE_STATUS_INVALID_ARGUMENT);  // session k 2
  EXPECT_EQ(forward(0, [](auto& q) { q.m_capacity = 5; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(forward(0, [](auto& q) { q.m_capacity = 0; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(forward(0, [](auto& q) { q.m = nullptr; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(forward(0, [](auto& q) { q.ids = nullptr; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(forward(0, [&](auto& q) { q.logits = xh; }), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("ids and params->weights"),
            std::string::npos);
  EXPECT_EQ(forward(0, [](auto& q) { q.weights = nullptr; }), QMOE_STATUS_INVALID_ARGUMENT);
  // Router logits alone are a routing: the call passes the host's checks and reaches the
  // device-pointer check (host pointers here).
  EXPECT_EQ(forward(0,
                    [&](auto& q) {
                      q.ids = nullptr;
                      q.weights = nullptr;
                      q.logits = xh;
                    }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("not device memory"), std::string::npos)
      << qmoe_last_error_message();
  EXPECT_EQ(forward(0,
                    [](auto& q) {
                      q.m_capacity = 2;
                      q.ldy = 32;
                    }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(forward(0, [&](auto& q) { q.x = reinterpret_cast<const char*>(xh) + 2; }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(forward(0, [&](auto& q) { q.workspace = reinterpret_cast<char*>(yh) + 4; }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(forward(0,
                    [&](auto& q) {
                      q.workspace = yh;  // 16-byte aligned only, or far too small
                      q.workspace_bytes = 16;
                    }),
            QMOE_STATUS_INVALID_ARGUMENT);
  // expected_tokens_per_expert: 0 or in [1, m_capacity = 1].
  for (float hint : {1.5f, 0.5f, -1.0f, NAN}) {
    EXPECT_EQ(forward(0, [&](auto& q) { q.expected_tokens_per_expert = hint; }),
              QMOE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(qmoe_last_error_message()).find("expected_tokens_per_expert"),
              std::string::npos)
        << qmoe_last_error_message();
  }
  // The struct before expected_tokens_per_expert is a version (its calls get no hint); a size
  // ending inside the field is none.
  EXPECT_EQ(forward(0,
                    [](auto& q) {
                      q.struct_size =
                          offsetof(qmoe_cuda_moe_params, expected_tokens_per_expert) + 2;
                    }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("struct_size"), std::string::npos);
  for (size_t size : {offsetof(qmoe_cuda_moe_params, expected_tokens_per_expert), sizeof p}) {
    EXPECT_EQ(forward(0,
                      [&](auto& q) {
                        q.struct_size = size;
                        q.expected_tokens_per_expert = 1.0f;
                      }),
              QMOE_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(qmoe_last_error_message()).find("not device memory"), std::string::npos)
        << size << ": " << qmoe_last_error_message();
  }
  // expert_counts: 4-byte words. The struct before it is a version (the field is not read: a
  // misaligned value there passes to the pointer checks); a size ending inside it is none.
  auto* odd_counts = reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(yh) + 2);
  EXPECT_EQ(forward(0, [&](auto& q) { q.expert_counts = odd_counts; }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("expert_counts"), std::string::npos)
      << qmoe_last_error_message();
  EXPECT_EQ(forward(0,
                    [&](auto& q) {
                      q.struct_size = offsetof(qmoe_cuda_moe_params, expert_counts) + 4;
                      q.expert_counts = odd_counts;
                    }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("struct_size"), std::string::npos);
  EXPECT_EQ(forward(0,
                    [&](auto& q) {
                      q.struct_size = offsetof(qmoe_cuda_moe_params, expert_counts);
                      q.expert_counts = odd_counts;
                    }),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("not device memory"), std::string::npos)
      << qmoe_last_error_message();
  EXPECT_EQ(forward(0, [](auto&) {}), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("not device memory"), std::string::npos)
      << qmoe_last_error_message();
  EXPECT_EQ(qmoe_cuda_offload_destroy(s), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_cuda_offload_destroy(s), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_cuda_offload_wake(s), QMOE_STATUS_INVALID_ARGUMENT);
}

TEST(CudaOffloadChecks, NullSessionIsRefused) {
  qmoe_cuda_moe_params p;
  qmoe_cuda_moe_params_init(&p);
  qmoe_cuda_offload_telemetry t{};
  t.struct_size = sizeof t;
  EXPECT_EQ(qmoe_cuda_offload_destroy(nullptr), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_cuda_offload_forward(nullptr, 0, &p, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_cuda_offload_wake(nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_cuda_offload_check(nullptr, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_cuda_offload_get_telemetry(nullptr, nullptr, &t), QMOE_STATUS_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace qmoe::testing
