// FP32 -> FP16 and FP32 -> BF16 on every tier, over all 2^32 inputs: the tier equals the scalar
// kernel bit for bit on every input (NaNs included), every NaN becomes a quiet NaN with its sign,
// and the tier matches independent oracles: F16C vcvtps2ph, libfp16, AVX512-BF16 vcvtneps2bf16
// where the CPU has it, and round-to-nearest-even computed from the definition in FP64.
// The results do not depend on MXCSR (DAZ, FTZ, rounding mode).
//
// Each sweep is split into chunks of 2^16 consecutive inputs handed out to
// std::thread::hardware_concurrency() threads. QMOE_TEST_SWEEP_STRIDE=k (default 1) tests only
// every k-th FP32 pattern (sanitizer builds).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <xmmintrin.h>
#define QMOE_TEST_HAVE_MXCSR 1
#endif

#include "tests/cpu/isa_test_util.h"
#include "tests/cpu/oracles/convert_oracles.h"

namespace qmoe::testing {
namespace {

constexpr size_t kChunk = size_t{1} << 16;
constexpr uint64_t kAllPatterns = uint64_t{1} << 32;

std::string hex(uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%0*X", digits, static_cast<unsigned>(v));
  return buf;
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

bool is_nan_f32(uint32_t x) {
  return (x & 0x7FFFFFFFu) > 0x7F800000u;
}
bool is_denormal_f32(uint32_t x) {
  return (x & 0x7F800000u) == 0 && (x & 0x007FFFFFu) != 0;
}

uint32_t sweep_stride() {
  static const uint32_t stride = [] {
    const char* s = std::getenv("QMOE_TEST_SWEEP_STRIDE");
    if (s == nullptr || *s == '\0') return 1u;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(s, &end, 10);
    if (end == s || *end != '\0' || v < 1 || v > 0xFFFFFFFFull) {
      std::printf("QMOE_TEST_SWEEP_STRIDE=\"%s\" is not a count in 1..2^32-1; using 1\n", s);
      return 1u;
    }
    if (v != 1) {
      std::printf("QMOE_TEST_SWEEP_STRIDE=%llu: each 2^32 sweep tests every %llu-th FP32 pattern\n",
                  v, v);
    }
    return static_cast<uint32_t>(v);
  }();
  return stride;
}

using NarrowFn = std::function<void(const float*, uint16_t*, size_t)>;

// What the narrowed format looks like, for the NaN rule.
struct Format {
  const char* name;
  uint16_t quiet_bit;  // 0x0200 for FP16, 0x0040 for BF16
  uint16_t inf_bits;   // 0x7C00 for FP16, 0x7F80 for BF16
};
constexpr Format kF16{"FP16", 0x0200, 0x7C00};
constexpr Format kBf16{"BF16", 0x0040, 0x7F80};

// Which inputs a reference defines, and which output bits it defines for NaN inputs.
struct Domain {
  bool skip_fp32_denormals = false;
  uint16_t nan_bits_compared = 0xFFFF;
};

// Smallest differing input of a sweep, and how many differ.
struct Mismatch {
  uint64_t count = 0;
  uint32_t input = 0;
  uint16_t got = 0;
  uint16_t want = 0;

  void add(uint32_t x, uint16_t g, uint16_t w) {
    if (count == 0 || x < input) {
      input = x;
      got = g;
      want = w;
    }
    ++count;
  }
  void merge(const Mismatch& o) {
    if (o.count == 0) return;
    if (count == 0 || o.input < input) {
      input = o.input;
      got = o.got;
      want = o.want;
    }
    count += o.count;
  }
};

struct SweepResult {
  uint64_t inputs = 0;
  Mismatch vs_reference;
  Mismatch nan_rule;
};

// Runs `kernel` and `reference` on every stride-th FP32 pattern and compares them.
SweepResult sweep_all_f32(const NarrowFn& kernel, const NarrowFn& reference, const Format& format,
                          const Domain& domain) {
  const uint64_t stride = sweep_stride();
  const uint64_t total = (kAllPatterns + stride - 1) / stride;
  const uint64_t chunks = (total + kChunk - 1) / kChunk;
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<uint64_t> next_chunk{0};
  std::vector<SweepResult> per_thread(threads);

  auto work = [&](SweepResult& r) {
    std::vector<uint32_t> bits(kChunk);
    std::vector<float> in(kChunk);
    std::vector<uint16_t> got(kChunk);
    std::vector<uint16_t> want(kChunk);
    for (uint64_t c; (c = next_chunk.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
      const uint64_t begin = c * kChunk;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, total - begin));
      uint32_t pattern = static_cast<uint32_t>(begin * stride);  // wraps modulo 2^32
      for (size_t k = 0; k < n; ++k, pattern += static_cast<uint32_t>(stride)) bits[k] = pattern;
      std::memcpy(in.data(), bits.data(), n * sizeof(float));
      kernel(in.data(), got.data(), n);
      reference(in.data(), want.data(), n);
      r.inputs += n;
      // Fast paths first: most chunks hold no difference and no NaN input.
      const bool differs = std::memcmp(got.data(), want.data(), n * sizeof(uint16_t)) != 0;
      uint32_t nans = 0;  // a count, not a bool, so the compiler vectorizes the scan
      for (size_t k = 0; k < n; ++k) nans += is_nan_f32(bits[k]) ? 1u : 0u;
      if (!differs && nans == 0) continue;
      for (size_t k = 0; k < n; ++k) {
        const uint32_t x = bits[k];
        const uint16_t g = got[k];
        const bool nan = is_nan_f32(x);
        if (g != want[k]) {
          const uint16_t mask = nan ? domain.nan_bits_compared : 0xFFFF;
          const bool compared = !(domain.skip_fp32_denormals && is_denormal_f32(x));
          if (compared && ((g ^ want[k]) & mask) != 0) r.vs_reference.add(x, g, want[k]);
        }
        if (nan) {
          const bool quiet_nan_with_sign = (g & format.inf_bits) == format.inf_bits &&
                                           (g & format.quiet_bit) != 0 && (g >> 15) == (x >> 31);
          if (!quiet_nan_with_sign) r.nan_rule.add(x, g, 0);
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work, std::ref(per_thread[t]));
  work(per_thread[0]);
  for (std::thread& t : pool) t.join();

  SweepResult all;
  for (const SweepResult& r : per_thread) {
    all.inputs += r.inputs;
    all.vs_reference.merge(r.vs_reference);
    all.nan_rule.merge(r.nan_rule);
  }
  return all;
}

void expect_clean(const char* isa, const Format& format, const char* reference_name,
                  const SweepResult& r) {
  EXPECT_EQ(r.inputs, (kAllPatterns + sweep_stride() - 1) / sweep_stride());
  EXPECT_EQ(r.vs_reference.count, 0u)
      << "[" << isa << "] FP32 -> " << format.name << ": " << r.vs_reference.count << " of "
      << r.inputs << " inputs differ from " << reference_name << "; first input "
      << hex(r.vs_reference.input, 8) << " -> got " << hex(r.vs_reference.got, 4) << ", want "
      << hex(r.vs_reference.want, 4);
  EXPECT_EQ(r.nan_rule.count, 0u)
      << "[" << isa << "] FP32 -> " << format.name << ": " << r.nan_rule.count
      << " NaN inputs do not give a quiet NaN with their sign; first input "
      << hex(r.nan_rule.input, 8) << " -> " << hex(r.nan_rule.got, 4);
}

// Round to nearest even from the definition: pick the nearer of the two BF16 neighbours of x,
// compared as exact FP64 distances (ties to the even encoding; past the largest finite the
// upper neighbour is 2^128, i.e. Inf). NaN: the documented rule, (x >> 16) | 0x0040.
uint16_t bf16_by_definition(uint32_t x) {
  if (is_nan_f32(x)) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  const uint16_t lo = static_cast<uint16_t>(x >> 16);  // truncation, toward zero
  if ((x & 0xFFFFu) == 0) return lo;
  const uint16_t hi = static_cast<uint16_t>(lo + 1);  // next encoding away from zero
  const double v = std::fabs(static_cast<double>(float_of(x)));
  const double vlo = std::fabs(static_cast<double>(float_of(static_cast<uint32_t>(lo) << 16)));
  const double vhi =
      (hi & 0x7FFFu) == 0x7F80u
          ? std::ldexp(1.0, 128)
          : std::fabs(static_cast<double>(float_of(static_cast<uint32_t>(hi) << 16)));
  const double below = v - vlo;  // exact: all three are 24-bit values within a binade pair
  const double above = vhi - v;
  if (below < above) return lo;
  if (above < below) return hi;
  return (lo & 1u) != 0 ? hi : lo;
}

const KernelTable& scalar_table() {
  return *kernel_table_for_isa(Isa::kScalar);
}

// Every tier against the scalar kernel. The scalar kernel itself is checked against the
// independent oracles below; together they pin every tier to the oracles.
class ConvertNarrowExhaustiveTest : public IsaTest {
 protected:
  const char* isa() const { return isa_name(GetParam()); }
  bool is_scalar() const { return GetParam() == Isa::kScalar; }
};

TEST_P(ConvertNarrowExhaustiveTest, F32ToF16AllInputsMatchScalar) {
  if (is_scalar()) GTEST_SKIP() << "the scalar kernel is the reference (ConvertNarrowOracleTest)";
  const SweepResult r = sweep_all_f32(table().convert_f32_to_f16.fn,
                                      scalar_table().convert_f32_to_f16.fn, kF16, Domain{});
  expect_clean(isa(), kF16, "the scalar kernel", r);
}

TEST_P(ConvertNarrowExhaustiveTest, F32ToBf16AllInputsMatchScalar) {
  if (is_scalar()) GTEST_SKIP() << "the scalar kernel is the reference (ConvertNarrowOracleTest)";
  const SweepResult r = sweep_all_f32(table().convert_f32_to_bf16.fn,
                                      scalar_table().convert_f32_to_bf16.fn, kBf16, Domain{});
  expect_clean(isa(), kBf16, "the scalar kernel", r);
}

// The scalar kernels against independent oracles.
TEST(ConvertNarrowOracleTest, ScalarF32ToF16AllInputsMatchF16c) {
  if (!oracle_f16c_available()) GTEST_SKIP() << "CPU lacks F16C (or the OS lacks YMM state)";
  // vcvtps2ph defines every input, NaN payloads included (quiet bit set, payload truncated).
  const SweepResult r =
      sweep_all_f32(scalar_table().convert_f32_to_f16.fn, oracle_f16c_f32_to_f16, kF16, Domain{});
  expect_clean("scalar", kF16, "F16C vcvtps2ph (imm8 = nearest even)", r);
}

TEST(ConvertNarrowOracleTest, ScalarF32ToF16AllInputsMatchLibfp16) {
  // fp16_ieee_from_fp32_value rounds with FP32 arithmetic, exact under the default MXCSR that
  // the test runs with; for NaN it returns sign | 0x7E00 and drops the payload, so for NaN
  // inputs only the sign, exponent and quiet bit (mask 0xFE00) are compared.
  Domain domain;
  domain.nan_bits_compared = 0xFE00;
  const SweepResult r =
      sweep_all_f32(scalar_table().convert_f32_to_f16.fn, oracle_libfp16_f32_to_f16, kF16, domain);
  expect_clean("scalar", kF16, "libfp16 fp16_ieee_from_fp32_value", r);
}

TEST(ConvertNarrowOracleTest, ScalarF32ToBf16AllInputsMatchDefinition) {
  const NarrowFn reference = [](const float* src, uint16_t* dst, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_by_definition(bits_of(src[i]));
  };
  const SweepResult r =
      sweep_all_f32(scalar_table().convert_f32_to_bf16.fn, reference, kBf16, Domain{});
  expect_clean("scalar", kBf16, "nearest-even rounding computed in FP64", r);
}

TEST(ConvertNarrowOracleTest, ScalarF32ToBf16AllInputsMatchAvx512Bf16) {
  if (!oracle_avx512bf16_available()) {
    GTEST_SKIP() << "CPU lacks AVX512-BF16 (or the OS lacks ZMM state)";
  }
  // vcvtneps2bf16 treats FP32 denormal inputs as zero, so those are not compared; on all other
  // inputs, NaNs included ((x >> 16) | 0x0040), it defines exactly our result.
  Domain domain;
  domain.skip_fp32_denormals = true;
  const SweepResult r = sweep_all_f32(scalar_table().convert_f32_to_bf16.fn,
                                      oracle_avx512bf16_f32_to_bf16, kBf16, domain);
  expect_clean("scalar", kBf16, "AVX512-BF16 vcvtneps2bf16", r);
}

// FP32 inputs around every boundary the conversions have: all exponents where FP16 results
// turn subnormal, normal or infinite and the FP32 denormals, Inf and NaN; mantissas with every
// rounding position (1..24 bits dropped) at, just below and just above the halfway point, with
// an even and an odd kept part; plus random mantissas. Both signs.
std::vector<float> structured_f32_inputs(uint32_t seed) {
  std::vector<uint32_t> exponents = {0, 1, 2, 125, 126, 127, 128, 253, 254, 255};
  for (uint32_t e = 98; e <= 114; ++e) exponents.push_back(e);
  for (uint32_t e = 140; e <= 143; ++e) exponents.push_back(e);
  std::mt19937 rng(seed);
  std::vector<uint32_t> mantissas = {0, 1, 2, 0x7FFFFF, 0x7FFFFE, 0x400000, 0x400001, 0x3FFFFF};
  for (uint32_t dropped = 1; dropped <= 24; ++dropped) {
    const uint32_t half = 1u << (dropped - 1);
    for (uint32_t odd = 0; odd <= 1; ++odd) {
      for (int delta = -1; delta <= 1; ++delta) {
        const uint32_t high = (dropped < 24 ? (rng() << dropped) : 0u) & 0x7FFFFFu;
        const uint32_t kept_lsb = dropped < 24 ? (odd << dropped) : 0u;
        const uint32_t m = ((high & ~kept_lsb) | kept_lsb | (half + static_cast<uint32_t>(delta)));
        mantissas.push_back(m & 0x7FFFFFu);
      }
    }
  }
  for (int i = 0; i < 64; ++i) mantissas.push_back(rng() & 0x7FFFFFu);
  std::vector<float> out;
  for (uint32_t sign = 0; sign <= 1; ++sign) {
    for (uint32_t e : exponents) {
      for (uint32_t m : mantissas) out.push_back(float_of((sign << 31) | (e << 23) | m));
    }
  }
  return out;
}

#if defined(QMOE_TEST_HAVE_MXCSR)
// Sets MXCSR for its lifetime and restores the caller's value, even when a test fails early.
class ScopedMxcsr {
 public:
  explicit ScopedMxcsr(unsigned csr) : saved_(_mm_getcsr()) { _mm_setcsr(csr); }
  ~ScopedMxcsr() { _mm_setcsr(saved_); }
  ScopedMxcsr(const ScopedMxcsr&) = delete;
  ScopedMxcsr& operator=(const ScopedMxcsr&) = delete;

 private:
  unsigned saved_;
};
#endif

struct AllOutputs {
  std::vector<uint32_t> f16_to_f32, bf16_to_f32;
  std::vector<uint16_t> f32_to_f16, f32_to_bf16;
};

AllOutputs run_all(const KernelTable& t, const std::vector<uint16_t>& halves,
                   const std::vector<float>& singles) {
  AllOutputs o;
  std::vector<float> wide(halves.size());
  t.convert_f16_to_f32.fn(halves.data(), wide.data(), halves.size());
  for (float f : wide) o.f16_to_f32.push_back(bits_of(f));
  t.convert_bf16_to_f32.fn(halves.data(), wide.data(), halves.size());
  for (float f : wide) o.bf16_to_f32.push_back(bits_of(f));
  o.f32_to_f16.resize(singles.size());
  o.f32_to_bf16.resize(singles.size());
  t.convert_f32_to_f16.fn(singles.data(), o.f32_to_f16.data(), singles.size());
  t.convert_f32_to_bf16.fn(singles.data(), o.f32_to_bf16.data(), singles.size());
  return o;
}

template <typename In, typename Out>
void expect_same_outputs(const std::string& what, const std::vector<In>& in,
                         const std::vector<Out>& got, const std::vector<Out>& want) {
  size_t count = 0;
  size_t first = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    if (got[i] != want[i] && count++ == 0) first = i;
  }
  uint32_t in_bits = 0;
  if (!in.empty()) std::memcpy(&in_bits, &in[first], sizeof(In));
  EXPECT_EQ(count, 0u) << what << ": " << count << " of " << in.size() << " inputs differ; first "
                       << hex(in_bits, 2 * sizeof(In)) << " -> got "
                       << hex(got[first], 2 * sizeof(Out)) << ", want "
                       << hex(want[first], 2 * sizeof(Out));
}

TEST_P(ConvertNarrowExhaustiveTest, ResultsDoNotDependOnMxcsr) {
#if defined(QMOE_TEST_HAVE_MXCSR)
  const auto seed = static_cast<uint32_t>(fresh_seed());
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<uint16_t> halves(65536);
  for (uint32_t i = 0; i < 65536; ++i) halves[i] = static_cast<uint16_t>(i);
  const std::vector<float> singles = structured_f32_inputs(seed);

  // Reference: MXCSR's power-on value (all exceptions masked, round to nearest, no DAZ/FTZ).
  AllOutputs want;
  {
    const ScopedMxcsr csr(0x1F80);
    want = run_all(table(), halves, singles);
  }
  constexpr unsigned kDaz = 0x0040, kFtz = 0x8000;
  const struct {
    unsigned rc;
    const char* name;
  } modes[] = {{0x6000, "toward zero"}, {0x2000, "down"}, {0x4000, "up"}, {0x0000, "nearest"}};
  for (const auto& mode : modes) {
    AllOutputs got;
    {
      const ScopedMxcsr csr(0x1F80 | kDaz | kFtz | mode.rc);
      got = run_all(table(), halves, singles);
    }
    const std::string ctx = std::string("[") + isa() + "] MXCSR DAZ|FTZ, rounding " + mode.name;
    expect_same_outputs(ctx + ", FP16 -> FP32", halves, got.f16_to_f32, want.f16_to_f32);
    expect_same_outputs(ctx + ", BF16 -> FP32", halves, got.bf16_to_f32, want.bf16_to_f32);
    expect_same_outputs(ctx + ", FP32 -> FP16", singles, got.f32_to_f16, want.f32_to_f16);
    expect_same_outputs(ctx + ", FP32 -> BF16", singles, got.f32_to_bf16, want.f32_to_bf16);
  }
  // The structured set must itself be right, not just stable.
  std::vector<uint16_t> ref(singles.size());
  scalar_table().convert_f32_to_f16.fn(singles.data(), ref.data(), singles.size());
  expect_same_outputs(std::string("[") + isa() + "] structured FP32 -> FP16 vs scalar", singles,
                      want.f32_to_f16, ref);
  scalar_table().convert_f32_to_bf16.fn(singles.data(), ref.data(), singles.size());
  expect_same_outputs(std::string("[") + isa() + "] structured FP32 -> BF16 vs scalar", singles,
                      want.f32_to_bf16, ref);
#else
  GTEST_SKIP() << "MXCSR exists only on x86-64";
#endif
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(ConvertNarrowExhaustiveTest);

}  // namespace
}  // namespace qmoe::testing
