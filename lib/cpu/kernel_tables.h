// The per-ISA kernel tables and the list of every kernel, both generated from
// lib/cpu/kernel_list.inc (lib/cpu/kernel_tables.cc). For dispatch, which overlays the tables
// into one per tier, and for tests and benchmarks, which run every kernel of the list.
#ifndef QMOE_LIB_CPU_KERNEL_TABLES_H_
#define QMOE_LIB_CPU_KERNEL_TABLES_H_

#include <cstdint>

#include "lib/cpu/kernel_table.h"

namespace qmoe {

struct CpuIsaInfo {
  CpuIsa isa;
  const char* name;          // "avx512vnni"
  Isa tier;                  // the tier whose flags (and gate) its files are built with
  uint32_t feature;          // QMOE_CPU_FEATURE_* the extension needs beyond its tier; 0 for a tier
  const KernelTable* table;  // the kernels this ISA provides
};

/// The ISAs of lib/cpu/isa_list.inc, in overlay order (index = CpuIsa value).
const CpuIsaInfo& cpu_isa_info(CpuIsa isa);

/// One row of lib/cpu/kernel_list.inc.
struct CpuKernelInfo {
  CpuIsa isa;
  const char* op;             // table member: "convert_f16_to_f32", ..., "gemm"
  qmoe_weight_format format;  // GEMM kernels: their format; 0 otherwise
  qmoe_accuracy accuracy;     // GEMM kernels: their level; 0 otherwise
  const char* name;           // "qmoe_gemm_int4_fast_8x32__avx512vnni"
};

/// Every kernel of the list, in list order.
uint32_t cpu_kernel_count();
const CpuKernelInfo& cpu_kernel_at(uint32_t i);

}  // namespace qmoe

#endif  // QMOE_LIB_CPU_KERNEL_TABLES_H_
