// Bounds of the row conversions on every tier: for every count 0..200 at every start offset
// 0..63 elements (from a 64-byte boundary), nothing outside [dst, dst + n) changes, the source is
// not written, and the values inside equal the scalar kernel's. Reads are checked with guard
// pages: a source that ends right before, or starts right after, an inaccessible page faults on
// any read outside [src, src + n).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#if defined(__unix__)
#include <sys/mman.h>
#include <unistd.h>
#define QMOE_TEST_HAVE_GUARD_PAGES 1
#endif

#include "tests/cpu/isa_test_util.h"

namespace qmoe::testing {
namespace {

constexpr size_t kMaxCount = 200;
constexpr size_t kOffsets = 64;
constexpr size_t kGuardBytes = 256;

std::string hex_bytes(const void* p, size_t bytes) {
  std::string s = "0x";
  for (size_t i = bytes; i-- > 0;) {  // little-endian value
    char b[3];
    std::snprintf(b, sizeof(b), "%02X", static_cast<const unsigned char*>(p)[i]);
    s += b;
  }
  return s;
}

// Random source elements that hit every class: any 16-bit pattern for FP16/BF16; for FP32,
// random bits with the exponent drawn mostly from the range FP16 cares about, plus zero/denormal
// and Inf/NaN exponents.
void fill_random(std::mt19937& rng, uint16_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint16_t>(rng());
}
void fill_random(std::mt19937& rng, float* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t x = rng();
    const uint32_t kind = rng() % 4;
    if (kind == 1) x = (x & 0x807FFFFFu) | ((100u + rng() % 46u) << 23);  // FP16 range
    if (kind == 2) x &= 0x807FFFFFu;                                      // zero or denormal
    if (kind == 3) x |= 0x7F800000u;                                      // Inf or NaN
    std::memcpy(&p[i], &x, sizeof(x));
  }
}

// A 64-byte-aligned byte buffer.
class AlignedBytes {
 public:
  explicit AlignedBytes(size_t bytes) : storage_(bytes + 64) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(storage_.data());
    data_ = storage_.data() + ((64 - p % 64) % 64);
  }
  unsigned char* data() { return data_; }

 private:
  std::vector<unsigned char> storage_;
  unsigned char* data_;
};

template <typename Src, typename Dst>
void check_bounds_and_values(const char* isa, const char* direction,
                             void (*kernel)(const Src*, Dst*, size_t),
                             void (*scalar)(const Src*, Dst*, size_t)) {
  const auto seed = static_cast<uint32_t>(fresh_seed());
  std::mt19937 rng(seed);
  // [guard | offsets + max count | guard] for both buffers, base 64-byte aligned.
  const size_t src_bytes = 2 * kGuardBytes + (kOffsets + kMaxCount) * sizeof(Src);
  const size_t dst_bytes = 2 * kGuardBytes + (kOffsets + kMaxCount) * sizeof(Dst);
  AlignedBytes src_buf(src_bytes), dst_buf(dst_bytes);
  std::vector<unsigned char> src_image(src_bytes), poison(dst_bytes), expected(dst_bytes);
  for (size_t i = 0; i < dst_bytes; ++i) poison[i] = static_cast<unsigned char>(0xA5 ^ (i * 29));
  Src* const src_base = reinterpret_cast<Src*>(src_buf.data() + kGuardBytes);
  Dst* const dst_base = reinterpret_cast<Dst*>(dst_buf.data() + kGuardBytes);
  fill_random(rng, reinterpret_cast<Src*>(src_buf.data()), src_bytes / sizeof(Src));
  std::memcpy(src_image.data(), src_buf.data(), src_bytes);
  std::vector<Dst> want(kMaxCount);

  for (size_t n = 0; n <= kMaxCount; ++n) {
    for (size_t offset = 0; offset < kOffsets; ++offset) {
      // Every source offset occurs too, paired with a different destination offset.
      const size_t src_offset = (offset * 29 + 3) % kOffsets;
      const Src* src = src_base + src_offset;
      Dst* dst = dst_base + offset;
      std::memcpy(dst_buf.data(), poison.data(), dst_bytes);
      kernel(src, dst, n);
      if (n != 0) scalar(src, want.data(), n);

      std::memcpy(expected.data(), poison.data(), dst_bytes);
      if (n != 0) {
        std::memcpy(expected.data() + kGuardBytes + offset * sizeof(Dst), want.data(),
                    n * sizeof(Dst));
      }
      if (std::memcmp(dst_buf.data(), expected.data(), dst_bytes) != 0) {
        size_t i = 0;
        while (dst_buf.data()[i] == expected[i]) ++i;
        const ptrdiff_t elem_bytes = sizeof(Dst);
        const ptrdiff_t dst_start = static_cast<ptrdiff_t>(kGuardBytes + offset * sizeof(Dst));
        const ptrdiff_t rel = static_cast<ptrdiff_t>(i) - dst_start;
        const ptrdiff_t elem =
            rel >= 0 ? rel / elem_bytes : -((-rel + elem_bytes - 1) / elem_bytes);
        const bool inside = elem >= 0 && static_cast<size_t>(elem) < n;
        const size_t at = static_cast<size_t>(dst_start + elem * elem_bytes);
        ADD_FAILURE() << "[" << isa << "] " << direction << " n=" << n << " dst offset=" << offset
                      << " src offset=" << src_offset << " (seed " << seed
                      << "): " << (inside ? "value" : "write outside the row") << " at element "
                      << elem << ": got " << hex_bytes(dst_buf.data() + at, sizeof(Dst))
                      << ", want " << hex_bytes(expected.data() + at, sizeof(Dst))
                      << (inside ? " (scalar)" : " (poison)");
        return;
      }
      if (std::memcmp(src_buf.data(), src_image.data(), src_bytes) != 0) {
        ADD_FAILURE() << "[" << isa << "] " << direction << " n=" << n << " offset=" << offset
                      << ": the source buffer was written";
        return;
      }
    }
  }
}

#if defined(QMOE_TEST_HAVE_GUARD_PAGES)
// One read-write page between two inaccessible pages.
class GuardedPage {
 public:
  GuardedPage() : page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
    void* p = mmap(nullptr, 3 * page_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    base_ = static_cast<unsigned char*>(p);
    if (mprotect(base_ + page_, page_, PROT_READ | PROT_WRITE) != 0) {
      munmap(base_, 3 * page_);
      base_ = nullptr;
    }
  }
  ~GuardedPage() {
    if (base_ != nullptr) munmap(base_, 3 * page_);
  }
  GuardedPage(const GuardedPage&) = delete;
  GuardedPage& operator=(const GuardedPage&) = delete;

  bool ok() const { return base_ != nullptr; }
  unsigned char* begin() const { return base_ + page_; }
  unsigned char* end() const { return base_ + 2 * page_; }
  size_t size() const { return page_; }

 private:
  size_t page_;
  unsigned char* base_ = nullptr;
};

// A kernel that reads before src or at/after src + n faults (the test binary dies there).
template <typename Src, typename Dst>
void check_reads_stay_inside(const char* isa, const char* direction,
                             void (*kernel)(const Src*, Dst*, size_t),
                             void (*scalar)(const Src*, Dst*, size_t)) {
  GuardedPage page;
  ASSERT_TRUE(page.ok()) << "mmap/mprotect failed";
  ASSERT_GE(page.size(), kMaxCount * sizeof(Src));
  const auto seed = static_cast<uint32_t>(fresh_seed());
  std::mt19937 rng(seed);
  fill_random(rng, reinterpret_cast<Src*>(page.begin()), page.size() / sizeof(Src));
  std::vector<Dst> got(kMaxCount + 1), want(kMaxCount + 1);
  for (size_t n = 0; n <= kMaxCount; ++n) {
    const Src* at_end = reinterpret_cast<const Src*>(page.end()) - n;
    const Src* at_begin = reinterpret_cast<const Src*>(page.begin());
    for (const Src* src : {at_end, at_begin}) {
      kernel(src, got.data(), n);
      scalar(src, want.data(), n);
      if (std::memcmp(got.data(), want.data(), n * sizeof(Dst)) != 0) {
        ADD_FAILURE() << "[" << isa << "] " << direction << " n=" << n << " source at page "
                      << (src == at_end ? "end" : "start") << " (seed " << seed
                      << "): differs from scalar";
        return;
      }
    }
  }
}
#endif

class ConvertGuardTest : public IsaTest {
 protected:
  const char* isa() const { return isa_name(GetParam()); }
  static const KernelTable& scalar_table() { return scalar_kernels(); }
};

TEST_P(ConvertGuardTest, F16ToF32WritesOnlyTheRow) {
  check_bounds_and_values(isa(), "FP16 -> FP32", table().convert_f16_to_f32.fn,
                          scalar_table().convert_f16_to_f32.fn);
}

TEST_P(ConvertGuardTest, F32ToF16WritesOnlyTheRow) {
  check_bounds_and_values(isa(), "FP32 -> FP16", table().convert_f32_to_f16.fn,
                          scalar_table().convert_f32_to_f16.fn);
}

TEST_P(ConvertGuardTest, Bf16ToF32WritesOnlyTheRow) {
  check_bounds_and_values(isa(), "BF16 -> FP32", table().convert_bf16_to_f32.fn,
                          scalar_table().convert_bf16_to_f32.fn);
}

TEST_P(ConvertGuardTest, F32ToBf16WritesOnlyTheRow) {
  check_bounds_and_values(isa(), "FP32 -> BF16", table().convert_f32_to_bf16.fn,
                          scalar_table().convert_f32_to_bf16.fn);
}

// Rows at any address (the ABI's promise): 16-bit rows at odd addresses give the bits of the
// same values at aligned ones. (The scalar kernels once dereferenced uint16_t* directly; UBSan
// in the sanitizer suite reports that as a misaligned load or store.)
TEST_P(ConvertGuardTest, OddAddressesGiveTheAlignedBits) {
  constexpr size_t kCount = 37;
  std::mt19937 rng(fresh_seed());
  alignas(16) uint16_t halves[kCount];
  alignas(16) float floats[kCount];
  for (size_t i = 0; i < kCount; ++i) {
    halves[i] = static_cast<uint16_t>(rng());
    const uint32_t bits = 0x3F000000u + (rng() & 0x00FFFFFFu);
    std::memcpy(&floats[i], &bits, 4);
  }
  alignas(16) unsigned char odd_in[2 * kCount + 1], odd_out[4 * kCount + 1];
  std::memcpy(odd_in + 1, halves, sizeof halves);
  const auto* odd_halves = reinterpret_cast<const uint16_t*>(odd_in + 1);
  for (auto widen : {table().convert_f16_to_f32.fn, table().convert_bf16_to_f32.fn}) {
    float want[kCount], got[kCount];
    widen(halves, want, kCount);
    widen(odd_halves, reinterpret_cast<float*>(odd_out + 1), kCount);
    std::memcpy(got, odd_out + 1, sizeof got);
    EXPECT_EQ(std::memcmp(want, got, sizeof got), 0) << isa();
  }
  alignas(16) unsigned char odd_floats[4 * kCount + 1];
  std::memcpy(odd_floats + 1, floats, sizeof floats);
  for (auto narrow : {table().convert_f32_to_f16.fn, table().convert_f32_to_bf16.fn}) {
    uint16_t want[kCount], got[kCount];
    narrow(floats, want, kCount);
    narrow(reinterpret_cast<const float*>(odd_floats + 1), reinterpret_cast<uint16_t*>(odd_out + 1),
           kCount);
    std::memcpy(got, odd_out + 1, sizeof got);
    EXPECT_EQ(std::memcmp(want, got, sizeof got), 0) << isa();
  }
}

TEST_P(ConvertGuardTest, ReadsStayInsideTheRow) {
#if defined(QMOE_TEST_HAVE_GUARD_PAGES)
  check_reads_stay_inside(isa(), "FP16 -> FP32", table().convert_f16_to_f32.fn,
                          scalar_table().convert_f16_to_f32.fn);
  check_reads_stay_inside(isa(), "FP32 -> FP16", table().convert_f32_to_f16.fn,
                          scalar_table().convert_f32_to_f16.fn);
  check_reads_stay_inside(isa(), "BF16 -> FP32", table().convert_bf16_to_f32.fn,
                          scalar_table().convert_bf16_to_f32.fn);
  check_reads_stay_inside(isa(), "FP32 -> BF16", table().convert_f32_to_bf16.fn,
                          scalar_table().convert_f32_to_bf16.fn);
#else
  GTEST_SKIP() << "guard pages need mmap/mprotect";
#endif
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(ConvertGuardTest);

}  // namespace
}  // namespace qmoe::testing
