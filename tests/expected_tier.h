// The tiers this host should get, worked out by the tests themselves: the best tier from
// cpuinfo's flags (not the library's CPUID probe), and the process default from this file's own
// reading of QMOE_MAX_ISA. Dispatch tests compare the library's answers with these, so a
// library that reported its own mistake back would not agree with itself.
#ifndef QMOE_TESTS_EXPECTED_TIER_H_
#define QMOE_TESTS_EXPECTED_TIER_H_

#include <cpuinfo.h>
#include <strings.h>

#include <cstdlib>

#include "lib/cpu/kernel_table.h"

namespace qmoe::testing {

/// The best tier by cpuinfo: AVX-512 needs F, BW, DQ and VL; AVX2 needs AVX, AVX2, FMA and F16C
/// (docs/dispatch.md); cpuinfo checks the OS's register state itself.
inline Isa expected_best_tier() {
#if defined(QMOE_HAVE_X86_TIERS)
  if (!cpuinfo_initialize()) return Isa::kScalar;
  const bool avx2 = cpuinfo_has_x86_avx() && cpuinfo_has_x86_avx2() && cpuinfo_has_x86_fma3() &&
                    cpuinfo_has_x86_f16c();
  const bool avx512 = avx2 && cpuinfo_has_x86_avx512f() && cpuinfo_has_x86_avx512bw() &&
                      cpuinfo_has_x86_avx512dq() && cpuinfo_has_x86_avx512vl();
  return avx512 ? Isa::kAvx512 : avx2 ? Isa::kAvx2 : Isa::kScalar;
#else
  return Isa::kScalar;
#endif
}

/// The process default: the best tier, capped by QMOE_MAX_ISA when it names a tier
/// ("scalar", "avx2", "avx512", any case); unset, empty or anything else leaves the best tier.
inline Isa expected_default_tier() {
  const Isa best = expected_best_tier();
  const char* env = std::getenv("QMOE_MAX_ISA");
  if (env == nullptr) return best;
  Isa cap = best;
  if (strcasecmp(env, "scalar") == 0) {
    cap = Isa::kScalar;
  } else if (strcasecmp(env, "avx2") == 0) {
    cap = Isa::kAvx2;
  } else if (strcasecmp(env, "avx512") == 0) {
    cap = Isa::kAvx512;
  }
  return static_cast<int>(cap) < static_cast<int>(best) ? cap : best;
}

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_EXPECTED_TIER_H_
