// The two E2M1 formats (MXFP4, NVFP4) as compile-time policies of the kernel bodies they share,
// and one dispatch from a call's scale plane to the body's compile-time scale type: the
// format's byte type read in place, or FP32 panels the GEMM driver decoded
// (lib/gemm/group_panels.cc).
//
// Internal linkage (an unnamed namespace): this header is compiled under every tier's flags
// (docs/dispatch.md, "Flags never leak").
#ifndef QMOE_LIB_CPU_COMMON_E2M1_GROUP_DISPATCH_H_
#define QMOE_LIB_CPU_COMMON_E2M1_GROUP_DISPATCH_H_

#include <type_traits>

#include "lib/formats/e2m1_layout.h"
#include "lib/gemm/group_args.h"

namespace qmoe {
namespace {

/// MXFP4: one E8M0 scale per 32 codes (one block per 32-code chunk).
struct Mxfp4Policy {
  static constexpr bool kBlock16 = false;
  static constexpr qmoe_dtype kByteScale = QMOE_DTYPE_E8M0;
  static constexpr bool kGlobalScale = false;
};

/// NVFP4: one E4M3 scale per 16 codes (two blocks per chunk: codes 0-15 and 16-31), and the
/// matrix's global scale.
struct Nvfp4Policy {
  static constexpr bool kBlock16 = true;
  static constexpr qmoe_dtype kByteScale = QMOE_DTYPE_F8_E4M3;
  static constexpr bool kGlobalScale = true;
};

/// Calls group(scale) with scale a std::integral_constant<qmoe_dtype, ...>: the format's byte
/// type or F32 (the only two a validated matrix of the format reaches a kernel with).
template <typename Format, typename GroupFn>
inline void dispatch_e2m1_group(const GemmGroupArgs& a, GroupFn&& group) {
  if (a.scale_dtype == QMOE_DTYPE_F32) {
    group(std::integral_constant<qmoe_dtype, QMOE_DTYPE_F32>{});
  } else {
    group(std::integral_constant<qmoe_dtype, Format::kByteScale>{});
  }
}

/// The factor the kernels multiply each output's sum by: the global scale for NVFP4, 1 for
/// MXFP4 (whose traits refuse one), times `unit` (what a kernel's weights were scaled by, as a
/// power of two, undone here).
template <typename Format>
inline float e2m1_output_scale(const GemmGroupArgs& a, float unit) {
  return Format::kGlobalScale ? unit * a.global_scale : unit;
}

}  // namespace
}  // namespace qmoe

#endif  // QMOE_LIB_CPU_COMMON_E2M1_GROUP_DISPATCH_H_
