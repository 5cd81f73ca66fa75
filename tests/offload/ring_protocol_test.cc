// The doorbell protocol on a machine without a GPU: the offload kernels' own code
// (lib/offload/kernels.h) on host threads standing in for the device (lib/offload/host_device.h)
// against the CPU service thread (lib/offload/service.h), over ordinary memory. Also run under
// ThreadSanitizer (docs/offload.md gives the command).
//
// Checked: the ring's layout (one writer per line); under many random calls with up to R
// requests in flight, every published request carries exactly the cold set, counts and payload
// the routing implies, sequences never decrease and done <= req <= done + R, results land in
// the right rows, and the telemetry balances; the zero-cold short circuit writes nothing to the
// ring and gives the bits of the path without it; a stopped or absent service and a failing
// handler end in the sticky error within the deadline, after which calls fail fast; invalid
// routing publishes nothing; a slot still in use is refused.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "lib/offload/device_state.h"
#include "lib/offload/host_device.h"
#include "lib/offload/ring_layout.h"
#include "lib/offload/service.h"
#include "tests/offload/offload_test_util.h"

namespace qmoe::offload::testing {
namespace {

using std::chrono::steady_clock;

// The ranges [begin, end) of an entry's pieces and who writes them.
struct Piece {
  const char* name;
  uint64_t begin, end;
  bool device;
};

std::vector<Piece> pieces(const RingLayout& l) {
  const RingGeometry& g = l.geometry;
  const uint64_t slots = uint64_t{g.m_capacity} * g.k_max;
  const uint64_t cold = std::min<uint64_t>(slots, g.num_experts_max);
  const uint64_t tile = uint64_t{g.m_capacity} * g.hidden * kMaxElementBytes;
  return {{"req_seq", l.req, l.req + 8, true},
          {"done_seq", l.done, l.done + 8, false},
          {"status", l.status, l.status + 4, false},
          {"meta", l.meta, l.meta + sizeof(RequestMeta), true},
          {"ids", l.ids, l.ids + slots * 4, true},
          {"weights", l.weights, l.weights + slots * 4, true},
          {"cold_ids", l.cold_ids, l.cold_ids + cold * 4, true},
          {"x", l.x, l.x + tile, true},
          {"result", l.result, l.result + tile, false}};
}

TEST(OffloadRingLayout, EveryLineHasOneWriterAndNothingOverlaps) {
  const RingGeometry geometries[] = {{1, 1, 1, 1, 1},     {4, 4, 8, 128, 2048},
                                     {3, 5, 3, 7, 72},    {1024, 1, 1, 1024, 1},
                                     {2, 4096, 1, 8, 33}, {8, 16, 8, 40, 4095}};
  for (const RingGeometry& g : geometries) {
    ASSERT_TRUE(ring_geometry_ok(g));
    const RingLayout l = make_ring_layout(g);
    SCOPED_TRACE("R " + std::to_string(g.ring_size) + " m " + std::to_string(g.m_capacity) + " k " +
                 std::to_string(g.k_max) + " E " + std::to_string(g.num_experts_max) + " H " +
                 std::to_string(g.hidden));
    EXPECT_EQ(l.first_entry % kLineBytes, 0u);
    EXPECT_EQ(l.entry_bytes % kLineBytes, 0u);
    EXPECT_EQ(l.total_bytes, l.first_entry + g.ring_size * l.entry_bytes);
    const std::vector<Piece> p = pieces(l);
    for (const Piece& a : p) {
      EXPECT_LE(a.end, l.entry_bytes) << a.name;
      EXPECT_EQ(a.begin % (a.begin == l.status ? 4 : 16), 0u) << a.name;
      for (const Piece& b : p) {
        if (&a == &b) continue;
        EXPECT_TRUE(a.end <= b.begin || b.end <= a.begin) << a.name << " overlaps " << b.name;
        if (a.device == b.device) continue;
        // Lines of different writers are disjoint.
        const uint64_t a0 = a.begin / kLineBytes, a1 = (a.end - 1) / kLineBytes;
        const uint64_t b0 = b.begin / kLineBytes, b1 = (b.end - 1) / kLineBytes;
        EXPECT_TRUE(a1 < b0 || b1 < a0) << a.name << " shares a line with " << b.name;
      }
    }
    // The doorbell has its line to itself (the host spins on it).
    for (const Piece& a : p) {
      if (std::string(a.name) != "req_seq") {
        EXPECT_GE(a.begin, l.req + kLineBytes) << a.name;
      }
    }
    // The ring header (error mirror, device) does not share a line with entry 0.
    EXPECT_GE(l.first_entry, kLineBytes);
  }
  EXPECT_FALSE(ring_geometry_ok({0, 1, 1, 1, 1}));
  EXPECT_FALSE(ring_geometry_ok({1025, 1, 1, 1, 1}));
  EXPECT_FALSE(ring_geometry_ok({1, 4097, 1, 8, 1}));
  EXPECT_FALSE(ring_geometry_ok({1, 1, 9, 8, 1}));
  EXPECT_FALSE(ring_geometry_ok({1, 1, 1, 1025, 1}));
  EXPECT_FALSE(ring_geometry_ok({1, 1, 1, 8, 0}));
}

TEST(OffloadRingLayout, SlotsAndReuse) {
  EXPECT_EQ(slot_of(1, 4), 0u);
  EXPECT_EQ(slot_of(4, 4), 3u);
  EXPECT_EQ(slot_of(5, 4), 0u);
  EXPECT_TRUE(slot_reusable(4, 0, 4));   // first lap
  EXPECT_FALSE(slot_reusable(5, 0, 4));  // request 1 not yet added
  EXPECT_TRUE(slot_reusable(5, 1, 4));
  EXPECT_TRUE(slot_reusable(6, 3, 4));
  EXPECT_FALSE(slot_reusable(7, 2, 4));
}

// The device side, the checking handler and the service of one test.
struct Rig {
  RingGeometry geometry;
  uint32_t layers;
  std::unique_ptr<HostDevice> device;
  CheckingHandler handler;
  std::unique_ptr<OffloadService> service;

  Rig(const RingGeometry& g, uint32_t num_layers, bool short_circuit, uint64_t timeout_ns,
      const ServiceOptions& service_options = fast_service(), bool start = true)
      : geometry(g), layers(num_layers), handler(g.hidden) {
    HostDevice::Options o;
    o.geometry = g;
    o.num_records = num_layers;
    o.threads = 4;
    o.wait_blocks = 3;
    o.timeout_ns = timeout_ns;
    o.short_circuit = short_circuit;
    device = std::make_unique<HostDevice>(o);
    handler.require_cold = short_circuit;
    service = std::make_unique<OffloadService>(device->ring(), device->layout(), &handler,
                                               service_options);
    if (start) {
      EXPECT_EQ(service->start("test"), QMOE_STATUS_OK);
    }
  }

  // Short spins and quick looks: the tests share a few cores.
  static ServiceOptions fast_service() {
    ServiceOptions o;
    o.spin_ns = 200000;
    o.park_ns = 50000;
    return o;
  }

  HostLayerCall view(Call& c) {
    return c.view(geometry.m_capacity, geometry.num_experts_max, geometry.num_experts_max);
  }

  // Registers what the call must publish (before it can be served), runs classify-publish and
  // checks the record; returns the sequence it was given (0 for none).
  uint64_t classify(Call& c, bool short_circuit, bool expect_publish_if_cold = true) {
    const uint64_t next = device->state().next_seq;
    const bool publish =
        expect_publish_if_cold && device->error() == 0 && (c.selections > 0 || !short_circuit);
    if (publish) handler.expect(next, &c);
    device->classify_publish(view(c));
    const OffloadCallRecord r = device->record(c.layer);
    EXPECT_EQ(r.seq, publish ? next : 0);
    EXPECT_EQ(r.m, c.m);
    if (device->error() == 0) {
      EXPECT_EQ(r.selections, c.selections);
    }
    if (publish) {
      EXPECT_EQ(r.num_cold, c.cold_ids.size());
      for (uint32_t t = 0; t < c.m; ++t) {
        EXPECT_EQ(device->token_cold(c.layer)[t], c.token_cold[t]) << "token " << t;
      }
    }
    return r.seq;
  }

  // Runs wait-accumulate and checks y: the result added to the rows with a cold selection of a
  // published call, every other element untouched.
  void wait_and_check(Call& c, uint64_t seq, float y0) {
    device->wait_accumulate(view(c));
    const uint32_t h_count = geometry.hidden;
    int reported = 0;
    for (uint32_t t = 0; t < geometry.m_capacity; ++t) {
      for (uint32_t h = 0; h < h_count; ++h) {
        const bool added = seq != 0 && t < c.m && c.token_cold[t] != 0;
        const float want = added ? y0 + result_value(seq, t, h) : y0;
        const float got = c.y[size_t{t} * h_count + h];
        if (std::memcmp(&want, &got, sizeof want) != 0 && reported++ < 3) {
          ADD_FAILURE() << "request " << seq << " y[" << t << "][" << h << "] = " << got
                        << ", expected " << want;
        }
      }
    }
  }
};

void expect_conservation(const DeviceTelemetry& d, const HostTelemetry& h) {
  EXPECT_EQ(d.published + d.short_circuits + d.refused, d.classify_calls);
  EXPECT_EQ(d.published, h.requests_served);
  EXPECT_EQ(d.cold_selections, h.selections_served);
  uint64_t histogram = 0;
  for (uint64_t b : h.histogram) histogram += b;
  EXPECT_EQ(histogram, h.requests_served);
}

// Many random calls over several layers, with 1 to R requests in flight at a time (the waits
// in order), while a third thread watches the sequence words.
TEST(OffloadProtocol, RandomCallsWithRequestsInFlight) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const RingGeometry g{4, 3, 4, 40, 72};
  const uint32_t layers = 5;
  Rig rig(g, layers, /*short_circuit=*/true, /*timeout_ns=*/20000000000ull);
  RingObserver observer(rig.device->ring(), rig.device->layout());
  const uint64_t calls = env_count("QMOE_OFFLOAD_STRESS_CALLS", kThreadSanitizer ? 1500 : 12000);
  const float y0 = 0.5f;
  struct InFlight {
    std::unique_ptr<Call> call;
    uint64_t seq;
  };
  std::deque<InFlight> in_flight;
  uint64_t published = 0, zero_cold = 0, selections = 0;
  std::uniform_int_distribution<uint32_t> window(1, std::min(g.ring_size, layers));
  for (uint64_t i = 0; i < calls && !::testing::Test::HasFailure(); ++i) {
    const uint32_t w = window(rng);
    while (in_flight.size() >= w) {
      rig.wait_and_check(*in_flight.front().call, in_flight.front().seq, y0);
      in_flight.pop_front();
    }
    auto c =
        std::make_unique<Call>(random_call(rng, static_cast<uint32_t>(i % layers), g.m_capacity,
                                           g.k_max, g.num_experts_max, g.hidden, y0));
    const uint64_t seq = rig.classify(*c, true);
    if (seq != 0) {
      ++published;
      selections += c->selections;
    } else {
      ++zero_cold;
    }
    in_flight.push_back({std::move(c), seq});
  }
  while (!in_flight.empty()) {
    rig.wait_and_check(*in_flight.front().call, in_flight.front().seq, y0);
    in_flight.pop_front();
  }
  observer.stop();
  EXPECT_EQ(observer.violations(), 0u) << observer.first_violation();
  EXPECT_GT(observer.observations(), 0u);
  EXPECT_EQ(rig.handler.mismatches(), 0u) << rig.handler.first_mismatch();
  EXPECT_EQ(rig.device->error(), 0u);
  const OffloadDeviceState s = rig.device->state();
  EXPECT_EQ(s.next_seq, published + 1);
  EXPECT_EQ(s.telemetry.classify_calls, calls);
  EXPECT_EQ(s.telemetry.published, published);
  EXPECT_EQ(s.telemetry.short_circuits, zero_cold);
  EXPECT_EQ(s.telemetry.refused, 0u);
  EXPECT_EQ(s.telemetry.cold_selections, selections);
  EXPECT_GT(published, calls / 4);  // the mix exercised both paths
  EXPECT_GT(zero_cold, calls / 20);
  rig.service->stop();
  const HostTelemetry h = rig.service->telemetry();
  expect_conservation(s.telemetry, h);
  EXPECT_EQ(h.failed_requests, 0u);
  EXPECT_EQ(rig.handler.served(), published);
}

// No cold selection: nothing is written to the ring (poisoned payload stays poisoned, the
// sequence words stay 0), the service sees nothing, y keeps its bits.
TEST(OffloadProtocol, ZeroColdCallsLeaveTheRingUntouched) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const RingGeometry g{2, 4, 3, 20, 48};
  Rig rig(g, 2, true, 5000000000ull);
  const RingLayout& l = rig.device->layout();
  // Poison every entry's payload (the service is idle: no request was published).
  for (uint32_t s = 0; s < g.ring_size; ++s) {
    unsigned char* e = ring_entry(rig.device->ring(), l, s);
    std::memset(e + l.meta, 0xA5, l.entry_bytes - l.meta);
  }
  const std::vector<unsigned char> before(rig.device->ring(), rig.device->ring() + l.total_bytes);
  const int calls = 200;
  for (int i = 0; i < calls; ++i) {
    Call c = random_call(rng, i % 2, g.m_capacity, g.k_max, g.num_experts_max, g.hidden, -0.0f);
    for (size_t e = 0; e < c.residency.size(); ++e) c.residency[e] = static_cast<int32_t>(e);
    if (i % 3 == 0) {  // cold experts, but only with weight 0
      for (size_t j = 0; j < c.weights.size(); j += 2) c.weights[j] = 0.0f;
      for (size_t j = 0; j < c.ids.size(); j += 2) c.residency[c.ids[j]] = -1;
      for (size_t j = 1; j < c.ids.size(); j += 2) c.residency[c.ids[j]] = 0;
    }
    expect_classification(&c);
    ASSERT_EQ(c.selections, 0u);
    const std::vector<float> y = c.y;
    EXPECT_EQ(rig.classify(c, true), 0u);
    rig.device->wait_accumulate(rig.view(c));
    EXPECT_EQ(std::memcmp(y.data(), c.y.data(), y.size() * sizeof(float)), 0) << "call " << i;
  }
  EXPECT_EQ(std::memcmp(before.data(), rig.device->ring(), before.size()), 0);
  rig.service->stop();
  const OffloadDeviceState s = rig.device->state();
  EXPECT_EQ(s.next_seq, 1u);
  EXPECT_EQ(s.telemetry.short_circuits, uint64_t(calls));
  EXPECT_EQ(s.telemetry.published, 0u);
  const HostTelemetry h = rig.service->telemetry();
  EXPECT_EQ(h.requests_served, 0u);
  EXPECT_EQ(h.wakeups, 0u);
  expect_conservation(s.telemetry, h);
}

// With the short circuit off, a call with no cold selection goes through the ring (a request
// with no cold expert, answered, waited for) and y has the same bits as with it on.
TEST(OffloadProtocol, ShortCircuitGivesTheBitsOfThePathWithoutIt) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const RingGeometry g{3, 3, 2, 12, 40};
  Rig on(g, 1, true, 5000000000ull);
  Rig off(g, 1, false, 5000000000ull);
  std::mt19937_64 rng(seed);
  uint64_t zero_cold = 0;
  const int calls = 150;
  for (int i = 0; i < calls; ++i) {
    Call a = random_call(rng, 0, g.m_capacity, g.k_max, g.num_experts_max, g.hidden, 0.0f);
    // Signed zeros and values in y: an added +0.0 would turn -0.0 into +0.0.
    for (size_t j = 0; j < a.y.size(); ++j) a.y[j] = j % 3 == 0 ? -0.0f : 0.25f * float(j % 7);
    Call b = a;
    zero_cold += a.selections == 0;
    const uint64_t sa = on.classify(a, true);
    const uint64_t sb = off.classify(b, false);
    EXPECT_NE(sb, 0u);
    on.device->wait_accumulate(on.view(a));
    off.device->wait_accumulate(off.view(b));
    if (a.selections == 0) {
      EXPECT_EQ(sa, 0u);
      EXPECT_EQ(std::memcmp(a.y.data(), b.y.data(), a.y.size() * sizeof(float)), 0) << "call " << i;
    }
  }
  EXPECT_GT(zero_cold, 0u);
  on.service->stop();
  off.service->stop();
  EXPECT_EQ(off.handler.mismatches(), 0u) << off.handler.first_mismatch();
  EXPECT_EQ(on.handler.mismatches(), 0u) << on.handler.first_mismatch();
  const OffloadDeviceState so = off.device->state();
  EXPECT_EQ(so.telemetry.published, uint64_t(calls));
  EXPECT_EQ(so.telemetry.short_circuits, 0u);
  EXPECT_EQ(on.device->state().telemetry.short_circuits, zero_cold);
  expect_conservation(so.telemetry, off.service->telemetry());
  expect_conservation(on.device->state().telemetry, on.service->telemetry());
}

// A call whose request nobody answers: the wait returns at the deadline with the sticky
// timeout (not before it, not long after), y untouched; later calls publish nothing and wait
// for nothing.
void expect_timeout_then_fail_fast(Rig& rig, uint64_t timeout_ns) {
  std::mt19937_64 rng(7);
  const RingGeometry& g = rig.geometry;
  Call c = random_call(rng, 0, g.m_capacity, g.k_max, g.num_experts_max, g.hidden, 1.0f);
  c.m = g.m_capacity;
  for (int32_t& r : c.residency) r = -1;
  expect_classification(&c);
  const std::vector<float> y = c.y;
  const uint64_t seq = rig.classify(c, true);
  ASSERT_EQ(seq, 1u);
  const auto t0 = steady_clock::now();
  rig.device->wait_accumulate(rig.view(c));
  const double waited = seconds_since(t0);
  EXPECT_GE(waited, timeout_ns * 1e-9);
  EXPECT_LT(waited, timeout_ns * 1e-9 + 5.0);  // bounded, with room for a loaded machine
  EXPECT_EQ(rig.device->error() & kErrorTimeout, kErrorTimeout);
  EXPECT_EQ(std::memcmp(y.data(), c.y.data(), y.size() * sizeof(float)), 0);
  EXPECT_EQ(
      __atomic_load_n(ring_error_mirror(rig.device->ring()), __ATOMIC_ACQUIRE) & kErrorTimeout,
      kErrorTimeout);
  // Fail fast: refused, no request, no wait.
  Call d = c;
  const auto t1 = steady_clock::now();
  EXPECT_EQ(rig.classify(d, true, /*expect_publish_if_cold=*/false), 0u);
  rig.device->wait_accumulate(rig.view(d));
  EXPECT_LT(seconds_since(t1), timeout_ns * 1e-9);
  const OffloadDeviceState s = rig.device->state();
  EXPECT_EQ(s.next_seq, 2u);
  EXPECT_EQ(s.telemetry.refused, 1u);
  EXPECT_EQ(s.telemetry.published + s.telemetry.short_circuits + s.telemetry.refused,
            s.telemetry.classify_calls);
}

TEST(OffloadProtocol, StoppedServiceTimesOutThenCallsFailFast) {
  const uint64_t timeout = 500000000;  // 500 ms: the fail-fast call must take far less
  Rig rig({2, 2, 2, 8, 32}, 1, true, timeout);
  rig.service->stop();
  expect_timeout_then_fail_fast(rig, timeout);
  EXPECT_EQ(rig.service->telemetry().requests_served, 0u);
}

TEST(OffloadProtocol, ServiceNeverStartedTimesOut) {
  const uint64_t timeout = 400000000;
  Rig rig({2, 2, 2, 8, 32}, 1, true, timeout, Rig::fast_service(), /*start=*/false);
  expect_timeout_then_fail_fast(rig, timeout);
}

// A handler failure is answered at once: the device sets the sticky host error without
// waiting for the deadline, and adds nothing.
TEST(OffloadProtocol, HandlerFailureIsStickyWithoutWaitingForTheDeadline) {
  const uint64_t timeout = 30000000000ull;  // 30 s: the test must end long before
  Rig rig({2, 2, 2, 8, 32}, 1, true, timeout);
  rig.handler.fail_next(true);
  std::mt19937_64 rng(11);
  Call c = random_call(rng, 0, 2, 2, 8, 32, 3.0f);
  c.m = 2;
  for (int32_t& r : c.residency) r = -1;
  expect_classification(&c);
  const std::vector<float> y = c.y;
  ASSERT_EQ(rig.classify(c, true), 1u);
  const auto t0 = steady_clock::now();
  rig.device->wait_accumulate(rig.view(c));
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_EQ(rig.device->error(), kErrorHost);
  EXPECT_EQ(std::memcmp(y.data(), c.y.data(), y.size() * sizeof(float)), 0);
  rig.service->stop();
  const HostTelemetry h = rig.service->telemetry();
  EXPECT_EQ(h.failed_requests, 1u);
  EXPECT_EQ(h.requests_served, 1u);
  EXPECT_NE(rig.service->last_failure().find("told to fail"), std::string::npos)
      << rig.service->last_failure();
}

// Routing the resident layer would refuse: nothing is published (and nothing read past the
// check), no sticky error: the layer's own error word reports it.
TEST(OffloadProtocol, InvalidRoutingPublishesNothing) {
  const RingGeometry g{2, 2, 2, 8, 32};
  Rig rig(g, 1, true, 5000000000ull);
  std::mt19937_64 rng(5);
  const std::vector<unsigned char> before(rig.device->ring(),
                                          rig.device->ring() + rig.device->layout().total_bytes);
  auto base = [&] {
    Call c = random_call(rng, 0, 2, 2, 8, 32, 0.0f);
    c.m = 2;
    for (int32_t& r : c.residency) r = -1;
    for (float& w : c.weights) w = 0.5f;
    expect_classification(&c);
    return c;
  };
  std::vector<Call> bad;
  bad.push_back(base());
  bad.back().ids[3] = 8;  // id outside [0, E)
  bad.push_back(base());
  bad.back().ids[0] = -1;
  bad.push_back(base());
  bad.back().weights[1] = std::numeric_limits<float>::quiet_NaN();
  bad.push_back(base());
  bad.back().weights[2] = -std::numeric_limits<float>::infinity();
  bad.push_back(base());
  bad.back().residency[bad.back().ids[0]] = -2;  // residency entry outside [-1, slots)
  bad.push_back(base());
  bad.back().residency[bad.back().ids[1]] = 8;
  bad.push_back(base());
  bad.back().m = 3;  // above the call's capacity
  for (Call& c : bad) {
    rig.device->classify_publish(rig.view(c));
    EXPECT_EQ(rig.device->record(0).seq, 0u);
    rig.device->wait_accumulate(rig.view(c));
  }
  EXPECT_EQ(std::memcmp(before.data(), rig.device->ring(), before.size()), 0);
  EXPECT_EQ(rig.device->error(), 0u);
  const OffloadDeviceState s = rig.device->state();
  EXPECT_EQ(s.telemetry.refused, bad.size());
  EXPECT_EQ(s.next_seq, 1u);
  // A valid call after them goes through.
  Call ok = base();
  const uint64_t seq = rig.classify(ok, true);
  EXPECT_EQ(seq, 1u);
  rig.wait_and_check(ok, seq, 0.0f);
  EXPECT_EQ(rig.handler.mismatches(), 0u) << rig.handler.first_mismatch();
}

// Publishing into a slot whose previous request the device has not added yet is refused with
// the sticky protocol error, and nothing of that slot is written.
TEST(OffloadProtocol, SlotStillInUseIsAProtocolError) {
  const RingGeometry g{2, 1, 2, 8, 32};
  Rig rig(g, 3, true, 5000000000ull);
  std::mt19937_64 rng(9);
  std::vector<Call> calls;
  for (uint32_t i = 0; i < 3; ++i) {
    calls.push_back(random_call(rng, i, 1, 2, 8, 32, 0.0f));
    Call& c = calls.back();
    c.m = 1;
    for (int32_t& r : c.residency) r = -1;
    for (float& w : c.weights) w = 0.5f;
    expect_classification(&c);
  }
  EXPECT_EQ(rig.classify(calls[0], true), 1u);
  EXPECT_EQ(rig.classify(calls[1], true), 2u);
  // Both answered, neither added: slot 0 is still request 1's.
  while (rig.service->served() < 2) std::this_thread::yield();
  rig.service->stop();
  unsigned char* slot0 = ring_entry(rig.device->ring(), rig.device->layout(), 0);
  const std::vector<unsigned char> before(slot0, slot0 + rig.device->layout().entry_bytes);
  rig.device->classify_publish(rig.view(calls[2]));
  EXPECT_EQ(rig.device->record(2).seq, 0u);
  EXPECT_EQ(rig.device->error(), kErrorProtocol);
  EXPECT_EQ(std::memcmp(before.data(), slot0, before.size()), 0);
  const OffloadDeviceState s = rig.device->state();
  EXPECT_EQ(s.next_seq, 3u);
  EXPECT_EQ(s.telemetry.refused, 1u);
  EXPECT_EQ(s.telemetry.published, 2u);
}

}  // namespace
}  // namespace qmoe::offload::testing
