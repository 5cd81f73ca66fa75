/*
 * libqmoe's experimental C ABI: introspection of the kernels a context runs, and read-bandwidth
 * measurement. These calls serve tools, benchmarks and tuning; unlike qmoe/qmoe.h they carry no
 * stability promise and may change or go in any release (zstd's ZSTD_STATIC_LINKING_ONLY
 * split). C99-clean.
 */
#ifndef QMOE_QMOE_EXPERIMENTAL_H_
#define QMOE_QMOE_EXPERIMENTAL_H_

#include <stddef.h>
#include <stdint.h>

#include "qmoe/qmoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * The kernels behind a context
 * ------------------------------------------------------------------------------------------- */

/** One entry of a context's kernel table. */
typedef struct qmoe_kernel_info {
  size_t struct_size;        /**< caller sets sizeof(qmoe_kernel_info) */
  const char* operation;     /**< "convert_f16_to_f32", ..., "gemm"; static storage */
  qmoe_weight_format format; /**< the GEMM's format; 0 for other operations */
  qmoe_accuracy accuracy;    /**< the GEMM's level; 0 for other operations */
  /** "qmoe_<operation>__<isa>", GEMMs "qmoe_gemm_<format>_<accuracy>_<tile>__<isa>"; static
   * storage. */
  const char* name;
} qmoe_kernel_info;

/// Number of entries in the context's kernel table (every operation, and one GEMM per format
/// and accuracy level the build has). INVALID_ARGUMENT for a NULL `count`.
QMOE_API qmoe_status qmoe_context_get_kernel_count(const qmoe_context* context, uint32_t* count);
/// Entry `index` (< the count) of the context's kernel table: operations first, in a fixed
/// order, then the GEMMs by format and accuracy. INVALID_ARGUMENT (nothing written) for a NULL
/// `info`, a struct_size no version had, or an index at or above the count.
QMOE_API qmoe_status qmoe_context_get_kernel_info(const qmoe_context* context, uint32_t index,
                                                  qmoe_kernel_info* info);

/* ---------------------------------------------------------------------------------------------
 * Memory bandwidth
 * ------------------------------------------------------------------------------------------- */

/// Measure read bandwidth (bytes/s) by streaming a private buffer of `buffer_bytes` (4096 to
/// 2^40) `repetitions` times (>= 1) with the context's read kernel, on one thread or on all of
/// the context's threads; reports the best repetition. Use a buffer several times the
/// last-level cache for DRAM bandwidth. INVALID_ARGUMENT for a buffer_bytes outside
/// [4096, 2^40], repetitions = 0 or a NULL `bytes_per_second`; OUT_OF_MEMORY when the buffer
/// cannot be allocated.
QMOE_API qmoe_status qmoe_measure_read_bandwidth(qmoe_context* context, size_t buffer_bytes,
                                                 uint32_t repetitions, int use_all_threads,
                                                 double* bytes_per_second);

/// The same measurement over the caller's memory [data, data + bytes), which is only read: the
/// whole 64-byte lines inside the range (at least 4096 bytes of them), every one read, split
/// into eight contiguous slices per thread with use_all_threads. For the bandwidth of the pages
/// a runtime's expert weights actually live in, to set beside qmoe_measure_read_bandwidth's
/// fresh buffer (on virtual machines the two can differ from one process to the next). Use a
/// range several times the last-level cache for DRAM bandwidth. INVALID_ARGUMENT for NULL
/// `data` or `bytes_per_second`, a range that wraps around the address space, fewer than 4096
/// bytes of whole 64-byte lines in it, or repetitions = 0.
QMOE_API qmoe_status qmoe_measure_read_bandwidth_over(qmoe_context* context, const void* data,
                                                      size_t bytes, uint32_t repetitions,
                                                      int use_all_threads,
                                                      double* bytes_per_second);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* QMOE_QMOE_EXPERIMENTAL_H_ */
