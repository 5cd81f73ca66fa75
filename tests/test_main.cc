// Test entry point: prints which tiers this run covers before any test starts, so a log says
// up front what was and was not exercised, and under every failed test the seeds it drew with
// the command that replays it (tests/cpu/isa_test_util.h's fresh_seed).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "lib/dispatch.h"
#include "tests/cpu/isa_test_util.h"

namespace {

class SeedReport : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo&) override { qmoe::testing::take_drawn_seeds(); }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const std::vector<uint64_t> seeds = qmoe::testing::take_drawn_seeds();
    if (seeds.empty() || !info.result()->Failed()) return;
    std::string list;
    for (uint64_t s : seeds) list += (list.empty() ? "" : ", ") + std::to_string(s);
    std::printf(
        "[   SEED   ] %s.%s failed with seed(s) %s; replay: QMOE_TEST_SEED=%llu "
        "qmoe_tests --gtest_filter='%s.%s'\n",
        info.test_suite_name(), info.name(), list.c_str(),
        static_cast<unsigned long long>(seeds.front()), info.test_suite_name(), info.name());
    std::fflush(stdout);
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new SeedReport);
  std::printf("libqmoe tests: tiers");
  for (qmoe::Isa isa : {qmoe::Isa::kScalar, qmoe::Isa::kAvx2, qmoe::Isa::kAvx512}) {
    const char* reason = qmoe::isa_unavailable_reason(isa);
    if (reason == nullptr) {
      std::printf(" %s=run", qmoe::isa_name(isa));
    } else {
      std::printf(" %s=skipped(%s)", qmoe::isa_name(isa), reason);
    }
  }
  std::printf("\n");
  return RUN_ALL_TESTS();
}
