// Importer into the canonical NVFP4 layout from ModelOpt's packed weights. The E4M3 scales
// ([N, K/16], "weight_scale") and the FP32 global scale ("weight_scale_2") are used as they
// are: a scale plane in place (or regrouped with qmoe_group_plane) and
// qmoe_quant_matrix::global_scale.
#include "lib/formats/nvfp4_import.h"

#include "lib/formats/e2m1_layout.h"
#include "lib/formats/format_traits.h"
#include "lib/formats/nibble_codes.h"

namespace qmoe {

qmoe_status import_nvfp4_modelopt(const char* function, const uint8_t* src, uint32_t n, uint32_t k,
                                  void* dst, size_t dst_bytes) {
  // uint8 [N, K/2], k = 2i in the low nibble of byte i and 2i + 1 in the high one (ModelOpt's
  // NVFP4QTensor.quantize packs (q[..., 1::2] << 4) | q[..., 0::2]).
  return import_nibble_pairs(function, kNvfp4Format, src, n, k, kNvfp4BlockSize, dst, dst_bytes);
}

}  // namespace qmoe
