// The INT4 traits row: unsigned 4-bit codes 0..15 in the canonical INT4 layout
// (lib/formats/int4_layout.h), any of the four block sizes, FP32/FP16/BF16 scales, optional
// zero points (default 8). Its importers are in int4_import.cc.
#include "lib/formats/format_traits.h"
#include "lib/formats/int4_layout.h"

namespace qmoe {

const FormatTraits kInt4Format = {
    /*format=*/QMOE_WEIGHT_FORMAT_INT4,
    /*name=*/"int4",
    /*code_bits=*/4,
    /*tile_row_bytes=*/kChunkRowBytes,
    /*block_sizes=*/16 | 32 | 64 | 128,
    /*scale_dtypes=*/(1u << QMOE_DTYPE_F32) | (1u << QMOE_DTYPE_F16) | (1u << QMOE_DTYPE_BF16),
    /*zero_points=*/true,
    /*default_zero_point=*/kInt4DefaultZeroPoint,
    /*global_scale=*/false,
};

}  // namespace qmoe
