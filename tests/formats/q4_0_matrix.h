// ggml Q4_0 rows imported into libqmoe for the importer's tests: the canonical INT4 codes, the
// FP16 scale plane in block-major order (row stride 1, block stride n) and the matrix that reads
// them. The matrix points into the vectors, so an ImportedQ4_0 is filled in place, not copied.
#ifndef QMOE_TESTS_FORMATS_Q4_0_MATRIX_H_
#define QMOE_TESTS_FORMATS_Q4_0_MATRIX_H_

#include <cstdint>
#include <vector>

#include "qmoe/qmoe.h"

namespace qmoe::testing {

struct ImportedQ4_0 {
  ImportedQ4_0() = default;
  ImportedQ4_0(const ImportedQ4_0&) = delete;
  ImportedQ4_0& operator=(const ImportedQ4_0&) = delete;

  std::vector<uint8_t> codes;
  std::vector<uint16_t> scales;
  qmoe_quant_matrix matrix{};
};

// Imports `q40` (n rows of k / 32 blocks of 18 bytes) into `out`; the importer's status.
inline qmoe_status import_q4_0_matrix(const std::vector<uint8_t>& q40, uint32_t n, uint32_t k,
                                      ImportedQ4_0* out) {
  size_t bytes = 0;
  const qmoe_status size_status =
      qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT4, n, k, &bytes);
  if (size_status != QMOE_STATUS_OK) return size_status;
  out->codes.assign(bytes, 0);
  out->scales.assign(size_t{n} * (k / 32), 0);
  const qmoe_status status =
      qmoe_import_int4_q4_0(q40.data(), n, k, out->codes.data(), bytes, out->scales.data(), 1, n);
  qmoe_quant_matrix& w = out->matrix;
  w = qmoe_quant_matrix{};
  w.struct_size = sizeof w;
  w.format = QMOE_WEIGHT_FORMAT_INT4;
  w.n = n;
  w.k = k;
  w.block_size = 32;
  w.codes = out->codes.data();
  w.scale_dtype = QMOE_DTYPE_F16;
  w.scales = out->scales.data();
  w.scale_row_stride = 1;
  w.scale_block_stride = n;
  return status;
}

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_FORMATS_Q4_0_MATRIX_H_
