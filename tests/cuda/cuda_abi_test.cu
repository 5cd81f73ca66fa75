// The CUDA C ABI on a device (include/qmoe/qmoe_cuda.h): resident expert sets made by both copy
// modes, the layer through qmoe_cuda_moe_forward against the FP64 reference (all and some
// experts resident), replayed in a captured graph with new routing each time (with the
// selections per expert it can leave in expert_counts), the device's
// error word, host pointers refused, and qmoe_cuda_gemm at decode and prefill sizes against the
// FP64 reference. Every test skips with the reason where no device is usable.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "qmoe/qmoe.h"
#include "qmoe/qmoe_cuda.h"
#include "tests/cpu/isa_test_util.h"
#include "tests/cuda/cuda_set_util.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/gemm/int4_reference.h"
#include "tests/moe/moe_reference.h"

namespace qmoe::testing {
namespace {

// One layer's inputs on the device, and the call's params over them.
struct LayerCall {
  uint32_t m, k, hidden;
  std::vector<float> x;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  DeviceBuffer d_m, d_x, d_y, d_ids, d_weights, workspace;
  qmoe_cuda_moe_params params;

  LayerCall(const qmoe_cuda_expert_set* set, const MoeOptions& o, uint32_t m_, uint32_t k_,
            std::mt19937_64& rng)
      : m(m_), k(k_), hidden(o.hidden), x(random_activations(m_, o.hidden, rng)) {
    std::uniform_int_distribution<int32_t> expert(0, static_cast<int32_t>(o.experts) - 1);
    std::uniform_real_distribution<float> weight(0.05f, 1.0f);
    for (uint32_t i = 0; i < m * k; ++i) {
      ids.push_back(expert(rng));
      weights.push_back(weight(rng));
    }
    d_m = DeviceBuffer(sizeof(uint32_t));
    d_x = DeviceBuffer(x.size() * sizeof(float));
    d_y = DeviceBuffer(x.size() * sizeof(float));
    d_ids = DeviceBuffer(ids.size() * sizeof(int32_t));
    d_weights = DeviceBuffer(weights.size() * sizeof(float));
    size_t bytes = 0;
    EXPECT_EQ(qmoe_cuda_moe_workspace_size(set, QMOE_ACCURACY_FAST, m, k, &bytes), QMOE_STATUS_OK)
        << qmoe_last_error_message();
    workspace = DeviceBuffer(bytes);
    EXPECT_TRUE(d_m.upload(&m, sizeof m));
    EXPECT_TRUE(d_x.upload(x.data(), x.size() * sizeof(float)));
    upload_routing();
    qmoe_cuda_moe_params_init(&params);
    params.m_capacity = m;
    params.m = d_m.as<uint32_t>();
    params.x = d_x.data();
    params.ldx = hidden;
    params.y = d_y.data();
    params.ldy = hidden;
    params.k = k;
    params.ids = d_ids.as<int32_t>();
    params.weights = d_weights.as<float>();
    params.workspace = workspace.data();
    params.workspace_bytes = workspace.bytes();
  }
  void upload_routing() {
    EXPECT_TRUE(d_ids.upload(ids.data(), ids.size() * sizeof(int32_t)));
    EXPECT_TRUE(d_weights.upload(weights.data(), weights.size() * sizeof(float)));
  }
  std::vector<float> y() const {
    std::vector<float> out(x.size());
    EXPECT_TRUE(d_y.download(out.data(), out.size() * sizeof(float)));
    return out;
  }
};

// The GPU layer against the FP64 reference: within twice the CPU's bound (the device sums in
// another order and its SwiGLU uses expf), plus the FP32 combine.
void expect_near_reference(const std::vector<float>& y, const MoeReference& ref,
                           const std::string& where) {
  int reported = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double tol = 2.0 * ref.tol[i] + 1e-6 * std::fabs(ref.y[i]) + 1e-30;
    if (!(std::fabs(y[i] - ref.y[i]) <= tol) && reported++ < 5) {
      ADD_FAILURE() << where << ": y[" << i << "] = " << y[i] << ", reference " << ref.y[i]
                    << " (tol " << tol << ")";
    }
  }
}

// Slot i of the call routes to expert i % experts, so that every expert is selected; uploaded
// and the device idle after it.
void route_every_expert(LayerCall* call, uint32_t experts) {
  for (size_t i = 0; i < call->ids.size(); ++i) call->ids[i] = static_cast<int32_t>(i % experts);
  call->upload_routing();
  QMOE_CUDA_OK(cudaDeviceSynchronize());
}

// The set's device residency map, read back (E entries: expert -> slot, or -1).
std::vector<int32_t> residency_map(const qmoe_cuda_expert_set* set, uint32_t experts) {
  const int32_t* map = nullptr;
  EXPECT_EQ(qmoe_cuda_expert_set_residency(set, &map), QMOE_STATUS_OK);
  std::vector<int32_t> m(experts);
  EXPECT_EQ(cudaMemcpy(m.data(), map, m.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return m;
}

// One forward captured on `stream` into *graph and instantiated into *exec (the caller destroys
// both).
void capture_forward(const qmoe_cuda_expert_set* set, const qmoe_cuda_moe_params& params,
                     cudaStream_t stream, cudaGraph_t* graph, cudaGraphExec_t* exec) {
  QMOE_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const qmoe_status captured = qmoe_cuda_moe_forward(set, &params, stream);
  QMOE_CUDA_OK(cudaStreamEndCapture(stream, graph));
  ASSERT_EQ(captured, QMOE_STATUS_OK) << qmoe_last_error_message();
  QMOE_CUDA_OK(cudaGraphInstantiate(exec, *graph, 0));
}

// A small random layer (6 experts, H = 64, I = 32) and its host expert set; each test makes
// the device sets it needs from it. Skips where no device is usable.
class CudaAbiLayer : public ::testing::Test {
 protected:
  void SetUp() override {
    QMOE_SKIP_WITHOUT_CUDA();
    o.experts = 6;
    o.hidden = 64;
    o.intermediate = 32;
    model = make_moe_model(o, rng);
    host = make_host_set(model->desc);
    ASSERT_TRUE(host);
  }
  std::string where() const { return "seed " + std::to_string(seed); }

  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng{seed};
  MoeOptions o;
  std::unique_ptr<MoeModel> model;
  HostSet host;
};

TEST_F(CudaAbiLayer, BothCopyModesGiveTheSameLayerAndItMeetsTheReference) {
  GpuSet batched = make_gpu_set(host.get(), {}, 0, QMOE_CUDA_COPY_BATCHED);
  GpuSet loop = make_gpu_set(host.get(), {}, 0, QMOE_CUDA_COPY_LOOP);
  ASSERT_TRUE(batched && loop);
  host.reset();  // the device copies no longer need the host set
  LayerCall call(batched.get(), o, 3, 2, rng);
  ASSERT_EQ(qmoe_cuda_moe_forward(batched.get(), &call.params, nullptr), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  ASSERT_EQ(qmoe_cuda_moe_check(call.workspace.data(), nullptr), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  const std::vector<float> y_batched = call.y();
  ASSERT_EQ(qmoe_cuda_moe_forward(loop.get(), &call.params, nullptr), QMOE_STATUS_OK);
  const std::vector<float> y_loop = call.y();
  EXPECT_EQ(std::memcmp(y_batched.data(), y_loop.data(), y_loop.size() * sizeof(float)), 0)
      << "seed " << seed;
  const MoeReference ref = reference_moe(*model, QMOE_ACCURACY_FAST, call.x, call.m, call.ids,
                                         call.weights, call.k, nullptr, {});
  expect_near_reference(y_batched, ref, where());
}

TEST_F(CudaAbiLayer, ExpertsNotResidentContributeNothing) {
  const std::vector<uint32_t> resident = {4, 1, 3};
  GpuSet set = make_gpu_set(host.get(), resident, 0, QMOE_CUDA_COPY_BATCHED);
  ASSERT_TRUE(set);
  const int32_t* map = nullptr;
  ASSERT_EQ(qmoe_cuda_expert_set_residency(set.get(), &map), QMOE_STATUS_OK);
  std::vector<int32_t> host_map(o.experts);
  QMOE_CUDA_OK(
      cudaMemcpy(host_map.data(), map, host_map.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  EXPECT_EQ(host_map, (std::vector<int32_t>{-1, 1, -1, 2, 0, -1}));
  std::vector<uint8_t> mask(o.experts, 0);
  for (uint32_t e : resident) mask[e] = 1;
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    LayerCall call(set.get(), o, 4, 3, rng);
    call.params.accuracy = level;
    ASSERT_EQ(qmoe_cuda_moe_forward(set.get(), &call.params, nullptr), QMOE_STATUS_OK)
        << qmoe_last_error_message();
    const MoeReference ref = reference_moe(*model, level, call.x, call.m, call.ids, call.weights,
                                           call.k, mask.data(), {});
    expect_near_reference(call.y(), ref, "level " + std::to_string(level) + " " + where());
  }
}

TEST_F(CudaAbiLayer, CapturedGraphReplaysWithNewRoutingAsEager) {
  GpuSet set = make_gpu_set(host.get(), {}, 0, QMOE_CUDA_COPY_BATCHED);
  ASSERT_TRUE(set);
  LayerCall call(set.get(), o, 2, 2, rng);
  cudaStream_t stream = nullptr;
  QMOE_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_NO_FATAL_FAILURE(capture_forward(set.get(), call.params, stream, &graph, &exec));
  std::uniform_int_distribution<int32_t> expert(0, static_cast<int32_t>(o.experts) - 1);
  for (int replay = 0; replay < 6; ++replay) {
    for (int32_t& id : call.ids) id = expert(rng);
    call.upload_routing();
    QMOE_CUDA_OK(cudaGraphLaunch(exec, stream));
    QMOE_CUDA_OK(cudaStreamSynchronize(stream));
    const std::vector<float> replayed = call.y();
    ASSERT_EQ(qmoe_cuda_moe_forward(set.get(), &call.params, stream), QMOE_STATUS_OK);
    QMOE_CUDA_OK(cudaStreamSynchronize(stream));
    const std::vector<float> eager = call.y();
    EXPECT_EQ(std::memcmp(replayed.data(), eager.data(), eager.size() * sizeof(float)), 0)
        << "replay " << replay << " seed " << seed;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// expert_counts: a graph captured once, replayed with new routing (zero weights and experts
// that are not resident among it), leaves each call's selections per expert, and an eager call
// the same; the E words are all the call writes there (the buffer's tail keeps its fill), and
// asking for them changes no bit of y.
TEST_F(CudaAbiLayer, ExpertCountsFollowEachReplaysRouting) {
  const std::vector<uint32_t> resident = {4, 1, 3};
  GpuSet set = make_gpu_set(host.get(), resident, 0, QMOE_CUDA_COPY_BATCHED);
  ASSERT_TRUE(set);
  LayerCall call(set.get(), o, 4, 3, rng);
  DeviceBuffer counts((o.experts + 4) * sizeof(uint32_t));
  call.params.expert_counts = counts.as<uint32_t>();
  cudaStream_t stream = nullptr;
  QMOE_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_NO_FATAL_FAILURE(capture_forward(set.get(), call.params, stream, &graph, &exec));
  const auto read_counts = [&] {
    std::vector<uint32_t> got(o.experts + 4);
    EXPECT_TRUE(counts.download(got.data(), got.size() * sizeof(uint32_t)));
    return got;
  };
  std::uniform_int_distribution<int32_t> expert(0, static_cast<int32_t>(o.experts) - 1);
  for (int replay = 0; replay < 5; ++replay) {
    for (int32_t& id : call.ids) id = expert(rng);
    call.ids[0] = 0;  // not resident
    call.weights[replay % call.weights.size()] = 0.0f;
    call.upload_routing();
    // The call's counts, then the buffer's tail still at its fill.
    std::vector<uint32_t> want =
        selections_per_expert(call.ids, call.weights, call.m, call.k, o.experts);
    want.resize(o.experts + 4, 0xFFFFFFFFu);
    const std::string what = "replay " + std::to_string(replay) + " " + where();
    QMOE_CUDA_OK(cudaMemset(counts.data(), 0xFF, counts.bytes()));
    QMOE_CUDA_OK(cudaDeviceSynchronize());  // the legacy stream's uploads and fill
    QMOE_CUDA_OK(cudaGraphLaunch(exec, stream));
    QMOE_CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_EQ(read_counts(), want) << "graph " << what;
    const std::vector<float> counted = call.y();
    QMOE_CUDA_OK(cudaMemset(counts.data(), 0xFF, counts.bytes()));
    QMOE_CUDA_OK(cudaDeviceSynchronize());
    ASSERT_EQ(qmoe_cuda_moe_forward(set.get(), &call.params, stream), QMOE_STATUS_OK);
    QMOE_CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_EQ(read_counts(), want) << "eager " << what;
    qmoe_cuda_moe_params plain = call.params;
    plain.expert_counts = nullptr;
    ASSERT_EQ(qmoe_cuda_moe_forward(set.get(), &plain, stream), QMOE_STATUS_OK);
    QMOE_CUDA_OK(cudaStreamSynchronize(stream));
    const std::vector<float> y = call.y();
    EXPECT_EQ(std::memcmp(counted.data(), y.data(), y.size() * sizeof(float)), 0) << what;
  }
  // A device-side error (an id outside [0, E)) zeroes every count.
  call.ids[1] = static_cast<int32_t>(o.experts);
  call.upload_routing();
  QMOE_CUDA_OK(cudaDeviceSynchronize());
  ASSERT_EQ(qmoe_cuda_moe_forward(set.get(), &call.params, stream), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_cuda_moe_check(call.workspace.data(), stream), QMOE_STATUS_INVALID_ARGUMENT);
  const std::vector<uint32_t> after_error = read_counts();
  EXPECT_EQ(std::vector<uint32_t>(after_error.begin(), after_error.begin() + o.experts),
            std::vector<uint32_t>(o.experts, 0u));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// expected_tokens_per_expert changes the kernels' tokens per work item (at capacity 8: the fast
// level 2 -> 4, the exact level 1 -> 8), never the bits: calls whose tokens all route to the
// same experts, and calls routed at random, give the same bytes with and without the hint, and
// meet the reference.
TEST_F(CudaAbiLayer, ExpectedTokensPerExpertKeepsTheBits) {
  GpuSet set = make_gpu_set(host.get(), {}, 0, QMOE_CUDA_COPY_BATCHED);
  ASSERT_TRUE(set);
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    for (bool shared : {true, false}) {
      LayerCall call(set.get(), o, 8, 2, rng);
      if (shared) {
        for (uint32_t t = 1; t < call.m; ++t) {
          std::copy_n(call.ids.begin(), call.k, call.ids.begin() + t * call.k);
        }
        call.upload_routing();
      }
      call.params.accuracy = level;
      const std::string what = std::string(shared ? "shared" : "random") + " level " +
                               std::to_string(level) + " " + where();
      ASSERT_EQ(qmoe_cuda_moe_forward(set.get(), &call.params, nullptr), QMOE_STATUS_OK)
          << qmoe_last_error_message();
      const std::vector<float> plain = call.y();
      QMOE_CUDA_OK(cudaMemset(call.d_y.data(), 0xFF, call.d_y.bytes()));
      call.params.expected_tokens_per_expert = 8.0f;
      ASSERT_EQ(qmoe_cuda_moe_forward(set.get(), &call.params, nullptr), QMOE_STATUS_OK)
          << qmoe_last_error_message();
      ASSERT_EQ(qmoe_cuda_moe_check(call.workspace.data(), nullptr), QMOE_STATUS_OK)
          << qmoe_last_error_message();
      const std::vector<float> hinted = call.y();
      EXPECT_EQ(std::memcmp(plain.data(), hinted.data(), plain.size() * sizeof(float)), 0) << what;
      const MoeReference ref =
          reference_moe(*model, level, call.x, call.m, call.ids, call.weights, call.k, nullptr, {});
      expect_near_reference(hinted, ref, what);
    }
  }
  LayerCall call(set.get(), o, 4, 2, rng);
  call.params.expected_tokens_per_expert = 4.5f;
  EXPECT_EQ(qmoe_cuda_moe_forward(set.get(), &call.params, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("expected_tokens_per_expert"),
            std::string::npos);
}

// Residency updates between calls, eager and in a captured graph: after each update a forward
// gives the bits of a set created with that residency, experts that stay keep their slots and
// are not copied, and a graph captured before the updates uses the new residency when replayed.
TEST_F(CudaAbiLayer, ResidencyUpdatesActLikeASetCreatedWithTheNewResidency) {
  qmoe_cuda_expert_set_desc d;
  qmoe_cuda_expert_set_desc_init(&d);
  d.experts = host.get();
  const std::vector<uint32_t> first = {4, 1, 3};
  d.resident = first.data();
  d.num_resident = static_cast<uint32_t>(first.size());
  d.num_slots = 4;
  qmoe_cuda_expert_set* raw = nullptr;
  ASSERT_EQ(qmoe_cuda_expert_set_create(&d, &raw), QMOE_STATUS_OK) << qmoe_last_error_message();
  GpuSet set(raw);
  cudaStream_t stream = nullptr;
  QMOE_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  LayerCall call(set.get(), o, 3, 3, rng);
  route_every_expert(&call, o.experts);
  auto read_map = [&] { return residency_map(set.get(), o.experts); };
  // Updates are refused on a capturing stream; the graph is captured around a plain forward.
  cudaGraph_t graph = nullptr;
  QMOE_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const qmoe_status in_capture = qmoe_cuda_expert_set_update_residency(
      set.get(), host.get(), first.data(), 3, stream, nullptr);
  const qmoe_status captured = qmoe_cuda_moe_forward(set.get(), &call.params, stream);
  QMOE_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  EXPECT_EQ(in_capture, QMOE_STATUS_INVALID_ARGUMENT);
  ASSERT_EQ(captured, QMOE_STATUS_OK) << qmoe_last_error_message();
  cudaGraphExec_t exec = nullptr;
  QMOE_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  std::vector<uint32_t> before = first;
  std::vector<int32_t> map_before = read_map();
  const std::vector<std::vector<uint32_t>> steps = {{1, 3, 5},    {0, 2, 4, 5}, {},
                                                    {5, 4, 3, 2}, {2, 0, 1},    {0, 1, 2, 3}};
  for (size_t step = 0; step < steps.size(); ++step) {
    const std::vector<uint32_t>& now = steps[step];
    const std::string at = "step " + std::to_string(step) + " " + where();
    uint32_t copied = 99;
    ASSERT_EQ(
        qmoe_cuda_expert_set_update_residency(set.get(), host.get(), now.data(),
                                              static_cast<uint32_t>(now.size()), stream, &copied),
        QMOE_STATUS_OK)
        << qmoe_last_error_message();
    uint32_t joined = 0;
    for (uint32_t e : now) {
      joined += std::find(before.begin(), before.end(), e) == before.end() ? 1 : 0;
    }
    EXPECT_EQ(copied, joined) << at;
    ASSERT_EQ(qmoe_cuda_moe_forward(set.get(), &call.params, stream), QMOE_STATUS_OK)
        << qmoe_last_error_message();
    QMOE_CUDA_OK(cudaStreamSynchronize(stream));
    const std::vector<float> eager = call.y();
    // The map: the resident experts in distinct slots below 4, those that stayed in theirs.
    const std::vector<int32_t> m = read_map();
    std::vector<bool> used(4, false);
    for (uint32_t e = 0; e < o.experts; ++e) {
      const bool resident = std::find(now.begin(), now.end(), e) != now.end();
      if (!resident) {
        EXPECT_EQ(m[e], -1) << "expert " << e << " " << at;
        continue;
      }
      ASSERT_GE(m[e], 0) << "expert " << e << " " << at;
      ASSERT_LT(m[e], 4) << "expert " << e << " " << at;
      EXPECT_FALSE(used[m[e]]) << "slot " << m[e] << " twice " << at;
      used[m[e]] = true;
      if (map_before[e] >= 0) EXPECT_EQ(m[e], map_before[e]) << "expert " << e << " moved " << at;
    }
    // A set created with this residency gives the same bits.
    if (!now.empty()) {
      GpuSet fresh = make_gpu_set(host.get(), now, 0, QMOE_CUDA_COPY_LOOP);
      ASSERT_TRUE(fresh);
      ASSERT_EQ(qmoe_cuda_moe_forward(fresh.get(), &call.params, stream), QMOE_STATUS_OK);
      QMOE_CUDA_OK(cudaStreamSynchronize(stream));
      const std::vector<float> expected = call.y();
      EXPECT_EQ(std::memcmp(eager.data(), expected.data(), eager.size() * sizeof(float)), 0) << at;
    }
    std::vector<uint8_t> mask(o.experts, 0);
    for (uint32_t e : now) mask[e] = 1;
    const MoeReference ref = reference_moe(*model, QMOE_ACCURACY_FAST, call.x, call.m, call.ids,
                                           call.weights, call.k, mask.data(), {});
    expect_near_reference(eager, ref, at);
    // The graph captured before any update reads the new residency.
    QMOE_CUDA_OK(cudaMemsetAsync(call.d_y.data(), 0xFF, call.d_y.bytes(), stream));
    QMOE_CUDA_OK(cudaGraphLaunch(exec, stream));
    QMOE_CUDA_OK(cudaStreamSynchronize(stream));
    const std::vector<float> replayed = call.y();
    EXPECT_EQ(std::memcmp(eager.data(), replayed.data(), eager.size() * sizeof(float)), 0) << at;
    before = now;
    map_before = m;
  }
  ASSERT_EQ(qmoe_cuda_moe_check(call.workspace.data(), stream), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The model's host set again, its weights copied into pinned memory. cudaMemcpyAsync from
// pageable memory waits for the stream's earlier work before it returns, so the copies of an
// update begun behind a busy copy stream would be done by the time the call returned; from
// pinned memory it returns at once, which the tests of a pending update need.
struct PinnedHostSet {
  void* memory = nullptr;
  std::vector<qmoe_quant_matrix> fc1, fc2;
  std::vector<const qmoe_quant_matrix*> fc1_of, fc2_of;
  HostSet set;
  PinnedHostSet() = default;
  PinnedHostSet(const PinnedHostSet&) = delete;
  PinnedHostSet& operator=(const PinnedHostSet&) = delete;
  ~PinnedHostSet() {
    set.reset();
    if (memory != nullptr) cudaFreeHost(memory);
  }
};

bool pin_host_set(const MoeModel& model, PinnedHostSet* out) {
  auto rounded = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  size_t total = 0;
  for (const std::vector<Int4Matrix>* list : {&model.fc1, &model.fc2}) {
    for (const Int4Matrix& m : *list) {
      total += rounded(m.codes.size()) + rounded(m.scales.size()) + rounded(m.zero_points.size()) +
               rounded(m.bias.size());
    }
  }
  if (cudaHostAlloc(&out->memory, std::max<size_t>(total, 1), cudaHostAllocDefault) !=
      cudaSuccess) {
    return false;
  }
  auto* at = static_cast<unsigned char*>(out->memory);
  // A pointer into `from` moves to the same offset of its pinned copy.
  auto move = [&](const void* p, const auto& from) -> const void* {
    if (from.empty()) return p;
    std::memcpy(at, from.data(), from.size());
    const void* moved = p == nullptr ? nullptr
                                     : at + (static_cast<const unsigned char*>(p) -
                                             reinterpret_cast<const unsigned char*>(from.data()));
    at += rounded(from.size());
    return moved;
  };
  for (int projection = 0; projection < 2; ++projection) {
    const std::vector<Int4Matrix>& list = projection == 0 ? model.fc1 : model.fc2;
    std::vector<qmoe_quant_matrix>& descs = projection == 0 ? out->fc1 : out->fc2;
    for (const Int4Matrix& m : list) {
      qmoe_quant_matrix d = m.desc;
      d.codes = move(d.codes, m.codes);
      d.scales = move(d.scales, m.scales);
      d.zero_points = static_cast<const uint8_t*>(move(d.zero_points, m.zero_points));
      d.bias = move(d.bias, m.bias);
      descs.push_back(d);
    }
  }
  for (const qmoe_quant_matrix& d : out->fc1) out->fc1_of.push_back(&d);
  for (const qmoe_quant_matrix& d : out->fc2) out->fc2_of.push_back(&d);
  qmoe_expert_set_desc d = model.desc;
  d.fc1 = out->fc1_of.data();
  d.fc2 = out->fc2_of.data();
  out->set = make_host_set(d);
  return static_cast<bool>(out->set);
}

// Spins for about `cycles` SM clocks: holds a stream up so that work queued behind it is still
// pending when the host enqueues more.
__global__ void spin_for(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// The stream of the forwards and the copy stream of the begun updates, non-blocking, destroyed
// with the object.
struct UpdateStreams {
  cudaStream_t stream = nullptr, copy_stream = nullptr;
  UpdateStreams() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking), cudaSuccess);
  }
  ~UpdateStreams() {
    cudaStreamDestroy(copy_stream);
    cudaStreamDestroy(stream);
  }
  UpdateStreams(const UpdateStreams&) = delete;
  UpdateStreams& operator=(const UpdateStreams&) = delete;
};

// A begun update, step by step: until it is finished, forwards skip the joiners and the leavers
// (the bits of a set holding the stayers only, the stayers in their slots); once finished, the
// bits of a set created with the new residency. Finishing without waiting returns 0 while the
// copies are held up and 1 once they are done; finishing with wait makes the stream wait.
TEST_F(CudaAbiLayer, BegunResidencyUpdatesSkipTheJoinersUntilFinished) {
  PinnedHostSet pinned;
  ASSERT_TRUE(pin_host_set(*model, &pinned));
  const std::vector<uint32_t> first = {4, 1, 3};
  GpuSet set = make_gpu_set(host.get(), first, 4, QMOE_CUDA_COPY_BATCHED);
  ASSERT_TRUE(set);
  UpdateStreams streams;
  cudaStream_t stream = streams.stream, copy_stream = streams.copy_stream;
  LayerCall call(set.get(), o, 3, 3, rng);
  route_every_expert(&call, o.experts);
  auto read_map = [&] { return residency_map(set.get(), o.experts); };
  // A forward's output against a set created holding `resident`: the same bits; with none
  // resident, the FP64 reference of no expert. Destroying the set synchronizes the device, so
  // this runs only after the checks that need the copies held up.
  auto expect_as_created_with = [&](const std::vector<float>& y,
                                    const std::vector<uint32_t>& resident, const std::string& at) {
    if (resident.empty()) {
      const std::vector<uint8_t> none(o.experts, 0);
      expect_near_reference(y,
                            reference_moe(*model, QMOE_ACCURACY_FAST, call.x, call.m, call.ids,
                                          call.weights, call.k, none.data(), {}),
                            at);
      return;
    }
    GpuSet fresh = make_gpu_set(host.get(), resident, 0, QMOE_CUDA_COPY_LOOP);
    ASSERT_TRUE(fresh);
    ASSERT_EQ(qmoe_cuda_moe_forward(fresh.get(), &call.params, stream), QMOE_STATUS_OK);
    QMOE_CUDA_OK(cudaStreamSynchronize(stream));
    const std::vector<float> expected = call.y();
    EXPECT_EQ(std::memcmp(y.data(), expected.data(), y.size() * sizeof(float)), 0) << at;
  };
  auto forward = [&] {
    EXPECT_EQ(qmoe_cuda_moe_forward(set.get(), &call.params, stream), QMOE_STATUS_OK)
        << qmoe_last_error_message();
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return call.y();
  };
  std::vector<uint32_t> before = first;
  const std::vector<std::vector<uint32_t>> steps = {{1, 3, 5},    {0, 2, 4, 5}, {},
                                                    {5, 4, 3, 2}, {2, 0, 1},    {0, 1, 2, 3}};
  for (size_t step = 0; step < steps.size(); ++step) {
    const std::vector<uint32_t>& now = steps[step];
    const std::string at = "step " + std::to_string(step) + " " + where();
    std::vector<uint32_t> stayers, joiners;
    for (uint32_t e : now) {
      const bool stays = std::find(before.begin(), before.end(), e) != before.end();
      (stays ? stayers : joiners).push_back(e);
    }
    const std::vector<int32_t> map_before = read_map();
    // Hold the copy stream up (about 100 ms), so that the copies are still pending when the
    // host asks below.
    spin_for<<<1, 1, 0, copy_stream>>>(200'000'000);
    QMOE_CUDA_OK(cudaGetLastError());
    uint32_t copied = 99;
    ASSERT_EQ(qmoe_cuda_expert_set_begin_residency_update(set.get(), pinned.set.get(), now.data(),
                                                          static_cast<uint32_t>(now.size()), stream,
                                                          copy_stream, &copied),
              QMOE_STATUS_OK)
        << qmoe_last_error_message();
    EXPECT_EQ(copied, joiners.size()) << at;
    const std::vector<float> between = forward();  // `stream` does not wait for the copies
    const std::vector<int32_t> m = read_map();
    for (uint32_t e = 0; e < o.experts; ++e) {
      const bool stays = std::find(stayers.begin(), stayers.end(), e) != stayers.end();
      EXPECT_EQ(m[e], stays ? map_before[e] : -1) << "expert " << e << " before finishing, " << at;
    }
    int finished = 7;
    if (step % 2 == 0) {
      // While the spin holds the copy stream, the copies' event cannot have completed: not
      // finished, nothing enqueued. (compute-sanitizer makes the copies synchronous, so there
      // begin returned after them and the stream is idle: finishing maps them at once.)
      const bool copies_held = cudaStreamQuery(copy_stream) == cudaErrorNotReady;
      cudaGetLastError();  // not ready is an answer, not an error to carry
      ASSERT_EQ(qmoe_cuda_expert_set_finish_residency_update(set.get(), stream, 0, &finished),
                QMOE_STATUS_OK)
          << qmoe_last_error_message();
      if (copies_held) {
        EXPECT_EQ(finished, 0) << at;
        EXPECT_EQ(read_map(), m) << at;
      }
      QMOE_CUDA_OK(cudaStreamSynchronize(copy_stream));
      ASSERT_EQ(qmoe_cuda_expert_set_finish_residency_update(set.get(), stream, 0, &finished),
                QMOE_STATUS_OK)
          << qmoe_last_error_message();
    } else {
      ASSERT_EQ(qmoe_cuda_expert_set_finish_residency_update(set.get(), stream, 1, &finished),
                QMOE_STATUS_OK)
          << qmoe_last_error_message();
    }
    EXPECT_EQ(finished, 1) << at;
    const std::vector<float> after = forward();
    const std::vector<int32_t> final_map = read_map();
    for (uint32_t e : stayers)
      EXPECT_EQ(final_map[e], map_before[e]) << "expert " << e << " " << at;
    for (uint32_t e = 0; e < o.experts; ++e) {
      const bool resident = std::find(now.begin(), now.end(), e) != now.end();
      EXPECT_EQ(final_map[e] >= 0, resident) << "expert " << e << " " << at;
    }
    expect_as_created_with(between, stayers, "before finishing, " + at);
    expect_as_created_with(after, now, "after finishing, " + at);
    before = now;
  }
}

// The lease on a leaving expert's slot: a forward queued behind slow work on the stream still
// reads the leaver from the slot a joiner takes, so the joiner's copies (on a stream of their
// own) wait for it. Copied at once, they would land before the forward ran and it would read the
// joiner's bytes in the leaver's place.
TEST_F(CudaAbiLayer, BegunUpdateCopiesWaitForTheForwardsBeforeThem) {
  const std::vector<uint32_t> first = {0, 1};
  GpuSet set = make_gpu_set(host.get(), first, 2, QMOE_CUDA_COPY_BATCHED);
  ASSERT_TRUE(set);
  UpdateStreams streams;
  cudaStream_t stream = streams.stream, copy_stream = streams.copy_stream;
  LayerCall call(set.get(), o, 4, 2, rng);
  route_every_expert(&call, 4);
  GpuSet reference_set = make_gpu_set(host.get(), first, 0, QMOE_CUDA_COPY_LOOP);
  ASSERT_TRUE(reference_set);
  ASSERT_EQ(qmoe_cuda_moe_forward(reference_set.get(), &call.params, stream), QMOE_STATUS_OK);
  QMOE_CUDA_OK(cudaStreamSynchronize(stream));
  const std::vector<float> expected = call.y();
  QMOE_CUDA_OK(cudaMemset(call.d_y.data(), 0xFF, call.d_y.bytes()));
  // About 50 ms of spin, then a forward of experts 0 and 1, then the update that moves 2 and 3
  // into their slots.
  spin_for<<<1, 1, 0, stream>>>(100'000'000);
  QMOE_CUDA_OK(cudaGetLastError());
  ASSERT_EQ(qmoe_cuda_moe_forward(set.get(), &call.params, stream), QMOE_STATUS_OK);
  const uint32_t next[] = {2, 3};
  uint32_t copied = 0;
  ASSERT_EQ(qmoe_cuda_expert_set_begin_residency_update(set.get(), host.get(), next, 2, stream,
                                                        copy_stream, &copied),
            QMOE_STATUS_OK)
      << qmoe_last_error_message();
  EXPECT_EQ(copied, 2u);
  QMOE_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> got = call.y();
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0) << where();
  int finished = 0;
  ASSERT_EQ(qmoe_cuda_expert_set_finish_residency_update(set.get(), stream, 0, &finished),
            QMOE_STATUS_OK);
  EXPECT_EQ(finished, 1);
}

// Updates enqueued faster than the stream runs them (held up behind a spin), plain and begun,
// twelve stagings through the set's two pinned images: every forward reads the residency of the
// update just before it. (The set rewrites an image only once its copies have run, as CUDA's
// contract for asynchronous copies asks. The H100's driver was seen to take copies this small
// into its command stream when they are enqueued, so there a set without that wait passes too.)
TEST_F(CudaAbiLayer, QueuedResidencyUpdatesEachReachTheForwardAfterThem) {
  PinnedHostSet pinned;
  ASSERT_TRUE(pin_host_set(*model, &pinned));
  const std::vector<uint32_t> first = {0, 1};
  GpuSet set = make_gpu_set(host.get(), first, 3, QMOE_CUDA_COPY_BATCHED);
  ASSERT_TRUE(set);
  UpdateStreams streams;
  cudaStream_t stream = streams.stream, copy_stream = streams.copy_stream;
  LayerCall call(set.get(), o, 3, 3, rng);
  route_every_expert(&call, o.experts);
  const std::vector<std::vector<uint32_t>> steps = {{1, 3, 5}, {0, 2}, {4},
                                                    {5, 4, 3}, {},     {2, 0, 1}};
  // [forward]: the residency it must see and a copy of its output, taken on the stream.
  std::vector<std::vector<uint32_t>> seen;
  std::vector<DeviceBuffer> outputs;
  auto forward = [&](const std::vector<uint32_t>& resident) {
    ASSERT_EQ(qmoe_cuda_moe_forward(set.get(), &call.params, stream), QMOE_STATUS_OK)
        << qmoe_last_error_message();
    outputs.emplace_back(call.d_y.bytes());
    QMOE_CUDA_OK(cudaMemcpyAsync(outputs.back().data(), call.d_y.data(), call.d_y.bytes(),
                                 cudaMemcpyDeviceToDevice, stream));
    seen.push_back(resident);
  };
  // About 50 ms of spin, then every update and forward queued behind it.
  spin_for<<<1, 1, 0, stream>>>(100'000'000);
  QMOE_CUDA_OK(cudaGetLastError());
  for (const std::vector<uint32_t>& now : steps) {
    ASSERT_EQ(
        qmoe_cuda_expert_set_update_residency(set.get(), pinned.set.get(), now.data(),
                                              static_cast<uint32_t>(now.size()), stream, nullptr),
        QMOE_STATUS_OK)
        << qmoe_last_error_message();
    forward(now);
  }
  std::vector<uint32_t> before = steps.back();
  spin_for<<<1, 1, 0, stream>>>(100'000'000);
  QMOE_CUDA_OK(cudaGetLastError());
  for (const std::vector<uint32_t>& now : steps) {
    std::vector<uint32_t> stayers;
    for (uint32_t e : now) {
      if (std::find(before.begin(), before.end(), e) != before.end()) stayers.push_back(e);
    }
    uint32_t copied = 0;
    ASSERT_EQ(qmoe_cuda_expert_set_begin_residency_update(set.get(), pinned.set.get(), now.data(),
                                                          static_cast<uint32_t>(now.size()), stream,
                                                          copy_stream, &copied),
              QMOE_STATUS_OK)
        << qmoe_last_error_message();
    forward(stayers);
    int finished = 0;
    ASSERT_EQ(qmoe_cuda_expert_set_finish_residency_update(set.get(), stream, 1, &finished),
              QMOE_STATUS_OK)
        << qmoe_last_error_message();
    EXPECT_EQ(finished, 1);
    forward(now);
    before = now;
  }
  QMOE_CUDA_OK(cudaDeviceSynchronize());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string at = "forward " + std::to_string(i) + " " + where();
    std::vector<float> got(call.d_y.bytes() / sizeof(float));
    ASSERT_TRUE(outputs[i].download(got.data(), call.d_y.bytes()));
    std::vector<float> expected;
    if (seen[i].empty()) {
      // No expert resident: every output row is zero.
      expected.assign(got.size(), 0.0f);
    } else {
      GpuSet fresh = make_gpu_set(host.get(), seen[i], 0, QMOE_CUDA_COPY_LOOP);
      ASSERT_TRUE(fresh);
      ASSERT_EQ(qmoe_cuda_moe_forward(fresh.get(), &call.params, stream), QMOE_STATUS_OK);
      QMOE_CUDA_OK(cudaStreamSynchronize(stream));
      expected = call.y();
    }
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0) << at;
  }
}

TEST_F(CudaAbiLayer, DeviceSideErrorsAreReadBackAndHostPointersRefused) {
  GpuSet set = make_gpu_set(host.get(), {}, 0, QMOE_CUDA_COPY_LOOP);
  ASSERT_TRUE(set);
  LayerCall call(set.get(), o, 2, 2, rng);
  call.ids[1] = 99;  // outside [0, 6): only the device can see it
  call.upload_routing();
  ASSERT_EQ(qmoe_cuda_moe_forward(set.get(), &call.params, nullptr), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_cuda_moe_check(call.workspace.data(), nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("expert id"), std::string::npos)
      << qmoe_last_error_message();
  for (float v : call.y()) EXPECT_EQ(v, 0.0f);
  // Host memory where device memory belongs is refused before anything is launched.
  qmoe_cuda_moe_params bad = call.params;
  bad.x = call.x.data();
  EXPECT_EQ(qmoe_cuda_moe_forward(set.get(), &bad, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("params->x"), std::string::npos);
  // The host-side checks of the params.
  bad = call.params;
  bad.logits = call.d_x.data();  // both routings
  EXPECT_EQ(qmoe_cuda_moe_forward(set.get(), &bad, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  bad = call.params;
  bad.workspace_bytes = 16;
  EXPECT_EQ(qmoe_cuda_moe_forward(set.get(), &bad, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  bad = call.params;
  bad.workspace = static_cast<unsigned char*>(call.workspace.data()) + 8;
  EXPECT_EQ(qmoe_cuda_moe_forward(set.get(), &bad, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  bad = call.params;
  bad.k = 7;
  EXPECT_EQ(qmoe_cuda_moe_forward(set.get(), &bad, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  // A device ordinal past the visible ones.
  int count = 0;
  ASSERT_EQ(qmoe_cuda_get_device_count(&count), QMOE_STATUS_OK);
  qmoe_cuda_expert_set_desc d;
  qmoe_cuda_expert_set_desc_init(&d);
  d.experts = host.get();
  d.device = count;
  qmoe_cuda_expert_set* raw = reinterpret_cast<qmoe_cuda_expert_set*>(0x1);
  EXPECT_EQ(qmoe_cuda_expert_set_create(&d, &raw), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(raw, nullptr);
}

// qmoe_cuda_gemm against the FP64 reference: the GEMV rows (M <= 8) within the level's bound,
// the tensor-core rows (16-bit X as given, FP32 X at the fast level as a BF16 pair) within the
// accumulation bound of lib/cuda/int4_gemm_tc.cuh plus X's own rounding, or at the fast level
// with BF16 X within the scaled weights' bound.
TEST(CudaAbi, GemmAtDecodeAndPrefillSizesMeetsTheReference) {
  QMOE_SKIP_WITHOUT_CUDA();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  Int4Options opt;
  opt.n = 72;
  opt.k = 256;
  opt.scale_order = ScaleOrder::kGrouped;
  opt.zero_points = true;
  opt.bias = true;
  const Int4Matrix w = make_int4_matrix(opt, rng);
  const auto dw = upload_matrix(w);
  qmoe_quant_matrix desc = w.desc;
  desc.codes = dw->desc.codes;
  desc.scales = dw->desc.scales;
  desc.zero_points = dw->desc.zero_points;
  desc.bias = dw->desc.bias;
  for (uint32_t m : {1u, 4u, 8u, 17u, 64u}) {
    for (qmoe_dtype xd : {QMOE_DTYPE_F32, QMOE_DTYPE_BF16}) {
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        std::vector<float> x = random_activations(m, opt.k, rng);
        const std::vector<unsigned char> xb = to_dtype(xd, x);
        x = from_dtype(xd, xb);  // the values the device reads
        const Reference ref = reference_gemm(w, x, m);
        DeviceBuffer d_x(xb.size()), d_y(size_t{m} * opt.n * sizeof(float));
        ASSERT_TRUE(d_x.upload(xb.data(), xb.size()));
        ASSERT_TRUE(d_y.fill(0x7F));
        ASSERT_EQ(qmoe_cuda_gemm(&desc, level, m, xd, d_x.data(), opt.k, QMOE_DTYPE_F32, d_y.data(),
                                 opt.n, 0, opt.n, nullptr),
                  QMOE_STATUS_OK)
            << qmoe_last_error_message();
        QMOE_CUDA_OK(cudaDeviceSynchronize());
        std::vector<float> y(size_t{m} * opt.n);
        ASSERT_TRUE(d_y.download(y.data(), y.size() * sizeof(float)));
        const bool tensor_cores = m > 8 && !(level == QMOE_ACCURACY_EXACT && xd == QMOE_DTYPE_F32);
        int reported = 0;
        for (size_t i = 0; i < y.size(); ++i) {
          double tol;
          if (tensor_cores && level == QMOE_ACCURACY_FAST && xd == QMOE_DTYPE_BF16) {
            // The fast level's bound (docs/abi.md): the weights may be scaled to BF16 before
            // the MMA (a wgmma tile, FP16 scales), w + acc (1 + w).
            const double wb = std::ldexp(1.0, -8);
            const double acc = (32.0 * ((opt.k + 15) / 16) + 2) * std::ldexp(1.0, -23);
            tol = (wb + acc * (1.0 + wb)) * ref.abs_sum[i];
          } else if (tensor_cores) {
            tol = (xd == QMOE_DTYPE_F32 ? std::ldexp(1.0, -16) : 0.0) * ref.abs_sum[i] +
                  (32.0 * 4 + opt.k / 32.0 + 2) * std::ldexp(1.0, -23) * ref.abs_sum[i];
          } else {
            tol = level == QMOE_ACCURACY_EXACT ? 2e-5 * ref.abs_sum[i] : 2.0 * ref.fast_bound[i];
          }
          tol += 1e-30;
          if (!(std::fabs(y[i] - ref.y[i]) <= tol) && reported++ < 3) {
            ADD_FAILURE() << "m=" << m << " x " << dtype_label(xd) << " level " << level
                          << (tensor_cores ? " (tensor cores)" : " (GEMV)") << ": y[" << i
                          << "] = " << y[i] << ", reference " << ref.y[i] << " (tol " << tol
                          << "), seed " << seed;
          }
        }
      }
    }
  }
  // Host pointers are refused.
  std::vector<float> x(opt.k, 1.0f), y(opt.n);
  EXPECT_EQ(qmoe_cuda_gemm(&desc, QMOE_ACCURACY_FAST, 1, QMOE_DTYPE_F32, x.data(), opt.k,
                           QMOE_DTYPE_F32, y.data(), opt.n, 0, opt.n, nullptr),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_cuda_gemm(&w.desc, QMOE_ACCURACY_FAST, 1, QMOE_DTYPE_F32, x.data(), opt.k,
                           QMOE_DTYPE_F32, y.data(), opt.n, 0, opt.n, nullptr),
            QMOE_STATUS_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace qmoe::testing
