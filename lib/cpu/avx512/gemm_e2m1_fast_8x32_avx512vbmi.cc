// AVX512-VBMI MXFP4 and NVFP4 dequant-GEMMs, fast level: the AVX512-VNNI kernels
// (gemm_{mxfp4,nvfp4}_fast_8x32_avx512vnni.cc) with each code looked up by vpermb straight from
// its byte (QMOE_E2M1_VPERMB): the table holds its 16 weights in every 16 bytes, so the bits
// above the nibble need no mask, one vpand fewer per 32 bytes of codes. The same integer sums,
// so the same bits as the VNNI and plain kernels. The extension exists for the E2M1 lookup, so
// both formats' entries live in this one translation unit, compiled with -mavx512vnni
// -mavx512vbmi; the table entries are taken only when the probe reports both features.
#include "lib/cpu/avx512/immintrin_avx512.h"

#include <cstdint>

#include "lib/cpu/common/e2m1_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/e2m1_layout.h"

namespace qmoe::avx512vbmi {
namespace {
#include "lib/cpu/common/e2m1_scales_ymm.inc"
}  // namespace

#define QMOE_E2M1_DPBUSD256 _mm256_dpbusd_epi32
#define QMOE_E2M1_DPBUSD512 _mm512_dpbusd_epi32
#define QMOE_E2M1_TRANSPOSED 1
#define QMOE_E2M1_VPERMB 1
#include "lib/cpu/common/gemm_e2m1_fast_ymm.inc"
// After the 256-bit body: the 512-bit file's entry runs M = 1 on it.
#include "lib/cpu/avx512/gemm_e2m1_fast_8x32_avx512.inc"
#undef QMOE_E2M1_VPERMB
#undef QMOE_E2M1_TRANSPOSED
#undef QMOE_E2M1_DPBUSD512
#undef QMOE_E2M1_DPBUSD256

void gemm_mxfp4_fast_8x32(const GemmGroupArgs& a) {
  e2m1_fast_group_avx512<Mxfp4Policy>(a);
}

void gemm_nvfp4_fast_8x32(const GemmGroupArgs& a) {
  e2m1_fast_group_avx512<Nvfp4Policy>(a);
}

}  // namespace qmoe::avx512vbmi
