// The CPU service thread on its own terms (lib/offload/service.h): stopping it with requests in
// flight and while it is parked, its spin-then-park policy (a parked service still finds
// requests, a wake() hint wakes it at once), the request checks that keep a corrupted ring
// away from the handler, and the service-time histogram's buckets.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "lib/offload/host_device.h"
#include "lib/offload/ring_layout.h"
#include "lib/offload/service.h"
#include "tests/offload/offload_test_util.h"

namespace qmoe::offload::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// A device side, a handler and a service with the given options, and an all-cold call maker.
struct ServiceRig {
  RingGeometry g{2, 2, 2, 8, 32};
  std::unique_ptr<HostDevice> device;
  CheckingHandler handler{32};
  std::unique_ptr<OffloadService> service;
  std::mt19937_64 rng{13};

  ServiceRig(const ServiceOptions& options, uint64_t timeout_ns, uint32_t layers = 2) {
    HostDevice::Options o;
    o.geometry = g;
    o.num_records = layers;
    o.threads = 2;
    o.wait_blocks = 1;
    o.timeout_ns = timeout_ns;
    device = std::make_unique<HostDevice>(o);
    service = std::make_unique<OffloadService>(device->ring(), device->layout(), &handler, options);
    EXPECT_EQ(service->start("test"), QMOE_STATUS_OK);
  }
  std::unique_ptr<Call> cold_call(uint32_t layer) {
    auto c = std::make_unique<Call>(
        random_call(rng, layer, g.m_capacity, g.k_max, g.num_experts_max, g.hidden, 0.0f));
    c->m = g.m_capacity;
    for (int32_t& r : c->residency) r = -1;
    for (float& w : c->weights) w = 0.75f;
    expect_classification(c.get());
    return c;
  }
  HostLayerCall view(Call& c) { return c.view(g.m_capacity, g.num_experts_max, g.num_experts_max); }
  uint64_t publish(Call& c) {
    const uint64_t seq = device->state().next_seq;
    handler.expect(seq, &c);
    device->classify_publish(view(c));
    EXPECT_EQ(device->record(c.layer).seq, seq);
    return seq;
  }
};

// Stopping the service while its handler runs: the request it holds is answered (stop waits
// for it), the ones after it are not, and the device's waits end (answered or timed out)
// within their deadline: nothing hangs, nothing is touched after the stop.
TEST(OffloadService, StopWithRequestsInFlight) {
  const uint64_t timeout = 300000000;  // 300 ms
  ServiceRig s(ServiceOptions{}, timeout);
  s.handler.set_delay(std::chrono::microseconds(150000));
  auto a = s.cold_call(0);
  auto b = s.cold_call(1);
  const uint64_t sa = s.publish(*a);
  const uint64_t sb = s.publish(*b);
  // The service is inside the first request's handler.
  while (s.handler.served() < 1) std::this_thread::yield();
  const auto t0 = steady_clock::now();
  s.service->stop();
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_EQ(s.service->served(), 1u);
  EXPECT_EQ(s.handler.served(), 1u);
  s.service.reset();  // destroyed while the device still has a request in flight
  const auto t1 = steady_clock::now();
  s.device->wait_accumulate(s.view(*a));
  EXPECT_EQ(s.device->error(), 0u);  // the first was answered
  for (uint32_t h = 0; h < s.g.hidden; ++h) EXPECT_EQ(a->y[h], result_value(sa, 0, h));
  s.device->wait_accumulate(s.view(*b));  // the second never will be
  EXPECT_EQ(s.device->error(), kErrorTimeout);
  const double waited = seconds_since(t1);
  EXPECT_GE(waited, timeout * 1e-9);
  EXPECT_LT(waited, timeout * 1e-9 + 5.0);
  EXPECT_EQ(b->y[0], 0.0f);
  (void)sb;
}

// stop() wakes a parked thread: it does not wait for the park to time out.
TEST(OffloadService, StopReturnsPromptlyWhileParked) {
  ServiceOptions o;
  o.spin_ns = 0;
  o.park_ns = 60000000000ull;  // a minute
  ServiceRig s(o, 1000000000);
  while (s.service->telemetry().parks < 1) std::this_thread::yield();
  const auto t0 = steady_clock::now();
  s.service->stop();
  EXPECT_LT(seconds_since(t0), 10.0);
  s.service->stop();  // idempotent
}

// A parked service looks at the ring every park_ns, so a request is still answered; with a
// park longer than the device's deadline only a wake() gets the request answered in time.
TEST(OffloadService, ParkedServiceFindsRequestsAndWakeHintsWakeIt) {
  {
    ServiceOptions o;
    o.spin_ns = 0;
    o.park_ns = 2000000;  // 2 ms
    ServiceRig s(o, 20000000000ull);
    while (s.service->telemetry().parks < 1) std::this_thread::yield();
    auto c = s.cold_call(0);
    const uint64_t seq = s.publish(*c);
    s.device->wait_accumulate(s.view(*c));
    EXPECT_EQ(s.device->error(), 0u);
    EXPECT_EQ(c->y[0], result_value(seq, 0, 0));
    const HostTelemetry t = s.service->telemetry();
    EXPECT_GE(t.wakeups, 1u);  // found by a look, then a new spin window
    EXPECT_EQ(t.requests_served, 1u);
  }
  {
    ServiceOptions o;
    o.spin_ns = 0;
    o.park_ns = 60000000000ull;
    ServiceRig s(o, 20000000000ull);
    while (s.service->telemetry().parks < 1) std::this_thread::yield();
    auto c = s.cold_call(0);
    const uint64_t seq = s.publish(*c);
    std::this_thread::sleep_for(milliseconds(20));
    EXPECT_EQ(s.service->served(), 0u);  // parked: nobody looked
    const auto t0 = steady_clock::now();
    s.service->wake();
    s.device->wait_accumulate(s.view(*c));
    EXPECT_LT(seconds_since(t0), 10.0);
    EXPECT_EQ(s.device->error(), 0u);
    EXPECT_EQ(c->y[0], result_value(seq, 0, 0));
    EXPECT_GE(s.service->telemetry().wakeups, 1u);
  }
}

// validate_request refuses each kind of corrupt payload, and recounts the selections.
TEST(OffloadService, ValidateRequestRefusesCorruptPayloads) {
  const RingGeometry g{1, 2, 2, 8, 4};
  int32_t ids[4] = {1, 5, 5, 2};
  float weights[4] = {0.5f, 0.25f, 0.0f, 1.0f};
  int32_t cold[2] = {2, 5};
  RequestView r{};
  r.seq = 1;
  r.meta = RequestMeta{0, 2, 2, 2, 2, QMOE_DTYPE_F32, QMOE_ACCURACY_FAST, 0};
  r.ids = ids;
  r.weights = weights;
  r.cold_ids = cold;
  char why[128];
  uint32_t count = 0;
  ASSERT_TRUE(validate_request(r, g, &count, why, sizeof why)) << why;
  EXPECT_EQ(count, 2u);  // ids[1] (5, 0.25) and ids[3] (2, 1.0); ids[2] has weight 0
  auto refused = [&](RequestView bad, const char* what) {
    EXPECT_FALSE(validate_request(bad, g, &count, why, sizeof why)) << what;
    EXPECT_EQ(count, 0u) << what;
  };
  RequestView b = r;
  b.meta.m = 3;
  refused(b, "m above capacity");
  b = r;
  b.meta.k = 3;
  refused(b, "k above k_max");
  b = r;
  b.meta.k = 0;
  refused(b, "k = 0");
  b = r;
  b.meta.dtype = QMOE_DTYPE_E8M0;
  refused(b, "dtype");
  b = r;
  b.meta.accuracy = 0;
  refused(b, "accuracy");
  b = r;
  b.meta.num_cold = 5;
  refused(b, "more cold experts than slots");
  b = r;
  b.meta.selections = 3;
  refused(b, "selection count");
  int32_t unsorted[2] = {5, 2};
  b = r;
  b.cold_ids = unsorted;
  refused(b, "cold ids not ascending");
  int32_t repeated[2] = {5, 5};
  b = r;
  b.cold_ids = repeated;
  refused(b, "cold id twice");
  int32_t outside[2] = {2, 8};
  b = r;
  b.cold_ids = outside;
  refused(b, "cold id outside E");
  int32_t bad_ids[4] = {1, 5, 9, 2};
  b = r;
  b.ids = bad_ids;
  refused(b, "id outside E");
  // An empty request (the short circuit off, no cold selection) is valid.
  b = r;
  b.meta.num_cold = 0;
  b.meta.selections = 0;
  EXPECT_TRUE(validate_request(b, g, &count, why, sizeof why)) << why;
  b.meta.m = 0;
  b.meta.k = 0;
  EXPECT_TRUE(validate_request(b, g, &count, why, sizeof why)) << why;
}

TEST(OffloadService, HistogramBuckets) {
  EXPECT_EQ(histogram_bucket(0), 0u);
  EXPECT_EQ(histogram_bucket(1999), 0u);
  EXPECT_EQ(histogram_bucket(2000), 1u);
  EXPECT_EQ(histogram_bucket(3999), 1u);
  EXPECT_EQ(histogram_bucket(4000), 2u);
  EXPECT_EQ(histogram_bucket(1000000), 9u);  // 1 ms = 1000 us, in [512, 1024)
  EXPECT_EQ(histogram_bucket((uint64_t{1} << 22) * 1000), 22u);
  EXPECT_EQ(histogram_bucket((uint64_t{1} << 23) * 1000), 23u);
  EXPECT_EQ(histogram_bucket(UINT64_MAX), 23u);
}

}  // namespace
}  // namespace qmoe::offload::testing
