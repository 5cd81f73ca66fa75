// The INT3 traits row: unsigned 3-bit codes 0..7 in the canonical INT3 layout
// (lib/formats/int3_layout.h), any of the four block sizes, FP32/FP16/BF16 scales, optional
// zero points (0..7; default 4). Its importer is in int3_import.cc.
#include "lib/formats/format_traits.h"
#include "lib/formats/int3_layout.h"

namespace qmoe {

const FormatTraits kInt3Format = {
    /*format=*/QMOE_WEIGHT_FORMAT_INT3,
    /*name=*/"int3",
    /*code_bits=*/3,
    /*tile_row_bytes=*/kInt3TileRowBytes,
    /*block_sizes=*/16 | 32 | 64 | 128,
    /*scale_dtypes=*/(1u << QMOE_DTYPE_F32) | (1u << QMOE_DTYPE_F16) | (1u << QMOE_DTYPE_BF16),
    /*zero_points=*/true,
    /*default_zero_point=*/kInt3DefaultZeroPoint,
    /*global_scale=*/false,
};

}  // namespace qmoe
