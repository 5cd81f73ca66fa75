// AVX2 NVFP4 dequant-GEMM, fast level: the 256-bit E2M1 body (gemm_e2m1_fast_ymm.inc, whose
// comment has the layout and reduction) with NVFP4's policy.
#include <immintrin.h>

#include <cstdint>

#include "lib/cpu/common/e2m1_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/e2m1_layout.h"

namespace qmoe::avx2 {
namespace {
#include "lib/cpu/common/e2m1_scales_ymm.inc"
}  // namespace

#include "lib/cpu/common/gemm_e2m1_fast_ymm.inc"

void gemm_nvfp4_fast_8x32(const GemmGroupArgs& a) {
  e2m1_fast_group<Nvfp4Policy>(a);
}

}  // namespace qmoe::avx2
