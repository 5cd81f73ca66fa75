// AVX-512 NVFP4 dequant-GEMM, fast level, with NVFP4's policy: M = 1 through the 256-bit E2M1
// body (gemm_e2m1_fast_ymm.inc), from M = 2 up through the 512-bit one
// (gemm_e2m1_fast_8x32_avx512.inc); each file's comment has its layout and reduction.
//
// Why two bodies: at M = 1 the 512-bit body measured no faster (on Zen 4, which runs a 512-bit
// operation as two 256-bit halves, the work per chunk is the same;
// docs/results/2026-12-01-fp4-gemm.md); from M = 2 up the 512-bit body shares each chunk's
// unpacking and scales between twice as many rows per instruction.
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

#include "lib/cpu/common/gemm_e2m1_fast_ymm.inc"
// After the 256-bit body: the 512-bit file's entry runs M = 1 on it.
#include "lib/cpu/avx512/gemm_e2m1_fast_8x32_avx512.inc"

void gemm_nvfp4_fast_8x32(const GemmGroupArgs& a) {
  e2m1_fast_group_avx512<Nvfp4Policy>(a);
}

}  // namespace qmoe::avx512
