// AVX512-VNNI NVFP4 dequant-GEMM, fast level: the AVX-512 kernel's two bodies with the u8 x s8
// products done by vpdpbusd, which sums four products straight into an int32 lane. M = 1 runs
// the 256-bit body in its transposed form (gemm_e2m1_fast_ymm.inc: the chunk transposed once so
// that every row owns a lane, eight vpdpbusd per activation row and no reduction tree); from
// M = 2 up the 512-bit body with vpdpbusd in place of vpmaddubsw and the widening. Compiled with
// -mavx512vnni in its own translation unit; the table entry is taken only when the probe
// reports AVX512-VNNI.
#include "lib/cpu/avx512/immintrin_avx512.h"

#include <cstdint>

#include "lib/cpu/common/e2m1_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/e2m1_layout.h"

namespace qmoe::avx512vnni {
namespace {
#include "lib/cpu/common/e2m1_scales_ymm.inc"
}  // namespace

#define QMOE_E2M1_DPBUSD256 _mm256_dpbusd_epi32
#define QMOE_E2M1_DPBUSD512 _mm512_dpbusd_epi32
#define QMOE_E2M1_TRANSPOSED 1
#include "lib/cpu/common/gemm_e2m1_fast_ymm.inc"
// After the 256-bit body: the 512-bit file's entry runs M = 1 on it.
#include "lib/cpu/avx512/gemm_e2m1_fast_8x32_avx512.inc"
#undef QMOE_E2M1_TRANSPOSED
#undef QMOE_E2M1_DPBUSD512
#undef QMOE_E2M1_DPBUSD256

void gemm_nvfp4_fast_8x32(const GemmGroupArgs& a) {
  e2m1_fast_group_avx512<Nvfp4Policy>(a);
}

}  // namespace qmoe::avx512vnni
