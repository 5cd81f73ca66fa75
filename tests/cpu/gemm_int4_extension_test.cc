// INT4 kernels behind extension features (AVX-VNNI, AVX512-VNNI), called directly on one 8-row
// group against the plain kernel of the tier they extend and against scalar, and checked to be
// the ones the assembled tier table picks exactly when the host has the feature. Also: the
// activation quantizer of every tier is bit-identical to scalar.
//
// The extension and plain fast kernels compute the same exact integer partial sums (vpdpbusd
// and vpmaddubsw + vpmaddwd sum the same bytes into each int32 lane) and share their float
// epilogue instruction for instruction, so they must agree bit for bit; both must also stay
// within 1e-5 of scalar relative to sum |(code - z) q| * |scale| * x_scale.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "lib/cpu/kernel_table.h"
#include "lib/cpu/kernel_tables.h"
#include "lib/dispatch.h"
#include "lib/formats/int4_layout.h"
#include "lib/gemm/group_args.h"
#include "tests/cpu/isa_test_util.h"

namespace qmoe::testing {
namespace {

constexpr float kPoison = -12345.678f;

// ---------------------------------------------------------------------------------------------
// Quantizer: every tier bit-identical to scalar on finite input.

class Int4QuantizeQ8 : public IsaTest {
 protected:
  void check(const std::vector<float>& x, const std::string& where) {
    const size_t chunks = (x.size() + kChunkCodes - 1) / kChunkCodes;
    std::vector<int8_t> q(chunks * kChunkCodes, 99), q_ref(chunks * kChunkCodes, 98);
    std::vector<float> s(chunks, kPoison), s_ref(chunks), u(chunks, kPoison), u_ref(chunks);
    table().quantize_activations_q8.fn(x.data(), x.size(), q.data(), s.data(), u.data());
    scalar_kernels().quantize_activations_q8.fn(x.data(), x.size(), q_ref.data(), s_ref.data(),
                                                u_ref.data());
    for (size_t i = 0; i < q.size(); ++i) {
      ASSERT_EQ(q[i], q_ref[i]) << where << ": q[" << i << "] of k=" << x.size()
                                << ", x = " << (i < x.size() ? x[i] : 0.0f);
    }
    for (size_t c = 0; c < chunks; ++c) {
      ASSERT_EQ(std::memcmp(&s[c], &s_ref[c], sizeof(float)), 0)
          << where << ": scale[" << c << "] " << s[c] << " vs scalar " << s_ref[c];
      ASSERT_EQ(std::memcmp(&u[c], &u_ref[c], sizeof(float)), 0)
          << where << ": sum_q[" << c << "] " << u[c] << " vs scalar " << u_ref[c];
    }
  }
};

TEST_P(Int4QuantizeQ8, BitIdenticalToScalarOnFiniteInput) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  for (size_t k : {1u, 5u, 16u, 31u, 32u, 33u, 64u, 95u, 1000u, 2048u}) {
    std::vector<float> x(k);
    for (float& v : x) v = std::ldexp(mantissa(rng), exponent(rng));
    check(x, std::string(isa_name(GetParam())) + " random seed=" + std::to_string(seed));
    // Ties: values whose products land on .5 (x = (2j+1)/2 * max/127 with max = 127).
    for (size_t i = 0; i < k; ++i)
      x[i] = i == 0 ? 127.0f : static_cast<float>(i % 255) * 0.5f - 63.5f;
    check(x, std::string(isa_name(GetParam())) + " ties");
    // All zero, and a single non-zero value per chunk.
    std::fill(x.begin(), x.end(), 0.0f);
    check(x, std::string(isa_name(GetParam())) + " zeros");
    for (size_t i = 0; i < k; i += 7) x[i] = -3.0f;
    check(x, std::string(isa_name(GetParam())) + " sparse");
  }
}

// A chunk whose max |x| is below 2^-119 (kQ8FlushBelow) quantizes to q = 0 and scale 0 on every
// tier. Every chunk tiny, and tiny chunks among ordinary ones, in lengths that reach both the
// one-chunk and the batched paths.
TEST_P(Int4QuantizeQ8, BitIdenticalToScalarWhenTheChunkMaxIsTiny) {
  for (size_t k : {70u, 300u, 520u}) {
    std::vector<float> x(k);
    for (size_t i = 0; i < k; ++i) {
      x[i] = static_cast<float>(static_cast<int>(i % 3) - 1) * 1e-39f * static_cast<float>(i + 1);
    }
    check(x, std::string(isa_name(GetParam())) + " tiny");
    for (size_t i = 0; i < k; ++i) {
      if ((i / kChunkCodes) % 3 == 1) x[i] = static_cast<float>(i % 7) - 3.0f;
    }
    check(x, std::string(isa_name(GetParam())) + " tiny among ordinary chunks");
  }
}

// NaN and +-Inf among the values, alone or beside ordinary chunks, and values near FLT_MAX:
// the batched paths must notice them and give the scalar tier's bits (NaN -> 0; an Inf makes
// the chunk's 127 / max 0, so its products are 0 and Inf * 0 = NaN -> 0). A path that
// converted without that care would store -128 (INT_MIN saturated) for those lanes.
TEST_P(Int4QuantizeQ8, BitIdenticalToScalarOnNonFiniteAndHugeInput) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const float big = std::numeric_limits<float>::max();
  for (size_t k : {64u, 256u, 300u, 544u}) {
    std::vector<float> x(k);
    for (size_t i = 0; i < k; ++i) x[i] = static_cast<float>(static_cast<int>(i % 11) - 5);
    const std::vector<float> ordinary = x;
    for (const auto& [where, value] : {std::pair<const char*, float>{"nan", nan},
                                       {"+inf", inf},
                                       {"-inf", -inf},
                                       {"-nan", -nan},
                                       {"FLT_MAX", big},
                                       {"-FLT_MAX", -big}}) {
      // One value in one chunk of the first batch, then one in every chunk.
      x = ordinary;
      x[std::min<size_t>(k - 1, 3 * kChunkCodes + 5)] = value;
      check(x, std::string(isa_name(GetParam())) + " one " + where);
      for (size_t i = 9; i < k; i += kChunkCodes) x[i] = value;
      check(x, std::string(isa_name(GetParam())) + " every chunk " + where);
    }
  }
}

// The flush itself, on the tier under test: chunks at max|x| = 0, 2^-130 (subnormal), 2^-121
// and just below 2^-119 give q = 0, scale 0 and sum 0; a chunk at exactly 2^-119 is quantized
// (its max to 127, scale 2^-119 / 127). And no division by zero is evaluated: the AVX2 batch
// used to compute 127 / 0 for an all-zero chunk (then masked the lane), which raised the
// divide-by-zero flag and trapped where a caller had unmasked it. Lengths reach the batched
// paths (eight chunks), the one-chunk path and a partial last chunk.
TEST_P(Int4QuantizeQ8, TinyChunksFlushToZeroWithoutDividingByZero) {
  const float tiny[] = {0.0f,
                        std::ldexp(1.0f, -130),
                        std::ldexp(1.0f, -121),
                        std::nextafter(kQ8FlushBelow, 0.0f),
                        kQ8FlushBelow,
                        1.0f};
  for (size_t k : {32u, 200u, 256u, 520u}) {
    const size_t chunks = (k + kChunkCodes - 1) / kChunkCodes;
    std::vector<float> x(k);
    for (size_t i = 0; i < k; ++i) {
      const float max = tiny[(i / kChunkCodes) % 6];
      // The chunk's max first, then smaller values of both signs.
      x[i] = i % kChunkCodes == 0 ? max : max * (static_cast<float>(i % 5) - 2.0f) / 3.0f;
    }
    std::vector<int8_t> q(chunks * kChunkCodes, 99);
    std::vector<float> s(chunks, kPoison), u(chunks, kPoison);
    std::feclearexcept(FE_ALL_EXCEPT);
    table().quantize_activations_q8.fn(x.data(), k, q.data(), s.data(), u.data());
    EXPECT_FALSE(std::fetestexcept(FE_DIVBYZERO)) << isa_name(GetParam()) << " k=" << k;
    EXPECT_FALSE(std::fetestexcept(FE_OVERFLOW | FE_INVALID)) << isa_name(GetParam()) << " k=" << k;
    for (size_t c = 0; c < chunks; ++c) {
      const float max = tiny[c % 6];
      const std::string where = std::string(isa_name(GetParam())) + " k=" + std::to_string(k) +
                                " chunk " + std::to_string(c) + " max " + std::to_string(max);
      if (max < kQ8FlushBelow) {
        EXPECT_EQ(s[c], 0.0f) << where;
        EXPECT_EQ(u[c], 0.0f) << where;
        for (size_t j = 0; j < kChunkCodes; ++j) {
          ASSERT_EQ(q[c * kChunkCodes + j], 0) << where << " q[" << j << "]";
        }
      } else {
        EXPECT_EQ(s[c], max / 127.0f) << where;
        EXPECT_EQ(q[c * kChunkCodes], 127) << where;
      }
    }
  }
}

QMOE_INSTANTIATE_ISA_TEST_SUITE(Int4QuantizeQ8);

#if defined(QMOE_HAVE_X86_TIERS)

// ---------------------------------------------------------------------------------------------
// Extension kernels.

// An extension ISA of the kernel list that has an INT4 fast kernel, and the base ISA of its tier.
struct Extension {
  CpuIsa isa;
  const char* name;  // the kernel-name suffix
  Isa tier;
  const KernelTable* table;  // the extension's own kernels
  const KernelTable* plain;  // the tier's own kernels
};

std::vector<Extension> extensions() {
  std::vector<Extension> out;
  for (CpuIsa isa : extension_isas()) {
    const CpuIsaInfo& info = cpu_isa_info(isa);
    if (int4_gemm(*info.table, QMOE_ACCURACY_FAST) == nullptr) continue;  // other formats only
    for (uint32_t i = 0; i < kCpuIsaCount; ++i) {
      const CpuIsaInfo& base = cpu_isa_info(static_cast<CpuIsa>(i));
      if (base.tier == info.tier && base.feature == 0) {
        out.push_back({isa, info.name, info.tier, info.table, base.table});
      }
    }
  }
  return out;
}

void PrintTo(const Extension& e, std::ostream* os) {
  *os << e.name;
}

class GemmInt4Extension : public ::testing::TestWithParam<Extension> {
 protected:
  // Empty when the host can run the extension (its tier and every feature it needs), else why
  // not.
  std::string unavailable() const {
    const char* reason = cpu_isa_unavailable_reason(GetParam().isa);
    return reason != nullptr ? reason : "";
  }
};

// Runs everywhere: the extension's kernels are named by it, and the assembled table of its tier
// takes them exactly when the host has its feature (no ISA above it in the list overrides them).
TEST_P(GemmInt4Extension, KernelsAreNamedByTheExtensionAndPickedOnlyWithTheFeature) {
  const Extension& e = GetParam();
  const GemmGroupFn fast = int4_gemm(*e.table, QMOE_ACCURACY_FAST);
  ASSERT_NE(fast, nullptr);
  EXPECT_EQ(std::string(gemm_kernel(*e.table, QMOE_WEIGHT_FORMAT_INT4, QMOE_ACCURACY_FAST).name),
            std::string("qmoe_gemm_int4_fast_8x32__") + e.name);

  const KernelTable* assembled = kernel_table_for_isa(e.tier);
  if (assembled == nullptr) GTEST_SKIP() << unavailable();
  const bool has_feature = unavailable().empty();  // the tier is available here
  EXPECT_EQ(int4_gemm(*assembled, QMOE_ACCURACY_FAST) == fast, has_feature)
      << isa_name(e.tier) << " tier runs "
      << gemm_kernel(*assembled, QMOE_WEIGHT_FORMAT_INT4, QMOE_ACCURACY_FAST).name;
  // Through the C ABI too: a context at the tier names the kernel it will run.
  qmoe_context_options o;
  qmoe_context_options_init(&o);
  o.max_isa = static_cast<qmoe_isa>(e.tier);
  o.num_threads = 1;
  qmoe_context* ctx = nullptr;
  ASSERT_EQ(qmoe_context_create(&o, &ctx), QMOE_STATUS_OK) << qmoe_last_error_message();
  const char* name = nullptr;
  int available = 0;
  EXPECT_EQ(qmoe_gemm_kernel_available(ctx, QMOE_WEIGHT_FORMAT_INT4, 32, QMOE_ACCURACY_FAST,
                                       &available, &name),
            QMOE_STATUS_OK);
  EXPECT_EQ(available, 1);
  const KernelTable& expected = has_feature ? *e.table : *e.plain;
  EXPECT_STREQ(name, gemm_kernel(expected, QMOE_WEIGHT_FORMAT_INT4, QMOE_ACCURACY_FAST).name);
  qmoe_context_destroy(ctx);
}

// One 8-row group's inputs, built directly in the kernel contract (lib/formats/int4_layout.h).
struct Group {
  uint32_t chunks = 1, block = 32, m = 1;
  qmoe_dtype dtype = QMOE_DTYPE_F16;
  bool zeros = false, bias = false;
  uint32_t row_begin = 0, row_end = kGroupRows;
  size_t scale_stride = kGroupRows, zero_stride = kGroupRows;  // elements per block

  std::vector<uint8_t> codes;
  std::vector<unsigned char> scales;
  std::vector<float> scale_f32;  // the same values as floats, [block][stride]
  std::vector<uint8_t> zero_points;
  std::vector<float> bias_values;
  std::vector<int8_t> q;
  std::vector<float> x_scale, x_sum;

  std::string describe() const {
    return "chunks=" + std::to_string(chunks) + " block=" + std::to_string(block) +
           " m=" + std::to_string(m) + " dtype=" + std::to_string(dtype) +
           " zeros=" + std::to_string(zeros) + " bias=" + std::to_string(bias) + " rows [" +
           std::to_string(row_begin) + "," + std::to_string(row_end) + ")";
  }

  void fill(std::mt19937_64& rng) {
    const uint32_t blocks = (chunks * kChunkCodes + block - 1) / block;
    codes.resize(size_t{chunks} * kChunkBytes);
    for (uint8_t& b : codes) b = static_cast<uint8_t>(rng());
    scale_f32.assign(blocks * scale_stride, 0.0f);
    std::uniform_real_distribution<float> mag(0.25f, 2.0f);
    for (float& s : scale_f32) s = (rng() % 2 ? -1.0f : 1.0f) * mag(rng) * 0.01f;
    if (dtype == QMOE_DTYPE_F32) {
      scales.resize(scale_f32.size() * 4);
      std::memcpy(scales.data(), scale_f32.data(), scales.size());
    } else {
      std::vector<uint16_t> bits(scale_f32.size());
      if (dtype == QMOE_DTYPE_F16) {
        scalar_kernels().convert_f32_to_f16.fn(scale_f32.data(), bits.data(), bits.size());
        scalar_kernels().convert_f16_to_f32.fn(bits.data(), scale_f32.data(), bits.size());
      } else {
        scalar_kernels().convert_f32_to_bf16.fn(scale_f32.data(), bits.data(), bits.size());
        scalar_kernels().convert_bf16_to_f32.fn(bits.data(), scale_f32.data(), bits.size());
      }
      scales.resize(bits.size() * 2);
      std::memcpy(scales.data(), bits.data(), scales.size());
    }
    zero_points.assign(blocks * zero_stride, 0);
    for (uint8_t& z : zero_points) z = static_cast<uint8_t>(rng() % 16);
    bias_values.resize(kGroupRows);
    for (float& b : bias_values) b = mag(rng) - 1.0f;
    // Activations quantized by the scalar tier (every tier's quantizer is bit-identical).
    const size_t k = size_t{chunks} * kChunkCodes;
    std::uniform_real_distribution<float> xv(-3.0f, 3.0f);
    std::vector<float> x(size_t{m} * k);
    for (float& v : x) v = xv(rng) * (rng() % 5 == 0 ? 50.0f : 1.0f);
    q.resize(x.size());
    x_scale.resize(size_t{m} * chunks);
    x_sum.resize(size_t{m} * chunks);
    for (uint32_t i = 0; i < m; ++i) {
      scalar_kernels().quantize_activations_q8.fn(x.data() + i * k, k, q.data() + i * k,
                                                  x_scale.data() + i * chunks,
                                                  x_sum.data() + i * chunks);
    }
  }

  GemmGroupArgs args(float* y, size_t ldy) const {
    GemmGroupArgs a{};
    a.codes = codes.data();
    a.chunks = chunks;
    a.block_size = block;
    a.scale_dtype = dtype;
    a.scales = scales.data();
    a.scale_block_stride = scale_stride;
    a.zero_points = zeros ? zero_points.data() : nullptr;
    a.zero_point_block_stride = zero_stride;
    a.bias = bias ? bias_values.data() : nullptr;
    a.m = m;
    a.xq = Q8Activations{q.data(), x_scale.data(), x_sum.data(), size_t{chunks} * kChunkCodes,
                         chunks,   nullptr};  // e2m1_start: read by E2M1 formats only
    a.y = y;
    a.ldy = ldy;
    a.row_begin = row_begin;
    a.row_end = row_end;
    return a;
  }

  // sum over k of |(code - z) * q| * |scale| * x_scale, the scale of the rounding error.
  double magnitude(uint32_t i, uint32_t r) const {
    double sum = 0.0;
    for (uint32_t c = 0; c < chunks; ++c) {
      for (uint32_t j = 0; j < kChunkCodes; ++j) {
        const uint8_t byte = codes[size_t{c} * kChunkBytes + r * kChunkRowBytes + j % 16];
        const int code = j < 16 ? byte & 0x0F : byte >> 4;
        const uint32_t b = (c * kChunkCodes + j) / block;
        const int z = zeros ? zero_points[b * zero_stride + r] : 8;
        const int qv = q[size_t{i} * chunks * kChunkCodes + c * kChunkCodes + j];
        sum += std::fabs(double{(code - z) * 1.0 * qv} * scale_f32[b * scale_stride + r]) *
               x_scale[size_t{i} * chunks + c];
      }
    }
    return sum;
  }
};

// Y of one kernel call in a poisoned buffer; words outside the written rows must keep it.
std::vector<float> run_group(GemmGroupFn fn, const Group& g, const std::string& where) {
  const size_t ldy = 11, guard = 16;
  std::vector<float> buffer(guard + g.m * ldy + guard, kPoison);
  fn(g.args(buffer.data() + guard, g.m > 1 ? ldy : 0));
  std::vector<float> y(size_t{g.m} * kGroupRows, kPoison);
  int reported = 0;
  for (size_t w = 0; w < buffer.size(); ++w) {
    const bool inside = w >= guard && w < guard + g.m * ldy;
    const size_t i = inside ? (w - guard) / ldy : 0, r = inside ? (w - guard) % ldy : 0;
    if (inside && r >= g.row_begin && r < g.row_end) {
      y[i * kGroupRows + r] = buffer[w];
    } else if (std::memcmp(&buffer[w], &kPoison, sizeof(float)) != 0 && reported++ < 3) {
      ADD_FAILURE() << where << ": word " << w << " outside the written rows changed";
    }
  }
  return y;
}

TEST_P(GemmInt4Extension, AgreesBitForBitWithThePlainKernelAndWithScalar) {
  if (const std::string reason = unavailable(); !reason.empty()) GTEST_SKIP() << reason;
  const Extension& e = GetParam();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  std::vector<Group> cases;
  for (uint32_t block : {16u, 32u, 64u, 128u}) {
    for (qmoe_dtype dtype : {QMOE_DTYPE_F16, QMOE_DTYPE_BF16, QMOE_DTYPE_F32}) {
      for (bool zeros : {false, true}) {
        for (uint32_t m : {1u, 2u, 3u, 4u, 5u, 8u, 9u}) {
          Group g;
          g.block = block;
          g.dtype = dtype;
          g.zeros = zeros;
          g.m = m;
          g.chunks = static_cast<uint32_t>(1 + rng() % 9);
          g.bias = rng() % 2;
          g.scale_stride = kGroupRows + rng() % 3;
          g.zero_stride = kGroupRows + rng() % 3;
          if (rng() % 3 == 0) {
            g.row_begin = static_cast<uint32_t>(rng() % kGroupRows);
            g.row_end = g.row_begin + 1 + static_cast<uint32_t>(rng() % (kGroupRows - g.row_begin));
          }
          cases.push_back(g);
        }
      }
    }
  }
  Group long_k;  // K = 2048, the Qwen3 hidden size
  long_k.chunks = 64;
  long_k.zeros = true;
  cases.push_back(long_k);

  for (Group& g : cases) {
    g.fill(rng);
    const std::string where =
        std::string(e.name) + " " + g.describe() + " seed=" + std::to_string(seed);
    const std::vector<float> ext = run_group(int4_gemm(*e.table, QMOE_ACCURACY_FAST), g, where);
    const std::vector<float> plain = run_group(int4_gemm(*e.plain, QMOE_ACCURACY_FAST), g,
                                               where + " [" + isa_name(e.tier) + "]");
    const std::vector<float> scalar =
        run_group(int4_gemm(scalar_kernels(), QMOE_ACCURACY_FAST), g, where + " [scalar]");
    int reported = 0;
    for (uint32_t i = 0; i < g.m; ++i) {
      for (uint32_t r = g.row_begin; r < g.row_end; ++r) {
        const size_t o = size_t{i} * kGroupRows + r;
        const double tol = 1e-5 * g.magnitude(i, r) + 1e-30;
        const bool same = std::memcmp(&ext[o], &plain[o], sizeof(float)) == 0;
        const bool near = std::fabs(double{ext[o]} - scalar[o]) <= tol &&
                          std::fabs(double{plain[o]} - scalar[o]) <= tol;
        if ((!same || !near) && reported++ < 3) {
          ADD_FAILURE() << where << ": Y[" << i << "," << r << "] " << e.name << " " << ext[o]
                        << ", " << isa_name(e.tier) << " " << plain[o] << ", scalar " << scalar[o]
                        << " (tol " << tol << ")";
        }
      }
    }
  }
}

std::string ExtensionName(const ::testing::TestParamInfo<Extension>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Extension, GemmInt4Extension, ::testing::ValuesIn(extensions()),
                         ExtensionName);

#endif  // QMOE_HAVE_X86_TIERS

}  // namespace
}  // namespace qmoe::testing
