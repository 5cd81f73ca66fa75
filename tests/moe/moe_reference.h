// Test-side model of a MoE layer: random INT4 (or INT3) experts (tests/gemm/int4_reference.h,
// int3_reference.h), their qmoe_expert_set_desc, and an FP64 reference of the layer with a
// per-output error bound derived from the per-GEMM bounds of docs/formats.md.
//
// The bound, per output y[t, n] (every term computed in FP64 from the reference values):
//  - FC1: |h' - h| <= e_h, the GEMM bound of the level (exact: 1e-5 * sum |x w|; fast: the
//    activation-rounding term plus that), per output row of FC1.
//  - SwiGLU: s(g) = g * sigmoid(alpha g) has |s'| <= 1.1 for every alpha (in x = alpha g,
//    s' = sigma(x) + x sigma(x) (1 - sigma(x)) lies in [-0.1, 1.1]), and the clamps are
//    1-Lipschitz, so |a' - a| <= 1.1 e_g (|u + beta| + e_u) + (|s(g)| + 1.1 e_g) e_u, plus the
//    FP32 evaluation, 4e-6 (|s(g)| + 1.1 e_g) (|u| + |beta| + e_u).
//  - FC2 on a' = a + da: sum_i |W2[n, i]| da_i, plus the level's GEMM bound evaluated with
//    |a| + da in place of |a'| (fast: chunk steps from max(|a| + da) / 127).
//  - Combine: sum_j |w_j| (FC2 error of slot j), plus 1e-6 (sum_j |w_j y2_j| + |y0|) for the
//    FP32 products and sums.
#ifndef QMOE_TESTS_MOE_REFERENCE_H_
#define QMOE_TESTS_MOE_REFERENCE_H_

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "qmoe/qmoe.h"
#include "tests/gemm/int4_reference.h"

namespace qmoe::testing {

struct MoeOptions {
  uint32_t experts = 6, hidden = 64, intermediate = 32;
  qmoe_swiglu_fusion fusion = QMOE_SWIGLU_INTERLEAVED;
  float alpha = 1.0f, beta = 0.0f, limit = INFINITY;
  // Layout options of every projection (n, k are set from the shape).
  Int4Options fc1, fc2;
  std::string describe() const;
};

/// gpt-oss activation parameters (alpha 1.702, beta 1, limit 7) and Qwen3's (1, 0, none).
void use_gpt_oss_swiglu(MoeOptions* o);
void use_qwen3_swiglu(MoeOptions* o);

/// A layer of `experts` experts, H = hidden and I = intermediate, the other options default.
MoeOptions moe_shape(uint32_t experts, uint32_t hidden, uint32_t intermediate);

/// Small layers the GPU layer tests (tests/cuda) share, 6 experts each, default SwiGLU:
///  - a: H = 80, I = 48 (block 16: H % 32 == I % 32 == 16, half-filled last chunks), zero
///    points in both projections, FC1 BF16 scales in the grouped order and a bias, FC2 FP16
///    row-major scales and block-major zero points;
///  - b: H = 96, I = 64, FC1 block 32 with FP16 row-major scales, FC2 block 64 with FP32
///    block-major scales and an FP16 bias.
MoeOptions small_layer_a();
MoeOptions small_layer_b();
/// Qwen3-30B-A3B's layer shape with `experts` experts: H = 2048, I = 768, block 32 and FP16
/// scales in the grouped order in both projections, Qwen3's SwiGLU.
MoeOptions qwen3_layer(uint32_t experts);
/// The layer of the graph-replay tests: 8 experts, H = 64, I = 96, FC1 scales in the grouped
/// order, FC2 block 32 with zero points, gpt-oss's SwiGLU.
MoeOptions graph_replay_layer();

struct MoeModel {
  MoeOptions options;
  std::vector<Int4Matrix> fc1, fc2;
  std::vector<const qmoe_quant_matrix*> fc1_desc, fc2_desc;
  qmoe_expert_set_desc desc{};  // points into this object: do not copy a MoeModel
};

/// Random experts, each projection made by `make_matrix` with the options' layout (INT4, or
/// make_int3_matrix's INT3); the returned model is heap-allocated so its descriptors stay valid.
std::unique_ptr<MoeModel> make_moe_model(const MoeOptions& options, std::mt19937_64& rng,
                                         Int4MatrixMaker make_matrix = make_int4_matrix);

struct MoeReference {
  std::vector<double> y;    // [m][hidden]
  std::vector<double> tol;  // [m][hidden]
  size_t clamped = 0;       // SwiGLU inputs the limit changed (to check a test exercises it)
};

/// FP64 reference of qmoe_moe_forward: X [m][hidden] (row stride hidden), ids and weights
/// [m][k], an optional run mask, and y0 (the initial Y for accumulate, [m][hidden]) or empty.
MoeReference reference_moe(const MoeModel& model, qmoe_accuracy accuracy,
                           const std::vector<float>& x, uint32_t m, const std::vector<int32_t>& ids,
                           const std::vector<float>& weights, uint32_t k, const uint8_t* run_mask,
                           const std::vector<float>& y0);

/// reference_moe with expert e's projections at fc1[e] and fc2[e] (several experts may share
/// one matrix, so large expert counts need not hold a matrix each).
MoeReference reference_moe_experts(const MoeOptions& options,
                                   const std::vector<const Int4Matrix*>& fc1,
                                   const std::vector<const Int4Matrix*>& fc2,
                                   qmoe_accuracy accuracy, const std::vector<float>& x, uint32_t m,
                                   const std::vector<int32_t>& ids,
                                   const std::vector<float>& weights, uint32_t k,
                                   const uint8_t* run_mask, const std::vector<float>& y0);

/// reference_moe_experts with FP64 routing weights, each within weight_error[i] of the weight
/// the library uses (the error enters the bound).
MoeReference reference_moe_weighted(const MoeOptions& options,
                                    const std::vector<const Int4Matrix*>& fc1,
                                    const std::vector<const Int4Matrix*>& fc2,
                                    qmoe_accuracy accuracy, const std::vector<float>& x, uint32_t m,
                                    const std::vector<int32_t>& ids,
                                    const std::vector<double>& weights,
                                    const std::vector<double>& weight_error, uint32_t k,
                                    const uint8_t* run_mask, const std::vector<float>& y0);

/// Routing computed in the test, in FP64, from router logits [m][E], as docs/abi.md states it:
/// the k largest logits in descending order (equal logits: lower id first), weights
/// exp(l - max) / sum with the sum over the k selected (renormalize) or over all E. Independent
/// of qmoe_moe_route_topk, against which the MoE tests check the layer's own routing.
struct Fp64Routing {
  std::vector<int32_t> ids;          // [m][k]
  std::vector<double> weights;       // [m][k]
  std::vector<double> weight_error;  // [m][k]: bound on |the library's FP32 weight - weight|
};
Fp64Routing reference_route_topk(const std::vector<float>& logits, uint32_t m, uint32_t experts,
                                 uint32_t k, bool renormalize);

/// The layer's FP64 reference on that routing (no run mask).
MoeReference reference_moe_routed(const MoeModel& model, qmoe_accuracy accuracy,
                                  const std::vector<float>& x, uint32_t m,
                                  const Fp64Routing& routing, uint32_t k,
                                  const std::vector<float>& y0);

/// Random routing: k distinct experts per token, weights softmax-like and positive.
void random_routing(uint32_t m, uint32_t experts, uint32_t k, std::mt19937_64& rng,
                    std::vector<int32_t>* ids, std::vector<float>* weights);

/// Selections per expert of m tokens' routing (slots with a nonzero weight, whatever the
/// residency): what a layer call's expert_counts must hold.
std::vector<uint32_t> selections_per_expert(const std::vector<int32_t>& ids,
                                            const std::vector<float>& weights, uint32_t m,
                                            uint32_t k, uint32_t experts);

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_MOE_REFERENCE_H_
