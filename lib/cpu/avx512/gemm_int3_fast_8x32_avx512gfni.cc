// AVX512-VNNI + GFNI INT3 dequant-GEMM, fast level: the AVX512-VNNI kernel with each unpacking
// shift-and-mask done by one vgf2p8affineqb (int3_unpack_gfni_zmm.inc). The unpacked codes are
// the same bytes, so the bits are the AVX-512 kernel's. Compiled with -mavx512vnni -mgfni in its
// own translation unit (the compiler may emit either anywhere in a file built with those flags);
// the table entry is taken only when the probe reports both (Ice Lake and Zen 4 onwards).
#include <type_traits>

#include "lib/cpu/avx512/immintrin_avx512.h"
#include "lib/cpu/common/int4_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/int3_layout.h"

namespace qmoe::avx512gfni {
namespace {
#include "lib/cpu/avx512/int3_pair_dots_dpbusd_zmm.inc"
#include "lib/cpu/avx512/int3_unpack_gfni_zmm.inc"
}  // namespace

// Defines gemm_int3_fast_8x32 (and its templates) in this namespace.
#include "lib/cpu/avx512/gemm_int3_fast_8x32_avx512.inc"

}  // namespace qmoe::avx512gfni
