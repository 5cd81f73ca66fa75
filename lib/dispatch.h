// Tier selection and the assembled kernel tables.
//
// The tables for every tier the host supports are assembled on first use (a function-local
// static, so initialisation is thread-safe) and are immutable afterwards: a context stores a
// pointer to one of them and calls through it with no further checks.
#ifndef QMOE_LIB_DISPATCH_H_
#define QMOE_LIB_DISPATCH_H_

#include "lib/cpu/kernel_table.h"

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

/// Parse "scalar" | "avx2" | "avx512" (ASCII case-insensitive); false for anything else.
bool parse_isa_name(const char* text, Isa* isa);

/// Lower-case tier name ("scalar", "avx2", "avx512").
const char* isa_name(Isa isa);

/// Kernel name of a table entry by public slot; nullptr for an unknown slot.
const char* kernel_name(const KernelTable& table, qmoe_kernel_slot slot);

/// Public name of a slot ("convert_f16_to_f32"); nullptr for an unknown slot.
const char* kernel_slot_name(qmoe_kernel_slot slot);

/// Number of slots (the public qmoe_kernel_slot values are 0 .. count-1).
uint32_t kernel_slot_count();

}  // namespace qmoe

#endif  // QMOE_LIB_DISPATCH_H_
