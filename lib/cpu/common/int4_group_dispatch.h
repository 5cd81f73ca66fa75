// One dispatch from an INT4 kernel's run-time variants to its compile-time ones, for every
// SIMD INT4 kernel file: the scale dtype, whether a zero-point plane is present, and whether
// the block size is 16 (two scales per 32-code chunk) become template arguments of the file's
// group function, so its inner loop carries no branch on them. Also the scale element size
// those kernels index their planes with.
//
// Internal linkage (an unnamed namespace): this header is compiled under every tier's flags,
// and an inline function with external linkage would leave the linker free to keep one tier's
// copy for all (docs/dispatch.md, "Flags never leak").
#ifndef QMOE_LIB_CPU_COMMON_INT4_GROUP_DISPATCH_H_
#define QMOE_LIB_CPU_COMMON_INT4_GROUP_DISPATCH_H_

#include <cstddef>
#include <type_traits>

#include "lib/formats/int4_layout.h"
#include "lib/gemm/group_args.h"

namespace qmoe {
namespace {

/// Bytes of one scale element of dtype kScale (FP32: 4; FP16, BF16: 2).
template <qmoe_dtype kScale>
constexpr size_t sizeof_scale() {
  return kScale == QMOE_DTYPE_F32 ? 4 : 2;
}

/// Calls group(scale, zeros, block16) with std::integral_constant arguments:
/// scale::value is a.scale_dtype, zeros::value is a.zero_points != nullptr, block16::value is
/// a.block_size == 16. A kernel entry point reads
///   dispatch_int4_group(a, [&a](auto s, auto z, auto b16) {
///     group<decltype(s)::value, decltype(z)::value, decltype(b16)::value>(a);
///   });
template <typename GroupFn>
inline void dispatch_int4_group(const GemmGroupArgs& a, GroupFn&& group) {
  const auto with_scale = [&](auto scale) {
    if (a.zero_points != nullptr) {
      if (a.block_size == 16) {
        group(scale, std::true_type{}, std::true_type{});
      } else {
        group(scale, std::true_type{}, std::false_type{});
      }
    } else if (a.block_size == 16) {
      group(scale, std::false_type{}, std::true_type{});
    } else {
      group(scale, std::false_type{}, std::false_type{});
    }
  };
  switch (a.scale_dtype) {
    case QMOE_DTYPE_F16:
      with_scale(std::integral_constant<qmoe_dtype, QMOE_DTYPE_F16>{});
      break;
    case QMOE_DTYPE_BF16:
      with_scale(std::integral_constant<qmoe_dtype, QMOE_DTYPE_BF16>{});
      break;
    case QMOE_DTYPE_F32:
      with_scale(std::integral_constant<qmoe_dtype, QMOE_DTYPE_F32>{});
      break;
    case QMOE_DTYPE_E8M0:
    case QMOE_DTYPE_F8_E4M3:
      break;  // no INT4 scale type: its traits row refuses them (lib/formats/int4_format.cc)
  }
}

}  // namespace
}  // namespace qmoe

#endif  // QMOE_LIB_CPU_COMMON_INT4_GROUP_DISPATCH_H_
