// Prototypes of every CPU kernel, generated from lib/cpu/kernel_list.inc: kernel <op> of ISA
// <isa> is qmoe::<isa>::<op>, GEMM kernels qmoe::<isa>::gemm_<format>_<accuracy>_<tile>, each
// with the signature of its table entry (lib/cpu/kernel_table.h). Each ISA's folder defines its
// own; a definition whose signature drifts from its entry's fails to link.
//
// Declarations only: included by translation units of every ISA's flags.
#ifndef QMOE_LIB_CPU_KERNELS_H_
#define QMOE_LIB_CPU_KERNELS_H_

#include <type_traits>

#include "lib/cpu/kernel_table.h"

#define QMOE_CPU_KERNEL(isa, op)                                         \
  namespace qmoe::isa {                                                  \
  std::remove_pointer_t<decltype(::qmoe::KernelTable::op)::Function> op; \
  }
#define QMOE_CPU_GEMM_KERNEL(isa, format, accuracy, tile)                         \
  namespace qmoe::isa {                                                           \
  std::remove_pointer_t<::qmoe::GemmGroupFn> gemm_##format##_##accuracy##_##tile; \
  }
#include "lib/cpu/kernel_list.inc"
#undef QMOE_CPU_GEMM_KERNEL
#undef QMOE_CPU_KERNEL

#endif  // QMOE_LIB_CPU_KERNELS_H_
