// AVX-512 INT3 dequant-GEMM, fast level: the 512-bit body (gemm_int3_fast_8x32_avx512.inc, two
// chunks a vector) with shift-and-mask unpacking and vpmaddubsw products. The avx512vnni and
// avx512gfni kernels run the same body with other hooks and give the same bits.
#include <type_traits>

#include "lib/cpu/avx512/immintrin_avx512.h"
#include "lib/cpu/common/int4_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/int3_layout.h"

namespace qmoe::avx512 {
namespace {
#include "lib/cpu/avx512/int3_pair_dots_maddubs_zmm.inc"
#include "lib/cpu/avx512/int3_unpack_zmm.inc"
}  // namespace

// Defines gemm_int3_fast_8x32 (and its templates) in this namespace.
#include "lib/cpu/avx512/gemm_int3_fast_8x32_avx512.inc"

}  // namespace qmoe::avx512
