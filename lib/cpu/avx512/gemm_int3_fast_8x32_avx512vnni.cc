// AVX512-VNNI INT3 dequant-GEMM, fast level: the AVX-512 kernel (gemm_int3_fast_8x32_avx512.cc:
// the 256-bit body of gemm_int3_fast_ymm.inc with the tier's flags) with its dot products done
// by the EVEX vpdpbusd (int3_row_sums_dpbusd.inc), the same exact sums in the same lane order.
// It pays from M = 2 up, where the products dominate (about 10% at M = 4); at M = 1 the stream
// does (docs/results/2026-12-01-int3-layout.md). Compiled with -mavx512vnni in its own
// translation unit (the compiler may emit VNNI anywhere in a file built with that flag); the
// table entry is taken only when the probe reports AVX512-VNNI.
#include <type_traits>

#include "lib/cpu/avx512/immintrin_avx512.h"
#include "lib/cpu/common/int4_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/int3_layout.h"

namespace qmoe::avx512vnni {
namespace {
#include "lib/cpu/common/int3_row_sums_dpbusd.inc"
}  // namespace

// Defines gemm_int3_fast_8x32 (and its templates) in this namespace.
#include "lib/cpu/common/gemm_int3_fast_ymm.inc"

}  // namespace qmoe::avx512vnni
