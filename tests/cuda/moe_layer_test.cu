// The CUDA MoE layer (lib/cuda/moe_layer.cuh) against the FP64 layer reference
// (tests/moe/moe_reference.h) and the CPU library's qmoe_moe_forward (both routings) with the
// residency as the run mask: both routings, both fusions,
// clamp on/off, accumulate on/off, each dtype, all-resident and partial residency, capacities
// from 1 to 12 tokens; a captured graph replayed with different routing against eager launches
// bit for bit; run-to-run bits; the error word. Every test skips, naming the reason, without a
// usable device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include "lib/cuda/int4_tile.cuh"
#include "lib/cuda/moe_layer.cuh"
#include "qmoe/qmoe.h"
#include "tests/cpu/isa_test_util.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/layer_call_util.h"
#include "tests/moe/moe_reference.h"

namespace qmoe::testing {
namespace {

// Experts on the device: expert e's projections are distinct matrix e % distinct; slot s holds
// expert slot_expert[s]; residency[e] is e's slot or -1.
struct DeviceExperts {
  std::vector<std::unique_ptr<DeviceInt4Matrix>> fc1, fc2;  // per distinct matrix
  DeviceBuffer fc1_desc, fc2_desc;                          // [slots] DeviceQuantMatrix
  DeviceBuffer residency;                                   // [E]
  std::vector<int32_t> host_residency;
  std::vector<uint8_t> run_mask;  // residency >= 0, for the CPU and the reference
  uint32_t slots = 0;
  bool lean = true;  // every slot's INT4 layout is lean: the calls set lean_walk, as a set does
};

// Uploads the distinct matrices and assigns slots: every expert resident, or about two in three.
std::unique_ptr<DeviceExperts> upload_experts(const std::vector<const Int4Matrix*>& fc1,
                                              const std::vector<const Int4Matrix*>& fc2,
                                              uint32_t distinct, bool partial,
                                              std::mt19937_64& rng) {
  auto d = std::make_unique<DeviceExperts>();
  const uint32_t experts = static_cast<uint32_t>(fc1.size());
  for (uint32_t i = 0; i < distinct; ++i) {
    d->fc1.push_back(upload_matrix(*fc1[i]));
    d->fc2.push_back(upload_matrix(*fc2[i]));
  }
  std::vector<uint32_t> order(experts);
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin(), order.end(), rng);
  d->host_residency.assign(experts, -1);
  std::vector<cuda::DeviceQuantMatrix> d1, d2;
  for (uint32_t e : order) {
    if (partial && rng() % 3 == 0) continue;
    d->host_residency[e] = static_cast<int32_t>(d1.size());
    d1.push_back(d->fc1[e % distinct]->desc);
    d2.push_back(d->fc2[e % distinct]->desc);
  }
  if (d1.empty()) {  // keep one slot so the arrays exist
    d->host_residency[order[0]] = 0;
    d1.push_back(d->fc1[order[0] % distinct]->desc);
    d2.push_back(d->fc2[order[0] % distinct]->desc);
  }
  d->slots = static_cast<uint32_t>(d1.size());
  for (size_t i = 0; i < d1.size(); ++i) {
    d->lean = d->lean && cuda::int4_lean_layout(d1[i]) && cuda::int4_lean_layout(d2[i]);
  }
  d->fc1_desc = DeviceBuffer(d1.size() * sizeof(d1[0]));
  d->fc2_desc = DeviceBuffer(d2.size() * sizeof(d2[0]));
  EXPECT_TRUE(d->fc1_desc.upload(d1.data(), d1.size() * sizeof(d1[0])));
  EXPECT_TRUE(d->fc2_desc.upload(d2.data(), d2.size() * sizeof(d2[0])));
  d->residency = DeviceBuffer(experts * sizeof(int32_t));
  EXPECT_TRUE(d->residency.upload(d->host_residency.data(), experts * sizeof(int32_t)));
  for (int32_t s : d->host_residency) d->run_mask.push_back(s >= 0 ? 1 : 0);
  return d;
}

// One call's inputs on the host.
struct Inputs {
  uint32_t m = 1;
  std::vector<float> x;        // [m][H] values (representable in the dtype)
  std::vector<int32_t> ids;    // [m][k]
  std::vector<float> weights;  // [m][k]
  std::vector<float> logits;   // [m][E] (logits routing), representable in the dtype
  std::vector<float> y0;       // [m][H] initial y for accumulate
};

std::vector<float> round_trip(qmoe_dtype d, const std::vector<float>& v) {
  return from_dtype(d, to_dtype(d, v));
}

Inputs random_inputs(uint32_t m, uint32_t hidden, uint32_t experts, uint32_t k, qmoe_dtype d,
                     bool logits, std::mt19937_64& rng) {
  Inputs in;
  in.m = m;
  in.x = round_trip(d, random_activations(m, hidden, rng));
  random_routing(m, experts, k, rng, &in.ids, &in.weights);
  for (size_t i = 0; i < in.weights.size(); i += 5) in.weights[i] = 0.0f;  // skipped slots
  if (logits) {
    std::normal_distribution<float> normal(0.0f, 2.0f);
    in.logits.resize(size_t{m} * experts);
    for (auto& v : in.logits) v = normal(rng);
    // Exact ties (to the lower id) and a -inf.
    for (uint32_t t = 0; t < m; ++t) {
      float* row = in.logits.data() + size_t{t} * experts;
      if (experts > 3) row[experts - 1] = row[1];
      if (experts > 4) row[2] = -INFINITY;
    }
    in.logits = round_trip(d, in.logits);
  }
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  in.y0.resize(size_t{m} * hidden);
  for (auto& v : in.y0) v = u(rng);
  in.y0 = round_trip(d, in.y0);
  return in;
}

// The routing the CPU derives from the logits (qmoe_moe_route_topk on the widened values).
void route_on_host(Inputs& in, uint32_t experts, uint32_t k, bool renormalize) {
  in.ids.assign(size_t{in.m} * k, 0);
  in.weights.assign(size_t{in.m} * k, 0.0f);
  ASSERT_EQ(qmoe_moe_route_topk(in.logits.data(), in.m, experts, k, renormalize ? 1 : 0,
                                in.ids.data(), in.weights.data()),
            QMOE_STATUS_OK)
      << qmoe_last_error_message();
}

// The device side of one layer configuration: buffers sized for the capacity
// (tests/cuda/layer_call_util.h: X and Y at strides past H, Y between guards) and the params.
struct DeviceCall : LayerBuffers {
  using LayerBuffers::LayerBuffers;
  cuda::MoeLayerParams params{};

  // Writes the call's inputs (and y: y0 or poison) into the device buffers.
  void write(const Inputs& in, bool accumulate) {
    LayerBuffers::write(in.m, in.x, in.y0, accumulate, in.ids, in.weights, in.logits);
  }
  uint32_t read_error() const {
    uint32_t e = 0xFFFFFFFFu;
    EXPECT_TRUE(d_workspace.download(&e, 4));
    return e;
  }
};

std::unique_ptr<DeviceCall> make_call(const MoeOptions& o, const DeviceExperts& ex,
                                      qmoe_accuracy acc, qmoe_dtype dtype, uint32_t capacity,
                                      uint32_t k, bool logits, bool renormalize, bool accumulate) {
  const size_t ws =
      cuda::moe_layer_workspace_size(capacity, k, o.experts, o.hidden, o.intermediate);
  EXPECT_GT(ws, 0u);
  auto c = std::make_unique<DeviceCall>(dtype, capacity, o.hidden, o.experts, k, ws);
  cuda::MoeLayerParams& p = c->params;
  p.num_experts = o.experts;
  p.hidden = o.hidden;
  p.intermediate = o.intermediate;
  p.top_k = k;
  p.num_slots = ex.slots;
  p.fusion = o.fusion;
  p.alpha = o.alpha;
  p.beta = o.beta;
  p.limit = o.limit;
  p.format = QMOE_WEIGHT_FORMAT_INT4;
  p.lean_walk = ex.lean;
  p.fc1 = ex.fc1_desc.as<const cuda::DeviceQuantMatrix>();
  p.fc2 = ex.fc2_desc.as<const cuda::DeviceQuantMatrix>();
  p.residency = ex.residency.as<const int32_t>();
  c->fill_params(&p, acc, logits, renormalize, accumulate);
  return c;
}

// The CPU library's layer on the same inputs (dtype in and out, residency as the run mask).
std::vector<float> cpu_forward(const qmoe_expert_set_desc& desc, qmoe_accuracy acc,
                               qmoe_dtype dtype, const Inputs& in, uint32_t k, bool logits,
                               bool renormalize, bool accumulate, const uint8_t* run_mask) {
  qmoe_context* ctx = nullptr;
  qmoe_expert_set* set = nullptr;
  EXPECT_EQ(qmoe_context_create(nullptr, &ctx), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_expert_set_create(&desc, &set), QMOE_STATUS_OK) << qmoe_last_error_message();
  const uint32_t hidden = desc.hidden;
  std::vector<unsigned char> x = to_dtype(dtype, in.x);
  std::vector<unsigned char> y = accumulate
                                     ? to_dtype(dtype, in.y0)
                                     : std::vector<unsigned char>(in.x.size() * dtype_size(dtype));
  qmoe_moe_params p;
  qmoe_moe_params_init(&p);
  p.accuracy = acc;
  p.m = in.m;
  p.dtype = dtype;
  p.x = x.data();
  p.ldx = hidden;
  p.y = y.data();
  p.ldy = hidden;
  p.k = k;
  p.run_mask = run_mask;
  p.accumulate = accumulate ? 1 : 0;
  const std::vector<unsigned char> l =
      logits ? to_dtype(dtype, in.logits) : std::vector<unsigned char>();
  if (logits) {
    p.logits = l.data();
    p.renormalize = renormalize ? 1 : 0;
  } else {
    p.ids = in.ids.data();
    p.weights = in.weights.data();
  }
  EXPECT_EQ(qmoe_moe_forward(ctx, set, &p), QMOE_STATUS_OK) << qmoe_last_error_message();
  qmoe_expert_set_destroy(set);
  qmoe_context_destroy(ctx);
  return from_dtype(dtype, y);
}

// GPU output rows [0, m) against the FP64 reference and the CPU library. With logits routing
// the device computes its own softmax weights (expf, a tree sum) and the reference uses the
// CPU's, a few ulps apart: the bound is doubled for that.
void check_layer(const DeviceCall& c, const std::vector<unsigned char>& yb, const MoeReference& ref,
                 const std::vector<float>& cpu, uint32_t m, const std::string& what) {
  check_layer_outputs(c, yb, m, ref, cpu, c.params.logits != nullptr, what);
}

class CudaMoeLayer : public ::testing::Test {
 protected:
  void SetUp() override {
    QMOE_SKIP_WITHOUT_CUDA();
    seed_ = fresh_seed();
    rng_.seed(seed_);
  }
  void TearDown() override {
    if (HasFailure()) std::printf("seed %llu\n", static_cast<unsigned long long>(seed_));
  }
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

struct Case {
  qmoe_accuracy acc;
  qmoe_dtype dtype;
  qmoe_swiglu_fusion fusion;
  bool clamp, accumulate, logits, renormalize, partial;
  uint32_t capacity, m, k;
  bool early;  // inputs_ready_early
};

std::string describe(const Case& c, const MoeOptions& o) {
  std::ostringstream s;
  s << (c.acc == QMOE_ACCURACY_EXACT ? "exact" : "fast") << " " << dtype_label(c.dtype)
    << (c.clamp ? " clamp" : "") << (c.accumulate ? " accumulate" : "")
    << (c.logits ? (c.renormalize ? " logits/renormalized" : " logits/softmax-all") : " ids")
    << (c.partial ? " partial-residency" : " all-resident") << " capacity=" << c.capacity
    << " m=" << c.m << " k=" << c.k << (c.early ? " early-routing" : "") << " " << o.describe();
  return s.str();
}

void run_case(const Case& cs, const MoeOptions& base, std::mt19937_64& rng) {
  MoeOptions o = base;
  o.fusion = cs.fusion;
  if (cs.clamp) {
    use_gpt_oss_swiglu(&o);
  } else {
    use_qwen3_swiglu(&o);
  }
  const auto model = make_moe_model(o, rng);
  std::vector<const Int4Matrix*> f1, f2;
  for (uint32_t e = 0; e < o.experts; ++e) {
    f1.push_back(&model->fc1[e]);
    f2.push_back(&model->fc2[e]);
  }
  const auto ex = upload_experts(f1, f2, o.experts, cs.partial, rng);
  auto call = make_call(o, *ex, cs.acc, cs.dtype, cs.capacity, cs.k, cs.logits, cs.renormalize,
                        cs.accumulate);
  Inputs in = random_inputs(cs.m, o.hidden, o.experts, cs.k, cs.dtype, cs.logits, rng);
  if (cs.logits) route_on_host(in, o.experts, cs.k, cs.renormalize);
  call->params.inputs_ready_early = cs.early;  // inputs are written before the launch
  call->write(in, cs.accumulate);
  QMOE_CUDA_OK(cuda::launch_moe_layer(call->params, nullptr));
  QMOE_CUDA_OK(cudaDeviceSynchronize());
  const std::string what = describe(cs, o);
  EXPECT_EQ(call->read_error(), 0u) << what;
  const std::vector<unsigned char> yb = call->read_y();
  EXPECT_EQ(call->touched_outside(yb, cs.m), 0u) << "bytes outside rows [0, m) x [0, H) " << what;
  const MoeReference ref =
      reference_moe(*model, cs.acc, in.x, cs.m, in.ids, in.weights, cs.k, ex->run_mask.data(),
                    cs.accumulate ? in.y0 : std::vector<float>{});
  const std::vector<float> cpu = cpu_forward(model->desc, cs.acc, cs.dtype, in, cs.k, cs.logits,
                                             cs.renormalize, cs.accumulate, ex->run_mask.data());
  check_layer(*call, yb, ref, cpu, cs.m, what);
}

TEST_F(CudaMoeLayer, MatchesReferenceAndCpuAcrossOptions) {
  // Two layer shapes: H % 32 == 16 and I % 32 == 16 (block 16: half-filled last chunks, a
  // partial last FC1 unit), zero points, BF16 scales; and blocks 32/64 with FP16/FP32 scales.
  const MoeOptions a = small_layer_a(), b = small_layer_b();
  struct Size {
    uint32_t capacity, m, k;
  };
  // Capacity 12 with m = 12 and k = 5 gives experts more than 8 tokens (several work items).
  const Size sizes[] = {{1, 1, 2}, {4, 3, 2}, {8, 8, 3}, {12, 12, 5}, {2, 2, 6}, {16, 5, 4}};
  const qmoe_dtype dtypes[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
  int index = 0;
  for (qmoe_accuracy acc : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    for (qmoe_dtype dtype : dtypes) {
      for (qmoe_swiglu_fusion fusion : {QMOE_SWIGLU_INTERLEAVED, QMOE_SWIGLU_CONCATENATED}) {
        for (int flags = 0; flags < 16; ++flags, ++index) {
          if (HasFailure()) return;
          const Size sz = sizes[index % 6];
          const int routing = (index / 6) % 3;  // ids, logits renormalized, logits over all E
          Case c{acc,          dtype,         fusion,           (flags & 1) != 0, (flags & 2) != 0,
                 routing != 0, routing == 1,  (flags & 4) != 0, sz.capacity,      sz.m,
                 sz.k,         index % 2 == 1};
          run_case(c, (flags & 8) ? b : a, rng_);
        }
      }
    }
  }
}

// Qwen3-30B-A3B's layer shape: E 128, H 2048, I 768, top-8, block 32, FP16 scales in the
// grouped order, both gate/up fusions (concatenated at M = 1: spread FC1 segments, at M = 4:
// a warp walks a task's two groups in turn). 16 distinct expert weights back the 128 experts
// (expert e uses matrix e % 16), all resident, so the test stays small; run twice for the bits.
TEST_F(CudaMoeLayer, Qwen3ShapeMatchesReferenceAndCpuRunToRun) {
  const MoeOptions o = qwen3_layer(16);
  const auto model = make_moe_model(o, rng_);
  constexpr uint32_t kExperts = 128, kTopK = 8;
  std::vector<const Int4Matrix*> f1, f2;
  std::vector<const qmoe_quant_matrix*> d1, d2;
  for (uint32_t e = 0; e < kExperts; ++e) {
    f1.push_back(&model->fc1[e % 16]);
    f2.push_back(&model->fc2[e % 16]);
    d1.push_back(&model->fc1[e % 16].desc);
    d2.push_back(&model->fc2[e % 16].desc);
  }
  MoeOptions big = o;
  big.experts = kExperts;
  qmoe_expert_set_desc desc = model->desc;
  desc.num_experts = kExperts;
  desc.fc1 = d1.data();
  desc.fc2 = d2.data();
  const auto ex = upload_experts(f1, f2, 16, false, rng_);
  // m tokens in a call of `capacity`, run twice: the same bits, the reference's values. The
  // fast level routes from logits, the exact level from ids.
  const auto check = [&](qmoe_accuracy acc, qmoe_dtype dtype, qmoe_swiglu_fusion fusion,
                         uint32_t capacity, uint32_t m) {
    const bool logits = acc == QMOE_ACCURACY_FAST;
    big.fusion = fusion;
    desc.swiglu_fusion = fusion;
    auto call = make_call(big, *ex, acc, dtype, capacity, kTopK, logits, true, false);
    Inputs in = random_inputs(m, o.hidden, kExperts, kTopK, dtype, logits, rng_);
    if (logits) route_on_host(in, kExperts, kTopK, true);
    call->write(in, false);
    QMOE_CUDA_OK(cuda::launch_moe_layer(call->params, nullptr));
    QMOE_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<unsigned char> first = call->read_y();
    QMOE_CUDA_OK(cuda::launch_moe_layer(call->params, nullptr));
    QMOE_CUDA_OK(cudaDeviceSynchronize());
    const std::vector<unsigned char> second = call->read_y();
    EXPECT_EQ(call->read_error(), 0u);
    EXPECT_TRUE(first == second) << "two runs on the same inputs differ in their bits";
    const MoeReference ref =
        reference_moe_experts(big, f1, f2, acc, in.x, m, in.ids, in.weights, kTopK, nullptr, {});
    const std::vector<float> cpu =
        cpu_forward(desc, acc, dtype, in, kTopK, logits, true, false, nullptr);
    check_layer(*call, first, ref, cpu, m,
                std::string("qwen3 ") + (acc == QMOE_ACCURACY_FAST ? "fast" : "exact") +
                    (fusion == QMOE_SWIGLU_CONCATENATED ? " concatenated" : "") +
                    " capacity=" + std::to_string(capacity) + " m=" + std::to_string(m));
  };
  for (qmoe_accuracy acc : {QMOE_ACCURACY_FAST, QMOE_ACCURACY_EXACT}) {
    for (uint32_t m : {1u, 4u}) {
      const qmoe_dtype dtype = m == 1 ? QMOE_DTYPE_F16 : QMOE_DTYPE_BF16;
      for (qmoe_swiglu_fusion fusion : {QMOE_SWIGLU_INTERLEAVED, QMOE_SWIGLU_CONCATENATED}) {
        check(acc, dtype, fusion, m, m);
      }
    }
  }
  // A capacity of 48 at the exact level: FC1's dynamic shared memory (its routing tables grow
  // with the capacity) is 45,584 bytes, under 48 KiB but over 48 KiB less the kernel's static
  // shared memory, so the launch needs the raised limit (launch_decode_kernel); it failed with
  // cudaErrorInvalidValue when only launches over 48 KiB raised it.
  check(QMOE_ACCURACY_EXACT, QMOE_DTYPE_BF16, QMOE_SWIGLU_INTERLEAVED, 48, 3);
  // The same capacity at the fast level: four tokens a work item. At either level a capacity of
  // 48 is expected to give FC1 more tasks than one wave, so FC1 takes every place of the SMs and
  // FC2 two blocks an SM (launch_moe_layer), here with T above 1.
  check(QMOE_ACCURACY_FAST, QMOE_DTYPE_BF16, QMOE_SWIGLU_INTERLEAVED, 48, 3);
}

// A captured graph replayed with new routing, token counts (0 included), residency and X
// written into its device buffers between replays gives the bits of eager launches.
TEST_F(CudaMoeLayer, GraphReplayWithNewRoutingEqualsEager) {
  const MoeOptions o = graph_replay_layer();
  const auto model = make_moe_model(o, rng_);
  std::vector<const Int4Matrix*> f1, f2;
  for (uint32_t e = 0; e < o.experts; ++e) {
    f1.push_back(&model->fc1[e]);
    f2.push_back(&model->fc2[e]);
  }
  const auto ex = upload_experts(f1, f2, o.experts, true, rng_);
  constexpr uint32_t kCapacity = 6, kTopK = 3;
  cudaStream_t stream = nullptr;
  QMOE_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (qmoe_accuracy acc : {QMOE_ACCURACY_FAST, QMOE_ACCURACY_EXACT}) {
    for (bool logits : {false, true}) {
      auto call = make_call(o, *ex, acc, QMOE_DTYPE_BF16, kCapacity, kTopK, logits, false, true);
      call->params.inputs_ready_early = logits;  // both orders, captured
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      QMOE_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
      const cudaError_t launched = cuda::launch_moe_layer(call->params, stream);
      QMOE_CUDA_OK(cudaStreamEndCapture(stream, &graph));
      QMOE_CUDA_OK(launched);
      QMOE_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      for (uint32_t replay = 0; replay < 6; ++replay) {
        const uint32_t m = replay == 3 ? 0 : 1 + (replay * 5) % kCapacity;
        Inputs in = random_inputs(m, o.hidden, o.experts, kTopK, QMOE_DTYPE_BF16, logits, rng_);
        // New residency too: one more expert leaves each replay (slots keep their weights).
        std::vector<int32_t> residency = ex->host_residency;
        residency[replay % o.experts] = -1;
        ASSERT_TRUE(ex->residency.upload(residency.data(), residency.size() * 4));
        call->write(in, true);
        QMOE_CUDA_OK(cudaGraphLaunch(exec, stream));
        QMOE_CUDA_OK(cudaStreamSynchronize(stream));
        const std::vector<unsigned char> replayed = call->read_y();
        EXPECT_EQ(call->read_error(), 0u);
        call->write(in, true);
        QMOE_CUDA_OK(cuda::launch_moe_layer(call->params, stream));
        QMOE_CUDA_OK(cudaStreamSynchronize(stream));
        const std::vector<unsigned char> eager = call->read_y();
        EXPECT_TRUE(replayed == eager)
            << "replay " << replay << " m " << m << (logits ? " logits" : " ids");
        EXPECT_EQ(call->touched_outside(eager, m), 0u) << "replay " << replay;
        if (m > 0) {
          if (logits) route_on_host(in, o.experts, kTopK, false);
          std::vector<uint8_t> mask;
          for (int32_t s : residency) mask.push_back(s >= 0 ? 1 : 0);
          const MoeReference ref =
              reference_moe(*model, acc, in.x, m, in.ids, in.weights, kTopK, mask.data(), in.y0);
          const std::vector<float> cpu = cpu_forward(model->desc, acc, QMOE_DTYPE_BF16, in, kTopK,
                                                     logits, false, true, mask.data());
          check_layer(*call, eager, ref, cpu, m, "graph replay " + std::to_string(replay));
        }
      }
      ASSERT_TRUE(ex->residency.upload(ex->host_residency.data(), ex->host_residency.size() * 4));
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
  }
  cudaStreamDestroy(stream);
}

// Invalid device-side input: the error word names it, rows [0, min(m, capacity)) are zero (with
// accumulate too), nothing else is written; the next valid call clears the word.
TEST_F(CudaMoeLayer, ErrorWordAndZeroOutputOnInvalidInput) {
  MoeOptions o;
  o.experts = 5;
  o.hidden = 64;
  o.intermediate = 32;
  const auto model = make_moe_model(o, rng_);
  std::vector<const Int4Matrix*> f1, f2;
  for (uint32_t e = 0; e < o.experts; ++e) {
    f1.push_back(&model->fc1[e]);
    f2.push_back(&model->fc2[e]);
  }
  const auto ex = upload_experts(f1, f2, o.experts, false, rng_);
  constexpr uint32_t kCapacity = 4, kTopK = 2;
  const auto expect_error = [&](DeviceCall& call, const Inputs& in, uint32_t bits, uint32_t rows,
                                const char* what) {
    call.write(in, true);
    QMOE_CUDA_OK(cuda::launch_moe_layer(call.params, nullptr));
    QMOE_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(call.read_error(), bits) << what;
    const std::vector<unsigned char> yb = call.read_y();
    EXPECT_EQ(call.touched_outside(yb, rows), 0u) << what;
    for (uint32_t t = 0; t < rows; ++t) {
      for (uint32_t n = 0; n < o.hidden; ++n) {
        ASSERT_EQ(call.y_at(yb, t, n), 0.0) << what << " y[" << t << "," << n << "]";
      }
    }
  };
  {
    auto call =
        make_call(o, *ex, QMOE_ACCURACY_FAST, QMOE_DTYPE_F32, kCapacity, kTopK, false, false, true);
    Inputs in = random_inputs(3, o.hidden, o.experts, kTopK, QMOE_DTYPE_F32, false, rng_);
    in.weights[0] = 0.75f;  // slot 0 runs: the residency and slot checks below need it
    in.ids[3] = 999;
    expect_error(*call, in, cuda::kMoeErrorExpertId, 3, "id 999");
    in.ids[3] = -1;
    expect_error(*call, in, cuda::kMoeErrorExpertId, 3, "id -1");
    in.ids[3] = 0 == in.ids[2] ? 1 : 0;
    in.weights[1] = NAN;
    expect_error(*call, in, cuda::kMoeErrorWeight, 3, "NaN weight");
    in.weights[1] = 0.5f;
    Inputs over =
        random_inputs(kCapacity + 1, o.hidden, o.experts, kTopK, QMOE_DTYPE_F32, false, rng_);
    expect_error(*call, over, cuda::kMoeErrorTokensOverCapacity, kCapacity, "m > capacity");
    // A routed expert's slot out of range.
    std::vector<int32_t> residency = ex->host_residency;
    residency[in.ids[0]] = static_cast<int32_t>(ex->slots);
    ASSERT_TRUE(ex->residency.upload(residency.data(), residency.size() * 4));
    expect_error(*call, in, cuda::kMoeErrorResidency, 3, "slot out of range");
    ASSERT_TRUE(ex->residency.upload(ex->host_residency.data(), residency.size() * 4));
    // A malformed slot description (FC2 of the wrong K) for a routed expert.
    std::vector<cuda::DeviceQuantMatrix> d2(ex->slots);
    ASSERT_TRUE(ex->fc2_desc.download(d2.data(), d2.size() * sizeof(d2[0])));
    cuda::DeviceQuantMatrix saved = d2[ex->host_residency[in.ids[0]]];
    d2[ex->host_residency[in.ids[0]]].k = 64;
    d2[ex->host_residency[in.ids[0]]].chunks = 2;
    ASSERT_TRUE(ex->fc2_desc.upload(d2.data(), d2.size() * sizeof(d2[0])));
    expect_error(*call, in, cuda::kMoeErrorSlotMatrix, 3, "malformed FC2");
    d2[ex->host_residency[in.ids[0]]] = saved;
    ASSERT_TRUE(ex->fc2_desc.upload(d2.data(), d2.size() * sizeof(d2[0])));
    // Valid again: the word is cleared and the output is the layer's.
    call->write(in, false);
    QMOE_CUDA_OK(cuda::launch_moe_layer(call->params, nullptr));
    QMOE_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(call->read_error(), 0u);
  }
  {
    auto call =
        make_call(o, *ex, QMOE_ACCURACY_EXACT, QMOE_DTYPE_F16, kCapacity, kTopK, true, true, true);
    Inputs in = random_inputs(2, o.hidden, o.experts, kTopK, QMOE_DTYPE_F16, true, rng_);
    in.logits[o.experts + 3] = NAN;
    expect_error(*call, in, cuda::kMoeErrorLogits, 2, "NaN logit");
    in.logits[o.experts + 3] = INFINITY;
    expect_error(*call, in, cuda::kMoeErrorLogits, 2, "+inf logit");
    for (uint32_t e = 0; e < o.experts; ++e) in.logits[e] = -INFINITY;
    in.logits[o.experts + 3] = 1.0f;
    expect_error(*call, in, cuda::kMoeErrorLogits, 2, "a row of -inf only");
  }
}

TEST_F(CudaMoeLayer, InvalidHostArgumentsLaunchNothing) {
  cuda::MoeLayerParams p{};
  EXPECT_EQ(cuda::launch_moe_layer(p, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::moe_layer_workspace_size(0, 8, 128, 2048, 768), 0u);
  EXPECT_EQ(cuda::moe_layer_workspace_size(1, 9, 8, 64, 64), 0u);
  EXPECT_EQ(cuda::moe_layer_workspace_size(1024, 8, 128, 2048, 768), 0u);  // 8192 slots
  EXPECT_GT(cuda::moe_layer_workspace_size(1, 8, 128, 2048, 768), 0u);
}

}  // namespace
}  // namespace qmoe::testing
