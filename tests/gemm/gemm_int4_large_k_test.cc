// Every tier's INT4 kernels at a K whose code offsets pass 2^32 bytes (K up to
// QMOE_MAX_MATRIX_DIM = 2^31 is accepted by the ABI, so a group's stream reaches 2^30 bytes and
// a chunk index times 128 no longer fits 32 bits).
//
// Why: the scalar kernels addressed chunk c at codes + c * kChunkBytes with both factors
// uint32_t, so from c = 2^25 (K > 2^30) they read chunk c - 2^25 and returned OK with a wrong
// result; the SIMD kernels step a pointer and were right. Here row 0 of chunk 0 holds code 3
// (weight -5) and row 0 of chunk 2^25 code 9 (weight +1), and X is 1 on chunk 2^25 only, so the
// right answer is 32 and the wrapped read gives -160.
//
// Memory: every buffer is an untouched anonymous mapping (MAP_NORESERVE): reads of it map the
// shared zero page (the huge one where THP allows), and only the pages written below take
// memory, although the mappings span about 9.5 GiB of address space. Where the system refuses
// such mappings the test is skipped with the reason.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "lib/formats/int4_layout.h"
#include "lib/gemm/group_args.h"
#include "tests/cpu/isa_test_util.h"

namespace qmoe::testing {
namespace {

// An untouched anonymous mapping of `bytes`, unmapped at scope exit.
class ZeroPages {
 public:
  explicit ZeroPages(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      error_ = std::strerror(errno);
    } else {
      data_ = static_cast<unsigned char*>(p);
      // Where THP allows, a read fault maps the huge zero page: 512 times fewer faults (the
      // 4 KiB faults were most of the test's time). Advice only; failure changes nothing.
      madvise(p, bytes, MADV_HUGEPAGE);
    }
  }
  ~ZeroPages() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  ZeroPages(const ZeroPages&) = delete;
  ZeroPages& operator=(const ZeroPages&) = delete;

  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }
  bool ok() const { return data_ != nullptr; }
  const std::string& error() const { return error_; }

 private:
  unsigned char* data_ = nullptr;
  size_t bytes_;
  std::string error_;
};

constexpr uint32_t kFarChunk = uint32_t{1} << 25;  // its byte offset, 2^32, wraps in 32 bits
constexpr uint32_t kChunks = kFarChunk + 1;
constexpr uint32_t kBlock = 128;
constexpr uint32_t kBlocks = (kChunks * kChunkCodes + kBlock - 1) / kBlock;

class GemmInt4LargeK : public IsaTest {};

#if defined(__SANITIZE_THREAD__)
#define QMOE_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define QMOE_TEST_TSAN 1
#endif
#endif

TEST_P(GemmInt4LargeK, ChunkOffsetsPastFourGiB) {
#if defined(QMOE_TEST_TSAN)
  GTEST_SKIP() << "ThreadSanitizer keeps shadow state for the memory a test reads: the 9.5 GiB "
                  "of zero pages would need several times that (a single-threaded test; the "
                  "Release and ASan suites run it)";
#endif
  const size_t codes_bytes = size_t{kChunks} * kChunkBytes;
  const size_t k_padded = size_t{kChunks} * kChunkCodes;
  ZeroPages codes(codes_bytes), x(k_padded * sizeof(float)), q(k_padded),
      x_scale(size_t{kChunks} * sizeof(float)), x_sum(size_t{kChunks} * sizeof(float)),
      scales(size_t{kBlocks} * kGroupRows * sizeof(float));
  for (const ZeroPages* map : {&codes, &x, &q, &x_scale, &x_sum, &scales}) {
    if (!map->ok()) GTEST_SKIP() << "cannot map the 9.5 GiB of zero pages: " << map->error();
  }
  // Row 0's 16 bytes of each chunk: both nibbles the code.
  std::memset(codes.as<uint8_t>(), 0x33, kChunkRowBytes);
  std::memset(codes.as<uint8_t>() + size_t{kFarChunk} * kChunkBytes, 0x99, kChunkRowBytes);
  // X = 1 on the far chunk only; its fast-level form: q = 127, scale 1/127, sum 32 * 127.
  const size_t far_k = size_t{kFarChunk} * kChunkCodes;
  for (uint32_t j = 0; j < kChunkCodes; ++j) {
    x.as<float>()[far_k + j] = 1.0f;
    q.as<int8_t>()[far_k + j] = 127;
  }
  x_scale.as<float>()[kFarChunk] = 1.0f / 127.0f;
  x_sum.as<float>()[kFarChunk] = 32.0f * 127.0f;
  // Scale 1 for row 0 of every block ([K/block, N] order, block stride 8); the zero pages'
  // rows 1-7 are not computed.
  for (uint32_t b = 0; b < kBlocks; ++b) scales.as<float>()[size_t{b} * kGroupRows] = 1.0f;

  GemmGroupArgs a{};
  a.codes = codes.as<uint8_t>();
  a.chunks = kChunks;
  a.block_size = kBlock;
  a.scale_dtype = QMOE_DTYPE_F32;
  a.scales = scales.as<float>();
  a.scale_block_stride = kGroupRows;
  a.m = 1;
  a.x = x.as<float>();
  a.ldx = k_padded;
  a.xq = Q8Activations{q.as<int8_t>(), x_scale.as<float>(), x_sum.as<float>(), k_padded, kChunks,
                       nullptr};  // e2m1_start: read by E2M1 formats only
  a.row_begin = 0;
  a.row_end = 1;  // one row: the scalar kernels take about a second per level
  for (const auto& [name, fn] : {std::pair{"exact", int4_gemm(table(), QMOE_ACCURACY_EXACT)},
                                 std::pair{"fast", int4_gemm(table(), QMOE_ACCURACY_FAST)}}) {
    float y[kGroupRows] = {-1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f, -1.0f};
    a.y = y;
    fn(a);
    // Exact: 32 products of 1 * 1 and one scale of 1. Fast: (32 * 127 * 9 - 8 * 32 * 127) *
    // (1 * 1/127), exact in float up to the last multiply.
    EXPECT_NEAR(y[0], 32.0f, 1e-4f) << name << " (-160: chunk 2^25 read chunk 0's codes)";
    for (uint32_t r = 1; r < kGroupRows; ++r) EXPECT_EQ(y[r], -1.0f) << name << " row " << r;
  }
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(GemmInt4LargeK);

}  // namespace
}  // namespace qmoe::testing
