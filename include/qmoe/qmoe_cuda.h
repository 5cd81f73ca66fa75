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
/// Y row. Up to 8 rows run the decode GEMV at `accuracy`; more rows run the tensor-core GEMM
/// (weights exact, X in its own 16-bit type; FP32 X at the FAST level as a BF16 pair, at the
/// EXACT level through the GEMV 8 rows at a time), docs/formats.md gives the bounds. No host
/// synchronisation, no allocation, capturable in a CUDA graph. INVALID_ARGUMENT for what
/// qmoe_gemm_typed refuses that can be checked without reading device memory.
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
  /** NULL: every expert, expert e in slot e. Otherwise num_resident distinct expert ids; the
   * i-th is placed in slot i and the others are not resident. */
  const uint32_t* resident;
  uint32_t num_resident;
  qmoe_cuda_copy_mode copy_mode;
} qmoe_cuda_expert_set_desc;

/** The resident experts of one layer on one device: an opaque handle; forwards on it may run
 * on any streams of its device at once. */
typedef struct qmoe_cuda_expert_set qmoe_cuda_expert_set;

/// Fill `desc` with the defaults: struct_size set, device 0, every expert, batched copies.
QMOE_API void qmoe_cuda_expert_set_desc_init(qmoe_cuda_expert_set_desc* desc);

/// Copy the chosen experts' canonical buffers (codes, scale and zero-point planes, bias: each
/// the span the host matrix reads, byte for byte, never repacked) into one device allocation,
/// and write the residency map (expert -> slot, or -1) to device memory. Synchronous: the set
/// is ready when the call returns. INVALID_ARGUMENT for a NULL or destroyed host set, a device
/// ordinal outside [0, count), a resident id outside [0, E) or given twice, an unknown copy
/// mode; a format the GPU kernels do not run is UNSUPPORTED_FORMAT. On failure *set is NULL.
QMOE_API qmoe_status qmoe_cuda_expert_set_create(const qmoe_cuda_expert_set_desc* desc,
                                                 qmoe_cuda_expert_set** set);

/// Free a set's device memory (after synchronising its device). NULL is accepted; a destroyed
/// handle is rejected.
QMOE_API qmoe_status qmoe_cuda_expert_set_destroy(qmoe_cuda_expert_set* set);

/// The device's residency map: E int32 values, expert -> slot or -1, a device pointer valid
/// until the set is destroyed (every forward reads it when it runs).
QMOE_API qmoe_status qmoe_cuda_expert_set_residency(const qmoe_cuda_expert_set* set,
                                                    const int32_t** device_map);

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
/// alignment, a stream of another device); device-side values (ids, weights, logits, m) are
/// checked by the kernels, which then write y = 0 for the call's rows and set the error word
/// that qmoe_cuda_moe_check reads.
QMOE_API qmoe_status qmoe_cuda_moe_forward(const qmoe_cuda_expert_set* set,
                                           const qmoe_cuda_moe_params* params,
                                           qmoe_cuda_stream stream);

/// Wait for `stream` and read the error word the last forward that used `workspace` left:
/// OK, or INVALID_ARGUMENT naming what the device found (m above the capacity, an id outside
/// [0, E), a non-finite weight, a bad logit row, a residency entry outside the slots).
QMOE_API qmoe_status qmoe_cuda_moe_check(const void* workspace, qmoe_cuda_stream stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* QMOE_QMOE_CUDA_H_ */
