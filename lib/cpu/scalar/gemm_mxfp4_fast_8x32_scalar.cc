// Scalar MXFP4 dequant-GEMM, fast level: the shared E2M1 body (gemm_e2m1_8x32_scalar.inc) with
// MXFP4's policy.
#include <cstring>

#include "lib/cpu/common/e2m1_group_dispatch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/byte_scales.h"
#include "lib/formats/e2m1_layout.h"
#include "lib/gemm/group_args.h"

namespace qmoe::scalar {

#include "lib/cpu/scalar/gemm_e2m1_8x32_scalar.inc"

void gemm_mxfp4_fast_8x32(const GemmGroupArgs& a) {
  e2m1_fast<Mxfp4Policy>(a);
}

}  // namespace qmoe::scalar
