// AVX2 INT3 dequant-GEMM, fast level, with vpmaddubsw products: the kernel body is in
// gemm_int3_fast_ymm.inc (its comment has the layout and the reduction); this file supplies the
// dot products (lib/cpu/common/int3_row_sums_maddubs.inc).
#include <immintrin.h>

#include <type_traits>

#include "lib/cpu/common/int4_group_dispatch.h"
#include "lib/cpu/common/int4_prefetch.h"
#include "lib/cpu/kernels.h"
#include "lib/formats/int3_layout.h"

namespace qmoe::avx2 {
namespace {
#include "lib/cpu/common/int3_row_sums_maddubs.inc"
}  // namespace

// Defines gemm_int3_fast_8x32 (and its templates) in this namespace.
#include "lib/cpu/common/gemm_int3_fast_ymm.inc"

}  // namespace qmoe::avx2
