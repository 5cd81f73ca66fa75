// The NVFP4 traits row: E2M1 codes in the canonical nibble layout (lib/formats/e2m1_layout.h),
// block size 16 only, one FP8 E4M3 scale per block, no zero points, and the FP32 global scale
// (qmoe_quant_matrix::global_scale) multiplying every weight. Its importer is in
// nvfp4_import.cc.
#include "lib/formats/e2m1_layout.h"
#include "lib/formats/format_traits.h"

namespace qmoe {

const FormatTraits kNvfp4Format = {
    /*format=*/QMOE_WEIGHT_FORMAT_NVFP4,
    /*name=*/"nvfp4",
    /*code_bits=*/4,
    /*tile_row_bytes=*/kChunkRowBytes,
    /*block_sizes=*/kNvfp4BlockSize,
    /*scale_dtypes=*/1u << QMOE_DTYPE_F8_E4M3,
    /*zero_points=*/false,
    /*default_zero_point=*/0,  // none: E2M1 codes are signed values
    /*global_scale=*/true,
};

}  // namespace qmoe
