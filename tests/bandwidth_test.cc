// The read-bandwidth kernel of every tier against an independent XOR, and
// qmoe_measure_read_bandwidth through the C ABI (results and bad arguments).
//
// The oracle builds every 64-bit little-endian word from its bytes with shifts, so it shares no
// load or byte-order assumption with the kernels, and keeps prefix XORs so that any
// [offset, offset + bytes) window costs one XOR.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lib/cpu/kernel_table.h"
#include "qmoe/qmoe.h"
#include "qmoe/qmoe_experimental.h"
#include "tests/cpu/isa_test_util.h"

namespace {

using qmoe::Isa;
using qmoe::testing::IsaTest;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// 64-byte aligned bytes, filled from `rng`.
std::unique_ptr<unsigned char, FreeDeleter> random_buffer(size_t bytes, std::mt19937_64& rng) {
  std::unique_ptr<unsigned char, FreeDeleter> buffer(
      static_cast<unsigned char*>(std::aligned_alloc(64, bytes)));
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t r = rng();
    for (size_t b = 0; b < 8 && i + b < bytes; ++b) {
      buffer.get()[i + b] = static_cast<unsigned char>(r >> (8 * b));
    }
  }
  return buffer;
}

// prefix[i] = XOR of little-endian words 0 .. i-1 of `data`.
std::vector<uint64_t> prefix_xor(const unsigned char* data, size_t bytes) {
  std::vector<uint64_t> prefix(bytes / 8 + 1, 0);
  for (size_t w = 0; w < bytes / 8; ++w) {
    uint64_t word = 0;
    for (int b = 7; b >= 0; --b) word = (word << 8) | data[8 * w + static_cast<size_t>(b)];
    prefix[w + 1] = prefix[w] ^ word;
  }
  return prefix;
}

// Line counts (64 bytes each) that cover an empty-main-loop call, every tail length of the
// 256- and 512-byte main loops, odd counts, and a few MB.
const size_t kLineCounts[] = {1,    2,    3,    4,    5,     6,     7,     8,     9,    11,  13,
                              15,   16,   17,   31,   33,    63,    65,    127,   129,  255, 257,
                              1023, 1025, 4095, 4097, 16383, 16385, 32769, 49153, 65535};
// Start offsets from a 64-byte aligned base, in lines (multiples of 64 bytes, none page
// aligned except 0 and 64).
const size_t kOffsetLines[] = {0, 1, 3, 7, 63, 64, 69};

class ReadBandwidthKernel : public IsaTest {};

TEST_P(ReadBandwidthKernel, MatchesIndependentXor) {
  const uint64_t seed = qmoe::testing::fresh_seed();
  std::mt19937_64 rng(seed);
  const size_t max_lines = 65535 + 69;
  const size_t bytes_total = max_lines * 64;
  auto buffer = random_buffer(bytes_total, rng);
  const std::vector<uint64_t> prefix = prefix_xor(buffer.get(), bytes_total);
  const qmoe::ReadBandwidthFn read = table().read_bandwidth.fn;
  for (size_t lines : kLineCounts) {
    for (size_t offset_lines : kOffsetLines) {
      const size_t offset = offset_lines * 64;
      const size_t bytes = lines * 64;
      const uint64_t expected = prefix[(offset + bytes) / 8] ^ prefix[offset / 8];
      const uint64_t got = read(buffer.get() + offset, bytes);
      ASSERT_EQ(got, expected) << qmoe::isa_name(GetParam()) << " bytes=" << bytes
                               << " offset=" << offset << " seed=" << seed;
    }
  }
}

// A single non-zero word at every position of buffers whose length ends in each tail case: the
// kernel must include each word an odd number of times (once), and nothing else.
TEST_P(ReadBandwidthKernel, EveryWordCountsOnce) {
  const qmoe::ReadBandwidthFn read = table().read_bandwidth.fn;
  for (size_t lines : {1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 37, 39}) {
    const size_t words = lines * 8;
    std::unique_ptr<uint64_t, FreeDeleter> buffer(
        static_cast<uint64_t*>(std::aligned_alloc(64, words * sizeof(uint64_t))));
    std::memset(buffer.get(), 0, words * sizeof(uint64_t));
    ASSERT_EQ(read(buffer.get(), words * sizeof(uint64_t)), 0u) << "lines=" << lines;
    for (size_t w = 0; w < words; ++w) {
      const uint64_t value = 0x9E3779B97F4A7C15ull * (w + 1);  // distinct, all bytes busy
      buffer.get()[w] = value;
      ASSERT_EQ(read(buffer.get(), words * sizeof(uint64_t)), value)
          << qmoe::isa_name(GetParam()) << " lines=" << lines << " word=" << w;
      buffer.get()[w] = 0;
    }
  }
}

// Inaccessible pages right before and right after the range: a kernel load outside
// [data, data + bytes) faults and fails the run (software prefetch never faults, so a kernel
// may prefetch past the end).
TEST_P(ReadBandwidthKernel, ReadsNothingOutsideTheRange) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t data_pages = 4;
  const size_t map_bytes = (data_pages + 2) * page;
  void* map = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  unsigned char* base = static_cast<unsigned char*>(map);
  ASSERT_EQ(mprotect(base, page, PROT_NONE), 0);
  ASSERT_EQ(mprotect(base + (data_pages + 1) * page, page, PROT_NONE), 0);
  unsigned char* first = base + page;
  unsigned char* last = base + (data_pages + 1) * page;  // one past the accessible bytes
  std::mt19937_64 rng(12345);
  for (size_t i = 0; i < data_pages * page; ++i) first[i] = static_cast<unsigned char>(rng());
  const std::vector<uint64_t> prefix = prefix_xor(first, data_pages * page);

  const qmoe::ReadBandwidthFn read = table().read_bandwidth.fn;
  for (size_t lines : {1, 2, 3, 5, 8, 9, 13, 64, 67, 200}) {
    const size_t bytes = lines * 64;
    ASSERT_LE(bytes, data_pages * page);
    // Starting on the first accessible byte.
    EXPECT_EQ(read(first, bytes), prefix[bytes / 8]) << "at start, bytes=" << bytes;
    // Ending on the last accessible byte.
    const size_t offset = data_pages * page - bytes;
    EXPECT_EQ(read(last - bytes, bytes), prefix[data_pages * page / 8] ^ prefix[offset / 8])
        << "at end, bytes=" << bytes;
  }
  ASSERT_EQ(munmap(map, map_bytes), 0);
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(ReadBandwidthKernel);

// --- qmoe_measure_read_bandwidth through the C ABI ------------------------------------------

struct ContextDeleter {
  void operator()(qmoe_context* c) const { qmoe_context_destroy(c); }
};
using ContextPtr = std::unique_ptr<qmoe_context, ContextDeleter>;

ContextPtr make_context(const qmoe_context_options* options) {
  qmoe_context* raw = nullptr;
  const qmoe_status status = qmoe_context_create(options, &raw);
  EXPECT_EQ(status, QMOE_STATUS_OK) << qmoe_last_error_message();
  return ContextPtr(status == QMOE_STATUS_OK ? raw : nullptr);
}

class MeasureReadBandwidth : public IsaTest {};

TEST_P(MeasureReadBandwidth, PositiveAndFiniteOnOneAndAllThreads) {
  qmoe_context_options options;
  qmoe_context_options_init(&options);
  options.max_isa = static_cast<qmoe_isa>(GetParam());
  ContextPtr ctx = make_context(&options);
  ASSERT_NE(ctx, nullptr);
  uint32_t threads = 0;
  ASSERT_EQ(qmoe_context_get_num_threads(ctx.get(), &threads), QMOE_STATUS_OK);
  for (int all_threads : {0, 1}) {
    // 1 MiB, the smallest accepted size, and a size that is not a multiple of 64.
    for (size_t bytes : {size_t{1} << 20, size_t{4096}, size_t{4096 + 64 * 3 + 8}}) {
      double bw = -1.0;
      ASSERT_EQ(qmoe_measure_read_bandwidth(ctx.get(), bytes, 3, all_threads, &bw), QMOE_STATUS_OK)
          << qmoe_last_error_message();
      EXPECT_TRUE(std::isfinite(bw)) << bw;
      EXPECT_GT(bw, 0.0) << qmoe::isa_name(GetParam()) << " bytes=" << bytes
                         << " all_threads=" << all_threads << " threads=" << threads;
    }
  }
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(MeasureReadBandwidth);

// A failing call returns the status, leaves the output untouched and sets a message.
void expect_rejected(qmoe_context* ctx, size_t bytes, uint32_t repetitions, qmoe_status status,
                     const char* what) {
  for (int all_threads : {0, 1}) {
    double bw = -7.0;
    EXPECT_EQ(qmoe_measure_read_bandwidth(ctx, bytes, repetitions, all_threads, &bw), status)
        << what << " all_threads=" << all_threads;
    EXPECT_EQ(bw, -7.0) << what << ": output written on failure";
    EXPECT_STRNE(qmoe_last_error_message(), "") << what;
  }
}

TEST(MeasureReadBandwidthArgs, NullContext) {
  expect_rejected(nullptr, size_t{1} << 20, 1, QMOE_STATUS_INVALID_CONTEXT, "null context");
}

TEST(MeasureReadBandwidthArgs, NullOutput) {
  ContextPtr ctx = make_context(nullptr);
  ASSERT_NE(ctx, nullptr);
  for (int all_threads : {0, 1}) {
    EXPECT_EQ(qmoe_measure_read_bandwidth(ctx.get(), size_t{1} << 20, 1, all_threads, nullptr),
              QMOE_STATUS_INVALID_ARGUMENT);
    EXPECT_STRNE(qmoe_last_error_message(), "");
  }
}

TEST(MeasureReadBandwidthArgs, BufferBelow4096Bytes) {
  ContextPtr ctx = make_context(nullptr);
  ASSERT_NE(ctx, nullptr);
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{64}, size_t{4095}}) {
    expect_rejected(ctx.get(), bytes, 1, QMOE_STATUS_INVALID_ARGUMENT, "buffer_bytes < 4096");
  }
}

TEST(MeasureReadBandwidthArgs, ZeroRepetitions) {
  ContextPtr ctx = make_context(nullptr);
  ASSERT_NE(ctx, nullptr);
  expect_rejected(ctx.get(), size_t{1} << 20, 0, QMOE_STATUS_INVALID_ARGUMENT, "repetitions 0");
}

// --- qmoe_measure_read_bandwidth_over: the caller's memory -------------------------------------

class MeasureReadBandwidthOver : public IsaTest {
 protected:
  // A context of the tier under test with threads of its own.
  static ContextPtr context_with_threads(uint32_t threads) {
    qmoe_context_options options;
    qmoe_context_options_init(&options);
    options.max_isa = static_cast<qmoe_isa>(GetParam());
    options.num_threads = threads;
    return make_context(&options);
  }
  static ContextPtr three_thread_context() { return context_with_threads(3); }

  // The body of ReadsEveryPageOfTheRange on one context.
  void reads_every_page(qmoe_context* ctx) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    constexpr size_t kPages = 64;
    const auto mapped_pages = [page](void* p) {
      unsigned char resident[kPages] = {};
      if (mincore(p, kPages * page, resident) != 0) return size_t{0};
      size_t count = 0;
      for (unsigned char r : resident) count += r & 1u;
      return count;
    };
    for (int all_threads : {0, 1}) {
      void* map = mmap(nullptr, kPages * page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (map == MAP_FAILED) GTEST_SKIP() << "mmap failed";
      madvise(map, kPages * page, MADV_NOHUGEPAGE);
      const size_t before = mapped_pages(map);
      double bw = -1.0;
      const qmoe_status status =
          qmoe_measure_read_bandwidth_over(ctx, map, kPages * page, 1, all_threads, &bw);
      const size_t after = mapped_pages(map);
      munmap(map, kPages * page);
      ASSERT_EQ(status, QMOE_STATUS_OK) << qmoe_last_error_message();
      EXPECT_EQ(before, 0u);
      EXPECT_EQ(after, kPages) << qmoe::isa_name(GetParam()) << " all_threads=" << all_threads
                               << ": pages of the range were not read";
    }
  }
};

// Positive and finite over unaligned ranges on one and all threads, and the memory is only
// read: guard bytes around the range and the range itself keep their pattern.
TEST_P(MeasureReadBandwidthOver, ReadsTheRangeAndWritesNothing) {
  ContextPtr ctx = three_thread_context();
  ASSERT_NE(ctx, nullptr);
  std::vector<unsigned char> memory((size_t{1} << 20) + 256);
  for (size_t i = 0; i < memory.size(); ++i) memory[i] = static_cast<unsigned char>(i * 131 + 7);
  const std::vector<unsigned char> before = memory;
  for (int all_threads : {0, 1}) {
    // Offsets and sizes that leave partial lines at both ends, down to the smallest range that
    // still holds 4096 bytes of whole lines.
    for (size_t offset : {size_t{0}, size_t{1}, size_t{63}}) {
      // The last size ends the range at the end of the allocation, so that a read past it is
      // a heap overflow under ASan.
      const size_t to_end = memory.size() - 64 - offset;
      for (size_t bytes : {size_t{1} << 20, size_t{4096} + 64 + 5, size_t{4096} + 127, to_end}) {
        double bw = -1.0;
        ASSERT_EQ(qmoe_measure_read_bandwidth_over(ctx.get(), memory.data() + 64 + offset, bytes, 2,
                                                   all_threads, &bw),
                  QMOE_STATUS_OK)
            << qmoe_last_error_message();
        EXPECT_TRUE(std::isfinite(bw)) << bw;
        EXPECT_GT(bw, 0.0) << qmoe::isa_name(GetParam()) << " offset=" << offset
                           << " bytes=" << bytes << " all_threads=" << all_threads;
      }
    }
  }
  EXPECT_TRUE(memory == before) << "the measured memory changed";
}

// It reads the caller's range itself, every page of it, on one and on all threads: no page of a
// fresh anonymous mapping is mapped before the call (mincore), and every one is after it (a
// read maps the zero page). A measurement of some other buffer would leave them unmapped. With 9
// threads the range splits into 72 slices, whose sizes rounded down to whole lines leave a whole
// 4 KB page over: the last slice must read it too.
TEST_P(MeasureReadBandwidthOver, ReadsEveryPageOfTheRange) {
  for (uint32_t threads : {3u, 9u}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    ContextPtr ctx = context_with_threads(threads);
    ASSERT_NE(ctx, nullptr);
    reads_every_page(ctx.get());
  }
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(MeasureReadBandwidthOver);

TEST(MeasureReadBandwidthOverArgs, BadInputGetsAStatus) {
  ContextPtr ctx = make_context(nullptr);
  ASSERT_NE(ctx, nullptr);
  alignas(64) static unsigned char memory[3 * 4096];
  const auto rejected = [&](qmoe_context* c, const void* data, size_t bytes, uint32_t reps,
                            qmoe_status status, const char* what) {
    for (int all_threads : {0, 1}) {
      double bw = -7.0;
      EXPECT_EQ(qmoe_measure_read_bandwidth_over(c, data, bytes, reps, all_threads, &bw), status)
          << what;
      EXPECT_EQ(bw, -7.0) << what << ": output written on failure";
      EXPECT_STRNE(qmoe_last_error_message(), "") << what;
    }
  };
  rejected(nullptr, memory, sizeof memory, 1, QMOE_STATUS_INVALID_CONTEXT, "null context");
  rejected(ctx.get(), nullptr, sizeof memory, 1, QMOE_STATUS_INVALID_ARGUMENT, "null data");
  rejected(ctx.get(), memory, sizeof memory, 0, QMOE_STATUS_INVALID_ARGUMENT, "repetitions 0");
  rejected(ctx.get(), memory, 4095, 1, QMOE_STATUS_INVALID_ARGUMENT, "4095 bytes");
  // 4096 bytes that start mid-line hold only 4032 bytes of whole lines.
  rejected(ctx.get(), memory + 1, 4096, 1, QMOE_STATUS_INVALID_ARGUMENT, "4096 bytes unaligned");
  rejected(ctx.get(), memory, SIZE_MAX, 1, QMOE_STATUS_INVALID_ARGUMENT, "range wraps around");
  for (int all_threads : {0, 1}) {
    EXPECT_EQ(
        qmoe_measure_read_bandwidth_over(ctx.get(), memory, sizeof memory, 1, all_threads, nullptr),
        QMOE_STATUS_INVALID_ARGUMENT);
  }
  double bw = 0.0;
  EXPECT_EQ(qmoe_measure_read_bandwidth_over(ctx.get(), memory, 4096, 1, 1, &bw), QMOE_STATUS_OK)
      << qmoe_last_error_message();
}

}  // namespace
