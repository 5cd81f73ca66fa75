// The production request handler: a request's cold experts run through the CPU MoE layer
// executor (lib/moe/executor.h) on the session's CPU context, with the request's cold set as
// the run mask, and their weighted sum is the result.
//
// Why the internal executor rather than qmoe_moe_forward: the service thread is the hot path
// of every offloaded layer, and the public call would, per request, re-resolve the context and
// set handles, re-check strides and overlaps against the set's weight ranges, lease scratch and
// (on a failure) format a thread-local message. Here the handles are resolved once when the
// session is made, the workspace is allocated once (sized for the ring's largest request at
// either accuracy), and the checks that matter for untrusted ring contents (ids in [0, E),
// finite weights, m and k in range, cold ids valid: validate_request plus the layer's E below)
// are done on the request itself. The bits are the same: qmoe_moe_forward calls this executor.
#ifndef QMOE_LIB_OFFLOAD_MOE_HANDLER_H_
#define QMOE_LIB_OFFLOAD_MOE_HANDLER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "lib/context.h"
#include "lib/moe/expert_set.h"
#include "lib/offload/service.h"

namespace qmoe::offload {

class MoeRequestHandler : public RequestHandler {
 public:
  /// For layers[i] the CPU expert set of layer i; the context and the sets must outlive the
  /// handler. OUT_OF_MEMORY or INVALID_ARGUMENT (the workspace size overflows) on failure.
  static qmoe_status create(Context* context, const std::vector<const ExpertSet*>& layers,
                            const RingGeometry& geometry, const char* function,
                            std::unique_ptr<MoeRequestHandler>* handler);

  /// y = the request's cold experts' weighted sum, rows t < m (a token without a cold
  /// selection gets 0); nothing when the request has no cold expert.
  qmoe_status serve(const RequestView& request, char* why, size_t why_size) override;

 private:
  MoeRequestHandler() = default;
  Context* context_ = nullptr;
  std::vector<const ExpertSet*> layers_;
  std::vector<uint8_t> run_mask_;            // [E_max]
  std::unique_ptr<unsigned char[]> memory_;  // the executor's workspace, + 64 to align
  unsigned char* workspace_ = nullptr;       // 64-byte aligned
  size_t workspace_bytes_ = 0;
};

}  // namespace qmoe::offload

#endif  // QMOE_LIB_OFFLOAD_MOE_HANDLER_H_
