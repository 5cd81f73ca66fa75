// Scalar INT4 dequant-GEMM kernels, both levels: the integer formats' scalar loops
// (gemm_integer_8x32_scalar.inc) on the INT4 tile.
#include "lib/cpu/kernels.h"
#include "lib/formats/int4_layout.h"
#include "lib/gemm/group_args.h"

namespace qmoe::scalar {
namespace {

// How the INT4 tile holds a row's codes (lib/formats/int4_layout.h): byte j of the row's 16
// holds code j in its low nibble and code j + 16 in its high one.
struct Int4Codes {
  static constexpr uint32_t kTileBytes = kChunkBytes;
  static constexpr uint32_t kDefaultZero = kInt4DefaultZeroPoint;
  static void unpack_row(const uint8_t* tile, uint32_t r, uint8_t codes[kChunkCodes]) {
    const uint8_t* bytes = tile + r * kChunkRowBytes;
    for (uint32_t j = 0; j < kChunkRowBytes; ++j) {
      codes[j] = bytes[j] & 0x0F;
      codes[j + 16] = bytes[j] >> 4;
    }
  }
};

#include "lib/cpu/scalar/gemm_integer_8x32_scalar.inc"

}  // namespace

void gemm_int4_exact_8x32(const GemmGroupArgs& a) {
  integer_exact_8x32<Int4Codes>(a);
}

void gemm_int4_fast_8x32(const GemmGroupArgs& a) {
  integer_fast_8x32<Int4Codes>(a);
}

}  // namespace qmoe::scalar
