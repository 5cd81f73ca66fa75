// `qmoe run`'s decode: --tokens steps, each running --batch tokens through every layer
// (x += moe(x), then x rescaled to unit RMS), after one untimed warm-up step (thread pool,
// first touches), with each part of a layer timed apart.
#ifndef QMOE_TOOLS_QMOE_RUN_DECODE_H_
#define QMOE_TOOLS_QMOE_RUN_DECODE_H_

#include <cstdint>
#include <vector>

#include "qmoe/qmoe.h"
#include "run_model.h"
#include "run_options.h"

// Times and counts over the timed steps, and the hidden state they left.
struct DecodeResult {
  double decode_s = 0.0;  // wall time
  double moe_s = 0.0;     // in the MoE layer calls
  double route_s = 0.0;   // in qmoe_moe_route_topk
  double tool_s = 0.0;    // the tool's own work: router logits, RMS rescale, expert count
  // Distinct experts with a nonzero weight, summed over the layer calls: each one's weights
  // are read once a call.
  uint64_t experts_computed = 0;
  std::vector<double> step_ms;  // each step's wall time, in order
  // The best step's weight bytes over its time in the layer calls: the achieved rate over the
  // step the least host noise hit.
  double best_step_bytes_per_s = 0.0;
  uint64_t checksum = 0;  // FNV-1a of the hidden state in its activation type
  float max_abs_x = 0.0f;
  bool finite = true;
};

// Returns 0, or 1 after the library's message on stderr.
int run_decode(const RunOptions& options, qmoe_context* context, const RunModel& model,
               DecodeResult* result);

#endif  // QMOE_TOOLS_QMOE_RUN_DECODE_H_
