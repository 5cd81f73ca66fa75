#include "lib/offload/moe_handler.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>

#include "lib/error.h"
#include "lib/memory_ranges.h"
#include "lib/moe/executor.h"
#include "lib/moe/workspace_layout.h"

namespace qmoe::offload {

qmoe_status MoeRequestHandler::create(Context* context, const std::vector<const ExpertSet*>& layers,
                                      const RingGeometry& geometry, const char* function,
                                      std::unique_ptr<MoeRequestHandler>* handler) {
  std::unique_ptr<MoeRequestHandler> h(new (std::nothrow) MoeRequestHandler);
  if (h == nullptr) return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating the handler");
  h->context_ = context;
  size_t bytes = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    for (qmoe_accuracy accuracy : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      // Every piece of the layout grows with m and k: the ring's largest request bounds all.
      MoeLayout l;
      if (!make_moe_layout(*layers[i], accuracy, geometry.m_capacity, geometry.k_max,
                           context->num_threads(), &l)) {
        return fail(QMOE_STATUS_INVALID_ARGUMENT, function,
                    "layer %zu: the CPU workspace for m = %u, k = %u overflows", i,
                    geometry.m_capacity, geometry.k_max);
      }
      bytes = std::max(bytes, l.total);
    }
  }
  try {
    h->layers_ = layers;
    h->run_mask_.assign(geometry.num_experts_max, 0);
    h->memory_.reset(new unsigned char[bytes + 64]);
  } catch (const std::bad_alloc&) {
    return fail(QMOE_STATUS_OUT_OF_MEMORY, function, "allocating %zu bytes of CPU workspace",
                bytes + 64);
  }
  const auto address = reinterpret_cast<uintptr_t>(h->memory_.get());
  h->workspace_ = h->memory_.get() + (align64(address) - address);
  h->workspace_bytes_ = bytes;
  *handler = std::move(h);
  return QMOE_STATUS_OK;
}

qmoe_status MoeRequestHandler::serve(const RequestView& r, char* why, size_t why_size) {
  const RequestMeta& meta = r.meta;
  if (meta.layer >= layers_.size()) {
    std::snprintf(why, why_size, "layer %u of %zu", meta.layer, layers_.size());
    return QMOE_STATUS_INTERNAL_ERROR;
  }
  const ExpertSet& set = *layers_[meta.layer];
  if (meta.m == 0 || meta.num_cold == 0) return QMOE_STATUS_OK;  // nothing runs
  if (meta.k > set.num_experts) {
    std::snprintf(why, why_size, "k = %u above the layer's %u experts", meta.k, set.num_experts);
    return QMOE_STATUS_INTERNAL_ERROR;
  }
  // validate_request checked ids against the ring's E; this layer may have fewer experts.
  const uint32_t slots = meta.m * meta.k;
  for (uint32_t i = 0; i < slots; ++i) {
    if (static_cast<uint32_t>(r.ids[i]) >= set.num_experts) {
      std::snprintf(why, why_size, "ids[%u] = %d: the layer has %u experts", i, r.ids[i],
                    set.num_experts);
      return QMOE_STATUS_INTERNAL_ERROR;
    }
  }
  if (static_cast<uint32_t>(r.cold_ids[meta.num_cold - 1]) >= set.num_experts) {
    std::snprintf(why, why_size, "cold id %d: the layer has %u experts",
                  r.cold_ids[meta.num_cold - 1], set.num_experts);
    return QMOE_STATUS_INTERNAL_ERROR;
  }
  const auto accuracy = static_cast<qmoe_accuracy>(meta.accuracy);
  MoeLayout layout;
  if (!make_moe_layout(set, accuracy, meta.m, meta.k, context_->num_threads(), &layout) ||
      layout.total > workspace_bytes_) {
    std::snprintf(why, why_size, "m = %u, k = %u needs more CPU workspace than the session has",
                  meta.m, meta.k);
    return QMOE_STATUS_INTERNAL_ERROR;
  }
  std::fill(run_mask_.begin(), run_mask_.end(), uint8_t{0});
  for (uint32_t i = 0; i < meta.num_cold; ++i) run_mask_[static_cast<uint32_t>(r.cold_ids[i])] = 1;
  MoeForward f{};
  f.accuracy = accuracy;
  f.m = meta.m;
  f.k = meta.k;
  f.dtype = static_cast<qmoe_dtype>(meta.dtype);
  f.x = r.x;
  f.ldx = r.hidden;
  f.ids = r.ids;
  f.weights = r.weights;
  f.run_mask = run_mask_.data();
  f.accumulate = false;
  f.y = r.result;
  f.ldy = r.hidden;
  run_moe_forward(*context_, set, f, layout, workspace_);
  return QMOE_STATUS_OK;
}

}  // namespace qmoe::offload
