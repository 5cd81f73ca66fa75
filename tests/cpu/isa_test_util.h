// Parameterisation of kernel tests over ISA tiers (Highway style) and over the rows of the kernel
// list (XNNPACK style): a suite is instantiated once per tier the build has, named by it
// (".../avx2"), or once per kernel of the list, named by its ISA; a tier or ISA the host cannot
// run is skipped with the reason, so a log shows exactly which paths were covered.
#ifndef QMOE_TESTS_ISA_TEST_UTIL_H_
#define QMOE_TESTS_ISA_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "lib/cpu/kernel_tables.h"
#include "lib/cpu_features.h"
#include "lib/dispatch.h"
#include "tests/cpu/tier_kernels.h"

namespace qmoe {
// Names the tier in test listings ("GetParam() = avx2" instead of raw bytes).
inline void PrintTo(Isa isa, std::ostream* os) {
  *os << isa_name(isa);
}
}  // namespace qmoe

namespace qmoe::testing {

namespace detail {
// The seeds the running test drew (tests/test_main.cc prints them under a failure).
struct SeedLog {
  std::mutex mutex;
  std::vector<uint64_t> seeds;
};
inline SeedLog& seed_log() {
  static SeedLog log;
  return log;
}
}  // namespace detail

/// The seed of a randomised test: QMOE_TEST_SEED when set (to replay a run: every draw then
/// gives that seed), a fresh random one otherwise. Every draw is printed with the line that
/// replays it, and tests/test_main.cc prints the test's seeds again under a failure. CI runs
/// the randomised tests under a fixed set of seeds as well (QMOE_TEST_FIXED_SEEDS in
/// tests/CMakeLists.txt), so a green CI run covers those seeds plus one fresh one.
inline uint64_t fresh_seed() {
  uint64_t seed = 0;
  const char* s = std::getenv("QMOE_TEST_SEED");
  if (s != nullptr && *s != '\0') {
    char* end = nullptr;
    seed = std::strtoull(s, &end, 0);
    if (*end != '\0') ADD_FAILURE() << "QMOE_TEST_SEED=\"" << s << "\" is not a number";
  } else {
    seed = std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
  }
  {
    std::lock_guard<std::mutex> lock(detail::seed_log().mutex);
    detail::seed_log().seeds.push_back(seed);
  }
  std::printf("[   SEED   ] %llu (replay: QMOE_TEST_SEED=%llu)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  return seed;
}

/// The seeds drawn since the last call (tests/test_main.cc clears them at every test start).
inline std::vector<uint64_t> take_drawn_seeds() {
  std::lock_guard<std::mutex> lock(detail::seed_log().mutex);
  std::vector<uint64_t> out;
  out.swap(detail::seed_log().seeds);
  return out;
}

/// The tiers the build has (lib/cpu/isa_list.inc's base rows), lowest first.
inline std::vector<Isa> built_tiers() {
  std::vector<Isa> tiers;
  for (uint32_t i = 0; i < built_tier_count(); ++i) tiers.push_back(built_tier_at(i));
  return tiers;
}

/// The kernels of one ISA, straight from the list (not an assembled tier table).
inline const KernelTable& isa_kernels(CpuIsa isa) {
  return *cpu_isa_info(isa).table;
}
/// The scalar kernels: the reference of every other ISA.
inline const KernelTable& scalar_kernels() {
  return isa_kernels(CpuIsa::scalar);
}

/// The INT4 GEMM kernel of a table at `accuracy`.
inline GemmGroupFn int4_gemm(const KernelTable& table, qmoe_accuracy accuracy) {
  return gemm_kernel(table, QMOE_WEIGHT_FORMAT_INT4, accuracy).fn;
}

/// Why the host cannot run `isa` (its tier unavailable, or the extension's feature missing), or
/// nullptr when it can.
inline const char* cpu_isa_unavailable_reason(CpuIsa isa) {
  const CpuIsaInfo& info = cpu_isa_info(isa);
  if (const char* reason = isa_unavailable_reason(info.tier)) return reason;
  if ((host_cpu_features().bits & info.feature) != info.feature) {
    return "host lacks the extension's feature";
  }
  return nullptr;
}

/// The ISAs of the list that extend a tier (feature != 0), in list order.
inline std::vector<CpuIsa> extension_isas() {
  std::vector<CpuIsa> isas;
  for (uint32_t i = 0; i < kCpuIsaCount; ++i) {
    if (cpu_isa_info(static_cast<CpuIsa>(i)).feature != 0) isas.push_back(static_cast<CpuIsa>(i));
  }
  return isas;
}

/// A context owned by the test: destroyed at scope exit.
struct ContextDeleter {
  void operator()(qmoe_context* c) const { qmoe_context_destroy(c); }
};
using ContextPtr = std::unique_ptr<qmoe_context, ContextDeleter>;

/// A context capped at `isa` with `threads` pool threads (0 = default); fails the test if the
/// library refuses, or if the context's tier or kernels are not `isa`'s own
/// (tests/cpu/tier_kernels.h).
inline ContextPtr make_context(Isa isa, uint32_t threads) {
  qmoe_context_options o;
  qmoe_context_options_init(&o);
  o.max_isa = static_cast<qmoe_isa>(isa);
  o.num_threads = threads;
  qmoe_context* raw = nullptr;
  EXPECT_EQ(qmoe_context_create(&o, &raw), QMOE_STATUS_OK) << qmoe_last_error_message();
  if (raw != nullptr) check_context_kernels(raw, isa, "make_context");
  return ContextPtr(raw);
}

inline std::string IsaParamName(const ::testing::TestParamInfo<Isa>& info) {
  return isa_name(info.param);
}

/// Base fixture: GetParam() is the tier; table() its assembled kernel table. Every test on a
/// tier first checks that the table holds the tier's own kernels (tests/cpu/tier_kernels.h): a
/// tier whose table came from another tier's kernels would otherwise pass its numeric tests.
class IsaTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    const char* reason = isa_unavailable_reason(GetParam());
    if (reason != nullptr) {
      GTEST_SKIP() << "tier " << isa_name(GetParam()) << " skipped: " << reason;
    }
    table_ = kernel_table_for_isa(GetParam());
    ASSERT_NE(table_, nullptr);
    check_tier_kernels(GetParam(), *table_, "IsaTest");
  }
  const KernelTable& table() const { return *table_; }

 private:
  const KernelTable* table_ = nullptr;
};

}  // namespace qmoe::testing

#define QMOE_INSTANTIATE_ISA_TEST_SUITE(suite)                                              \
  INSTANTIATE_TEST_SUITE_P(Isa, suite, ::testing::ValuesIn(::qmoe::testing::built_tiers()), \
                           ::qmoe::testing::IsaParamName)

#endif  // QMOE_TESTS_ISA_TEST_UTIL_H_
