// The MXFP4 traits row (OCP Microscaling MXFP4): E2M1 codes in the canonical nibble layout
// (lib/formats/e2m1_layout.h), block size 32 only, one E8M0 scale per block, no zero points, no
// global scale. Its importers are in mxfp4_import.cc.
#include "lib/formats/e2m1_layout.h"
#include "lib/formats/format_traits.h"

namespace qmoe {

const FormatTraits kMxfp4Format = {
    /*format=*/QMOE_WEIGHT_FORMAT_MXFP4,
    /*name=*/"mxfp4",
    /*code_bits=*/4,
    /*tile_row_bytes=*/kChunkRowBytes,
    /*block_sizes=*/kMxfp4BlockSize,
    /*scale_dtypes=*/1u << QMOE_DTYPE_E8M0,
    /*zero_points=*/false,
    /*default_zero_point=*/0,  // none: E2M1 codes are signed values
    /*global_scale=*/false,
};

}  // namespace qmoe
