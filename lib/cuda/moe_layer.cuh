// The resident-expert MoE layer for decode and small M, in two launches a layer, capturable in a
// CUDA graph with every per-call value read from device memory:
//
//   (a) FC1 + SwiGLU: a grid of two blocks per SM. Every block first builds the layer's routing
//       itself (moe_routes.cuh: top-k or the given ids, residency, grouping of routes by expert
//       in ascending id, tokens ascending; work item = an expert and up to T of its tokens,
//       T = min(8, capacity rounded up to a power of 2)), then takes one contiguous range of the
//       call's (work item, task) list. A task is one warp's, start to end: an FC1 group (8 rows:
//       gate and up of 4 intermediates, interleaved fusion) or the gate and up groups of 8
//       intermediates (concatenated). The block stages the item's tokens' X rows once per item
//       (quantized per 32 at the fast level), each warp walks its task's groups over K, sums
//       its lanes, applies bias and SwiGLU in the warp and writes the FP32 activations of its
//       intermediates per route into the workspace. No block barrier inside an item.
//   (b) FC2 + combine: a grid of one block per SM; block b owns output groups b, b + grid, ... of
//       H for all routes. It builds the same routing, prefetches its FC2 rows into the L2, waits
//       for (a) (programmatic dependent launch on sm_90: griddepcontrol.wait after the
//       prefetches are issued; elsewhere a plain stream order), then warp w takes work items
//       w, w + 8, ...: it stages the item's routes' activations once into its own shared area
//       (FP32, or int8 records quantized per 32 as the CPU quantizes FC2's input at the fast
//       level) and computes its groups' outputs for them; then for each token the block sums
//       (accumulate ? y : 0) + sum over slots j in slot order of weight[t, j] * out in FP32 and
//       rounds once to the dtype. No float atomics: the bits depend only on the inputs (not on
//       the grid, the device or timing).
// The grids fit side by side on every SM (80 registers a thread), so (b)'s blocks route and
// prefetch while (a) computes, and the next layer's (a) does the same while (b) computes.
// A hybrid layer (offload_session.cu) is the same two kernels, (a) with one more block that
// classifies and publishes the CPU's request (MoeOffloadSteps below), then the offload's wait.
//
// Routes are what the CPU executor runs (lib/moe_forward.cc): slot (t, j) with weight != 0 whose
// expert is resident (residency[e] >= 0); slots with weight 0 or a non-resident expert are
// skipped, and a token with none gets 0 (or keeps y with accumulate).
//
// Invalid device-side input. Both kernels check the inputs of the call identically, and (b)'s
// first block writes the call's error word (the first 4 bytes of the workspace; 0 when valid)
// as the OR of kMoeError* bits. On any error the call computes nothing and writes y = 0 for rows
// t < min(m, capacity) (with accumulate too). The word is overwritten by every call.
#ifndef QMOE_LIB_CUDA_MOE_LAYER_CUH_
#define QMOE_LIB_CUDA_MOE_LAYER_CUH_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "lib/cuda/device_quant_matrix.cuh"
#include "lib/offload/kernels.h"
#include "qmoe/qmoe.h"

namespace qmoe::cuda {

/// Error-word bits (moe_layer_error_word).
constexpr uint32_t kMoeErrorTokensOverCapacity = 1u;  // *m > m_capacity
constexpr uint32_t kMoeErrorExpertId = 2u;            // an id outside [0, E)
constexpr uint32_t kMoeErrorWeight = 4u;              // a non-finite routing weight
constexpr uint32_t kMoeErrorLogits = 8u;              // NaN or +inf logit, or a row of -inf only
constexpr uint32_t kMoeErrorResidency = 16u;          // routed expert's slot outside [-1, slots)
constexpr uint32_t kMoeErrorSlotMatrix = 32u;         // a used slot's FC1/FC2 is malformed

/// Largest supported sizes: E experts, m_capacity * k routing slots (they size each block's
/// shared routing tables).
constexpr uint32_t kMoeMaxExperts = 1024;
constexpr uint32_t kMoeMaxSlots = 4096;

/// The offload's classify-publish (lib/offload/kernels.h) carried by the layer's FC1 kernel, so
/// that it is not a graph node of its own (offload_session.cu): (a)'s grid gets one more block,
/// block 0, whose whole work is classify_publish, and the CPU's request goes out as soon as x
/// is ready, beside FC1. The call's values (m, the routing, the residency, x, the sizes, dtype
/// and accuracy) are the layer's own; these are where the request goes. (The wait stays a
/// kernel of its own: carried by the (b) blocks it made hybrid layers slower;
/// docs/results/2026-12-02-h200-offload-fold.md.)
struct MoeOffloadSteps {
  bool enabled;  // false: a resident-only layer (nothing below is read)
  offload::OffloadDeviceState* state;
  offload::OffloadCallRecord* record;  // this layer's
  uint8_t* token_cold;                 // this layer's per-token flags
  unsigned char* ring;                 // as the device addresses it
  offload::RingLayout layout;
  uint32_t layer;
  bool short_circuit;  // a call with no cold selection publishes nothing
};

struct MoeLayerParams {
  // Fixed when a graph is captured (host values).
  uint32_t num_experts;   // E
  uint32_t hidden;        // H: FC1 k, FC2 n
  uint32_t intermediate;  // I: FC1 n is 2 I, FC2 k is I
  uint32_t top_k;         // k slots per token, 1..E
  uint32_t m_capacity;    // largest m; sizes the grid and the workspace
  uint32_t num_slots;     // device expert slots
  qmoe_accuracy accuracy;
  qmoe_dtype dtype;  // of x, y and logits
  qmoe_swiglu_fusion fusion;
  float alpha, beta, limit;  // SwiGLU; limit +inf: no clamp
  bool accumulate;           // y += result instead of y = result
  // The weight format of every slot's FC1 and FC2 (INT4, INT3, MXFP4 or NVFP4): the kernels are
  // compiled per format, so a set holds one.
  qmoe_weight_format format;
  // INT4 and INT3 only: every slot's FC1 and FC2 has the lean layout (int4_lean_layout: blocks
  // >= 32, 16-bit scales, no zero points), so the kernels compiled for that walk alone run
  // (decode_formats.cuh, Int4LeanDecode and Int3LeanDecode). A device expert set knows it from its
  // experts; a slot that is not lean is then reported as malformed (kMoeErrorSlotMatrix).
  bool lean_walk;
  // Device memory, read by every call.
  const DeviceQuantMatrix* fc1;  // [num_slots]: [2I, H]
  const DeviceQuantMatrix* fc2;  // [num_slots]: [H, I]
  const uint32_t* m;             // tokens of this call, <= m_capacity
  const void* x;                 // [m, H], row t at x + t * ldx elements
  size_t ldx;
  void* y;  // [m, H]
  size_t ldy;
  // Routing: ids and weights [m, k] (logits NULL), or router logits [m, E] (ids and weights
  // NULL) routed as qmoe_moe_route_topk: top k by logit, ties to the lower id, weights
  // exp(l - max) over the sum across the k selected (renormalize) or all E.
  const int32_t* ids;
  const float* weights;
  const void* logits;
  bool renormalize;
  const int32_t* residency;  // [E]: expert -> slot, or -1 (not resident: its routes are skipped)
  // true: m, the routing, the residency and the slot descriptions were complete before the
  // kernel preceding this call in the stream started (written before a graph launch, say), so
  // FC1 builds its routing and prefetches its weights into L2 before waiting for that kernel
  // (x is still read after the wait). false: FC1 waits first and reads everything after.
  bool inputs_ready_early;
  // The caller's hint for the tokens per work item (moe_layer.cu, tokens_per_item): the tokens
  // each routed expert is expected to hold, 0 (uniform routing's expectation) or in
  // [1, m_capacity]. Like m_capacity, fixed when a graph is captured; it never changes the bits.
  float expected_tokens_per_expert;
  // Optional [E] (NULL: not written): selections per expert of the call's routing, resident or
  // not (slots t < m with a nonzero weight), every entry overwritten by (b)'s block 0 after its
  // wait; all 0 when the error word is set. Counted in that block's shared memory before the
  // wait, from the tables every block builds anyway, so only E stores follow the wait.
  uint32_t* expert_counts;
  // Scratch of moe_layer_workspace_size bytes, 256-byte aligned; one call at a time.
  void* workspace;
  size_t workspace_bytes;
  MoeOffloadSteps offload;
};

/// Bytes of device workspace for a capacity (0 when the sizes are out of range or overflow).
size_t moe_layer_workspace_size(uint32_t m_capacity, uint32_t top_k, uint32_t num_experts,
                                uint32_t hidden, uint32_t intermediate);

/// The call's error word inside a workspace (device pointer).
inline const uint32_t* moe_layer_error_word(const void* workspace) {
  return static_cast<const uint32_t*>(workspace);
}

/// Launches (a) and (b) on `stream`: no host synchronisation, no allocation, capturable.
/// cudaErrorInvalidValue (nothing launched) for host-side arguments out of range: sizes above,
/// k outside [1, E], m_capacity 0, unknown enums (a format without decode kernels too), NULL
/// pointers (ids/weights and logits: exactly
/// one routing), a workspace too small or not 256-byte aligned, expert_counts not 4-byte
/// aligned, or ldx, ldy < H with capacity > 1. Otherwise the first launch error. `kernels_launched`
/// (optional) gets how many of the two launched: 1 means (a) did and (b) did not, so a request (a)
/// published has no wait.
cudaError_t launch_moe_layer(const MoeLayerParams& params, cudaStream_t stream,
                             uint32_t* kernels_launched = nullptr);

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_MOE_LAYER_CUH_
