// The production handler (lib/offload/moe_handler.h) end to end on the host: layer calls
// classified and published by the offload kernels' code on host threads, served by the CPU
// MoE executor on a CPU context (a caller parallel-for: serial, and two threads of the test's
// own, so that ThreadSanitizer sees every thread), the result added by the wait kernel's code.
//
// The cold part is the CPU layer with the call's cold set as the run mask, bit for bit: after
// the offload, y equals the hot part plus qmoe_moe_forward(run mask = cold set), rounded once to
// the dtype, on rows with a cold selection, and the hot part elsewhere. In FP32 hot + cold is
// also checked against the FP64 reference of the whole layer.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lib/context.h"
#include "lib/moe/expert_set.h"
#include "lib/offload/host_device.h"
#include "lib/offload/moe_handler.h"
#include "lib/offload/service.h"
#include "qmoe/qmoe.h"
#include "tests/moe/moe_reference.h"
#include "tests/offload/offload_test_util.h"

namespace qmoe::offload::testing {
namespace {

using qmoe::testing::make_moe_model;
using qmoe::testing::MoeModel;
using qmoe::testing::MoeOptions;
using qmoe::testing::random_routing;
using qmoe::testing::reference_moe;

// A caller parallel-for on two std::threads (instrumented, unlike Debian's pthreadpool).
void two_thread_parallel_for(void*, qmoe_parallel_task_fn task, void* state, size_t range) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < range; i = next.fetch_add(1)) task(state, i);
  };
  std::thread helper(work);
  work();
  helper.join();
}

struct ContextDeleter {
  void operator()(qmoe_context* c) const { qmoe_context_destroy(c); }
};
struct SetDeleter {
  void operator()(qmoe_expert_set* s) const { qmoe_expert_set_destroy(s); }
};

std::vector<unsigned char> to_dtype(qmoe_dtype d, const std::vector<float>& v) {
  std::vector<unsigned char> out(v.size() * (d == QMOE_DTYPE_F32 ? 4 : 2));
  for (size_t i = 0; i < v.size(); ++i) HostCta::store_element(d, out.data(), i, v[i]);
  return out;
}

const char* dtype_name(qmoe_dtype d) {
  return d == QMOE_DTYPE_F32 ? "f32" : d == QMOE_DTYPE_F16 ? "f16" : "bf16";
}

class OffloadMoe : public ::testing::TestWithParam<bool> {};  // two-thread CPU context

TEST_P(OffloadMoe, ColdPartIsTheCpuLayerWithTheColdRunMask) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  MoeOptions o;
  o.experts = 10;
  o.hidden = 64;
  o.intermediate = 32;
  const uint32_t layers = 2, m_capacity = 3, k = 3;
  std::vector<std::unique_ptr<MoeModel>> models;
  std::vector<std::unique_ptr<qmoe_expert_set, SetDeleter>> sets;
  std::vector<const ExpertSet*> internal;
  for (uint32_t l = 0; l < layers; ++l) {
    models.push_back(make_moe_model(o, rng));
    qmoe_expert_set* raw = nullptr;
    ASSERT_EQ(qmoe_expert_set_create(&models.back()->desc, &raw), QMOE_STATUS_OK)
        << qmoe_last_error_message();
    sets.emplace_back(raw);
    const ExpertSet* s = nullptr;
    ASSERT_EQ(resolve_expert_set(raw, "test", &s), QMOE_STATUS_OK);
    internal.push_back(s);
  }
  qmoe_context_options co;
  qmoe_context_options_init(&co);
  if (GetParam()) {
    co.parallel_for = two_thread_parallel_for;
    co.num_threads = 2;
  } else {
    co.num_threads = 1;  // inline: no pool
  }
  qmoe_context* raw_ctx = nullptr;
  ASSERT_EQ(qmoe_context_create(&co, &raw_ctx), QMOE_STATUS_OK) << qmoe_last_error_message();
  std::unique_ptr<qmoe_context, ContextDeleter> ctx(raw_ctx);
  Context* context = nullptr;
  ASSERT_EQ(resolve_context(raw_ctx, "test", &context), QMOE_STATUS_OK);

  const RingGeometry g{2, m_capacity, k, o.experts, o.hidden};
  std::unique_ptr<MoeRequestHandler> handler;
  ASSERT_EQ(MoeRequestHandler::create(context, internal, g, "test", &handler), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  HostDevice::Options dopt;
  dopt.geometry = g;
  dopt.num_records = layers;
  dopt.threads = 3;
  dopt.wait_blocks = 2;
  dopt.timeout_ns = 60000000000ull;
  HostDevice device(dopt);
  ServiceOptions sopt;
  sopt.spin_ns = 500000;
  sopt.park_ns = 50000;
  OffloadService service(device.ring(), device.layout(), handler.get(), sopt);
  ASSERT_EQ(service.start("test"), QMOE_STATUS_OK);

  uint64_t published = 0;
  const int rounds = kThreadSanitizer ? 4 : 12;
  for (int round = 0; round < rounds; ++round) {
    for (qmoe_dtype dtype : {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16}) {
      for (qmoe_accuracy accuracy : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        const uint32_t layer = static_cast<uint32_t>(round) % layers;
        const uint32_t m = 1 + static_cast<uint32_t>(round) % m_capacity;
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " m " + std::to_string(m) + " layer " +
                     std::to_string(layer) + (accuracy == QMOE_ACCURACY_FAST ? " fast" : " exact"));
        std::vector<int32_t> ids;
        std::vector<float> weights;
        random_routing(m_capacity, o.experts, k, rng, &ids, &weights);
        std::vector<int32_t> residency(o.experts);
        std::vector<uint8_t> hot_mask(o.experts), cold_mask(o.experts);
        int32_t slot = 0;
        std::bernoulli_distribution hot(round % 4 == 3 ? 1.0 : 0.5);
        for (uint32_t e = 0; e < o.experts; ++e) {
          const bool h = hot(rng);
          residency[e] = h ? slot++ : -1;
          hot_mask[e] = h;
          cold_mask[e] = !h;
        }
        std::vector<float> xf(size_t{m_capacity} * o.hidden);
        std::uniform_real_distribution<float> value(-1.5f, 1.5f);
        for (float& v : xf) v = value(rng);
        const std::vector<unsigned char> x = to_dtype(dtype, xf);
        const size_t es = dtype == QMOE_DTYPE_F32 ? 4 : 2;
        auto forward = [&](const std::vector<uint8_t>* mask, std::vector<unsigned char>* y) {
          y->assign(size_t{m_capacity} * o.hidden * es, 0);
          qmoe_moe_params p;
          qmoe_moe_params_init(&p);
          p.accuracy = accuracy;
          p.m = m;
          p.dtype = dtype;
          p.x = x.data();
          p.ldx = o.hidden;
          p.y = y->data();
          p.ldy = o.hidden;
          p.k = k;
          p.ids = ids.data();
          p.weights = weights.data();
          p.run_mask = mask != nullptr ? mask->data() : nullptr;
          ASSERT_EQ(qmoe_moe_forward(raw_ctx, sets[layer].get(), &p), QMOE_STATUS_OK)
              << qmoe_last_error_message();
        };
        std::vector<unsigned char> y_hot, y_cold;
        forward(&hot_mask, &y_hot);
        forward(&cold_mask, &y_cold);
        std::vector<unsigned char> y = y_hot;  // the resident layer's output

        HostLayerCall call;
        call.layer = layer;
        call.m_capacity = m_capacity;
        call.k = k;
        call.num_experts = o.experts;
        call.num_slots = o.experts;
        call.m = &m;
        call.ids = ids.data();
        call.weights = weights.data();
        call.residency = residency.data();
        call.dtype = dtype;
        call.accuracy = accuracy;
        call.x = x.data();
        call.ldx = o.hidden;
        call.y = y.data();
        call.ldy = o.hidden;
        device.classify_publish(call);
        const OffloadCallRecord r = device.record(layer);
        device.wait_accumulate(call);
        ASSERT_EQ(device.error(), 0u) << service.last_failure();
        published += r.seq != 0;
        // Expected bits: hot + cold rounded once, on rows with a cold selection.
        int reported = 0;
        for (uint32_t t = 0; t < m_capacity; ++t) {
          bool has_cold = false;
          for (uint32_t j = 0; j < k && t < m; ++j) has_cold |= cold_mask[ids[t * k + j]] != 0;
          // The flags are the published request's (a short-circuited call leaves them as they
          // were).
          if (r.seq != 0 && t < m) {
            EXPECT_EQ(has_cold, device.token_cold(layer)[t] != 0) << "token " << t;
          }
          EXPECT_TRUE(r.seq != 0 || !has_cold) << "token " << t;
          for (uint32_t h = 0; h < o.hidden; ++h) {
            const size_t i = size_t{t} * o.hidden + h;
            std::vector<unsigned char> want(es);
            if (has_cold) {
              HostCta::store_element(dtype, want.data(), 0,
                                     HostCta::load_element(dtype, y_hot.data(), i) +
                                         HostCta::load_element(dtype, y_cold.data(), i));
            } else {
              std::memcpy(want.data(), y_hot.data() + i * es, es);
            }
            if (std::memcmp(want.data(), y.data() + i * es, es) != 0 && reported++ < 3) {
              ADD_FAILURE() << "y[" << t << "][" << h
                            << "] = " << HostCta::load_element(dtype, y.data(), i) << ", expected "
                            << HostCta::load_element(dtype, want.data(), 0);
            }
          }
        }
        if (dtype == QMOE_DTYPE_F32) {
          // Hot + cold is the whole layer, within the reference's bound (summed in two parts).
          const auto ref =
              reference_moe(*models[layer], accuracy, xf, m, ids, weights, k, nullptr, {});
          for (size_t i = 0; i < size_t{m} * o.hidden; ++i) {
            const double got = HostCta::load_element(dtype, y.data(), i);
            const double tol = 2.0 * ref.tol[i] + 1e-6 * std::fabs(ref.y[i]) + 1e-30;
            ASSERT_LE(std::fabs(got - ref.y[i]), tol) << "element " << i;
          }
        }
      }
    }
  }
  service.stop();
  const OffloadDeviceState s = device.state();
  const HostTelemetry h = service.telemetry();
  EXPECT_EQ(s.telemetry.published, published);
  EXPECT_EQ(s.telemetry.published + s.telemetry.short_circuits, s.telemetry.classify_calls);
  EXPECT_EQ(h.requests_served, published);
  EXPECT_EQ(h.selections_served, s.telemetry.cold_selections);
  EXPECT_EQ(h.failed_requests, 0u);
  EXPECT_GT(published, 0u);
  EXPECT_GT(s.telemetry.short_circuits, 0u);  // the all-hot rounds
}

INSTANTIATE_TEST_SUITE_P(Context, OffloadMoe, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "two_threads" : "inline";
                         });

}  // namespace
}  // namespace qmoe::offload::testing
