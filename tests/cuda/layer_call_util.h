// The device side of the MoE layer tests' calls, through the kernels' launcher
// (moe_layer_test.cu) and through the C ABI (int3_decode_test.cu): the buffers of calls of up to
// a capacity of tokens, X and Y at row strides past H, Y poisoned between guards; and the check
// of the hybrid (offload) layer against its resident and CPU parts (offload_test.cu too).
#ifndef QMOE_TESTS_CUDA_LAYER_CALL_UTIL_H_
#define QMOE_TESTS_CUDA_LAYER_CALL_UTIL_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "qmoe/qmoe.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/moe/moe_reference.h"

namespace qmoe::testing {

/// The device buffers of layer calls of up to `capacity` tokens: m, X [capacity][ldx] (ldx =
/// H + 3), Y [capacity][ldy] (ldy = H + 5) between guards of kGuard elements, ids and weights
/// [capacity][k], logits [capacity][E], and a workspace.
struct LayerBuffers {
  static constexpr unsigned char kPoison = 0x7F;
  static constexpr size_t kGuard = 32;  // elements of Y before and after the rows

  qmoe_dtype dtype;
  uint32_t capacity, hidden, experts, k;
  size_t ldx, ldy, workspace_bytes;
  DeviceBuffer d_m, d_x, d_y, d_ids, d_weights, d_logits, d_workspace;

  LayerBuffers(qmoe_dtype dtype, uint32_t capacity, uint32_t hidden, uint32_t experts, uint32_t k,
               size_t workspace_bytes);

  /// Writes a call of m tokens into the buffers: m; X's rows (x: [m][H] values exact in the
  /// dtype); Y poisoned, with y0's rows ([m][H]) for accumulate; the logits ([m][E]) when not
  /// empty, the ids and weights ([m][k]) when not empty. Rows past the capacity (an m > capacity
  /// call) have no room and are left out. Then waits for the device: the poison is a cudaMemset
  /// on the legacy stream, which the tests' non-blocking streams do not wait for.
  void write(uint32_t m, const std::vector<float>& x, const std::vector<float>& y0, bool accumulate,
             const std::vector<int32_t>& ids, const std::vector<float>& weights,
             const std::vector<float>& logits);

  /// The fields of a layer call's params (the C ABI's qmoe_cuda_moe_params or the kernels'
  /// MoeLayerParams) that these buffers give: the level, dtype and capacity, m, X, Y (its row 0,
  /// past the guard), the routing (logits routed with `renormalize`, or ids and weights),
  /// accumulate and the workspace.
  template <class Params>
  void fill_params(Params* p, qmoe_accuracy level, bool logits, bool renormalize,
                   bool accumulate) const {
    p->accuracy = level;
    p->dtype = dtype;
    p->m_capacity = capacity;
    p->m = d_m.as<const uint32_t>();
    p->x = d_x.data();
    p->ldx = ldx;
    p->y = d_y.as<unsigned char>() + kGuard * dtype_size(dtype);
    p->ldy = ldy;
    if (logits) {
      p->logits = d_logits.data();
      p->renormalize = renormalize;
    } else {
      p->ids = d_ids.as<const int32_t>();
      p->weights = d_weights.as<const float>();
    }
    p->accumulate = accumulate;
    p->workspace = d_workspace.data();
    p->workspace_bytes = workspace_bytes;
  }

  /// Y's whole buffer, guards included.
  std::vector<unsigned char> read_y() const;
  /// Element (t, n) of Y in read_y's bytes: its address, and its value widened.
  const unsigned char* y_bytes_at(const std::vector<unsigned char>& yb, uint32_t t,
                                  uint32_t n) const {
    return yb.data() + (kGuard + size_t{t} * ldy + n) * dtype_size(dtype);
  }
  double y_at(const std::vector<unsigned char>& yb, uint32_t t, uint32_t n) const;
  /// Bytes other than rows [0, rows) x columns [0, H) that no longer hold the poison.
  size_t touched_outside(const std::vector<unsigned char>& yb, uint32_t rows) const;
};

/// Rows [0, m) of a call's Y (read_y's bytes) against the FP64 reference and the CPU layer
/// (check_layer_values, tests/cuda/layer_output_check.h: slack 2 where the device routed from
/// the logits itself; the CPU within twice the output's rounding), the failures naming `what`.
void check_layer_outputs(const LayerBuffers& b, const std::vector<unsigned char>& yb, uint32_t m,
                         const MoeReference& ref, const std::vector<float>& cpu, bool device_routed,
                         const std::string& what);

/// Expects the hybrid layer's output y(t, h) (the address of its element in `dtype`) to be, bit
/// for bit, the resident layer's hot(t, h) plus, on the rows with a cold selection (an expert
/// `cold` marks, with a nonzero weight), the CPU's cold part cold_part(t, h) (both FP32 values
/// of dtype outputs): their FP32 sum rounded once to the dtype. The first three mismatches are
/// reported with `where`. Returns whether any of the m rows had a cold selection.
template <class Y, class Hot, class Cold>
bool expect_resident_plus_cold(qmoe_dtype dtype, uint32_t m, uint32_t hidden, uint32_t k,
                               const std::vector<uint8_t>& cold, const std::vector<int32_t>& ids,
                               const std::vector<float>& weights, const Y& y, const Hot& hot,
                               const Cold& cold_part, const std::string& where) {
  const size_t es = dtype_size(dtype);
  bool any_cold = false;
  int reported = 0;
  for (uint32_t t = 0; t < m; ++t) {
    bool has_cold = false;
    for (uint32_t j = 0; j < k; ++j) {
      has_cold |= cold[ids[t * k + j]] != 0 && weights[t * k + j] != 0.0f;
    }
    any_cold |= has_cold;
    for (uint32_t h = 0; h < hidden; ++h) {
      const float hot_value = hot(t, h), cold_value = cold_part(t, h);
      const float want_value = has_cold ? hot_value + cold_value : hot_value;
      const std::vector<unsigned char> want = to_dtype(dtype, {want_value});
      const std::vector<unsigned char> got(y(t, h), y(t, h) + es);
      if (got != want && reported++ < 3) {
        ADD_FAILURE() << where << ": y[" << t << "][" << h << "] = " << from_dtype(dtype, got)[0]
                      << ", resident + cold = " << want_value;
      }
    }
  }
  return any_cold;
}

/// Expects outputs y(t, h) (FP32 values of rows [0, m) x [0, hidden)) within twice the FP64
/// reference's bound plus 1e-6 of its magnitude (the hybrid layer's two parts each within the
/// bound, and their FP32 sum).
template <class Y>
void expect_within_layer_reference(uint32_t m, uint32_t hidden, const Y& y, const MoeReference& ref,
                                   const std::string& where) {
  for (uint32_t t = 0; t < m; ++t) {
    for (uint32_t h = 0; h < hidden; ++h) {
      const size_t i = size_t{t} * hidden + h;
      const double tol = 2.0 * ref.tol[i] + 1e-6 * std::fabs(ref.y[i]) + 1e-30;
      ASSERT_LE(std::fabs(y(t, h) - ref.y[i]), tol) << where << " y[" << t << "][" << h << "]";
    }
  }
}

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_CUDA_LAYER_CALL_UTIL_H_
