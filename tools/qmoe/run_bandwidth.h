// `qmoe run`'s read-bandwidth roofs, the rates its decode is held against: a fresh buffer well
// over the last-level cache, read before the weights exist, and the weights' own pages.
#ifndef QMOE_TOOLS_QMOE_RUN_BANDWIDTH_H_
#define QMOE_TOOLS_QMOE_RUN_BANDWIDTH_H_

#include <cstddef>
#include <cstdint>

#include "run_context.h"
#include "run_model.h"

struct RunBandwidth {
  size_t llc_bytes = 0;     // the last-level cache, all instances (32 MiB when unknown)
  size_t buffer_bytes = 0;  // 8x llc_bytes and at least 256 MiB, so the reads are DRAM's
  double one_thread = 0.0;  // bytes per second over the buffer
  double all_threads = 0.0;
  double reference = 0.0;  // all_threads when the context has more than one thread
  double weights = 0.0;    // over the weights' pages, the best of two passes
  size_t weights_bytes = 0;
  uint32_t weights_layers = 0;
  double seconds = 0.0;  // both measurements
  // --gpu: reference over the buffer again, after the decode's passes (0 until measured). The
  // host's read bandwidth moves between processes and within one (other tenants), so the
  // hybrid decode's CPU floor divides by the best of reference, weights and this one.
  double reference_after = 0.0;
};

// The best of the reads measured (buffer before, the weights' pages, buffer after): the roof a
// CPU floor can use without the floor overstating a busy moment's bandwidth.
double best_read_roof(const RunBandwidth& bandwidth);

// Both return 0, or 1 after the library's message on stderr.
int measure_buffer_bandwidth(const RunContext& run, RunBandwidth* bandwidth);
int measure_weights_bandwidth(const RunContext& run, const RunModel& model,
                              RunBandwidth* bandwidth);
// reference_after: the buffer read again at the context's thread count (returns as above).
int measure_buffer_bandwidth_again(const RunContext& run, RunBandwidth* bandwidth);

#endif  // QMOE_TOOLS_QMOE_RUN_BANDWIDTH_H_
