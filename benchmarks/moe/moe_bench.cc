// The MoE layer through the public ABI (qmoe_moe_forward on a qmoe_context), on the
// Qwen3-30B-A3B layer shape: 128 experts, top-8, hidden 2048, expert intermediate 768, scales in
// the grouped order (per 8-row group, K/block x 8), gate and up interleaved (swiglu_fusion = 1),
// in each weight format (gemm_bench_common.h: what the formats' weights hold):
//
//   moe_layer/qwen3/<isa>/<exact|fast>/m:<1|4>/cold/threads:<1|all>          INT4
//   moe_layer/qwen3_<int3|mxfp4|nvfp4>/<isa>/fast/m:<1|4>/cold/threads:<1|all>
//
//   isa      the context's max_isa (scalar, avx2, avx512); a tier the host lacks is skipped
//            with the reason. Scalar runs INT4 m:1 at 1 thread only (it is the reference).
//   M        tokens per call: 1 (decode) or 4 (a small decode batch).
//   cold     calls walk the experts in order: at M = 1 call c takes the 8 experts of the next
//            window of 8; at M = 4 each token draws 8 distinct experts at random from the next
//            window of 32 (so tokens share some experts, as real routing does). Layers are
//            added until they hold 4 x the LLC, and the walk moves to the next layer each
//            time it has passed all 128 experts, so an expert is read again only after every
//            expert of every layer was (over 320 MB, and over 4 x the LLC): each call
//            streams its experts from DRAM, the cold-expert case.
//   threads  the context's own thread count: 1, or all hardware threads.
//
// One iteration is one qmoe_moe_forward call, timed alone (argument checks, routing groups,
// activation preparation, both projections, SwiGLU, the weighted combine, thread hand-offs).
// Before each call, untimed, the same context reads the window after the previous call's (its
// experts' whole slots, as cold as the call's) with qmoe_measure_read_bandwidth_over: a read of
// the same kind of pages on the same threads in the same seconds, so that a host whose
// bandwidth drifts (other tenants, a shared socket) moves the call and its roof together; the
// call then takes the window after that one.
// Counters:
//   us_per_call          mean time per call
//   experts              distinct experts per call (their weights are what the call must read)
//   GB/s                 those experts' weight bytes (codes + scales) per call over time
//   frac_of_read_bw      GB/s over the DRAM read roof of the same thread count, measured at
//                        startup: the fraction of the memory-bound floor reached
//   paired_read_GB/s     the interleaved reads' bytes over their time
//   frac_of_paired_read  GB/s over paired_read_GB/s: the same fraction against the roof
//                        measured beside each call (issue 21's all-thread bar reads it)
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/bench_util.h"
#include "benchmarks/gemm/gemm_bench_common.h"
#include "qmoe/qmoe.h"

namespace qmoe::bench {
namespace {

constexpr uint32_t kExperts = 128, kTopK = 8, kHidden = 2048, kIntermediate = 768;
constexpr uint32_t kWindow = 32;
constexpr uint32_t kTokenCounts[] = {1, 4};

size_t round_up(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// One projection's storage inside an expert's slot: canonical codes, then the scale plane.
struct Projection {
  const GemmBenchFormat* format;
  uint32_t n, k;
  size_t codes_bytes, scale_offset, bytes;  // bytes: codes + scales (what a call reads)

  Projection(const GemmBenchFormat& f, uint32_t n_rows, uint32_t k_cols)
      : format(&f), n(n_rows), k(k_cols) {
    qmoe_quant_matrix_codes_size(f.format, n, k, &codes_bytes);
    scale_offset = round_up(codes_bytes, 64);
    bytes = codes_bytes + scale_elements() * f.scale_element_bytes;
  }
  size_t scale_elements() const { return size_t{n} * (k / format->block_size); }
  size_t slot_bytes() const { return round_up(scale_offset + bytes - codes_bytes, 4096); }

  qmoe_quant_matrix describe(unsigned char* slot) const {
    qmoe_quant_matrix w{};
    w.struct_size = sizeof(w);
    w.format = format->format;
    w.n = n;
    w.k = k;
    w.block_size = format->block_size;
    w.codes = slot;
    w.scale_dtype = format->scale_dtype;
    w.scales = slot + scale_offset;
    w.scale_row_stride = 1;  // grouped: (n, b) at (n / 8) * 8 K/block + b * 8 + n % 8
    w.scale_block_stride = 8;
    w.scale_group_stride = size_t{8} * (k / format->block_size);
    w.global_scale = format->global_scale;
    return w;
  }
  void fill(unsigned char* slot, uint64_t& seed) const {
    fill_random_bytes(slot, codes_bytes, seed);
    format->fill_scales(slot + scale_offset, scale_elements(), seed);
  }
};

// Layers of random experts of one format in one huge-page buffer. Expert e of layer l occupies
// slot l * 128 + e: its FC1, then its FC2. Kept for the consecutive rows of one format (they are
// registered format by format); the next format's pool replaces it, so that one pool (4 x the
// LLC or more) is held at a time.
class LayerPool {
 public:
  static LayerPool& get(const GemmBenchFormat& format) {
    static std::unique_ptr<LayerPool> current;
    if (current == nullptr || current->format_ != &format) {
      current.reset();  // free the previous pool's buffer before allocating the next
      current.reset(new LayerPool(format));
    }
    return *current;
  }
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  size_t layer_count() const { return sets_.size(); }
  const qmoe_expert_set* layer(size_t i) const { return sets_[i]; }
  size_t expert_bytes() const { return fc1_.bytes + fc2_.bytes; }
  // Experts [first, first + count) of layer l: their whole slots, one contiguous range (NULL
  // when the range leaves the layer).
  const unsigned char* slots(size_t l, uint32_t first, uint32_t count) const {
    if (l >= sets_.size() || first + count > kExperts) return nullptr;
    return buffer_.data() + (l * kExperts + first) * expert_slot_;
  }
  size_t slots_bytes(uint32_t count) const { return count * expert_slot_; }

  ~LayerPool() {
    for (qmoe_expert_set* s : sets_) qmoe_expert_set_destroy(s);
  }

 private:
  explicit LayerPool(const GemmBenchFormat& format)
      : format_(&format),
        fc1_(format, 2 * kIntermediate, kHidden),
        fc2_(format, kHidden, kIntermediate),
        expert_slot_(fc1_.slot_bytes() + fc2_.slot_bytes()) {
    const size_t layer_bytes = size_t{kExperts} * expert_bytes();
    const size_t layers =
        std::max<size_t>(1, (4 * llc_total_bytes() + layer_bytes - 1) / layer_bytes);
    buffer_ = AlignedBuffer(layers * kExperts * expert_slot_);
    matrices_.resize(layers * kExperts * 2);
    uint64_t seed = 0x30EB1A7Eull;
    for (size_t l = 0; l < layers; ++l) {
      std::vector<const qmoe_quant_matrix*> fc1(kExperts), fc2(kExperts);
      for (uint32_t e = 0; e < kExperts; ++e) {
        const size_t index = l * kExperts + e;
        unsigned char* slot = buffer_.data() + index * expert_slot_;
        fc1_.fill(slot, seed);
        fc2_.fill(slot + fc1_.slot_bytes(), seed);
        matrices_[2 * index] = fc1_.describe(slot);
        matrices_[2 * index + 1] = fc2_.describe(slot + fc1_.slot_bytes());
        fc1[e] = &matrices_[2 * index];
        fc2[e] = &matrices_[2 * index + 1];
      }
      qmoe_expert_set_desc d;
      qmoe_expert_set_desc_init(&d);
      d.num_experts = kExperts;
      d.hidden = kHidden;
      d.intermediate = kIntermediate;
      d.swiglu_fusion = QMOE_SWIGLU_INTERLEAVED;
      d.fc1 = fc1.data();
      d.fc2 = fc2.data();
      qmoe_expert_set* set = nullptr;
      if (qmoe_expert_set_create(&d, &set) != QMOE_STATUS_OK) {
        error_ = std::string("qmoe_expert_set_create failed: ") + qmoe_last_error_message();
        return;
      }
      sets_.push_back(set);
    }
  }

  const GemmBenchFormat* format_;
  Projection fc1_, fc2_;
  size_t expert_slot_;
  AlignedBuffer buffer_;
  std::vector<qmoe_quant_matrix> matrices_;
  std::vector<qmoe_expert_set*> sets_;
  std::string error_;
};

struct Case {
  const GemmBenchFormat* format;
  Isa isa;
  qmoe_accuracy accuracy;
  uint32_t m;
  size_t threads;
};

// The walk over the experts (see the file comment): each call, and each paired read, takes the
// next window. The walk's position (cursor_, layer_) is one per process, shared by every router:
// Google Benchmark calls a benchmark function once per probe run and per repetition, and a
// router whose walk restarted at layer 0, expert 0 each time re-read, in the reported run,
// experts its own probe run had just read (on a 300 MiB L3, up to a fifth of one-thread M = 1
// reads).
class ColdRouter {
 public:
  explicit ColdRouter(uint32_t m) : m_(m), ids_(size_t{m} * kTopK), weights_(ids_.size()) {}

  uint32_t window() const { return m_ == 1 ? kTopK : kWindow; }

  // Moves the walk to the next window; returns its first expert. A window never wraps around:
  // when the experts left in the layer are fewer than a window (the row before had another
  // window size), the walk moves on to the next layer's first window. The window's layer is
  // then layer().
  uint32_t advance() {
    if (cursor_ + window() > kExperts) {
      cursor_ = 0;
      ++layer_;
    }
    const uint32_t base = cursor_;
    cursor_ += window();
    return base;
  }

  // Routes the next call; returns the number of distinct experts it reads.
  uint32_t next() {
    const uint32_t w = window();
    const uint32_t base = advance();
    bool used[kWindow] = {};
    for (uint32_t t = 0; t < m_; ++t) {
      uint32_t picked[kWindow];
      for (uint32_t i = 0; i < w; ++i) picked[i] = i;
      for (uint32_t j = 0; j < kTopK; ++j) {  // first kTopK of a partial Fisher-Yates shuffle
        const uint32_t r = m_ == 1 ? j : j + static_cast<uint32_t>(splitmix64(seed_) % (w - j));
        std::swap(picked[j], picked[r]);
        used[picked[j]] = true;
        ids_[t * kTopK + j] = static_cast<int32_t>(base + picked[j]);
        weights_[t * kTopK + j] = 1.0f / static_cast<float>(kTopK + j);  // any finite weights
      }
    }
    return static_cast<uint32_t>(std::count(used, used + kWindow, true));
  }
  // The layer of the window taken last.
  size_t layer(size_t layer_count) const { return layer_ % layer_count; }
  const int32_t* ids() const { return ids_.data(); }
  const float* weights() const { return weights_.data(); }

 private:
  uint32_t m_;
  inline static uint32_t cursor_ = 0;
  inline static size_t layer_ = 0;
  uint64_t seed_ = 0x5EEDull;
  std::vector<int32_t> ids_;
  std::vector<float> weights_;
};

void moe_layer_benchmark(benchmark::State& state, const Case& c) {
  if (table_or_skip(state, c.isa) == nullptr) return;
  LayerPool& pool = LayerPool::get(*c.format);
  if (!pool.ok()) {
    state.SkipWithError(pool.error().c_str());
    return;
  }
  BenchContext context(c.isa, c.threads);
  if (!context.ok()) {
    state.SkipWithError(("qmoe_context_create failed: " + context.error()).c_str());
    return;
  }
  const char* kernel =
      gemm_kernel_name(context.get(), c.format->format, c.format->block_size, c.accuracy);

  std::vector<float> x(size_t{c.m} * kHidden), y(x.size());
  uint64_t seed = 0xAC71u + c.m;
  for (float& v : x) {
    v = static_cast<float>(static_cast<int64_t>(splitmix64(seed) >> 40) - (1 << 23)) /
        static_cast<float>(1 << 23);  // uniform in [-1, 1)
  }
  ColdRouter router(c.m);
  qmoe_moe_params params;
  qmoe_moe_params_init(&params);
  params.accuracy = c.accuracy;
  params.m = c.m;
  params.x = x.data();
  params.ldx = kHidden;
  params.y = y.data();
  params.ldy = kHidden;
  params.k = kTopK;
  params.ids = router.ids();
  params.weights = router.weights();
  auto call = [&]() {
    const qmoe_expert_set* set = pool.layer(router.layer(pool.layer_count()));
    return qmoe_moe_forward(context.get(), set, &params);
  };
  // Warm-up: code, the context's scratch, the pool's threads.
  for (int i = 0; i < 3; ++i) {
    router.next();
    if (call() != QMOE_STATUS_OK) {
      state.SkipWithError(
          (std::string("qmoe_moe_forward failed: ") + qmoe_last_error_message()).c_str());
      return;
    }
  }

  double bytes = 0.0, experts = 0.0;
  qmoe_status failed = QMOE_STATUS_OK;
  PairedRead paired;
  const double seconds = run_timed(
      state,
      [&] {
        // The paired read: the next window, on the call's threads.
        const uint32_t first = router.advance();
        paired.read(context.get(),
                    pool.slots(router.layer(pool.layer_count()), first, router.window()),
                    pool.slots_bytes(router.window()), c.threads > 1);
        const uint32_t distinct = router.next();
        experts += distinct;
        bytes += static_cast<double>(distinct) * static_cast<double>(pool.expert_bytes());
      },
      [&] {
        const qmoe_status s = call();
        if (s != QMOE_STATUS_OK) failed = s;
      });
  benchmark::DoNotOptimize(y.data());
  if (failed != QMOE_STATUS_OK) {
    state.SkipWithError(
        (std::string("qmoe_moe_forward failed: ") + qmoe_status_string(failed)).c_str());
    return;
  }
  if (paired.failed != QMOE_STATUS_OK) {
    state.SkipWithError(
        (std::string("the paired read failed: ") + qmoe_status_string(paired.failed)).c_str());
    return;
  }
  const double iterations = static_cast<double>(state.iterations());
  if (iterations == 0.0) return;
  state.SetLabel(std::string("E=128 top-8 H=2048 I=768 ") + c.format->name + ", " +
                 format_bytes(static_cast<double>(pool.expert_bytes())) + "/expert, " +
                 std::to_string(pool.layer_count()) + " layer(s) rotated, " + kernel);
  report_bandwidth(state, bytes / iterations, seconds, c.threads, /*versus_read_roof=*/true);
  state.counters["us_per_call"] = seconds / iterations * 1e6;
  state.counters["experts"] = experts / iterations;
  paired.report(state, bytes, seconds);
}

void register_moe_benchmarks() {
  const std::vector<size_t> thread_counts = one_and_all_threads();
  for (const GemmBenchFormat* format : {&kBenchInt4, &kBenchInt3, &kBenchMxfp4, &kBenchNvfp4}) {
    const bool int4 = format == &kBenchInt4;
    const std::string shape = int4 ? "qwen3" : std::string("qwen3_") + format->name;
    for (Isa isa : bench_tiers()) {
      for (qmoe_accuracy accuracy : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
        // The other formats: the fast level on the SIMD tiers (issue 21's bar).
        if (!int4 && (accuracy != QMOE_ACCURACY_FAST || isa == Isa::kScalar)) continue;
        for (uint32_t m : kTokenCounts) {
          for (size_t threads : thread_counts) {
            if (isa == Isa::kScalar && (m != 1 || threads != 1)) continue;
            const Case c{format, isa, accuracy, m, threads};
            const std::string name = "moe_layer/" + shape + "/" + isa_name(isa) + "/" +
                                     level_name(accuracy) + "/m:" + std::to_string(m) + "/cold/" +
                                     threads_name(threads);
            register_timed(name, [c](benchmark::State& state) { moe_layer_benchmark(state, c); });
          }
        }
      }
    }
  }
}

QMOE_BENCH_REGISTRAR(400, register_moe_benchmarks);

}  // namespace
}  // namespace qmoe::bench
