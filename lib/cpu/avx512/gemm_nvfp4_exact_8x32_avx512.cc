// AVX-512 NVFP4 dequant-GEMM, exact level: the AVX-512 E2M1 exact body
// (gemm_e2m1_exact_8x32_avx512.inc, whose comment has the table lookup and reduction) with
// NVFP4's policy.
#include "lib/cpu/avx512/immintrin_avx512.h"

#include <cstdint>

#include "lib/cpu/common/e2m1_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/e2m1_layout.h"

namespace qmoe::avx512 {
namespace {
#include "lib/cpu/common/e2m1_scales_ymm.inc"
}  // namespace

#include "lib/cpu/avx512/gemm_e2m1_exact_8x32_avx512.inc"

void gemm_nvfp4_exact_8x32(const GemmGroupArgs& a) {
  e2m1_exact_group<Nvfp4Policy>(a);
}

}  // namespace qmoe::avx512
