// AVX-512 INT3 dequant-GEMM, fast level: the 256-bit body of the AVX2 kernel
// (gemm_int3_fast_ymm.inc, whose comment has the layout and the reduction) compiled with the
// AVX-512 tier's flags. With AVX-512VL the compiler merges the unpacking's AND/OR pairs into
// vpternlogd and keeps the M = 4 tile in 32 vector registers instead of 16.
//
// Why not a 512-bit body (four rows per vector, as the INT4 AVX-512 kernel from M = 2): the
// tile's rows 4-7 then need a lane shuffle and per-half shift counts (vpsrlvw) on top of the
// 256-bit form's operations, and on the development host (Zen 4, whose 512-bit operations issue
// as two 256-bit halves) such a body took 1.5x this one's time at M = 1 and 1.2x at M = 4
// (docs/results/2026-12-01-int3-layout.md).
#include <type_traits>

#include "lib/cpu/avx512/immintrin_avx512.h"
#include "lib/cpu/common/int4_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/int3_layout.h"

namespace qmoe::avx512 {
namespace {
#include "lib/cpu/common/int3_row_sums_maddubs.inc"
}  // namespace

// Defines gemm_int3_fast_8x32 (and its templates) in this namespace.
#include "lib/cpu/common/gemm_int3_fast_ymm.inc"

}  // namespace qmoe::avx512
