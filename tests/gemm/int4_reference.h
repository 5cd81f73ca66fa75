// Test-side model of an INT4 matrix: random codes, scales with real FP16/BF16/FP32 bit
// patterns, optional zero points and bias, written into the canonical layout by an independent
// implementation of docs/formats.md, and an FP64 reference GEMM with the error bounds of both
// accuracy levels.
#ifndef QMOE_TESTS_INT4_REFERENCE_H_
#define QMOE_TESTS_INT4_REFERENCE_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "qmoe/qmoe.h"

namespace qmoe::testing {

// kGrouped: the group-strided order (per 8-row group, blocks x 8 elements; the last group
// padded to 8 rows), described with scale_group_stride / zero_point_group_stride.
enum class ScaleOrder { kRowMajor, kBlockMajor, kPaddedRowMajor, kGrouped };

struct Int4Options {
  uint32_t n = 8, k = 32, block_size = 32;
  qmoe_dtype scale_dtype = QMOE_DTYPE_F16;
  ScaleOrder scale_order = ScaleOrder::kBlockMajor;
  bool zero_points = false;
  ScaleOrder zero_point_order = ScaleOrder::kRowMajor;
  bool bias = false;
  qmoe_dtype bias_dtype = QMOE_DTYPE_F32;
  std::string describe() const;
};

/// A random INT4 matrix and the buffers that describe it.
struct Int4Matrix {
  Int4Options options;
  std::vector<uint8_t> code_values;  // [n][k], 0..15 (the truth)
  std::vector<double> scale_values;  // [n][blocks], exactly representable in scale_dtype
  std::vector<uint8_t> zero_values;  // [n][blocks], 0..15 (8 when absent)
  std::vector<double> bias_values;   // [n], exactly representable in bias_dtype (0 if none)

  std::vector<uint8_t> codes;  // canonical layout
  std::vector<unsigned char> scales;
  std::vector<uint8_t> zero_points;
  std::vector<unsigned char> bias;
  qmoe_quant_matrix desc{};

  double weight(uint32_t n, uint32_t k) const;
};

Int4Matrix make_int4_matrix(const Int4Options& options, std::mt19937_64& rng);

/// What makes a random matrix of this model: make_int4_matrix, or another format's with the
/// same options (make_int3_matrix, tests/gemm/int3_reference.h).
using Int4MatrixMaker = Int4Matrix (*)(const Int4Options& options, std::mt19937_64& rng);

/// Random options from the whole space the kernels take, for the randomised tests: every block
/// size, K a multiple of it up to `max_k`, N in 1..70, every scale dtype and order, zero points
/// (in any order) or none, bias (any dtype) or none.
Int4Options random_int4_options(std::mt19937_64& rng, uint32_t max_k);

/// N x K in block 32 with FP16 scales in the grouped order (the layout of the models' matrices
/// in the benchmarks), zero points (in the default order) and a bias where asked.
Int4Options grouped_int4_options(uint32_t n, uint32_t k, bool zero_points = false,
                                 bool bias = false);

/// The benchmarks' GEMV shapes in that layout: Qwen3-30B-A3B's expert projections (FC1
/// [1536, 2048], FC2 [2048, 768]) and gpt-oss's FC1 [5760, 2880] with a bias.
std::vector<Int4Options> benchmark_gemm_shapes();

/// Canonical byte offset and nibble of (n, k), from the layout formula in docs/formats.md.
size_t canonical_byte(uint32_t n, uint32_t k, uint32_t k_total);

struct Reference {
  std::vector<double> y;           // [m][n]
  std::vector<double> abs_sum;     // [m][n]: sum_k |x w|
  std::vector<double> fast_bound;  // [m][n]: documented fast-level bound
};

/// FP64 Y = X W^T + bias, and the per-output error bounds.
Reference reference_gemm(const Int4Matrix& w, const std::vector<float>& x, uint32_t m);

/// Random activations, a mix of magnitudes and signs.
std::vector<float> random_activations(uint32_t m, uint32_t k, std::mt19937_64& rng);

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_INT4_REFERENCE_H_
