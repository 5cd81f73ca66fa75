/*
 * libqmoe's expert cache policy: which experts of each MoE layer a GPU should keep resident,
 * learned from the routing a runtime observes step by step. Host code only (every build has
 * it; no CUDA). The cache decides; the runtime moves the bytes: each layer's resident list goes
 * to qmoe_cuda_expert_set_update_residency (qmoe/qmoe_cuda.h) between steps, which copies only
 * the experts that joined, and the experts the list leaves out run on the CPU (the offload
 * session). C99-clean.
 *
 * A step: qmoe_expert_cache_observe for each layer with the step's routed expert ids (hits and
 * misses are counted against the residency of that moment), then qmoe_expert_cache_end_step,
 * which updates every layer's scores and residency; then qmoe_expert_cache_get_residency gives
 * each layer's list for the next step.
 *
 * Policies (one per cache). Each expert of a layer has a score:
 *  - LRU: the last step that selected it;
 *  - LFU: its selections since the cache was created;
 *  - LFRU: its selections, each weighted 2^(-age / half_life_steps) by its age in steps (a
 *    decayed count: LFU that forgets; kept as count * 2^(-1 / half_life_steps) + the step's
 *    selections at each end_step, and zero once below 2^-1022);
 *  - STATIC: none; residency changes only through qmoe_expert_cache_set_residency.
 * At end_step a layer admits the non-resident experts with a score (selected at least once), the
 * highest score first (ties: more selections this step, then the lower id), up to
 * max_promotions_per_step: into a free slot while one is left, else in place of the resident
 * expert with the lowest score (ties: fewer selections this step, then the higher id), and only
 * when the newcomer's score is greater than the resident's plus admission_margin (by default 0:
 * strictly greater). So an expert admitted in a step is never
 * evicted in the same step, and the residency never exceeds num_slots. Under LRU every expert
 * selected in a step outranks every resident that was not, so LRU copies each miss unless
 * max_promotions_per_step limits it; LFU and LFRU copy an expert only once its count passes a
 * resident's.
 *
 * Calls on one cache may come from any threads (the cache serialises them). Values are fixed:
 * new enum values are appended, none is renumbered.
 */
#ifndef QMOE_QMOE_CACHE_H_
#define QMOE_QMOE_CACHE_H_

#include <stddef.h>
#include <stdint.h>

#include "qmoe/qmoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/** How an expert cache chooses its residents; fixed values. */
typedef enum qmoe_cache_policy {
  /** Residency changes only through qmoe_expert_cache_set_residency (a placement the runtime
   * chose, e.g. the most selected experts of a recorded trace). */
  QMOE_CACHE_POLICY_STATIC = 1,
  /** Least recently used: the experts of the latest steps stay. */
  QMOE_CACHE_POLICY_LRU = 2,
  /** Least frequently used: the experts with the most selections so far stay. */
  QMOE_CACHE_POLICY_LFU = 3,
  /** Least frequently and recently used: selections decay with age (half_life_steps). */
  QMOE_CACHE_POLICY_LFRU = 4
} qmoe_cache_policy;

/** An expert cache's shape and policy. qmoe_expert_cache_desc_init sets the defaults. */
typedef struct qmoe_expert_cache_desc {
  size_t struct_size;       /**< caller sets sizeof(qmoe_expert_cache_desc) */
  uint32_t num_layers;      /**< MoE layers, >= 1 */
  uint32_t num_experts;     /**< routed experts per layer (E), >= 1 */
  uint32_t num_slots;       /**< resident experts per layer at most, 1..E */
  qmoe_cache_policy policy; /**< default LFRU */
  /** LFRU: steps after which a selection counts half; finite and > 0; default 32. Other
   * policies ignore it. */
  float half_life_steps;
  /** Experts a layer may admit at one end_step (copies a step can afford), 0 for no limit
   * (default). qmoe_expert_cache_set_residency is not limited. */
  uint32_t max_promotions_per_step;
  /** How much a newcomer's score must exceed a resident's for the newcomer to take its slot
   * (an admission into a free slot needs none); finite and >= 0, default 0. In selections under
   * LFU and LFRU: a promotion pays only when the newcomer wins more selections from the CPU
   * than its copy costs, about (the copy's time) / (the CPU's time for one selection), so a
   * margin of that size stops experts of nearly equal counts from trading places every step.
   * In steps under LRU: a resident goes only when idle for more than the margin. Added after
   * max_promotions_per_step: a struct_size that ends before it gets 0. */
  float admission_margin;
} qmoe_expert_cache_desc;

/** Counters of one layer or of all, since the cache was created. */
typedef struct qmoe_expert_cache_stats {
  size_t struct_size;  /**< caller sets sizeof(qmoe_expert_cache_stats) */
  uint64_t steps;      /**< the cache's end_step calls (the same for every layer) */
  uint64_t selections; /**< ids observed (not the -1 of padding) */
  uint64_t hits;       /**< of those, the ones resident when observed */
  /** Experts that became resident (each one copy to the device), by end_step and by
   * set_residency. */
  uint64_t promotions;
  uint64_t evictions; /**< experts that stopped being resident */
} qmoe_expert_cache_stats;

/** qmoe_expert_cache_get_stats's layer for the sum over every layer. */
#define QMOE_EXPERT_CACHE_ALL_LAYERS UINT32_MAX

typedef struct qmoe_expert_cache qmoe_expert_cache;

/// Defaults: struct_size set, LFRU with a half-life of 32 steps, no promotion limit, the shape
/// zero (to be set).
QMOE_API void qmoe_expert_cache_desc_init(qmoe_expert_cache_desc* desc);

/// A cache with no expert resident in any layer. INVALID_ARGUMENT for NULL pointers, a
/// struct_size no version had, num_layers, num_experts or num_slots of 0, num_slots above
/// num_experts, a policy that is not a qmoe_cache_policy, (LFRU) a half-life that is not
/// finite and > 0, or an admission margin that is not finite and >= 0; OUT_OF_MEMORY when its
/// state cannot be allocated.
QMOE_API qmoe_status qmoe_expert_cache_create(const qmoe_expert_cache_desc* desc,
                                              qmoe_expert_cache** cache);

/// Destroys the cache; NULL does nothing. INVALID_ARGUMENT for a destroyed or foreign handle.
QMOE_API qmoe_status qmoe_expert_cache_destroy(qmoe_expert_cache* cache);

/// Records layer `layer`'s routed expert ids of this step: ids[0, count), each in [0, E) or -1
/// (no selection: the padding of a fixed-capacity batch, skipped). An id may repeat (tokens
/// share experts); each occurrence is one selection. May be called several times per layer and
/// step. INVALID_ARGUMENT, nothing recorded, for a bad handle, a layer >= num_layers, NULL ids
/// with count > 0, or an id outside [-1, E).
QMOE_API qmoe_status qmoe_expert_cache_observe(qmoe_expert_cache* cache, uint32_t layer,
                                               const int32_t* ids, size_t count);

/// The same as qmoe_expert_cache_observe for a layer's per-expert counts of this step:
/// counts[e] selections of expert e (the token counts a grouped MoE kernel computes anyway),
/// num_experts = E entries. INVALID_ARGUMENT, nothing recorded, for a bad handle, a layer >=
/// num_layers, NULL counts, num_experts other than E, or a step's selections of one expert
/// passing 2^32 - 1.
QMOE_API qmoe_status qmoe_expert_cache_observe_counts(qmoe_expert_cache* cache, uint32_t layer,
                                                      const uint32_t* counts, uint32_t num_experts);

/// Ends the step: every layer's scores take the step's selections and its residency admits
/// and evicts as the header comment says (STATIC: only the step count changes).
/// INVALID_ARGUMENT for a bad handle.
QMOE_API qmoe_status qmoe_expert_cache_end_step(qmoe_expert_cache* cache);

/// Layer `layer`'s resident experts in ascending id order: *count = their number (at most
/// num_slots); ids[0, *count) written when ids is not NULL. INVALID_ARGUMENT, nothing written,
/// for a bad handle, a layer >= num_layers, a NULL count, or ids (not NULL) with a capacity
/// below the layer's resident count (ids NULL asks for the count alone).
QMOE_API qmoe_status qmoe_expert_cache_get_residency(const qmoe_expert_cache* cache, uint32_t layer,
                                                     uint32_t* ids, uint32_t capacity,
                                                     uint32_t* count);

/// Makes ids[0, count) (distinct, each below E, count <= num_slots; 0 empties the layer) layer
/// `layer`'s resident experts, with any policy: a placement chosen by the runtime, or a warm
/// start. Scores are kept; a placed expert that has none (never selected) counts as selected
/// once in the current step (not in the counters), so that the next end_step does not give its
/// slot to the first newcomer. INVALID_ARGUMENT, nothing changed, for a bad handle, a layer >=
/// num_layers, NULL ids with count > 0, an id >= E or given twice, or count > num_slots.
QMOE_API qmoe_status qmoe_expert_cache_set_residency(qmoe_expert_cache* cache, uint32_t layer,
                                                     const uint32_t* ids, uint32_t count);

/// Counters of layer `layer`, or their sums over every layer for QMOE_EXPERT_CACHE_ALL_LAYERS
/// (steps is the cache's step count either way). INVALID_ARGUMENT for a bad handle, another
/// layer >= num_layers, a NULL stats, or a struct_size no version had.
QMOE_API qmoe_status qmoe_expert_cache_get_stats(const qmoe_expert_cache* cache, uint32_t layer,
                                                 qmoe_expert_cache_stats* stats);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* QMOE_QMOE_CACHE_H_ */
