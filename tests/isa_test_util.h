// Parameterisation of kernel tests over ISA tiers (Highway style): every test suite is
// instantiated once per tier and named by it (".../avx2"), and a tier the build or host cannot
// run is skipped with the reason, so a log shows exactly which paths were covered.
#ifndef QMOE_TESTS_ISA_TEST_UTIL_H_
#define QMOE_TESTS_ISA_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <ostream>
#include <random>
#include <string>

#include "lib/dispatch.h"

namespace qmoe {
// Names the tier in test listings ("GetParam() = avx2" instead of raw bytes).
inline void PrintTo(Isa isa, std::ostream* os) {
  *os << isa_name(isa);
}
}  // namespace qmoe

namespace qmoe::testing {

/// The seed of a randomised test: QMOE_TEST_SEED when set (to replay a failure; tests print the
/// seed they used), a fresh random one otherwise.
inline uint64_t fresh_seed() {
  if (const char* s = std::getenv("QMOE_TEST_SEED")) return std::strtoull(s, nullptr, 0);
  return std::random_device{}() ^ (uint64_t{std::random_device{}()} << 32);
}

inline const Isa kAllIsas[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512};

/// A context owned by the test: destroyed at scope exit.
struct ContextDeleter {
  void operator()(qmoe_context* c) const { qmoe_context_destroy(c); }
};
using ContextPtr = std::unique_ptr<qmoe_context, ContextDeleter>;

/// A context capped at `isa` with `threads` pool threads (0 = default); fails the test if the
/// library refuses.
inline ContextPtr make_context(Isa isa, uint32_t threads) {
  qmoe_context_options o;
  qmoe_context_options_init(&o);
  o.max_isa = static_cast<qmoe_isa>(isa);
  o.num_threads = threads;
  qmoe_context* raw = nullptr;
  EXPECT_EQ(qmoe_context_create(&o, &raw), QMOE_STATUS_OK) << qmoe_last_error_message();
  return ContextPtr(raw);
}

inline std::string IsaParamName(const ::testing::TestParamInfo<Isa>& info) {
  return isa_name(info.param);
}

/// Base fixture: GetParam() is the tier; table() its assembled kernel table.
class IsaTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    const char* reason = isa_unavailable_reason(GetParam());
    if (reason != nullptr) {
      GTEST_SKIP() << "tier " << isa_name(GetParam()) << " skipped: " << reason;
    }
    table_ = kernel_table_for_isa(GetParam());
    ASSERT_NE(table_, nullptr);
  }
  const KernelTable& table() const { return *table_; }

 private:
  const KernelTable* table_ = nullptr;
};

}  // namespace qmoe::testing

#define QMOE_INSTANTIATE_ISA_TEST_SUITE(suite)                                         \
  INSTANTIATE_TEST_SUITE_P(Isa, suite, ::testing::ValuesIn(::qmoe::testing::kAllIsas), \
                           ::qmoe::testing::IsaParamName)

#endif  // QMOE_TESTS_ISA_TEST_UTIL_H_
