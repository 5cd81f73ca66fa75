// Tier selection and the assembled kernel tables.
//
// The tables for every tier the host supports are assembled on first use (a function-local
// static, so initialisation is thread-safe) and are immutable afterwards: a context stores a
// pointer to one of them and calls through it with no further checks.
#ifndef QMOE_LIB_DISPATCH_H_
#define QMOE_LIB_DISPATCH_H_

#include <cstdint>

#include "lib/cpu/kernel_table.h"
#include "lib/formats/format_traits.h"

namespace qmoe {

/// The assembled table for `isa`, or nullptr when the build or the host cannot run that tier.
const KernelTable* kernel_table_for_isa(Isa isa);

/// Why `isa` is unavailable ("host lacks avx512bw, avx512vl", "not built for this
/// architecture"), or nullptr when it is available. Static storage.
const char* isa_unavailable_reason(Isa isa);

/// Best tier the build and host support.
Isa best_supported_isa();

/// Process default: best_supported_isa() capped by QMOE_MAX_ISA, read once.
Isa default_isa();

/// QMOE_MAX_ISA as read at init ("" when unset), and why the default is below the best tier
/// or why the variable was ignored ("" when neither). Static storage.
const char* max_isa_env_value();
const char* default_isa_reason();

/// The tiers this build has (one per base row of lib/cpu/isa_list.inc), lowest first; the
/// host may still lack some of them.
uint32_t built_tier_count();
Isa built_tier_at(uint32_t i);

/// Parse a tier name ("scalar", "avx2", "avx512"; ASCII case-insensitive) of any tier the
/// public enum has; false for anything else.
bool parse_isa_name(const char* text, Isa* isa);

/// Lower-case tier name ("scalar", "avx2", "avx512").
const char* isa_name(Isa isa);

/// Index of an accuracy level in KernelTable::gemm (value - 1).
constexpr uint32_t accuracy_slot(qmoe_accuracy accuracy) {
  return static_cast<uint32_t>(accuracy) - 1;
}

/// The table's GEMM entry for a format and accuracy level that validation has accepted.
inline const KernelEntry<GemmGroupFn>& gemm_kernel(const KernelTable& table,
                                                   qmoe_weight_format format,
                                                   qmoe_accuracy accuracy) {
  return table.gemm[format_slot(format)][accuracy_slot(accuracy)];
}

}  // namespace qmoe

#endif  // QMOE_LIB_DISPATCH_H_
