// Test entry point: prints which tiers this run covers before any test starts, so a log says
// up front what was and was not exercised.
#include <gtest/gtest.h>

#include <cstdio>

#include "lib/dispatch.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
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
