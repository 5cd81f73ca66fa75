// Test-side model of an INT3 matrix: the INT4 model of tests/gemm/int4_reference.h (scales with
// real FP16/BF16/FP32 bit patterns in any plane order, optional zero points and bias, the FP64
// reference GEMM and both levels' error bounds, all of which read only the code, zero-point and
// scale values) with INT3 codes 0..7, zero points 0..7 (default 4), written into the canonical
// INT3 layout by an implementation of docs/formats.md's formula independent of the library's.
#ifndef QMOE_TESTS_GEMM_INT3_REFERENCE_H_
#define QMOE_TESTS_GEMM_INT3_REFERENCE_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "tests/gemm/int4_reference.h"

namespace qmoe::testing {

/// Where bit `bit` (0..2) of code (n, k) of a matrix with `k_total` columns lies in the
/// canonical INT3 codes: byte offset and bit within the byte (docs/formats.md, "INT3 weights").
struct Int3BitPosition {
  size_t byte;
  int bit;
};
Int3BitPosition int3_bit_position(uint32_t n, uint32_t k, uint32_t k_total, int bit);

/// The canonical INT3 codes of an n x k matrix of codes [n][k] (0..7), padding zero.
std::vector<uint8_t> pack_int3_canonical(const std::vector<uint8_t>& codes, uint32_t n, uint32_t k);

/// Code (n, k) read back from canonical INT3 codes.
uint8_t canonical_int3_code(const uint8_t* canonical, uint32_t n, uint32_t k, uint32_t k_total);

/// A random INT3 matrix (the Int4Matrix model, see above); `options` as for INT4.
Int4Matrix make_int3_matrix(const Int4Options& options, std::mt19937_64& rng);

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_GEMM_INT3_REFERENCE_H_
