// The CPUID/XGETBV probe against cpuinfo, and the tier gates against synthetic feature sets.
#include <cpuinfo.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "lib/cpu/kernel_tables.h"
#include "lib/cpu_features.h"
#include "lib/dispatch.h"
#include "lib/gemm/stream_tuning.h"
#include "tests/cpu/tier_kernels.h"
#include "tests/expected_tier.h"

namespace qmoe {
namespace {

TEST(CpuFeatures, ProbeAgreesWithCpuinfoOnEveryFeatureBothReport) {
  ASSERT_TRUE(cpuinfo_initialize());
  const uint32_t bits = probe_cpu_features().bits;
  struct Pair {
    uint32_t ours;
    bool theirs;
  };
  const Pair pairs[] = {
      {QMOE_CPU_FEATURE_AVX, cpuinfo_has_x86_avx()},
      {QMOE_CPU_FEATURE_AVX2, cpuinfo_has_x86_avx2()},
      {QMOE_CPU_FEATURE_FMA, cpuinfo_has_x86_fma3()},
      {QMOE_CPU_FEATURE_F16C, cpuinfo_has_x86_f16c()},
      {QMOE_CPU_FEATURE_AVX512F, cpuinfo_has_x86_avx512f()},
      {QMOE_CPU_FEATURE_AVX512BW, cpuinfo_has_x86_avx512bw()},
      {QMOE_CPU_FEATURE_AVX512DQ, cpuinfo_has_x86_avx512dq()},
      {QMOE_CPU_FEATURE_AVX512VL, cpuinfo_has_x86_avx512vl()},
      {QMOE_CPU_FEATURE_AVX512VNNI, cpuinfo_has_x86_avx512vnni()},
      {QMOE_CPU_FEATURE_AVX512BF16, cpuinfo_has_x86_avx512bf16()},
      {QMOE_CPU_FEATURE_AVX512VBMI, cpuinfo_has_x86_avx512vbmi()},
      {QMOE_CPU_FEATURE_GFNI, cpuinfo_has_x86_gfni()},
      // cpuinfo 2022 (Debian 12) does not report AVX-VNNI; nothing to compare it with.
  };
  for (const Pair& p : pairs) {
    EXPECT_EQ((bits & p.ours) != 0, p.theirs) << qmoe_cpu_feature_name(p.ours) << ": probe "
                                              << ((bits & p.ours) != 0) << ", cpuinfo " << p.theirs;
  }
}

// The vendor string picks per-host stream tuning (lib/gemm/stream_tuning.h): it must name the same
// vendor cpuinfo does.
TEST(CpuFeatures, VendorAgreesWithCpuinfo) {
  ASSERT_TRUE(cpuinfo_initialize());
  ASSERT_GT(cpuinfo_get_processors_count(), 0u);
  const cpuinfo_vendor theirs = cpuinfo_get_processor(0)->core->vendor;
  const std::string ours = probe_cpu_features().vendor;
  EXPECT_EQ(ours == "GenuineIntel", theirs == cpuinfo_vendor_intel) << ours;
  EXPECT_EQ(ours == "AuthenticAMD", theirs == cpuinfo_vendor_amd) << ours;
  EXPECT_EQ(int4_l2_prefetch_bytes(), ours == "GenuineIntel" ? 8192u : 0u);
}

TEST(CpuFeatures, ProbeIsStableAndCached) {
  EXPECT_EQ(probe_cpu_features().bits, host_cpu_features().bits);
  EXPECT_EQ(&host_cpu_features(), &host_cpu_features());
}

TEST(CpuFeatures, BrandStringIsPrintableAndTrimmed) {
  const char* brand = host_cpu_features().brand;
  for (const char* c = brand; *c; ++c) EXPECT_TRUE(*c >= 0x20 && *c < 0x7f) << brand;
  if (*brand) {
    EXPECT_NE(brand[0], ' ');
    EXPECT_NE(brand[std::strlen(brand) - 1], ' ');
  }
}

TEST(TierGates, EachTierNeedsExactlyItsFeatures) {
  const uint32_t avx2 =
      QMOE_CPU_FEATURE_AVX | QMOE_CPU_FEATURE_AVX2 | QMOE_CPU_FEATURE_FMA | QMOE_CPU_FEATURE_F16C;
  const uint32_t avx512 = avx2 | QMOE_CPU_FEATURE_AVX512F | QMOE_CPU_FEATURE_AVX512BW |
                          QMOE_CPU_FEATURE_AVX512DQ | QMOE_CPU_FEATURE_AVX512VL;
  EXPECT_TRUE(isa_runs_on(Isa::kScalar, 0));
  EXPECT_TRUE(isa_runs_on(Isa::kAvx2, avx2));
  EXPECT_TRUE(isa_runs_on(Isa::kAvx512, avx512));
  // Dropping any single required feature disables the tier (a Haswell without F16C, a
  // Knights Landing without BW/DQ/VL, an OS that does not save ZMM state...).
  for (uint32_t bit = 1; bit <= QMOE_CPU_FEATURE_GFNI; bit <<= 1) {
    if (avx2 & bit) {
      EXPECT_FALSE(isa_runs_on(Isa::kAvx2, avx2 & ~bit)) << bit;
    }
    if (avx512 & bit) {
      EXPECT_FALSE(isa_runs_on(Isa::kAvx512, avx512 & ~bit)) << bit;
    }
  }
  // Narrow extras are not tier requirements.
  EXPECT_EQ(isa_required_features(Isa::kAvx512) & QMOE_CPU_FEATURE_AVX512VNNI, 0u);
}

TEST(TierGates, AvailabilityFollowsTheProbe) {
  const uint32_t bits = host_cpu_features().bits;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
#if defined(QMOE_HAVE_X86_TIERS)
    const bool expected = isa_runs_on(isa, bits);
#else
    const bool expected = isa == Isa::kScalar;
#endif
    EXPECT_EQ(kernel_table_for_isa(isa) != nullptr, expected) << isa_name(isa);
    EXPECT_EQ(isa_unavailable_reason(isa) == nullptr, expected) << isa_name(isa);
  }
  EXPECT_NE(kernel_table_for_isa(best_supported_isa()), nullptr);
}

// Which tiers are available, against the test's own reading of cpuinfo's flags
// (tests/expected_tier.h) rather than the library's gates: every tier up to the expected best.
TEST(TierGates, AvailabilityMatchesCpuinfo) {
  const Isa best = testing::expected_best_tier();
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    const bool expected = static_cast<int>(isa) <= static_cast<int>(best);
    EXPECT_EQ(kernel_table_for_isa(isa) != nullptr, expected) << isa_name(isa);
  }
  EXPECT_STREQ(isa_name(best_supported_isa()), isa_name(best));
}

// The tier and extension suffix each assembled entry must carry, written here, not computed by
// the library: on this host, a tier takes an extension's kernel exactly when the host has it.
std::string expected_suffix(Isa tier, bool extension_kernel) {
  const uint32_t have = host_cpu_features().bits;
  switch (tier) {
    case Isa::kScalar:
      return "__scalar";
    case Isa::kAvx2:
      return extension_kernel && (have & QMOE_CPU_FEATURE_AVXVNNI) ? "__avxvnni" : "__avx2";
    case Isa::kAvx512:
      return extension_kernel && (have & QMOE_CPU_FEATURE_AVX512VNNI) ? "__avx512vnni" : "__avx512";
  }
  return "?";
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

TEST(Dispatch, AssembledTablesAreCompleteAndNamedByTheirTier) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    const KernelTable* table = kernel_table_for_isa(isa);
    if (table == nullptr) continue;
#define QMOE_CHECK_ENTRY_(member, type)                                                     \
  EXPECT_NE(table->member.fn, nullptr) << isa_name(isa) << " " #member;                     \
  ASSERT_NE(table->member.name, nullptr) << isa_name(isa) << " " #member;                   \
  EXPECT_EQ(std::string(table->member.name), "qmoe_" #member + expected_suffix(isa, false)) \
      << isa_name(isa);
    QMOE_CPU_OPS(QMOE_CHECK_ENTRY_)
#undef QMOE_CHECK_ENTRY_
    // INT4: the exact kernel is the tier's own; the fast one the VNNI extension's when the host
    // has it (the kernel list's avxvnni and avx512vnni rows).
    const auto& exact = gemm_kernel(*table, QMOE_WEIGHT_FORMAT_INT4, QMOE_ACCURACY_EXACT);
    const auto& fast = gemm_kernel(*table, QMOE_WEIGHT_FORMAT_INT4, QMOE_ACCURACY_FAST);
    ASSERT_NE(exact.fn, nullptr);
    ASSERT_NE(fast.fn, nullptr);
    EXPECT_EQ(std::string(exact.name), "qmoe_gemm_int4_exact_8x32" + expected_suffix(isa, false));
    EXPECT_EQ(std::string(fast.name), "qmoe_gemm_int4_fast_8x32" + expected_suffix(isa, true));
    // And every entry's function is the one its name belongs to (a table can carry the right
    // names over another ISA's functions).
    EXPECT_EQ(testing::check_tier_kernels(isa, *table, "Dispatch"), 0);
  }
  // Every tier's table is assembled once: the same pointer on every call.
  EXPECT_EQ(kernel_table_for_isa(Isa::kScalar), kernel_table_for_isa(Isa::kScalar));
}

TEST(Dispatch, EveryListedKernelIsInItsIsaTableUnderItsName) {
  ASSERT_GT(cpu_kernel_count(), 0u);
  for (uint32_t i = 0; i < cpu_kernel_count(); ++i) {
    const CpuKernelInfo& k = cpu_kernel_at(i);
    const CpuIsaInfo& isa = cpu_isa_info(k.isa);
    EXPECT_TRUE(ends_with(k.name, std::string("__") + isa.name)) << k.name;
    const char* table_name = nullptr;
    if (std::string(k.op) == "gemm") {
      table_name = gemm_kernel(*isa.table, k.format, k.accuracy).name;
    } else {
#define QMOE_FIND_ENTRY_(member, type) \
  if (std::string(k.op) == #member) table_name = isa.table->member.name;
      QMOE_CPU_OPS(QMOE_FIND_ENTRY_)
#undef QMOE_FIND_ENTRY_
    }
    EXPECT_STREQ(table_name, k.name);
  }
}

TEST(Dispatch, BuiltTiersFollowTheArchitecture) {
#if defined(QMOE_HAVE_X86_TIERS)
  ASSERT_EQ(built_tier_count(), 3u);
  EXPECT_EQ(built_tier_at(1), Isa::kAvx2);
  EXPECT_EQ(built_tier_at(2), Isa::kAvx512);
#else
  ASSERT_EQ(built_tier_count(), 1u);
#endif
  EXPECT_EQ(built_tier_at(0), Isa::kScalar);
}

TEST(Dispatch, ParseIsaName) {
  Isa isa = Isa::kScalar;
  EXPECT_TRUE(parse_isa_name("AVX2", &isa));
  EXPECT_EQ(isa, Isa::kAvx2);
  EXPECT_TRUE(parse_isa_name("avx512", &isa));
  EXPECT_EQ(isa, Isa::kAvx512);
  EXPECT_TRUE(parse_isa_name("scalar", &isa));
  EXPECT_EQ(isa, Isa::kScalar);
  EXPECT_FALSE(parse_isa_name("sse4", &isa));
  EXPECT_FALSE(parse_isa_name("", &isa));
  EXPECT_FALSE(parse_isa_name(nullptr, &isa));
}

}  // namespace
}  // namespace qmoe
