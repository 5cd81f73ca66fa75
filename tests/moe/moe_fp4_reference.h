// Test-side model of a MoE layer with E2M1 experts (MXFP4 or NVFP4; gpt-oss's activation:
// interleaved gate and up, alpha 1.702, beta 1, limit 7, biases on both projections; NVFP4 with
// a global scale of 1/4), its CPU expert set, and the FP64 layer with a per-output tolerance
// (reference_fp4_moe). Shared by the CPU layer's test (moe_fp4_test.cc) and the GPU layer's
// (tests/cuda/moe_layer_emulation_test.cc, moe_layer_test.cu).
#ifndef QMOE_TESTS_MOE_MOE_FP4_REFERENCE_H_
#define QMOE_TESTS_MOE_MOE_FP4_REFERENCE_H_

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "qmoe/qmoe.h"
#include "tests/gemm/fp4_reference.h"

namespace qmoe::testing {

struct SetDeleter {
  void operator()(qmoe_expert_set* s) const { qmoe_expert_set_destroy(s); }
};

struct Fp4Experts {
  uint32_t experts, hidden, inter;
  float alpha = 1.702f, beta = 1.0f, limit = 7.0f;
  std::vector<Fp4Matrix> fc1, fc2;
  std::vector<const qmoe_quant_matrix*> fc1_desc, fc2_desc;
  std::unique_ptr<qmoe_expert_set, SetDeleter> set;
};

/// Random experts of `format` ([2 inter, hidden] FC1 in the grouped scale order, [hidden, inter]
/// FC2 row-major) and their CPU expert set (e->set; null after a failed EXPECT).
std::unique_ptr<Fp4Experts> make_fp4_experts(qmoe_weight_format format, uint32_t experts,
                                             uint32_t hidden, uint32_t inter, std::mt19937_64& rng);

/// The FP64 layer on X [m][hidden] and the routing ids/weights [m][k] (every expert run, y
/// starting from 0) into y [m][hidden], and each output's tolerance into tol (FP32 outputs;
/// a narrower output type adds its own rounding).
void reference_fp4_moe(const Fp4Experts& e, const std::vector<float>& x, uint32_t m,
                       const std::vector<int32_t>& ids, const std::vector<float>& weights,
                       uint32_t k, qmoe_accuracy level, std::vector<double>* y,
                       std::vector<double>* tol);

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_MOE_MOE_FP4_REFERENCE_H_
