// The expert cache ABI (include/qmoe/qmoe_cache.h): qmoe_expert_cache_* and the handle shells
// behind them. Each layer's policy is a LayerCache (lib/cache/layer_cache.h); this file checks
// arguments and serialises the calls on a cache with its mutex.
//
// Handles: as with expert sets (lib/expert_set_api.cc), the caller holds a shell {magic,
// ExpertCache*} that is never freed, so a destroyed handle is rejected, not a use-after-free.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "lib/abi_enum.h"
#include "lib/cache/layer_cache.h"
#include "lib/distinct_ids.h"
#include "lib/error.h"
#include "lib/handle_pool.h"
#include "lib/struct_size.h"
#include "qmoe/qmoe_cache.h"

namespace qmoe {

struct ExpertCache {
  uint32_t num_experts, num_slots;
  // Guards everything below: the ABI lets any threads call on one cache.
  mutable std::mutex mutex;
  uint64_t steps = 0;
  std::vector<LayerCache> layers;
};

}  // namespace qmoe

struct qmoe_expert_cache {
  // kLiveMagic while the cache exists, kDeadMagic after destroy; atomic so that a caller's racy
  // misuse is a rejected handle rather than a data race inside the library.
  std::atomic<uint64_t> magic{0};
  qmoe::ExpertCache* cache = nullptr;  // written only while the shell is not live
};

namespace qmoe {
namespace {

constexpr uint64_t kLiveMagic = 0x716d6f652d636163ull;  // "qmoe-cac"
constexpr uint64_t kDeadMagic = 0x716d6f652d636464ull;  // "qmoe-cdd"

qmoe_status resolve(const qmoe_expert_cache* handle, const char* function, ExpertCache** cache) {
  if (const qmoe_status s =
          check_handle(handle, &qmoe_expert_cache::cache, kLiveMagic, kDeadMagic,
                       QMOE_STATUS_INVALID_ARGUMENT, function, "cache", "qmoe expert cache");
      s != QMOE_STATUS_OK) {
    return s;
  }
  *cache = handle->cache;
  return QMOE_STATUS_OK;
}

// resolve, then the layer index.
qmoe_status resolve_layer(const qmoe_expert_cache* handle, uint32_t layer, const char* function,
                          ExpertCache** cache) {
  if (const qmoe_status s = resolve(handle, function, cache); s != QMOE_STATUS_OK) return s;
  const size_t layers = (*cache)->layers.size();
  if (layer >= layers) {
    return fail(QMOE_STATUS_INVALID_ARGUMENT, function, "layer %u is not below the %zu layers",
                layer, layers);
  }
  return QMOE_STATUS_OK;
}

bool is_policy(int32_t bits) {
  return bits == QMOE_CACHE_POLICY_STATIC || bits == QMOE_CACHE_POLICY_LRU ||
         bits == QMOE_CACHE_POLICY_LFU || bits == QMOE_CACHE_POLICY_LFRU;
}

}  // namespace
}  // namespace qmoe

extern "C" {

QMOE_API void qmoe_expert_cache_desc_init(qmoe_expert_cache_desc* desc) {
  if (desc == nullptr) return;
  *desc = qmoe_expert_cache_desc{};
  desc->struct_size = sizeof(qmoe_expert_cache_desc);
  desc->policy = QMOE_CACHE_POLICY_LFRU;
  desc->half_life_steps = 32.0f;
}

QMOE_API qmoe_status qmoe_expert_cache_create(const qmoe_expert_cache_desc* desc,
                                              qmoe_expert_cache** cache) {
  using namespace qmoe;
  if (cache == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "cache out-pointer is NULL");
  *cache = nullptr;
  if (desc == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "desc is NULL");
  // Read only the fields the caller's struct has; admission_margin keeps its default.
  using D = qmoe_expert_cache_desc;
  constexpr size_t kRequired = offsetof(D, max_promotions_per_step) + sizeof(uint32_t);
  static constexpr FieldSpan kFields[] = {QMOE_FIELD(D, admission_margin)};
  if (!struct_size_ok(desc->struct_size, kRequired, kFields)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
              "desc->struct_size is %zu, not the size of any version of the struct; set it to "
              "sizeof(qmoe_expert_cache_desc) (%zu)",
              desc->struct_size, sizeof(D));
  }
  D d;
  qmoe_expert_cache_desc_init(&d);
  std::memcpy(&d, desc, std::min(desc->struct_size, sizeof d));
  if (d.num_layers == 0 || d.num_experts == 0 || d.num_slots == 0) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
              "num_layers = %u, num_experts = %u and num_slots = %u must be >= 1", d.num_layers,
              d.num_experts, d.num_slots);
  }
  if (d.num_slots > d.num_experts) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "num_slots = %u is above num_experts = %u", d.num_slots,
              d.num_experts);
  }
  const int32_t policy = enum_bits(d.policy);
  if (!is_policy(policy)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "policy %d is not a qmoe_cache_policy",
              static_cast<int>(policy));
  }
  if (policy == QMOE_CACHE_POLICY_LFRU &&
      !(std::isfinite(d.half_life_steps) && d.half_life_steps > 0.0f)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "half_life_steps = %g must be finite and > 0",
              static_cast<double>(d.half_life_steps));
  }
  if (!(std::isfinite(d.admission_margin) && d.admission_margin >= 0.0f)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "admission_margin = %g must be finite and >= 0",
              static_cast<double>(d.admission_margin));
  }
  // Other policies ignore the half-life; any value is given a harmless one.
  const float half_life = policy == QMOE_CACHE_POLICY_LFRU ? d.half_life_steps : 1.0f;

  ExpertCache* impl = nullptr;
  try {
    impl = new ExpertCache{d.num_experts, d.num_slots, {}, 0, {}};
    impl->layers.reserve(d.num_layers);
    for (uint32_t l = 0; l < d.num_layers; ++l) {
      impl->layers.emplace_back(d.num_experts, d.num_slots, static_cast<qmoe_cache_policy>(policy),
                                half_life, d.max_promotions_per_step, d.admission_margin);
    }
  } catch (const std::bad_alloc&) {
    delete impl;
    QMOE_FAIL(QMOE_STATUS_OUT_OF_MEMORY, "allocating %u layers of %u experts failed", d.num_layers,
              d.num_experts);
  }
  qmoe_expert_cache* shell =
      HandlePool<qmoe_expert_cache>::publish(&qmoe_expert_cache::cache, impl, kLiveMagic);
  if (shell == nullptr) {
    delete impl;
    QMOE_FAIL(QMOE_STATUS_OUT_OF_MEMORY, "allocating the cache handle failed");
  }
  *cache = shell;
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_expert_cache_destroy(qmoe_expert_cache* cache) {
  using namespace qmoe;
  if (cache == nullptr) return QMOE_STATUS_OK;
  ExpertCache* impl = nullptr;
  if (qmoe_status s = resolve(cache, __func__, &impl); s != QMOE_STATUS_OK) return s;
  if (!HandlePool<qmoe_expert_cache>::claim_for_destroy(cache, kLiveMagic, kDeadMagic)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "cache was destroyed");
  }
  delete impl;
  HandlePool<qmoe_expert_cache>::release(cache);
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_expert_cache_observe(qmoe_expert_cache* cache, uint32_t layer,
                                               const int32_t* ids, size_t count) {
  using namespace qmoe;
  ExpertCache* impl = nullptr;
  if (qmoe_status s = resolve_layer(cache, layer, __func__, &impl); s != QMOE_STATUS_OK) {
    return s;
  }
  if (ids == nullptr && count > 0) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "ids is NULL with count = %zu", count);
  }
  // Every id is checked before any is counted: a bad call records nothing.
  for (size_t i = 0; i < count; ++i) {
    if (ids[i] < -1 || ids[i] >= static_cast<int64_t>(impl->num_experts)) {
      QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "ids[%zu] = %d is outside [-1, %u)", i,
                static_cast<int>(ids[i]), impl->num_experts);
    }
  }
  std::lock_guard<std::mutex> lock(impl->mutex);
  impl->layers[layer].observe(ids, count);
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_expert_cache_observe_counts(qmoe_expert_cache* cache, uint32_t layer,
                                                      const uint32_t* counts,
                                                      uint32_t num_experts) {
  using namespace qmoe;
  ExpertCache* impl = nullptr;
  if (qmoe_status s = resolve_layer(cache, layer, __func__, &impl); s != QMOE_STATUS_OK) {
    return s;
  }
  if (counts == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "counts is NULL");
  if (num_experts != impl->num_experts) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "num_experts = %u, the cache's E is %u", num_experts,
              impl->num_experts);
  }
  std::lock_guard<std::mutex> lock(impl->mutex);
  if (!impl->layers[layer].observe_counts(counts)) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
              "an expert's selections this step would pass 2^32 - 1: nothing was counted");
  }
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_expert_cache_end_step(qmoe_expert_cache* cache) {
  using namespace qmoe;
  ExpertCache* impl = nullptr;
  if (qmoe_status s = resolve(cache, __func__, &impl); s != QMOE_STATUS_OK) return s;
  std::lock_guard<std::mutex> lock(impl->mutex);
  for (LayerCache& layer : impl->layers) layer.end_step(impl->steps);
  ++impl->steps;
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_expert_cache_get_residency(const qmoe_expert_cache* cache, uint32_t layer,
                                                     uint32_t* ids, uint32_t capacity,
                                                     uint32_t* count) {
  using namespace qmoe;
  ExpertCache* impl = nullptr;
  if (qmoe_status s = resolve_layer(cache, layer, __func__, &impl); s != QMOE_STATUS_OK) {
    return s;
  }
  if (count == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "count is NULL");
  std::lock_guard<std::mutex> lock(impl->mutex);
  const LayerCache& l = impl->layers[layer];
  const uint32_t resident = l.resident_count();
  if (ids != nullptr) {
    if (capacity < resident) {
      QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
                "capacity = %u is below the layer's %u resident experts", capacity, resident);
    }
    l.residents(ids);
  }
  *count = resident;
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_expert_cache_set_residency(qmoe_expert_cache* cache, uint32_t layer,
                                                     const uint32_t* ids, uint32_t count) {
  using namespace qmoe;
  ExpertCache* impl = nullptr;
  if (qmoe_status s = resolve_layer(cache, layer, __func__, &impl); s != QMOE_STATUS_OK) {
    return s;
  }
  if (ids == nullptr && count > 0) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "ids is NULL with count = %u", count);
  }
  if (count > impl->num_slots) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "count = %u is above the %u slots", count,
              impl->num_slots);
  }
  if (const qmoe_status s = check_distinct_ids(ids, count, impl->num_experts, "ids", __func__);
      s != QMOE_STATUS_OK) {
    return s;
  }
  std::lock_guard<std::mutex> lock(impl->mutex);
  impl->layers[layer].set_residency(ids, count);
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_expert_cache_get_stats(const qmoe_expert_cache* cache, uint32_t layer,
                                                 qmoe_expert_cache_stats* stats) {
  using namespace qmoe;
  ExpertCache* impl = nullptr;
  if (layer == QMOE_EXPERT_CACHE_ALL_LAYERS) {
    if (qmoe_status s = resolve(cache, __func__, &impl); s != QMOE_STATUS_OK) return s;
  } else if (qmoe_status s = resolve_layer(cache, layer, __func__, &impl); s != QMOE_STATUS_OK) {
    return s;
  }
  if (stats == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "stats is NULL");
  if (!struct_size_ok(stats->struct_size, sizeof(qmoe_expert_cache_stats))) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
              "stats->struct_size is %zu, not the size of any version of the struct; set it to "
              "sizeof(qmoe_expert_cache_stats) (%zu)",
              stats->struct_size, sizeof(qmoe_expert_cache_stats));
  }
  LayerCacheCounters sum;
  std::lock_guard<std::mutex> lock(impl->mutex);
  const size_t first = layer == QMOE_EXPERT_CACHE_ALL_LAYERS ? 0 : layer;
  const size_t end = layer == QMOE_EXPERT_CACHE_ALL_LAYERS ? impl->layers.size() : layer + 1;
  for (size_t l = first; l < end; ++l) {
    const LayerCacheCounters& c = impl->layers[l].counters();
    sum.selections += c.selections;
    sum.hits += c.hits;
    sum.promotions += c.promotions;
    sum.evictions += c.evictions;
  }
  // Fields this version has; a newer caller's trailing fields are left as they are.
  qmoe_expert_cache_stats out{};
  out.struct_size = stats->struct_size;
  out.steps = impl->steps;
  out.selections = sum.selections;
  out.hits = sum.hits;
  out.promotions = sum.promotions;
  out.evictions = sum.evictions;
  std::memcpy(stats, &out, sizeof out);
  return QMOE_STATUS_OK;
}

}  // extern "C"
