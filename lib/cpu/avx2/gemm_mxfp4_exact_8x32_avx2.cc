// AVX2 MXFP4 dequant-GEMM, exact level: the AVX2 E2M1 exact body (gemm_e2m1_exact_8x32_avx2.inc,
// whose comment has the conversion and reduction) with MXFP4's policy.
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "lib/cpu/common/e2m1_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/e2m1_layout.h"

namespace qmoe::avx2 {
namespace {
#include "lib/cpu/common/e2m1_scales_ymm.inc"
}  // namespace

#include "lib/cpu/avx2/gemm_e2m1_exact_8x32_avx2.inc"

void gemm_mxfp4_exact_8x32(const GemmGroupArgs& a) {
  e2m1_exact_group<Mxfp4Policy, &scalar::gemm_mxfp4_exact_8x32>(a);
}

}  // namespace qmoe::avx2
