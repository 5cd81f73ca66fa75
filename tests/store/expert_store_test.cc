// The expert store (include/qmoe/qmoe_store.h): CRC-32C against known values and its two
// versions against each other, the record layout of Qwen3-30B-A3B's expert worked by hand, the
// header's bytes against docs/formats.md's example, every format and plane option written, read
// back and run (bitwise the outputs of the sets written), records placed anywhere, and every
// corruption, truncation and bad argument refused with the status the header promises.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "lib/store/crc32c.h"
#include "lib/store/store_layout.h"
#include "qmoe/qmoe_store.h"
#include "tests/gemm/int3_reference.h"
#include "tests/moe/moe_call.h"
#include "tests/moe/moe_fp4_reference.h"
#include "tests/moe/moe_reference.h"

namespace qmoe::testing {
namespace {

struct StoreCloser {
  void operator()(qmoe_expert_store* s) const { qmoe_expert_store_close(s); }
};
using StorePtr = std::unique_ptr<qmoe_expert_store, StoreCloser>;
using SetPtr = std::unique_ptr<qmoe_expert_set, SetDeleter>;

struct FreeWeights {
  void operator()(void* p) const { qmoe_free_weight_memory(p); }
};
using WeightMemory = std::unique_ptr<void, FreeWeights>;

WeightMemory weight_memory(size_t bytes) {
  void* p = nullptr;
  EXPECT_EQ(qmoe_alloc_weight_memory(bytes, &p), QMOE_STATUS_OK) << qmoe_last_error_message();
  return WeightMemory(p);
}

// A file name of the test's own under the test temp directory, removed at scope exit.
class TempPath {
 public:
  TempPath() {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = ::testing::TempDir() + "qmoe_store_" + info->test_suite_name() + "_" + info->name() +
            "_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++) + ".qmoe";
  }
  ~TempPath() {
    std::remove(path_.c_str());
    std::remove((path_ + ".partial").c_str());
  }
  const char* c_str() const { return path_.c_str(); }
  const std::string& str() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

uint32_t le32(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
void put_le32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_le64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
// After editing header bytes [16, 128): the header CRC made right again, so the edit itself is
// what the reader sees.
void reseal_header(std::vector<unsigned char>* file) {
  put_le32(file->data() + 12, crc32c(file->data() + 16, 112));
}

SetPtr create_set(const qmoe_expert_set_desc& desc) {
  qmoe_expert_set* set = nullptr;
  EXPECT_EQ(qmoe_expert_set_create(&desc, &set), QMOE_STATUS_OK) << qmoe_last_error_message();
  return SetPtr(set);
}

StorePtr open_store(const TempPath& path) {
  qmoe_expert_store* store = nullptr;
  EXPECT_EQ(qmoe_expert_store_open(path.c_str(), &store), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  return StorePtr(store);
}

qmoe_expert_store_info store_info(const qmoe_expert_store* store) {
  qmoe_expert_store_info info{};
  info.struct_size = sizeof info;
  EXPECT_EQ(qmoe_expert_store_get_info(store, &info), QMOE_STATUS_OK) << qmoe_last_error_message();
  return info;
}

struct ContextCloser {
  void operator()(qmoe_context* c) const { qmoe_context_destroy(c); }
};
std::unique_ptr<qmoe_context, ContextCloser> default_context() {
  qmoe_context_options o;
  qmoe_context_options_init(&o);
  o.num_threads = 2;
  qmoe_context* ctx = nullptr;
  EXPECT_EQ(qmoe_context_create(&o, &ctx), QMOE_STATUS_OK) << qmoe_last_error_message();
  return std::unique_ptr<qmoe_context, ContextCloser>(ctx);
}

// The layer's output for tokens routed over every expert, both accuracy levels, as bits.
std::vector<float> layer_outputs(qmoe_context* ctx, const qmoe_expert_set* set, uint32_t experts,
                                 uint32_t hidden, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const uint32_t m = 5, k = std::min(experts, 3u);
  std::vector<float> x(size_t{m} * hidden);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : x) v = u(rng);
  std::vector<int32_t> ids;
  std::vector<float> weights;
  random_routing(m, experts, k, rng, &ids, &weights);
  std::vector<float> out;
  for (qmoe_accuracy level : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
    std::vector<float> y(size_t{m} * hidden, NAN);
    EXPECT_EQ(moe_forward(ctx, set, level, m, x.data(), hidden, ids.data(), weights.data(), k,
                          y.data(), hidden, nullptr),
              QMOE_STATUS_OK)
        << qmoe_last_error_message();
    out.insert(out.end(), y.begin(), y.end());
  }
  return out;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  size_t finite = 0;
  for (float v : a) finite += std::isfinite(v) ? 1 : 0;
  EXPECT_EQ(finite, a.size());
}

// ---------------------------------------------------------------------------------------------
// CRC-32C

TEST(StoreCrc32c, KnownValues) {
  const char* digits = "123456789";
  EXPECT_EQ(crc32c(digits, 9), 0xE3069283u);
  EXPECT_EQ(crc32c_portable(digits, 9), 0xE3069283u);
  // RFC 3720 (iSCSI) B.4's vectors: 32 bytes of zeros, of ones, ascending and descending.
  unsigned char zeros[32] = {}, ones[32], up[32], down[32];
  for (int i = 0; i < 32; ++i) {
    ones[i] = 0xFF;
    up[i] = static_cast<unsigned char>(i);
    down[i] = static_cast<unsigned char>(31 - i);
  }
  for (auto* f : {&crc32c, &crc32c_portable}) {
    EXPECT_EQ(f(zeros, 32, 0), 0x8A9136AAu);
    EXPECT_EQ(f(ones, 32, 0), 0x62A8AB43u);
    EXPECT_EQ(f(up, 32, 0), 0x46DD794Eu);
    EXPECT_EQ(f(down, 32, 0), 0x113FDB5Cu);
    EXPECT_EQ(f(zeros, 0, 0), 0u);
  }
}

TEST(StoreCrc32c, VersionsAgreeAndContinue) {
  std::mt19937_64 rng(7);
  // Lengths on both sides of the SSE4.2 version's three-stream blocks (3 x 8192 bytes).
  std::vector<unsigned char> bytes(120000);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  for (int trial = 0; trial < 200; ++trial) {
    const size_t begin = rng() % 64;
    const size_t n = trial % 4 == 0   ? 24576 * (1 + trial % 3) + rng() % 16 - 8
                     : trial % 2 == 0 ? rng() % 110000
                                      : rng() % 5000;
    const unsigned char* p = bytes.data() + begin;
    const uint32_t whole = crc32c_portable(p, n);
    EXPECT_EQ(crc32c(p, n), whole) << begin << " " << n;
    const size_t cut = n == 0 ? 0 : rng() % n;
    EXPECT_EQ(crc32c(p + cut, n - cut, crc32c(p, cut)), whole);
    EXPECT_EQ(crc32c_portable(p + cut, n - cut, crc32c_portable(p, cut)), whole);
  }
}

// ---------------------------------------------------------------------------------------------
// Layout

// Qwen3-30B-A3B's expert (H 2048, I 768, INT4, block 32, FP16 scales), by hand: FC1 codes
// 1536 * 2048 / 2 = 1572864 bytes at 64; its scales 1536 * 64 * 2 = 196608 at 1572928; FC2
// codes 2048 * 768 / 2 = 786432 at 1769536; its scales 2048 * 24 * 2 = 98304 at 2555968; the end
// 2654272 rounds up to 2658304 = 649 * 4096.
TEST(StoreLayout, Qwen3ExpertByHand) {
  StoreShape s;
  s.layers = 48;
  s.experts = 128;
  s.hidden = 2048;
  s.intermediate = 768;
  s.fusion = QMOE_SWIGLU_INTERLEAVED;
  s.alpha = 1.0f;
  s.limit = INFINITY;
  s.fc1 = {QMOE_WEIGHT_FORMAT_INT4, 32, QMOE_DTYPE_F16, 0, 0};
  s.fc2 = s.fc1;
  RecordLayout layout;
  ASSERT_EQ(check_store_shape(s, QMOE_STATUS_INVALID_ARGUMENT, "test", &layout), QMOE_STATUS_OK);
  EXPECT_EQ(layout.fc1.codes, 64u);
  EXPECT_EQ(layout.fc1.codes_bytes, 1572864u);
  EXPECT_EQ(layout.fc1.scales, 1572928u);
  EXPECT_EQ(layout.fc1.scales_bytes, 196608u);
  EXPECT_EQ(layout.fc2.codes, 1769536u);
  EXPECT_EQ(layout.fc2.scales, 2555968u);
  EXPECT_EQ(layout.fc2.scales_bytes, 98304u);
  EXPECT_EQ(layout.fc2.bias + layout.fc2.bias_bytes, 2654272u);
  EXPECT_EQ(layout.bytes, 2658304u);
}

// The example header of docs/formats.md ("Expert store files"): 2 layers of 4 experts, H 64,
// I 32, INT4 block 32 with FP16 scales, FC2 with zero points and an FP32 bias, Qwen3's SwiGLU.
TEST(StoreLayout, HeaderBytesOfTheDocsExample) {
  StoreHeader h;
  StoreShape& s = h.shape;
  s.layers = 2;
  s.experts = 4;
  s.hidden = 64;
  s.intermediate = 32;
  s.fusion = QMOE_SWIGLU_INTERLEAVED;
  s.alpha = 1.0f;
  s.beta = 0.0f;
  s.limit = INFINITY;
  s.fc1 = {QMOE_WEIGHT_FORMAT_INT4, 32, QMOE_DTYPE_F16, 0, 0};
  s.fc2 = {QMOE_WEIGHT_FORMAT_INT4, 32, QMOE_DTYPE_F16, kStoreZeroPoints | kStoreBias,
           QMOE_DTYPE_F32};
  RecordLayout layout;
  ASSERT_EQ(check_store_shape(s, QMOE_STATUS_INVALID_ARGUMENT, "test", &layout), QMOE_STATUS_OK);
  // FC1: codes 64 * 64 / 2 = 2048 at 64, scales 64 * 2 * 2 = 256 at 2112; FC2: codes 64 * 32 / 2
  // = 1024 at 2368, scales 64 * 1 * 2 = 128 at 3392, zero points 64 at 3520, bias 256 at 3584;
  // the end 3840 rounds up to 4096.
  EXPECT_EQ(layout.fc2.codes, 2368u);
  EXPECT_EQ(layout.fc2.zero_points, 3520u);
  EXPECT_EQ(layout.fc2.bias, 3584u);
  ASSERT_EQ(layout.bytes, 4096u);
  h.expert_bytes = layout.bytes;
  h.data_offset = kStoreDataOffset;
  h.file_bytes = 4096 + 2 * 4 * 4096;
  unsigned char bytes[kStoreHeaderBytes];
  encode_store_header(h, bytes);
  const unsigned char expected[kStoreHeaderBytes - 16] = {
      // layers, experts, hidden, intermediate
      0x02, 0, 0, 0, 0x04, 0, 0, 0, 0x40, 0, 0, 0, 0x20, 0, 0, 0,
      // fusion 1, alpha 1.0f, beta 0.0f, limit +inf
      0x01, 0, 0, 0, 0x00, 0x00, 0x80, 0x3F, 0, 0, 0, 0, 0x00, 0x00, 0x80, 0x7F,
      // FC1: INT4, block 32, F16 scales, no flags, no bias, reserved
      0x01, 0, 0, 0, 0x20, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
      // FC2: INT4, block 32, F16 scales, zero points and bias, F32 bias, reserved
      0x01, 0, 0, 0, 0x20, 0, 0, 0, 0x02, 0, 0, 0, 0x03, 0, 0, 0, 0x01, 0, 0, 0, 0, 0, 0, 0,
      // expert_bytes 4096, data_offset 4096, file_bytes 36864, reserved
      0x00, 0x10, 0, 0, 0, 0, 0, 0, 0x00, 0x10, 0, 0, 0, 0, 0, 0, 0x00, 0x90, 0, 0, 0, 0, 0, 0, 0,
      0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(std::memcmp(bytes, "QMOESTOR\x01\x00\x00\x00", 12), 0);
  EXPECT_EQ(std::memcmp(bytes + 16, expected, sizeof expected), 0);
  EXPECT_EQ(le32(bytes + 12), crc32c(expected, sizeof expected));
  EXPECT_EQ(le32(bytes + 12), 0x36F32EDCu);  // the value docs/formats.md prints
}

// ---------------------------------------------------------------------------------------------
// Round trips: every format and plane option, written from sets, read, run.

struct Layers {
  std::vector<std::unique_ptr<MoeModel>> models;  // INT4 / INT3 layers
  std::vector<std::unique_ptr<Fp4Experts>> fp4;   // or FP4 layers
  std::vector<SetPtr> sets;
  std::vector<const qmoe_expert_set*> handles;
  uint32_t experts = 0, hidden = 0;
};

Layers int_layers(const MoeOptions& options, uint32_t layers, Int4MatrixMaker maker,
                  uint64_t seed) {
  Layers out;
  std::mt19937_64 rng(seed);
  for (uint32_t l = 0; l < layers; ++l) {
    out.models.push_back(make_moe_model(options, rng, maker));
    out.sets.push_back(create_set(out.models.back()->desc));
    out.handles.push_back(out.sets.back().get());
  }
  out.experts = options.experts;
  out.hidden = options.hidden;
  return out;
}

Layers fp4_layers(qmoe_weight_format format, uint32_t layers, uint64_t seed) {
  Layers out;
  std::mt19937_64 rng(seed);
  for (uint32_t l = 0; l < layers; ++l) {
    out.fp4.push_back(make_fp4_experts(format, 5, 64, 32, rng));
    out.handles.push_back(out.fp4.back()->set.get());
  }
  out.experts = 5;
  out.hidden = 64;
  return out;
}

// Writes `layers`, opens the store, reads each layer whole into weight memory, creates its set
// and checks the outputs are the bits of the set written.
void round_trip(const Layers& layers) {
  TempPath path;
  const uint32_t L = static_cast<uint32_t>(layers.handles.size());
  ASSERT_EQ(qmoe_expert_store_write(path.c_str(), layers.handles.data(), L), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  struct stat st;
  EXPECT_NE(::stat((path.str() + ".partial").c_str(), &st), 0) << "the partial file is left";
  StorePtr store = open_store(path);
  ASSERT_NE(store, nullptr);
  const qmoe_expert_store_info info = store_info(store.get());
  EXPECT_EQ(info.num_layers, L);
  EXPECT_EQ(info.num_experts, layers.experts);
  EXPECT_EQ(info.hidden, layers.hidden);
  EXPECT_EQ(info.expert_bytes % 4096, 0u);
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(info.file_bytes, static_cast<uint64_t>(st.st_size));
  EXPECT_EQ(info.file_bytes, 4096 + uint64_t{L} * info.num_experts * info.expert_bytes);
  auto ctx = default_context();
  std::vector<uint32_t> all(info.num_experts);
  for (uint32_t e = 0; e < info.num_experts; ++e) all[e] = e;
  for (uint32_t l = 0; l < L; ++l) {
    const size_t bytes = info.expert_bytes * info.num_experts;
    WeightMemory memory = weight_memory(bytes);
    ASSERT_EQ(qmoe_expert_store_read(store.get(), l, all.data(), info.num_experts, 1, memory.get(),
                                     bytes),
              QMOE_STATUS_OK)
        << qmoe_last_error_message();
    std::vector<const void*> records(info.num_experts);
    for (uint32_t e = 0; e < info.num_experts; ++e) {
      records[e] = static_cast<unsigned char*>(memory.get()) + size_t{e} * info.expert_bytes;
    }
    qmoe_expert_set* raw = nullptr;
    ASSERT_EQ(qmoe_expert_store_create_set(store.get(), l, records.data(), &raw), QMOE_STATUS_OK)
        << qmoe_last_error_message();
    SetPtr set(raw);
    expect_same_bits(layer_outputs(ctx.get(), set.get(), layers.experts, layers.hidden, l),
                     layer_outputs(ctx.get(), layers.handles[l], layers.experts, layers.hidden, l));
  }
}

TEST(ExpertStore, RoundTripInt4ZeroPointsBiasEveryScaleOrder) {
  // small_layer_a: FC1 block 16, BF16 grouped scales, zero points, a bias; FC2 FP16 row-major
  // scales and block-major zero points. small_layer_b: FC1 block 32 FP16 row-major, FC2 block
  // 64 FP32 block-major scales and an FP16 bias.
  round_trip(int_layers(small_layer_a(), 2, make_int4_matrix, 1));
  round_trip(int_layers(small_layer_b(), 3, make_int4_matrix, 2));
}

TEST(ExpertStore, RoundTripGptOssSwigluAndConcatenatedFusion) {
  round_trip(int_layers(graph_replay_layer(), 2, make_int4_matrix, 3));
  MoeOptions o = small_layer_b();
  o.fusion = QMOE_SWIGLU_CONCATENATED;
  use_gpt_oss_swiglu(&o);
  round_trip(int_layers(o, 1, make_int4_matrix, 4));
}

TEST(ExpertStore, RoundTripInt3) {
  round_trip(int_layers(small_layer_a(), 2, make_int3_matrix, 5));
}

TEST(ExpertStore, RoundTripMxfp4AndNvfp4) {
  round_trip(fp4_layers(QMOE_WEIGHT_FORMAT_MXFP4, 2, 6));
  round_trip(fp4_layers(QMOE_WEIGHT_FORMAT_NVFP4, 2, 7));  // global scales 1/4 per matrix
}

// A runtime's pool: some experts read into slots in any order, records placed anywhere; the
// set made from them runs the experts it was given, and a slot mix-up is refused.
TEST(ExpertStore, RecordsInSlotsAndMixUpsRefused) {
  const Layers layers = int_layers(small_layer_b(), 2, make_int4_matrix, 8);
  TempPath path;
  ASSERT_EQ(qmoe_expert_store_write(path.c_str(), layers.handles.data(), 2), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  StorePtr store = open_store(path);
  const qmoe_expert_store_info info = store_info(store.get());
  const uint32_t E = info.num_experts;
  // Layer 1's experts in reverse order, one read per pair, into a pool with a gap.
  WeightMemory pool = weight_memory(info.expert_bytes * (E + 1));
  unsigned char* base = static_cast<unsigned char*>(pool.get());
  std::vector<const void*> records(E);
  for (uint32_t i = 0; i < E; i += 2) {
    std::vector<uint32_t> ids;
    for (uint32_t j = i; j < std::min(i + 2, E); ++j) ids.push_back(E - 1 - j);
    unsigned char* slot = base + size_t{i + 1} * info.expert_bytes;
    ASSERT_EQ(qmoe_expert_store_read(store.get(), 1, ids.data(), static_cast<uint32_t>(ids.size()),
                                     0, slot, info.expert_bytes * ids.size()),
              QMOE_STATUS_OK)
        << qmoe_last_error_message();
    for (size_t j = 0; j < ids.size(); ++j) records[ids[j]] = slot + j * info.expert_bytes;
  }
  qmoe_expert_set* raw = nullptr;
  ASSERT_EQ(qmoe_expert_store_create_set(store.get(), 1, records.data(), &raw), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  SetPtr set(raw);
  auto ctx = default_context();
  expect_same_bits(layer_outputs(ctx.get(), set.get(), E, layers.hidden, 9),
                   layer_outputs(ctx.get(), layers.handles[1], E, layers.hidden, 9));

  // Two records swapped; a record of the other layer; a record that is not one.
  std::swap(records[0], records[1]);
  EXPECT_EQ(qmoe_expert_store_create_set(store.get(), 1, records.data(), &raw),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(raw, nullptr);
  EXPECT_NE(std::strstr(qmoe_last_error_message(), "records[0] holds expert 1 of layer 1"), nullptr)
      << qmoe_last_error_message();
  std::swap(records[0], records[1]);
  EXPECT_EQ(qmoe_expert_store_create_set(store.get(), 0, records.data(), &raw),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(qmoe_last_error_message(), "of layer 1, not expert 0 of layer 0"), nullptr)
      << qmoe_last_error_message();
  const void* saved = records[2];
  records[2] = base;  // the gap: never written
  std::memset(base, 0, 64);
  EXPECT_EQ(qmoe_expert_store_create_set(store.get(), 1, records.data(), &raw),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(qmoe_last_error_message(), "magic"), nullptr) << qmoe_last_error_message();
  records[2] = static_cast<const unsigned char*>(saved) + 8;
  EXPECT_EQ(qmoe_expert_store_create_set(store.get(), 1, records.data(), &raw),
            QMOE_STATUS_INVALID_ARGUMENT);
  records[2] = nullptr;
  EXPECT_EQ(qmoe_expert_store_create_set(store.get(), 1, records.data(), &raw),
            QMOE_STATUS_INVALID_ARGUMENT);
  records[2] = saved;
  EXPECT_EQ(qmoe_expert_store_create_set(store.get(), 2, records.data(), &raw),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_create_set(store.get(), 1, nullptr, &raw),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_create_set(store.get(), 1, records.data(), nullptr),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_create_set(nullptr, 1, records.data(), &raw),
            QMOE_STATUS_INVALID_ARGUMENT);
}

// ---------------------------------------------------------------------------------------------
// Damaged files

class DamagedStore : public ::testing::Test {
 protected:
  void SetUp() override {
    layers_ = int_layers(small_layer_b(), 2, make_int4_matrix, 10);
    ASSERT_EQ(qmoe_expert_store_write(good_.c_str(), layers_.handles.data(), 2), QMOE_STATUS_OK)
        << qmoe_last_error_message();
    bytes_ = read_file(good_.str());
    ASSERT_GT(bytes_.size(), 4096u);
    expert_bytes_ = le32(bytes_.data() + 96);
  }
  // The status of opening `bytes` written to a file, and (when it opens) of reading every
  // expert of every layer with verify.
  qmoe_status open_status(const std::vector<unsigned char>& bytes) {
    write_file(bad_.str(), bytes);
    qmoe_expert_store* store = nullptr;
    const qmoe_status s = qmoe_expert_store_open(bad_.c_str(), &store);
    if (s != QMOE_STATUS_OK) {
      EXPECT_EQ(store, nullptr);
      return s;
    }
    qmoe_expert_store_close(store);
    return s;
  }
  qmoe_status read_status(const std::vector<unsigned char>& bytes, int verify) {
    write_file(bad_.str(), bytes);
    qmoe_expert_store* raw = nullptr;
    EXPECT_EQ(qmoe_expert_store_open(bad_.c_str(), &raw), QMOE_STATUS_OK)
        << qmoe_last_error_message();
    StorePtr store(raw);
    const qmoe_expert_store_info info = store_info(store.get());
    WeightMemory memory = weight_memory(info.expert_bytes * info.num_experts);
    std::vector<uint32_t> all(info.num_experts);
    for (uint32_t e = 0; e < info.num_experts; ++e) all[e] = e;
    for (uint32_t l = 0; l < info.num_layers; ++l) {
      const qmoe_status s =
          qmoe_expert_store_read(store.get(), l, all.data(), info.num_experts, verify, memory.get(),
                                 info.expert_bytes * info.num_experts);
      if (s != QMOE_STATUS_OK) return s;
    }
    return QMOE_STATUS_OK;
  }
  std::string message() const { return qmoe_last_error_message(); }

  Layers layers_;
  TempPath good_, bad_;
  std::vector<unsigned char> bytes_;
  size_t expert_bytes_ = 0;
};

TEST_F(DamagedStore, TheGoodFileOpensAndReads) {
  EXPECT_EQ(open_status(bytes_), QMOE_STATUS_OK) << message();
  EXPECT_EQ(read_status(bytes_, 1), QMOE_STATUS_OK) << message();
}

TEST_F(DamagedStore, HeaderDamage) {
  auto b = bytes_;
  b[0] = 'X';
  EXPECT_EQ(open_status(b), QMOE_STATUS_CORRUPT_DATA);
  EXPECT_NE(message().find("magic"), std::string::npos) << message();
  // Every header byte from 12 to 127 flipped: the CRC (or, for the CRC's own bytes, the
  // mismatch) refuses it.
  for (size_t i = 12; i < 128; ++i) {
    b = bytes_;
    b[i] ^= 0x10;
    EXPECT_EQ(open_status(b), QMOE_STATUS_CORRUPT_DATA) << "byte " << i;
  }
  b = bytes_;
  put_le32(b.data() + 8, 2);
  EXPECT_EQ(open_status(b), QMOE_STATUS_UNSUPPORTED_FORMAT);
  EXPECT_NE(message().find("version 2"), std::string::npos) << message();
  put_le32(b.data() + 8, 0);
  EXPECT_EQ(open_status(b), QMOE_STATUS_CORRUPT_DATA);
}

// Header fields changed with the CRC resealed: each is caught by its own check.
TEST_F(DamagedStore, ResealedHeaderFields) {
  struct Edit {
    size_t offset;
    uint32_t value;
    qmoe_status status;
    const char* says;
  };
  const Edit edits[] = {
      {16, 0, QMOE_STATUS_CORRUPT_DATA, "layers = 0"},
      {16, 3, QMOE_STATUS_CORRUPT_DATA, "file_bytes"},  // more layers than the file has
      {20, 0xFFFFFFFFu, QMOE_STATUS_CORRUPT_DATA, "file_bytes"},
      {24, 0, QMOE_STATUS_CORRUPT_DATA, "hidden = 0"},
      {28, 0x40000001u, QMOE_STATUS_CORRUPT_DATA, "intermediate"},
      {32, 3, QMOE_STATUS_CORRUPT_DATA, "fusion"},
      {36, 0x7FC00000u, QMOE_STATUS_CORRUPT_DATA, "alpha"},  // NaN
      {44, 0u, QMOE_STATUS_CORRUPT_DATA, "limit"},
      {48, 9, QMOE_STATUS_UNSUPPORTED_FORMAT, "fc1 format 9"},
      {52, 48, QMOE_STATUS_CORRUPT_DATA, "block size"},
      {56, QMOE_DTYPE_E8M0, QMOE_STATUS_CORRUPT_DATA, "scale dtype"},
      {60, 4, QMOE_STATUS_CORRUPT_DATA, "unknown bits"},
      {60, kStoreBias, QMOE_STATUS_CORRUPT_DATA, "bias dtype 0"},
      {64, QMOE_DTYPE_F16, QMOE_STATUS_CORRUPT_DATA, "bias dtype 2 does not fit its flags 0x0"},
      {88, 7, QMOE_STATUS_CORRUPT_DATA, "bias dtype 7"},
      {92, 1, QMOE_STATUS_CORRUPT_DATA, "reserved"},
      {96, 8192, QMOE_STATUS_CORRUPT_DATA, "expert_bytes"},
      {104, 8192, QMOE_STATUS_CORRUPT_DATA, "data_offset"},
      {124, 1, QMOE_STATUS_CORRUPT_DATA, "reserved"},
  };
  for (const Edit& e : edits) {
    auto b = bytes_;
    put_le32(b.data() + e.offset, e.value);
    reseal_header(&b);
    EXPECT_EQ(open_status(b), e.status) << "offset " << e.offset << ": " << message();
    EXPECT_NE(message().find(e.says), std::string::npos)
        << "offset " << e.offset << ": " << message();
  }
  // file_bytes near 2^64 with layers * experts * expert_bytes overflowing: refused before any
  // allocation, on arithmetic.
  auto b = bytes_;
  put_le32(b.data() + 16, 0xFFFFFFFFu);
  put_le32(b.data() + 20, 0xFFFFFFFFu);
  put_le64(b.data() + 112, ~uint64_t{0});
  reseal_header(&b);
  EXPECT_EQ(open_status(b), QMOE_STATUS_CORRUPT_DATA);
}

TEST_F(DamagedStore, TruncatedOrExtended) {
  for (size_t size : {size_t{0}, size_t{10}, size_t{127}, size_t{128}, size_t{4096},
                      bytes_.size() - expert_bytes_, bytes_.size() - 1}) {
    std::vector<unsigned char> b(bytes_.begin(), bytes_.begin() + static_cast<long>(size));
    EXPECT_EQ(open_status(b), QMOE_STATUS_CORRUPT_DATA) << size;
  }
  auto b = bytes_;
  b.push_back(0);
  EXPECT_EQ(open_status(b), QMOE_STATUS_CORRUPT_DATA);
  EXPECT_NE(message().find("truncated or appended to"), std::string::npos) << message();
}

TEST_F(DamagedStore, RecordDamage) {
  const size_t E = layers_.experts;
  // A plane byte of layer 1's last expert: found with verify, not without.
  auto b = bytes_;
  const size_t last = 4096 + (2 * E - 1) * expert_bytes_;
  b[last + 100] ^= 1;
  EXPECT_EQ(read_status(b, 1), QMOE_STATUS_CORRUPT_DATA);
  EXPECT_NE(message().find("layer 1 expert " + std::to_string(E - 1) + "'s CRC-32C"),
            std::string::npos)
      << message();
  EXPECT_EQ(read_status(b, 0), QMOE_STATUS_OK) << message();
  // The padding after the last plane and the global scales are covered too.
  b = bytes_;
  b[4096 + expert_bytes_ - 1] ^= 0x80;
  EXPECT_EQ(read_status(b, 1), QMOE_STATUS_CORRUPT_DATA);
  b = bytes_;
  b[4096 + 16] ^= 1;
  EXPECT_EQ(read_status(b, 1), QMOE_STATUS_CORRUPT_DATA);
  // Two records swapped: each header names another expert, with or without verify.
  b = bytes_;
  std::swap_ranges(b.begin() + 4096, b.begin() + 4096 + static_cast<long>(expert_bytes_),
                   b.begin() + 4096 + static_cast<long>(expert_bytes_));
  EXPECT_EQ(read_status(b, 0), QMOE_STATUS_CORRUPT_DATA);
  EXPECT_NE(message().find("holds expert 1 of layer 0"), std::string::npos) << message();
  // A record's magic.
  b = bytes_;
  b[4096 + expert_bytes_ * 3] = 'X';
  EXPECT_EQ(read_status(b, 0), QMOE_STATUS_CORRUPT_DATA);
}

// The file shrinking after open is an I/O error at the read, not a crash or a short record.
TEST_F(DamagedStore, ShrunkAfterOpen) {
  write_file(bad_.str(), bytes_);
  qmoe_expert_store* raw = nullptr;
  ASSERT_EQ(qmoe_expert_store_open(bad_.c_str(), &raw), QMOE_STATUS_OK);
  StorePtr store(raw);
  ASSERT_EQ(::truncate(bad_.c_str(), static_cast<off_t>(bytes_.size() - expert_bytes_ / 2)), 0);
  WeightMemory memory = weight_memory(expert_bytes_);
  const uint32_t last = layers_.experts - 1;
  EXPECT_EQ(qmoe_expert_store_read(store.get(), 1, &last, 1, 0, memory.get(), expert_bytes_),
            QMOE_STATUS_IO_ERROR);
  EXPECT_NE(message().find("shrank"), std::string::npos) << message();
  const uint32_t first = 0;
  EXPECT_EQ(qmoe_expert_store_read(store.get(), 0, &first, 1, 1, memory.get(), expert_bytes_),
            QMOE_STATUS_OK)
      << message();
}

// ---------------------------------------------------------------------------------------------
// Bad arguments

TEST(ExpertStore, OpenRefusals) {
  qmoe_expert_store* store = reinterpret_cast<qmoe_expert_store*>(&store);
  EXPECT_EQ(qmoe_expert_store_open(nullptr, &store), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(store, nullptr);
  TempPath path;
  EXPECT_EQ(qmoe_expert_store_open(path.c_str(), nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_open(path.c_str(), &store), QMOE_STATUS_IO_ERROR);
  EXPECT_NE(std::strstr(qmoe_last_error_message(), "cannot open"), nullptr);
  EXPECT_EQ(qmoe_expert_store_open(::testing::TempDir().c_str(), &store), QMOE_STATUS_IO_ERROR);
  EXPECT_NE(std::strstr(qmoe_last_error_message(), "not a regular file"), nullptr)
      << qmoe_last_error_message();
  EXPECT_EQ(store, nullptr);
}

TEST(ExpertStore, WriteRefusalsLeaveNoFile) {
  const Layers a = int_layers(small_layer_a(), 1, make_int4_matrix, 11);
  const Layers b = int_layers(small_layer_b(), 1, make_int4_matrix, 12);
  TempPath path;
  const qmoe_expert_set* mixed[2] = {a.handles[0], b.handles[0]};
  EXPECT_EQ(qmoe_expert_store_write(path.c_str(), mixed, 2), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(qmoe_last_error_message(), "layer 1 has E, H, I"), nullptr)
      << qmoe_last_error_message();
  EXPECT_EQ(qmoe_expert_store_write(nullptr, a.handles.data(), 1), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_write("", a.handles.data(), 1), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_write(path.c_str(), nullptr, 1), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_write(path.c_str(), a.handles.data(), 0),
            QMOE_STATUS_INVALID_ARGUMENT);
  const qmoe_expert_set* with_null[2] = {a.handles[0], nullptr};
  EXPECT_EQ(qmoe_expert_store_write(path.c_str(), with_null, 2), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(qmoe_last_error_message(), "layers[1]"), nullptr)
      << qmoe_last_error_message();
  // A set whose experts differ in a projection's layout: expert 3's FC2 with zero points.
  std::mt19937_64 rng(13);
  auto model = make_moe_model(small_layer_b(), rng);
  MoeOptions other = small_layer_b();
  other.fc2.zero_points = true;
  auto model2 = make_moe_model(other, rng);
  model->fc2_desc[3] = model2->fc2_desc[3];
  SetPtr odd = create_set(model->desc);
  const qmoe_expert_set* odd_layers[1] = {odd.get()};
  EXPECT_EQ(qmoe_expert_store_write(path.c_str(), odd_layers, 1), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(qmoe_last_error_message(), "layer 0 expert 3: its fc2 zero points"),
            nullptr)
      << qmoe_last_error_message();
  struct stat st;
  EXPECT_NE(::stat(path.c_str(), &st), 0);
  // A directory that does not exist: IO_ERROR, nothing created.
  const std::string missing = ::testing::TempDir() + "qmoe_no_such_dir/store.qmoe";
  EXPECT_EQ(qmoe_expert_store_write(missing.c_str(), a.handles.data(), 1), QMOE_STATUS_IO_ERROR);
  EXPECT_NE(std::strstr(qmoe_last_error_message(), "cannot create"), nullptr);
  // A destroyed set.
  qmoe_expert_set* gone = nullptr;
  ASSERT_EQ(qmoe_expert_set_create(&a.models[0]->desc, &gone), QMOE_STATUS_OK);
  qmoe_expert_set_destroy(gone);
  const qmoe_expert_set* stale[1] = {gone};
  EXPECT_EQ(qmoe_expert_store_write(path.c_str(), stale, 1), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(::stat(path.c_str(), &st), 0);
}

// A failed write leaves an existing file as it was; a successful one replaces it whole.
TEST(ExpertStore, WriteReplacesOnlyWhole) {
  const Layers a = int_layers(small_layer_a(), 1, make_int4_matrix, 14);
  const Layers b = int_layers(small_layer_b(), 2, make_int4_matrix, 15);
  TempPath path;
  ASSERT_EQ(qmoe_expert_store_write(path.c_str(), a.handles.data(), 1), QMOE_STATUS_OK);
  const auto before = read_file(path.str());
  const qmoe_expert_set* mixed[2] = {b.handles[0], a.handles[0]};
  EXPECT_EQ(qmoe_expert_store_write(path.c_str(), mixed, 2), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(read_file(path.str()), before);
  ASSERT_EQ(qmoe_expert_store_write(path.c_str(), b.handles.data(), 2), QMOE_STATUS_OK);
  StorePtr store = open_store(path);
  EXPECT_EQ(store_info(store.get()).num_layers, 2u);
}

TEST(ExpertStore, ReadRefusalsWriteNothing) {
  const Layers a = int_layers(small_layer_b(), 2, make_int4_matrix, 16);
  TempPath path;
  ASSERT_EQ(qmoe_expert_store_write(path.c_str(), a.handles.data(), 2), QMOE_STATUS_OK);
  StorePtr store = open_store(path);
  const qmoe_expert_store_info info = store_info(store.get());
  const size_t eb = info.expert_bytes;
  // Two experts' room plus guard bytes after; the second read asks for 3 experts.
  std::vector<unsigned char> guard(2 * eb + 4096 + 64, 0xA5);
  unsigned char* mem = guard.data() + (64 - reinterpret_cast<uintptr_t>(guard.data()) % 64);
  const uint32_t ids[3] = {1, 0, 2};
  const uint32_t bad_id[2] = {0, info.num_experts};
  auto untouched = [&] {
    for (unsigned char c : guard) {
      if (c != 0xA5) return false;
    }
    return true;
  };
  EXPECT_EQ(qmoe_expert_store_read(store.get(), 0, ids, 3, 1, mem, 2 * eb),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_read(store.get(), 0, bad_id, 2, 1, mem, 2 * eb),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(qmoe_last_error_message(), "ids[1]"), nullptr);
  EXPECT_EQ(qmoe_expert_store_read(store.get(), 2, ids, 1, 1, mem, eb),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_read(store.get(), 0, ids, 1, 1, mem + 32, eb),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_read(store.get(), 0, nullptr, 1, 1, mem, eb),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_read(store.get(), 0, ids, 1, 1, nullptr, eb),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_read(nullptr, 0, ids, 1, 1, mem, eb), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_TRUE(untouched());
  EXPECT_EQ(qmoe_expert_store_read(store.get(), 0, ids, 0, 1, nullptr, 0), QMOE_STATUS_OK);
  // The largest read that fits writes exactly its records.
  ASSERT_EQ(qmoe_expert_store_read(store.get(), 1, ids, 2, 1, mem, 2 * eb), QMOE_STATUS_OK)
      << qmoe_last_error_message();
  for (size_t i = 2 * eb + (mem - guard.data()); i < guard.size(); ++i) {
    ASSERT_EQ(guard[i], 0xA5) << i;
  }
  EXPECT_EQ(le32(mem + 8), 1u);       // ids[0]'s record first
  EXPECT_EQ(le32(mem + eb + 8), 0u);  // then ids[1]'s
}

TEST(ExpertStore, InfoAndCloseRefusals) {
  const Layers a = int_layers(small_layer_b(), 1, make_int4_matrix, 17);
  TempPath path;
  ASSERT_EQ(qmoe_expert_store_write(path.c_str(), a.handles.data(), 1), QMOE_STATUS_OK);
  qmoe_expert_store* store = nullptr;
  ASSERT_EQ(qmoe_expert_store_open(path.c_str(), &store), QMOE_STATUS_OK);
  qmoe_expert_store_info info{};
  info.struct_size = size_t{1} << 20;
  EXPECT_EQ(qmoe_expert_store_get_info(store, &info), QMOE_STATUS_INVALID_ARGUMENT);
  info.struct_size = 8;
  EXPECT_EQ(qmoe_expert_store_get_info(store, &info), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_get_info(store, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  info.struct_size = sizeof info;
  EXPECT_EQ(qmoe_expert_store_get_info(store, &info), QMOE_STATUS_OK);
  EXPECT_EQ(info.fc1_format, QMOE_WEIGHT_FORMAT_INT4);
  EXPECT_EQ(qmoe_expert_store_close(store), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_expert_store_close(store), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::strstr(qmoe_last_error_message(), "destroyed"), nullptr);
  EXPECT_EQ(qmoe_expert_store_get_info(store, &info), QMOE_STATUS_INVALID_ARGUMENT);
  const uint32_t id = 0;
  unsigned char buf[64];
  EXPECT_EQ(qmoe_expert_store_read(store, 0, &id, 1, 0, buf, sizeof buf),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_close(nullptr), QMOE_STATUS_OK);
}

// Reads from several threads at once on one handle (TSan runs this).
TEST(ExpertStore, ConcurrentReads) {
  const Layers a = int_layers(small_layer_b(), 2, make_int4_matrix, 18);
  TempPath path;
  ASSERT_EQ(qmoe_expert_store_write(path.c_str(), a.handles.data(), 2), QMOE_STATUS_OK);
  StorePtr store = open_store(path);
  const qmoe_expert_store_info info = store_info(store.get());
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      WeightMemory memory = weight_memory(info.expert_bytes);
      for (uint32_t i = 0; i < 40; ++i) {
        const uint32_t layer = (i + t) % 2, id = (i * 7 + t) % info.num_experts;
        if (qmoe_expert_store_read(store.get(), layer, &id, 1, 1, memory.get(),
                                   info.expert_bytes) != QMOE_STATUS_OK ||
            le32(static_cast<unsigned char*>(memory.get()) + 8) != id) {
          ++failures[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[t], 0) << t;
}

// Whether this process maps `path` (/proc/self/maps).
bool process_maps(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(path) != std::string::npos) return true;
  }
  return false;
}

// A layer mapped from the file runs to the bits of the set written, after the store is closed
// too; the mapping goes when the last set over it does.
TEST(ExpertStore, MappedLayerRunsAndOutlivesTheStore) {
  const Layers layers = int_layers(small_layer_a(), 2, make_int4_matrix, 19);
  TempPath path;
  ASSERT_EQ(qmoe_expert_store_write(path.c_str(), layers.handles.data(), 2), QMOE_STATUS_OK);
  auto ctx = default_context();
  const std::vector<float> want =
      layer_outputs(ctx.get(), layers.handles[1], layers.experts, layers.hidden, 20);
  qmoe_expert_store* store = nullptr;
  ASSERT_EQ(qmoe_expert_store_open(path.c_str(), &store), QMOE_STATUS_OK);
  qmoe_expert_set* a = nullptr;
  qmoe_expert_set* b = nullptr;
  ASSERT_EQ(qmoe_expert_store_map_layer(store, 1, &a), QMOE_STATUS_OK) << qmoe_last_error_message();
  ASSERT_EQ(qmoe_expert_store_map_layer(store, 1, &b), QMOE_STATUS_OK);
  expect_same_bits(layer_outputs(ctx.get(), a, layers.experts, layers.hidden, 20), want);
  EXPECT_TRUE(process_maps(path.str()));
  ASSERT_EQ(qmoe_expert_store_close(store), QMOE_STATUS_OK);
  expect_same_bits(layer_outputs(ctx.get(), b, layers.experts, layers.hidden, 20), want);
  EXPECT_EQ(qmoe_expert_set_destroy(b), QMOE_STATUS_OK);
  EXPECT_TRUE(process_maps(path.str())) << "a still uses the mapping";
  expect_same_bits(layer_outputs(ctx.get(), a, layers.experts, layers.hidden, 20), want);
  EXPECT_EQ(qmoe_expert_set_destroy(a), QMOE_STATUS_OK);
  EXPECT_FALSE(process_maps(path.str())) << "the mapping outlived every set and the store";
}

TEST(ExpertStore, MappedLayerRefusals) {
  const Layers layers = int_layers(small_layer_b(), 2, make_int4_matrix, 21);
  TempPath path, swapped;
  ASSERT_EQ(qmoe_expert_store_write(path.c_str(), layers.handles.data(), 2), QMOE_STATUS_OK);
  StorePtr store = open_store(path);
  qmoe_expert_set* set = reinterpret_cast<qmoe_expert_set*>(&set);
  EXPECT_EQ(qmoe_expert_store_map_layer(store.get(), 2, &set), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(set, nullptr);
  EXPECT_EQ(qmoe_expert_store_map_layer(store.get(), 0, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_map_layer(nullptr, 0, &set), QMOE_STATUS_INVALID_ARGUMENT);
  // Layer 1's experts 2 and 3 swapped in the file: mapping layer 1 is refused, layer 0 is not.
  auto bytes = read_file(path.str());
  const size_t eb = store_info(store.get()).expert_bytes, E = layers.experts;
  std::swap_ranges(bytes.begin() + static_cast<long>(4096 + (E + 2) * eb),
                   bytes.begin() + static_cast<long>(4096 + (E + 3) * eb),
                   bytes.begin() + static_cast<long>(4096 + (E + 3) * eb));
  write_file(swapped.str(), bytes);
  StorePtr bad = open_store(swapped);
  EXPECT_EQ(qmoe_expert_store_map_layer(bad.get(), 1, &set), QMOE_STATUS_CORRUPT_DATA);
  EXPECT_NE(std::strstr(qmoe_last_error_message(), "records[2] holds expert 3 of layer 1"), nullptr)
      << qmoe_last_error_message();
  ASSERT_EQ(qmoe_expert_store_map_layer(bad.get(), 0, &set), QMOE_STATUS_OK);
  qmoe_expert_set_destroy(set);
}

// After a read the records are in the page cache: ready says so (within a deadline, as the
// cache is the OS's). Prefetch is advice and succeeds; bad arguments are refused.
TEST(ExpertStore, PrefetchAndReady) {
  const Layers layers = int_layers(small_layer_b(), 2, make_int4_matrix, 22);
  TempPath path;
  ASSERT_EQ(qmoe_expert_store_write(path.c_str(), layers.handles.data(), 2), QMOE_STATUS_OK);
  StorePtr store = open_store(path);
  const qmoe_expert_store_info info = store_info(store.get());
  std::vector<uint32_t> all(info.num_experts);
  for (uint32_t e = 0; e < info.num_experts; ++e) all[e] = info.num_experts - 1 - e;
  ASSERT_EQ(qmoe_expert_store_prefetch(store.get(), 1, all.data(), info.num_experts),
            QMOE_STATUS_OK);
  WeightMemory memory = weight_memory(info.expert_bytes * info.num_experts);
  ASSERT_EQ(qmoe_expert_store_read(store.get(), 1, all.data(), info.num_experts, 1, memory.get(),
                                   info.expert_bytes * info.num_experts),
            QMOE_STATUS_OK);
  std::vector<uint8_t> ready(info.num_experts + 1, 7);
  bool all_ready = false;
  for (int attempt = 0; attempt < 200 && !all_ready; ++attempt) {
    ASSERT_EQ(qmoe_expert_store_ready(store.get(), 1, all.data(), info.num_experts, ready.data()),
              QMOE_STATUS_OK)
        << qmoe_last_error_message();
    all_ready = std::count(ready.begin(), ready.end() - 1, 1) == info.num_experts;
    if (!all_ready) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(all_ready);
  EXPECT_EQ(ready.back(), 7) << "ready wrote past num_ids";
  for (uint8_t r : ready) EXPECT_TRUE(r == 0 || r == 1 || r == 7);
  const uint32_t bad_id = info.num_experts;
  EXPECT_EQ(qmoe_expert_store_ready(store.get(), 1, &bad_id, 1, ready.data()),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_ready(store.get(), 2, all.data(), 1, ready.data()),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_ready(store.get(), 1, all.data(), 1, nullptr),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_ready(store.get(), 1, nullptr, 1, ready.data()),
            QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_ready(store.get(), 1, nullptr, 0, nullptr), QMOE_STATUS_OK);
  EXPECT_EQ(qmoe_expert_store_prefetch(store.get(), 1, &bad_id, 1), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_prefetch(nullptr, 1, all.data(), 1), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_expert_store_prefetch(store.get(), 1, nullptr, 0), QMOE_STATUS_OK);
}

// docs/abi.md's ready-experts-first pattern: two calls over complementary run masks, the second
// accumulating, give the single call's outputs (to FP32 rounding of the one extra add).
TEST(ExpertStore, ReadyExpertsFirstInTwoCalls) {
  const Layers layers = int_layers(small_layer_b(), 1, make_int4_matrix, 23);
  TempPath path;
  ASSERT_EQ(qmoe_expert_store_write(path.c_str(), layers.handles.data(), 1), QMOE_STATUS_OK);
  StorePtr store = open_store(path);
  qmoe_expert_set* raw = nullptr;
  ASSERT_EQ(qmoe_expert_store_map_layer(store.get(), 0, &raw), QMOE_STATUS_OK);
  SetPtr set(raw);
  auto ctx = default_context();
  std::mt19937_64 rng(24);
  const uint32_t m = 4, k = 3, H = layers.hidden, E = layers.experts;
  std::vector<float> x(size_t{m} * H);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : x) v = u(rng);
  std::vector<int32_t> ids;
  std::vector<float> weights;
  random_routing(m, E, k, rng, &ids, &weights);
  std::vector<float> once(size_t{m} * H), twice(size_t{m} * H, NAN);
  ASSERT_EQ(moe_forward(ctx.get(), set.get(), QMOE_ACCURACY_EXACT, m, x.data(), H, ids.data(),
                        weights.data(), k, once.data(), H, nullptr),
            QMOE_STATUS_OK);
  std::vector<uint8_t> first(E), second(E);
  for (uint32_t e = 0; e < E; ++e) first[e] = e % 2, second[e] = 1 - e % 2;  // "ready": odd ids
  MoeCallOptions call;
  call.run_mask = first.data();
  ASSERT_EQ(moe_forward(ctx.get(), set.get(), QMOE_ACCURACY_EXACT, m, x.data(), H, ids.data(),
                        weights.data(), k, twice.data(), H, &call),
            QMOE_STATUS_OK);
  call.run_mask = second.data();
  call.accumulate = 1;
  ASSERT_EQ(moe_forward(ctx.get(), set.get(), QMOE_ACCURACY_EXACT, m, x.data(), H, ids.data(),
                        weights.data(), k, twice.data(), H, &call),
            QMOE_STATUS_OK);
  for (size_t i = 0; i < once.size(); ++i) {
    EXPECT_NEAR(twice[i], once[i], 1e-5f * (std::fabs(once[i]) + 1.0f)) << i;
  }
}

TEST(ExpertStore, StatusNames) {
  EXPECT_STREQ(qmoe_status_string(QMOE_STATUS_IO_ERROR), "QMOE_STATUS_IO_ERROR");
  EXPECT_STREQ(qmoe_status_string(QMOE_STATUS_CORRUPT_DATA), "QMOE_STATUS_CORRUPT_DATA");
}

}  // namespace
}  // namespace qmoe::testing
