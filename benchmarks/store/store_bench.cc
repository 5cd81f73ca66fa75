// The expert store (include/qmoe/qmoe_store.h): what loading a model from a store file costs.
//
//   store/crc32c/<version>                  CRC-32C over 64 MiB on one thread: the SSE4.2
//                                           crc32 instruction ("sse42", where the host has it)
//                                           and the slicing-by-8 tables ("tables"); reports
//                                           frac_of_read_bw against the one-thread read roof
//   store/read/qwen3/experts:<n>/verify:<v> qmoe_expert_store_read of every expert of one
//                                           Qwen3-30B-A3B-shaped layer of n experts, from a
//                                           file the page cache holds (written once before),
//                                           into weight memory, with and without the CRC check
//
// The read rows measure the library's side of a load (the copy out of the page cache, the
// record checks, the CRC), not the storage device: the file was just written, so the OS has it
// cached. Their frac_of_read_bw is against the one-thread read roof; a copy also writes every
// byte, so 0.5 is about what a memcpy-bound load reaches.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/bench_util.h"
#include "lib/store/crc32c.h"
#include "qmoe/qmoe_store.h"

namespace qmoe::bench {
namespace {

void crc32c_benchmark(benchmark::State& state, bool hardware) {
  constexpr size_t kBytes = 64 * kMiB;
  std::vector<unsigned char> data(kBytes);
  uint64_t seed = 11;
  fill_random_bytes(data.data(), data.size(), seed);
  uint32_t sink = 0;
  const double seconds = run_timed(state, [&] {
    sink ^= hardware ? crc32c(data.data(), data.size()) : crc32c_portable(data.data(), data.size());
  });
  benchmark::DoNotOptimize(sink);
  report_bandwidth(state, static_cast<double>(kBytes), seconds, 1, /*versus_read_roof=*/true);
}

// One Qwen3-30B-A3B-shaped layer of `experts` experts (INT4, block 32, FP16 scales in the
// grouped order, every expert the same bytes: the writer copies them per record) written to a
// store file under TMPDIR once per process and shape, and removed at exit.
class StoreFixture {
 public:
  static StoreFixture& get(uint32_t experts) {
    static std::vector<std::unique_ptr<StoreFixture>> fixtures;
    for (auto& f : fixtures) {
      if (f->experts_ == experts) return *f;
    }
    fixtures.push_back(std::unique_ptr<StoreFixture>(new StoreFixture(experts)));
    return *fixtures.back();
  }
  ~StoreFixture() {
    qmoe_expert_store_close(store_);
    if (!path_.empty()) std::remove(path_.c_str());
  }
  const qmoe_expert_store* store() const { return store_; }
  const char* error() const { return error_.empty() ? nullptr : error_.c_str(); }
  size_t expert_bytes() const { return expert_bytes_; }

 private:
  explicit StoreFixture(uint32_t experts) : experts_(experts) {
    constexpr uint32_t kHidden = 2048, kInter = 768, kBlock = 32;
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir != nullptr && *dir ? dir : "/tmp") + "/qmoe_store_bench_" +
            std::to_string(::getpid()) + "_" + std::to_string(experts) + ".qmoe";
    std::vector<std::vector<unsigned char>> codes(2);
    std::vector<std::vector<uint16_t>> scales(2);
    qmoe_quant_matrix w[2];
    const uint32_t n[2] = {2 * kInter, kHidden}, k[2] = {kHidden, kInter};
    uint64_t seed = 5;
    for (int p = 0; p < 2; ++p) {
      size_t code_bytes = 0;
      qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT4, n[p], k[p], &code_bytes);
      codes[p].resize(code_bytes);
      fill_random_bytes(codes[p].data(), code_bytes, seed);
      const uint32_t blocks = k[p] / kBlock;
      scales[p].resize(qmoe_grouped_plane_elements(n[p], blocks));
      fill_weight_scales_f16(scales[p].data(), scales[p].size(), seed);
      w[p] = qmoe_quant_matrix{};
      w[p].struct_size = sizeof w[p];
      w[p].format = QMOE_WEIGHT_FORMAT_INT4;
      w[p].n = n[p];
      w[p].k = k[p];
      w[p].block_size = kBlock;
      w[p].codes = codes[p].data();
      w[p].scale_dtype = QMOE_DTYPE_F16;
      w[p].scales = scales[p].data();
      w[p].scale_row_stride = 1;
      w[p].scale_block_stride = 8;
      w[p].scale_group_stride = 8 * blocks;
      w[p].bias_dtype = QMOE_DTYPE_F32;
    }
    std::vector<const qmoe_quant_matrix*> fc1(experts, &w[0]), fc2(experts, &w[1]);
    qmoe_expert_set_desc d;
    qmoe_expert_set_desc_init(&d);
    d.num_experts = experts;
    d.hidden = kHidden;
    d.intermediate = kInter;
    d.fc1 = fc1.data();
    d.fc2 = fc2.data();
    qmoe_expert_set* set = nullptr;
    qmoe_status s = qmoe_expert_set_create(&d, &set);
    if (s == QMOE_STATUS_OK) {
      const qmoe_expert_set* layers[1] = {set};
      s = qmoe_expert_store_write(path_.c_str(), layers, 1);
      qmoe_expert_set_destroy(set);
    }
    if (s == QMOE_STATUS_OK) s = qmoe_expert_store_open(path_.c_str(), &store_);
    if (s == QMOE_STATUS_OK) {
      qmoe_expert_store_info info{};
      info.struct_size = sizeof info;
      s = qmoe_expert_store_get_info(store_, &info);
      expert_bytes_ = info.expert_bytes;
    }
    if (s != QMOE_STATUS_OK) error_ = qmoe_last_error_message();
  }

  uint32_t experts_;
  std::string path_, error_;
  qmoe_expert_store* store_ = nullptr;
  size_t expert_bytes_ = 0;
};

struct FreeWeights {
  void operator()(void* p) const { qmoe_free_weight_memory(p); }
};

void store_read_benchmark(benchmark::State& state, uint32_t experts, bool verify) {
  StoreFixture& fixture = StoreFixture::get(experts);
  if (fixture.error() != nullptr) {
    state.SkipWithError(fixture.error());
    return;
  }
  const size_t bytes = fixture.expert_bytes() * experts;
  void* raw = nullptr;
  if (qmoe_alloc_weight_memory(bytes, &raw) != QMOE_STATUS_OK) {
    state.SkipWithError("qmoe_alloc_weight_memory failed");
    return;
  }
  std::unique_ptr<void, FreeWeights> memory(raw);
  std::vector<uint32_t> ids(experts);
  for (uint32_t e = 0; e < experts; ++e) ids[e] = e;
  qmoe_status failed = QMOE_STATUS_OK;
  auto read = [&] {
    const qmoe_status s = qmoe_expert_store_read(fixture.store(), 0, ids.data(), experts,
                                                 verify ? 1 : 0, memory.get(), bytes);
    if (s != QMOE_STATUS_OK) failed = s;
  };
  read();  // warm-up: the destination's pages, the page cache
  const double seconds = run_timed(state, read);
  if (failed != QMOE_STATUS_OK) {
    state.SkipWithError(qmoe_last_error_message());
    return;
  }
  state.SetLabel(format_bytes(static_cast<double>(bytes)) + " a layer");
  report_bandwidth(state, static_cast<double>(bytes), seconds, 1, /*versus_read_roof=*/true);
}

void register_store_benchmarks() {
  register_timed("store/crc32c/sse42", [](benchmark::State& s) { crc32c_benchmark(s, true); });
  register_timed("store/crc32c/tables", [](benchmark::State& s) { crc32c_benchmark(s, false); });
  for (uint32_t experts : {32u, 128u}) {
    for (bool verify : {false, true}) {
      register_timed(
          "store/read/qwen3/experts:" + std::to_string(experts) + "/verify:" + (verify ? "1" : "0"),
          [=](benchmark::State& s) { store_read_benchmark(s, experts, verify); });
    }
  }
}

QMOE_BENCH_REGISTRAR(500, register_store_benchmarks);

}  // namespace
}  // namespace qmoe::bench
