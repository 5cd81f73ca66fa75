#include "moe_layer_call.h"

qmoe_status call_moe_layer(const MoeLayerCall& call, size_t* workspace_bytes_needed) {
  if (workspace_bytes_needed != nullptr) {
    return qmoe_moe_workspace_size(call.context, call.set, call.accuracy, call.tokens, call.top_k,
                                   workspace_bytes_needed);
  }
  qmoe_moe_options options;
  qmoe_moe_options_init(&options);
  options.accumulate = 1;  // y == x: x += moe(x)
  options.workspace = call.workspace;
  options.workspace_bytes = call.workspace_bytes;
  if (call.activations == QMOE_DTYPE_F32) {
    float* x = static_cast<float*>(call.state);
    return qmoe_moe_forward(call.context, call.set, call.accuracy, call.tokens, x, call.hidden,
                            call.ids, call.weights, call.top_k, x, call.hidden, &options);
  }
  return qmoe_moe_forward_typed(call.context, call.set, call.accuracy, call.tokens,
                                call.activations, call.state, call.hidden, call.ids, call.weights,
                                call.top_k, call.state, call.hidden, &options);
}
