// The one place `qmoe run` calls the library's MoE layer (qmoe_moe_forward and
// qmoe_moe_workspace_size), so that a change of that entry point changes one file.
#ifndef QMOE_TOOLS_QMOE_MOE_LAYER_CALL_H_
#define QMOE_TOOLS_QMOE_MOE_LAYER_CALL_H_

#include <cstddef>
#include <cstdint>

#include "qmoe/qmoe.h"

// One MoE layer over `tokens` rows of the hidden state, in place: state += moe(state).
struct MoeLayerCall {
  qmoe_context* context = nullptr;
  const qmoe_expert_set* set = nullptr;
  qmoe_accuracy accuracy = QMOE_ACCURACY_FAST;
  uint32_t tokens = 0;                      // M
  uint32_t top_k = 0;                       // routing slots per token
  qmoe_dtype activations = QMOE_DTYPE_F32;  // of the state: F32, F16 or BF16
  void* state = nullptr;                    // [tokens, hidden] in `activations`
  uint32_t hidden = 0;                      // elements a row
  const int32_t* ids = nullptr;             // [tokens, top_k]: each slot's expert
  const float* weights = nullptr;           // [tokens, top_k]: each slot's weight
  void* workspace = nullptr;                // at least moe_layer_workspace_size's bytes
  size_t workspace_bytes = 0;
};

// Bytes of workspace the call needs (context, set, accuracy, tokens and top_k are read).
qmoe_status moe_layer_workspace_size(const MoeLayerCall& call, size_t* bytes);

// Runs the layer.
qmoe_status run_moe_layer(const MoeLayerCall& call);

#endif  // QMOE_TOOLS_QMOE_MOE_LAYER_CALL_H_
