/*
 * libqmoe's CUDA C ABI: the GPU half of expert offload. Every library build has these
 * functions: each checks its host-side arguments first, in every build, then answers
 * QMOE_STATUS_CUDA_UNAVAILABLE in a build without CUDA (or with no usable driver or device).
 * A CUDA error is QMOE_STATUS_CUDA_ERROR (or the nearest status: OUT_OF_MEMORY,
 * INVALID_ARGUMENT) with the CUDA error's name in qmoe_last_error_message(). C99-clean; needs no
 * CUDA header (qmoe_cuda_stream is the same type as cudaStream_t).
 *
 * Pointers documented as device pointers are read or written by kernels and must be device
 * memory (cudaMalloc) of the set's device; host pointers are read during the call.
 */
#ifndef QMOE_QMOE_CUDA_H_
#define QMOE_QMOE_CUDA_H_

#include <stddef.h>
#include <stdint.h>

#include "qmoe/qmoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A CUDA stream: the runtime's cudaStream_t (the same incomplete struct), or NULL for the
 * legacy default stream. */
typedef struct CUstream_st* qmoe_cuda_stream;

/// Number of CUDA devices visible; QMOE_STATUS_CUDA_UNAVAILABLE in a build without CUDA or with
/// no usable driver, QMOE_STATUS_CUDA_ERROR (message names the CUDA error) when the runtime
/// cannot be queried.
QMOE_API qmoe_status qmoe_cuda_get_device_count(int* device_count);

/* ---------------------------------------------------------------------------------------------
 * The dequant-GEMM on a device
 * ------------------------------------------------------------------------------------------- */

/// qmoe_gemm_typed on the GPU, enqueued on `stream` of the current device: `weights` describes
/// a matrix whose codes, planes and bias are device pointers (the same canonical bytes and
/// strides as on the host; codes 16-byte aligned), X and Y are device pointers (X 16-byte
/// aligned with 16-byte aligned rows when m > 8). Writes only columns [n_begin, n_end) of each
/// Y row. Formats: INT4, INT3, MXFP4 and NVFP4. Up to 8 rows run the decode GEMV at `accuracy`;
/// more rows of INT4 run the tensor-core GEMM (weights exact, X in its own 16-bit type; FP32 X at
/// the FAST level as a BF16 pair, at the EXACT level through the GEMV 8 rows at a time), more
/// rows of INT3, MXFP4 or NVFP4 the GEMV 8 rows at a time; docs/formats.md
/// gives the bounds, the CPU's for every format. No host synchronisation, no allocation,
/// capturable in a CUDA graph. INVALID_ARGUMENT for what qmoe_gemm_typed refuses that can be
/// checked without reading device memory.
QMOE_API qmoe_status qmoe_cuda_gemm(const qmoe_quant_matrix* weights, qmoe_accuracy accuracy,
                                    uint32_t m, qmoe_dtype x_dtype, const void* x, size_t ldx,
                                    qmoe_dtype y_dtype, void* y, size_t ldy, uint32_t n_begin,
                                    uint32_t n_end, qmoe_cuda_stream stream);

/* ---------------------------------------------------------------------------------------------
 * Resident experts
 * ------------------------------------------------------------------------------------------- */

/** How qmoe_cuda_expert_set_create copies experts to the device; fixed values. */
typedef enum qmoe_cuda_copy_mode {
  /** One cudaMemcpyBatchAsync for all the buffers where the runtime has it (CUDA 12.8 and
   * up), else as QMOE_CUDA_COPY_LOOP. */
  QMOE_CUDA_COPY_BATCHED = 0,
  /** One cudaMemcpyAsync per buffer. */
  QMOE_CUDA_COPY_LOOP = 1
} qmoe_cuda_copy_mode;

/** Which experts of a host expert set to place on which device. */
typedef struct qmoe_cuda_expert_set_desc {
  size_t struct_size; /**< caller sets sizeof(qmoe_cuda_expert_set_desc) */
  int device;         /**< CUDA device ordinal */
  /** The experts: shapes, SwiGLU and each expert's weight descriptions. The host set may be
   * destroyed after the call; its weights are copied. */
  const qmoe_expert_set* experts;
  /** NULL: every expert, expert e in slot e. Otherwise num_resident distinct expert ids (0
   * only with num_slots set: a set that starts empty); the i-th is placed in slot i and the
   * others are not resident. */
  const uint32_t* resident;
  uint32_t num_resident;
  qmoe_cuda_copy_mode copy_mode;
  /** The slots the set has: 0 (default) for as many as resident experts (E when resident is
   * NULL); otherwise at least that many. Each slot has room for any expert of `experts` (the
   * largest of each buffer), so qmoe_cuda_expert_set_update_residency can place any of them;
   * device memory is num_slots times that. Added after the first version: a caller whose
   * struct_size ends before it gets the default. */
  uint32_t num_slots;
} qmoe_cuda_expert_set_desc;

/** The resident experts of one layer on one device: an opaque handle; forwards on it may run
 * on any streams of its device at once (a residency update is ordered with them by the
 * caller). */
typedef struct qmoe_cuda_expert_set qmoe_cuda_expert_set;

/// Fill `desc` with the defaults: struct_size set, device 0, every expert, batched copies.
QMOE_API void qmoe_cuda_expert_set_desc_init(qmoe_cuda_expert_set_desc* desc);

/// Copy the chosen experts' canonical buffers (codes, scale and zero-point planes, bias: each
/// the span the host matrix reads, byte for byte, never repacked) into one device allocation,
/// and write the residency map (expert -> slot, or -1) to device memory. Synchronous: the set
/// is ready when the call returns. INVALID_ARGUMENT for a NULL or destroyed host set, a device
/// ordinal outside [0, count), a resident id outside [0, E) or given twice, an unknown copy
/// mode; a format the GPU kernels do not run (they run INT4, INT3, MXFP4 and NVFP4), or experts of
/// more than one format (every expert's FC1 and FC2, resident or not, must share one), is
/// UNSUPPORTED_FORMAT. On failure *set is NULL.
QMOE_API qmoe_status qmoe_cuda_expert_set_create(const qmoe_cuda_expert_set_desc* desc,
                                                 qmoe_cuda_expert_set** set);

/// Free a set's device memory (after synchronising its device). NULL is accepted; a destroyed
/// handle is rejected.
QMOE_API qmoe_status qmoe_cuda_expert_set_destroy(qmoe_cuda_expert_set* set);

/// The device's residency map: E int32 values, expert -> slot or -1, a device pointer valid
/// until the set is destroyed (every forward reads it when it runs).
QMOE_API qmoe_status qmoe_cuda_expert_set_residency(const qmoe_cuda_expert_set* set,
                                                    const int32_t** device_map);

/// Make resident[0, num_resident) (distinct expert ids, at most the set's slots; 0 leaves none
/// resident) the set's resident experts, enqueued on `stream` (of the set's device), between
/// steps. Experts already resident keep their slots and are not copied; each other one takes a
/// slot no longer needed, its canonical buffers copied from `experts` (a host set with the
/// set's E, H, intermediate size and SwiGLU, whose buffers fit the slots; it and its weight
/// buffers must stay valid and unchanged until the stream has run the copies). Then the slot
/// descriptions and the residency map are rewritten. Stream-ordered: forwards enqueued on
/// `stream` before the call use the old residency, those after it the new; a forward on another
/// stream must be ordered with the update by the caller (events), as must a CUDA graph that
/// holds forwards of the set (it reads the map when it runs, so a replay after the update uses
/// the new residency). One update of a set at a time. Not capturable: INVALID_ARGUMENT on a
/// capturing stream. The host blocks only while an earlier update's copies have not yet run,
/// or while the pinned image this call stages the descriptions and map in (the set has two,
/// used in turn by its updates, begins and finishes) has not been copied out since the call two
/// before.
/// *experts_copied (may be NULL) = the experts copied. INVALID_ARGUMENT for a NULL or destroyed
/// handle or host set, an id outside [0, E) or given twice, more ids than slots, a host set of
/// another shape or larger buffers, a stream of another device; UNSUPPORTED_FORMAT for a host
/// set whose format is not the set's (the set's kernels are chosen for its one format). After a
/// CUDA error the set's residency is undefined until an update succeeds (which then copies every
/// expert).
QMOE_API qmoe_status qmoe_cuda_expert_set_update_residency(
    qmoe_cuda_expert_set* set, const qmoe_expert_set* experts, const uint32_t* resident,
    uint32_t num_resident, qmoe_cuda_stream stream, uint32_t* experts_copied);

/// The same update without holding `stream` up for the copies (an expert cache's promotions,
/// overlapping the steps): on `stream`, at once, the map drops the experts that leave and the
/// experts that join, so forwards enqueued after this call skip both (through an offload
/// session, the CPU computes them); the joiners' buffers are copied on `copy_stream` (of the
/// set's device; it may be `stream`) once the work enqueued on `stream` before the call is done,
/// since that work may still read a leaving expert's slot that a joiner takes; and
/// qmoe_cuda_expert_set_finish_residency_update maps the joiners. The host does not wait for
/// the copies when the host set's buffers are pinned (cudaHostRegister, cudaHostAlloc); from
/// pageable memory the CUDA runtime first waits for the copy stream's earlier work, the lease
/// included, then stages the bytes before the call returns. Arguments, buffers' lifetime (until the
/// copies have run), the copy count and the refusals as for qmoe_cuda_expert_set_update_residency;
/// also INVALID_ARGUMENT while an update begun earlier is not finished (both calls refuse then),
/// and for a capturing copy_stream.
QMOE_API qmoe_status qmoe_cuda_expert_set_begin_residency_update(
    qmoe_cuda_expert_set* set, const qmoe_expert_set* experts, const uint32_t* resident,
    uint32_t num_resident, qmoe_cuda_stream stream, qmoe_cuda_stream copy_stream,
    uint32_t* experts_copied);

/// Finishes the begun update on `stream`: when its copies are done, enqueues the joiners' slot
/// descriptions and then the map that names them (forwards after this call use the whole new
/// residency) and sets *finished = 1. With wait = 0 and the copies still running, enqueues
/// nothing and sets *finished = 0 (call again between later steps); with wait != 0, `stream`
/// waits for the copies (the host does not, beyond the staging image's wait described at
/// qmoe_cuda_expert_set_update_residency). *finished = 1 when no update is pending. Not capturable.
/// INVALID_ARGUMENT for a NULL or destroyed set, a NULL `finished`, a capturing stream or one of
/// another device. After a CUDA error the residency is undefined until an update succeeds, as for
/// qmoe_cuda_expert_set_update_residency.
QMOE_API qmoe_status qmoe_cuda_expert_set_finish_residency_update(qmoe_cuda_expert_set* set,
                                                                  qmoe_cuda_stream stream, int wait,
                                                                  int* finished);

/* ---------------------------------------------------------------------------------------------
 * The resident MoE layer
 * ------------------------------------------------------------------------------------------- */

/** One layer call on the device. Every pointer is a device pointer and every per-call value is
 * read from device memory when the kernels run (the token count, the routing, the residency),
 * so a CUDA graph captured once replays with new routing each time. */
typedef struct qmoe_cuda_moe_params {
  size_t struct_size;     /**< caller sets sizeof(qmoe_cuda_moe_params) */
  qmoe_accuracy accuracy; /**< EXACT or FAST (default FAST) */
  qmoe_dtype dtype;       /**< of x, y and logits: F32 (default), F16 or BF16 */
  uint32_t m_capacity;    /**< the most tokens a call may have: sizes the launch */
  const uint32_t* m;      /**< device: this call's tokens, at most m_capacity */
  const void* x;          /**< [m, H], row t at x + t * ldx elements */
  size_t ldx;
  void* y; /**< [m, H]; may not overlap x */
  size_t ldy;
  uint32_t k; /**< routing slots per token, 1 to E */
  /** The routing: ids and weights [m, k] (int32, FP32), or router logits [m, E] in dtype (ids
   * and weights NULL), routed as qmoe_moe_route_topk with renormalize. */
  const int32_t* ids;
  const float* weights;
  const void* logits;
  int renormalize;
  /** 0: y = result; nonzero: y += result. */
  int accumulate;
  /** qmoe_cuda_moe_workspace_size bytes, 256-byte aligned; one call at a time. */
  void* workspace;
  size_t workspace_bytes;
  /** A hint (0, the default: none), fixed when a graph is captured: the tokens each routed
   * expert is expected to hold in a call, on average (tokens times k over the experts routed).
   * The kernels batch an expert's tokens in work items of a size chosen when the call is
   * enqueued; without the hint that size assumes uniform routing, which spreads a call's tokens
   * thinly (about 1.0-1.6 tokens a routed expert at capacity 2-16 with Qwen3-30B-A3B's 128
   * experts, top-8). Set it when a call's tokens share experts: m_capacity when they all route
   * to the same experts. It changes the time only, never the results. 0, or finite in
   * [1, m_capacity]. */
  float expected_tokens_per_expert;
  /** Optional (NULL, the default: nothing written): E uint32_t in device memory, 4-byte
   * aligned, that every call overwrites with its routing's selections per expert:
   * expert_counts[e] = the slots (t < m, j < k) routed to expert e with a nonzero weight,
   * resident or not (the per-expert counts qmoe_expert_cache_observe_counts takes, so a runtime
   * whose routing stays on the device feeds its expert cache with one copy of E words a layer
   * instead of the ids). All E are written, 0 for an expert no slot selects and for every
   * expert of a call whose device-side input was invalid (the error word set). Written after
   * the kernels' wait for the preceding stream work, like y; it may not overlap x, y, the
   * routing or the workspace. Added after expected_tokens_per_expert: a struct_size that ends
   * before it gets NULL. */
  uint32_t* expert_counts;
} qmoe_cuda_moe_params;

/// Fill `params` with the defaults: struct_size set, FAST, F32, renormalize 1, the rest 0.
QMOE_API void qmoe_cuda_moe_params_init(qmoe_cuda_moe_params* params);

/// Bytes of device workspace a forward on `set` needs for up to m_capacity tokens and k slots.
QMOE_API qmoe_status qmoe_cuda_moe_workspace_size(const qmoe_cuda_expert_set* set,
                                                  qmoe_accuracy accuracy, uint32_t m_capacity,
                                                  uint32_t k, size_t* bytes);

/// The MoE layer of the resident experts on `stream` (of the set's device): as qmoe_moe_forward
/// with the residency map as the run mask (slots whose expert is not resident are skipped),
/// the sum over slots in slot order, the bits independent of timing and run to run; two kernel
/// launches, no host synchronisation, no allocation, capturable. Host-side arguments are checked
/// here (INVALID_ARGUMENT: NULLs, exactly one routing, k, m_capacity, ld, the workspace size and
/// alignment, a stream of another device: while the stream is capturing, a CUDA_ERROR from
/// the launch instead); device-side values (ids, weights, logits, m) are
/// checked by the kernels, which then write y = 0 for the call's rows and set the error word
/// that qmoe_cuda_moe_check reads.
QMOE_API qmoe_status qmoe_cuda_moe_forward(const qmoe_cuda_expert_set* set,
                                           const qmoe_cuda_moe_params* params,
                                           qmoe_cuda_stream stream);

/// Wait for `stream` and read the error word the last forward that used `workspace` left:
/// OK, or INVALID_ARGUMENT naming what the device found (m above the capacity, an id outside
/// [0, E), a non-finite weight, a bad logit row, a residency entry outside the slots).
QMOE_API qmoe_status qmoe_cuda_moe_check(const void* workspace, qmoe_cuda_stream stream);

/* ---------------------------------------------------------------------------------------------
 * CPU/GPU offload: the resident experts on the GPU, the cold ones on the CPU, in one layer call
 * ------------------------------------------------------------------------------------------- */

/** An offload session on one GPU: a doorbell ring in mapped pinned host memory, its device-side
 * state (sequence numbers, a sticky error, counters) in device memory, and a CPU service thread
 * that runs each layer call's cold experts on a CPU context (docs/offload.md). Calls on one
 * session are stream-ordered: enqueue them on one stream (or order their streams yourself). */
typedef struct qmoe_cuda_offload qmoe_cuda_offload;

/** What an offload session serves. */
typedef struct qmoe_cuda_offload_desc {
  size_t struct_size; /**< caller sets sizeof(qmoe_cuda_offload_desc) */
  int device;         /**< CUDA device ordinal of every gpu_layers set */
  /** The CPU context the cold experts run on; it must outlive the session. Its threads and the
   * service thread share the host's cores: size it for the cores the GPU's host thread does
   * not need. */
  qmoe_context* context;
  uint32_t num_layers;
  /** [num_layers] each layer's experts on the host (every expert; the cold ones run from here)
   * and on the GPU (the resident ones, with the residency map); the same E and H per layer, the
   * same H for every layer; all must outlive the session. */
  const qmoe_expert_set* const* host_layers;
  const qmoe_cuda_expert_set* const* gpu_layers;
  uint32_t m_capacity; /**< most tokens per call (sizes the ring entries); default 4 */
  uint32_t k;          /**< most routing slots per token; default 8; m_capacity * k <= 4096 */
  uint32_t ring_size;  /**< ring entries, 1 to 1024; default 4 */
  /** How long the GPU waits for the CPU's answer to one call, from the start of the wait, in
   * microseconds; past it the call gives up, the session's error becomes TIMEOUT and every
   * later call fails fast. Default 1000000 (1 s). */
  uint32_t timeout_us;
  /** The service thread polls the ring for spin_us after its last request or a wake, then
   * parks, looking at the ring every park_poll_us. Defaults 2000 and 100. */
  uint32_t spin_us;
  uint32_t park_poll_us;
  /** Nonzero (default): a call with no cold selection publishes nothing (no host write, no
   * wakeup, no ring slot). 0: such calls go through the ring too (same results, bit for bit). */
  int short_circuit;
} qmoe_cuda_offload_desc;

/** Buckets of qmoe_cuda_offload_telemetry.service_histogram: bucket 0 counts requests served in
 * under 2 us, bucket b (1 to 22) those in [2^b, 2^(b+1)) us, bucket 23 the rest. */
#define QMOE_CUDA_OFFLOAD_HISTOGRAM_BUCKETS 24

/** A session's counters. Device counters (read from device memory after the stream is
 * synchronised): published_requests + short_circuits + refused_calls == classify_calls, and,
 * once every published request is answered, cold_selections == selections_served. */
typedef struct qmoe_cuda_offload_telemetry {
  size_t struct_size;          /**< caller sets sizeof(qmoe_cuda_offload_telemetry) */
  uint64_t classify_calls;     /**< device: layer calls */
  uint64_t short_circuits;     /**< device: calls with no cold selection (nothing published) */
  uint64_t published_requests; /**< device: requests put on the ring */
  uint64_t refused_calls;      /**< device: calls refused (sticky error, invalid routing) */
  uint64_t cold_selections;    /**< device: cold (token, slot) selections published */
  uint64_t requests_served;    /**< host: requests answered (failed ones included) */
  uint64_t selections_served;  /**< host: cold selections of those, counted from the ring */
  uint64_t failed_requests;    /**< host: requests answered with a failure */
  uint64_t wakeups;            /**< host: times the parked service thread resumed spinning */
  uint64_t parks;              /**< host: times the service thread parked */
  uint64_t service_ns;         /**< host: total time serving requests */
  uint64_t service_histogram[QMOE_CUDA_OFFLOAD_HISTOGRAM_BUCKETS]; /**< host */
} qmoe_cuda_offload_telemetry;

/// Fill `desc` with the defaults: struct_size set, device 0, m_capacity 4, k 8, ring 4,
/// timeout 1 s, spin 2000 us, park poll 100 us, short circuit on; the pointers NULL.
QMOE_API void qmoe_cuda_offload_desc_init(qmoe_cuda_offload_desc* desc);

/// Make a session: the ring (mapped pinned host memory), the device state, and the service
/// thread, started. INVALID_CONTEXT for a NULL or destroyed context; INVALID_ARGUMENT for a NULL
/// or destroyed handle, num_layers 0, a layer whose
/// host and GPU sets differ in E, H, the intermediate size or the SwiGLU fusion, layers of
/// different H, more than 1024 experts, k outside [1, E] of some layer, m_capacity 0,
/// m_capacity * k above 4096, ring_size outside [1, 1024], timeout_us or park_poll_us 0, a GPU
/// set on another device; UNSUPPORTED_HARDWARE when the device cannot map host memory. On
/// failure *session is NULL.
QMOE_API qmoe_status qmoe_cuda_offload_create(const qmoe_cuda_offload_desc* desc,
                                              qmoe_cuda_offload** session);

/// Wait for the session's device (requests in flight are still answered; each wait is bounded
/// by the timeout), stop and join the service thread, free the ring and the device state.
/// NULL is accepted; a destroyed handle is rejected.
QMOE_API qmoe_status qmoe_cuda_offload_destroy(qmoe_cuda_offload* session);

/// One hybrid MoE layer on `stream` (of the session's device): y (+)= the layer of
/// host_layers[layer] for params->m tokens, its resident experts on the GPU and its cold ones
/// (routed experts the residency map marks -1, with a nonzero weight) on the CPU. Enqueues three
/// steps, all reading per-call values from device memory (capturable in a CUDA graph; every
/// replay issues a new request): classify-publish (one extra block of the resident layer's
/// first kernel, so no graph node of its own: the cold set via __syncthreads_count, and, when
/// it is not empty, the request on the ring), the resident layer (as qmoe_cuda_moe_forward, the
/// residency map its run mask), wait-accumulate (a kernel; waits for the
/// CPU's answer, at most timeout_us, and adds it into the rows of tokens with a cold selection:
/// y = dtype(y + cold) with the resident part already in y, so a 16-bit y is rounded twice).
/// params as for qmoe_cuda_moe_forward (ids and weights, or router logits: then the request
/// carries the ids and weights the GPU routed, and the CPU runs those), except: k at most the
/// session's k, m_capacity at most the session's, workspace may be NULL (the session's own). No
/// host synchronisation. TIMEOUT (or INTERNAL_ERROR) without enqueueing anything once the session's
/// sticky error is known to the host; INVALID_ARGUMENT as qmoe_cuda_moe_forward's host-side checks.
QMOE_API qmoe_status qmoe_cuda_offload_forward(qmoe_cuda_offload* session, uint32_t layer,
                                               const qmoe_cuda_moe_params* params,
                                               qmoe_cuda_stream stream);

/// Tell the service thread requests are coming (forward does this itself; call it before
/// launching a graph that holds forwards, so a parked thread is spinning when they arrive).
QMOE_API qmoe_status qmoe_cuda_offload_wake(qmoe_cuda_offload* session);

/// Wait for `stream`, then report the session's state: OK; TIMEOUT once a wait has timed out;
/// INTERNAL_ERROR when the CPU failed a request or a ring slot was misused (both sticky: every
/// later call publishes nothing and waits for nothing); INVALID_ARGUMENT for what the resident
/// layer found in the last call that used the session's own workspace (as qmoe_cuda_moe_check).
QMOE_API qmoe_status qmoe_cuda_offload_check(qmoe_cuda_offload* session, qmoe_cuda_stream stream);

/// Wait for `stream`, then fill `telemetry` (struct_size set by the caller). Reading is off the
/// doorbell path: the counters live in device memory and in the service thread.
QMOE_API qmoe_status qmoe_cuda_offload_get_telemetry(qmoe_cuda_offload* session,
                                                     qmoe_cuda_stream stream,
                                                     qmoe_cuda_offload_telemetry* telemetry);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* QMOE_QMOE_CUDA_H_ */
