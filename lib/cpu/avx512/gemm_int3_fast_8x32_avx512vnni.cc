// AVX512-VNNI INT3 dequant-GEMM, fast level: the 512-bit body (gemm_int3_fast_8x32_avx512.inc)
// with its products done by vpdpbusd (int3_pair_dots_dpbusd_zmm.inc), the same exact sums in the
// same lanes as the AVX-512 kernel's vpmaddubsw, so the same bits. Compiled with -mavx512vnni in
// its own translation unit (the compiler may emit VNNI anywhere in a file built with that flag);
// the table entry is taken only when the probe reports AVX512-VNNI.
#include <type_traits>

#include "lib/cpu/avx512/immintrin_avx512.h"
#include "lib/cpu/common/int4_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/int3_layout.h"

namespace qmoe::avx512vnni {
namespace {
#include "lib/cpu/avx512/int3_pair_dots_dpbusd_zmm.inc"
#include "lib/cpu/avx512/int3_unpack_zmm.inc"
}  // namespace

// Defines gemm_int3_fast_8x32 (and its templates) in this namespace.
#include "lib/cpu/avx512/gemm_int3_fast_8x32_avx512.inc"

}  // namespace qmoe::avx512vnni
