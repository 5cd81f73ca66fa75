// AVX-VNNI INT4 dequant-GEMM, fast level: the AVX2 fast kernel (gemm_int4_fast_ymm.inc, whose
// comment has the layout and reduction) with the u8 x s8 dot products done by the VEX-encoded
// vpdpbusd, which sums four products straight into int32 lanes: two instructions per pair of
// rows and chunk replace vpmaddubsw, vpmaddubsw, vpaddw and the widening vpmaddwd. Compiled
// with -mavxvnni in its own translation unit (the compiler may emit VNNI anywhere in a file
// built with that flag); the table entry is taken only when the probe reports AVX-VNNI.
#include <cstring>
#include <type_traits>

#include <immintrin.h>

#include "lib/cpu/common/int4_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/int4_layout.h"

namespace qmoe::avxvnni {
namespace {

#define QMOE_INT4_DPBUSD256 _mm256_dpbusd_avx_epi32
#include "lib/cpu/common/int4_row_sums_dpbusd.inc"
#undef QMOE_INT4_DPBUSD256

}  // namespace

// Defines gemm_int4_fast_8x32 (and its templates) in this namespace.
#include "lib/cpu/common/gemm_int4_fast_ymm.inc"

}  // namespace qmoe::avxvnni
