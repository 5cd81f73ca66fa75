// The per-ISA kernel tables and the kernel rows, generated from lib/cpu/kernel_list.inc. This
// translation unit is built with no -m flags: it only takes the kernels' addresses.
#include "lib/cpu/kernel_tables.h"

#include "lib/cpu/kernels.h"
#include "lib/dispatch.h"
#include "lib/formats/format_traits.h"

namespace qmoe {
namespace {

// The rows of one ISA as a table (a discarded `if constexpr` branch takes no address, so a
// table refers to its own ISA's kernels only).
template <CpuIsa kIsa>
constexpr KernelTable isa_table() {
  KernelTable t{};
#define QMOE_CPU_KERNEL(isa, op) \
  if constexpr (kIsa == CpuIsa::isa) t.op = {&::qmoe::isa::op, "qmoe_" #op "__" #isa};
#define QMOE_CPU_GEMM_KERNEL(isa, format, accuracy, tile)                                \
  if constexpr (kIsa == CpuIsa::isa) {                                                   \
    t.gemm[format_slot(list_format::format)][accuracy_slot(list_accuracy::accuracy)] = { \
        &::qmoe::isa::gemm_##format##_##accuracy##_##tile,                               \
        "qmoe_gemm_" #format "_" #accuracy "_" #tile "__" #isa};                         \
  }
#include "lib/cpu/kernel_list.inc"
#undef QMOE_CPU_GEMM_KERNEL
#undef QMOE_CPU_KERNEL
  return t;
}

#define QMOE_CPU_ISA(token, tier, feature) \
  constexpr KernelTable k_##token##_table = isa_table<CpuIsa::token>();
#include "lib/cpu/isa_list.inc"
#undef QMOE_CPU_ISA

constexpr CpuIsaInfo kIsas[] = {
#define QMOE_CPU_ISA(token, tier, feature) \
  {CpuIsa::token, #token, static_cast<Isa>(tier), feature, &k_##token##_table},
#include "lib/cpu/isa_list.inc"
#undef QMOE_CPU_ISA
};

constexpr CpuKernelInfo kKernels[] = {
#define QMOE_CPU_KERNEL(isa, op)                                                        \
  {CpuIsa::isa, #op, static_cast<qmoe_weight_format>(0), static_cast<qmoe_accuracy>(0), \
   "qmoe_" #op "__" #isa},
#define QMOE_CPU_GEMM_KERNEL(isa, format, accuracy, tile)             \
  {CpuIsa::isa, "gemm", list_format::format, list_accuracy::accuracy, \
   "qmoe_gemm_" #format "_" #accuracy "_" #tile "__" #isa},
#include "lib/cpu/kernel_list.inc"
#undef QMOE_CPU_GEMM_KERNEL
#undef QMOE_CPU_KERNEL
};

constexpr bool isas_in_order() {
  for (uint32_t i = 0; i < kCpuIsaCount; ++i) {
    if (static_cast<uint32_t>(kIsas[i].isa) != i) return false;
    // An ISA's tier never falls below an earlier one's: overlaying in list order then gives
    // each tier the kernels of its highest ISA.
    if (i > 0 && kIsas[i].tier < kIsas[i - 1].tier) return false;
  }
  return true;
}
static_assert(isas_in_order(), "isa_list.inc lists ISAs by ascending tier");

}  // namespace

const CpuIsaInfo& cpu_isa_info(CpuIsa isa) {
  return kIsas[static_cast<uint32_t>(isa)];
}

uint32_t cpu_kernel_count() {
  return sizeof(kKernels) / sizeof(kKernels[0]);
}

const CpuKernelInfo& cpu_kernel_at(uint32_t i) {
  return kKernels[i];
}

}  // namespace qmoe
