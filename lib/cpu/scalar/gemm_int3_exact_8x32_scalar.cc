// Scalar INT3 dequant-GEMM, exact level: the reference every SIMD tier is compared with, and the
// only path on non-x86 hosts. One call computes rows [row_begin, row_end) of one 8-row group;
// the numerics are the INT4 scalar kernel's (docs/formats.md, "Accuracy levels").
#include "lib/cpu/kernels.h"
#include "lib/formats/int3_layout.h"
#include "lib/gemm/group_args.h"

namespace qmoe::scalar {
namespace {
#include "lib/cpu/scalar/gemm_int3_8x32_scalar.inc"
#include "lib/cpu/scalar/gemm_integer_8x32_scalar.inc"
}  // namespace

void gemm_int3_exact_8x32(const GemmGroupArgs& a) {
  integer_exact_8x32<Int3Codes>(a);
}

}  // namespace qmoe::scalar
