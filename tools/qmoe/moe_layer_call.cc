#include "moe_layer_call.h"

qmoe_status moe_layer_workspace_size(const MoeLayerCall& call, size_t* bytes) {
  return qmoe_moe_workspace_size(call.context, call.set, call.accuracy, call.tokens, call.top_k,
                                 bytes);
}

qmoe_status run_moe_layer(const MoeLayerCall& call) {
  qmoe_moe_params params;
  qmoe_moe_params_init(&params);
  params.accuracy = call.accuracy;
  params.m = call.tokens;
  params.dtype = call.activations;
  params.x = call.state;
  params.ldx = call.hidden;
  params.y = call.state;  // in place: x is read before y is written
  params.ldy = call.hidden;
  params.k = call.top_k;
  params.ids = call.ids;
  params.weights = call.weights;
  params.accumulate = 1;  // y == x: x += moe(x)
  params.workspace = call.workspace;
  params.workspace_bytes = call.workspace_bytes;
  return qmoe_moe_forward(call.context, call.set, &params);
}
