// Every tier's fast-level activation quantizer against the test's own quantizer written from
// docs/formats.md (tests/gemm/q8_reference.h), bit for bit. The tiers are also compared with
// the scalar kernel (tests/cpu/gemm_int4_extension_test.cc); this is the independent check of
// the scalar kernel itself, so a quantizer that rounded half away from zero, or scaled by
// max / 127 in FP64, fails here on every tier.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/cpu/isa_test_util.h"
#include "tests/gemm/q8_reference.h"

namespace qmoe::testing {
namespace {

class QuantizeQ8Spec : public IsaTest {
 protected:
  // Adds a failure (with the first difference) unless the tier's quantizer gives the
  // reference's q, scales and sums.
  void check(const std::vector<float>& x, const std::string& where) {
    const size_t chunks = (x.size() + 31) / 32;
    std::vector<int8_t> q(chunks * 32, 99);
    std::vector<float> s(chunks, -1.0f), u(chunks, -1.0f);
    table().quantize_activations_q8.fn(x.data(), x.size(), q.data(), s.data(), u.data());
    const Q8Reference ref = reference_quantize_q8(x.data(), x.size());
    for (size_t i = 0; i < q.size(); ++i) {
      ASSERT_EQ(q[i], ref.q[i]) << where << ": q[" << i << "] of k=" << x.size()
                                << ", x = " << (i < x.size() ? x[i] : 0.0f) << ", chunk scale "
                                << ref.scale[i / 32];
    }
    for (size_t c = 0; c < chunks; ++c) {
      ASSERT_EQ(std::memcmp(&s[c], &ref.scale[c], sizeof(float)), 0)
          << where << ": scale[" << c << "] " << s[c] << ", documented " << ref.scale[c];
      ASSERT_EQ(u[c], static_cast<float>(ref.sum_q[c])) << where << ": sum_q[" << c << "]";
    }
  }
  std::string where(const char* what) const {
    return std::string(isa_name(GetParam())) + " " + what;
  }
};

TEST_P(QuantizeQ8Spec, RandomRowsEveryLength) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-40, 40);
  for (size_t k : {1u, 7u, 31u, 32u, 33u, 64u, 100u, 255u, 256u, 257u, 1000u, 2048u}) {
    std::vector<float> x(k);
    for (float& v : x) v = std::ldexp(mantissa(rng), exponent(rng));
    check(x, where("random") + " seed=" + std::to_string(seed));
    for (float& v : x) v = std::normal_distribution<float>(0.0f, 3.0f)(rng);
    check(x, where("normal") + " seed=" + std::to_string(seed));
  }
}

// Products that land exactly on k + 1/2: with max = 127 the reciprocal is 1, so x = j + 0.5
// rounds to the even neighbour (0.5 -> 0, 1.5 -> 2, -2.5 -> -2).
TEST_P(QuantizeQ8Spec, TiesRoundToEven) {
  for (size_t k : {32u, 96u, 300u}) {
    std::vector<float> x(k);
    for (size_t i = 0; i < k; ++i) {
      x[i] = i % 32 == 0 ? 127.0f : static_cast<float>(static_cast<int>(i % 251) - 125) + 0.5f;
    }
    check(x, where("ties"));
  }
  // And one hand-checked row: the documented rounding, not just agreement.
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  x[1] = 0.5f;
  x[2] = 1.5f;
  x[3] = -2.5f;
  x[4] = 126.5f;
  const Q8Reference ref = reference_quantize_q8(x.data(), x.size());
  EXPECT_EQ(ref.q[1], 0);
  EXPECT_EQ(ref.q[2], 2);
  EXPECT_EQ(ref.q[3], -2);
  EXPECT_EQ(ref.q[4], 126);
  EXPECT_EQ(ref.scale[0], 1.0f);
  check(x, where("hand-checked ties"));
}

// The flush threshold from both sides, subnormal chunks, and magnitudes up to FLT_MAX.
TEST_P(QuantizeQ8Spec, FlushAndRangeEnds) {
  const float flush = std::ldexp(1.0f, -119);
  const float maxima[] = {0.0f,
                          std::numeric_limits<float>::denorm_min(),
                          std::ldexp(1.0f, -130),
                          std::nextafter(flush, 0.0f),
                          flush,
                          std::nextafter(flush, 1.0f),
                          std::ldexp(1.0f, -100),
                          1.0f,
                          std::ldexp(1.0f, 100),
                          std::numeric_limits<float>::max()};
  constexpr size_t kCount = sizeof(maxima) / sizeof(maxima[0]);
  for (size_t k : {kCount * 32, kCount * 32 - 5}) {
    std::vector<float> x(k);
    for (size_t i = 0; i < k; ++i) {
      const float m = maxima[(i / 32) % kCount];
      x[i] = i % 32 == 0 ? -m : m * ((static_cast<float>(i % 9) - 4.0f) / 4.5f);
    }
    check(x, where("flush and range ends"));
  }
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(QuantizeQ8Spec);

}  // namespace
}  // namespace qmoe::testing
