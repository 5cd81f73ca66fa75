// Test-side model of the E2M1 formats (MXFP4, NVFP4): decoders of E2M1 codes and of E8M0 and
// E4M3 bytes written from the OCP specifications (not from library code), random matrices
// written into the canonical nibble layout by an independent implementation of
// docs/formats.md, and an FP64 reference GEMM with the error bounds of both accuracy levels.
#ifndef QMOE_TESTS_GEMM_FP4_REFERENCE_H_
#define QMOE_TESTS_GEMM_FP4_REFERENCE_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "qmoe/qmoe.h"
#include "tests/gemm/int4_reference.h"

namespace qmoe::testing {

/// OCP MX v1.0 section 5.3.3, FP4 E2M1: sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0;
/// exponent 0 is subnormal (m * 0.5). No infinities or NaN.
double e2m1_value(uint8_t code);
/// OCP MX v1.0 section 5.4.1, E8M0: 2^(e - 127); 0xFF is NaN.
double e8m0_value(uint8_t e);
/// OCP 8-bit floating point (OFP8) v1.0, E4M3: sign bit 7, exponent bits 6-3 (bias 7),
/// mantissa bits 2-0; exponent 0 is subnormal (m / 8 * 2^-6); S.1111.111 is NaN; no
/// infinities (S.1111.110 = 448 is the largest).
double e4m3_value(uint8_t b);

/// The block size and scale type of an E2M1 format (32 / E8M0 or 16 / E4M3).
uint32_t fp4_block_size(qmoe_weight_format format);
qmoe_dtype fp4_scale_dtype(qmoe_weight_format format);
const char* fp4_format_name(qmoe_weight_format format);

struct Fp4Options {
  qmoe_weight_format format = QMOE_WEIGHT_FORMAT_MXFP4;
  uint32_t n = 8, k = 32;
  ScaleOrder scale_order = ScaleOrder::kGrouped;
  bool bias = false;
  qmoe_dtype bias_dtype = QMOE_DTYPE_F32;
  float global_scale = 0.0f;  // NVFP4: 0 (none) or a finite value > 0
  std::string describe() const;
};

/// A random E2M1 matrix and the buffers that describe it.
struct Fp4Matrix {
  Fp4Options options;
  std::vector<uint8_t> code_values;  // [n][k], 0..15 (the truth)
  std::vector<uint8_t> scale_bytes;  // [n][blocks], E8M0 or E4M3 bytes
  std::vector<double> bias_values;   // [n] (0 if none)

  std::vector<uint8_t> codes;  // canonical layout
  std::vector<uint8_t> scales;
  std::vector<unsigned char> bias;
  qmoe_quant_matrix desc{};

  double weight(uint32_t n, uint32_t k) const;
  /// Rewrites scale (n, b) in place (plane and truth).
  void set_scale(uint32_t n, uint32_t b, uint8_t byte);
  /// Rewrites code (n, k) in place (canonical bytes and truth).
  void set_code(uint32_t n, uint32_t k, uint8_t code);
};

/// Random codes (all 16), scales of weight-like magnitude (E8M0 2^-10 .. 2^3; E4M3 normal and
/// subnormal bytes, some negative), in `options`' order.
Fp4Matrix make_fp4_matrix(const Fp4Options& options, std::mt19937_64& rng);

/// Random options for the randomised tests: either format, K a multiple of its block up to
/// `max_k` (NVFP4: K % 32 == 16 included), N in 1..70, every scale order, bias or none, a
/// global scale or none (NVFP4).
Fp4Options random_fp4_options(std::mt19937_64& rng, uint32_t max_k);

/// FP64 Y = X W^T + bias and, per output, the documented error bounds (docs/formats.md).
struct Fp4Reference {
  std::vector<double> y;        // [m][n]
  std::vector<double> abs_sum;  // [m][n]: sum_k |x w|
  // exact: 1e-5 sum_k |x w|; fast: the activation-rounding term plus that; both plus one
  // rounding of the output, 2^-23 |y| (adding a bias, or the global scale, to a sum much smaller
  // than the result rounds at the result's magnitude).
  std::vector<double> exact_tol, fast_tol;
  double tol(qmoe_accuracy level, size_t i) const {
    return level == QMOE_ACCURACY_EXACT ? exact_tol[i] : fast_tol[i];
  }
};
Fp4Reference reference_gemm(const Fp4Matrix& w, const std::vector<float>& x, uint32_t m);

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_GEMM_FP4_REFERENCE_H_
