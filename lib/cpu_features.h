// Our own CPUID + XGETBV probe. cpuinfo supplies topology and caches; this probe decides the
// tiers, so the gate that enables a kernel checks exactly the features its flags enable.
#ifndef QMOE_LIB_CPU_FEATURES_H_
#define QMOE_LIB_CPU_FEATURES_H_

#include <cstdint>

#include "lib/cpu/kernel_table.h"

namespace qmoe {

struct CpuFeatures {
  uint32_t bits = 0;     // QMOE_CPU_FEATURE_*: the CPU reports it and XCR0 enables its state
  char brand[64] = {};   // CPUID 0x80000002..4, leading spaces trimmed
  char vendor[13] = {};  // CPUID 0 ("GenuineIntel", "AuthenticAMD", ...); "" when unknown
};

/// The host's features, probed once (thread-safe static init).
const CpuFeatures& host_cpu_features();

/// Probe now (no caching); exposed for tests.
CpuFeatures probe_cpu_features();

/// QMOE_CPU_FEATURE_* bits a tier requires (0 for scalar).
uint32_t isa_required_features(Isa isa);

/// Whether a feature set can run a tier (pure; tests feed synthetic feature sets).
inline bool isa_runs_on(Isa isa, uint32_t feature_bits) {
  const uint32_t required = isa_required_features(isa);
  return (feature_bits & required) == required;
}

}  // namespace qmoe

#endif  // QMOE_LIB_CPU_FEATURES_H_
