// The device side's own memory: the ring state (sequence numbers), the sticky error, the device
// telemetry and the per-call records. In production all of it is device memory (cudaMalloc),
// written only by the offload kernels (lib/offload/kernels.h) and read by the host only on
// demand (cudaMemcpy after a stream synchronisation); in tests it is memory owned by the thread
// standing in for the device (lib/offload/host_device.h).
//
// Keeping the sequence numbers here, never in kernel arguments, is what lets a CUDA graph
// captured once issue a new request on every replay: the kernels read and advance them.
#ifndef QMOE_LIB_OFFLOAD_DEVICE_STATE_H_
#define QMOE_LIB_OFFLOAD_DEVICE_STATE_H_

#include <cstdint>

#include "lib/offload/ring_layout.h"

namespace qmoe::offload {

/// Sticky error bits (OffloadDeviceState::error). Set, never cleared: once any is set, every
/// later call publishes nothing and waits for nothing (it fails fast).
constexpr uint32_t kErrorTimeout = 1u;   // a wait passed the session's deadline
constexpr uint32_t kErrorHost = 2u;      // the service answered a request with a failure status
constexpr uint32_t kErrorProtocol = 4u;  // a request's slot was still in use (a ring misuse)

/// Device counters; each has one writer, thread 0 of the classify-publish block (of its own
/// kernel, or block 0 of the MoE layer's FC1 kernel; calls on a session are stream-ordered, so
/// there is never a second one running). Conservation:
/// published + short_circuits + refused == classify_calls, and cold_selections equals the
/// selections the host served once every published request has been answered.
struct DeviceTelemetry {
  uint64_t classify_calls;   // layer calls classified
  uint64_t short_circuits;   // calls with no cold selection: nothing published
  uint64_t published;        // requests published on the ring
  uint64_t refused;          // calls that published nothing because of the sticky error or
                             // invalid routing (the resident layer reports the routing)
  uint64_t cold_selections;  // cold selections of the published requests
};

struct OffloadDeviceState {
  /// The next request's sequence number, from 1. Writer: classify-publish thread 0.
  uint64_t next_seq;
  /// The last request whose result the device added. Writer: wait-accumulate block 0 thread 0
  /// (read by a later classify-publish, so the whole wait kernel that wrote it has ended).
  uint64_t consumed_seq;
  /// OR of kError* bits. Writers: any thread of either kernel, with an atomic OR.
  uint32_t error;
  uint32_t reserved;
  /// The last request wait block 0 saw answered on the host (done_seq), release-stored for the
  /// call's other wait blocks, which poll it instead of the host's word. Writer: wait block 0
  /// thread 0.
  uint64_t answered_seq;
  DeviceTelemetry telemetry;
};

/// What one layer call's classify left for its wait (one record per layer of the session:
/// calls are stream-ordered, and a record is rewritten by every call of its layer). Writer:
/// classify-publish thread 0; the per-token flags, one thread per token.
struct OffloadCallRecord {
  uint64_t seq;         // the request published by the call, 0 for none
  uint32_t m;           // the call's tokens
  uint32_t selections;  // its cold selections
  uint32_t num_cold;    // its unique cold experts
  uint32_t reserved;
};

/// What one routing slot is to the offload: invalid input (an id outside [0, E), a non-finite
/// weight, a residency entry outside [-1, slots)), nothing (weight 0: skipped by both layers),
/// a hot selection (its expert is resident) or a cold one.
enum class Selection : uint32_t { kInvalid, kSkipped, kHot, kCold };

/// The same rules as the resident layer's routes (lib/cuda/moe_layer.cuh) and the CPU
/// executor's: a slot with weight 0 runs nowhere.
QMOE_HD Selection classify_selection(int32_t id, uint32_t weight_bits, const int32_t* residency,
                                     uint32_t num_experts, uint32_t num_slots) {
  if (id < 0 || static_cast<uint32_t>(id) >= num_experts) return Selection::kInvalid;
  if ((weight_bits & 0x7F800000u) == 0x7F800000u) return Selection::kInvalid;  // Inf, NaN
  if ((weight_bits & 0x7FFFFFFFu) == 0) return Selection::kSkipped;            // +0, -0
  const int32_t r = residency[id];
  if (r < -1 || (r >= 0 && static_cast<uint32_t>(r) >= num_slots)) return Selection::kInvalid;
  return r < 0 ? Selection::kCold : Selection::kHot;
}

}  // namespace qmoe::offload

#endif  // QMOE_LIB_OFFLOAD_DEVICE_STATE_H_
