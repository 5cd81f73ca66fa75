// The MoE layer's own code (lib/cuda/moe_layer.cu) run on the host by
// tests/cuda/cuda_host_emulator.h, so that CI, which has no GPU, executes it: the launcher's
// grids and shared-memory carving, the routing every block builds, FC1's task ranges, segments
// and in-warp SwiGLU, FC2's per-warp staging (the fast level quantizing FC1's FP32 output), its
// groups dealt over blocks and the combine, on emulated devices of 1 and 4 multiprocessors.
// Against the FP64 layer reference within the device test's bounds, with poisoned outputs; the
// bits must not depend on the device size, and the error word and zero output on invalid input
// are checked. MXFP4 and NVFP4 experts (gpt-oss's activation) run the same way, against the FP64
// layer of tests/moe/moe_fp4_reference.h and the CPU library's qmoe_moe_forward; INT3 experts
// (tests/gemm/int3_reference.h) against the FP64 layer and the CPU layer. The device test
// (moe_layer_test.cu) covers the hardware, graphs and the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cuda/cuda_set_util.h"
#include "tests/cuda/decode_emulation_util.h"
#include "tests/cuda/layer_output_check.h"
#include "tests/gemm/fp4_reference.h"
#include "tests/gemm/int3_reference.h"
#include "tests/gemm/int4_reference.h"
#include "tests/moe/moe_call.h"
#include "tests/moe/moe_fp4_reference.h"
#include "tests/moe/moe_reference.h"
// The kernel source with its namespace renamed (the library linked into this binary defines the
// real one).
#define qmoe qmoe_moe_emulation
#include "lib/cuda/moe_layer.cu"  // NOLINT(build/include)
#undef qmoe

namespace qmoe::testing {
namespace {

namespace emu = ::qmoe_moe_emulation::cuda;
namespace emu_offload = ::qmoe_moe_emulation::offload;

// ---- MoE layer -------------------------------------------------------------------------------

struct MoeCase {
  qmoe_accuracy acc;
  qmoe_dtype dtype;
  bool accumulate, logits, renormalize, partial, early;
  uint32_t capacity, m, k;
};

struct MoeRun {
  std::vector<unsigned char> y;  // [capacity][ldy] in the dtype
  uint32_t error = 0;
  std::vector<uint32_t> counts;  // [E] the call's expert_counts (empty when not asked for)
};

// Fill of the expert_counts buffer and of the two words past it, which no call may change.
constexpr uint32_t kCountsPoison = 0xA5A5A5A5u;

// An offload session's device side in ordinary memory (lib/offload/device_state.h,
// ring_layout.h), for a layer call whose FC1 carries the offload's classify-publish.
struct EmulatedOffload {
  emu_offload::OffloadDeviceState state{};
  emu_offload::OffloadCallRecord record{};
  std::vector<uint8_t> token_cold;
  std::vector<unsigned char> ring_memory;
  unsigned char* ring = nullptr;  // 128-byte aligned, zeroed
  emu_offload::RingLayout layout{};

  EmulatedOffload(uint32_t capacity, uint32_t k, uint32_t experts, uint32_t hidden) {
    layout = emu_offload::make_ring_layout({2, capacity, k, experts, hidden});
    ring_memory.assign(layout.total_bytes + 128, 0);
    ring = ring_memory.data() +
           ((128 - (reinterpret_cast<uintptr_t>(ring_memory.data()) & 127)) & 127);
    token_cold.assign(capacity, 0xEE);
    state.next_seq = 1;
  }
};

// One layer on the emulated device: experts e use matrices e (slot order shuffled), residency
// all or partial, routing by ids/weights or logits. Partial is always mixed, whatever the seed:
// in a shuffled order of the experts the first is never resident, the next two always are, and
// the rest are with probability two in three. The launch's format is the experts' (INT4 unless
// the model was made with other matrices: make_moe_model's make_matrix).
class MoeFixture {
 public:
  MoeFixture(const MoeOptions& o, bool partial, std::mt19937_64& rng)
      : MoeFixture(make_moe_model(o, rng), partial, rng) {}
  MoeFixture(std::unique_ptr<MoeModel> model, bool partial, std::mt19937_64& rng)
      : options_(model->options), model_(std::move(model)) {
    const MoeOptions& o = options_;
    format_ = model_->fc1[0].desc.format;
    std::vector<uint32_t> order(o.experts);
    std::iota(order.begin(), order.end(), 0u);
    std::shuffle(order.begin(), order.end(), rng);
    residency_.assign(o.experts, -1);
    for (uint32_t i = 0; i < o.experts; ++i) {
      const uint32_t e = order[i];
      if (partial && (i == 0 || (i > 2 && rng() % 3 == 0))) continue;
      residency_[e] = static_cast<int32_t>(fc1_.size());
      fc1_.push_back(describe_host<emu::DeviceQuantMatrix>(model_->fc1[e]));
      fc2_.push_back(describe_host<emu::DeviceQuantMatrix>(model_->fc2[e]));
    }
    if (fc1_.empty()) {
      residency_[order[0]] = 0;
      fc1_.push_back(describe_host<emu::DeviceQuantMatrix>(model_->fc1[order[0]]));
      fc2_.push_back(describe_host<emu::DeviceQuantMatrix>(model_->fc2[order[0]]));
    }
    for (int32_t s : residency_) mask_.push_back(s >= 0 ? 1 : 0);
    // What a device expert set of these experts would say (device_expert_set.cu).
    lean_ = emu::has_lean_decode(format_);
    for (size_t i = 0; i < fc1_.size(); ++i) {
      lean_ = lean_ && emu::int4_lean_layout(fc1_[i]) && emu::int4_lean_layout(fc2_[i]);
    }
  }
  // Whether every slot has the lean INT4 or INT3 layout (the calls then set
  // MoeLayerParams::lean_walk),
  // and a switch to run the kernels that also hold the general walk instead.
  bool lean() const { return lean_; }
  void set_lean_walk(bool on) { lean_walk_ = on; }
  // The calls' expected_tokens_per_expert (0: none), and the T the last call's launcher chose.
  void set_tokens_hint(float hint) { tokens_hint_ = hint; }
  // Whether the calls ask for expert_counts (on by default; MoeRun::counts holds them).
  void set_counting(bool on) { counting_ = on; }
  uint32_t last_tokens_per_item() const { return last_tokens_per_item_; }
  // The calls must be refused by the launcher (cudaErrorInvalidValue, nothing launched).
  void expect_refusal(bool on) { expect_refusal_ = on; }
  const MoeModel& model() const { return *model_; }
  std::vector<int32_t>& residency() { return residency_; }
  std::vector<emu::DeviceQuantMatrix>& fc2() { return fc2_; }
  const std::vector<uint8_t>& mask() const { return mask_; }

  MoeRun run(const MoeCase& c, const std::vector<float>& x, const std::vector<int32_t>& ids,
             const std::vector<float>& weights, const std::vector<float>& logits,
             const std::vector<float>& y0, uint32_t m_call, int sms,
             EmulatedOffload* offload = nullptr) {
    qmoe_emu::device().sm_count = sms;
    const uint32_t H = options_.hidden, E = options_.experts;
    const size_t ldx = H + 3, ldy = H + 5, es = dsize(c.dtype);
    std::vector<float> xs(size_t{c.capacity} * ldx, 0.0f);
    for (uint32_t t = 0; t < std::min(m_call, c.capacity); ++t) {
      std::copy_n(x.begin() + size_t{t} * H, H, xs.begin() + size_t{t} * ldx);
    }
    const std::vector<unsigned char> xb = to_bytes(c.dtype, xs);
    MoeRun out;
    out.y.assign(size_t{c.capacity} * ldy * es, kPoison);
    if (c.accumulate) {
      for (uint32_t t = 0; t < std::min(m_call, c.capacity); ++t) {
        const std::vector<float> row(y0.begin() + size_t{t} * H, y0.begin() + size_t{t + 1} * H);
        const std::vector<unsigned char> rb = to_bytes(c.dtype, row);
        std::copy(rb.begin(), rb.end(), out.y.begin() + size_t{t} * ldy * es);
      }
    }
    std::vector<unsigned char> lb;
    if (c.logits) {
      std::vector<float> l(logits.begin(),
                           logits.begin() + size_t{std::min(m_call, c.capacity)} * E);
      lb = to_bytes(c.dtype, l);
      lb.resize(size_t{c.capacity} * E * es);
    }
    std::vector<int32_t> id_buf(size_t{c.capacity} * c.k, 0);
    std::vector<float> w_buf(size_t{c.capacity} * c.k, 0.0f);
    if (!c.logits) {
      std::copy_n(ids.begin(), std::min(ids.size(), id_buf.size()), id_buf.begin());
      std::copy_n(weights.begin(), std::min(weights.size(), w_buf.size()), w_buf.begin());
    }
    const size_t ws = emu::moe_layer_workspace_size(c.capacity, c.k, E, H, options_.intermediate);
    EXPECT_GT(ws, 0u);
    // 256-byte aligned workspace, poisoned (a kernel that reads what nothing wrote sees NaNs).
    std::vector<unsigned char> ws_buf(ws + 256, 0xFF);
    unsigned char* workspace =
        ws_buf.data() + ((256 - (reinterpret_cast<uintptr_t>(ws_buf.data()) & 255)) & 255);
    emu::MoeLayerParams p{};
    p.num_experts = E;
    p.hidden = H;
    p.intermediate = options_.intermediate;
    p.top_k = c.k;
    p.m_capacity = c.capacity;
    p.num_slots = static_cast<uint32_t>(fc1_.size());
    p.accuracy = c.acc;
    p.dtype = c.dtype;
    p.fusion = options_.fusion;
    p.alpha = options_.alpha;
    p.beta = options_.beta;
    p.limit = options_.limit;
    p.accumulate = c.accumulate;
    p.format = format_;
    p.lean_walk = lean_ && lean_walk_;
    p.fc1 = fc1_.data();
    p.fc2 = fc2_.data();
    p.m = &m_call;
    p.x = xb.data();
    p.ldx = ldx;
    p.y = out.y.data();
    p.ldy = ldy;
    if (c.logits) {
      p.logits = lb.data();
      p.renormalize = c.renormalize;
    } else {
      p.ids = id_buf.data();
      p.weights = w_buf.data();
    }
    p.residency = residency_.data();
    p.inputs_ready_early = c.early;
    p.expected_tokens_per_expert = tokens_hint_;
    std::vector<uint32_t> counts(E + 2, kCountsPoison);
    if (counting_) p.expert_counts = counts.data();
    last_tokens_per_item_ = emu::tokens_per_item(p);
    p.workspace = workspace;
    p.workspace_bytes = ws;
    if (offload != nullptr) {  // as lib/cuda/offload_session.cu fills them
      p.offload.state = &offload->state;
      p.offload.record = &offload->record;
      p.offload.token_cold = offload->token_cold.data();
      p.offload.ring = offload->ring;
      p.offload.layout = offload->layout;
      p.offload.short_circuit = true;
      p.offload.enabled = true;
    }
    uint32_t launched = 0;
    const cudaError_t launch = emu::launch_moe_layer(p, nullptr, &launched);
    EXPECT_EQ(launch, expect_refusal_ ? cudaErrorInvalidValue : cudaSuccess);
    EXPECT_EQ(launched, expect_refusal_ ? 0u : 2u);
    std::memcpy(&out.error, workspace, 4);
    EXPECT_EQ(counts[E], kCountsPoison) << "a word past expert_counts changed";
    EXPECT_EQ(counts[E + 1], kCountsPoison) << "a word past expert_counts changed";
    if (counting_) out.counts.assign(counts.begin(), counts.begin() + E);
    return out;
  }

 private:
  MoeOptions options_;
  std::unique_ptr<MoeModel> model_;
  std::vector<int32_t> residency_;
  std::vector<emu::DeviceQuantMatrix> fc1_, fc2_;
  std::vector<uint8_t> mask_;
  qmoe_weight_format format_ = QMOE_WEIGHT_FORMAT_INT4;
  bool lean_ = false, lean_walk_ = true, expect_refusal_ = false, counting_ = true;
  float tokens_hint_ = 0.0f;
  uint32_t last_tokens_per_item_ = 0;
};

std::string describe_moe(const MoeCase& c, const MoeOptions& o, int sms) {
  std::ostringstream s;
  s << (c.acc == QMOE_ACCURACY_EXACT ? "exact" : "fast") << " " << label(c.dtype)
    << (c.accumulate ? " accumulate" : "")
    << (c.logits ? (c.renormalize ? " logits/renormalized" : " logits/softmax-all") : " ids")
    << (c.partial ? " partial-residency" : " all-resident") << " capacity=" << c.capacity
    << " m=" << c.m << " k=" << c.k << (c.early ? " early" : "") << " sms=" << sms << " "
    << o.describe();
  return s.str();
}

// The routing the CPU derives from logits.
void route(const std::vector<float>& logits, uint32_t m, uint32_t E, uint32_t k, bool renormalize,
           std::vector<int32_t>* ids, std::vector<float>* weights) {
  ids->assign(size_t{m} * k, 0);
  weights->assign(size_t{m} * k, 0.0f);
  ASSERT_EQ(qmoe_moe_route_topk(logits.data(), m, E, k, renormalize ? 1 : 0, ids->data(),
                                weights->data()),
            QMOE_STATUS_OK);
}

// Runs one case on two device sizes: each within the reference's bounds (doubled for
// logits routing, whose softmax differs in its last bits), nothing written outside rows
// [0, m) x [0, H), and the same bits on every device size. With INT3 experts (`format`), also
// against the CPU layer (qmoe_moe_forward on the same X, routing, run mask and initial Y: both
// within their bounds of the reference, so within the sum of the two).
void check_moe_case(const MoeCase& c, const MoeOptions& base, std::mt19937_64& rng,
                    qmoe_weight_format format = QMOE_WEIGHT_FORMAT_INT4) {
  MoeOptions o = base;
  MoeFixture f(make_moe_model(
                   o, rng, format == QMOE_WEIGHT_FORMAT_INT3 ? make_int3_matrix : make_int4_matrix),
               c.partial, rng);
  ASSERT_EQ(f.model().fc1[0].desc.format, format);
  const uint32_t H = o.hidden, E = o.experts;
  std::vector<float> x = random_activations(c.m, H, rng);
  x = round_trip(c.dtype, x);
  std::vector<int32_t> ids;
  std::vector<float> weights, logits;
  random_routing(c.m, E, c.k, rng, &ids, &weights);
  for (size_t i = 0; i < weights.size(); i += 5) weights[i] = 0.0f;  // skipped slots
  if (c.logits) {
    std::normal_distribution<float> normal(0.0f, 2.0f);
    logits.resize(size_t{c.m} * E);
    for (auto& v : logits) v = normal(rng);
    for (uint32_t t = 0; t < c.m; ++t) {
      float* row = logits.data() + size_t{t} * E;
      if (E > 3) row[E - 1] = row[1];  // a tie, to the lower id
      if (E > 4) row[2] = -INFINITY;
    }
    logits = round_trip(c.dtype, logits);
    route(logits, c.m, E, c.k, c.renormalize, &ids, &weights);
  }
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> y0(size_t{c.m} * H);
  for (auto& v : y0) v = u(rng);
  y0 = round_trip(c.dtype, y0);
  const MoeReference ref = reference_moe(f.model(), c.acc, x, c.m, ids, weights, c.k,
                                         f.mask().data(), c.accumulate ? y0 : std::vector<float>{});
  const double slack = c.logits ? 2.0 : 1.0;
  const size_t ldy = H + 5, es = dsize(c.dtype);
  const bool compare_cpu = format != QMOE_WEIGHT_FORMAT_INT4;
  std::vector<float> cpu;
  if (compare_cpu) {
    const HostSet set = make_host_set(f.model().desc);
    ASSERT_TRUE(set);
    qmoe_context* ctx = nullptr;
    ASSERT_EQ(qmoe_context_create(nullptr, &ctx), QMOE_STATUS_OK);
    MoeCallOptions call;
    call.run_mask = f.mask().data();
    call.accumulate = c.accumulate ? 1 : 0;
    cpu = c.accumulate ? y0 : std::vector<float>(size_t{c.m} * H, 0.0f);
    const qmoe_status status = moe_forward(ctx, set.get(), c.acc, c.m, x.data(), H, ids.data(),
                                           weights.data(), c.k, cpu.data(), H, &call);
    qmoe_context_destroy(ctx);
    ASSERT_EQ(status, QMOE_STATUS_OK) << qmoe_last_error_message();
  }
  std::vector<unsigned char> first;
  for (int sms : {1, 4}) {
    const MoeRun r = f.run(c, x, ids, weights, logits, y0, c.m, sms);
    const std::string what =
        std::string(format == QMOE_WEIGHT_FORMAT_INT3 ? "int3 " : "") + describe_moe(c, o, sms);
    EXPECT_EQ(r.error, 0u) << what;
    EXPECT_EQ(r.counts, selections_per_expert(ids, weights, c.m, c.k, E))
        << "expert_counts; " << what;
    size_t bad = 0;
    for (size_t el = 0; el < r.y.size() / es; ++el) {
      const uint32_t t = static_cast<uint32_t>(el / ldy), n = static_cast<uint32_t>(el % ldy);
      if (t < c.m && n < H) continue;
      for (size_t b = 0; b < es; ++b) {
        if (r.y[el * es + b] != kPoison && bad++ < 5) {
          ADD_FAILURE() << "y element (" << t << "," << n << ") outside [0, m) x [0, H) changed; "
                        << what;
        }
      }
    }
    // The CPU layer within the sum of both bounds and the output's rounding once.
    check_layer_values(
        c.dtype, c.m, H,
        [&](uint32_t t, uint32_t n) { return element(c.dtype, r.y.data(), size_t{t} * ldy + n); },
        ref, cpu, slack, 1.01, what, &bad);
    EXPECT_EQ(bad, 0u) << what;
    if (first.empty()) {
      first = r.y;
    } else {
      EXPECT_TRUE(first == r.y) << "the bits depend on the device size; " << what;
    }
    if (::testing::Test::HasFailure()) return;
    // Lean experts: the kernels that also hold the general walk give the lean ones' bits.
    if (f.lean() && sms == 4) {
      f.set_lean_walk(false);
      const MoeRun g = f.run(c, x, ids, weights, logits, y0, c.m, sms);
      f.set_lean_walk(true);
      EXPECT_EQ(g.error, 0u) << what;
      EXPECT_TRUE(g.y == r.y) << "the general walk's bits differ from the lean walk's; " << what;
    }
  }
}

MoeOptions shape_c() {
  // The lean INT4 layout (blocks >= 32, 16-bit scales, no zero points; the kernels'
  // Int4LeanDecode): FC1 block 32, BF16 grouped, bias; FC2 block 64, FP16 row-major.
  MoeOptions c;
  c.experts = 6;
  c.hidden = 96;
  c.intermediate = 64;
  c.fc1.block_size = 32;
  c.fc1.scale_dtype = QMOE_DTYPE_BF16;
  c.fc1.scale_order = ScaleOrder::kGrouped;
  c.fc1.bias = true;
  c.fc2.block_size = 64;
  c.fc2.scale_dtype = QMOE_DTYPE_F16;
  c.fc2.scale_order = ScaleOrder::kRowMajor;
  return c;
}

TEST_F(EmulatedDevice, MoeLayerMatchesReferenceAcrossOptions) {
  struct Size {
    uint32_t capacity, m, k;
  };
  // Capacity 12 with m = 12 and k = 5 gives experts more than 8 tokens (several work items).
  const Size sizes[] = {{1, 1, 2}, {4, 3, 2}, {8, 8, 3}, {12, 12, 5}, {2, 2, 6}, {16, 5, 4}};
  const qmoe_dtype dtypes[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
  int index = 0;
  for (qmoe_accuracy acc : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    for (qmoe_swiglu_fusion fusion : {QMOE_SWIGLU_INTERLEAVED, QMOE_SWIGLU_CONCATENATED}) {
      for (int v = 0; v < 6; ++v, ++index) {
        if (HasFailure()) return;
        const Size sz = sizes[index % 6];
        const int routing = (index / 2) % 3;    // ids, logits renormalized, logits over all E
        const int shape = (v + index / 6) % 3;  // the shapes in turn, shifted per level and fusion
        MoeOptions o = shape == 0 ? small_layer_a() : shape == 1 ? small_layer_b() : shape_c();
        o.fusion = fusion;
        if (v % 3 == 1) {
          use_gpt_oss_swiglu(&o);
        } else {
          use_qwen3_swiglu(&o);
        }
        MoeCase c{acc,          dtypes[v % 3],  (v & 2) != 0, routing != 0, routing == 1,
                  (v & 1) != 0, index % 2 == 1, sz.capacity,  sz.m,         sz.k};
        check_moe_case(c, o, rng_);
      }
    }
  }
}

// The concatenated fusion at M <= 2: on 4 multiprocessors a block gets one or two tasks of two
// groups, so its segments are spread (each group on its own warp, the gate and up sums met
// behind a block barrier); on 1 multiprocessor at M = 2 a block's range also holds a whole
// item (6 or 8 tasks), whose warps walk their task's two groups in turn. Both give the
// reference's values and the same bits.
TEST_F(EmulatedDevice, MoeLayerConcatenatedSpreadSegments) {
  for (MoeOptions o : {small_layer_a(), shape_c()}) {
    o.fusion = QMOE_SWIGLU_CONCATENATED;
    use_qwen3_swiglu(&o);
    for (qmoe_accuracy acc : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      for (uint32_t m : {1u, 2u}) {
        const MoeCase c{acc, QMOE_DTYPE_BF16, false, false, false, m == 2, false, m, m, 2};
        check_moe_case(c, o, rng_);
        if (HasFailure()) return;
      }
    }
  }
}

// Invalid device-side input: the error word names it, rows [0, min(m, capacity)) are zero (with
// accumulate too), nothing else is written; the next valid call clears the word.
TEST_F(EmulatedDevice, MoeLayerErrorWordAndZeroOutput) {
  MoeOptions o;
  o.experts = 5;
  o.hidden = 64;
  o.intermediate = 32;
  MoeFixture f(o, false, rng_);
  const uint32_t H = o.hidden;
  const MoeCase c{QMOE_ACCURACY_FAST, QMOE_DTYPE_F32, true, false, false, false, false, 4, 3, 2};
  std::vector<float> x = random_activations(4, H, rng_), y0(size_t{4} * H, 0.5f), logits;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  random_routing(4, o.experts, c.k, rng_, &ids, &weights);
  weights[0] = 0.75f;
  const auto expect = [&](uint32_t m_call, uint32_t bits, const char* what) {
    const MoeRun r = f.run(c, x, ids, weights, logits, y0, m_call, 2);
    EXPECT_EQ(r.error, bits) << what;
    EXPECT_EQ(r.counts, std::vector<uint32_t>(o.experts, 0u)) << "expert_counts; " << what;
    const uint32_t rows = std::min(m_call, c.capacity);
    for (uint32_t t = 0; t < c.capacity; ++t) {
      for (uint32_t n = 0; n < H + 5; ++n) {
        const size_t el = size_t{t} * (H + 5) + n;
        if (t < rows && n < H) {
          ASSERT_EQ(element(c.dtype, r.y.data(), el), 0.0f)
              << what << " y[" << t << "," << n << "]";
        } else {
          ASSERT_EQ(r.y[el * 4], kPoison) << what << " element " << el;
        }
      }
    }
  };
  ids[3] = 999;
  expect(3, emu::kMoeErrorExpertId, "id 999");
  ids[3] = ids[2] == 0 ? 1 : 0;
  weights[1] = NAN;
  expect(3, emu::kMoeErrorWeight, "NaN weight");
  weights[1] = 0.5f;
  expect(5, emu::kMoeErrorTokensOverCapacity, "m > capacity");
  const int32_t saved_slot = f.residency()[ids[0]];
  f.residency()[ids[0]] = static_cast<int32_t>(f.fc2().size());
  expect(3, emu::kMoeErrorResidency, "slot out of range");
  f.residency()[ids[0]] = saved_slot;
  const emu::DeviceQuantMatrix saved = f.fc2()[saved_slot];
  f.fc2()[saved_slot].k = 64;
  f.fc2()[saved_slot].chunks = 2;
  expect(3, emu::kMoeErrorSlotMatrix, "malformed FC2");
  f.fc2()[saved_slot] = saved;
  // A slot that breaks the lean promise (a zero-point plane: every zero point 8, strides 0) is
  // malformed for the lean kernels (the exact level runs them at every T), which never read it
  // with their walk; the kernels that also hold the general walk read it, and zero point 8
  // gives the layer's own result.
  ASSERT_TRUE(f.lean());
  static const uint8_t kEight = 8;
  f.fc2()[saved_slot].zero_points = &kEight;
  MoeCase ce = c;
  ce.acc = QMOE_ACCURACY_EXACT;
  EXPECT_EQ(f.run(ce, x, ids, weights, logits, y0, 3, 2).error, emu::kMoeErrorSlotMatrix)
      << "zero points in a slot of a lean call";
  f.set_lean_walk(false);
  EXPECT_EQ(f.run(ce, x, ids, weights, logits, y0, 3, 2).error, 0u);
  f.set_lean_walk(true);
  f.fc2()[saved_slot] = saved;
  const MoeRun ok = f.run(c, x, ids, weights, logits, y0, 3, 2);
  EXPECT_EQ(ok.error, 0u);
  EXPECT_EQ(ok.counts, selections_per_expert(ids, weights, 3, c.k, o.experts));
}

// expert_counts: every expert's selections (weight 0 excluded, resident or not, a token that
// lists an expert twice counted twice) whatever the residency, the device size or the routing
// mode, and asking for them changes no bit of y.
TEST_F(EmulatedDevice, MoeLayerCountsEverySelectedExpert) {
  MoeOptions o;
  o.experts = 7;
  o.hidden = 64;
  o.intermediate = 32;
  MoeFixture f(o, true, rng_);
  const uint32_t H = o.hidden, E = o.experts;
  for (bool logits_mode : {false, true}) {
    const MoeCase c{
        QMOE_ACCURACY_FAST, QMOE_DTYPE_F32, false, logits_mode, true, true, false, 6, 5, 3};
    std::vector<float> x = random_activations(c.m, H, rng_), y0, logits;
    std::vector<int32_t> ids;
    std::vector<float> weights;
    const auto cold_expert = static_cast<int32_t>(
        std::find_if(f.residency().begin(), f.residency().end(), [](int32_t s) { return s < 0; }) -
        f.residency().begin());
    ASSERT_LT(cold_expert, static_cast<int32_t>(E)) << "partial residency leaves one out";
    random_routing(c.m, E, c.k, rng_, &ids, &weights);
    ids[0] = cold_expert;  // token 0 selects an expert that is not resident
    weights[0] = 0.5f;
    weights[1] = 0.0f;  // not a selection
    ids[4] = ids[3];    // token 1 lists one expert twice
    if (logits_mode) {
      std::normal_distribution<float> normal(0.0f, 2.0f);
      logits.resize(size_t{c.m} * E);
      for (auto& v : logits) v = normal(rng_);
      logits[static_cast<size_t>(cold_expert)] = 10.0f;  // token 0's top expert
      route(logits, c.m, E, c.k, true, &ids, &weights);
    }
    const std::vector<uint32_t> want = selections_per_expert(ids, weights, c.m, c.k, E);
    ASSERT_GT(want[static_cast<size_t>(cold_expert)], 0u);
    for (int sms : {1, 3}) {
      const MoeRun counted = f.run(c, x, ids, weights, logits, y0, c.m, sms);
      EXPECT_EQ(counted.error, 0u);
      EXPECT_EQ(counted.counts, want) << (logits_mode ? "logits" : "ids") << " sms " << sms;
      f.set_counting(false);
      const MoeRun plain = f.run(c, x, ids, weights, logits, y0, c.m, sms);
      f.set_counting(true);
      EXPECT_TRUE(plain.y == counted.y) << "expert_counts changed y; sms " << sms;
    }
  }
}

// The offload's classify-publish carried by FC1's extra block 0 (moe_layer.cuh). With cold
// selections: y is the resident-only layer's, bit for bit (the other blocks split FC1's work as
// before), and the ring holds the request as the standalone kernel writes it (doorbell 1, the
// meta, the cold ids, the x tile; the per-token flags). Without: the same y, nothing written
// to the ring, a short circuit counted. Device sizes 1 and 3.
TEST_F(EmulatedDevice, MoeLayerCarriesTheOffloadClassify) {
  MoeOptions o = small_layer_a();
  use_qwen3_swiglu(&o);
  MoeFixture f(o, true, rng_);
  const uint32_t H = o.hidden, E = o.experts;
  for (qmoe_dtype dtype : {QMOE_DTYPE_F32, QMOE_DTYPE_BF16}) {
    for (int sms : {1, 3}) {
      const MoeCase c{QMOE_ACCURACY_FAST, dtype, false, false, false, true, false, 4, 3, 2};
      const std::vector<float> x = round_trip(dtype, random_activations(c.m, H, rng_));
      const std::vector<float> none;
      // Token 0: a cold and a resident expert; token 1: resident experts only; token 2: cold.
      std::vector<int32_t> hot, cold;
      for (uint32_t e = 0; e < E; ++e) (f.residency()[e] >= 0 ? hot : cold).push_back(e);
      ASSERT_GE(hot.size(), 2u);
      ASSERT_GE(cold.size(), 1u);
      const std::vector<int32_t> ids = {cold[0], hot[0], hot[0], hot[1], cold.back(), hot[1]};
      const std::vector<float> weights = {0.5f, 0.5f, 0.25f, 0.75f, 0.625f, 0.375f};
      const std::string what = std::string(label(dtype)) + " sms=" + std::to_string(sms);
      const MoeRun resident = f.run(c, x, ids, weights, none, none, c.m, sms);
      EmulatedOffload offload(c.capacity, c.k, E, H);
      const MoeRun hybrid = f.run(c, x, ids, weights, none, none, c.m, sms, &offload);
      EXPECT_EQ(hybrid.error, 0u) << what;
      EXPECT_TRUE(hybrid.y == resident.y) << what;
      EXPECT_EQ(offload.state.error, 0u) << what;
      EXPECT_EQ(offload.state.next_seq, 2u) << what;
      EXPECT_EQ(offload.state.telemetry.published, 1u) << what;
      EXPECT_EQ(offload.state.telemetry.cold_selections, 2u) << what;
      EXPECT_EQ(offload.record.seq, 1u) << what;
      const emu_offload::RingLayout& l = offload.layout;
      unsigned char* entry = emu_offload::ring_entry(offload.ring, l, 0);
      EXPECT_EQ(*emu_offload::entry_field<uint64_t>(entry, l.req), 1u) << what;
      const auto& meta = *emu_offload::entry_field<emu_offload::RequestMeta>(entry, l.meta);
      EXPECT_EQ(meta.m, c.m) << what;
      EXPECT_EQ(meta.selections, 2u) << what;
      const std::vector<int32_t> want_cold = cold[0] == cold.back()
                                                 ? std::vector<int32_t>{cold[0]}
                                                 : std::vector<int32_t>{cold[0], cold.back()};
      ASSERT_EQ(meta.num_cold, want_cold.size()) << what;
      EXPECT_TRUE(std::equal(want_cold.begin(), want_cold.end(),
                             emu_offload::entry_field<int32_t>(entry, l.cold_ids)))
          << what;
      const std::vector<unsigned char> xb = to_bytes(dtype, x);
      EXPECT_EQ(std::memcmp(entry + l.x, xb.data(), xb.size()), 0) << what;
      EXPECT_EQ(offload.token_cold[0], 1) << what;
      EXPECT_EQ(offload.token_cold[1], 0) << what;
      EXPECT_EQ(offload.token_cold[2], 1) << what;

      // No cold selection: the same y and an untouched ring.
      const std::vector<int32_t> hot_ids = {hot[0], hot[1], hot[1], hot[0], hot[0], hot[1]};
      const MoeRun resident_only = f.run(c, x, hot_ids, weights, none, none, c.m, sms);
      EmulatedOffload quiet(c.capacity, c.k, E, H);
      const MoeRun short_circuit = f.run(c, x, hot_ids, weights, none, none, c.m, sms, &quiet);
      EXPECT_TRUE(short_circuit.y == resident_only.y) << what;
      EXPECT_EQ(quiet.state.next_seq, 1u) << what;
      EXPECT_EQ(quiet.state.telemetry.short_circuits, 1u) << what;
      EXPECT_EQ(quiet.record.seq, 0u) << what;
      EXPECT_TRUE(std::all_of(quiet.ring_memory.begin(), quiet.ring_memory.end(),
                              [](unsigned char b) { return b == 0; }))
          << what;
      if (HasFailure()) return;
    }
  }
}

// The hybrid layer given router logits: the classify block routes them as the layer's kernels
// do, so the request carries the routing the CPU's rule gives (the ids exactly, the weights to
// the last bits of the softmax) and its cold set, y is the resident layer's with the same
// logits bit for bit, and a row with a NaN logit refuses the call (nothing on the ring, the
// error word set, y zero). Device sizes 1 and 3.
TEST_F(EmulatedDevice, MoeLayerOffloadRoutesLogits) {
  MoeOptions o = small_layer_a();
  use_qwen3_swiglu(&o);
  MoeFixture f(o, true, rng_);
  const uint32_t H = o.hidden, E = o.experts;
  std::vector<int32_t> hot, cold;
  for (uint32_t e = 0; e < E; ++e) (f.residency()[e] >= 0 ? hot : cold).push_back(e);
  ASSERT_GE(hot.size(), 2u);
  ASSERT_GE(cold.size(), 1u);
  const MoeCase c{QMOE_ACCURACY_FAST, QMOE_DTYPE_F32, false, true, true, true, false, 4, 3, 2};
  const std::vector<float> x = random_activations(c.m, H, rng_), none;
  const std::vector<int32_t> no_ids;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> logits(size_t{c.m} * E);
  for (float& v : logits) v = normal(rng_);
  // Token 0 tops at a cold expert, token 1 at two resident ones, token 2 at a cold one.
  logits[static_cast<size_t>(cold[0])] = 6.0f;
  logits[E + static_cast<size_t>(hot[0])] = 6.0f;
  logits[E + static_cast<size_t>(hot[1])] = 5.5f;
  logits[2 * E + static_cast<size_t>(cold.back())] = 6.0f;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  route(logits, c.m, E, c.k, true, &ids, &weights);
  uint32_t cold_selections = 0;
  std::vector<uint8_t> token_cold(c.m, 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool is_cold = f.residency()[static_cast<size_t>(ids[i])] < 0;
    cold_selections += is_cold;
    token_cold[i / c.k] |= is_cold;
  }
  for (int sms : {1, 3}) {
    const std::string what = "sms=" + std::to_string(sms);
    const MoeRun resident = f.run(c, x, no_ids, none, logits, none, c.m, sms);
    EmulatedOffload offload(c.capacity, c.k, E, H);
    const MoeRun hybrid = f.run(c, x, no_ids, none, logits, none, c.m, sms, &offload);
    EXPECT_EQ(hybrid.error, 0u) << what;
    EXPECT_TRUE(hybrid.y == resident.y) << what;
    EXPECT_EQ(offload.state.telemetry.published, 1u) << what;
    EXPECT_EQ(offload.state.telemetry.cold_selections, cold_selections) << what;
    const emu_offload::RingLayout& l = offload.layout;
    unsigned char* entry = emu_offload::ring_entry(offload.ring, l, 0);
    EXPECT_EQ(*emu_offload::entry_field<uint64_t>(entry, l.req), 1u) << what;
    const int32_t* sent_ids = emu_offload::entry_field<int32_t>(entry, l.ids);
    const float* sent_weights = emu_offload::entry_field<float>(entry, l.weights);
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(sent_ids[i], ids[i]) << what << " slot " << i;
      EXPECT_NEAR(sent_weights[i], weights[i], 1e-6f) << what << " slot " << i;
    }
    for (uint32_t t = 0; t < c.m; ++t) EXPECT_EQ(offload.token_cold[t], token_cold[t]) << what;

    // Block 0's tables hold token 0's routing (a cold selection) and, past the bad row, what
    // shared memory held: zeros here, which read as routing (ids 0, weights 0), so only the
    // refusal keeps the request off the ring.
    std::vector<float> bad = logits;
    bad[E + 3] = NAN;
    EmulatedOffload refused(c.capacity, c.k, E, H);
    qmoe_emu::device().smem_garbage = 0;
    const MoeRun r = f.run(c, x, no_ids, none, bad, none, c.m, sms, &refused);
    qmoe_emu::device().smem_garbage = 0xA5;
    EXPECT_EQ(r.error, emu::kMoeErrorLogits) << what;
    EXPECT_EQ(refused.state.telemetry.refused, 1u) << what;
    EXPECT_EQ(refused.state.telemetry.published, 0u) << what;
    EXPECT_EQ(refused.record.seq, 0u) << what;
    EXPECT_TRUE(std::all_of(refused.ring_memory.begin(), refused.ring_memory.end(),
                            [](unsigned char b) { return b == 0; }))
        << what;
    for (uint32_t t = 0; t < c.m; ++t) {
      for (uint32_t n = 0; n < H; ++n) {
        ASSERT_EQ(element(c.dtype, r.y.data(), size_t{t} * (H + 5) + n), 0.0f) << what;
      }
    }
    if (HasFailure()) return;
  }
}

// ---- Routing from logits ------------------------------------------------------------------

// The routing tables one block builds (moe_routes.cuh), read back: sel_id and sel_w for every
// slot of a valid call, and the error bits.
struct RouteProbe {
  emu::MoeLayerParams p;
  uint32_t slots_cap;
  int32_t* ids;
  float* weights;
  uint32_t* error;
};

void route_probe_kernel(const RouteProbe probe) {
  QMOE_DECODE_DYNAMIC_SMEM(smem);
  __shared__ emu::RouteInfo info;
  const emu::RouteTables tab = emu::carve_route_tables(smem, probe.slots_cap, probe.p.num_experts);
  emu::build_routes(probe.p, tab, info, 1);
  for (uint32_t s = threadIdx.x; s < info.slots; s += blockDim.x) {
    probe.ids[s] = tab.sel_id[s];
    probe.weights[s] = tab.sel_w[s];
  }
  if (threadIdx.x == 0) *probe.error = info.error;
}

struct RoutedRows {
  uint32_t error = 0;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

// Routes m rows of E logits (given in FP32, passed in dtype) on one emulated block of the MoE
// kernels' size.
RoutedRows route_on_device(const std::vector<float>& logits, uint32_t m, uint32_t E, uint32_t k,
                           bool renormalize, qmoe_dtype dtype) {
  const std::vector<unsigned char> bytes = to_bytes(dtype, logits);
  const std::vector<int32_t> residency(E, -1);
  RoutedRows out;
  out.ids.assign(size_t{m} * k, -7);
  out.weights.assign(size_t{m} * k, NAN);
  out.error = 0xEEEEu;
  RouteProbe probe{};
  probe.p.num_experts = E;
  probe.p.top_k = k;
  probe.p.m_capacity = m;
  probe.p.m = &m;
  probe.p.dtype = dtype;
  probe.p.logits = bytes.data();
  probe.p.renormalize = renormalize;
  probe.p.residency = residency.data();
  probe.slots_cap = m * k;
  probe.ids = out.ids.data();
  probe.weights = out.weights.data();
  probe.error = &out.error;
  const size_t smem = emu::route_table_bytes(probe.slots_cap, E);
  EXPECT_EQ(
      qmoe_host_emulator_launch(route_probe_kernel, dim3(1), dim3(emu::kBlockThreads), smem, probe),
      cudaSuccess);
  return out;
}

// Every block routes router logits exactly as qmoe_moe_route_topk (the ids bit for bit, the
// weights to the last bits of the softmax), over expert counts that do and do not fill whole
// 16-byte loads and pass a block's thread pairs, with ties (the lower id first, +0 and -0
// equal), -inf logits (selected, with weight 0, when fewer than k are finite) and equal rows;
// and refuses a row with a NaN or +inf logit, or of -inf only, wherever it sits.
TEST_F(EmulatedDevice, MoeRoutesLogitsAsTheCpu) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (uint32_t E : {1u, 2u, 3u, 5u, 8u, 13u, 32u, 127u, 128u, 130u, 300u, 1024u}) {
    for (uint32_t k : {1u, 2u, 3u, 8u, 13u}) {
      if (k > E) continue;
      const uint32_t m = 6;
      std::vector<float> logits(size_t{m} * E);
      for (float& v : logits) v = normal(rng_);
      std::uniform_int_distribution<uint32_t> pick(0, E - 1);
      float* row = logits.data();
      for (uint32_t i = 0; i < 2 * E; ++i) row[pick(rng_)] = row[pick(rng_)];  // row 0: ties
      row = logits.data() + E;  // row 1: coarse values, many equal, +0 and -0
      for (uint32_t e = 0; e < E; ++e) row[e] = std::round(normal(rng_) / 2.0f);
      for (uint32_t e = 0; e < E; e += 3) row[e] = e % 2 ? 0.0f : -0.0f;
      row = logits.data() + 2 * E;  // row 2: -inf everywhere but two experts
      for (uint32_t e = 0; e < E; ++e) row[e] = -INFINITY;
      row[pick(rng_)] = 1.5f;
      row[pick(rng_)] = -3.0f;
      row = logits.data() + 3 * E;  // row 3: one value everywhere
      for (uint32_t e = 0; e < E; ++e) row[e] = 0.25f;
      row = logits.data() + 4 * E;  // row 4: large and tiny magnitudes, some -inf
      for (uint32_t e = 0; e < E; ++e) row[e] = normal(rng_) * (e % 2 ? 1e37f : 1e-42f);
      for (uint32_t e = 1; e < E; e += 4) row[e] = -INFINITY;
      // row 5 stays normal.
      for (qmoe_dtype dtype : {QMOE_DTYPE_F32, QMOE_DTYPE_BF16}) {
        const std::vector<float> rows = round_trip(dtype, logits);
        for (bool renormalize : {true, false}) {
          std::vector<int32_t> ids;
          std::vector<float> weights;
          route(rows, m, E, k, renormalize, &ids, &weights);
          const RoutedRows got = route_on_device(rows, m, E, k, renormalize, dtype);
          const std::string what = "E " + std::to_string(E) + " k " + std::to_string(k) + " " +
                                   label(dtype) + (renormalize ? " renormalized" : " over E");
          ASSERT_EQ(got.error, 0u) << what;
          for (size_t s = 0; s < ids.size(); ++s) {
            ASSERT_EQ(got.ids[s], ids[s]) << what << " slot " << s;
            ASSERT_NEAR(got.weights[s], weights[s], 2e-6f * std::max(1.0f, weights[s]))
                << what << " slot " << s;
          }
        }
      }
    }
  }
  // Invalid rows: the bad value first, last, in the middle, and the row's other token valid.
  for (uint32_t E : {1u, 5u, 128u, 130u}) {
    const uint32_t k = std::min(E, 8u);
    for (uint32_t at : {0u, E / 2, E - 1}) {
      for (float bad : {NAN, INFINITY, -INFINITY}) {
        std::vector<float> logits(size_t{2} * E);
        for (float& v : logits) v = normal(rng_);
        float* row = logits.data() + E;
        if (bad == -INFINITY) {
          for (uint32_t e = 0; e < E; ++e) row[e] = -INFINITY;
        } else {
          row[at] = bad;
        }
        const RoutedRows got = route_on_device(logits, 2, E, k, true, QMOE_DTYPE_F32);
        EXPECT_EQ(got.error, emu::kMoeErrorLogits) << "E " << E << " at " << at << " " << bad;
      }
    }
  }
}

// Qwen3's layer shape (H 2048, I 768, block 32, FP16 grouped scales) at a reduced expert count,
// both levels, m = 1 and 4 (capacities 1 and 4): the model-size walks, tiles and task ranges.
TEST_F(EmulatedDevice, MoeLayerQwen3Shape) {
  MoeOptions o;
  o.experts = 8;
  o.hidden = 2048;
  o.intermediate = 768;
  for (Int4Options* q : {&o.fc1, &o.fc2}) {
    q->block_size = 32;
    q->scale_dtype = QMOE_DTYPE_F16;
    q->scale_order = ScaleOrder::kGrouped;
  }
  use_qwen3_swiglu(&o);
  for (qmoe_accuracy acc : {QMOE_ACCURACY_FAST, QMOE_ACCURACY_EXACT}) {
    for (uint32_t m : {1u, 4u}) {
      const MoeCase c{
          acc, m == 1 ? QMOE_DTYPE_F16 : QMOE_DTYPE_BF16, false, false, false, false, m == 1, m, m,
          4};
      check_moe_case(c, o, rng_);
      if (HasFailure()) return;
    }
  }
}

// expected_tokens_per_expert changes the tokens per work item, never the bits: a call whose
// tokens all route to the same experts (the hint's case) and one routed at random, each run
// without the hint and with it, must give the same bytes, within the reference's bounds; the
// hint must have moved T (else the comparison proves nothing).
TEST_F(EmulatedDevice, MoeLayerTokensPerExpertHintKeepsTheBits) {
  // 32 experts, top-2: uniform routing's estimate at capacity 8 is 1.24 tokens a routed expert
  // (T = 1 at both levels); the hint of 8 takes T = 4 and 8.
  MoeOptions o = shape_c();
  o.experts = 32;
  use_qwen3_swiglu(&o);
  const uint32_t capacity = 8, m = capacity, k = 2, H = o.hidden, E = o.experts;
  for (qmoe_accuracy acc : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    for (bool shared : {true, false}) {
      const MoeCase c{acc, QMOE_DTYPE_BF16, false, false, false, !shared, false, capacity, m, k};
      MoeFixture f(o, c.partial, rng_);
      const std::vector<float> x = round_trip(c.dtype, random_activations(m, H, rng_));
      std::vector<int32_t> ids;
      std::vector<float> weights;
      random_routing(m, E, k, rng_, &ids, &weights);
      if (shared) {
        for (uint32_t t = 1; t < m; ++t) std::copy_n(ids.begin(), k, ids.begin() + t * k);
      }
      const MoeReference ref =
          reference_moe(f.model(), acc, x, m, ids, weights, k, f.mask().data(), {});
      const std::string what = std::string(shared ? "shared " : "random ") + describe_moe(c, o, 4);
      f.set_tokens_hint(0.0f);
      const MoeRun plain = f.run(c, x, ids, weights, {}, {}, m, 4);
      const uint32_t plain_t = f.last_tokens_per_item();
      f.set_tokens_hint(static_cast<float>(capacity));
      const MoeRun hinted = f.run(c, x, ids, weights, {}, {}, m, 4);
      EXPECT_GT(f.last_tokens_per_item(), plain_t) << what;
      EXPECT_EQ(plain.error, 0u) << what;
      EXPECT_EQ(hinted.error, 0u) << what;
      EXPECT_TRUE(plain.y == hinted.y) << "the hint changed the bits; " << what;
      size_t bad = 0;
      const size_t ldy = H + 5;
      check_layer_values(
          c.dtype, m, H,
          [&](uint32_t t, uint32_t n) {
            return element(c.dtype, hinted.y.data(), size_t{t} * ldy + n);
          },
          ref, {}, 1.0, 1.01, what, &bad);
      EXPECT_EQ(bad, 0u) << what;
      if (HasFailure()) return;
    }
  }
}

// A hint outside 0 or [1, m_capacity] is refused by the launcher, which writes nothing; hints
// inside it run the same call.
TEST_F(EmulatedDevice, MoeLayerRefusesABadTokensPerExpertHint) {
  MoeOptions o = shape_c();
  use_qwen3_swiglu(&o);
  const uint32_t capacity = 4, k = 2;
  const MoeCase c{QMOE_ACCURACY_FAST, QMOE_DTYPE_F32, false, false, false, false, false,
                  capacity,           capacity,       k};
  MoeFixture f(o, false, rng_);
  const std::vector<float> x = random_activations(capacity, o.hidden, rng_);
  std::vector<int32_t> ids;
  std::vector<float> weights;
  random_routing(capacity, o.experts, k, rng_, &ids, &weights);
  for (float hint : {1.0f, 2.5f, 4.0f}) {  // accepted: the same call runs
    f.set_tokens_hint(hint);
    const MoeRun r = f.run(c, x, ids, weights, {}, {}, capacity, 1);
    EXPECT_EQ(r.error, 0u) << hint;
  }
  f.expect_refusal(true);
  for (float hint : {0.5f, 4.5f, -1.0f, NAN, INFINITY}) {
    f.set_tokens_hint(hint);
    const MoeRun r = f.run(c, x, ids, weights, {}, {}, capacity, 1);
    EXPECT_TRUE(std::all_of(r.y.begin(), r.y.end(), [](unsigned char v) { return v == kPoison; }))
        << "a refused call wrote y; hint " << hint;
  }
}

// One token on fewer than 8 slots: FC2's rounds are dealt over a block's warps (the kByRound
// kernel) where a block has several rounds, and the item deal runs where every block has one
// (as many multiprocessors as FC2 has groups). Both give the same bits, within the reference's
// bounds, at both levels and on every device size.
TEST_F(EmulatedDevice, MoeLayerFc2RoundDealKeepsTheBits) {
  MoeOptions o = shape_c();  // H = 96: 12 groups of FC2 rows
  use_gpt_oss_swiglu(&o);
  const int groups = static_cast<int>(o.hidden / 8);
  for (qmoe_accuracy acc : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    for (uint32_t k : {3u, 4u}) {  // 3 items do not divide the 8 warps: each pair restages
      const MoeCase c{acc, QMOE_DTYPE_F32, false, false, false, k == 3, false, 1, 1, k};
      MoeFixture f(o, c.partial, rng_);
      const std::vector<float> x = random_activations(1, o.hidden, rng_);
      std::vector<int32_t> ids;
      std::vector<float> weights;
      random_routing(1, o.experts, k, rng_, &ids, &weights);
      const MoeReference ref =
          reference_moe(f.model(), acc, x, 1, ids, weights, k, f.mask().data(), {});
      std::vector<unsigned char> first;
      for (int sms : {groups, 1, 5}) {  // from one FC2 round a block (items dealt) to several
        const std::string what = describe_moe(c, o, sms);
        const MoeRun r = f.run(c, x, ids, weights, {}, {}, 1, sms);
        EXPECT_EQ(r.error, 0u) << what;
        size_t bad = 0;
        check_layer_values(
            c.dtype, 1, o.hidden,
            [&](uint32_t t, uint32_t n) {
              return element(c.dtype, r.y.data(), size_t{t} * (o.hidden + 5) + n);
            },
            ref, {}, 1.0, 1.01, what, &bad);
        EXPECT_EQ(bad, 0u) << what;
        if (first.empty()) {
          first = r.y;
        } else {
          EXPECT_TRUE(first == r.y) << "the rounds' deal changed the bits; " << what;
        }
        if (HasFailure()) return;
      }
    }
  }
}

// ---- INT3 experts ------------------------------------------------------------------------------

// INT3 experts (FC1 and FC2: a set holds one format) in the INT4 tests' layer shapes (blocks 16
// to 64 with half-filled last chunks, zero points 0..7 or the default 4, FP32/FP16/BF16 scales in
// several orders, biases), both levels, M from 1 to 12 (experts with more than 8 tokens), both
// fusions and activations, ids or logits routing, partial residency and accumulate; against the
// FP64 layer and the CPU layer, and the same bits on 1 and 4 multiprocessors.
TEST_F(EmulatedDevice, MoeLayerInt3ExpertsMatchReferenceAndCpu) {
  struct Variant {
    int shape;
    qmoe_swiglu_fusion fusion;
    bool gpt_oss;
    int routing;  // ids, logits renormalized, logits over all E
    bool partial, accumulate;
  };
  const Variant variants[] = {
      {0, QMOE_SWIGLU_INTERLEAVED, true, 0, false, false},
      {1, QMOE_SWIGLU_CONCATENATED, false, 1, true, true},
      {2, QMOE_SWIGLU_INTERLEAVED, false, 0, true, false},
      {0, QMOE_SWIGLU_CONCATENATED, true, 2, false, true},
  };
  struct Size {
    uint32_t capacity, m, k;
  };
  // Per level, one size per variant (m = 12, k = 5: experts with more than 8 tokens, once only,
  // as it takes the emulator as long as the other cases together).
  const Size sizes[2][4] = {{{1, 1, 2}, {4, 4, 3}, {8, 7, 2}, {12, 12, 5}},
                            {{8, 7, 2}, {16, 5, 4}, {1, 1, 2}, {4, 4, 3}}};
  const qmoe_dtype dtypes[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
  int index = 0;
  for (qmoe_accuracy acc : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    for (const Variant& v : variants) {
      const Size sz = sizes[acc == QMOE_ACCURACY_FAST ? 1 : 0][index % 4];
      MoeOptions o = v.shape == 0 ? small_layer_a() : v.shape == 1 ? small_layer_b() : shape_c();
      o.fusion = v.fusion;
      if (v.gpt_oss) {
        use_gpt_oss_swiglu(&o);
      } else {
        use_qwen3_swiglu(&o);
      }
      const MoeCase c{acc,       dtypes[index % 3], v.accumulate, v.routing != 0, v.routing == 1,
                      v.partial, index % 2 == 1,    sz.capacity,  sz.m,           sz.k};
      ++index;
      check_moe_case(c, o, rng_, QMOE_WEIGHT_FORMAT_INT3);
      if (HasFailure()) return;
    }
  }
}

// ---- MXFP4 and NVFP4 experts -------------------------------------------------------------------

struct Fp4LayerRun {
  std::vector<float> y;  // [m][H], widened from the dtype
  uint32_t error = 0;
};

// The layer on the emulated device with every expert of `e` resident (slots in a shuffled
// order), routed by ids and weights; `slot_format` overrides one slot's description format
// (-1: none) to check the kernels' refusal.
Fp4LayerRun run_fp4_layer(const Fp4Experts& e, qmoe_accuracy acc, qmoe_dtype dtype,
                          const std::vector<float>& x, uint32_t m, const std::vector<int32_t>& ids,
                          const std::vector<float>& weights, uint32_t k, int sms,
                          std::mt19937_64& rng, int slot_format = -1) {
  qmoe_emu::device().sm_count = sms;
  const uint32_t H = e.hidden, E = e.experts;
  std::vector<uint32_t> order(E);
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> residency(E);
  std::vector<emu::DeviceQuantMatrix> fc1, fc2;
  for (uint32_t s = 0; s < E; ++s) {
    residency[order[s]] = static_cast<int32_t>(s);
    fc1.push_back(describe_host<emu::DeviceQuantMatrix>(e.fc1[order[s]]));
    fc2.push_back(describe_host<emu::DeviceQuantMatrix>(e.fc2[order[s]]));
  }
  if (slot_format >= 0) fc2[0].format = static_cast<qmoe_weight_format>(slot_format);
  const std::vector<unsigned char> xb = to_bytes(dtype, x);
  std::vector<unsigned char> y(size_t{m} * H * dsize(dtype), kPoison);
  const size_t ws = emu::moe_layer_workspace_size(m, k, E, H, e.inter);
  std::vector<unsigned char> ws_buf(ws + 256, 0xFF);
  unsigned char* workspace =
      ws_buf.data() + ((256 - (reinterpret_cast<uintptr_t>(ws_buf.data()) & 255)) & 255);
  emu::MoeLayerParams p{};
  p.num_experts = E;
  p.hidden = H;
  p.intermediate = e.inter;
  p.top_k = k;
  p.m_capacity = m;
  p.num_slots = E;
  p.accuracy = acc;
  p.dtype = dtype;
  p.fusion = QMOE_SWIGLU_INTERLEAVED;
  p.alpha = e.alpha;
  p.beta = e.beta;
  p.limit = e.limit;
  p.format = e.fc1[0].desc.format;
  p.fc1 = fc1.data();
  p.fc2 = fc2.data();
  p.m = &m;
  p.x = xb.data();
  p.ldx = H;
  p.y = y.data();
  p.ldy = H;
  p.ids = ids.data();
  p.weights = weights.data();
  p.residency = residency.data();
  p.workspace = workspace;
  p.workspace_bytes = ws;
  EXPECT_EQ(emu::launch_moe_layer(p, nullptr), cudaSuccess);
  Fp4LayerRun out;
  std::memcpy(&out.error, workspace, 4);
  out.y.resize(size_t{m} * H);
  for (size_t i = 0; i < out.y.size(); ++i) out.y[i] = element(dtype, y.data(), i);
  return out;
}

// gpt-oss's layer form with MXFP4 experts and the same with NVFP4 (FC1's K = H % 32 == 16: a
// half-filled last chunk): both levels, every dtype, m = 1, 4 and 7; against the FP64 layer
// and the CPU layer, and the same bits on 1 and 4 multiprocessors.
TEST_F(EmulatedDevice, MoeLayerFp4ExpertsMatchReferenceAndCpu) {
  const qmoe_dtype dtypes[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
  int index = 0;
  for (qmoe_weight_format format : {QMOE_WEIGHT_FORMAT_MXFP4, QMOE_WEIGHT_FORMAT_NVFP4}) {
    const uint32_t experts = 6, hidden = format == QMOE_WEIGHT_FORMAT_MXFP4 ? 96 : 80, inter = 64,
                   k = 3;
    const std::unique_ptr<Fp4Experts> e = make_fp4_experts(format, experts, hidden, inter, rng_);
    ASSERT_NE(e->set, nullptr);
    qmoe_context* ctx = nullptr;
    ASSERT_EQ(qmoe_context_create(nullptr, &ctx), QMOE_STATUS_OK);
    for (uint32_t m : {1u, 4u, 7u}) {
      for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        const qmoe_dtype dtype = dtypes[index++ % 3];
        const std::vector<float> x = round_trip(dtype, random_activations(m, hidden, rng_));
        std::vector<int32_t> ids;
        std::vector<float> weights;
        random_routing(m, experts, k, rng_, &ids, &weights);
        std::vector<double> y_ref, tol;
        reference_fp4_moe(*e, x, m, ids, weights, k, level, &y_ref, &tol);
        std::vector<float> cpu(size_t{m} * hidden);
        ASSERT_EQ(moe_forward(ctx, e->set.get(), level, m, x.data(), hidden, ids.data(),
                              weights.data(), k, cpu.data(), hidden, nullptr),
                  QMOE_STATUS_OK)
            << qmoe_last_error_message();
        std::vector<float> first;
        for (int sms : {1, 4}) {
          const Fp4LayerRun r = run_fp4_layer(*e, level, dtype, x, m, ids, weights, k, sms, rng_);
          const std::string what = std::string(fp4_format_name(format)) +
                                   (level == QMOE_ACCURACY_EXACT ? " exact " : " fast ") +
                                   label(dtype) + " m=" + std::to_string(m) +
                                   " sms=" + std::to_string(sms);
          EXPECT_EQ(r.error, 0u) << what;
          size_t bad = 0;
          for (size_t o = 0; o < r.y.size(); ++o) {
            const double got = r.y[o];
            const double t = tol[o] + 1.01 * dtype_half_ulp(dtype, std::max(std::fabs(y_ref[o]),
                                                                            std::fabs(got)));
            if (!(std::fabs(got - y_ref[o]) <= t) && bad++ < 5) {
              ADD_FAILURE() << "y[" << o << "] = " << got << ", FP64 " << y_ref[o] << " +- " << t
                            << "; " << what;
            }
            if (!(std::fabs(got - cpu[o]) <= t + tol[o]) && bad++ < 5) {
              ADD_FAILURE() << "y[" << o << "] = " << got << ", CPU layer " << cpu[o] << "; "
                            << what;
            }
          }
          EXPECT_EQ(bad, 0u) << what;
          if (first.empty()) {
            first = r.y;
          } else {
            EXPECT_EQ(std::memcmp(first.data(), r.y.data(), first.size() * sizeof(float)), 0)
                << "the bits depend on the device size; " << what;
          }
        }
        if (HasFailure()) {
          qmoe_context_destroy(ctx);
          return;
        }
      }
    }
    qmoe_context_destroy(ctx);
  }
}

// A slot whose description is not the launch's format (or not one its kernels read) is a
// malformed slot: the error word says so and the rows are zero.
TEST_F(EmulatedDevice, MoeLayerFp4SlotOfAnotherFormatIsMalformed) {
  const std::unique_ptr<Fp4Experts> e = make_fp4_experts(QMOE_WEIGHT_FORMAT_MXFP4, 4, 64, 32, rng_);
  const uint32_t m = 2, k = 4;  // every expert routed
  const std::vector<float> x = random_activations(m, e->hidden, rng_);
  std::vector<int32_t> ids;
  std::vector<float> weights;
  random_routing(m, e->experts, k, rng_, &ids, &weights);
  for (int format : {int{QMOE_WEIGHT_FORMAT_NVFP4}, int{QMOE_WEIGHT_FORMAT_INT4}}) {
    const Fp4LayerRun r = run_fp4_layer(*e, QMOE_ACCURACY_FAST, QMOE_DTYPE_F32, x, m, ids, weights,
                                        k, 2, rng_, format);
    EXPECT_EQ(r.error, emu::kMoeErrorSlotMatrix) << format;
    for (float v : r.y) ASSERT_EQ(v, 0.0f) << format;
  }
  const Fp4LayerRun ok =
      run_fp4_layer(*e, QMOE_ACCURACY_FAST, QMOE_DTYPE_F32, x, m, ids, weights, k, 2, rng_);
  EXPECT_EQ(ok.error, 0u);
}

// ---- Launch plans at the model shapes --------------------------------------------------------
//
// The launcher's grids on a device with an H100's or H200's limits (132 SMs, 228 KiB of shared
// memory an SM, 227 KiB a block), as docs/results/2026-12-05-moe-fill-by-expected-tasks.md and
// 2026-12-05-h100-fc2-two-blocks-at-eight-tokens.md measured them: FC1 takes every place of the
// SMs (three blocks) where its expected tasks pass the warps of two blocks an SM, and FC2 then
// takes two blocks an SM, as it does at eight tokens an item; elsewhere FC1 two blocks and FC2
// one. Plans only: nothing is launched.

struct PlanCase {
  const char* what;
  uint32_t experts, hidden, intermediate, top_k, m;
  qmoe_accuracy acc;
  float hint;
  uint32_t want_t, want_fc1_per_sm, want_fc2_per_sm;
};

emu::MoeLayerParams plan_params(const PlanCase& c) {
  emu::MoeLayerParams p{};
  p.num_experts = c.experts;
  p.hidden = c.hidden;
  p.intermediate = c.intermediate;
  p.top_k = c.top_k;
  p.m_capacity = c.m;
  p.num_slots = c.experts;
  p.accuracy = c.acc;
  p.dtype = QMOE_DTYPE_BF16;
  p.fusion = QMOE_SWIGLU_INTERLEAVED;
  p.format = QMOE_WEIGHT_FORMAT_INT4;
  p.expected_tokens_per_expert = c.hint;
  return p;
}

constexpr emu::DeviceLimits kHopperLimits{132, 228 * 1024, 227 * 1024};

// Every plan: grids within the device and the call, FC2's rounds cover its groups, the blocks
// that share an SM fit its shared memory.
void expect_consistent_plan(const emu::MoeLaunchPlan& plan, const emu::DeviceLimits& d,
                            bool publish, const std::string& what) {
  const emu::MoeKernelParams& kp = plan.kp;
  EXPECT_GE(plan.fc1_grid, 1u) << what;
  EXPECT_LE(plan.fc1_grid, emu::kDecodeMinBlocksPerSm * d.sms) << what;
  EXPECT_LE(plan.fc1_grid, plan.fc1_blocks_per_sm * d.sms + (publish ? 1 : 0)) << what;
  EXPECT_LE(plan.fc2_grid, kp.fc2_groups) << what;
  EXPECT_LE(plan.fc2_grid, plan.fc2_blocks_per_sm * d.sms) << what;
  EXPECT_GE(uint64_t{kp.fc2_rounds} * plan.fc2_grid, kp.fc2_groups) << what;
  EXPECT_LT(uint64_t{kp.fc2_rounds - 1} * plan.fc2_grid, kp.fc2_groups) << what;
  const size_t per_block = emu::kStaticSmemBoundBytes + emu::kBlockSmemReserveBytes;
  const size_t fc2_beside = plan.fc1_blocks_per_sm == emu::kFillFc1BlocksPerSm ? 0 : 1;
  EXPECT_LE(
      plan.fc1_blocks_per_sm * (plan.smem1 + per_block) + fc2_beside * (plan.smem2 + per_block),
      d.smem_per_sm)
      << what;
}

TEST_F(EmulatedDevice, MoeLayerLaunchPlansAtTheModelShapes) {
  constexpr uint32_t kQ[4] = {128, 2048, 768, 8};  // Qwen3-30B-A3B: E, H, I, k
  constexpr uint32_t kG[4] = {32, 2880, 2880, 4};  // gpt-oss-20b
  constexpr qmoe_accuracy kFast = QMOE_ACCURACY_FAST, kExact = QMOE_ACCURACY_EXACT;
  const PlanCase cases[] = {
      // FC1's 1536 tasks fit one wave of 2112 warps: FC2 starts early beside it.
      {"qwen3 fast m1", kQ[0], kQ[1], kQ[2], kQ[3], 1, kFast, 0, 1, 2, 1},
      {"qwen3 exact m1", kQ[0], kQ[1], kQ[2], kQ[3], 1, kExact, 0, 1, 2, 1},
      // 2880 tasks (gpt-oss M = 1), 6144 (Qwen3 M = 4): filled.
      {"gpt-oss fast m1", kG[0], kG[1], kG[2], kG[3], 1, kFast, 0, 1, 3, 2},
      {"qwen3 fast m4", kQ[0], kQ[1], kQ[2], kQ[3], 4, kFast, 0, 1, 3, 2},
      {"qwen3 exact m4", kQ[0], kQ[1], kQ[2], kQ[3], 4, kExact, 0, 1, 3, 2},
      // Every token on the same 8 experts (the hint): 8 items at fast M = 2 and 4, one wave.
      {"qwen3 fast m2 hint 2", kQ[0], kQ[1], kQ[2], kQ[3], 2, kFast, 2, 2, 2, 1},
      {"qwen3 fast m4 hint 4", kQ[0], kQ[1], kQ[2], kQ[3], 4, kFast, 4, 4, 2, 1},
      // 16 items at T = 4 and T = 2: two waves' worth, filled.
      {"qwen3 fast m8 hint 8", kQ[0], kQ[1], kQ[2], kQ[3], 8, kFast, 8, 4, 3, 2},
      {"qwen3 exact m4 hint 4", kQ[0], kQ[1], kQ[2], kQ[3], 4, kExact, 4, 2, 3, 2},
      // T = 8 with 8 items: FC1 one wave beside FC2's first block, FC2 two blocks an SM.
      {"qwen3 exact m8 hint 8", kQ[0], kQ[1], kQ[2], kQ[3], 8, kExact, 8, 8, 2, 2},
      // Uniform routing at M = 64: T = 4 (fast) and 2 (exact), filled.
      {"qwen3 fast m64", kQ[0], kQ[1], kQ[2], kQ[3], 64, kFast, 0, 4, 3, 2},
      {"qwen3 exact m64", kQ[0], kQ[1], kQ[2], kQ[3], 64, kExact, 0, 2, 3, 2},
      {"gpt-oss exact m64", kG[0], kG[1], kG[2], kG[3], 64, kExact, 0, 8, 3, 2},
  };
  for (const PlanCase& c : cases) {
    emu::MoeLaunchPlan plan{};
    ASSERT_TRUE(emu::plan_moe_launch(plan_params(c), kHopperLimits, &plan)) << c.what;
    EXPECT_EQ(plan.kp.tokens_per_item, c.want_t) << c.what;
    EXPECT_EQ(plan.fc1_blocks_per_sm, c.want_fc1_per_sm) << c.what;
    EXPECT_EQ(plan.fc2_blocks_per_sm, c.want_fc2_per_sm) << c.what;
    expect_consistent_plan(plan, kHopperLimits, false, c.what);
  }
  // gpt-oss's top-4 at M = 1: 4 slots and two rounds of FC2's 360 groups on 264 blocks, dealt
  // over the warps.
  emu::MoeLaunchPlan plan{};
  ASSERT_TRUE(emu::plan_moe_launch(plan_params(cases[2]), kHopperLimits, &plan));
  EXPECT_EQ(plan.fc2_grid, 264u);
  EXPECT_EQ(plan.kp.fc2_rounds, 2u);
  EXPECT_TRUE(plan.fc2_by_round);
  ASSERT_TRUE(emu::plan_moe_launch(plan_params(cases[0]), kHopperLimits, &plan));
  EXPECT_EQ(plan.fc1_grid, 264u);
  EXPECT_EQ(plan.fc2_grid, 132u);
  EXPECT_FALSE(plan.fc2_by_round);  // 8 slots: an item for each warp
}

TEST_F(EmulatedDevice, MoeLayerLaunchPlanFollowsTheDevice) {
  const PlanCase qwen3_m1{"qwen3 fast m1", 128, 2048, 768, 8, 1, QMOE_ACCURACY_FAST, 0, 1, 2, 1};
  const PlanCase qwen3_m4{"qwen3 exact m4", 128, 2048, 768, 8, 4, QMOE_ACCURACY_EXACT, 0, 1, 3, 2};
  emu::MoeLaunchPlan plan{};
  // A 16-SM device: Qwen3's 1536 tasks at M = 1 pass its 256 warps of two blocks an SM.
  const emu::DeviceLimits small{16, kHopperLimits.smem_per_sm, kHopperLimits.smem_per_block};
  ASSERT_TRUE(emu::plan_moe_launch(plan_params(qwen3_m1), small, &plan));
  EXPECT_EQ(plan.fc1_blocks_per_sm, emu::kFillFc1BlocksPerSm);
  EXPECT_EQ(plan.fc1_grid, 48u);
  EXPECT_EQ(plan.fc2_grid, 32u);
  expect_consistent_plan(plan, small, false, "16 SMs");

  // The offload's classify-publish block takes one place: a filled FC1 keeps the others.
  emu::MoeLayerParams p = plan_params(qwen3_m4);
  p.offload.enabled = true;
  ASSERT_TRUE(emu::plan_moe_launch(p, kHopperLimits, &plan));
  EXPECT_EQ(plan.fc1_grid, 396u);
  expect_consistent_plan(plan, kHopperLimits, true, "offload, filled");
  p = plan_params(qwen3_m1);
  p.offload.enabled = true;
  ASSERT_TRUE(emu::plan_moe_launch(p, kHopperLimits, &plan));
  EXPECT_EQ(plan.fc1_grid, 265u);
  expect_consistent_plan(plan, kHopperLimits, true, "offload, one wave");

  // Shared memory for fewer than three FC1 blocks an SM: FC1 takes the places that fit (with
  // FC2's block beside them); FC2 still takes two blocks an SM after it.
  ASSERT_TRUE(emu::plan_moe_launch(plan_params(qwen3_m4), kHopperLimits, &plan));
  const size_t fc1_block = plan.smem1 + emu::kStaticSmemBoundBytes + emu::kBlockSmemReserveBytes;
  const emu::DeviceLimits tight{132, 3 * fc1_block - 1, kHopperLimits.smem_per_block};
  ASSERT_TRUE(emu::plan_moe_launch(plan_params(qwen3_m4), tight, &plan));
  EXPECT_LT(plan.fc1_blocks_per_sm, emu::kFillFc1BlocksPerSm);
  EXPECT_EQ(plan.fc2_blocks_per_sm, 2u);
  expect_consistent_plan(plan, tight, false, "tight shared memory");

  // A block's shared memory over the device's: no plan (the launcher's cudaErrorInvalidValue).
  const emu::DeviceLimits tiny{132, kHopperLimits.smem_per_sm,
                               plan.smem1 + emu::kStaticSmemBoundBytes - 1};
  EXPECT_FALSE(emu::plan_moe_launch(plan_params(qwen3_m4), tiny, &plan));
}

}  // namespace
}  // namespace qmoe::testing
